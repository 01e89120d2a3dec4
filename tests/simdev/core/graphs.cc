/* Stream capture, graphs, their instances and user objects.
 *
 * A capture starts on its origin stream; work issued to a capturing stream
 * becomes a node that depends on the stream's tail. A stream joins a
 * capture by waiting on an event recorded in it (a fork) and must be joined
 * back to the origin (the origin waits on an event recorded after the
 * stream's last node) before the capture ends, or the end fails with
 * cudaErrorStreamCaptureUnjoined. What CUDA forbids during capture fails
 * and invalidates it: synchronizing or querying a capturing stream or
 * captured event, the legacy stream while a blocking stream captures,
 * waiting on an event from outside without cudaEventWaitExternal, and the
 * calls CUDA calls potentially unsafe (allocation) under the thread's
 * capture interaction mode. An instance runs its nodes one at a time, in
 * an order that respects their dependencies and nothing else: the newest
 * startable node first under the lazy schedule. */
#include <algorithm>
#include <thread>

#include "core/config.h"
#include "core/core.h"
#include "core/errors.h"
#include "core/internal.h"

namespace simdev {
namespace {

thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

const char* mode_name(cudaStreamCaptureMode m) {
  return m == cudaStreamCaptureModeGlobal ? "global"
         : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

/* Drops references; destructors of objects left without any run on this
 * thread, without the mutex (CUDA runs them on an internal thread). */
void release_objects(const std::map<UserObject*, unsigned>& refs) {
  std::vector<UserObject*> dead;
  {
    Lock lock(sim().mutex);
    for (const auto& [o, n] : refs) {
      o->refs -= std::min(o->refs, n);
      if (o->refs == 0) {
        sim().user_objects.erase(o);
        dead.push_back(o);
      }
    }
  }
  for (UserObject* o : dead) {
    if (o->destroy != nullptr) o->destroy(o->ptr);
    delete o;
  }
}

/* Every node `from` depends on, directly or not, and from. */
void ancestors(const std::vector<Node*>& from, std::set<const Node*>* out) {
  std::vector<const Node*> todo(from.begin(), from.end());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!out->insert(n).second) continue;
    for (const Node* d : n->deps) todo.push_back(d);
  }
}

/* A graph the API may use: a made one, or one a capture builds. */
bool live_graph_locked(Graph* g) {
  if (sim().graphs.count(g)) return true;
  for (const auto& [id, c] : sim().captures)
    if (c->graph.get() == g) return true;
  return false;
}

void end_locked(Capture* c) {
  for (Stream* s : c->members) {
    s->capture = nullptr;
    s->tail.clear();
  }
  sim().captures.erase(c->id);
}

}  // namespace

Exec::~Exec() { release_objects(objects); }

void invalidate_locked(Capture* c, const std::string& why) {
  if (c->invalidated) return;
  c->invalidated = true;
  c->why = why;
  report("stream capture %lu (origin stream %lu) invalidated: %s", (unsigned long)c->id,
         (unsigned long)c->origin->id, why.c_str());
}

Capture* blocking_capture_locked(Device* d) {
  for (Stream* s : d->streams)
    if (s->capture != nullptr && s->blocking() && s->kind != Stream::kLegacy) return s->capture;
  return nullptr;
}

Node* add_node_locked(Stream* s, Node::Kind kind, Work work, Event* event) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  node->work = std::move(work);
  node->event = event;
  node->deps = s->tail;
  Node* n = node.get();
  s->capture->graph->nodes.push_back(std::move(node));
  s->tail = {n};
  return n;
}

cudaError_t capture_begin(Stream* s, cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d; allowed: global (0), "
                "thread-local (1), relaxed (2)", (int)mode);
  Sim& S = sim();
  Lock lock(S.mutex);
  if (s->kind == Stream::kLegacy)
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the legacy default "
                "stream: not allowed; capture on a stream you created");
  if (s->capture != nullptr)
    return fail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is already capturing");
  auto* c = new Capture();
  c->id = S.next_capture++;
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->graph = std::make_unique<Graph>();
  c->graph->device = s->device;
  c->members.insert(s);
  s->capture = c;
  s->tail.clear();
  S.captures[c->id] = c;
  return cudaSuccess;
}

