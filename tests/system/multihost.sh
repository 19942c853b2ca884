#!/usr/bin/env bash
# The package on several hosts: the acceptance test of a systemd fleet
# (docs/deploy.md), and of the image where podman runs.
#
#   tests/system/multihost.sh      (as root, on Debian 12; scripts/test.sh --full)
#
# Four Debian 12 machines booted with systemd-nspawn (systemd as PID 1), each
# its own host: its own hostname, network namespace and systemd, joined by a
# bridge that lives in a network namespace of its own (nothing of it is in
# the host's network):
#
#   dtf-ps    10.77.0.1   dtf-ps@0
#   dtf-w0    10.77.0.2   dtf-worker@0 (the chief) and dtf-evaluator: the
#                         only host with checkpoints
#   dtf-w1    10.77.0.3   dtf-worker@1
#   dtf-ctl   10.77.0.4   no task: the operator's `dtf status`
#
# Each installs the .deb alone (apt-get, no network), gets the one dtf.toml,
# the first host's token and its own TLS certificate (mutual TLS between all
# of them). Checks: the cluster trains over TLS across hosts; `dtf status`
# from the fourth host shows every task; `systemctl kill -s KILL` of the
# ps's unit on its host (systemd restarts it, the chief re-seeds it from its
# checkpoint on another host, both workers train on); the worker host's
# container powered off and booted again (its unit, enabled, starts at boot
# and trains again); the run ends at last_step on every host, with the
# checkpoints only on the chief's host.
#
# Then, if podman runs here, the same cluster from the image
# (scripts/image.sh): the ps and both workers as image containers in three
# more network namespaces on the bridge (10.77.0.11-13), TLS, trained to
# last_step, `dtf status` from dtf-ctl. If podman is missing or cannot run
# a container here, that part says so and is skipped (not failed).
#
# Why not in CI's default run: it boots four machines and trains two
# clusters, about 5-10 minutes on a shared 2-core machine, beyond what the
# suite's budget leaves; scripts/test.sh --full runs it.
#
# Environment: as tests/system/run.sh (DTF_SYSTEM_TEST_CACHE,
# DTF_SYSTEM_TEST_MIRROR, DTF_DEB); DTF_IMAGE: the OCI archive to run
# (default: build it with scripts/image.sh); DTF_SKIP_IMAGE=1 skips it.
set -euo pipefail
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive

cd "$(dirname "$0")/../.."
SRC=$(pwd)

CACHE=${DTF_SYSTEM_TEST_CACHE:-/var/cache/dtf-system-test}
# The same cached root as tests/system/run.sh (same recipe name and steps).
ROOT_RECIPE=v2
CACHED_ROOT=$CACHE/bookworm-root-$ROOT_RECIPE
ROOT_PACKAGES=systemd,systemd-sysv,dbus,adduser
ROOT_EXTRA=dataset-fashion-mnist
ROOT_OFFLINE=procps

NET=10.77.0
HOSTS=(ps w0 w1 ctl)
declare -A ADDR=([ps]=$NET.1 [w0]=$NET.2 [w1]=$NET.3 [ctl]=$NET.4)
PORT=2222
HUGE_STEP=100000000
TAG=$$

ME=multihost
# log, die, pass, fail, skip, check, wait_for, host_mirror.
# shellcheck source=tests/system/lib.sh
. "$SRC/tests/system/lib.sh"

[ "$(id -u)" = 0 ] || die "must run as root (systemd-nspawn, ip netns)"

need=
command -v systemd-nspawn >/dev/null || need="$need systemd-container"
command -v debootstrap >/dev/null || need="$need debootstrap"
command -v openssl >/dev/null || need="$need openssl"
command -v ip >/dev/null || need="$need iproute2"
if [ -n "$need" ]; then
	log "apt-get install$need"
	apt-get update -qq
	# shellcheck disable=SC2086 # a list of package names
	apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# --- the .deb and the cached root (as tests/system/run.sh) --------------------------

if [ -n "${DTF_DEB:-}" ]; then
	DEB=$(readlink -f "$DTF_DEB")
