/* Kernels that break (or keep) a rule of the GPU, for the simulated GPU's own
 * tests (kernel_rules.cc, tests/test_simdev_runtime.py). Plain CUDA: the
 * simulator compiles them as it compiles QNCCL's kernels. */

struct Big {
  float v[1100];  // 4400 bytes of parameters: more than the 4 KiB every driver takes
};

extern "C" __global__ void big_params(Big b, float* out) { out[threadIdx.x] = b.v[threadIdx.x]; }

extern "C" __global__ void copy_values(const float* in, float* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i];
}

extern "C" __global__ void read_past_end(const float* in, float* out, int n) {
  out[threadIdx.x] = in[n + threadIdx.x];
}

extern "C" __global__ void misaligned_vector(const float* in, float4* out) {
  out[threadIdx.x] = *reinterpret_cast<const float4*>(in + 1 + 4 * threadIdx.x);
}

extern "C" __global__ void divergent_syncwarp(int* out) {
  if (threadIdx.x < 16) {
    __syncwarp();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = 1;
}

extern "C" __global__ void early_return(int* out) {
  if (threadIdx.x == 2) return;
  __syncwarp();
  out[threadIdx.x] = 1;
}

extern "C" __global__ void mask_mismatch(int* out) {
  __syncwarp(threadIdx.x < 16 ? 0x0000ffffu : 0xffffffffu);
  out[threadIdx.x] = 1;
}

/* Legal: the lower half of the warp meets on its own mask. */
extern "C" __global__ void half_warp(int* out) {
  if (threadIdx.x % 32 < 16) __syncwarp(0x0000ffffu);
  out[threadIdx.x] = 1;
}

/* A butterfly sum over each warp: every lane ends with its warp's sum. */
extern "C" __global__ void warp_sum(const int* in, int* out) {
  int v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, lane_mask);
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

/* Shared memory read before anything wrote it. */
extern "C" __global__ void shared_unwritten(unsigned* out) {
  __shared__ unsigned staging[256];
  out[blockIdx.x * blockDim.x + threadIdx.x] = staging[threadIdx.x];
}

extern "C" __global__ void convert(const float* in, int* as_int, unsigned* as_unsigned) {
  as_int[threadIdx.x] = static_cast<int>(in[threadIdx.x]);
  as_unsigned[threadIdx.x] = static_cast<unsigned>(in[threadIdx.x]);
}

extern "C" __global__ void halve(const float* in, float* out) {
  out[threadIdx.x] = in[threadIdx.x] * 0.5f;
}
