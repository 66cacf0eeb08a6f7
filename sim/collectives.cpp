// The simulator's collectives: argument checks (a bad call is this rank's InvalidArgument), then
// the rendezvous of SimCommunicator::collective with each op's registration and data movement.
// Data moves outside the world lock; in timing-only (meta) mode it does not move at all.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "sim/communicator.hpp"
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
// otherwise let a peer read what this rank already overwrote (all_to_all). Not in meta mode.
struct Staging {
  std::vector<std::byte> bytes;
  comm::ConstBuffer stage(comm::ConstBuffer send, const comm::Buffer& recv, bool meta) {
    const auto* s = static_cast<const std::byte*>(send.data);
    const auto* r = static_cast<const std::byte*>(recv.data);
    if (meta || send.bytes() == 0 || s + send.bytes() <= r || r + recv.bytes() <= s) return send;
    bytes.assign(s, s + send.bytes());
    return {bytes.data(), send.count, send.dtype, send.device};
  }
};

}  // namespace

comm::WorkPtr SimCommunicator::do_all_reduce(comm::ConstBuffer send, comm::Buffer recv,
                                             comm::ReduceOptions o) {
  check_buffer(OpKind::all_reduce, send, "send");
  check_buffer(OpKind::all_reduce, recv, "recv");
  if (send.count != recv.count || send.dtype != recv.dtype)
    invalid(OpKind::all_reduce, "send and recv must have the same count and dtype");
  const OpDesc desc{OpKind::all_reduce, recv.dtype, recv.count, o.op, 0};
  auto slot = collective(
      desc, send,
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
        reduce_into(desc.dtype, o.op, srcs, dsts, c.size(), rank_, world_->options().planted);
      });
  return work(slot);
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
  auto slot = collective(
      desc, send,
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
        reduce_into(desc.dtype, o.op, srcs, std::span<void* const>(&dst, 1), desc.count, rank_,
                    world_->options().planted);
      });
  return work(slot);
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
  auto slot = collective(
      desc, send, [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = send; },
      [&](const Slot& s) {
        const std::size_t bytes = send.bytes();
        const bool stream = recv.bytes() >= kStreamBytes;
        for (int r = 0; r < s.size; ++r) {
          const void* src = s.send[static_cast<std::size_t>(r)].data;
          copy_bytes(at(recv, desc.count * static_cast<std::size_t>(r)), src, bytes, stream);
        }
        if (stream) copy_fence();
      });
  return work(slot);
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
  auto slot = collective(
      desc, rank_ == o.root ? send : comm::ConstBuffer{},
      [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = send; },
      [&](const Slot& s) {
        const void* src = s.send[static_cast<std::size_t>(o.root)].data;
        copy_bytes(recv.data, src, recv.bytes(), recv.bytes() >= kStreamBytes);
        copy_fence();
      });
  return work(slot);
}

