// run_pipeline: one stage's schedule over the pp group. Every stage derives the message order of
// its neighbours from their schedules, so receives are posted in each sender's send order (the
// order NCCL matches p2p messages in) and only when their data is needed: a receive posted at the
// moment its data is needed costs no virtual time on the simulator, and a send is never waited
// on before the end, so a stage never stalls on a neighbour that has not reached the receive yet.
#include <deque>
#include <map>
#include <string>
#include <tuple>

#include "parallel/mp/pipeline.hpp"

namespace shardcheck::parallel {

namespace {

// A message, named by the virtual stage that consumes it: the activation entering `vs` (forward),
// or the gradient of the activation leaving `vs` (backward, i.e. the grad_output of vs).
struct Key {
  PipeAction::Kind kind;
  int mb;
  int vs;
  auto operator<=>(const Key&) const = default;
};

struct Outgoing {
  Key key;
  int dest;  // stage
};

// The messages stage `stage` sends, in send order.
std::vector<Outgoing> outgoing(PipeSchedule s, int p, int stage, int m, int v) {
  const int depth = p * v;
  std::vector<Outgoing> out;
  for (const PipeAction& a : pipeline_schedule(s, p, stage, m, v)) {
    const int vs = a.chunk * p + stage;
    if (a.kind == PipeAction::Kind::forward && vs + 1 < depth) {
      out.push_back({{a.kind, a.microbatch, vs + 1}, (vs + 1) % p});
    } else if (a.kind == PipeAction::Kind::backward && vs > 0) {
      out.push_back({{a.kind, a.microbatch, vs - 1}, (vs - 1) % p});
    }
  }
  return out;
}

std::string shape_str(const ref::Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

template <class T>
class Executor {
 public:
  Executor(comm::Communicator& pp, PipeSchedule s, int m, int v, const PipeStage<T>& cb)
      : pp_(pp), cb_(cb), p_(pp.size()), stage_(pp.rank()), v_(v) {
    actions_ = pipeline_schedule(s, p_, stage_, m, v);
    if (!cb.forward || !cb.backward || !cb.activation_shape) {
      throw PipelineError("run_pipeline: PipeStage needs forward, backward and activation_shape");
    }
    if (p_ == 1) return;
    for (const int peer : {(stage_ + p_ - 1) % p_, (stage_ + 1) % p_}) {
      if (!inboxes_.empty() && inboxes_.front().peer == peer) continue;  // p == 2: one neighbour
      Inbox in{peer, {}, 0};
      for (const Outgoing& o : outgoing(s, p_, peer, m, v)) {
        if (o.dest == stage_) in.order.push_back(o.key);
      }
      inboxes_.push_back(std::move(in));
    }
  }

  void run() {
    const int depth = p_ * v_;
    for (const PipeAction& a : actions_) {
      const int vs = a.chunk * p_ + stage_;
      scope_ = {a.kind == PipeAction::Kind::forward ? comm::WorkScope::Pass::forward
                                                    : comm::WorkScope::Pass::backward,
                a.microbatch, a.chunk};
      pp_.set_scope(scope_);
      if (a.kind == PipeAction::Kind::forward) {
        ref::Tensor<T> in;
        if (vs > 0) in = take({a.kind, a.microbatch, vs}, (stage_ + p_ - 1) % p_);
        ref::Tensor<T> out = cb_.forward(a.microbatch, a.chunk, std::move(in));
        if (vs + 1 < depth) {
          check_shape(out, a, vs + 1, "forward");
          give({a.kind, a.microbatch, vs + 1}, (stage_ + 1) % p_, std::move(out));
        }
      } else {
        ref::Tensor<T> grad;
        if (vs + 1 < depth) grad = take({a.kind, a.microbatch, vs}, (stage_ + 1) % p_);
        ref::Tensor<T> out = cb_.backward(a.microbatch, a.chunk, std::move(grad));
        if (vs > 0) {
          check_shape(out, a, vs, "backward");
          give({a.kind, a.microbatch, vs - 1}, (stage_ + p_ - 1) % p_, std::move(out));
        }
      }
    }
    pp_.set_scope({});
    for (auto& [tensor, work] : sends_) work->wait();
  }

 private:
  struct Inbox {
    int peer;
    std::vector<Key> order;  // the peer's sends to this stage, in its send order
    std::size_t posted;
  };
  struct Pending {
    ref::Tensor<T> tensor;
    comm::WorkPtr work;
  };

  ref::Shape shape_of(const Key& k) const {
    // A forward message enters vs; a backward message is the gradient of vs's output (= vs+1's
    // input).
    return cb_.activation_shape(k.mb, k.kind == PipeAction::Kind::forward ? k.vs : k.vs + 1);
  }

  void check_shape(const ref::Tensor<T>& t, const PipeAction& a, int vs, const char* what) const {
    const ref::Shape want = cb_.activation_shape(a.microbatch, vs);
    if (t.shape() != want) {
      throw PipelineError("run_pipeline: stage " + std::to_string(stage_) + " " + what +
                          " of microbatch " + std::to_string(a.microbatch) + ", chunk " +
                          std::to_string(a.chunk) + " returned shape " + shape_str(t.shape()) +
                          ", but activation_shape(" + std::to_string(a.microbatch) + ", " +
                          std::to_string(vs) + ") is " + shape_str(want));
    }
  }

  void give(const Key& k, int dest, ref::Tensor<T> t) {
    if (p_ == 1) {
      local_.emplace(k, std::move(t));
      return;
    }
    sends_.push_back({std::move(t), nullptr});
    Pending& s = sends_.back();
    s.work = pp_.send(comm::cview(std::span<const T>(s.tensor.span())), dest);
  }

  ref::Tensor<T> take(const Key& k, int src) {
    if (p_ == 1) {
      auto it = local_.find(k);
      if (it == local_.end()) throw PipelineError("run_pipeline: internal: missing local input");
      ref::Tensor<T> t = std::move(it->second);
      local_.erase(it);
      return t;
    }
    Inbox* in = nullptr;
    for (Inbox& b : inboxes_) {
      if (b.peer == src) in = &b;
    }
    // Post the sender's messages to this stage, in its send order, up to the one needed now.
    while (in != nullptr && !posted_.contains(k) && in->posted < in->order.size()) {
      const Key& next = in->order[in->posted++];
      auto [it, fresh] = posted_.emplace(next, Pending{ref::Tensor<T>(shape_of(next)), nullptr});
      if (!fresh) throw PipelineError("run_pipeline: internal: message received twice");
      // The receive is timed under the action that consumes it (its microbatch and chunk).
      pp_.set_scope({next.kind == PipeAction::Kind::forward ? comm::WorkScope::Pass::forward
                                                            : comm::WorkScope::Pass::backward,
                     next.mb, next.vs / p_});
      it->second.work = pp_.recv(comm::view(it->second.tensor.span()), src);
      pp_.set_scope(scope_);
    }
    auto it = posted_.find(k);
    if (it == posted_.end()) throw PipelineError("run_pipeline: internal: input never sent");
    it->second.work->wait();
    ref::Tensor<T> t = std::move(it->second.tensor);
    posted_.erase(it);
    return t;
  }

  comm::Communicator& pp_;
  const PipeStage<T>& cb_;
  int p_, stage_, v_;
  comm::WorkScope scope_;  // the action being run
  std::vector<PipeAction> actions_;
  std::vector<Inbox> inboxes_;
  std::map<Key, Pending> posted_;        // receives posted, not yet consumed
  std::map<Key, ref::Tensor<T>> local_;  // p == 1: chunk outputs handed on in place
  std::deque<Pending> sends_;            // stable addresses: the send buffers live to the end
};

}  // namespace

template <class T>
void run_pipeline(comm::Communicator& pp, PipeSchedule s, int microbatches, int virtual_stages,
                  const PipeStage<T>& stage) {
  Executor<T>(pp, s, microbatches, virtual_stages, stage).run();
}

template void run_pipeline<double>(comm::Communicator&, PipeSchedule, int, int,
                                   const PipeStage<double>&);
template void run_pipeline<float>(comm::Communicator&, PipeSchedule, int, int,
                                  const PipeStage<float>&);

}  // namespace shardcheck::parallel
