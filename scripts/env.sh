# Sourced by scripts/setup.sh and scripts/run: the Python environment plugrt is installed into and run from.
# That is the active virtual or conda environment when python3 belongs to one; otherwise .venv in this checkout,
# made by setup.sh, so that neither an externally managed Python (PEP 668: Debian 12, Ubuntu 24.04) nor an
# interpreter other programs share (pyenv's, the system's) is changed.
PLUGRT_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"

# "active" when python3 is a virtual environment's, or a conda environment's that is not externally managed; else "venv"
plugrt_env_kind() {
  python3 -c 'import os, sys, sysconfig
venv = sys.prefix != sys.base_prefix
conda = os.path.isdir(os.path.join(sys.prefix, "conda-meta"))
managed = os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
print("active" if venv or (conda and not managed) else "venv")' 2>/dev/null || echo venv
}