cudaError_t capture_end(Stream* s, Graph** out) {
  *out = nullptr;
  Sim& S = sim();
  Lock lock(S.mutex);
  Capture* c = s->capture;
  if (c == nullptr || c->origin != s)
    return fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture: %s",
                c == nullptr ? "the stream is not capturing"
                             : "the capture did not begin on this stream (end it on its origin)");
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture from another thread "
                "than the one that began a %s-mode capture", mode_name(c->mode));
  std::unique_ptr<Capture> ended(c);
  std::set<const Node*> joined;
  ancestors(s->tail, &joined);
  std::string unjoined;
  for (Stream* t : c->members)
    for (const Node* n : t->tail)
      if (t != s && !joined.count(n)) unjoined += " " + std::to_string(t->id);
  end_locked(c);
  if (c->invalidated)
    return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was "
                "invalidated (%s)", c->why.c_str());
  if (!unjoined.empty())
    return fail(cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture: stream(s)%s joined the "
                "capture and were not joined back to its origin (record an event on each and "
                "make the origin wait on it before ending)", unjoined.c_str());
  *out = c->graph.release();
  S.graphs.insert(*out);
  return cudaSuccess;
}

cudaError_t capture_info(Stream* s, cudaStreamCaptureStatus* status, unsigned long long* id,
                         Graph** graph, Node* const** deps, size_t* ndeps) {
  Lock lock(sim().mutex);
  if (s->kind == Stream::kLegacy && blocking_capture_locked(s->device) != nullptr)
    return fail(cudaErrorStreamCaptureImplicit, "capture status of the legacy default stream "
                "while a blocking stream of device %d captures: it would be implicitly captured",
                s->device->ordinal);
  Capture* c = s->capture;
  *status = c == nullptr        ? cudaStreamCaptureStatusNone
            : c->invalidated   ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
  if (c == nullptr || c->invalidated) return cudaSuccess;
  if (id != nullptr) *id = c->id;
  if (graph != nullptr) *graph = c->graph.get();
  if (deps != nullptr) *deps = s->tail.data();
  if (ndeps != nullptr) *ndeps = s->tail.size();
  return cudaSuccess;
}

cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode) {
  const cudaStreamCaptureMode m = *mode;
  if (m != cudaStreamCaptureModeGlobal && m != cudaStreamCaptureModeThreadLocal &&
      m != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: mode %d", (int)m);
  *mode = thread_mode;
  thread_mode = m;
  return cudaSuccess;
}

cudaError_t check_unsafe_call(const char* api) {
  Sim& S = sim();
  Lock lock(S.mutex);
  if (thread_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const std::thread::id me = std::this_thread::get_id();
  std::vector<Capture*> forbid;
  for (const auto& [id, c] : S.captures) {
    const bool mine = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = thread_mode == cudaStreamCaptureModeGlobal &&
                        c->mode == cudaStreamCaptureModeGlobal;
    if (mine || global) forbid.push_back(c);
  }
  if (forbid.empty()) return cudaSuccess;
  for (Capture* c : forbid) invalidate_locked(c, std::string(api) + " during the capture");
  return fail(cudaErrorStreamCaptureUnsupported, "%s while a stream captures in %s mode (this "
              "thread's mode: %s): potentially unsafe, not allowed; allocate before capturing, "
              "or make the call in relaxed mode (cudaThreadExchangeStreamCaptureMode)", api,
              mode_name(forbid.front()->mode), mode_name(thread_mode));
}

cudaError_t graph_create(Device* d, Graph** out) {
  SIMDEV_CHECK(use_device(d));
  Lock lock(sim().mutex);
  *out = new Graph();
  (*out)->device = d;
  sim().graphs.insert(*out);
  return cudaSuccess;
}

cudaError_t graph_destroy(Graph* g) {
  std::map<UserObject*, unsigned> refs;
  {
    Lock lock(sim().mutex);
    if (!sim().graphs.erase(g))
      return fail(cudaErrorInvalidValue, "cudaGraphDestroy(%p): not a live graph", (void*)g);
    refs.swap(g->objects);
  }
  release_objects(refs);
  delete g;
  return cudaSuccess;
}

cudaError_t graph_instantiate(Graph* g, unsigned long long flags, Exec** out) {
  const unsigned long long allowed = cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                     cudaGraphInstantiateFlagUpload |
                                     cudaGraphInstantiateFlagUseNodePriority;
  if (flags & ~allowed)
    return fail(cudaErrorInvalidValue, "cudaGraphInstantiate flags %#llx: only "
                "AutoFreeOnLaunch, Upload and UseNodePriority are simulated", flags);
  Lock lock(sim().mutex);
  if (!sim().graphs.count(g))
    return fail(cudaErrorInvalidValue, "cudaGraphInstantiate(%p): not a live graph", (void*)g);
  auto x = std::make_shared<Exec>();
  x->device = g->device;
  std::map<const Node*, size_t> index;
  std::vector<const Node*> order;  // Kahn's algorithm: creation order among the free nodes
  std::map<const Node*, size_t> pending;
  for (const auto& n : g->nodes) pending[n.get()] = n->deps.size();
  std::vector<const Node*> free_nodes;
  for (const auto& n : g->nodes)
    if (n->deps.empty()) free_nodes.push_back(n.get());
  std::map<const Node*, std::vector<const Node*>> dependents;
  for (const auto& n : g->nodes)
    for (const Node* d : n->deps) dependents[d].push_back(n.get());
  while (!free_nodes.empty()) {
    const Node* n = free_nodes.front();
    free_nodes.erase(free_nodes.begin());
    index[n] = order.size();
    order.push_back(n);
    for (const Node* m : dependents[n])
      if (--pending[m] == 0) free_nodes.push_back(m);
  }
  if (order.size() != g->nodes.size())
    return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: the graph has a cycle");
  for (const Node* n : order) {
    Exec::Step step;
    step.node.kind = n->kind;
    step.node.work = n->work;
    step.node.event = n->event;
    for (const Node* d : n->deps) step.after.push_back(index[d]);
    x->steps.push_back(std::move(step));
  }
  for (const auto& [o, n] : g->objects) {  // the instance holds a reference of each
    o->refs++;
    x->objects[o] = 1;
  }
  *out = x.get();
  sim().execs[x.get()] = x;
  return cudaSuccess;
}

cudaError_t run_exec(Exec& x) {
  const size_t n = x.steps.size();
  std::vector<size_t> waiting(n);
  std::vector<std::vector<size_t>> dependents(n);
  std::vector<size_t> ready;
  for (size_t i = 0; i < n; i++) {
    waiting[i] = x.steps[i].after.size();
    for (size_t d : x.steps[i].after) dependents[d].push_back(i);
    if (waiting[i] == 0) ready.push_back(i);
  }
  const bool newest_first = config().schedule == Schedule::kLazy;
  while (!ready.empty()) {
    auto pick = newest_first ? std::max_element(ready.begin(), ready.end())
                             : std::min_element(ready.begin(), ready.end());
    const size_t i = *pick;
    ready.erase(pick);
    const Node& node = x.steps[i].node;
    cudaError_t e = cudaSuccess;
    if (node.kind == Node::kWork && node.work.run) {
      if (node.work.kind == Work::kHost) {
        std::lock_guard<std::mutex> one_at_a_time(x.device->host_functions);
        set_in_host_function(true);
        e = node.work.run();
        set_in_host_function(false);
      } else {
        e = node.work.run();
      }
    } else if (node.kind == Node::kEventRecord) {
      Lock lock(sim().mutex);
      if (live_event_locked(node.event)) {
        node.event->snapshot = done_now();
        node.event->capture_id = 0;
        node.event->captured.clear();
      }
    } else if (node.kind == Node::kEventWait) {
      Lock lock(sim().mutex);
      if (live_event_locked(node.event) && node.event->capture_id == 0)
        e = wait_locked(lock, node.event->snapshot, "a graph's event wait node");
    }
    if (e != cudaSuccess) return e;
    for (size_t m : dependents[i])
      if (--waiting[m] == 0) ready.push_back(m);
  }
  Lock lock(sim().mutex);
  sim().counters.graph_launches++;
  return cudaSuccess;
}

cudaError_t graph_launch(Exec* handle, Stream* s) {
  Lock lock(sim().mutex);
  auto it = sim().execs.find(handle);
  if (it == sim().execs.end())
    return fail(cudaErrorInvalidValue, "cudaGraphLaunch(%p): not a live graph instance",
                (void*)handle);
  std::shared_ptr<Exec> x = it->second;
  if (x->device != s->device)
    return fail(cudaErrorInvalidValue, "cudaGraphLaunch: the graph is device %d's, the stream "
                "device %d's", x->device->ordinal, s->device->ordinal);
  if (s->capture != nullptr)
    return fail(cudaErrorNotSupported, "cudaGraphLaunch into a capturing stream (a child "
                "graph) is not simulated");
  Work w;
  w.kind = Work::kDevice;
  w.what = "graph launch";
  w.run = [x] { return run_exec(*x); };
  std::vector<Done> deps;
  if (x->last_launch) deps.push_back(x->last_launch);
  SIMDEV_CHECK(issue_locked(s, std::move(w), deps));
  x->last_launch = s->last;
  return cudaSuccess;
}

cudaError_t exec_destroy(Exec* handle) {
  std::shared_ptr<Exec> x;
  {
    Lock lock(sim().mutex);
    auto it = sim().execs.find(handle);
    if (it == sim().execs.end())
      return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy(%p): not a live graph instance",
                  (void*)handle);
    x = std::move(it->second);
    sim().execs.erase(it);
  }
  return cudaSuccess;  // x goes here, or with its last pending launch
}

cudaError_t user_object_create(void* ptr, void (*destroy)(void*), unsigned refs, unsigned flags,
                               UserObject** out) {
  if (flags != cudaUserObjectNoDestructorSync)
    return fail(cudaErrorInvalidValue, "cudaUserObjectCreate: flags must be "
                "cudaUserObjectNoDestructorSync");
  if (refs == 0 || destroy == nullptr)
    return fail(cudaErrorInvalidValue, "cudaUserObjectCreate: %s", refs == 0
                ? "initialRefcount is 0" : "destroy is NULL");
  Lock lock(sim().mutex);
  auto* o = new UserObject{ptr, destroy, refs};
  sim().user_objects.insert(o);
  *out = o;
  return cudaSuccess;
}

cudaError_t user_object_retain(UserObject* o, unsigned count) {
  Lock lock(sim().mutex);
  if (!sim().user_objects.count(o) || count == 0)
    return fail(cudaErrorInvalidValue, "cudaUserObjectRetain(%p, %u): not a live user object, or "
                "count 0", (void*)o, count);
  o->refs += count;
  return cudaSuccess;
}

cudaError_t user_object_release(UserObject* o, unsigned count) {
  {
    Lock lock(sim().mutex);
    if (!sim().user_objects.count(o) || count == 0 || count > o->refs)
      return fail(cudaErrorInvalidValue, "cudaUserObjectRelease(%p, %u): not a live user object, "
                  "or more references than it has", (void*)o, count);
  }
  release_objects({{o, count}});
  return cudaSuccess;
}

cudaError_t graph_retain_object(Graph* g, UserObject* o, unsigned count, unsigned flags) {
  if (flags & ~(unsigned)cudaGraphUserObjectMove)
    return fail(cudaErrorInvalidValue, "cudaGraphRetainUserObject flags %#x; allowed: 0, "
                "cudaGraphUserObjectMove", flags);
  Lock lock(sim().mutex);
  if (!live_graph_locked(g) || !sim().user_objects.count(o) || count == 0)
    return fail(cudaErrorInvalidValue, "cudaGraphRetainUserObject: not a live graph and user "
                "object, or count 0");
  if (!(flags & cudaGraphUserObjectMove)) o->refs += count;  // else the caller's move over
  g->objects[o] += count;
  return cudaSuccess;
}

cudaError_t graph_release_object(Graph* g, UserObject* o, unsigned count) {
  {
    Lock lock(sim().mutex);
    if (!live_graph_locked(g))
      return fail(cudaErrorInvalidValue, "cudaGraphReleaseUserObject: not a live graph");
    auto it = g->objects.find(o);
    if (it == g->objects.end() || count == 0 || count > it->second)
      return fail(cudaErrorInvalidValue, "cudaGraphReleaseUserObject: the graph holds fewer "
                  "references");
    if ((it->second -= count) == 0) g->objects.erase(it);
  }
  release_objects({{o, count}});
  return cudaSuccess;
}

}  // namespace simdev
