# The simulated GPU (docs/simulated-gpu.md): test-only, built by `make simdev` into
# $(SIMDEV) (build/simdev), never into the shipped library.
#
#   $(SIMDEV)/libcuda.so.1      the simulator and the driver API it answers with
#   $(SIMDEV)/libcudart.so.12   the CUDA runtime API (NVIDIA's ABI, from the toolkit's headers)
#   $(SIMDEV)/lib/libqnccl.so   the library's own objects, with its kernels compiled for the
#                               simulator (clang++) in place of NVRTC's images, linked against
#                               the two above
#   $(SIMDEV)/bin/*_gpu_test    tests/gpu's programs, linked against NVIDIA's libcudart.so.12:
#                               LD_LIBRARY_PATH=$(SIMDEV) runs them on the simulated GPU unchanged
#   $(SIMDEV)/bin/kernel_rules  the simulator's own kernels that break the GPU's rules
#                               (checks/), loaded through the driver API
#   $(SIMDEV)/bin/all_reduce_perf  the perf binary on device memory, linked against NVIDIA's
#                               libcudart.so.12 and the host backend (make simdev only)
#
# `make simdev-asan` builds the same with AddressSanitizer and UBSan (kernels included) into
# build/simdev-asan, the library's objects, its host backend and cffi header into
# build/simdev-asan/product (make sanitize runs the interposer's tests on them too). The
# kernels need clang++: its -fno-strict-float-cast-overflow gives the GPU's saturating
# float-to-integer conversions.

