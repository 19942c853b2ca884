#!/usr/bin/env bash
# Layer 4 of the tests (docs/design.md): dtf under a real systemd.
#
#   tests/system/run.sh            (as root, on Debian 12)
#
# Boots a Debian 12 container with systemd-nspawn (systemd as PID 1, its own
# loopback: --private-network), installs the .deb and runs a 1 ps + 2 worker
# cluster on Fashion-MNIST through the template units, with dtf-evaluator
# beside it (it scores checkpoints while training, keeps the best in best/,
# and stops by itself after the final one): readiness and STATUS,
# SIGKILL of a worker and of the ps (systemd restarts them, the chief
# restores the checkpoint), a worker added by an edit of cluster.worker and
# `systemctl start dtf-worker@2`, then removed (it exits 0: inactive, not
# failed, not restarted), reload by file change and by `systemctl reload`
# (valid, invalid, not reloadable), the end of the run (every unit inactive
# with Result=success, checkpoints, `dtf eval`), a second run over mutual TLS
# (openssl certificates, the key root:dtf 0640; `dtf status` with and without
# TLS), and a broken config (exit 78, no restart loop). Prints PASS/FAIL per
# check, exits 1 on any failure (after dumping the units' journal). The
# container is torn down in every case.
#
# The Debian root (debootstrap minbase + systemd + dataset-fashion-mnist) is
# cached in $DTF_SYSTEM_TEST_CACHE (default /var/cache/dtf-system-test); every
# run boots a fresh copy of it. Environment:
#   DTF_SYSTEM_TEST_CACHE   where the cached root lives
#   DTF_SYSTEM_TEST_MIRROR  Debian mirror for debootstrap (default: the
#                           host's own apt source)
#   DTF_DEB                 a prebuilt .deb to test (default: build one with
#                           cargo build --release && cargo deb --no-build)
set -euo pipefail
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive

cd "$(dirname "$0")/../.."
SRC=$(pwd)

CACHE=${DTF_SYSTEM_TEST_CACHE:-/var/cache/dtf-system-test}
# Bump when the recipe of the cached root changes, so old caches are not used.
ROOT_RECIPE=v2
CACHED_ROOT=$CACHE/bookworm-root-$ROOT_RECIPE
ROOT_PACKAGES=systemd,systemd-sysv,dbus,adduser
# Pre-installed so that a run needs no network inside the container.
ROOT_EXTRA=dataset-fashion-mnist
# Downloaded, not installed: the .deb's dependencies beyond minbase. The
# package must still declare them (apt-get installs them from the cache).
ROOT_OFFLINE=procps

# The cluster inside the container (its own loopback: no clash with the host).
PS_ADDR=127.0.0.1:2222
W0_ADDR=127.0.0.1:2223
W1_ADDR=127.0.0.1:2224
# Added to the running cluster by an edit, then removed (cluster.worker is live).
W2_ADDR=127.0.0.1:2225
# The workers write_config lists (the membership section adds W2_ADDR).
WORKER_LIST="\"$W0_ADDR\", \"$W1_ADDR\""
# Added to cluster.ps by an edit, then removed (the re-shard section).
PS1_ADDR=127.0.0.1:2226
PS_LIST="\"$PS_ADDR\""
# dtf-evaluator runs beside the cluster: the same lifecycle checks apply to it
# (start, reloads, the stop at last_step, once it has scored the final checkpoint).
UNITS=(dtf-ps@0 dtf-worker@0 dtf-worker@1 dtf-evaluator)
FINAL_STEPS=2500     # the run ends at max(this, current step + 500)
MIN_ACCURACY=0.7

ME="system test"
# log, die, pass, fail, check, wait_for, host_mirror.
# shellcheck source=tests/system/lib.sh
. "$SRC/tests/system/lib.sh"

[ "$(id -u)" = 0 ] || die "must run as root (systemd-nspawn, debootstrap)"

# --- host tools -------------------------------------------------------------

need=
command -v systemd-nspawn >/dev/null || need="$need systemd-container"
command -v debootstrap >/dev/null || need="$need debootstrap"
command -v nsenter >/dev/null || need="$need util-linux"
command -v openssl >/dev/null || need="$need openssl"
if [ -n "$need" ]; then
	log "apt-get install$need"
	apt-get update -qq
	# shellcheck disable=SC2086 # a list of package names
	apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# --- the .deb ---------------------------------------------------------------

if [ -n "${DTF_DEB:-}" ]; then
	DEB=$DTF_DEB
else
	log "cargo build --release"
	cargo build --release --locked -q
	version=$(cargo metadata --no-deps --format-version 1 |
		sed -n 's/.*"name":"dtf","version":"\([^"]*\)".*/\1/p')
	DEB=$SRC/target/debian/dtf_${version}-1_$(dpkg --print-architecture).deb
	# Repackaged only when something that goes into it is newer (as after
	# scripts/check-package.sh, the package is usually fresh).
	if [ ! -f "$DEB" ] || [ -n "$(find Cargo.toml packaging/debian etc/dtf man \
		target/release/dtf target/release/dtf-ps target/release/dtf-worker -newer "$DEB" -print -quit)" ]; then
		log "cargo deb --no-build"
		cargo deb --no-build -q >/dev/null
	fi
fi
[ -f "$DEB" ] || die "no package $DEB"
log "package: $DEB"

# --- the cached Debian root -------------------------------------------------

