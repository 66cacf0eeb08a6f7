// The recording decorator and the cost view of op_log.hpp.
#include "comm/op_log.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardcheck::comm {

std::string OpLog::describe(const OpRecord& r) const {
  std::ostringstream os;
  os << name_of(r.kind);
  using K = OpRecord::Kind;
  if (r.kind == K::compute) {
    if (!r.name.empty()) os << " " << r.name;
    os << " " << r.flops << " flop " << r.bytes << " B";
    for (const Gemm& g : r.gemms)
      if (g.m > 0) os << " gemm " << g.m << "x" << g.n << "x" << g.k;
  } else if (r.kind == K::wait) {
    os << " on record " << r.op;
  } else if (r.kind == K::begin_step) {
    os << " " << r.step;
  } else {
    if (r.kind != K::barrier && r.kind != K::split)
      os << " " << name_of(r.dtype) << " x " << r.send_count << " -> " << r.recv_count;
    if (info(r.kind).reduces) os << " " << name_of(r.redop);
    if (info(r.kind).rooted) os << " root " << r.root_or_peer;
    if (info(r.kind).point_to_point)
      os << (r.kind == K::send ? " to " : " from ") << r.root_or_peer << " tag " << r.tag;
    if (r.kind == K::all_to_all_v) {
      os << " send counts";
      for (std::size_t c : r.send_counts) os << " " << c;
      os << " recv counts";
      for (std::size_t c : r.recv_counts) os << " " << c;
    }
    if (r.group >= 0 && static_cast<std::size_t>(r.group) < groups.size()) {
      const Group& g = groups[static_cast<std::size_t>(r.group)];
      os << " over " << (g.name.empty() ? "group" : g.name) << " [";
      for (std::size_t i = 0; i < g.members.size(); ++i) os << (i ? " " : "") << g.members[i];
      os << "]";
    }
  }
  return os.str();
}

namespace {

// A Work whose first wait() is appended to the log before it waits.
class RecordedWork final : public Work {
 public:
  RecordedWork(WorkPtr inner, OpLog& log, std::size_t index, std::shared_ptr<int> step)
      : inner_(std::move(inner)), log_(&log), index_(index), step_(std::move(step)) {}
  void wait() override {
    if (!waited_) {
      waited_ = true;
      OpRecord r;
      r.kind = OpRecord::Kind::wait;
      r.op = index_;
      r.step = *step_;
      log_->records.push_back(std::move(r));
    }
    inner_->wait();
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  OpLog* log_;
  std::size_t index_;
  std::shared_ptr<int> step_;
  bool waited_ = false;
};

OpRecord op(OpRecord::Kind k, DType t, std::size_t send, std::size_t recv) {
  OpRecord r;
  r.kind = k;
  r.dtype = t;
  r.send_count = send;
  r.recv_count = recv;
  return r;
}

}  // namespace

RecordingCommunicator::RecordingCommunicator(Communicator& inner, OpLog& log)
    : inner_(&inner), log_(&log), step_(std::make_shared<int>(0)) {
  group_ = static_cast<int>(log_->groups.size());
  log_->groups.push_back({inner.name(), inner.members()});
}

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> owned, OpLog& log,
                                             std::shared_ptr<int> step)
    : owned_(std::move(owned)), inner_(owned_.get()), log_(&log), step_(std::move(step)) {
  group_ = static_cast<int>(log_->groups.size());
  log_->groups.push_back({inner_->name(), inner_->members()});
}

std::size_t RecordingCommunicator::record(OpRecord r) {
  r.group = group_;
  r.step = *step_;
  log_->records.push_back(std::move(r));
  return log_->records.size() - 1;
}

WorkPtr RecordingCommunicator::recorded(WorkPtr w, std::size_t index) {
  return std::make_shared<RecordedWork>(std::move(w), *log_, index, step_);
}

WorkPtr RecordingCommunicator::do_all_reduce(ConstBuffer send, Buffer recv, ReduceOptions o) {
  OpRecord r = op(OpRecord::Kind::all_reduce, send.dtype, send.count, recv.count);
  r.redop = o.op;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->all_reduce(send, recv, o), i);
}

WorkPtr RecordingCommunicator::do_reduce_scatter(ConstBuffer send, Buffer recv, ReduceOptions o) {
  OpRecord r = op(OpRecord::Kind::reduce_scatter, send.dtype, send.count, recv.count);
  r.redop = o.op;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->reduce_scatter(send, recv, o), i);
}

WorkPtr RecordingCommunicator::do_all_gather(ConstBuffer send, Buffer recv) {
  const std::size_t i = record(op(OpRecord::Kind::all_gather, send.dtype, send.count, recv.count));
  return recorded(inner_->all_gather(send, recv), i);
}

