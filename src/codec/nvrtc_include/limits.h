/* <limits.h> for NVRTC (see README). */
#pragma once
#include <cuda/std/climits>