build_root() {
	local mirror tmp
	mirror=${DTF_SYSTEM_TEST_MIRROR:-$(host_mirror)}
	mkdir -p "$CACHE"
	# Built beside its final name and renamed when complete: an interrupted
	# build is never taken for a cached root.
	tmp=$(mktemp -d "$CACHE/bookworm-root.tmp.XXXXXX")
	chmod 0755 "$tmp" # mktemp's 0700 would become the container's / (and
	# keep the dtf user, dbus and apt's _apt out of everything).
	# shellcheck disable=SC2064 # expand $tmp now
	trap "umount -l '$tmp/proc' 2>/dev/null; rm -rf '$tmp'" EXIT
	log "debootstrap bookworm from $mirror (a few minutes, once)"
	debootstrap --variant=minbase --include="$ROOT_PACKAGES" bookworm "$tmp" "$mirror" \
		>"$CACHE/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
	log "apt-get install $ROOT_EXTRA in the root"
	cp /etc/resolv.conf "$tmp/etc/resolv.conf"
	mount -t proc proc "$tmp/proc"
	chroot "$tmp" apt-get update -qq
	chroot "$tmp" apt-get install -y -qq --no-install-recommends "$ROOT_EXTRA" >"$CACHE/apt.log" 2>&1 ||
		{ cat "$CACHE/apt.log" >&2; die "apt-get install $ROOT_EXTRA in the root failed"; }
	chroot "$tmp" apt-get clean
	chroot "$tmp" apt-get install -y -qq --download-only --no-install-recommends $ROOT_OFFLINE >>"$CACHE/apt.log" 2>&1 ||
		{ cat "$CACHE/apt.log" >&2; die "apt-get download $ROOT_OFFLINE in the root failed"; }
	umount "$tmp/proc"
	rm -f "$tmp/etc/resolv.conf"
	# The container has no network of its own; nothing should wait for it.
	echo dtf-systest >"$tmp/etc/hostname"
	# -T: if a concurrent run got there first, keep its root and drop ours.
	mv -T "$tmp" "$CACHED_ROOT" 2>/dev/null || rm -rf "$tmp"
	trap - EXIT
}

if [ ! -d "$CACHED_ROOT" ]; then
	build_root
else
	log "cached root: $CACHED_ROOT"
fi

# --- boot a copy --------------------------------------------------------------

RUN=$(mktemp -d /var/tmp/dtf-system-test.XXXXXX)
ROOT=$RUN/root
NSPAWN_PID=
PID=

in_ct() { nsenter -t "$PID" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
	SYSTEMD_PAGER= SYSTEMD_COLORS=0 DEBIAN_FRONTEND=noninteractive "$@"; }

teardown() {
	local rc=$?
	set +e
	if [ -n "$PID" ] && { [ "$failures" -gt 0 ] || [ "$rc" -ne 0 ]; }; then
		echo "---- journal of the dtf units (container) ----"
		in_ct journalctl --no-pager -o short-monotonic -u 'dtf-*' 2>&1 | tail -n 400
		echo "---- systemctl status ----"
		in_ct systemctl --no-pager status 'dtf-*' 2>&1 | tail -n 80
	fi
	if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
		log "powering the container off"
		[ -n "$PID" ] && timeout 10 nsenter -t "$PID" -a systemctl poweroff >/dev/null 2>&1
		for _ in $(seq 60); do
			kill -0 "$NSPAWN_PID" 2>/dev/null || break
			sleep 0.5
		done
		if kill -0 "$NSPAWN_PID" 2>/dev/null; then
			log "the container did not stop in 30 s: SIGKILL to systemd-nspawn"
			kill -KILL "$NSPAWN_PID"
			wait "$NSPAWN_PID" 2>/dev/null
		fi
	fi
	log "container stopped; removing $RUN"
	rm -rf "$RUN"
	log "torn down"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

log "copying the root to $ROOT"
cp -a "$CACHED_ROOT" "$ROOT"
cp "$DEB" "$ROOT/root/"
debname=$(basename "$DEB")

log "booting the container"
systemd-nspawn -q -D "$ROOT" --boot --register=no --keep-unit --console=passive \
	--private-network --machine="dtf-systest-$$" >"$RUN/nspawn.log" 2>&1 &
NSPAWN_PID=$!

container_pid() {
	kill -0 "$NSPAWN_PID" 2>/dev/null || { cat "$RUN/nspawn.log" >&2; die "systemd-nspawn exited"; }
	local c
	c=$(cat /proc/"$NSPAWN_PID"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 . || true)
	[ -n "$c" ] && [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ] && PID=$c
}
wait_for 30 container_pid || die "no systemd in the container"

system_up() {
	local s
	s=$(in_ct systemctl is-system-running 2>/dev/null || true)
	case $s in running | degraded) return 0 ;; *) return 1 ;; esac
}
if wait_for 90 system_up; then
	pass "container boots: systemctl is-system-running = $(in_ct systemctl is-system-running || true)"
else
	fail "container boots: is-system-running = $(in_ct systemctl is-system-running 2>&1 || true)"
	exit 1
fi

# From here on a failing command is a failed check, not the end of the run:
# every check reports, and the trap tears down.
set +e

# --- install -------------------------------------------------------------------

log "apt-get install /root/$debname"
if in_ct apt-get install -y -q --no-install-recommends "/root/$debname" >"$RUN/apt.log" 2>&1; then
	pass "apt-get install the .deb (no network needed)"
else
	cat "$RUN/apt.log"
	fail "apt-get install the .deb"
	exit 1
fi
check "postinst: system user dtf ($(in_ct getent passwd dtf || true))" quiet in_ct getent passwd dtf
token_mode=$(in_ct stat -c '%U:%G %a' /etc/dtf/token 2>&1 || true)
check "postinst: /etc/dtf/token is root:dtf 640 ($token_mode)" test "$token_mode" = "root:dtf 640"
check "postinst: /var/lib/dtf exists" in_ct test -d /var/lib/dtf

# --- the cluster's configuration ------------------------------------------------

