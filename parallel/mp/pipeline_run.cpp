// run_pipeline: one stage's schedule over the pp group. Every stage derives the message order of
// its neighbours from their schedules, so receives are posted in each sender's send order (the
// order NCCL matches p2p messages in) and only when their data is needed: a receive posted at the
// moment its data is needed costs no virtual time on the simulator, and a send is never waited
// on before the end, so a stage never stalls on a neighbour that has not reached the receive yet.
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "parallel/mp/pipeline.hpp"

namespace shardcheck::parallel {

namespace {

struct Outgoing {
  PipeMessage key;
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

}  // namespace

std::vector<PipeEvent> pipeline_events(PipeSchedule s, int p, int stage, int m, int v) {
  using K = PipeEvent::Kind;
  const std::vector<PipeAction> actions = pipeline_schedule(s, p, stage, m, v);
  struct Inbox {
    int peer;
    std::vector<PipeMessage> order;  // the peer's sends to this stage, in its send order
    std::size_t posted = 0;
  };
  std::vector<Inbox> inboxes;
  if (p > 1)
    for (const int peer : {(stage + p - 1) % p, (stage + 1) % p}) {
      if (!inboxes.empty() && inboxes.front().peer == peer) continue;  // p == 2: one neighbour
      Inbox in{peer, {}, 0};
      for (const Outgoing& o : outgoing(s, p, peer, m, v))
        if (o.dest == stage) in.order.push_back(o.key);
      inboxes.push_back(std::move(in));
    }
  std::set<PipeMessage> posted;
  std::vector<PipeEvent> out;
  // The input of `a`: with one stage handed on in place; else the sender's messages to this
  // stage posted in its send order up to the one needed, then waited for.
  const auto take = [&](const PipeAction& a, const PipeMessage& k, int src) {
    if (p > 1) {
      Inbox* in = nullptr;
      for (Inbox& b : inboxes)
        if (b.peer == src) in = &b;
      while (in != nullptr && !posted.contains(k) && in->posted < in->order.size()) {
        const PipeMessage& next = in->order[in->posted++];
        if (!posted.insert(next).second)
          throw PipelineError("run_pipeline: internal: message received twice");
        out.push_back({K::post_recv, a, next, src});
      }
      if (posted.erase(k) == 0) throw PipelineError("run_pipeline: internal: input never sent");
    }
    out.push_back({K::wait_recv, a, k, p > 1 ? src : stage});
  };
  const int depth = p * v;
  for (const PipeAction& a : actions) {
    const int vs = a.chunk * p + stage;
    if (a.kind == PipeAction::Kind::forward) {
      if (vs > 0) take(a, {a.kind, a.microbatch, vs}, (stage + p - 1) % p);
      out.push_back({K::run, a, {}, -1});
      if (vs + 1 < depth)
        out.push_back({K::send, a, {a.kind, a.microbatch, vs + 1}, (stage + 1) % p});
    } else {
      if (vs + 1 < depth) take(a, {a.kind, a.microbatch, vs}, (stage + 1) % p);
      out.push_back({K::run, a, {}, -1});
      if (vs > 0) out.push_back({K::send, a, {a.kind, a.microbatch, vs - 1}, (stage + p - 1) % p});
    }
  }
  return out;
}

namespace {

// What the executor moves: a stage's callbacks and its messages' payloads. The numeric run's
// are tensors; the timing-only run's carry no data (a null buffer of the message's shape).
template <class T>
struct TensorPayload {
  using P = ref::Tensor<T>;
  const PipeStage<T>& cb;
  P forward(int mb, int chunk, P in) const { return cb.forward(mb, chunk, std::move(in)); }
  P backward(int mb, int chunk, P in) const { return cb.backward(mb, chunk, std::move(in)); }
  ref::Shape shape(int mb, int vs) const { return cb.activation_shape(mb, vs); }
  static P receive(const ref::Shape& s) { return P(s); }
  static comm::Buffer recv_view(P& t) { return comm::view(t.span()); }
  static comm::ConstBuffer send_view(const P& t) {
    return comm::cview(std::span<const T>(t.span()));
  }
  static const ref::Shape* returned_shape(const P& t) { return &t.shape(); }
};
struct NullPayload {
  struct P {
    std::size_t count = 0;
  };
  const NullPipeStage& cb;
  P forward(int mb, int chunk, P /*in*/) const {
    cb.forward(mb, chunk);
    return {};
  }
  P backward(int mb, int chunk, P /*in*/) const {
    cb.backward(mb, chunk);
    return {};
  }
  ref::Shape shape(int mb, int vs) const { return cb.activation_shape(mb, vs); }
  P receive(const ref::Shape& s) const { return {static_cast<std::size_t>(ref::numel_of(s))}; }
  comm::Buffer recv_view(const P& t) const { return {nullptr, t.count, cb.dtype, {}}; }
  comm::ConstBuffer send_view(const P& t) const { return {nullptr, t.count, cb.dtype, {}}; }
  static const ref::Shape* returned_shape(const P& /*t*/) { return nullptr; }  // nothing returned
};

// Executes a stage's pipeline_events with the payload's callbacks and messages.
template <class Payload>
class Executor {
 public:
  using P = typename Payload::P;
  Executor(comm::Communicator& pp, const std::vector<PipeEvent>& events, Payload payload)
      : pp_(pp), events_(events), pl_(std::move(payload)), p_(pp.size()), stage_(pp.rank()) {}

