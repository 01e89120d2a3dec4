# QNCCL build.
#   make          libqnccl.so with its CUDA kernels (the CUDA 12 wheels make setup puts in .venv;
#                 CUDA=0: without), the host backend, cffi header, perf binaries
#   make setup    install what building and testing need (idempotent)
#   make test     setup + build + the test suite + make sanitize
#   make bench    setup + build + the benchmark
#   make accuracy setup + build + the training-accuracy benchmark
#   make sanitize setup + ThreadSanitizer and AddressSanitizer/UBSan builds + the tests of each
# Knobs: CXX, CUDA (0: no CUDA), CUDA_ROOT, CUDA_ARCHS, CUDA_PTX, NCCL_INCLUDE, BUILD, PYTHON,
#        JOBS, SANITIZE (e.g. thread, or address,undefined: an instrumented build, CPU only).

BUILD   ?= build
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CXX     ?= g++
VENV    ?= .venv
PYTHON  ?= $(VENV)/bin/python

# CUDA: one CUDA 12 toolkit from PyPI, which make setup installs into the venv:
# the runtime (headers, libcudart_static.a), NVRTC (compiles the kernels to PTX
# at build time, scripts/nvrtc_build.py), ptxas (the nvcc wheel's: the PTX's
# machine code per architecture) and CCCL (standard headers for NVRTC).
# A library built with it serves every driver from R525 on. No nvcc is used.
CUDA ?= 1
CUDA_ROOT ?= $(abspath $(patsubst %/cuda_nvrtc,%,$(firstword $(wildcard $(VENV)/lib/python3*/site-packages/nvidia/cuda_nvrtc))))
# GPU architectures: machine code for each of CUDA_ARCHS (V100, A100,
# H100/H200, B200, RTX 50), PTX for CUDA_PTX, the oldest (compute_70: the
# kernels need nothing newer), which any later GPU compiles at load time (with
# a driver of CUDA 12.9 or later, the PTX's ISA). Machine code runs on every
# GPU of its major version and a minor one at least its own, so sm_70's serves
# T4 (7.5) and sm_80's A10/3090 (8.6) and L4/4090 (8.9) too (the loader picks
# it, src/codec/cuda_module.cc): NCCL's own build leaves 7.5, 8.6 and 8.9 out
# the same way. The codec's kernels cost about 45 s of NVRTC once and a minute
# of ptxas per architecture, on one core.
# `qnccl info` lists what a library carries; for a quicker development build
# pick one, e.g. CUDA_ARCHS=80.
CUDA_ARCHS ?= 70 80 90 100 120
CUDA_PTX ?= $(firstword $(CUDA_ARCHS))

# -ffp-contract=off and no -ffast-math: the codec must round exactly as the
# kernels and the emulator do (docs/wire-format.md).
CXXFLAGS ?= -O3 -g
CXXFLAGS += -std=c++17 -fPIC -ffp-contract=off -fno-fast-math -fno-trapping-math -fvisibility=hidden \
            -Wall -Wextra -Wshadow -Werror -Isrc/include -Isrc
ifneq ($(strip $(SANITIZE)),)
  # ThreadSanitizer's build is of the host path; the simulated GPU's (simdev-asan) keeps CUDA
  ifeq ($(SIMDEV_SANITIZED),)
    CUDA := 0
  endif
  # a report needs files and lines only: line tables (-g1) compile a fifth faster than -g;
  # -O1, as the sanitizers' documentation advises, compiles the host codec's instantiations
  # three times faster than -O3
  CXXFLAGS := $(patsubst -O3,-O1,$(patsubst -g,-g1,$(CXXFLAGS))) -fsanitize=$(SANITIZE) \
              -fno-sanitize-recover=all -fno-omit-frame-pointer
  SAN_LDFLAGS := -fsanitize=$(SANITIZE)
endif
# -Bsymbolic-functions: calls between our own exported functions stay inside
# the library even when another one (the interposer) exports the same names.
LDFLAGS += $(SAN_LDFLAGS) -shared -Wl,--no-undefined -Wl,-soname,libqnccl.so -Wl,-Bsymbolic-functions