# write_config LAST_STEP SAVE_SECS [EXTRA TRAIN LINE [EXTRA SECTIONS]]:
# /etc/dtf/dtf.toml in the container, replaced atomically (as an editor does)
# so the daemons' file watchers see one change.
write_config() {
	cat >"$ROOT/etc/dtf/dtf.toml.new" <<-EOF
		# dtf system test: 1 ps + 2 workers on the container's loopback.
		[cluster]
		ps = [$PS_LIST]
		worker = [$WORKER_LIST]
		[train]
		mode = "async"
		batch_size = 100
		last_step = $1
		log_step_count_steps = 50
		${3:-}
		[data]
		dir = "/usr/share/datasets/fashion-mnist"
		[checkpoint]
		dir = "/var/lib/dtf/checkpoints"
		save_secs = $2
		[log]
		level = "info"
		${4:-}
	EOF
	chmod 644 "$ROOT/etc/dtf/dtf.toml.new"
	mv "$ROOT/etc/dtf/dtf.toml.new" "$ROOT/etc/dtf/dtf.toml"
}

# Far away: the run is ended later by reloading a reachable last_step, so
# the faults and reloads below do not race the end of training.
HUGE_STEP=100000000
write_config $HUGE_STEP 2
check "dtf check-config accepts the test config: $(in_ct dtf check-config 2>&1 || true)" quiet in_ct dtf check-config

# --- helpers on units -------------------------------------------------------------

prop() { in_ct systemctl show -P "$2" "$1.service" 2>/dev/null; }
is_active() { [ "$(prop "$1" ActiveState)" = active ]; }
all_active() {
	local u
	for u in "${UNITS[@]}"; do is_active "$u" || return 1; done
}
# The global step in a worker's STATUS= line ("step N loss …"), or empty.
status_step() { prop "$1" StatusText | sed -n 's/^step \([0-9]\+\) .*/\1/p'; }
status_step_above() {
	local s
	s=$(status_step "$1")
	[ -n "$s" ] && [ "$s" -gt "$2" ]
}
# journal_count UNIT PATTERN: lines of the unit's journal matching PATTERN.
journal_count() { in_ct journalctl --no-pager -o cat -u "$1.service" 2>/dev/null | grep -c -- "$2" || true; }
journal_count_above() { [ "$(journal_count "$1" "$2")" -gt "$3" ]; }

# --- start ---------------------------------------------------------------------------

log "systemctl start ${UNITS[*]}"
if in_ct timeout 180 systemctl start "${UNITS[@]}"; then
	pass "systemctl start ${UNITS[*]} returns 0 (Type=notify: after READY=1)"
else
	fail "systemctl start ${UNITS[*]}"
fi
for u in "${UNITS[@]}"; do
	check "$u is active" is_active "$u"
done
if [ "$failures" -gt 0 ]; then
	log "the cluster did not start; the remaining checks would only time out"
	exit 1
fi
check "dtf-ps@0 STATUS names its address ($(prop dtf-ps@0 StatusText))" \
	contains "$(prop dtf-ps@0 StatusText)" "serving on $PS_ADDR"
for u in dtf-worker@0 dtf-worker@1; do
	if wait_for 120 status_step_above "$u" 0; then
		pass "$u STATUS reports training: $(prop "$u" StatusText)"
	else
		fail "$u STATUS reports training (StatusText='$(prop "$u" StatusText)')"
	fi
done

# --- the shared-memory transport between the hardened units -----------------------

# The ps and both workers are separate sandboxed services (PrivateTmp=,
# PrivateDevices=, ProtectSystem=strict): they meet through the socket in
# /run/dtf (RuntimeDirectory=dtf) and memfd regions, not TCP.
# shm_connections N: dtf status --json says ps:0 has at least N shm peers
# (dtf status itself, as root, also comes through shared memory).
shm_connections() {
	local n
	n=$(in_ct dtf status --json 2>/dev/null | sed -n 's/.*"task":"ps:0"[^}]*"shm_connections":\([0-9]*\).*/\1/p')
	[ -n "$n" ] && [ "$n" -ge "$1" ]
}
for u in dtf-worker@0 dtf-worker@1; do
	line=$(in_ct journalctl --no-pager -o cat -u "$u.service" | grep 'Connected to ps' | tail -n1)
	check "$u reached the ps through shared memory: $line" contains "$line" "transport=shm"
done
check "the ps socket is in the units' runtime directory ($(in_ct ls -l /run/dtf 2>&1 | tr '\n' ' '))" \
	in_ct sh -c "test -S /run/dtf/ps-${PS_ADDR##*:}-*.sock"
shm_json=$(in_ct dtf status --json 2>&1 || true)
check "dtf status --json: ps:0 has the workers' shared-memory connections ($(grep -o '"transport":"[a-z]*","shm_connections":[0-9]*' <<<"$shm_json" | head -n1))" \
	wait_for 30 shm_connections 2
# A client trusts only a socket of its own user (or root's): as the units'
# user, dtf status itself comes through shared memory; as root, over TCP.
dtf_json=$(in_ct runuser -u dtf -- dtf status --json 2>&1 || true)
check "dtf status --json as the dtf user reaches ps:0 over shm ($(grep -o '"transport":"[a-z]*"' <<<"$dtf_json" | head -n1))" \
	contains "$dtf_json" '"transport":"shm"'
status_line=$(in_ct systemctl --no-pager status dtf-worker@0 2>&1 | grep -m1 'Status:' || true)
evaluator_scored() { contains "$(prop dtf-evaluator StatusText)" "newest step"; }
if wait_for 120 evaluator_scored; then
	pass "dtf-evaluator STATUS reports a scored checkpoint: $(prop dtf-evaluator StatusText)"
else
	fail "dtf-evaluator STATUS reports a scored checkpoint (StatusText='$(prop dtf-evaluator StatusText)')"
fi
check "systemctl status dtf-worker@0 shows the STATUS line ($status_line)" \
	contains "$status_line" step

# --- SIGKILL a worker -----------------------------------------------------------------

