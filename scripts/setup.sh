#!/usr/bin/env bash
# Idempotent set-up: apt packages, .venv, torch (CPU build unless PTM_TORCH_INDEX says otherwise),
# deepspeed, megatron-core and ptm itself. Usage: scripts/setup.sh [EXTRAS], e.g. "dev,hf,mpi,kernels,eval".
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-dev,hf,mpi,kernels,eval}
stamp=.venv/.ptm-setup-$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)-${extras//,/_}
[ -f "$stamp" ] && exit 0

apt_pkgs="fortunes-zh libopenmpi-dev openmpi-bin slurmctld slurmd slurm-client munge gcc"
# data_prep's compiled loops need Python's headers: Debian's own python3 keeps them in python3-dev
[ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || apt_pkgs="$apt_pkgs python3-dev"
missing=$(for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "ptm setup: installing apt packages: $missing"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -qq --disable-pip-version-check -c constraints.txt)
# torch first, so deepspeed's sdist build sees it. On a GPU cluster set PTM_TORCH_INDEX to a CUDA wheel index.
if [ -n "${PTM_TORCH_INDEX:-}" ]; then "${pip[@]}" --index-url "$PTM_TORCH_INDEX" torch
else "${pip[@]}" torch; fi
"${pip[@]}" setuptools wheel numpy cython setuptools-scm  # cython: data_prep's compiled loops (setup.py)
"${pip[@]}" --no-build-isolation deepspeed
# seqeval is a source distribution whose setup_requires fetches the newest setuptools-scm without its dependency
# (vcs-versioning): build it against the venv's, which pip installed whole
[[ ",$extras," == *,eval,* ]] && "${pip[@]}" --no-build-isolation seqeval
"${pip[@]}" -e ".[$extras]"
rm -f .venv/.ptm-setup-*
touch "$stamp"
echo "ptm setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