WorkPtr RecordingCommunicator::do_broadcast(ConstBuffer send, Buffer recv, BroadcastOptions o) {
  OpRecord r = op(OpRecord::Kind::broadcast, recv.dtype, send.count, recv.count);
  r.root_or_peer = o.root;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->broadcast(send, recv, o), i);
}

WorkPtr RecordingCommunicator::do_reduce(ConstBuffer send, Buffer recv, int root, ReduceOptions o) {
  OpRecord r = op(OpRecord::Kind::reduce, send.dtype, send.count, recv.count);
  r.redop = o.op;
  r.root_or_peer = root;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->reduce(send, recv, root, o), i);
}

WorkPtr RecordingCommunicator::do_all_to_all(ConstBuffer send, Buffer recv) {
  const std::size_t i = record(op(OpRecord::Kind::all_to_all, send.dtype, send.count, recv.count));
  return recorded(inner_->all_to_all(send, recv), i);
}

WorkPtr RecordingCommunicator::do_all_to_all_v(ConstBuffer send,
                                               std::span<const std::size_t> send_counts,
                                               Buffer recv,
                                               std::span<const std::size_t> recv_counts) {
  OpRecord r = op(OpRecord::Kind::all_to_all_v, send.dtype, send.count, recv.count);
  r.send_counts.assign(send_counts.begin(), send_counts.end());
  r.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  const std::size_t i = record(std::move(r));
  return recorded(inner_->all_to_all_v(send, send_counts, recv, recv_counts), i);
}

WorkPtr RecordingCommunicator::do_send(ConstBuffer buf, int peer, P2POptions o) {
  OpRecord r = op(OpRecord::Kind::send, buf.dtype, buf.count, 0);
  r.root_or_peer = peer;
  r.tag = o.tag;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->send(buf, peer, o), i);
}

WorkPtr RecordingCommunicator::do_recv(Buffer buf, int peer, P2POptions o) {
  OpRecord r = op(OpRecord::Kind::recv, buf.dtype, 0, buf.count);
  r.root_or_peer = peer;
  r.tag = o.tag;
  const std::size_t i = record(std::move(r));
  return recorded(inner_->recv(buf, peer, o), i);
}

WorkPtr RecordingCommunicator::do_barrier() {
  const std::size_t i = record(op(OpRecord::Kind::barrier, DType::u8, 0, 0));
  return recorded(inner_->barrier(), i);
}

std::unique_ptr<Communicator> RecordingCommunicator::do_split(int color, int key,
                                                              const SplitOptions& o) {
  OpRecord r = op(OpRecord::Kind::split, DType::u8, 0, 0);
  r.name = o.name;
  record(std::move(r));
  std::unique_ptr<Communicator> child = inner_->split(color, key, o);
  if (!child) return nullptr;
  return std::unique_ptr<Communicator>(new RecordingCommunicator(std::move(child), *log_, step_));
}

void replay(const OpLog& log, std::span<Communicator* const> groups) {
  using K = OpRecord::Kind;
  std::vector<WorkPtr> works(log.records.size());
  const auto null = [](DType t, std::size_t n) { return Buffer{nullptr, n, t, {}}; };
  for (std::size_t i = 0; i < log.records.size(); ++i) {
    const OpRecord& r = log.records[i];
    if (r.kind == K::wait) {
      if (r.op >= i || !works[r.op]) throw std::invalid_argument("replay: a wait on no op");
      works[r.op]->wait();
      continue;
    }
    if (r.kind == K::split || r.kind == K::begin_step)
      throw std::invalid_argument("replay: a log with a split or a step start");
    if (r.group < 0 || static_cast<std::size_t>(r.group) >= groups.size())
      throw std::invalid_argument("replay: record " + std::to_string(i) + " on group " +
                                  std::to_string(r.group) + " of " + std::to_string(groups.size()));
    Communicator& g = *groups[static_cast<std::size_t>(r.group)];
    const Buffer send = null(r.dtype, r.send_count), recv = null(r.dtype, r.recv_count);
    switch (r.kind) {
      case K::all_reduce:
        works[i] = g.all_reduce(send, recv, {.op = r.redop});
        break;
      case K::reduce_scatter:
        works[i] = g.reduce_scatter(send, recv, {.op = r.redop});
        break;
      case K::all_gather:
        works[i] = g.all_gather(send, recv);
        break;
      case K::broadcast:
        works[i] = g.broadcast(send, recv, {.root = r.root_or_peer});
        break;
      case K::reduce:
        works[i] = g.reduce(send, recv, r.root_or_peer, {.op = r.redop});
        break;
      case K::all_to_all:
        works[i] = g.all_to_all(send, recv);
        break;
      case K::all_to_all_v:
        works[i] = g.all_to_all_v(send, r.send_counts, recv, r.recv_counts);
        break;
      case K::send:
        works[i] = g.send(send, r.root_or_peer, {.tag = r.tag});
        break;
      case K::recv:
        works[i] = g.recv(recv, r.root_or_peer, {.tag = r.tag});
        break;
      case K::barrier:
        works[i] = g.barrier();
        break;
      case K::compute:
        g.compute({.name = r.name, .flops = r.flops, .bytes = r.bytes, .gemms = r.gemms});
        break;
      default:
        break;
    }
  }
}