restarts_before=$(prop dtf-worker@1 NRestarts)
step_before=$(status_step dtf-worker@1)
log "systemctl kill -s KILL dtf-worker@1 (at step $step_before)"
in_ct systemctl kill -s KILL dtf-worker@1 || true
restarted() { [ "$(prop "$1" NRestarts)" -gt "$2" ] && is_active "$1"; }
if wait_for 60 restarted dtf-worker@1 "$restarts_before"; then
	pass "dtf-worker@1 restarted by systemd after SIGKILL (NRestarts $restarts_before -> $(prop dtf-worker@1 NRestarts)), active"
else
	fail "dtf-worker@1 restarted after SIGKILL (NRestarts=$(prop dtf-worker@1 NRestarts) ActiveState=$(prop dtf-worker@1 ActiveState))"
fi
if wait_for 90 status_step_above dtf-worker@1 "${step_before:-0}"; then
	pass "dtf-worker@1 trains again: $(prop dtf-worker@1 StatusText)"
else
	fail "dtf-worker@1 trains again (StatusText='$(prop dtf-worker@1 StatusText)')"
fi

# --- SIGKILL the ps ---------------------------------------------------------------------

# A checkpoint newer than the start must exist for the chief to restore.
# A timed checkpoint, past the one written at step 0 on init: the restore
# after the kill must bring back trained values, not the initial ones.
has_checkpoint() { in_ct sh -c 'ls /var/lib/dtf/checkpoints/' 2>/dev/null | grep -Eq '^model\.ckpt-[1-9][0-9]*\.safetensors$'; }
check "the chief wrote a timed checkpoint (step > 0) before the ps is killed" wait_for 30 has_checkpoint
ps_restarts=$(prop dtf-ps@0 NRestarts)
w0_restarts=$(prop dtf-worker@0 NRestarts)
w1_restarts=$(prop dtf-worker@1 NRestarts)
restored_before=$(journal_count dtf-worker@0 Restored)
declare -A step_before_ps_kill=([dtf-worker@0]=$(status_step dtf-worker@0) [dtf-worker@1]=$(status_step dtf-worker@1))
log "systemctl kill -s KILL dtf-ps@0 (at step ${step_before_ps_kill[dtf-worker@0]})"
in_ct systemctl kill -s KILL dtf-ps@0 || true
if wait_for 60 restarted dtf-ps@0 "$ps_restarts"; then
	pass "dtf-ps@0 restarted by systemd after SIGKILL (NRestarts $ps_restarts -> $(prop dtf-ps@0 NRestarts)), active"
else
	fail "dtf-ps@0 restarted after SIGKILL (NRestarts=$(prop dtf-ps@0 NRestarts) ActiveState=$(prop dtf-ps@0 ActiveState))"
fi
# The ps restores its own snapshot (ps.snapshot_secs = 1, in
# /var/lib/dtf/ps-0, the unit's StateDirectory) when it is newer than the
# newest checkpoint (every 2 s here); otherwise the chief re-seeds it from
# that checkpoint. Either way the step it resumes from is at most about a
# second of training behind the step before the kill.
resumed_from() {
	if [ "$(journal_count dtf-ps@0 'Shard restored from its snapshot')" -gt 0 ]; then
		in_ct journalctl --no-pager -o cat -u dtf-ps@0.service | grep 'Shard restored from its snapshot' | tail -n1
	elif [ "$(journal_count dtf-worker@0 Restored)" -gt "$restored_before" ]; then
		in_ct journalctl --no-pager -o cat -u dtf-worker@0.service | grep Restored | tail -n1
	else
		return 1
	fi
}
if wait_for 90 resumed_from; then
	line=$(resumed_from)
	pass "the restarted ps resumed: $line"
	resumed=$(printf '%s\n' "$line" | sed -n 's/.* step=\([0-9]*\).*/\1/p')
	before=${step_before_ps_kill[dtf-worker@0]:-0}
	# The reference model trains well under 2000 steps a second here.
	check "it resumed within 2000 steps of the step before the kill ($resumed vs $before)" \
		test "${resumed:-0}" -ge $((before > 2000 ? before - 2000 : 0))
	if [ "$(journal_count dtf-ps@0 'Shard restored from its snapshot')" -gt 0 ]; then
		check "the chief did not re-seed the ps that restored its snapshot" \
			test "$(journal_count dtf-worker@0 Restored)" = "$restored_before"
	fi
else
	fail "the restarted ps resumed (no 'Shard restored from its snapshot' from dtf-ps@0, no new 'Restored' from dtf-worker@0)"
fi
# Training resumes from the restored step, at or below the one before
# the kill: a STATUS past the latter is new progress.
for u in dtf-worker@0 dtf-worker@1; do
	if wait_for 90 status_step_above "$u" "${step_before_ps_kill[$u]:-0}"; then
		pass "$u trains after the ps restart: $(prop "$u" StatusText)"
	else
		fail "$u trains after the ps restart (StatusText='$(prop "$u" StatusText)', before the kill: step ${step_before_ps_kill[$u]:-?})"
	fi
done
check "the restarted ps serves the workers through shared memory again" wait_for 60 shm_connections 2
check "the workers rode out the ps restart without restarting themselves" \
	test "$(prop dtf-worker@0 NRestarts):$(prop dtf-worker@1 NRestarts)" = "$w0_restarts:$w1_restarts"
check "all units active after the ps restart" all_active

# --- reload ---------------------------------------------------------------------------------

# Counts per unit, before each reload.
declare -A reloaded rejected
# shellcheck disable=SC2034 # read through a nameref in expect_in_journals
count_reloads() {
	local u
	for u in "${UNITS[@]}"; do
		reloaded[$u]=$(journal_count "$u" 'Configuration reloaded')
		rejected[$u]=$(journal_count "$u" 'Reload rejected')
	done
}
# expect_in_journals PATTERN ARRAY WHAT: every unit logs PATTERN once more.
expect_in_journals() {
	local pattern=$1 what=$2 u
	local -n before=$3
	for u in "${UNITS[@]}"; do
		if wait_for 30 journal_count_above "$u" "$pattern" "${before[$u]}"; then
			pass "$u: $what: $(in_ct journalctl --no-pager -o cat -u "$u.service" | grep -- "$pattern" | tail -n1)"
		else
			fail "$u: $what (no new '$pattern' in its journal)"
		fi
	done
}

