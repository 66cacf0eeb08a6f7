// Pipeline parallelism (PP): the per-stage schedules, the executor that runs one stage's schedule
// over the pipeline group with point-to-point sends, the bubble (formula and measured) and the
// partition of layers into stages by a cost profile. Knows nothing of the model: the mesh engine
// passes callbacks that run one model chunk forward or backward on one microbatch.
//
// Terms: p stages (ranks of the pp group), m microbatches, v model chunks per stage ("virtual
// stages"). Chunk c of stage s is virtual stage c*p + s (Megatron interleaving), so the pipeline
// is V = p*v virtual stages deep and the activations of the last stage's chunk c go to stage 0's
// chunk c+1. gpipe and one_f_one_b use v = 1.
//
// Schedules (the per-stage order of forward F and backward B actions, Megatron-LM's):
//   gpipe        F of every microbatch, then B of every microbatch (in microbatch order). Keeps m
//                microbatches' activations alive.
//   one_f_one_b  warmup of min(p-s-1, m) forwards, then alternate one F and one B, then the
//                remaining Bs (PipeDream-flush). At most p-s microbatches are in flight on stage s.
//   interleaved  Megatron's interleaved 1F1B over v chunks: the k-th forward of a stage runs
//                chunk (k mod p*v) / p on microbatch (k / (p*v))*p + k mod p, i.e. groups of p
//                microbatches go through chunk 0, then chunk 1, ...; the k-th backward walks the
//                chunks in reverse (chunk v-1 - (k mod p*v)/p). Warmup is (p-s-1)*2 + (v-1)*p
//                forwards (capped at m*v; all m*v when m == p), then 1F1B, then the remaining Bs.
// Every schedule needs m >= p when p > 1 (we enforce it, as Megatron does); interleaved needs
// v >= 2 and m % p == 0.
//
// Bubble: with equal stage costs and free communication each stage idles (p-1)/(v*m + p-1) of the
// step in every schedule (interleaving divides the warmup/cooldown time by v). Executed as soon as
// inputs allow on the simulator, the three schedules give exactly this (any ratio of backward to
// forward cost); communication latency adds to it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// PipeSchedule and its names: parallel/config.hpp.

// A pipeline configuration the schedules do not support, or a callback breaking its contract.
class PipelineError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct PipeAction {
  enum class Kind : std::uint8_t { forward, backward } kind;
  int microbatch;
  int chunk;  // this stage's local chunk 0..v-1 (virtual stage chunk * stages + stage)
  friend bool operator==(const PipeAction&, const PipeAction&) = default;
};

// The order stage `stage` of `stages` runs its actions in: every (microbatch, chunk) forward once
// and backward once, each backward after its forward. Throws PipelineError naming the numbers for
// a configuration the schedule does not support (see above).
std::vector<PipeAction> pipeline_schedule(PipeSchedule s, int stages, int stage, int microbatches,
                                          int virtual_stages);

// What one stage does, in order, to run its schedule over the pp group (run_pipeline executes
// these; the planner's timing-only run issues the same with null buffers). A message is named by
// the virtual stage that consumes it: the activation entering `vs` (forward) or the gradient of the
// activation leaving `vs` (backward). Receives are posted in each sender's send order, as late as
// the data is needed (with every earlier message of the same sender); a stage's sends are waited
// for only at the end, in send order. With one stage, messages go to the stage itself (peer ==
// stage) and are handed on without communication.
struct PipeMessage {
  PipeAction::Kind kind = PipeAction::Kind::forward;
  int microbatch = 0;
  int vs = 0;
  auto operator<=>(const PipeMessage&) const = default;
};
struct PipeEvent {
  enum class Kind : std::uint8_t { post_recv, wait_recv, run, send } kind;
  PipeAction action{};    // run: the action; post_recv / wait_recv / send: the one it serves
  PipeMessage message{};  // post_recv / wait_recv / send
  int peer = -1;          // the stage sent to or received from
};
std::vector<PipeEvent> pipeline_events(PipeSchedule s, int stages, int stage, int microbatches,
                                       int virtual_stages);

template <class T>
struct PipeStage {
  // forward(mb, chunk, input): input is empty on virtual stage 0; returns the output activation
  // (ignored on the last virtual stage).
  std::function<ref::Tensor<T>(int microbatch, int chunk, ref::Tensor<T> input)> forward;
  // backward(mb, chunk, grad_output): grad_output is empty on the last virtual stage; returns the
  // gradient of the input (ignored on virtual stage 0).
  std::function<ref::Tensor<T>(int microbatch, int chunk, ref::Tensor<T> grad_output)> backward;
  // Shape of the activation entering virtual stage vs for microbatch mb (= the output of vs-1, and
  // the shape of its gradient). Every rank must be able to compute every shape.
  std::function<ref::Shape(int microbatch, int virtual_stage)> activation_shape;
};

// Runs this rank's schedule (stage = pp.rank(), p = pp.size()): receives inputs and output
// gradients from the neighbouring stages, calls the callbacks in schedule order and sends outputs
// and input gradients on. Sends are posted asynchronously and waited only at the end (so the
// rendezvous sends never stall or deadlock a stage); a receive is posted when its data is needed,
// together with every earlier message of the same sender (messages match in posting order per
// sender and receiver, as NCCL's do, so no tags are relied on). With p == 1 chunk outputs are
// handed on locally. Throws PipelineError for a bad configuration or a callback returning a tensor
// whose shape is not activation_shape's; communication errors propagate.
template <class T>
void run_pipeline(comm::Communicator& pp, PipeSchedule s, int microbatches, int virtual_stages,
                  const PipeStage<T>& stage);

// The timing-only run of a stage (the planner's): the same events, messages and order as
// run_pipeline, every message a null buffer of activation_shape's elements in `dtype`; the
// callbacks run the chunk without data. `events`: this stage's pipeline_events.
struct NullPipeStage {
  std::function<void(int microbatch, int chunk)> forward;
  std::function<void(int microbatch, int chunk)> backward;
  std::function<ref::Shape(int microbatch, int virtual_stage)> activation_shape;
  comm::DType dtype = comm::DType::f32;
};
void run_pipeline(comm::Communicator& pp, const std::vector<PipeEvent>& events,
                  const NullPipeStage& stage);

// (p-1)/(v*m + p-1): the idle fraction of each stage with equal costs and free communication.
double bubble_formula(int stages, int microbatches, int virtual_stages);

struct Interval {
  double start = 0, end = 0;
};
// One stage's measured bubble: 1 - busy / (step_end - step_start), busy = the length of the union
// of its compute intervals clipped to the step. Pure: the caller extracts the intervals (e.g. the
// simulator timeline's compute events of one rank).
double measured_bubble(std::span<const Interval> compute, double step_start, double step_end);
// The mean of measured_bubble over stages (one interval list per stage).
double mean_measured_bubble(std::span<const std::vector<Interval>> per_stage, double step_start,
                            double step_end);

// Contiguous layer ranges [begin, end) for `chunks` chunks (p*v, in virtual-stage order) that
// minimise the largest chunk cost, where chunk 0 also pays first_extra (embedding) and the last
// chunk pays last_extra (final norm, LM head, loss). Every chunk gets >= 1 layer. Ties: the
// most even of the optimal partitions (least sum of squared chunk costs), then fewer layers for
// earlier chunks (earlier stages hold more microbatches' activations under 1F1B). Throws
// PipelineError when layers < chunks or chunks < 1.
std::vector<std::pair<int, int>> partition_layers(std::span<const double> layer_cost,
                                                  double first_extra, double last_extra,
                                                  int chunks);

}  // namespace shardcheck::parallel