else
	version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
	DEB=$SRC/target/debian/dtf_${version}-1_$(dpkg --print-architecture).deb
	if [ ! -f "$DEB" ]; then
		log "cargo build --release && cargo deb --no-build"
		cargo build --release --locked -q
		cargo deb --no-build -q >/dev/null
	fi
fi
[ -f "$DEB" ] || die "no package $DEB"
debname=$(basename "$DEB")
log "package: $DEB"

if [ ! -d "$CACHED_ROOT" ]; then
	mirror=${DTF_SYSTEM_TEST_MIRROR:-$(host_mirror)}
	mkdir -p "$CACHE"
	tmp=$(mktemp -d "$CACHE/bookworm-root.tmp.XXXXXX")
	chmod 0755 "$tmp"
	# shellcheck disable=SC2064 # expand $tmp now
	trap "umount -l '$tmp/proc' 2>/dev/null; rm -rf '$tmp'" EXIT
	log "debootstrap bookworm from $mirror (a few minutes, once)"
	debootstrap --variant=minbase --include="$ROOT_PACKAGES" bookworm "$tmp" "$mirror" \
		>"$CACHE/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
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
	echo dtf-systest >"$tmp/etc/hostname"
	mv -T "$tmp" "$CACHED_ROOT" 2>/dev/null || rm -rf "$tmp"
	trap - EXIT
else
	log "cached root: $CACHED_ROOT"
fi

# --- the network: a bridge in a namespace of its own, a namespace per host -----------

RUN=$(mktemp -d /var/tmp/dtf-multihost.XXXXXX)
SWITCH=dtfmh-sw-$TAG
NETNS=("$SWITCH")
declare -A NSPAWN_PID=() PID=()
IMAGE_CONTAINERS=()

netns_of() { echo "dtfmh-$1-$TAG"; }
# plug NAME ADDRESS: a namespace for NAME with eth0 at ADDRESS on the bridge.
plug() {
	local ns
	ns=$(netns_of "$1")
	ip netns add "$ns"
	NETNS+=("$ns")
	ip link add eth0 netns "$ns" type veth peer name "p-$1" netns "$SWITCH"
	ip -n "$SWITCH" link set "p-$1" master br0 up
	ip -n "$ns" addr add "$2/24" dev eth0
	ip -n "$ns" link set lo up
	ip -n "$ns" link set eth0 up
}

in_ct() { nsenter -t "${PID[$1]}" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
	SYSTEMD_PAGER= SYSTEMD_COLORS=0 DEBIAN_FRONTEND=noninteractive "${@:2}"; }

# boot HOST: systemd-nspawn on the host's root, in its namespace.
boot() {
	local h=$1
	systemd-nspawn -q -D "$RUN/$h" --boot --register=no --keep-unit --console=passive \
		--network-namespace-path="/run/netns/$(netns_of "$h")" --hostname="dtf-$h" \
		--machine="dtf-$h-$TAG" >>"$RUN/nspawn-$h.log" 2>&1 &
	NSPAWN_PID[$h]=$!
	PID[$h]=
}
container_pid() {
	local h=$1 c
	kill -0 "${NSPAWN_PID[$h]}" 2>/dev/null || { cat "$RUN/nspawn-$h.log" >&2; die "systemd-nspawn of $h exited"; }
	c=$(cat /proc/"${NSPAWN_PID[$h]}"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 . || true)
	[ -n "$c" ] && [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ] && PID[$h]=$c
}
system_up() {
	local s
	s=$(in_ct "$1" systemctl is-system-running 2>/dev/null || true)
	case $s in running | degraded) return 0 ;; *) return 1 ;; esac
}
# poweroff HOST: a clean shutdown of its systemd, SIGKILL after 30 s.
poweroff() {
	local h=$1
	[ -n "${NSPAWN_PID[$h]:-}" ] && kill -0 "${NSPAWN_PID[$h]}" 2>/dev/null || return 0
	[ -n "${PID[$h]:-}" ] && timeout 10 nsenter -t "${PID[$h]}" -a systemctl poweroff >/dev/null 2>&1
	for _ in $(seq 60); do
		kill -0 "${NSPAWN_PID[$h]}" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "${NSPAWN_PID[$h]}" 2>/dev/null; then
		kill -KILL "${NSPAWN_PID[$h]}"
	fi
	wait "${NSPAWN_PID[$h]}" 2>/dev/null || true
	NSPAWN_PID[$h]=
}