log "reload: edit checkpoint.save_secs 2 -> 3 in /etc/dtf/dtf.toml"
count_reloads
write_config $HUGE_STEP 3
expect_in_journals 'Configuration reloaded' "file change reloaded" reloaded
check "all units active after the reload" all_active

log "reload: an invalid value (batch_size = \"x\")"
count_reloads
sed -i 's/^batch_size = 100$/batch_size = "x"/' "$ROOT/etc/dtf/dtf.toml"
check "the invalid file has batch_size = \"x\"" grep -q '^batch_size = "x"' "$ROOT/etc/dtf/dtf.toml"
expect_in_journals 'Reload rejected' "invalid value rejected" rejected
msg=$(in_ct journalctl --no-pager -o cat -u dtf-worker@0.service | grep 'Reload rejected' | tail -n1)
check "the rejection names the key batch_size" contains "$msg" batch_size
if in_ct systemctl reload dtf-ps@0 >/dev/null 2>&1; then
	fail "systemctl reload dtf-ps@0 with an invalid file fails (it returned 0)"
else
	pass "systemctl reload dtf-ps@0 with an invalid file fails (ExecReload's check-config)"
fi
check "all units still active with an invalid file" all_active

log "reload: a change that cannot be live (cluster.worker)"
count_reloads
# The valid file back, with save_secs 3 -> 4 so that the reload has a change
# to log (one that changes nothing logs at DEBUG); wait for it before the
# next edit.
write_config $HUGE_STEP 4
expect_in_journals 'Configuration reloaded' "valid file back, reloaded" reloaded
count_reloads
sed -i "s/\"$W1_ADDR\"/\"127.0.0.1:2299\"/" "$ROOT/etc/dtf/dtf.toml"
expect_in_journals 'Reload rejected' "cluster change rejected" rejected
msg=$(in_ct journalctl --no-pager -o cat -u dtf-ps@0.service | grep 'Reload rejected' | tail -n1)
check "the rejection names cluster.worker" contains "$msg" cluster.worker
check "all units still active after the rejected cluster change" all_active

log "systemctl reload dtf-ps@0 with the valid file"
count_reloads
# save_secs 4 -> 3: a change, so the reload logs it.
write_config $HUGE_STEP 3
expect_in_journals 'Configuration reloaded' "valid file back, reloaded" reloaded
# The file is applied already: this SIGHUP changes nothing, which dtf logs
# at DEBUG only; systemd's own "Reloaded" line says ExecReload= (check-config,
# then SIGHUP) went through, and the ps must still be active after it.
sighup_before=$(journal_count dtf-ps@0 'Reloaded')
if in_ct systemctl reload dtf-ps@0; then
	pass "systemctl reload dtf-ps@0 returns 0"
else
	fail "systemctl reload dtf-ps@0"
fi
if wait_for 30 journal_count_above dtf-ps@0 'Reloaded' "$sighup_before"; then
	pass "systemd logs dtf-ps@0 reloaded after systemctl reload"
else
	fail "systemd logs dtf-ps@0 reloaded after systemctl reload"
fi
check "dtf-ps@0 active after systemctl reload" is_active dtf-ps@0

# --- membership: a worker joins and leaves the running cluster --------------------------

log "membership: add worker 2 to cluster.worker, then systemctl start dtf-worker@2"
restarts_before_join="$(prop dtf-ps@0 NRestarts):$(prop dtf-worker@0 NRestarts):$(prop dtf-worker@1 NRestarts)"
count_reloads
WORKER_LIST="\"$W0_ADDR\", \"$W1_ADDR\", \"$W2_ADDR\""
write_config $HUGE_STEP 3
expect_in_journals 'Configuration reloaded' "worker 2 added, reloaded" reloaded
check "dtf-ps@0 applied the new membership" wait_for 30 journal_count_above dtf-ps@0 'Membership changed' 0
if in_ct timeout 120 systemctl start dtf-worker@2; then
	pass "systemctl start dtf-worker@2 returns 0 (joined: connected and training)"
else
	fail "systemctl start dtf-worker@2"
fi
check "dtf-worker@2 trains: $(prop dtf-worker@2 StatusText)" wait_for 90 status_step_above dtf-worker@2 0
check "dtf-ps@0 logs that worker 2 joined" wait_for 30 journal_count_above dtf-ps@0 'Worker joined' 0
w2_live() { in_ct dtf status 2>/dev/null | grep -E '^worker:2 ' | grep -q live; }
check "dtf status lists worker:2 live" wait_for 30 w2_live
check "no other unit restarted for the join" \
	test "$(prop dtf-ps@0 NRestarts):$(prop dtf-worker@0 NRestarts):$(prop dtf-worker@1 NRestarts)" = "$restarts_before_join"
check "all units active after the join" all_active

log "membership: remove worker 2 from cluster.worker"
count_reloads
WORKER_LIST="\"$W0_ADDR\", \"$W1_ADDR\""
write_config $HUGE_STEP 3
w2_gone() { [ "$(prop dtf-worker@2 ActiveState)" = inactive ]; }
if wait_for 60 w2_gone; then
	pass "dtf-worker@2 stopped by itself: ActiveState=inactive Result=$(prop dtf-worker@2 Result)"
else
	fail "dtf-worker@2 stops when removed (ActiveState=$(prop dtf-worker@2 ActiveState))"