// Each member reduces its chunk of the buffer (all_reduce's chunks, so the same values bitwise)
// from every member's send, in rank order, into the root's recv; nobody else's recv is touched.
comm::WorkPtr SimCommunicator::do_reduce(comm::ConstBuffer send, comm::Buffer recv, int root,
                                         comm::ReduceOptions o) {
  check_buffer(OpKind::reduce, send, "send");
  if (root < 0 || root >= size())
    invalid(OpKind::reduce,
            "root " + std::to_string(root) + " is outside the group of " + std::to_string(size()));
  if (rank_ == root) {
    check_buffer(OpKind::reduce, recv, "recv");
    if (send.count != recv.count || send.dtype != recv.dtype)
      invalid(OpKind::reduce, "send and recv must have the same count and dtype on the root");
  }
  const OpDesc desc{OpKind::reduce, send.dtype, send.count, o.op, root};
  auto slot = collective(
      desc, send,
      [&](Slot& s) {
        s.send[static_cast<std::size_t>(rank_)] = send;
        if (rank_ == root) s.recv[static_cast<std::size_t>(rank_)] = recv;
      },
      [&](const Slot& s) {
        const Range c = chunk(desc.count, s.size, rank_);
        std::vector<const void*> srcs;
        for (int r = 0; r < s.size; ++r)
          srcs.push_back(at(s.send[static_cast<std::size_t>(r)], c.begin));
        void* dst = at(s.recv[static_cast<std::size_t>(root)], c.begin);
        reduce_into(desc.dtype, o.op, srcs, std::span<void* const>(&dst, 1), c.size(), rank_,
                    world_->options().planted);
      });
  return work(slot);
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
  const comm::ConstBuffer src_buf = staging.stage(send, recv, meta());
  const OpDesc desc{OpKind::all_to_all, send.dtype, send.count, comm::ReduceOp::sum, 0};
  const std::size_t c = send.count / n;
  auto slot = collective(
      desc, src_buf, [&](Slot& s) { s.send[static_cast<std::size_t>(rank_)] = src_buf; },
      [&](const Slot& s) {
        const std::size_t bytes = c * comm::size_of(desc.dtype);
        const bool stream = recv.bytes() >= kStreamBytes;
        for (std::size_t j = 0; j < n; ++j)
          copy_bytes(at(recv, j * c), at(s.send[j], static_cast<std::size_t>(rank_) * c), bytes,
                     stream);
        if (stream) copy_fence();
      });
  return work(slot);
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
  const comm::ConstBuffer src_buf = staging.stage(send, recv, meta());
  const OpDesc desc{OpKind::all_to_all_v, send.dtype, 0, comm::ReduceOp::sum, 0};
  const auto ctx = context(OpKind::all_to_all_v);
  auto slot = collective(
      desc, src_buf.slice(0, send_total),
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
  return work(slot);
}

comm::WorkPtr SimCommunicator::do_barrier() {
  return work(collective(OpDesc{OpKind::barrier, comm::DType::u8, 0, comm::ReduceOp::sum, 0}, {},
                         [](Slot&) {}, {}));
}

std::unique_ptr<comm::Communicator> SimCommunicator::do_split(int color, int key,
                                                              const comm::SplitOptions& o) {
  auto slot = collective(
      OpDesc{OpKind::split, comm::DType::i32, 0, comm::ReduceOp::sum, 0}, {},
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
          g->link = group_link(world_->options().topology, g->members);
          g->name =
              s.names[static_cast<std::size_t>(v.front().second)] + comm::rank_list(g->members);
          for (auto [k, r] : v) s.split_result[static_cast<std::size_t>(r)] = g;
        }
      });
  SC_CHECK(slot != nullptr, "split is never skipped by a fault");
  auto g = slot->split_result[static_cast<std::size_t>(rank_)];
  if (!g) return nullptr;
  const auto it = std::find(g->members.begin(), g->members.end(), world_rank());
  return std::make_unique<SimCommunicator>(world_, g, static_cast<int>(it - g->members.begin()));
}

std::unique_ptr<SimCommunicator> SimCommunicator::group(const std::string& id,
                                                        const std::vector<int>& members,
                                                        const std::string& name) const {
  const comm::OpContext ctx{world_rank(), name, "group " + id, 0};
  const int world = world_->world_size();
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (members.empty() || sorted.front() < 0 || sorted.back() >= world ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw comm::InvalidArgument(ctx, "members " + comm::rank_list(members) +
                                         " are not distinct world ranks in [0, " +
                                         std::to_string(world) + ")");
  const auto me = std::find(members.begin(), members.end(), world_rank());
  if (me == members.end())
    throw comm::InvalidArgument(ctx, "rank " + std::to_string(world_rank()) +
                                         " is not among the members " + comm::rank_list(members));
  std::shared_ptr<SimGroup> g;
  {
    std::lock_guard lk(world_->mu);
    world_->check_usable(ctx);
    g = world_->named_group(id, members);
    if (g->name.empty()) g->name = (name.empty() ? "group" : name) + comm::rank_list(members);
  }
  if (g->members != members)
    throw comm::InvalidArgument(ctx, "group id '" + id + "' was registered with members " +
                                         comm::rank_list(g->members) + "; this rank names " +
                                         comm::rank_list(members));
  return std::make_unique<SimCommunicator>(world_, g, static_cast<int>(me - members.begin()));
}

}  // namespace shardcheck::sim
