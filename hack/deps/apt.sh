#!/usr/bin/env bash
# Installs the Debian packages the tests run (real Squid, ...) when any is missing; does
# nothing, quickly, when all are there. CI runs it as root on a fresh Debian machine through
# `make deps` (a prerequisite of `make test`); a developer who is not root is told the
# command to run.
#
# A package is installed without recommended packages, and without starting its service:
# the tests start their own Squid on a free port, and a system Squid would only hold port
# 3128. The package lists are updated only when the install fails for want of them (a fresh
# machine has none).
#
# Usage: hack/deps/apt.sh
# PROXYFLEET_POLICY_RC_D moves the policy-rc.d file (for this script's test).
set -euo pipefail

# The packages, one per line; add what a new test needs.
packages=(
	squid
	python3-scrapy
	python3-pytest
)

policy=${PROXYFLEET_POLICY_RC_D:-/usr/sbin/policy-rc.d}

installed() {
	[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

if ! command -v dpkg-query >/dev/null 2>&1; then
	echo "hack/deps: not a Debian-like system; install these yourself: ${packages[*]}" >&2
	exit 0
fi

missing=()
for p in "${packages[@]}"; do
	installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0

if [ "$(id -u)" != 0 ]; then
	echo "hack/deps: missing Debian packages: ${missing[*]}" >&2
	echo "hack/deps: install them (without starting their services) with:" >&2
	echo "    sudo $(cd "$(dirname "$0")" && pwd)/apt.sh" >&2
	exit 1
fi

# policy-rc.d answering 101 ("action forbidden") keeps maintainer scripts from starting
# services, with systemd or without; one that was there before is put back afterwards.
log=$(mktemp)
backup= ours=
cleanup() {
	rm -f "$log"
	if [ -n "$ours" ]; then rm -f "$policy"; fi
	if [ -n "$backup" ]; then mv -f "$backup" "$policy"; fi
}
trap cleanup EXIT
if [ -e "$policy" ] || [ -L "$policy" ]; then
	mv -f "$policy" "$policy.proxyfleet-saved"
	backup=$policy.proxyfleet-saved
fi
ours=1
printf '#!/bin/sh\n# hack/deps/apt.sh: no service starts while packages install.\nexit 101\n' >"$policy"
chmod 0755 "$policy"

apt_install() {
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" 2>&1 | tee "$log"
	return "${PIPESTATUS[0]}"
}
echo "hack/deps: installing ${missing[*]}" >&2
if ! apt_install; then
	# Only a missing or stale package list is fixed by an update; anything else is reported.
	if ! grep -qE 'Unable to locate package|has no installation candidate|is not available|apt-get update' "$log"; then
		exit 1
	fi
	echo "hack/deps: updating the package lists" >&2
	apt-get update
	apt_install
fi