fi
check "dtf-worker@2 ended with Result=success (exit 0, not failed)" test "$(prop dtf-worker@2 Result)" = success
check "dtf-worker@2 was not restarted (NRestarts=$(prop dtf-worker@2 NRestarts))" test "$(prop dtf-worker@2 NRestarts)" = 0
check "dtf-worker@2 logged that it left the cluster" journal_count_above dtf-worker@2 'Left the cluster' 0
check "all units active after the leave" all_active

# --- re-shard: the ps list grows and shrinks back ---------------------------------------

# Every task starts again in its own process (the same PID: systemd sees a
# reload, not a restart), and the chief seeds the new placement from the
# checkpoint it wrote of the old one.
pids() { echo "$(prop dtf-ps@0 MainPID):$(prop dtf-worker@0 MainPID):$(prop dtf-worker@1 MainPID)"; }
restarts() { echo "$(prop dtf-ps@0 NRestarts):$(prop dtf-worker@0 NRestarts):$(prop dtf-worker@1 NRestarts)"; }
# reshard_step N: the step of the chief's Nth re-shard checkpoint.
reshard_step() {
	in_ct journalctl --no-pager -o cat -u dtf-worker@0.service | grep 'Re-shard checkpoint done' |
		sed -n "${1}s/.*global_step=\([0-9]*\).*/\1/p"
}
# resharded N: the chief has written its Nth re-shard checkpoint, seeded
# the new placement from it, and trains past it.
resharded() {
	local step
	step=$(reshard_step "$1")
	[ -n "$step" ] && journal_count_above dtf-worker@0 "Restored the model from the newest valid checkpoint.*step=$step " 0 &&
		status_step_above dtf-worker@0 "$step"
}
ps1_listed() { in_ct dtf status 2>/dev/null | grep -E '^ps:1 ' | grep -q ' yes '; }

log "re-shard: add ps 1 to cluster.ps, then systemctl start dtf-ps@1"
pids_before=$(pids)
restarts_before=$(restarts)
count_reloads
PS_LIST="\"$PS_ADDR\", \"$PS1_ADDR\""
write_config $HUGE_STEP 3
expect_in_journals 'Configuration reloaded' "ps 1 added, reloaded" reloaded
if in_ct timeout 120 systemctl start dtf-ps@1; then
	pass "systemctl start dtf-ps@1 returns 0"
else
	fail "systemctl start dtf-ps@1"
fi
check "the chief checkpointed at the re-shard, seeded 2 ps from it and trains on (step $(reshard_step 1))" \
	wait_for 120 resharded 1
check "dtf status lists ps:1 reachable" wait_for 30 ps1_listed
check "every task started again in place (same PIDs: $pids_before)" test "$(pids)" = "$pids_before"
check "systemd restarted nothing (NRestarts $(restarts))" test "$(restarts)" = "$restarts_before"
check "dtf-ps@0 logged its start again" journal_count_above dtf-ps@0 'Starting again under the new cluster.ps' 0
check "all units active after the re-shard, dtf-ps@1 too" all_active
check "dtf-ps@1 is active" is_active dtf-ps@1

log "re-shard: remove ps 1 from cluster.ps"
count_reloads
PS_LIST="\"$PS_ADDR\""
write_config $HUGE_STEP 3
ps1_gone() { [ "$(prop dtf-ps@1 ActiveState)" = inactive ]; }
check "dtf-ps@1 stopped by itself" wait_for 120 ps1_gone
check "dtf-ps@1 ended with Result=success, not restarted ($(prop dtf-ps@1 Result), NRestarts=$(prop dtf-ps@1 NRestarts))" \
	test "$(prop dtf-ps@1 Result):$(prop dtf-ps@1 NRestarts)" = success:0
check "dtf-ps@1 said it is no longer listed" journal_count_above dtf-ps@1 'No longer in cluster.ps' 0
check "the chief re-sharded back to 1 ps and trains on (step $(reshard_step 2))" wait_for 120 resharded 2
check "still the same processes ($(pids))" test "$(pids)" = "$pids_before"
check "all units active after the second re-shard" all_active

# --- to the end of the run -------------------------------------------------------------

now=$(status_step dtf-worker@0)
last=$((${now:-0} + 500))
[ "$last" -ge "$FINAL_STEPS" ] || last=$FINAL_STEPS
log "reload: last_step = $last (now at step ${now:-?})"
count_reloads
write_config "$last" 3
expect_in_journals 'Configuration reloaded' "last_step reloaded" reloaded

all_inactive() {
	local u s
	for u in "${UNITS[@]}"; do
		s=$(prop "$u" ActiveState)
		[ "$s" = inactive ] || [ "$s" = failed ] || return 1
	done
}
if wait_for 600 all_inactive; then
	pass "every unit stopped by itself at last_step"
else
	fail "every unit stopped by itself at last_step ($(for u in "${UNITS[@]}"; do printf '%s=%s ' "$u" "$(prop "$u" ActiveState)"; done))"
fi
for u in "${UNITS[@]}"; do
	r=$(in_ct systemctl show -p Result -p ActiveState -p ExecMainStatus "$u.service" | tr '\n' ' ')
	check "$u ended cleanly: $r" test "$(prop "$u" Result):$(prop "$u" ActiveState):$(prop "$u" ExecMainStatus)" = success:inactive:0
done
ckpts=$(in_ct sh -c 'cd /var/lib/dtf/checkpoints && ls' 2>&1 | tr '\n' ' ')
final_ckpt=$(in_ct sh -c 'ls /var/lib/dtf/checkpoints/' 2>/dev/null |
	sed -n 's/^model\.ckpt-\([0-9]\+\)\.safetensors$/\1/p' | sort -n | tail -n1)
check "a final checkpoint at step >= $last (${final_ckpt:-none}; $ckpts)" \
	test "${final_ckpt:-0}" -ge "$last"
check "its EMA shadows: model.ckpt-${final_ckpt:-?}.ema.safetensors" \
	in_ct test -s "/var/lib/dtf/checkpoints/model.ckpt-${final_ckpt:-x}.ema.safetensors"