void RecordingCommunicator::do_compute(const ComputeCost& c) {
  OpRecord r;
  r.kind = OpRecord::Kind::compute;
  r.name = std::string(c.name);
  r.flops = c.flops;
  r.bytes = c.bytes;
  r.gemms = c.gemms;
  record(std::move(r));
  inner_->compute(c);
}

void RecordingCommunicator::do_begin_step(int step) {
  *step_ = step;
  OpRecord r;
  r.kind = OpRecord::Kind::begin_step;
  record(std::move(r));
  inner_->begin_step(step);
}

OpLog cost_view(const OpLog& log, int first_step) {
  using K = OpRecord::Kind;
  OpLog out;
  out.groups = log.groups;
  for (OpLog::Group& g : out.groups) g.name.clear();
  std::vector<std::size_t> kept(log.records.size(), SIZE_MAX);  // index in out
  for (std::size_t i = 0; i < log.records.size(); ++i) {
    const OpRecord& r = log.records[i];
    if (r.step < first_step || r.kind == K::split) continue;
    if (r.kind == K::wait) {
      if (r.op >= kept.size() || kept[r.op] == SIZE_MAX) continue;
      OpRecord w = r;
      w.op = kept[r.op];
      out.records.push_back(std::move(w));
      continue;
    }
    if (is_communication(r.kind) &&
        log.groups[static_cast<std::size_t>(r.group)].members.size() < 2)
      continue;
    kept[i] = out.records.size();
    out.records.push_back(r);
  }
  return out;
}

namespace {

bool near(double a, double b, double rel) {
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

bool same(const OpLog& la, const OpRecord& a, const OpLog& lb, const OpRecord& b,
          const CompareOptions& o) {
  using K = OpRecord::Kind;
  const double rel = o.rel_tol;
  if (a.kind != b.kind) return false;
  if (a.kind == K::compute) {
    if (a.name != b.name || !near(a.bytes, b.bytes, rel)) return false;
    const auto listed = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), a.name) != names.end();
    };
    if (listed(o.unchecked_flops)) return true;
    if (listed(o.upper_bounds)) return b.flops >= a.flops * (1 - rel);
    for (std::size_t i = 0; i < a.gemms.size(); ++i) {
      const Gemm &x = a.gemms[i], &y = b.gemms[i];
      if (!near(x.m, y.m, rel) || !near(x.n, y.n, rel) || !near(x.k, y.k, rel)) return false;
    }
    return near(a.flops, b.flops, rel);
  }
  if (a.kind == K::wait) return a.op == b.op;
  if (a.kind == K::begin_step) return a.step == b.step;
  const auto members = [](const OpLog& l, const OpRecord& r) -> const std::vector<int>& {
    return l.groups[static_cast<std::size_t>(r.group)].members;
  };
  if (a.kind == K::all_to_all_v && o.routed_splits)
    return members(la, a) == members(lb, b) && a.dtype == b.dtype &&
           a.send_counts.size() == b.send_counts.size() &&
           a.recv_counts.size() == b.recv_counts.size();
  return members(la, a) == members(lb, b) && a.dtype == b.dtype && a.send_count == b.send_count &&
         a.recv_count == b.recv_count && a.redop == b.redop && a.root_or_peer == b.root_or_peer &&
         a.tag == b.tag && a.send_counts == b.send_counts && a.recv_counts == b.recv_counts;
}

void context(std::ostringstream& os, const char* side, const OpLog& l, std::size_t at) {
  os << side << ":\n";
  const std::size_t from = at >= 3 ? at - 3 : 0;
  for (std::size_t i = from; i < std::min(l.records.size(), at + 3); ++i)
    os << (i == at ? "  > " : "    ") << i << " " << l.describe(l.records[i]) << "\n";
  if (at >= l.records.size()) os << "  > " << at << " (end of log)\n";
}

}  // namespace

double flops_named(const OpLog& log, const std::string& name) {
  double sum = 0;
  for (const OpRecord& r : log.records)
    if (r.kind == OpRecord::Kind::compute && r.name == name) sum += r.flops;
  return sum;
}

std::string first_difference(const OpLog& a, const OpLog& b, const CompareOptions& o) {
  const std::size_t n = std::max(a.records.size(), b.records.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i < a.records.size() && i < b.records.size() && same(a, a.records[i], b, b.records[i], o))
      continue;
    std::ostringstream os;
    os << "record " << i << " differs (" << a.records.size() << " and " << b.records.size()
       << " records)\n";
    context(os, "first", a, i);
    context(os, "second", b, i);
    return os.str();
  }
  return "";
}

}  // namespace shardcheck::comm