teardown() {
	local rc=$? h ns c
	set +e
	if [ "$failures" -gt 0 ] || [ "$rc" -ne 0 ]; then
		for h in ps w0 w1; do
			[ -n "${PID[$h]:-}" ] || continue
			echo "---- journal of the dtf units on dtf-$h ----"
			in_ct "$h" journalctl --no-pager -o short-monotonic -u 'dtf-*' 2>&1 | tail -n 120
		done
		for c in "${IMAGE_CONTAINERS[@]}"; do
			echo "---- podman logs $c ----"
			podman logs "$c" 2>&1 | tail -n 60
		done
	fi
	for c in "${IMAGE_CONTAINERS[@]}"; do podman rm -f -t 5 "$c" >/dev/null 2>&1; done
	for h in "${HOSTS[@]}"; do poweroff "$h"; done
	for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "$RUN"
	log "torn down"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

ip netns add "$SWITCH"
ip -n "$SWITCH" link add br0 type bridge
ip -n "$SWITCH" link set br0 up
for h in "${HOSTS[@]}"; do
	plug "$h" "${ADDR[$h]}"
	log "dtf-$h: copying the root"
	cp -a "$CACHED_ROOT" "$RUN/$h"
	echo "dtf-$h" >"$RUN/$h/etc/hostname"
	cp "$DEB" "$RUN/$h/root/"
	boot "$h"
done
for h in "${HOSTS[@]}"; do
	wait_for 30 container_pid "$h" || die "no systemd in dtf-$h"
	wait_for 120 system_up "$h" || die "dtf-$h did not boot ($(in_ct "$h" systemctl is-system-running 2>&1))"
done
pass "four hosts booted: $(for h in "${HOSTS[@]}"; do printf '%s ' "$(in_ct "$h" hostname)"; done)"

set +e

# --- install, token, TLS, config --------------------------------------------------------

for h in "${HOSTS[@]}"; do
	if in_ct "$h" apt-get install -y -q --no-install-recommends "/root/$debname" >"$RUN/apt-$h.log" 2>&1; then
		pass "dtf-$h: apt-get install the .deb (no network)"
	else
		cat "$RUN/apt-$h.log"
		fail "dtf-$h: apt-get install the .deb"
		exit 1
	fi
done
# One token for the cluster: the first host's, copied to the others.
for h in w0 w1 ctl; do
	install -m 640 "$RUN/ps/etc/dtf/token" "$RUN/$h/etc/dtf/token"
	in_ct "$h" chgrp dtf /etc/dtf/token
done
check "one token on every host" test "$(md5sum "$RUN"/{ps,w0,w1,ctl}/etc/dtf/token | cut -d' ' -f1 | sort -u | wc -l)" = 1

tls=$RUN/tls
mkdir -p "$tls"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2)
quiet openssl req -x509 "${ec[@]}" -subj "/CN=dtf multihost CA" -keyout "$tls/ca.key" -out "$tls/ca.crt" ||
	die "openssl: the CA"
# cert NAME IP: a certificate for IP signed by the CA, in $tls/NAME.{crt,key}.
cert() {
	quiet openssl req "${ec[@]}" -subj "/CN=$1" -keyout "$tls/$1.key" -out "$tls/$1.csr" &&
		printf 'subjectAltName=IP:%s\n' "$2" >"$tls/$1.ext" &&
		quiet openssl x509 -req -in "$tls/$1.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" \
			-CAcreateserial -days 2 -extfile "$tls/$1.ext" -out "$tls/$1.crt"
}
for h in "${HOSTS[@]}"; do
	cert "$h" "${ADDR[$h]}" || die "openssl: the certificate of $h"
	mkdir -p "$RUN/$h/etc/dtf/tls"
	install -m 644 "$tls/ca.crt" "$RUN/$h/etc/dtf/tls/ca.crt"
	install -m 644 "$tls/$h.crt" "$RUN/$h/etc/dtf/tls/host.crt"
	install -m 640 "$tls/$h.key" "$RUN/$h/etc/dtf/tls/host.key"
	in_ct "$h" chgrp dtf /etc/dtf/tls/host.key