check "the checkpoint index names it" \
	in_ct grep -q "model.ckpt-${final_ckpt:-x}" /var/lib/dtf/checkpoints/checkpoint.dtf
eval_json=$(in_ct dtf eval /var/lib/dtf/checkpoints --json 2>&1 || true)
acc=$(sed -n 's/.*"accuracy":\([0-9.eE+-]*\).*/\1/p' <<<"$eval_json")
ema=$(sed -n 's/.*"ema_accuracy":\([0-9.eE+-]*\).*/\1/p' <<<"$eval_json")
if [ -n "$acc" ] && awk -v a="$acc" -v m="$MIN_ACCURACY" 'BEGIN { exit !(a > m) }'; then
	pass "dtf eval --json: accuracy $acc > $MIN_ACCURACY (ema $ema)"
else
	fail "dtf eval --json: accuracy > $MIN_ACCURACY (got: $eval_json)"
fi
check "dtf eval evaluated the final checkpoint" \
	contains "$eval_json" "\"global_step\":${final_ckpt:-x},"
# The evaluator scored checkpoints while the cluster trained, then the final one.
scored=$(journal_count dtf-evaluator 'Checkpoint scored.')
check "dtf-evaluator scored checkpoints while training ($scored)" test "${scored:-0}" -ge 2
check "dtf-evaluator wrote TensorBoard events to checkpoints/eval/" \
	in_ct sh -c 'ls /var/lib/dtf/checkpoints/eval/events.out.tfevents.* >/dev/null'
check "dtf-evaluator scored the final checkpoint (step ${final_ckpt:-?})" \
	in_ct grep -q "\"global_step\":${final_ckpt:-x}," /var/lib/dtf/checkpoints/eval/evaluated.jsonl
nbest=$(in_ct sh -c 'ls /var/lib/dtf/checkpoints/best/' 2>/dev/null | grep -c '^model\.ckpt-[0-9]*\.safetensors$' || true)
check "best/ holds 1 to 3 checkpoints ($nbest)" test "${nbest:-0}" -ge 1 -a "${nbest:-0}" -le 3
best_json=$(in_ct dtf eval /var/lib/dtf/checkpoints/best --json 2>&1 || true)
best_step=$(in_ct sed -n 's/.*"file": "model\.ckpt-\([0-9]*\)\.safetensors".*/\1/p' /var/lib/dtf/checkpoints/best/index.json 2>/dev/null | head -n1)
check "dtf eval checkpoints/best evaluates the best one, step ${best_step:-?} ($best_json)" \
	contains "$best_json" "\"global_step\":${best_step:-x},"

# A task started again on a complete run says so and exits 0 at once
# (docs/design.md, Recovery), without a restart loop.
for u in dtf-ps@0 dtf-worker@0; do
	in_ct timeout 30 systemctl start "$u" >/dev/null 2>&1
	# Long enough for systemd to have restarted it (RestartSec=1) if it would.
	sleep 3
	r=$(in_ct systemctl show -p Result -p NRestarts -p ExecMainStatus -p ActiveState "$u.service" | tr '\n' ' ')
	check "$u started again on the complete run exits 0 at once ($r)" \
		test "$(prop "$u" Result):$(prop "$u" ActiveState):$(prop "$u" ExecMainStatus):$(prop "$u" NRestarts)" = success:inactive:0:0
done
msg=$(in_ct journalctl --no-pager -o cat -u dtf-worker@0.service | grep 'already complete' | tail -n1)
check "the chief says the run is complete: $msg" contains "$msg" "already complete"
# A non-chief worker that sees the final checkpoint exits 0 at once; one
# that cannot (a multi-host cluster) cannot tell ps tasks that exited on a
# complete run from ps tasks not up yet, so it waits (as TensorFlow's workers
# do), saying why on a schedule, and does not crash-loop. Either is right.
w1_restarts=$(prop dtf-worker@1 NRestarts)
since=$(in_ct date '+%Y-%m-%d %H:%M:%S')
in_ct systemctl start --no-block dtf-worker@1 >/dev/null 2>&1
why=
for _ in $(seq 1 60); do
	[ "$(prop dtf-worker@1 ActiveState):$(prop dtf-worker@1 Result)" = inactive:success ] && break
	why=$(in_ct journalctl --no-pager -o cat --since "$since" -u dtf-worker@1.service | grep 'Waiting for the ps tasks' | tail -n1 || true)
	[ -n "$why" ] && break
	sleep 0.5
done
r=$(in_ct systemctl show -p Result -p ActiveState -p ExecMainStatus dtf-worker@1.service | tr '\n' ' ')
if [ -n "$why" ]; then
	check "dtf-worker@1 started again on the complete run says why it waits: $why" \
		contains "$why" "if the run is already complete they have exited"
else
	check "dtf-worker@1 started again on the complete run exits 0 ($r)" \
		test "$(prop dtf-worker@1 ActiveState):$(prop dtf-worker@1 Result)" = inactive:success
fi
check "dtf-worker@1 on the complete run does not restart in a loop" \
	test "$(prop dtf-worker@1 NRestarts)" = "$w1_restarts"
in_ct systemctl stop dtf-worker@1 >/dev/null 2>&1

# --- mutual TLS: a second run through the units, as user dtf ------------------------------

log "mutual TLS: a new run with security.tls_* (certificates from openssl)"
tls=$RUN/tls
mkdir -p "$tls"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2)
if quiet openssl req -x509 "${ec[@]}" -subj "/CN=dtf system test CA" -keyout "$tls/ca.key" -out "$tls/ca.crt" &&
	quiet openssl req "${ec[@]}" -subj "/CN=dtf host" -keyout "$tls/host.key" -out "$tls/host.csr" &&
	printf 'subjectAltName=IP:127.0.0.1\n' >"$tls/ext" &&
	quiet openssl x509 -req -in "$tls/host.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
		-days 2 -extfile "$tls/ext" -out "$tls/host.crt"; then
	pass "openssl: a CA and a host certificate for 127.0.0.1"
