#!/usr/bin/env bash
# Build a wheel of every distribution in this repository (the core, each backend, each interface) into dist/:
#   bash scripts/wheelhouse.sh
#   pip install --find-links dist 'plugrt[cpu,cl]'     then picks backends; their own dependencies come from PyPI
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
PY=python3
[ "$(plugrt_env_kind)" = venv ] && [ -x "$PLUGRT_VENV/bin/python3" ] && PY="$PLUGRT_VENV/bin/python3"
DIRS=$(for f in core/pyproject.toml testkit/pyproject.toml plugins/*/pyproject.toml plugins/*/iface_*/pyproject.toml; do
  if [ -f "$f" ]; then echo "./$(dirname "$f")"; fi; done)
# without build isolation when this Python has the build tools: an isolated build looks setuptools up on the index, ~7 s a wheel
ISOLATION=""
$PY -c "import setuptools, wheel, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 68)" 2>/dev/null && ISOLATION="--no-build-isolation"
# setuptools leaves build/ and *.egg-info in each folder (and would reuse a stale build/lib): cleared before and after
clean() { for d in $DIRS; do rm -rf "$d/build" "$d"/*.egg-info; done; }
clean
trap clean EXIT
mkdir -p dist
rm -f dist/plugrt-*.whl dist/plugrt_*.whl
# shellcheck disable=SC2086
$PY -m pip wheel -q --disable-pip-version-check --no-deps $ISOLATION -w dist $DIRS
ls dist/plugrt*.whl
