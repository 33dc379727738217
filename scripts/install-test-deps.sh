#!/usr/bin/env bash
# The system packages `make test` needs (scripts/test-tools.txt: a command, then the Debian
# packages that install it), installed when one is missing. `make test` and CI (.ci/run)
# run it.
#
#   bash scripts/install-test-deps.sh          # as root: apt-get update, then apt-get install
#                                              # what is missing; otherwise name it, and go on
#   bash scripts/install-test-deps.sh --check  # only name what is missing (exit 1 if any)
#
# Whatever is still missing, the tests that need it are skipped with the same install line,
# and fail on CI (tests/support/tools.py). Only bash's builtins until apt-get: the check
# runs with any PATH.
set -uo pipefail
here=${BASH_SOURCE[0]%/*}
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.

missing=()
while read -r tool packages; do
  case "$tool" in '' | '#'*) continue ;; esac
  # shellcheck disable=SC2206 # one word per package
  command -v "$tool" >/dev/null 2>&1 || missing+=($packages)
done <"$here/test-tools.txt"
[ ${#missing[@]} -eq 0 ] && exit 0

install="apt-get update && apt-get install ${missing[*]}"
if [ "${1:-}" = --check ]; then
  echo "install-test-deps: missing ${missing[*]} (as root: $install)"
  exit 1
fi
if [ "$EUID" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-deps: missing ${missing[*]}; as root: $install" \
    "(until then the tests that need them are skipped)"
  exit 0
fi
echo "install-test-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
  echo "install-test-deps: apt-get failed (above); the tests that need them are skipped"
fi
exit 0