else
	fail "openssl: a CA and a host certificate for 127.0.0.1"
fi
mkdir -p "$ROOT/etc/dtf/tls"
install -m 644 "$tls/ca.crt" "$tls/host.crt" "$ROOT/etc/dtf/tls/"
install -m 640 "$tls/host.key" "$ROOT/etc/dtf/tls/"
in_ct chgrp dtf /etc/dtf/tls/host.key
in_ct rm -rf /var/lib/dtf/checkpoints
TLS_SECTION='[security]
tls_cert = "/etc/dtf/tls/host.crt"
tls_key = "/etc/dtf/tls/host.key"
tls_ca = "/etc/dtf/tls/ca.crt"'
write_config $HUGE_STEP 3 "" "$TLS_SECTION"
for u in "${UNITS[@]}"; do in_ct systemctl reset-failed "$u.service" >/dev/null 2>&1 || true; done
trained=$(journal_count dtf-worker@1 'Training.')
if in_ct timeout 180 systemctl start "${UNITS[@]}"; then
	pass "systemctl start ${UNITS[*]} with TLS returns 0"
else
	fail "systemctl start ${UNITS[*]} with TLS"
fi
if wait_for 120 journal_count_above dtf-worker@1 'Training.' "$trained" &&
	wait_for 60 status_step_above dtf-worker@1 0; then
	pass "dtf-worker@1 trains over TLS: $(prop dtf-worker@1 StatusText)"
else
	fail "dtf-worker@1 trains over TLS (StatusText='$(prop dtf-worker@1 StatusText)')"
fi
msg=$(in_ct journalctl --no-pager -o cat -u dtf-ps@0.service | grep 'Parameter server ready' | tail -n1)
check "dtf-ps@0 says it serves TLS: $msg" contains "$msg" "tls=true"
tls_status=$(in_ct dtf status 2>&1 || true)
check "dtf status reaches the ps over TLS" in_ct dtf status
# The same cluster without the tls_* keys: the ps answers no plaintext client.
in_ct sh -c 'grep -v "^tls_" /etc/dtf/dtf.toml >/root/plain.toml'
check "the same config without tls_* is valid" quiet in_ct dtf check-config -c /root/plain.toml
if in_ct dtf status -c /root/plain.toml >/dev/null 2>&1; then
	fail "dtf status without TLS is refused by the ps ($tls_status)"
else
	pass "dtf status without TLS is refused by the ps"
fi
plain_status=$(in_ct dtf status -c /root/plain.toml 2>&1 || true)
check "dtf status says why: $(grep unreachable <<<"$plain_status" || true)" \
	contains "$plain_status" "TLS, which is not set here"
now=$(status_step dtf-worker@0)
last=$((${now:-0} + 300))
log "reload: last_step = $last (now at step ${now:-?})"
count_reloads
write_config "$last" 3 "" "$TLS_SECTION"
expect_in_journals 'Configuration reloaded' "last_step reloaded (TLS run)" reloaded
if wait_for 300 all_inactive; then
	pass "the TLS run stopped by itself at last_step"
else
	fail "the TLS run stopped by itself at last_step"
fi
for u in "${UNITS[@]}"; do
	check "$u ended cleanly (TLS run)" test "$(prop "$u" Result):$(prop "$u" ExecMainStatus)" = success:0
done
final_ckpt=$(in_ct sh -c 'ls /var/lib/dtf/checkpoints/' 2>/dev/null |
	sed -n 's/^model\.ckpt-\([0-9]\+\)\.safetensors$/\1/p' | sort -n | tail -n1)
check "the TLS run's final checkpoint is at step >= $last (${final_ckpt:-none})" \
	test "${final_ckpt:-0}" -ge "$last"

# --- a broken configuration: exit 78, no restart loop ---------------------------------------

log "systemctl start dtf-worker@7 (not in the cluster)"
if in_ct timeout 60 systemctl start dtf-worker@7 >/dev/null 2>&1; then
	fail "systemctl start dtf-worker@7 fails"
else
	pass "systemctl start dtf-worker@7 fails"
fi
# Long enough for a few restarts (RestartSec=1) if they would happen.
sleep 5
w7=$(in_ct systemctl show -p Result -p NRestarts -p ExecMainStatus -p ActiveState dtf-worker@7.service | tr '\n' ' ')
# Whichever process failed (ExecStartPre's check-config or the daemon), systemd
# logs its status; ExecMainStatus alone misses the former.
w7_exit=$(in_ct journalctl --no-pager -o cat -u dtf-worker@7.service | grep -m1 'exited, code=exited, status=' || true)
if [[ "$(prop dtf-worker@7 ExecMainStatus)" == 78 || "$w7_exit" == *"status=78/CONFIG"* ]]; then
	pass "dtf-worker@7 exits 78 (EX_CONFIG): $w7_exit"
else
	fail "dtf-worker@7 exits 78 (EX_CONFIG): $w7 journal: ${w7_exit:-nothing}"
fi
check "dtf-worker@7 is not restarted in a loop ($w7)" test "$(prop dtf-worker@7 NRestarts)" = 0
check "dtf-worker@7 failed, not activating ($w7)" test "$(prop dtf-worker@7 ActiveState)" = failed
msg=$(in_ct journalctl --no-pager -o cat -u dtf-worker@7.service | grep -m1 '^error:' || true)
check "its journal says why: $msg" contains "$msg" "worker:7"

# --- verdict ----------------------------------------------------------------------------------

echo
if [ "$failures" -eq 0 ]; then
	log "system test: PASS ($checks checks)"
else
	log "system test: FAIL ($failures of $checks checks failed)"
	exit 1
fi