done

# config FILE PS W0 W1 LAST_STEP: the cluster's one dtf.toml.
config() {
	cat >"$1.new" <<-EOF
		# dtf multi-host test: the same file on every host.
		[cluster]
		ps = ["$2:$PORT"]
		worker = ["$3:$PORT", "$4:$PORT"]
		[train]
		last_step = $5
		log_step_count_steps = 50
		[checkpoint]
		dir = "/var/lib/dtf/checkpoints"
		save_secs = 2
		[security]
		tls_cert = "/etc/dtf/tls/host.crt"
		tls_key = "/etc/dtf/tls/host.key"
		tls_ca = "/etc/dtf/tls/ca.crt"
		[metrics]
		listen = "0.0.0.0:9464"
	EOF
	chmod 644 "$1.new"
	mv "$1.new" "$1"
}
write_config() {
	local h
	for h in "${HOSTS[@]}"; do config "$RUN/$h/etc/dtf/dtf.toml" "${ADDR[ps]}" "${ADDR[w0]}" "${ADDR[w1]}" "$1"; done
}
write_config $HUGE_STEP
for h in "${HOSTS[@]}"; do
	check "dtf-$h: dtf check-config accepts the cluster's file" quiet in_ct "$h" dtf check-config
done

# --- helpers -------------------------------------------------------------------------------

prop() { in_ct "$1" systemctl show -P "$3" "$2.service" 2>/dev/null; }
is_active() { [ "$(prop "$1" "$2" ActiveState)" = active ]; }
status_step() { prop "$1" "$2" StatusText | sed -n 's/^step \([0-9]\+\) .*/\1/p'; }
status_step_above() {
	local s
	s=$(status_step "$1" "$2")
	[ -n "$s" ] && [ "$s" -gt "$3" ]
}
journal_count() { in_ct "$1" journalctl --no-pager -o cat -u "$2.service" 2>/dev/null | grep -c -- "$3" || true; }
journal_count_above() { [ "$(journal_count "$1" "$2" "$3")" -gt "$4" ]; }
# The operator's view, from the fourth host.
status_json() { in_ct ctl dtf status --json 2>&1; }
# workers_live: dtf status on dtf-ctl shows every ps reachable and both workers live.
workers_live() {
	local j
	j=$(status_json)
	[ "$(grep -o '"contact":"live"' <<<"$j" | wc -l)" -eq 2 ] &&
		contains "$j" '"task":"ps:0"' && ! contains "$j" '"reachable":false'
}

# --- start: each host its own units ----------------------------------------------------

log "starting: dtf-ps@0 on dtf-ps, dtf-worker@0 + dtf-evaluator on dtf-w0, dtf-worker@1 on dtf-w1"
check "dtf-ps: systemctl enable --now dtf-ps@0" quiet in_ct ps timeout 120 systemctl enable --now dtf-ps@0
check "dtf-w0: systemctl enable --now dtf-worker@0 dtf-evaluator" \
	quiet in_ct w0 timeout 180 systemctl enable --now dtf-worker@0 dtf-evaluator
