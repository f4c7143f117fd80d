#!/usr/bin/env bash
# Install plugrt and its CPU backend on a fresh Debian/Ubuntu machine.
#   bash scripts/setup.sh          the runtime: clang and binutils (apt), plugrt + plugrt-cpu (pip)
#   bash scripts/setup.sh --test   the same, plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v clang >/dev/null || ! command -v ld >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang binutils >/dev/null
fi
PIP="python3 -m pip install -q --disable-pip-version-check"
$PIP ./core ./plugins/ops_cpu
if [ "${1:-}" = "--test" ]; then
  $PIP -r requirements-test.txt
fi
