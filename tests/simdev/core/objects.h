/* The simulated GPU's objects: devices (each with its primary context),
 * streams and the operations queued on them, events, stream captures,
 * graphs and their executable instances, user objects, modules and their
 * kernels. One mutex (Sim::mutex) guards all of them; device work runs on
 * the streams' worker threads without it. core/core.h is what the driver and
 * runtime layers call. */
#ifndef SIMDEV_CORE_OBJECTS_H_
#define SIMDEV_CORE_OBJECTS_H_

#include <stddef.h>
#include <stdint.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <driver_types.h>

#include "simdev/abi.h"

namespace simdev {

using Clock = std::chrono::steady_clock;

struct Capture;
struct Device;
struct Event;
struct Node;
struct Op;
struct Stream;

/* The completion of one operation: what events, waits and synchronizing
 * calls refer to. */
struct Completion {
  Op* op = nullptr;          // while queued (for forcing it in lazy mode)
  Stream* stream = nullptr;
  bool done = false;
  double time_ms = 0;        // when it completed (events' timestamps)
  cudaError_t error = cudaSuccess;
};
using Done = std::shared_ptr<Completion>;

/* Work on the device: a kernel, a copy, a memset, a stream-ordered
 * allocation or free, a graph launch; or a host function; or nothing (a
 * marker: an event record, a wait). */
struct Work {
  enum Kind { kDevice, kHost, kMarker } kind = kMarker;
  std::string what;                      // "kernel qnccl_x", "copy of 4096 bytes", ...
  std::function<cudaError_t()> run;      // on the stream's worker, outside the mutex
};

struct Op {
  Work work;
  std::vector<Done> deps;  // besides the stream order
  Done done;
  uint64_t order = 0;      // issue order, process-wide
  Clock::time_point issued;
  bool forced = false;     // the host waits for it (lazy schedule)
};

struct Stream {
  enum Kind { kUser, kLegacy, kPerThread } kind = kUser;
  Device* device = nullptr;
  unsigned flags = 0;      // cudaStreamNonBlocking
  int priority = 0;
  uint64_t id = 0;
  std::deque<std::unique_ptr<Op>> queue;  // not started yet
  Done last;               // of the last operation issued
  bool running = false;    // its worker runs an operation
  bool destroyed = false;  // the handle is gone; the worker ends once the queue is empty
  std::thread worker;
  bool worker_started = false;
  // stream capture
  Capture* capture = nullptr;
  std::vector<Node*> tail;  // what the next captured operation depends on
  /* Blocking streams synchronize with the legacy default stream. */
  bool blocking() const { return kind != kUser || (flags & cudaStreamNonBlocking) == 0; }
};

struct Device {
  int ordinal = 0;
  bool initialized = false;  // its primary context
  unsigned flags = 0;        // cudaSetDeviceFlags
  cudaError_t sticky = cudaSuccess;  // a fault ended device work: every later call fails with it
  Stream* legacy = nullptr;
  std::set<Stream*> streams;  // every live stream of the device, the legacy one included
  std::mutex host_functions;  // host functions of a device run one at a time
  bool busy = false;          // lazy schedule: one device operation at a time
  std::set<int> peers;        // devices whose memory its kernels may use
};

struct Event {
  Device* device = nullptr;
  unsigned flags = 0;
  Done snapshot;                // what it stands for; null: never recorded
  uint64_t capture_id = 0;      // last recorded in this capture (0: not captured)
  std::vector<Node*> captured;  // the capture's nodes it stands for
};

/* ---- graphs ---- */

struct UserObject {
  void* ptr = nullptr;
  void (*destroy)(void*) = nullptr;
  unsigned refs = 0;
};

struct Node {
  enum Kind { kWork, kEventRecord, kEventWait } kind = kWork;
  Work work;
  Event* event = nullptr;  // kEventRecord, kEventWait
  std::vector<Node*> deps;
};

struct Graph {
  Device* device = nullptr;
  std::vector<std::unique_ptr<Node>> nodes;
  std::map<UserObject*, unsigned> objects;  // references the graph holds
};

/* An instantiated graph: a snapshot of its nodes in an order that respects
 * their dependencies, and references to the graph's user objects. */
struct Exec {
  struct Step {
    Node node;                   // copied; deps cleared
    std::vector<size_t> after;   // indices of the steps it depends on
  };
  Device* device = nullptr;
  std::vector<Step> steps;
  std::map<UserObject*, unsigned> objects;  // released when the last launch holding it is done
  Done last_launch;              // launches of one instance run one at a time
  ~Exec();                       // never under the mutex
};

struct Capture {
  uint64_t id = 0;
  Stream* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::string why;               // what invalidated it
  std::unique_ptr<Graph> graph;
  std::set<Stream*> members;     // the origin and every stream joined to it
};

/* ---- kernels ---- */

struct Module {
  Device* device = nullptr;
  const simdev_module_image* image = nullptr;
};

struct Function {
  Module* module = nullptr;
  const simdev_kernel* kernel = nullptr;
  std::vector<size_t> offsets;  // of each parameter in the packed block
  size_t param_bytes = 0;
};

/* Process-wide counters, for tests (simdevGetCounters). */
struct Counters {
  uint64_t kernels = 0;              // kernels executed
  uint64_t graph_launches = 0;
  uint64_t allocations_in_capture = 0;  // memory allocated while any stream was capturing
  uint64_t host_functions = 0;
  uint64_t modules_loaded = 0;       // cuModuleLoadData calls that loaded a module
  uint64_t kernels_resolved = 0;     // kernels loaded by a first cuModuleGetFunction
};

struct Sim {
  std::mutex mutex;
  // an operation completed, or something a worker waits on changed
  std::condition_variable progress;
  std::vector<std::unique_ptr<Device>> devices;
  std::set<Stream*> streams;         // live handles
  std::set<Event*> events;
  std::set<Graph*> graphs;
  std::map<Exec*, std::shared_ptr<Exec>> execs;
  std::set<UserObject*> user_objects;
  std::set<Module*> modules;
  std::set<Function*> functions;
  std::map<uint64_t, Capture*> captures;  // in progress, by id
  uint64_t next_order = 1, next_capture = 1, next_stream = 1;
  uint64_t completed = 0;            // operations completed (a hang shows as no change)
  Counters counters;
};

Sim& sim();

}  // namespace simdev

#endif
