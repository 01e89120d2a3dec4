/* The SIMT executor: runs a kernel launch of a module compiled for the
 * simulated GPU on the calling (worker) thread.
 *
 * Every CUDA thread is a fiber. Blocks run one after another, one at a time
 * in the process (their __shared__ storage is the module's one section,
 * filled with garbage before each block). Inside a block, lanes run until
 * they reach a warp operation or return; a warp operation completes once
 * every lane of the warp that its mask names has reached it, and the
 * executor requires, as CUDA does, that they all call the same operation
 * with the same mask (it requires the same line too: stricter than the
 * hardware, which QNCCL's kernels meet). A lane that returns while others
 * wait for it at a warp operation, lanes that meet at different operations,
 * a mask without the caller's own lane, a shuffle that reads a lane not
 * taking part: the launch fails, naming the lines. Lanes and warps run and
 * resume in the configured order (SIMDEV_LANE_ORDER), so code that depends
 * on an order the hardware does not promise gives different bytes under
 * different orders. */
#ifndef SIMDEV_CORE_EXECUTOR_H_
#define SIMDEV_CORE_EXECUTOR_H_

#include <stddef.h>

#include <mutex>
#include <vector>

#include <driver_types.h>

#include "simdev/abi.h"

namespace simdev {

struct Launch {
  const simdev_module_image* image;
  const simdev_kernel* kernel;
  simdev_dim3 grid, block;
  const unsigned char* params;  // the packed parameter block
  const size_t* offsets;        // of each parameter in it
  int device;
  std::vector<int> hidden;      // devices whose memory it may not touch (no peer access)
};

/* Device work (kernels, copies, memsets) runs one piece at a time in the
 * process, under this lock: a block's __shared__ storage is one section, and
 * a kernel hides other devices' memory while it runs. */
std::mutex& device_work_lock();

/* Runs every block of `launch`; cudaSuccess, or the error it ended with
 * (cudaErrorIllegalAddress for a fault, cudaErrorLaunchFailure for misused
 * warp operations), described in the thread's last message. */
cudaError_t execute(const Launch& launch);

/* The warp operations handed to every module at load. */
const simdev_hooks* executor_hooks();

}  // namespace simdev

#endif
