# shellcheck shell=bash
# Sourced by tests/system/run.sh, tests/system/multihost.sh and
# scripts/image.sh: the checks' reporting and the host's Debian mirror.
# The caller sets ME, the name its errors begin with, before sourcing it;
# scripts/image.sh takes host_mirror only and keeps its own log and die.

started=$(date +%s)
failures=0
checks=0
log() { printf '[%4ds] %s\n' $(($(date +%s) - started)) "$*"; }
die() { printf '%s: ERROR: %s\n' "$ME" "$*" >&2; exit 2; }
pass() { checks=$((checks + 1)); printf 'PASS  %s\n' "$*"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); printf 'FAIL  %s\n' "$*"; }
skip() { printf 'SKIP  %s\n' "$*"; }
quiet() { "$@" >/dev/null 2>&1; }
# contains HAYSTACK NEEDLE
contains() { [[ "$1" == *"$2"* ]]; }
# check DESCRIPTION COMMAND...: PASS if the command succeeds.
check() {
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}
# wait_for SECONDS COMMAND...: polls the command until it succeeds.
wait_for() {
	local deadline=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.5
	done
}

# The Debian mirror of the host's own apt sources (debootstrap's source
# unless DTF_SYSTEM_TEST_MIRROR says otherwise).
host_mirror() {
	local uri
	uri=$( {
		sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
		sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
			/etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
	} | grep -E '^https?://' | grep -v -e security -e updates | head -n1)
	[ -n "$uri" ] || die "no Debian mirror in the host's apt sources: set DTF_SYSTEM_TEST_MIRROR"
	echo "$uri"
}
