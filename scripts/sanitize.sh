#!/usr/bin/env bash
# make sanitize: runs the tests that exercise QNCCL's threads under
# ThreadSanitizer (build/tsan: the host path), then the interposer's tests and the
# simulated GPU's kernel and runtime tests under AddressSanitizer + UBSan
# (build/simdev-asan: the library with CUDA, on the simulated GPU; its objects and host
# backend in build/simdev-asan/product); `make sanitize` builds them first. pytest and every
# MPI rank preload the sanitizer's runtime (Python itself is not instrumented; mpirun does
# not); a report fails its process, so the test fails with the report in its output. Each
# runs its tests two at a time (pytest-xdist), the tests, not the files, going to the workers:
# a few long tests make these selections (under ThreadSanitizer the hierarchical one takes
# half the run), and a file per worker left one worker idle behind them.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

runtime() {  # the shared sanitizer runtime the compiler links against
  local path
  path=$(${CXX:-g++} -print-file-name="$1")
  [ -f "$path" ] || { echo "[sanitize] $1 not found: install the compiler's sanitizer runtimes" >&2; exit 1; }
  readlink -f "$path"
}

run() {  # run BUILD LIBRARY PRELOAD PYTEST-ARGS...: BUILD's host backend and header, LIBRARY
  local build=$1 library=$2 preload=$3
  shift 3
  echo "[sanitize] $library: ${*}"
  QNCCL_TEST_BUILD=$PWD/$build QNCCL_TEST_RANK_PRELOAD=$preload LD_PRELOAD=$preload \
    QNCCL_LIB=$PWD/$library QNCCL_CDEF=$PWD/$build/include/qnccl_cdef.h \
    "$PYTHON" -m pytest -p no:cacheprovider -q -n 2 --dist load "$@"
}

# ThreadSanitizer: nonblocking communicators (progress and watchdog threads,
# abort from another thread), the ProcessGroupNCCL-style job (watchdog,
# groups over two communicators in lock-step), a fault on one rank, the
# pipelined segments of hierarchical and flat calls (lanes on their own
# threads, moving together or in turn), groups of every quantized collective
# on two communicators, a group's quantized sends and receives. The longest first
# (the hierarchical matrix, then the process groups), so that neither worker ends alone.
# Open MPI's races are suppressed by the frames of its libraries (scripts/tsan.supp),
# among them its copies into a request's buffer, made on whichever thread drives
# MPI's progress: the owner frees or reads the buffer after MPI_Test said done, a
# happens-before TSan cannot see in uninstrumented code. The suppression needs the
# copy's stack, which TSan rebuilds from the copying thread's history; a lane that
# quantizes a segment after the copy overwrites the default 128K accesses (the
# report then reads "failed to restore the stack", unsuppressed), so the history
# is the largest TSan keeps, 4M accesses per thread.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 report_signal_unsafe=0 history_size=7 \
suppressions=$PWD/scripts/tsan.supp" \
  run build/tsan build/tsan/lib/libqnccl.so "$(runtime libtsan.so)" \
  tests/test_hierarchical.py tests/test_interposer.py tests/test_host_backend.py \
  tests/test_allreduce.py tests/test_collectives.py \
  -k "nonblocking or another_thread or process_group or fault_on_one_rank or host_ids or \
each_communicator_counts or (interposed and (both or fsdp)) or (quantized_sends and 3)"

# AddressSanitizer + UBSan: the interposer's tests, but those that replace
# LD_PRELOAD themselves (the runtime must stay preloaded), and the other
# collectives' but their long matrices (one run of quantized sends and
# receives), with the library of the simulated GPU (a device is there; these
# tests' buffers are host memory). Python leaks by design (interned objects at
# exit): leak checking is off.
ASAN_OPTIONS="detect_leaks=0 verify_asan_link_order=0 abort_on_error=1" \
UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
  run build/simdev-asan/product build/simdev-asan/lib/libqnccl.so "$(runtime libasan.so)" \
  tests/test_interposer.py tests/test_collectives.py \
  -k "(not ld_preload and not matches_the_emulator and not match_the_emulator) or \
(quantized_sends and 3)"

# The simulated GPU with AddressSanitizer + UBSan, the library's kernels and the simulator
# included: the codec kernels against the host codec, the plain CUDA program, CUDA's rules
# and the executor's (but the misaligned load, which UBSan reports itself, ending the
# program: its case checks the plain build's answer). The codec kernels run in one lane
# order (random): each order runs every kernel and configuration whole, so one finds what
# ASan and UBSan look for; the three orders look for results that depend on the order,
# which `make test` checks in the plain simulated build (each order takes 80 s under
# ASan). The simulator's own SIGSEGV handler turns a kernel's fault into CUDA's error, so
# ASan leaves SIGSEGV to it. The tests, not the files, go to the workers, the kernels' first.
echo "[sanitize] build/simdev-asan: the simulated GPU"
ASAN_OPTIONS="detect_leaks=0 verify_asan_link_order=0 abort_on_error=1 handle_segv=0 \
allow_user_segv_handler=1" \
UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
QNCCL_TEST_SIMDEV=$PWD/build/simdev-asan LD_PRELOAD="$(runtime libasan.so)" \
  "$PYTHON" -m pytest -p no:cacheprovider -q -n 2 --dist load tests/test_simdev_kernels.py \
  tests/test_simdev_runtime.py -k "not device_path and not misaligned and \
not (host_codec and (forward or reverse))"
