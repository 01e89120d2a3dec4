#!/usr/bin/env bash
# make setup: install what building and testing QNCCL need, idempotently.
#
#   system packages   g++, clang, make, OpenMPI, iproute2, python3 venv (apt, only when missing)
#   .venv             pinned Python tools (torch included), the CUDA 12 toolkit wheels the
#                     kernels build with, + `pip install -e .` of qnccl
#   .venv/nccl-reference/include/nccl.h
#                     NVIDIA's header, which tests/test_abi.py checks src/include/nccl_abi.h
#                     against (optional: without network the test is skipped)
#
# A stamp in .venv keyed on this script and pyproject.toml makes a rerun instant.
# Knobs: PYTHON3 (interpreter for the venv, default python3), QNCCL_CACHE (download
# cache, default ~/.cache/qnccl), QNCCL_SETUP_FORCE=1 (ignore the stamp).
# `scripts/setup.sh --cuda-pins` prints the CUDA toolkit wheels' pins and exits (the
# runtime image's build stage installs just those).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=.venv
PYTHON3=${PYTHON3:-python3}
CACHE=${QNCCL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qnccl}
STAMP=$VENV/.setup-stamp
REF_INCLUDE=$VENV/nccl-reference/include

# Pinned versions (bump together, then rerun make setup: the stamp notices).
# mpi4py's wheel carries builds for both Open MPI (libmpi.so.40) and MPICH
# (libmpi.so.12) and loads the system library at import; building it from
# source instead takes ~5 minutes on 2 cores.
PY_PKGS=(
  cffi==2.1.1
  numpy==2.4.6
  mpi4py==4.1.2
  pytest==9.2.0
  pytest-timeout==2.4.0
  pytest-xdist==3.8.0  # make test: two test files at a time (most tests wait on their ranks)
  execnet==2.1.2       # (pytest-xdist's)
  hypothesis==6.170.15
  matplotlib==3.11.2
  ml-dtypes==0.6.0  # bfloat16 numpy arrays: qnccl.codec accepts them (tests/test_codec.py)
  torch==2.13.0     # the gloo baseline of make bench, the DDP hook and its tests
  nvidia-cuda-cuobjdump==13.5.37  # reads the kernels' images (tests/test_cuda_build.py)
)
# One CUDA 12 toolkit for the kernels (Makefile, "CUDA"): the runtime (headers and static
# library), NVRTC (compiles the kernels to PTX), CCCL (standard headers for NVRTC), and the
# nvcc wheel for ptxas (the PTX's machine code per architecture) and the crt/ headers the
# runtime's include. A wheel's build gets the same pins (scripts/build_backend.py).
CUDA_PKGS=(
  nvidia-cuda-runtime-cu12==12.9.79
  nvidia-cuda-nvrtc-cu12==12.9.86
  nvidia-cuda-cccl-cu12==12.9.27
  nvidia-cuda-nvcc-cu12==12.9.86
)
if [ "${1:-}" = --cuda-pins ]; then
  printf '%s\n' "${CUDA_PKGS[@]}"
  exit 0
fi
PY_PKGS+=("${CUDA_PKGS[@]}")
NCCL_VERSION=2.32.3  # the release src/include/nccl_abi.h follows
NCCL_WHEEL=nvidia-nccl-cu13==$NCCL_VERSION

log() { echo "[setup] $*"; }
STEP=""
step() { STEP=$1; log "$1"; }
on_error() {
  echo "[setup] FAILED while ${STEP:-starting}." >&2
  [ -n "${HINT:-}" ] && echo "[setup] next: $HINT" >&2
  exit 1
}
trap on_error ERR

start=$SECONDS
stamp_key=$(cat scripts/setup.sh pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1)

ref_note() {
  [ -f "$REF_INCLUDE/nccl.h" ] ||
    log "warning: no reference nccl.h (download failed earlier); the ABI test will be skipped." \
        "Retry: QNCCL_SETUP_FORCE=1 make setup"
}

