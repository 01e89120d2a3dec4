/* <stddef.h> for NVRTC (see README). */
#pragma once
#include <cuda/std/cstddef>
using cuda::std::size_t;
using cuda::std::ptrdiff_t;