SIMDEV ?= build/simdev
SIMDEV_KCXX ?= clang++
SIMDEV_DIR := tests/simdev
SIMDEV_CORE_SRCS := $(wildcard $(SIMDEV_DIR)/core/*.cc) $(SIMDEV_DIR)/driver.cc
SIMDEV_HEADERS := $(wildcard $(SIMDEV_DIR)/core/*.h $(SIMDEV_DIR)/include/simdev/*.h)
SIMDEV_INCLUDES := -I$(SIMDEV_DIR) -I$(SIMDEV_DIR)/include
SIMDEV_CXXFLAGS = $(filter-out -fvisibility=hidden,$(CXXFLAGS)) $(SIMDEV_INCLUDES)
# Kernels as the GPU computes: no contraction, IEEE division, saturating conversions. Line
# tables only (-g1): the simulator names a kernel's sites itself (SIMDEV_SITE), and the
# codec's module, 150 kernels, compiles a sixth faster.
SIMDEV_KFLAGS := -std=c++17 -O2 -g1 -fPIC -ffp-contract=off -fno-fast-math \
                 -fno-strict-float-cast-overflow -fvisibility=hidden -Wall -Wextra -Werror \
                 -Wno-pass-failed \
                 -DQNCCL_WITH_CUDA $(SIMDEV_INCLUDES) -Isrc/include -Isrc
ifneq ($(strip $(SANITIZE)),)
  # (saturating conversions are defined on the GPU: UBSan must not call them overflow)
  SIMDEV_KFLAGS := $(patsubst -O2,-O1,$(SIMDEV_KFLAGS)) -fsanitize=$(SANITIZE) \
                   -fno-sanitize=float-cast-overflow -fno-sanitize-recover=all \
                   -fno-omit-frame-pointer
endif
SIMDEV_CUDART_REAL = $(CUDA_ROOT)/cuda_runtime/lib/libcudart.so.12

SIMDEV_LIBS := $(SIMDEV)/libcuda.so.1 $(SIMDEV)/libcudart.so.12 $(SIMDEV)/lib/libqnccl.so
SIMDEV_BINS := $(SIMDEV)/bin/codec_gpu_test $(SIMDEV)/bin/allreduce_gpu_test \
               $(SIMDEV)/bin/kernel_rules

# Each in two steps: the kernel modules' sources first (seconds), then the rest with the
# modules' compiles in front, the codec's being the longest of all (minutes with ASan): the
# other objects fill the other cores meanwhile.
SIMDEV_MODULE_SOURCES := $(KERNEL_MODULES:%=$(SIMDEV)/modules/%_module.cc)
SIMDEV_MODULE_OBJS := $(KERNEL_MODULES:%=$(SIMDEV)/obj/modules/%_module.o)
SIMDEV_ASAN_MAKE = $(MAKE) --no-print-directory -j$(JOBS) BUILD=build/simdev-asan/product \
                   SIMDEV=build/simdev-asan SANITIZE=address,undefined SIMDEV_SANITIZED=1

.PHONY: simdev simdev-asan simdev-sources simdev-targets
simdev:
	@test -n "$(CUDA_ROOT)" || \
	  { echo "make simdev: the CUDA 12 wheels are missing: run make setup" >&2; exit 1; }
	@$(MAKE) --no-print-directory -j$(JOBS) simdev-sources
	@$(MAKE) --no-print-directory -j$(JOBS) simdev-targets $(SIMDEV)/bin/all_reduce_perf
simdev-asan:
	@$(SIMDEV_ASAN_MAKE) simdev-sources
	@$(SIMDEV_ASAN_MAKE) simdev-targets
simdev-sources: $(SIMDEV_MODULE_SOURCES)
simdev-targets: $(SIMDEV_MODULE_OBJS) $(SIMDEV_LIBS) $(SIMDEV_BINS) $(HOST_LIB) $(CDEF)

$(SIMDEV)/obj/simdev/%.o: $(SIMDEV_DIR)/%.cc $(SIMDEV_HEADERS) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(SIMDEV_CXXFLAGS) -c $< -o $@

$(SIMDEV)/libcuda.so.1: $(SIMDEV_CORE_SRCS:$(SIMDEV_DIR)/%.cc=$(SIMDEV)/obj/simdev/%.o) \
                        $(SIMDEV_DIR)/libcuda.map
	$(CXX) $(SAN_LDFLAGS) -shared -Wl,--no-undefined -Wl,-soname,libcuda.so.1 \
	  -Wl,--version-script=$(SIMDEV_DIR)/libcuda.map -o $@ $(filter %.o,$^) -lpthread

$(SIMDEV)/modules/runtime_stubs.cc: $(SIMDEV)/obj/simdev/runtime.o $(SIMDEV_DIR)/gen_stubs.py
	$(PYTHON) $(SIMDEV_DIR)/gen_stubs.py --real $(SIMDEV_CUDART_REAL) \
	  --header $(CUDA_INCLUDE)/cuda_runtime_api.h --defined $< --out $@

$(SIMDEV)/obj/modules/runtime_stubs.o: $(SIMDEV)/modules/runtime_stubs.cc $(SIMDEV_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(SIMDEV_CXXFLAGS) -c $< -o $@

$(SIMDEV)/libcudart.so.12: $(SIMDEV)/obj/simdev/runtime.o $(SIMDEV)/obj/modules/runtime_stubs.o \
                           $(SIMDEV)/libcuda.so.1 $(SIMDEV_DIR)/libcudart.map
	$(CXX) $(SAN_LDFLAGS) -shared -Wl,--no-undefined -Wl,-soname,libcudart.so.12 \
	  -Wl,--version-script=$(SIMDEV_DIR)/libcudart.map -o $@ $(filter %.o,$^) \
	  -L$(SIMDEV) -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN'

# Each kernel module: the kernels found in the source as the preprocessor sees it, then the
# source compiled as C++ with simdev/kernel.h in front (clang++), and its image table.
define simdev_module
$(SIMDEV)/modules/$(1).scan.ii: $(KERNEL_SOURCE_$(1)) $(HEADERS) $(SIMDEV_HEADERS)
	@mkdir -p $$(dir $$@)
	$(SIMDEV_KCXX) -E -P -x c++ -std=c++17 -DSIMDEV_SCAN -DQNCCL_WITH_CUDA -include simdev/kernel.h \
	  $(SIMDEV_INCLUDES) -Isrc/include -Isrc $$< -o $$@
$(SIMDEV)/modules/$(1)_module.cc $(SIMDEV)/modules/$(1)_images.cc &: \
    $(SIMDEV)/modules/$(1).scan.ii $(SIMDEV_DIR)/gen_module.py
	$(PYTHON) $(SIMDEV_DIR)/gen_module.py --module $(1) --source $(KERNEL_SOURCE_$(1)) \
	  --scan $$< --out $(SIMDEV)/modules
endef
KERNEL_SOURCE_checks := $(SIMDEV_DIR)/checks/rule_kernels.cu
$(foreach m,$(KERNEL_MODULES) checks,$(eval $(call simdev_module,$(m))))

$(SIMDEV)/obj/modules/%_module.o: $(SIMDEV)/modules/%_module.cc $(HEADERS) $(SIMDEV_HEADERS)
	@mkdir -p $(dir $@)
	$(SIMDEV_KCXX) $(SIMDEV_KFLAGS) -c $< -o $@

$(SIMDEV)/obj/modules/%_images.o: $(SIMDEV)/modules/%_images.cc $(HEADERS) $(SIMDEV_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SIMDEV_INCLUDES) -c $< -o $@

# libqnccl.so's own objects (those of the build this is part of), its kernels as simulator
# modules in place of the NVRTC images, and the simulated runtime in place of the static one.
SIMDEV_LIB_OBJS = $(filter-out $(CU_OBJS),$(LIB_OBJS)) $(SIMDEV_MODULE_OBJS) \
                  $(KERNEL_MODULES:%=$(SIMDEV)/obj/modules/%_images.o)
$(SIMDEV)/lib/libqnccl.so: $(SIMDEV_LIB_OBJS) $(SIMDEV)/libcudart.so.12 src/exports.map
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -Wl,--version-script=src/exports.map -o $@ $(SIMDEV_LIB_OBJS) \
	  -L$(SIMDEV) -l:libcudart.so.12 -ldl -Wl,-rpath,'$$ORIGIN/..'

$(SIMDEV)/bin/%_gpu_test: tests/gpu/%_gpu_test.cc $(SIMDEV)/lib/libqnccl.so $(HEADERS) \
                          tests/gpu/gpu_test.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(filter-out -fvisibility=hidden,$(CXXFLAGS)) $(SAN_LDFLAGS) $< -o $@ \
	  -L$(SIMDEV)/lib -lqnccl $(SIMDEV_CUDART_REAL) -Wl,-rpath,'$$ORIGIN/../lib'

$(SIMDEV)/bin/all_reduce_perf: perf/all_reduce_perf.cc $(call perf_objs,cuda,nccl) $(HOST_LIB) \
                               $(PERF_HEADERS)
	@mkdir -p $(dir $@)
	$(MPICXX) $(PERF_CXXFLAGS) $(PERF_FLAGS_cuda) $< $(call perf_objs,cuda,nccl) -o $@ \
	  -L$(BUILD)/host -lnccl $(SIMDEV_CUDART_REAL) -ldl

$(SIMDEV)/bin/kernel_rules: $(SIMDEV_DIR)/checks/kernel_rules.cc \
                            $(SIMDEV)/obj/modules/checks_module.o $(SIMDEV)/libcuda.so.1 \
                            $(SIMDEV_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(SIMDEV_CXXFLAGS) $(SAN_LDFLAGS) $< $(SIMDEV)/obj/modules/checks_module.o -o $@ \
	  -L$(SIMDEV) -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN/..'