# The host side of the CUDA path; the kernels are KERNEL_MODULES' sources.
CUDA_SRCS := src/codec/codec_cuda.cc src/codec/cuda_module.cc src/engine/compute_cuda.cc
KERNEL_MODULES := codec engine
KERNEL_SOURCE_codec := src/codec/codec_kernels.cu
KERNEL_SOURCE_engine := src/engine/compute_kernels.cu
LIB_SRCS := src/common/error.cc src/common/env.cc src/codec/host_isa.cc src/codec/codec_api.cc \
            $(filter-out $(CUDA_SRCS),$(wildcard src/engine/*.cc)) $(wildcard src/shim/*.cc) \
            $(wildcard src/config/*.cc) $(wildcard src/api/*.cc)
# The host backend: the NCCL API for host memory over MPI (its own libnccl.so.2).
MPICXX  ?= mpicxx
HOST_SRCS := $(wildcard src/host_backend/*.cc)
HOST_LIB  := $(BUILD)/host/libnccl.so.2
HEADERS  := $(wildcard src/include/*.h src/*/*.h)

# A library asked for with kernels (CUDA=1) is never built without them: where no toolkit is
# found, building it stops and says what to do (pip install . gets one itself, setup.py).
ifeq ($(CUDA)$(strip $(CUDA_ROOT)),1)
  NO_TOOLKIT = $(error no CUDA 12 toolkit to build the kernels with: CUDA_ROOT is empty (no \
    nvidia/cuda_nvrtc in $(VENV)'s site-packages). Run `make setup` (installs the CUDA 12 wheels), \
    set CUDA_ROOT to a site-packages/nvidia folder holding nvidia-cuda-nvrtc-cu12, \
    nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12 and nvidia-cuda-cccl-cu12, or build without \
    kernels on purpose with CUDA=0 (a host-only library))
endif
ifeq ($(CUDA)$(if $(strip $(CUDA_ROOT)),y),1y)
  CUDA_INCLUDE := $(CUDA_ROOT)/cuda_runtime/include
  NVRTC := $(CUDA_ROOT)/cuda_nvrtc/lib/libnvrtc.so.12
  PTXAS := $(CUDA_ROOT)/cuda_nvcc/bin/ptxas
  # (the runtime headers include crt/, which comes with the nvcc wheel)
  CUDA_CFLAGS := -isystem $(CUDA_INCLUDE) -isystem $(CUDA_ROOT)/cuda_nvcc/include
  CXXFLAGS += -DQNCCL_WITH_CUDA $(CUDA_CFLAGS)
  LIB_SRCS += $(CUDA_SRCS)
  CU_OBJS := $(KERNEL_MODULES:%=$(BUILD)/obj/gen/%_images.o)
  CUDA_LIBS := $(CUDA_ROOT)/cuda_runtime/lib/libcudart_static.a -lrt -lpthread -ldl
endif

# The host codec is built once per instruction set and picked at run time.
HOST_ISAS := generic
ifeq ($(shell uname -m),x86_64)
  HOST_ISAS += avx2 avx512
  CXXFLAGS += -DQNCCL_HOST_X86
endif
ISA_FLAGS_generic :=
ISA_FLAGS_avx2 := -mavx2 -mf16c -mbmi2
# AVX-512 on 512-bit vectors: the cubic grid's encode is arithmetic-bound,
# and 16 lanes encode 1.5 times as fast as 8 on the development machine
# (docs/perf.md, the codec).
ISA_FLAGS_avx512 := $(ISA_FLAGS_avx2) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mprefer-vector-width=512
# Jump threading would split bucket_params' two grids back into branches
# (it specializes the constant inputs of the grid that does not apply), and
# the loop that derives a batch of buckets' parameters would not vectorize.
CODEC_FLAGS := -fno-thread-jumps
HOST_CODEC_OBJS := $(HOST_ISAS:%=$(BUILD)/obj/src/codec/codec_host_%.o)

# The kernel images first: they are the longest step (an architecture per core), and the
# objects fill the cores around them rather than after them.
LIB_OBJS := $(CU_OBJS) $(LIB_SRCS:%.cc=$(BUILD)/obj/%.o) $(HOST_CODEC_OBJS)
LIB      := $(BUILD)/lib/libqnccl.so
CDEF     := $(BUILD)/include/qnccl_cdef.h
# nccl-tests style perf binaries (docs/perf.md): one rank per process under mpirun.
# The driver (perf/perf.h: one file per job) and the NCCL backend its binaries share.
PERF_DRIVER_SRCS := perf/perf.cc perf/options.cc perf/reference.cc perf/timing.cc perf/output.cc
NCCL_PERF_TOOLS := all_reduce_perf reduce_scatter_perf all_gather_perf alltoall_perf sendrecv_perf
NCCL_PERF_BINS := $(NCCL_PERF_TOOLS:%=$(BUILD)/bin/%)
COLL_PERF_BINS := $(NCCL_PERF_BINS) $(BUILD)/bin/mpi_all_reduce_perf
PERF_BINS := $(BUILD)/bin/codec_bench $(COLL_PERF_BINS)
# The nccl.h they compile against: QNCCL's declaration of the ABI by default;
# NCCL_INCLUDE=<dir of NVIDIA's nccl.h> builds against NVIDIA's header instead.
NCCL_INCLUDE ?= $(BUILD)/include/nccl
# (MPI's deprecated C++ bindings are left out: they do not build with -Werror.)
PERF_CXXFLAGS = $(filter-out -fvisibility=hidden,$(CXXFLAGS)) -Iperf -I$(NCCL_INCLUDE) \
                -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
GPU_TESTS := $(if $(CU_OBJS),$(BUILD)/bin/codec_gpu_test $(BUILD)/bin/allreduce_gpu_test)

.PHONY: all native setup test bench accuracy sanitize clean
all: $(LIB) $(HOST_LIB) $(CDEF) $(PERF_BINS) $(GPU_TESTS)
# What the Python package carries when installed (setup.py; qnccl/_native.py's PARTS).
native: $(LIB) $(HOST_LIB) $(CDEF) $(PERF_BINS) $(NCCL_INCLUDE)/nccl.h

# Objects depend on the compilers and flags they were built with: a build
# with other settings (say CUDA=0) rebuilds everything instead of mixing.
FLAGS_STAMP := $(BUILD)/flags.txt
# The toolkit enters by its wheels' versions, not its folder: pip's isolated build of a wheel
# installs it under a new temporary folder each time, which would rebuild everything.
CUDA_VERSIONS := $(if $(CUDA_ROOT),$(notdir $(wildcard $(CUDA_ROOT)/../nvidia_cuda_*_cu12-*.dist-info)))
FLAGS_RAW := $(CXX) $(CXXFLAGS) | $(CODEC_FLAGS) $(foreach i,$(HOST_ISAS),$(ISA_FLAGS_$(i))) | $(CUDA_VERSIONS) $(CUDA_ARCHS) / $(CUDA_PTX) | $(LDFLAGS) $(CUDA_LIBS)
FLAGS_NOW := $(if $(CUDA_ROOT),$(subst $(CUDA_ROOT),<cuda>,$(FLAGS_RAW)),$(FLAGS_RAW))
$(shell mkdir -p $(BUILD) && { test -f $(FLAGS_STAMP) && test "$$(cat $(FLAGS_STAMP))" = '$(FLAGS_NOW)' || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP); })

$(BUILD)/obj/%.o: %.cc $(HEADERS) $(FLAGS_STAMP)
	$(NO_TOOLKIT)@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/src/codec/codec_host_%.o: src/codec/codec_host.cc $(HEADERS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(CODEC_FLAGS) $(ISA_FLAGS_$*) -DQNCCL_CODEC_ISA=$* -c $< -o $@

# The kernels: NVRTC images of each module, embedded by a generated source.
NVRTC_INCLUDES := -I src/include -I src -I src/codec/nvrtc_include -I $(CUDA_ROOT)/cuda_cccl/include
define kernel_module
$(BUILD)/gen/$(1)_images.cc: $(KERNEL_SOURCE_$(1)) $(HEADERS) $(wildcard src/codec/nvrtc_include/*) \
                             scripts/nvrtc_build.py $(FLAGS_STAMP)
	@mkdir -p $$(dir $$@)
	$(PYTHON) scripts/nvrtc_build.py --nvrtc $(NVRTC) --ptxas $(PTXAS) --module $(1) \
	  --source $(KERNEL_SOURCE_$(1)) --out $(BUILD)/gen --sass "$(CUDA_ARCHS)" --ptx $(CUDA_PTX) \
	  --jobs $(JOBS) $(NVRTC_INCLUDES)
endef
$(foreach m,$(KERNEL_MODULES),$(eval $(call kernel_module,$(m))))

$(BUILD)/obj/gen/%_images.o: $(BUILD)/gen/%_images.cc $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS) src/exports.map
	$(NO_TOOLKIT)@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -Wl,--version-script=src/exports.map -o $@ $(LIB_OBJS) $(CUDA_LIBS) -ldl

$(BUILD)/obj/host/%.o: src/host_backend/%.cc $(HEADERS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(MPICXX) $(CXXFLAGS) -c $< -o $@

# SONAME libnccl.so.2 like NVIDIA's; libnccl.so beside it for -lnccl.
$(HOST_LIB): $(HOST_SRCS:src/host_backend/%.cc=$(BUILD)/obj/host/%.o) $(BUILD)/obj/src/common/error.o \
             $(BUILD)/obj/src/common/env.o src/host_backend/exports.map
	@mkdir -p $(dir $@)
	$(MPICXX) $(SAN_LDFLAGS) -shared -Wl,--no-undefined -Wl,-soname,libnccl.so.2 -Wl,-Bsymbolic-functions \
	  -Wl,--version-script=src/host_backend/exports.map -o $@ $(filter %.o,$^)
	ln -sf libnccl.so.2 $(BUILD)/host/libnccl.so

# The cffi binding reads the public header itself, preprocessed into plain
# declarations (qnccl/_ffi.py).
$(CDEF): src/include/qnccl.h src/include/nccl_abi.h
	@mkdir -p $(dir $@)
	$(CXX) -E -P -x c -DQNCCL_CDEF -Isrc/include $< -o $@

$(BUILD)/bin/codec_bench: perf/codec_bench.cc $(LIB) $(HEADERS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(filter-out -fvisibility=hidden,$(CXXFLAGS)) $< -o $@ -L$(BUILD)/lib -lqnccl -Wl,-rpath,'$$ORIGIN/../lib'

$(BUILD)/include/nccl/nccl.h:
	@mkdir -p $(dir $@)
	printf '/* The NCCL API as QNCCL declares it (src/include/nccl_abi.h). */\n#include "nccl_abi.h"\n' > $@

# Built with CUDA when the library is: buffers then live on the GPU when one is
# visible (--memory), and the same binary runs over NVIDIA's NCCL. They link
# the host backend; LD_LIBRARY_PATH picks another libnccl.so.2 at run time.
# The driver and the NCCL backend are compiled once per flavour: host (MPI's
# baseline, and the NCCL binaries of a build without CUDA) and cuda.
PERF_HEADERS := perf/perf.h perf/driver.h perf/nccl_backend.h $(HEADERS) $(NCCL_INCLUDE)/nccl.h \
                $(FLAGS_STAMP)
PERF_FLAGS_host :=
PERF_FLAGS_cuda := -DQNCCL_PERF_CUDA $(CUDA_CFLAGS)
define perf_flavour
$(BUILD)/obj/perf/$(1)/%.o: perf/%.cc $(PERF_HEADERS)
	@mkdir -p $$(dir $$@)
	$(MPICXX) $(PERF_CXXFLAGS) $(PERF_FLAGS_$(1)) -c $$< -o $$@
endef
$(foreach f,host cuda,$(eval $(call perf_flavour,$(f))))
# perf_objs FLAVOUR[,nccl]: the driver's objects (and the NCCL backend's)
perf_objs = $(PERF_DRIVER_SRCS:perf/%.cc=$(BUILD)/obj/perf/$(1)/%.o) \
            $(if $(2),$(BUILD)/obj/perf/$(1)/nccl_backend.o)
PERF_FLAVOUR := $(if $(CU_OBJS),cuda,host)
PERF_CUDA_LIBS := $(if $(CU_OBJS),$(CUDA_LIBS))
$(NCCL_PERF_BINS): $(BUILD)/bin/%: perf/%.cc $(call perf_objs,$(PERF_FLAVOUR),nccl) $(HOST_LIB) \
                   $(PERF_HEADERS)
	@mkdir -p $(dir $@)
	$(MPICXX) $(PERF_CXXFLAGS) $(PERF_FLAGS_$(PERF_FLAVOUR)) $< \
	  $(call perf_objs,$(PERF_FLAVOUR),nccl) -o $@ -L$(BUILD)/host -lnccl $(PERF_CUDA_LIBS) -ldl \
	  -Wl,-rpath,'$$ORIGIN/../host'

$(BUILD)/bin/mpi_all_reduce_perf: perf/mpi_all_reduce_perf.cc $(call perf_objs,host) $(PERF_HEADERS)
	@mkdir -p $(dir $@)
	$(MPICXX) $(PERF_CXXFLAGS) $< $(call perf_objs,host) -o $@

$(BUILD)/bin/%_gpu_test: tests/gpu/%_gpu_test.cc $(LIB) $(HEADERS) tests/gpu/gpu_test.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(filter-out -fvisibility=hidden,$(CXXFLAGS)) $< -o $@ -L$(BUILD)/lib -lqnccl \
	  $(CUDA_LIBS) -Wl,-rpath,'$$ORIGIN/../lib'

setup:
	@bash scripts/setup.sh

# Both build on every core first (the CUDA and per-ISA objects are slow alone). The tests
# run a file per worker, JOBS (at least 2) at a time, the longest files first
# (tests/conftest.py): most of them wait on MPI ranks, which leaves a core idle; those
# marked serial (they assert times) then run alone.
TEST_WORKERS = $(shell echo $$(( $(JOBS) > 2 ? $(JOBS) : 2 )))
# (each phase's end time in the log: CI's whole run must stay under 40 minutes)
test: setup
	@date '+make test: %T setup done'
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory simdev
	@date '+make test: %T builds done'
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 \
	  -m "not serial" tests
	$(PYTHON) -m pytest -m serial tests
	@date '+make test: %T tests done'
	@$(MAKE) --no-print-directory sanitize
	@date '+make test: %T sanitizers done'

bench: setup
	@$(MAKE) --no-print-directory -j$(JOBS) all
	$(PYTHON) -m qnccl bench --out $(BUILD)/bench

# Training accuracy under quantized allreduce, both models (docs/accuracy.md; about 50 min;
# perf/accuracy_bench.py --model dlrm: the DLRM table alone, about 13 min).
accuracy: setup
	@$(MAKE) --no-print-directory -j$(JOBS) all
	$(PYTHON) perf/accuracy_bench.py

# The concurrency tests under ThreadSanitizer (build/tsan: the host path), the interposer's
# and the simulated GPU's under AddressSanitizer + UBSan (build/simdev-asan: one build of
# the library with CUDA, on the simulated GPU) (scripts/sanitize.sh; docs/host-backend.md).
sanitize: setup
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build/tsan SANITIZE=thread \
	  build/tsan/lib/libqnccl.so build/tsan/host/libnccl.so.2 build/tsan/include/qnccl_cdef.h
	@$(MAKE) --no-print-directory simdev-asan
	@bash scripts/sanitize.sh

clean:
	rm -rf $(BUILD)

include tests/simdev/simdev.mk
