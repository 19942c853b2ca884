#!/bin/sh
# Layer 3 of the tests (docs/design.md): build the Debian package and check it.
#
#   scripts/check-package.sh [--no-build]
#
# 1. cargo deb            -> target/debian/dtf_<version>_<arch>.deb
# 2. lintian              no errors and no warnings (overrides, each with its
#                         reason: packaging/debian/lintian-overrides)
# 3. mandoc -Tlint        the man pages, warnings included
# 4. systemd-analyze verify    every unit, inside the unpacked
#                         package (so /usr/bin/dtf-ps is the packaged one);
#                         nothing is installed on this host
# 5. systemd-analyze security --offline=true: exposure at most 2.0 per unit
#
# Installs what it needs (cargo-deb; lintian, mandoc, systemd, man-db with
# apt-get) when missing: run as root on Debian 12, as in CI. Exits non-zero
# on the first failure. --no-build packages target/release as it is.
set -eu

MAX_EXPOSURE=2.0
UNITS="dtf-ps@.service dtf-worker@.service dtf-evaluator.service"

cd "$(dirname "$0")/.."
build=yes
[ "${1:-}" = --no-build ] && build=no

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'check-package: FAILED: %s\n' "$*" >&2; exit 1; }

need_apt=
for tool in lintian:lintian mandoc:mandoc systemd-analyze:systemd man:man-db; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || need_apt="$need_apt ${tool#*:}"
done
if [ -n "$need_apt" ]; then
	step "apt-get install$need_apt"
	apt-get update -q
	# shellcheck disable=SC2086 # a list of package names
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need_apt
fi
if ! cargo deb --version >/dev/null 2>&1; then
	step "cargo install cargo-deb"
	cargo install --locked cargo-deb
fi

step "cargo deb"
if [ "$build" = yes ]; then
	cargo deb
else
	cargo deb --no-build
fi
version=$(cargo metadata --no-deps --format-version 1 |
	sed -n 's/.*"name":"dtf","version":"\([^"]*\)".*/\1/p')
arch=$(dpkg --print-architecture)
deb=target/debian/dtf_${version}-1_${arch}.deb
[ -f "$deb" ] || fail "no $deb"
echo "$deb"
dpkg-deb --info "$deb"
dpkg-deb --contents "$deb"

step "lintian $(lintian --version)"
# Exit status non-zero on any error or warning; info and experimental tags
# are shown but do not fail.
lintian --fail-on error,warning --display-info --display-experimental --info "$deb" ||
	fail "lintian"

step "mandoc -Tlint -W warning man/*"
mandoc -Tlint -W warning man/* || fail "mandoc"

# A root for systemd-analyze: the package unpacked over this host's units
# (sysinit.target & co.) and the /bin/kill that ExecReload= runs, with
# Debian 12's merged /usr. verify then checks the packaged binaries and man
# pages, not whatever is installed here.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
cp -rn /usr/lib/systemd/system/. "$root/usr/lib/systemd/system/"
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/sbin "$root/sbin"
cp "$(readlink -f /bin/kill)" "$root/usr/bin/kill"

step "systemd-analyze verify (in the unpacked package)"
for unit in $UNITS; do
	instance=$(echo "$unit" | sed 's/@\.service$/@0.service/')
	# The man: links are checked against the package's own man pages.
	out=$(MANPATH="$root/usr/share/man" systemd-analyze verify --man=yes --generators=no \
		--root="$root" "$instance" 2>&1) || { echo "$out"; fail "systemd-analyze verify $instance"; }
	# verify also prints problems of other units it loads without failing.
	if [ -n "$out" ]; then
		echo "$out"
		fail "systemd-analyze verify $instance has something to say"
	fi
	echo "$instance: ok"
done

step "systemd-analyze security --offline=true (at most $MAX_EXPOSURE)"
for unit in $UNITS; do
	out=$(systemd-analyze security --offline=true --root="$root" \
		"$root/usr/lib/systemd/system/$unit" 2>&1) || { echo "$out"; fail "systemd-analyze security $unit"; }
	echo "$out" | grep -v '^✓' || true
	level=$(echo "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
	[ -n "$level" ] || fail "no exposure level for $unit"
	awk -v l="$level" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(l <= m) }' ||
		fail "$unit: exposure $level > $MAX_EXPOSURE"
	echo "$unit: exposure $level"
done

step "check-package: OK ($deb)"
