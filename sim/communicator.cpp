// The simulator's collectives and point-to-point operations. Argument checks happen before the
// rendezvous (a bad call is this rank's InvalidArgument); disagreement between members is found at
// arrival (MismatchError for every member); data moves outside the world lock.
#include "sim/communicator.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "sim/kernels.hpp"

namespace shardcheck::sim {

namespace {

std::byte* at(const comm::Buffer& b, std::size_t elems) {
  return static_cast<std::byte*>(b.data) + elems * comm::size_of(b.dtype);
}
const std::byte* at(const comm::ConstBuffer& b, std::size_t elems) {
  return static_cast<const std::byte*>(b.data) + elems * comm::size_of(b.dtype);
}

// Keeps a private copy of `send` when it overlaps `recv`, for ops whose in-place form would
// otherwise let a peer read what this rank already overwrote (all_to_all).
struct Staging {
  std::vector<std::byte> bytes;
  comm::ConstBuffer stage(comm::ConstBuffer send, const comm::Buffer& recv) {
    const auto* s = static_cast<const std::byte*>(send.data);
    const auto* r = static_cast<const std::byte*>(recv.data);
    if (send.bytes() == 0 || s + send.bytes() <= r || r + recv.bytes() <= s) return send;
    bytes.assign(s, s + send.bytes());
    return {bytes.data(), send.count, send.dtype, send.device};
  }
};

class P2PWork final : public comm::Work {
 public:
  P2PWork(std::shared_ptr<WorldState> w, std::shared_ptr<P2POp> op)
      : world_(std::move(w)), op_(std::move(op)) {}
  void wait() override {
    std::unique_lock lk(world_->mu);
    const int peer = op_->peer_world;
    WorldState::WaitInfo info{op_->ctx.group, op_->ctx.op, op_->ctx.seq,
                              [peer] { return std::vector<int>{peer}; }};
    try {
      world_->block(lk, op_->world_rank, info, [this] { return op_->done || op_->error; });
    } catch (...) {
      world_->mark(op_->world_rank, op_->record, OpState::failed);
      throw;
    }
    if (op_->error) std::rethrow_exception(op_->error);
  }
  bool is_completed() override {
    std::lock_guard lk(world_->mu);
    return op_->done || op_->error;
  }