  void run() {
    using K = PipeEvent::Kind;
    P in{}, out{};
    for (const PipeEvent& e : events_) {
      const PipeAction& a = e.action;
      const comm::WorkScope scope = scope_of(a.kind, a.microbatch, a.chunk);
      if (e.kind != K::send) pp_.set_scope(scope);  // the action being served
      switch (e.kind) {
        case K::post_recv:
          post(e.message, e.peer, scope);
          break;
        case K::wait_recv:
          in = take(e.message);
          break;
        case K::run:
          out = a.kind == PipeAction::Kind::forward
                    ? pl_.forward(a.microbatch, a.chunk, std::move(in))
                    : pl_.backward(a.microbatch, a.chunk, std::move(in));
          in = P{};
          break;
        case K::send:
          check_shape(out, a,
                      e.message.kind == PipeAction::Kind::forward ? e.message.vs : e.message.vs + 1,
                      a.kind == PipeAction::Kind::forward ? "forward" : "backward");
          give(e.message, e.peer, std::move(out));
          out = P{};
          break;
      }
    }
    pp_.set_scope({});
    for (auto& [payload, work] : sends_) work->wait();
  }

 private:
  struct Pending {
    P payload;
    comm::WorkPtr work;
  };

  static comm::WorkScope scope_of(PipeAction::Kind k, int mb, int chunk) {
    return {k == PipeAction::Kind::forward ? comm::WorkScope::Pass::forward
                                           : comm::WorkScope::Pass::backward,
            mb, chunk};
  }

  ref::Shape shape_of(const PipeMessage& k) const {
    // A forward message enters vs; a backward message is the gradient of vs's output (= vs+1's
    // input).
    return pl_.shape(k.microbatch, k.kind == PipeAction::Kind::forward ? k.vs : k.vs + 1);
  }

  void check_shape(const P& t, const PipeAction& a, int vs, const char* what) const {
    const ref::Shape* got = Payload::returned_shape(t);
    if (got == nullptr) return;
    const ref::Shape want = pl_.shape(a.microbatch, vs);
    if (*got != want) {
      throw PipelineError("run_pipeline: stage " + std::to_string(stage_) + " " + what +
                          " of microbatch " + std::to_string(a.microbatch) + ", chunk " +
                          std::to_string(a.chunk) + " returned shape " + shape_str(*got) +
                          ", but activation_shape(" + std::to_string(a.microbatch) + ", " +
                          std::to_string(vs) + ") is " + shape_str(want));
    }
  }

  void give(const PipeMessage& k, int dest, P t) {
    if (p_ == 1) {
      local_.emplace(k, std::move(t));
      return;
    }
    if (Payload::returned_shape(t) == nullptr) t = pl_.receive(shape_of(k));  // no data: its size
    sends_.push_back({std::move(t), nullptr});
    Pending& s = sends_.back();
    s.work = pp_.send(pl_.send_view(s.payload), dest);
  }

  // The receive is timed under the action that consumes it (its microbatch and chunk).
  void post(const PipeMessage& k, int src, const comm::WorkScope& now) {
    auto [it, fresh] = posted_.emplace(k, Pending{pl_.receive(shape_of(k)), nullptr});
    if (!fresh) throw PipelineError("run_pipeline: internal: message received twice");
    pp_.set_scope(scope_of(k.kind, k.microbatch, k.vs / p_));
    it->second.work = pp_.recv(pl_.recv_view(it->second.payload), src);
    pp_.set_scope(now);
  }

  P take(const PipeMessage& k) {
    if (p_ == 1) {
      auto it = local_.find(k);
      if (it == local_.end()) throw PipelineError("run_pipeline: internal: missing local input");
      P t = std::move(it->second);
      local_.erase(it);
      return t;
    }
    auto it = posted_.find(k);
    if (it == posted_.end()) throw PipelineError("run_pipeline: internal: input never sent");
    it->second.work->wait();
    P t = std::move(it->second.payload);
    posted_.erase(it);
    return t;
  }

  comm::Communicator& pp_;
  const std::vector<PipeEvent>& events_;
  Payload pl_;
  int p_, stage_;
  std::map<PipeMessage, Pending> posted_;  // receives posted, not yet consumed
  std::map<PipeMessage, P> local_;         // p == 1: chunk outputs handed on in place
  std::deque<Pending> sends_;              // stable addresses: the send buffers live to the end
};

}  // namespace

template <class T>
void run_pipeline(comm::Communicator& pp, PipeSchedule s, int microbatches, int virtual_stages,
                  const PipeStage<T>& stage) {
  if (!stage.forward || !stage.backward || !stage.activation_shape)
    throw PipelineError("run_pipeline: PipeStage needs forward, backward and activation_shape");
  const std::vector<PipeEvent> events =
      pipeline_events(s, pp.size(), pp.rank(), microbatches, virtual_stages);
  Executor<TensorPayload<T>>(pp, events, TensorPayload<T>{stage}).run();
}

void run_pipeline(comm::Communicator& pp, const std::vector<PipeEvent>& events,
                  const NullPipeStage& stage) {
  if (!stage.forward || !stage.backward || !stage.activation_shape)
    throw PipelineError("run_pipeline: NullPipeStage needs forward, backward and activation_shape");
  Executor<NullPayload>(pp, events, NullPayload{stage}).run();
}

template void run_pipeline<double>(comm::Communicator&, PipeSchedule, int, int,
                                   const PipeStage<double>&);
template void run_pipeline<float>(comm::Communicator&, PipeSchedule, int, int,
                                  const PipeStage<float>&);

}  // namespace shardcheck::parallel