# Fast path: nothing changed since the last complete run and the venv still works.
if [ "${QNCCL_SETUP_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] &&
   [ "$(cat "$STAMP")" = "$stamp_key" ] && "$VENV/bin/python" -c '' 2>/dev/null; then
  ref_note
  log "up to date (.venv)"
  exit 0
fi

[ -f pyproject.toml ] || { echo "[setup] pyproject.toml not found in $PWD" >&2; exit 1; }
rm -f "$STAMP"  # a run that fails below must not leave an old stamp that looks valid

# ---- system packages ----------------------------------------------------------
missing=()
need_pkg() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$1"); }
apt_install() {  # the packages in `missing`, once
  [ ${#missing[@]} -gt 0 ] || return 0
  step "installing system packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null ||
      { echo "[setup] not root and no sudo: as root run apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  HINT="check network access to the apt mirror, then: apt-get install ${missing[*]}"
  [ -n "${APT_UPDATED:-}" ] || $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  APT_UPDATED=1
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  missing=()
}
if command -v dpkg >/dev/null; then
  # clang: the simulated GPU compiles the kernels with it (docs/simulated-gpu.md)
  for p in g++ clang make libopenmpi-dev openmpi-bin iproute2 ca-certificates; do need_pkg "$p"; done
  if ! command -v "$PYTHON3" >/dev/null; then
    missing+=(python3 python3-venv)
  elif ! "$PYTHON3" -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=(python3-venv)  # Debian splits venv/ensurepip out of python3
  fi
  apt_install
  # clang's sanitizer files (make simdev-asan), packaged per clang version
  need_pkg "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
  apt_install
else
  # Not Debian-like: only check, the user installs with their package manager.
  for c in g++ clang make mpicc mpirun "$PYTHON3"; do command -v "$c" >/dev/null || missing+=("$c"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] missing: ${missing[*]} (no dpkg/apt here; install them, plus Open MPI headers)" >&2
    exit 1
  fi
fi

step "checking $PYTHON3"
HINT="install Python >= 3.11, or point PYTHON3 at one: PYTHON3=python3.11 make setup"
"$PYTHON3" -c 'import sys; sys.exit(sys.version_info < (3, 11))'

# ---- virtual environment --------------------------------------------------------
if ! "$VENV/bin/python" -c '' 2>/dev/null; then
  step "creating $VENV with $("$PYTHON3" --version)"
  HINT="remove $VENV and rerun make setup"
  rm -rf "$VENV"
  "$PYTHON3" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

step "installing Python packages: ${PY_PKGS[*]}"
HINT="check network access to PyPI (pip output above names the package that failed)"
"${PIP[@]}" install -q "${PY_PKGS[@]}"

step "checking that mpi4py loads the system MPI"
HINT="mpi4py's wheel found no usable libmpi; build it against yours (~5 min):
  $VENV/bin/pip install --no-binary mpi4py --force-reinstall $(printf '%s\n' "${PY_PKGS[@]}" | grep '^mpi4py==')"
"$VENV/bin/python" -c 'from mpi4py import MPI; print("[setup]  ", MPI.Get_library_version().splitlines()[0])'

step "installing qnccl (pip install -e .)"
HINT="see the pip error above; pyproject.toml must declare package qnccl"
"${PIP[@]}" install -q -e .

# ---- reference nccl.h for the ABI test (optional) --------------------------------
wheel=$(ls "$CACHE"/nvidia_nccl_cu13-$NCCL_VERSION-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  step "downloading $NCCL_WHEEL (305 MB, once; cached in $CACHE)"
  HINT="set QNCCL_CACHE to a writable directory"
  mkdir -p "$CACHE"
  # The header is the same on every platform: pin the x86_64 wheel so that
  # this also works on other architectures. Short timeout: offline is fine.
  if "${PIP[@]}" download -q --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
       --timeout 30 --retries 1 -d "$CACHE" "$NCCL_WHEEL" > "$CACHE/download.log" 2>&1; then
    wheel=$(ls "$CACHE"/nvidia_nccl_cu13-$NCCL_VERSION-*.whl | head -n1)
  else
    log "warning: could not download $NCCL_WHEEL (see $CACHE/download.log); the ABI test will be skipped"
  fi
fi
if [ -n "$wheel" ]; then
  step "extracting nccl.h into $REF_INCLUDE"
  HINT="the cached wheel may be damaged: rm $wheel and rerun make setup"
  "$VENV/bin/python" - "$wheel" "$REF_INCLUDE/nccl.h" <<'EOF'
import pathlib, sys, zipfile
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
dest.parent.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    dest.write_bytes(z.read("nvidia/nccl/include/nccl.h"))
EOF
fi

echo "$stamp_key" > "$STAMP"
log "done in $((SECONDS - start)) s"