 private:
  std::shared_ptr<WorldState> world_;
  std::shared_ptr<P2POp> op_;
};

}  // namespace

SimCommunicator::SimCommunicator(std::shared_ptr<WorldState> world, std::shared_ptr<SimGroup> group,
                                 int rank)
    : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

comm::OpContext SimCommunicator::context(OpKind k) const {
  return {world_rank(), group_->name, std::string(name_of(k)), seq_};
}

comm::OpContext SimCommunicator::p2p_context(OpKind k, int peer, int tag) const {
  auto it = p2p_seq_.find({peer, tag, k == OpKind::send});
  const std::uint64_t seq = it == p2p_seq_.end() ? 0 : it->second;
  std::string op = std::string(name_of(k)) + (k == OpKind::send ? " to " : " from ") + "rank " +
                   std::to_string(group_->members[static_cast<std::size_t>(peer)]) + " tag " +
                   std::to_string(tag);
  return {world_rank(), group_->name, op, seq};
}

void SimCommunicator::invalid(OpKind k, const std::string& what) const {
  throw comm::InvalidArgument(context(k), what);
}

void SimCommunicator::check_buffer(OpKind k, const comm::ConstBuffer& b, const char* which) const {
  if (b.device.kind != comm::DeviceKind::host)
    invalid(k, std::string(which) + " buffer is on a device; the sim backend needs host buffers");
  if (b.count > 0 && b.data == nullptr)
    invalid(k,
            std::string(which) + " buffer is null with " + std::to_string(b.count) + " elements");
}

std::shared_ptr<Slot> SimCommunicator::collective(const OpDesc& desc, const Register& reg,
                                                  const Data& data, const Complete& complete) {
  std::unique_lock lk(world_->mu);
  const comm::OpContext ctx = context(desc.kind);
  world_->check_usable(ctx);
  auto& entry = group_->slots[seq_];
  if (!entry) entry = std::make_shared<Slot>(seq_, size(), desc, rank_);
  std::shared_ptr<Slot> slot = entry;
  ++seq_;
  const int me = world_rank();
  FlightRecord record{0,
                      group_->name,
                      std::string(name_of(desc.kind)),
                      slot->seq,
                      desc.dtype,
                      desc.count,
                      desc.kind == OpKind::broadcast ? desc.root : -1,
                      OpState::issued,
                      world_->now(),
                      0,
                      0};
  const std::uint64_t rec = world_->recorder(me).push(std::move(record));
  if (slot->error) {
    world_->mark(me, rec, OpState::failed);
    std::rethrow_exception(slot->error);
  }
  if (!(slot->desc == desc)) {
    world_->mark(me, rec, OpState::failed);
    const int other = group_->members[static_cast<std::size_t>(slot->first_rank)];
    std::ostringstream os;
    os << "collective mismatch in group " << group_->name << " at seq " << slot->seq << ": rank "
       << other << " called " << slot->desc.describe() << " but rank " << world_rank() << " called "
       << desc.describe();
    comm::MismatchError e(ctx, os.str(), {other, world_rank()});
    slot->error = std::make_exception_ptr(e);
    world_->wake_all(group_->members);
    throw e;
  }
  reg(*slot);
  slot->arrived_mask[static_cast<std::size_t>(rank_)] = true;
  if (++slot->arrived == slot->size) {
    if (complete) {
      try {
        complete(*slot);
      } catch (...) {
        slot->error = std::current_exception();
      }
    }
    world_->wake_all(group_->members);
  }
  auto group = group_;
  WorldState::WaitInfo info{group_->name, std::string(name_of(desc.kind)), slot->seq,
                            [slot, group] {
                              std::vector<int> missing;
                              for (std::size_t r = 0; r < slot->arrived_mask.size(); ++r)
                                if (!slot->arrived_mask[r]) missing.push_back(group->members[r]);
                              return missing;
                            }};
  try {
    world_->block(lk, me, info,
                  [&] { return slot->arrived == slot->size || slot->error != nullptr; });
  } catch (...) {
    world_->mark(me, rec, OpState::failed);
    throw;
  }
  if (slot->error) {
    world_->mark(me, rec, OpState::failed);
    std::rethrow_exception(slot->error);
  }
  world_->mark(me, rec, OpState::started);
  lk.unlock();

  std::exception_ptr data_error;
  try {
    if (data) data(*slot);
  } catch (...) {
    data_error = std::current_exception();
  }

  lk.lock();
  if (++slot->departed == slot->size) {
    group_->slots.erase(slot->seq);
    world_->wake_all(group_->members);
  } else {
    info.op += " (leaving)";
    world_->block(
        lk, me, info, [&] { return slot->departed == slot->size; }, true);
  }
  world_->mark(me, rec, data_error ? OpState::failed : OpState::completed);
  if (data_error) std::rethrow_exception(data_error);
  return slot;
}

comm::WorkPtr SimCommunicator::do_all_reduce(comm::ConstBuffer send, comm::Buffer recv,
                                             comm::ReduceOptions o) {
  check_buffer(OpKind::all_reduce, send, "send");
  check_buffer(OpKind::all_reduce, recv, "recv");
  if (send.count != recv.count || send.dtype != recv.dtype)
    invalid(OpKind::all_reduce, "send and recv must have the same count and dtype");
  const OpDesc desc{OpKind::all_reduce, recv.dtype, recv.count, o.op, 0};
  collective(
      desc,
      [&](Slot& s) {
        s.send[static_cast<std::size_t>(rank_)] = send;
        s.recv[static_cast<std::size_t>(rank_)] = recv;
      },
      [&](const Slot& s) {
        const Range c = chunk(desc.count, s.size, rank_);
        std::vector<const void*> srcs;
        std::vector<void*> dsts;
        for (int r = 0; r < s.size; ++r) {
          srcs.push_back(at(s.send[static_cast<std::size_t>(r)], c.begin));
          dsts.push_back(at(s.recv[static_cast<std::size_t>(r)], c.begin));
        }
        reduce_into(desc.dtype, o.op, srcs, dsts, c.size(), rank_);
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_reduce_scatter(comm::ConstBuffer send, comm::Buffer recv,
                                                 comm::ReduceOptions o) {
  check_buffer(OpKind::reduce_scatter, send, "send");
  check_buffer(OpKind::reduce_scatter, recv, "recv");
  if (send.dtype != recv.dtype || send.count != recv.count * static_cast<std::size_t>(size()))
    invalid(OpKind::reduce_scatter, "send must hold group size (" + std::to_string(size()) +
                                        ") x recv count elements of the same dtype; got send " +
                                        std::to_string(send.count) + ", recv " +
                                        std::to_string(recv.count));
  const OpDesc desc{OpKind::reduce_scatter, recv.dtype, recv.count, o.op, 0};
  collective(
      desc,
      [&](Slot& s) {
        s.send[static_cast<std::size_t>(rank_)] = send;
        s.recv[static_cast<std::size_t>(rank_)] = recv;
      },
      [&](const Slot& s) {
        const std::size_t off = desc.count * static_cast<std::size_t>(rank_);
        std::vector<const void*> srcs;
        for (int r = 0; r < s.size; ++r)
          srcs.push_back(at(s.send[static_cast<std::size_t>(r)], off));
        void* dst = recv.data;
        reduce_into(desc.dtype, o.op, srcs, std::span<void* const>(&dst, 1), desc.count, rank_);
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_all_gather(comm::ConstBuffer send, comm::Buffer recv) {
  check_buffer(OpKind::all_gather, send, "send");
  check_buffer(OpKind::all_gather, recv, "recv");
  if (send.dtype != recv.dtype || recv.count != send.count * static_cast<std::size_t>(size()))
    invalid(OpKind::all_gather, "recv must hold group size (" + std::to_string(size()) +
                                    ") x send count elements of the same dtype; got send " +
                                    std::to_string(send.count) + ", recv " +
                                    std::to_string(recv.count));
  const OpDesc desc{OpKind::all_gather, send.dtype, send.count, comm::ReduceOp::sum, 0};
  collective(
      desc, [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = send; },
      [&](const Slot& s) {
        const std::size_t bytes = send.bytes();
        const bool stream = recv.bytes() >= kStreamBytes;
        for (int r = 0; r < s.size; ++r) {
          const void* src = s.send[static_cast<std::size_t>(r)].data;
          copy_bytes(at(recv, desc.count * static_cast<std::size_t>(r)), src, bytes, stream);
        }
        if (stream) copy_fence();
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_broadcast(comm::ConstBuffer send, comm::Buffer recv,
                                            comm::BroadcastOptions o) {
  check_buffer(OpKind::broadcast, recv, "recv");
  if (o.root < 0 || o.root >= size())
    invalid(OpKind::broadcast, "root " + std::to_string(o.root) + " is outside the group of " +
                                   std::to_string(size()));
  if (rank_ == o.root) {
    check_buffer(OpKind::broadcast, send, "send");
    if (send.count != recv.count || send.dtype != recv.dtype)
      invalid(OpKind::broadcast, "send and recv must have the same count and dtype on the root");
  }
  const OpDesc desc{OpKind::broadcast, recv.dtype, recv.count, comm::ReduceOp::sum, o.root};
  collective(
      desc, [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = send; },
      [&](const Slot& s) {
        const void* src = s.send[static_cast<std::size_t>(o.root)].data;
        copy_bytes(recv.data, src, recv.bytes(), recv.bytes() >= kStreamBytes);
        copy_fence();
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_all_to_all(comm::ConstBuffer send, comm::Buffer recv) {
  check_buffer(OpKind::all_to_all, send, "send");
  check_buffer(OpKind::all_to_all, recv, "recv");
  const auto n = static_cast<std::size_t>(size());
  if (send.count != recv.count || send.dtype != recv.dtype || send.count % n != 0)
    invalid(OpKind::all_to_all,
            "send and recv must have the same dtype and count, divisible by the "
            "group size " +
                std::to_string(n) + "; got send " + std::to_string(send.count) + ", recv " +
                std::to_string(recv.count));
  Staging staging;
  const comm::ConstBuffer src_buf = staging.stage(send, recv);
  const OpDesc desc{OpKind::all_to_all, send.dtype, send.count, comm::ReduceOp::sum, 0};
  const std::size_t c = send.count / n;
  collective(
      desc, [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = src_buf; },
      [&](const Slot& s) {
        const std::size_t bytes = c * comm::size_of(desc.dtype);
        const bool stream = recv.bytes() >= kStreamBytes;
        for (std::size_t j = 0; j < n; ++j)
          copy_bytes(at(recv, j * c), at(s.send[j], static_cast<std::size_t>(rank_) * c), bytes,
                     stream);
        if (stream) copy_fence();
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_all_to_all_v(comm::ConstBuffer send,
                                               std::span<const std::size_t> send_counts,
                                               comm::Buffer recv,
                                               std::span<const std::size_t> recv_counts) {
  check_buffer(OpKind::all_to_all_v, send, "send");
  check_buffer(OpKind::all_to_all_v, recv, "recv");
  const auto n = static_cast<std::size_t>(size());
  if (send_counts.size() != n || recv_counts.size() != n)
    invalid(OpKind::all_to_all_v,
            "send_counts and recv_counts need one entry per rank (" + std::to_string(n) + ")");
  if (send.dtype != recv.dtype) invalid(OpKind::all_to_all_v, "send and recv dtypes differ");
  const std::size_t send_total =
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t recv_total =
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  if (send_total > send.count || recv_total > recv.count)
    invalid(OpKind::all_to_all_v,
            "split sizes sum to " + std::to_string(send_total) + " sent / " +
                std::to_string(recv_total) + " received, more than the buffers (" +
                std::to_string(send.count) + " / " + std::to_string(recv.count) + ")");
  Staging staging;
  const comm::ConstBuffer src_buf = staging.stage(send, recv);
  const OpDesc desc{OpKind::all_to_all_v, send.dtype, 0, comm::ReduceOp::sum, 0};
  const auto ctx = context(OpKind::all_to_all_v);
  collective(
      desc,
      [&](Slot& s) {
        const auto r = static_cast<std::size_t>(rank_);
        s.send[r] = src_buf;
        s.send_counts[r].assign(send_counts.begin(), send_counts.end());
        s.recv_counts[r].assign(recv_counts.begin(), recv_counts.end());
      },
      [&](const Slot& s) {
        const auto me = static_cast<std::size_t>(rank_);
        std::size_t recv_off = 0;
        for (std::size_t j = 0; j < n; ++j) {
          const auto& sc = s.send_counts[j];
          const std::size_t send_off =
              std::accumulate(sc.begin(), sc.begin() + static_cast<long>(me), std::size_t{0});
          const std::size_t cnt = s.recv_counts[me][j];
          if (cnt > 0)
            std::memcpy(at(recv, recv_off), at(s.send[j], send_off),
                        cnt * comm::size_of(desc.dtype));
          recv_off += cnt;
        }
      },
      [&](Slot& s) {
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t j = 0; j < n; ++j)
            if (s.recv_counts[i][j] != s.send_counts[j][i]) {
              const int ri = group_->members[i], rj = group_->members[j];
              throw comm::MismatchError(ctx,
                                        "all_to_all_v split sizes disagree in group " +
                                            group_->name + ": rank " + std::to_string(ri) +
                                            " expects " + std::to_string(s.recv_counts[i][j]) +
                                            " elements from rank " + std::to_string(rj) +
                                            ", which sends " + std::to_string(s.send_counts[j][i]),
                                        {ri, rj});
            }
      });
  return std::make_shared<comm::CompletedWork>();
}

comm::WorkPtr SimCommunicator::do_barrier() {
  collective(OpDesc{OpKind::barrier, comm::DType::u8, 0, comm::ReduceOp::sum, 0}, [](Slot&) {}, {});
  return std::make_shared<comm::CompletedWork>();
}

std::unique_ptr<comm::Communicator> SimCommunicator::do_split(int color, int key,
                                                              const comm::SplitOptions& o) {
  auto slot = collective(
      OpDesc{OpKind::split, comm::DType::i32, 0, comm::ReduceOp::sum, 0},
      [&](Slot& s) {
        const auto r = static_cast<std::size_t>(rank_);
        s.colors[r] = color;
        s.keys[r] = key;
        s.names[r] = o.name.empty() ? "split" : o.name;
      },
      {},
      [this](Slot& s) {
        std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, group rank)
        for (int r = 0; r < s.size; ++r)
          if (s.colors[static_cast<std::size_t>(r)] >= 0)
            by_color[s.colors[static_cast<std::size_t>(r)]].push_back(
                {s.keys[static_cast<std::size_t>(r)], r});
        for (auto& [c, v] : by_color) {
          std::sort(v.begin(), v.end());
          auto g = std::make_shared<SimGroup>();
          for (auto [k, r] : v) g->members.push_back(group_->members[static_cast<std::size_t>(r)]);
          g->name =
              s.names[static_cast<std::size_t>(v.front().second)] + comm::rank_list(g->members);
          for (auto [k, r] : v) s.split_result[static_cast<std::size_t>(r)] = g;
        }
      });
  auto g = slot->split_result[static_cast<std::size_t>(rank_)];
  if (!g) return nullptr;
  const auto it = std::find(g->members.begin(), g->members.end(), world_rank());
  return std::make_unique<SimCommunicator>(world_, g, static_cast<int>(it - g->members.begin()));
}

comm::WorkPtr SimCommunicator::post_p2p(std::shared_ptr<P2POp> op, int peer, int tag) {
  const comm::DType dt = op->is_send ? op->send.dtype : op->recv.dtype;
  const std::size_t count = op->is_send ? op->send.count : op->recv.count;
  op->record = world_->recorder(op->world_rank)
                   .push({0, group_->name, op->ctx.op, op->ctx.seq, dt, count, -1, OpState::issued,
                          world_->now(), 0, 0});
  const int src = op->is_send ? rank_ : peer;
  const int dst = op->is_send ? peer : rank_;
  Channel& ch = group_->channels[{src, dst, tag}];
  auto& mine = op->is_send ? ch.sends : ch.recvs;
  auto& theirs = op->is_send ? ch.recvs : ch.sends;
  if (theirs.empty()) {
    mine.push_back(op);
  } else {
    std::shared_ptr<P2POp> other = theirs.front();
    theirs.pop_front();
    P2POp& s = op->is_send ? *op : *other;
    P2POp& r = op->is_send ? *other : *op;
    if (s.send.count != r.recv.count || s.send.dtype != r.recv.dtype) {
      const std::string what =
          "send/recv mismatch in group " + group_->name + ": rank " + std::to_string(s.world_rank) +
          " sends " + std::to_string(s.send.count) + " " +
          std::string(comm::name_of(s.send.dtype)) + ", rank " + std::to_string(r.world_rank) +
          " receives " + std::to_string(r.recv.count) + " " +
          std::string(comm::name_of(r.recv.dtype));
      s.error =
          std::make_exception_ptr(comm::MismatchError(s.ctx, what, {s.world_rank, r.world_rank}));
      r.error =
          std::make_exception_ptr(comm::MismatchError(r.ctx, what, {s.world_rank, r.world_rank}));
    } else {
      if (s.send.bytes() > 0) std::memcpy(r.recv.data, s.send.data, s.send.bytes());
      s.done = r.done = true;
    }
    const OpState st = s.done ? OpState::completed : OpState::failed;
    world_->mark(s.world_rank, s.record, st);
    world_->mark(r.world_rank, r.record, st);
    world_->wake(other->world_rank);
  }
  return std::make_shared<P2PWork>(world_, std::move(op));
}

comm::WorkPtr SimCommunicator::do_send(comm::ConstBuffer buf, int peer, comm::P2POptions o) {
  check_buffer(OpKind::send, buf, "send");
  if (peer < 0 || peer >= size())
    invalid(OpKind::send,
            "peer " + std::to_string(peer) + " is outside the group of " + std::to_string(size()));
  std::lock_guard lk(world_->mu);
  auto op = std::make_shared<P2POp>();
  op->is_send = true;
  op->send = buf;
  op->world_rank = world_rank();
  op->peer_world = group_->members[static_cast<std::size_t>(peer)];
  op->ctx = p2p_context(OpKind::send, peer, o.tag);
  world_->check_usable(op->ctx);
  ++p2p_seq_[{peer, o.tag, true}];
  return post_p2p(std::move(op), peer, o.tag);
}

comm::WorkPtr SimCommunicator::do_recv(comm::Buffer buf, int peer, comm::P2POptions o) {
  check_buffer(OpKind::recv, buf, "recv");
  if (peer < 0 || peer >= size())
    invalid(OpKind::recv,
            "peer " + std::to_string(peer) + " is outside the group of " + std::to_string(size()));
  std::lock_guard lk(world_->mu);
  auto op = std::make_shared<P2POp>();
  op->recv = buf;
  op->world_rank = world_rank();
  op->peer_world = group_->members[static_cast<std::size_t>(peer)];
  op->ctx = p2p_context(OpKind::recv, peer, o.tag);
  world_->check_usable(op->ctx);
  ++p2p_seq_[{peer, o.tag, false}];
  return post_p2p(std::move(op), peer, o.tag);
}

// Virtual time and step-keyed faults are not modelled yet: compute and step markers are accepted
// and ignored.
void SimCommunicator::do_compute(const comm::ComputeCost& /*c*/) {}
void SimCommunicator::do_begin_step(int /*step*/) {}

comm::MemoryTracker& SimCommunicator::do_memory() { return world_->memory(world_rank()); }

}  // namespace shardcheck::sim