check "dtf-w1: systemctl enable --now dtf-worker@1" quiet in_ct w1 timeout 180 systemctl enable --now dtf-worker@1
msg=$(in_ct ps journalctl --no-pager -o cat -u dtf-ps@0.service | grep 'Parameter server ready' | tail -n1)
check "the ps serves TLS on ${ADDR[ps]}:$PORT: $msg" contains "$msg" "tls=true"
for hu in w0:dtf-worker@0 w1:dtf-worker@1; do
	h=${hu%%:*} u=${hu#*:}
	if wait_for 120 status_step_above "$h" "$u" 0; then
		pass "dtf-$h: $u trains across hosts: $(prop "$h" "$u" StatusText)"
	else
		fail "dtf-$h: $u trains across hosts (StatusText='$(prop "$h" "$u" StatusText)')"
	fi
	line=$(in_ct "$h" journalctl --no-pager -o cat -u "$u.service" | grep 'Connected to ps' | tail -n1)
	check "dtf-$h: $u reached the ps on another host over TCP: $line" contains "$line" "transport=tcp"
done
if wait_for 60 workers_live; then
	pass "dtf status on dtf-ctl (no task there) shows ps:0 and both workers live"
else
	fail "dtf status on dtf-ctl shows ps:0 and both workers live: $(status_json)"
fi
in_ct ctl dtf status 2>&1 | sed 's/^/      /'
plain=$(in_ct ctl sh -c 'grep -v "^tls_" /etc/dtf/dtf.toml >/root/plain.toml && dtf status -c /root/plain.toml' 2>&1)
check "dtf status from dtf-ctl without TLS is refused by the ps" contains "$plain" "TLS, which is not set here"

# --- systemctl kill of the ps on its host ----------------------------------------------

has_checkpoint() { in_ct w0 sh -c 'ls /var/lib/dtf/checkpoints/' 2>/dev/null | grep -Eq '^model\.ckpt-[1-9][0-9]*\.safetensors$'; }
check "the chief wrote a checkpoint past step 0 on its host" wait_for 60 has_checkpoint
ps_restarts=$(prop ps dtf-ps@0 NRestarts)
restored=$(journal_count w0 dtf-worker@0 Restored)
s0=$(status_step w0 dtf-worker@0)
s1=$(status_step w1 dtf-worker@1)
log "dtf-ps: systemctl kill -s KILL dtf-ps@0 (workers at steps $s0, $s1)"
in_ct ps systemctl kill -s KILL dtf-ps@0
restarted() { [ "$(prop "$1" "$2" NRestarts)" -gt "$3" ] && is_active "$1" "$2"; }
check "dtf-ps: systemd restarted dtf-ps@0" wait_for 60 restarted ps dtf-ps@0 "$ps_restarts"
# The ps restores its own snapshot (/var/lib/dtf/ps-0 on its host, which has
# no checkpoint.dir to compare with); the chief then says what the kill cost.
# (A ps without a usable snapshot is re-seeded from the checkpoint instead.)
resumed() {
	journal_count_above w0 dtf-worker@0 'from its own snapshot' 0 ||
		journal_count_above w0 dtf-worker@0 Restored "$restored"
}
if wait_for 90 resumed; then
	pass "the ps on dtf-ps resumed: $(in_ct w0 journalctl --no-pager -o cat -u dtf-worker@0.service | grep -e 'from its own snapshot' -e Restored | tail -n1)"
else
	fail "the ps on dtf-ps resumed from its snapshot or the chief's checkpoint (no new line in journalctl -u dtf-worker@0)"
fi
check "dtf-w0: the chief trains on past step $s0" wait_for 120 status_step_above w0 dtf-worker@0 "${s0:-0}"
check "dtf-w1: worker 1 trains on past step $s1" wait_for 120 status_step_above w1 dtf-worker@1 "${s1:-0}"

# --- the worker host's container restarted ---------------------------------------------

s1=$(status_step w1 dtf-worker@1)
log "dtf-w1: powering the container off (worker 1 at step $s1) and booting it again"
poweroff w1
check "dtf status on dtf-ctl still reaches the ps while dtf-w1 is down" \
	contains "$(status_json)" '"reachable":true'
boot w1
wait_for 30 container_pid w1 || die "no systemd in dtf-w1 after the restart"
check "dtf-w1 booted again" wait_for 120 system_up w1
check "dtf-w1: dtf-worker@1 (enabled) started at boot" wait_for 60 is_active w1 dtf-worker@1
check "dtf-w1: worker 1 trains again after the host's restart" wait_for 120 status_step_above w1 dtf-worker@1 0
check "dtf status on dtf-ctl shows both workers live again" wait_for 60 workers_live

# --- to the end ---------------------------------------------------------------------------

now=$(status_step w0 dtf-worker@0)
last=$((${now:-0} + 400))
log "last_step = $last on every host (now at step ${now:-?})"
write_config "$last"
done_all() {
	local hu h u s
	for hu in ps:dtf-ps@0 w0:dtf-worker@0 w0:dtf-evaluator w1:dtf-worker@1; do
		h=${hu%%:*} u=${hu#*:}
		s=$(prop "$h" "$u" ActiveState)
		[ "$s" = inactive ] || [ "$s" = failed ] || return 1
	done
}
check "every unit on every host stopped by itself at last_step" wait_for 600 done_all
for hu in ps:dtf-ps@0 w0:dtf-worker@0 w0:dtf-evaluator w1:dtf-worker@1; do
	h=${hu%%:*} u=${hu#*:}
	r="$(prop "$h" "$u" Result):$(prop "$h" "$u" ExecMainStatus)"
	check "dtf-$h: $u ended cleanly ($r)" test "$r" = success:0
done
final=$(in_ct w0 sh -c 'ls /var/lib/dtf/checkpoints/' 2>/dev/null |
	sed -n 's/^model\.ckpt-\([0-9]\+\)\.safetensors$/\1/p' | sort -n | tail -n1)
check "the final checkpoint on dtf-w0 is at step $last (${final:-none})" test "${final:-0}" = "$last"
check "dtf-evaluator on dtf-w0 scored it" \
	in_ct w0 grep -q "\"global_step\":$last," /var/lib/dtf/checkpoints/eval/evaluated.jsonl
for h in ps w1 ctl; do
	n=$(in_ct "$h" sh -c 'ls /var/lib/dtf/checkpoints 2>/dev/null | wc -l')
	check "no checkpoints on dtf-$h ($n files)" test "${n:-0}" = 0
done
eval_json=$(in_ct w0 dtf eval /var/lib/dtf/checkpoints --json 2>&1)
check "dtf eval on dtf-w0: $(grep -o '"accuracy":[0-9.]*' <<<"$eval_json" | head -n1)" contains "$eval_json" "\"global_step\":$last,"
hosts_done=$(date +%s)

# --- the image, as containers on the same bridge --------------------------------------------

PODMAN=(podman)
PODMAN_RUN=()
# image_works IMAGE: podman runs a container of it (WHY says what it ran,
# or why not). Plain podman first, then with what some machines need (this
# one: cgroup v1 hybrid, which crun refuses, and no CAP_SYS_RESOURCE to
# raise podman's default rlimits): runc, cgroupfs and lower rlimits.
WHY=
image_works() {
	command -v podman >/dev/null || { WHY="podman is not installed"; return 1; }
	WHY=$(podman run --rm --network none "$1" dtf --version 2>&1) && return 0
	if command -v runc >/dev/null; then
		PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
		PODMAN_RUN=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
		WHY=$("${PODMAN[@]}" run "${PODMAN_RUN[@]}" --rm --network none "$1" dtf --version 2>&1) &&
			{ WHY="$WHY (podman --runtime runc --cgroup-manager cgroupfs)"; return 0; }
	fi
	return 1
}
if [ "${DTF_SKIP_IMAGE:-}" = 1 ]; then
	skip "the image part (DTF_SKIP_IMAGE=1)"
else
	image=localhost/dtf:multihost-$TAG
	archive=${DTF_IMAGE:-}
	if [ -z "$archive" ] && command -v podman >/dev/null; then
		log "scripts/image.sh --deb $DEB"
		scripts/image.sh --deb "$DEB" --tag "multihost-$TAG" >"$RUN/image.log" 2>&1 || { cat "$RUN/image.log"; fail "scripts/image.sh"; }
		archive=$(sed -n 's/^\[image\] archive: \([^ ]*\) .*/\1/p' "$RUN/image.log")
	fi
	if [ -n "$archive" ] && command -v podman >/dev/null; then
		loaded=$("${PODMAN[@]}" load -q -i "$archive" 2>&1 | sed -n 's/^Loaded image: //p' | head -n1)
		image=${loaded:-$image}
	fi
	if image_works "$image"; then
		log "the image: $image: $WHY"
		declare -A IADDR=([ips]=$NET.11 [iw0]=$NET.12 [iw1]=$NET.13)
		conf=$RUN/image-conf
		mkdir -p "$conf"
		install -m 640 "$RUN/ps/etc/dtf/token" "$conf/token"
		chown 0:10001 "$conf/token"
		for c in ips iw0 iw1; do
			plug "$c" "${IADDR[$c]}"
			cert "$c" "${IADDR[$c]}" || die "openssl: the certificate of $c"
			mkdir -p "$conf/$c"
			config "$conf/$c/dtf.toml" "${IADDR[ips]}" "${IADDR[iw0]}" "${IADDR[iw1]}" 300
			install -m 644 "$tls/ca.crt" "$conf/$c/ca.crt"
			install -m 644 "$tls/$c.crt" "$conf/$c/host.crt"
			install -m 640 -g 10001 "$tls/$c.key" "$conf/$c/host.key"
			# checkpoint.dir: the root is read-only, as under Kubernetes.
			install -d -o 10001 -g 10001 -m 750 "$conf/$c/checkpoints"
		done
		# run_image NAME COMMAND...: a container of the image in NAME's namespace,
		# read-only, as the image's user, the config and secrets mounted as a
		# Kubernetes pod has them.
		run_image() {
			local c=$1
			shift
			"${PODMAN[@]}" run "${PODMAN_RUN[@]}" -d --name "dtf-$c-$TAG" --hostname "dtf-$c" \
				--network "ns:/run/netns/$(netns_of "$c")" --read-only --tmpfs /tmp \
				-v "$conf/$c/dtf.toml:/etc/dtf/dtf.toml:ro" -v "$conf/token:/etc/dtf/token:ro" \
				-v "$conf/$c/ca.crt:/etc/dtf/tls/ca.crt:ro" -v "$conf/$c/host.crt:/etc/dtf/tls/host.crt:ro" \
				-v "$conf/$c/host.key:/etc/dtf/tls/host.key:ro" \
				-v "$conf/$c/checkpoints:/var/lib/dtf/checkpoints" \
				"$image" "$@" >/dev/null && IMAGE_CONTAINERS+=("dtf-$c-$TAG")
		}
		check "podman: the ps from the image" run_image ips dtf-ps --task 0
		check "podman: the chief from the image (checkpoint.dir a mounted directory)" run_image iw0 dtf-worker --task 0
		check "podman: worker 1 from the image" run_image iw1 dtf-worker --task 1
		# dtf status on dtf-ctl, against the image cluster (its own config copy).
		config "$RUN/ctl/root/image.toml" "${IADDR[ips]}" "${IADDR[iw0]}" "${IADDR[iw1]}" 300
		image_live() {
			local j
			j=$(in_ct ctl dtf status -c /root/image.toml --json 2>&1)
			[ "$(grep -o '"contact":"live"' <<<"$j" | wc -l)" -eq 2 ]
		}
		check "dtf status on dtf-ctl shows the image cluster's ps and both workers live (TLS)" wait_for 120 image_live
		exited() { [ "$("${PODMAN[@]}" inspect -f '{{.State.Status}}' "dtf-$1-$TAG" 2>/dev/null)" = exited ]; }
		image_done() { exited ips && exited iw0 && exited iw1; }
		check "the image cluster trained to last_step 300 and every container exited" wait_for 300 image_done
		for c in ips iw0 iw1; do
			code=$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "dtf-$c-$TAG" 2>/dev/null)
			check "podman: dtf-$c exited 0 ($code)" test "$code" = 0
		done
		check "the image's chief wrote the final checkpoint at step 300" \
			test -s "$conf/iw0/checkpoints/model.ckpt-300.safetensors"
		user=$("${PODMAN[@]}" inspect -f '{{.Config.User}}' "dtf-ips-$TAG" 2>/dev/null)
		check "the image runs as the non-root dtf user ($user)" test "$user" = 10001:10001
		"${PODMAN[@]}" rmi -f "$image" >/dev/null 2>&1
	else
		skip "the image part: podman cannot run the image here: $WHY"
	fi
fi

echo
log "hosts: 4 machines (systemd-nspawn) + the image part; the fleet's checks took $((hosts_done - started)) s"
if [ "$failures" -eq 0 ]; then
	log "multihost: PASS ($checks checks)"
else
	log "multihost: FAIL ($failures of $checks checks failed)"
	exit 1
fi
