// Point-to-point send/recv of the simulator: matched in order per (sender, receiver, tag) with
// rendezvous semantics. A pair is timed at the match, alpha-beta over the link between the two
// ranks, from the later of the two posts; p2p ops do not queue behind collectives on the comm
// stream (they model NCCL's separate p2p channels). Faults and checksums as for collectives.
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "sim/communicator.hpp"

namespace shardcheck::sim {

namespace {

class P2PWork final : public comm::Work {
 public:
  P2PWork(std::shared_ptr<WorldState> w, std::shared_ptr<P2POp> op)
      : world_(std::move(w)), op_(std::move(op)) {}
  // Blocks until matched; then joins the compute stream to the transfer's virtual end.
  void wait() override {
    std::unique_lock lk(world_->mu);
    const int peer = op_->peer_world;
    WorldState::WaitInfo info{op_->ctx.group, op_->ctx.op, op_->ctx.seq,
                              [peer] { return std::vector<int>{peer}; }, false};
    try {
      world_->block(lk, op_->world_rank, info, [this] { return op_->done || op_->error; });
    } catch (...) {
      world_->mark(op_->world_rank, op_->record, OpState::failed);
      throw;
    }
    if (op_->error) std::rethrow_exception(op_->error);
    RankLocal& l = world_->local(op_->world_rank);
    l.compute = std::max(l.compute, op_->v_end);
  }
  bool is_completed() override {
    std::lock_guard lk(world_->mu);
    return op_->done || op_->error;
  }

 private:
  std::shared_ptr<WorldState> world_;
  std::shared_ptr<P2POp> op_;
};

// Decides a matched pair (lock held): mismatch, corruption, or the copy; then times it.
void match(WorldState& world, const std::string& group, P2POp& s, P2POp& r) {
  if (s.desc_count != r.desc_count || s.desc_dtype != r.desc_dtype) {
    const std::string what =
        "send/recv mismatch in group " + group + ": rank " + std::to_string(s.world_rank) +
        " sends " + std::to_string(s.desc_count) + " " + std::string(comm::name_of(s.desc_dtype)) +
        ", rank " + std::to_string(r.world_rank) + " receives " + std::to_string(r.desc_count) +
        " " + std::string(comm::name_of(r.desc_dtype));
    s.error =
        std::make_exception_ptr(comm::MismatchError(s.ctx, what, {s.world_rank, r.world_rank}));
    r.error =
        std::make_exception_ptr(comm::MismatchError(r.ctx, what, {s.world_rank, r.world_rank}));
  } else if (s.checksum_bytes > 0 && XXH3_64bits(s.send.data, s.checksum_bytes) != s.checksum) {
    const std::string what =
        "payload corrupted in flight: the message of rank " + std::to_string(s.world_rank) +
        " to rank " + std::to_string(r.world_rank) + " (" + s.ctx.op + " seq " +
        std::to_string(s.ctx.seq) + " of group " + group + ") does not match its checksum at issue";
    comm::OpContext ctx = s.ctx;
    s.error = std::make_exception_ptr(comm::CorruptionError(ctx, what, s.world_rank));
    r.error = s.error;
  } else {
    if (!world.options().meta && s.send.bytes() > 0)
      std::memcpy(r.recv.data, s.send.data, s.send.bytes());
    s.done = r.done = true;
  }
  const double bytes = static_cast<double>(s.send.bytes());
  s.v_start = r.v_start = std::max(s.v_issued, r.v_issued);
  s.v_end = r.v_end = s.v_start + op_seconds(OpKind::send, 2, bytes, s.link);
  const OpState st = s.done ? OpState::completed : OpState::failed;
  world.mark(s.world_rank, s.record, st, s.v_start, s.v_end);
  world.mark(r.world_rank, r.record, st, r.v_start, r.v_end);
}

}  // namespace

comm::WorkPtr SimCommunicator::post_p2p(OpKind k, comm::ConstBuffer send, comm::Buffer recv,
                                        int peer, int tag) {
  const bool is_send = k == OpKind::send;
  if (is_send)
    check_buffer(k, send, "send");
  else
    check_buffer(k, recv, "recv");
  if (peer < 0 || peer >= size())
    invalid(k,
            "peer " + std::to_string(peer) + " is outside the group of " + std::to_string(size()));
  const SimOptions& opt = world_->options();
  RankLocal& l = local();
  auto op = std::make_shared<P2POp>();
  op->is_send = is_send;
  op->send = send;
  op->recv = recv;
  op->world_rank = world_rank();
  op->peer_world = group_->members[static_cast<std::size_t>(peer)];
  op->ctx = p2p_context(k, peer, tag);
  op->desc_count = is_send ? send.count : recv.count;
  op->desc_dtype = is_send ? send.dtype : recv.dtype;
  op->step = l.step;
  const int pair[2] = {op->world_rank, op->peer_world};
  op->link = group_link(opt.topology, pair);

  const std::optional<Fault> fault = next_op(op->ctx.op, op->ctx.seq);
  const FaultKind fk = fault ? fault->kind : FaultKind::straggler;
  if (fault && fk == FaultKind::skip_collective) return std::make_shared<comm::CompletedWork>();
  if (fault && fk == FaultKind::mismatch) {
    if (fault->what == MismatchWhat::dtype)
      op->desc_dtype = op->desc_dtype == comm::DType::f32 ? comm::DType::f64 : comm::DType::f32;
    else
      op->desc_count += 1;  // p2p has no reduce op: "op" alters the count too
  }
  const bool has_payload = is_send && !opt.meta && send.count > 0;
  if (opt.checksum_payloads && has_payload) {
    op->checksum = XXH3_64bits(send.data, send.bytes());
    op->checksum_bytes = send.bytes();
  }
  if (fault && fk == FaultKind::corrupt_payload) {
    if (has_payload) {
      const auto* p = static_cast<const std::byte*>(send.data);
      op->staged.assign(p, p + send.bytes());
      const std::size_t i =
          corrupt_index(opt.faults.seed, op->world_rank, l.step, l.op_index - 1, send.count);
      flip_element(op->staged.data(), comm::size_of(send.dtype), i);
      op->send.data = op->staged.data();
      l.fired.back().detail = "element " + std::to_string(i) + " of " + std::to_string(send.count) +
                              " flipped (bit 6 of its top byte)";
    } else {
      l.fired.back().detail = "no payload to corrupt (a recv, meta mode, or empty)";
    }
  }
  op->v_issued = l.compute;

  std::unique_lock lk(world_->mu);
  world_->check_usable(op->ctx);
  if (fault && fk == FaultKind::hang) hang_here(lk, "before " + op->ctx.op);
  ++p2p_seq_[{peer, tag, is_send}];
  op->record = world_->recorder(op->world_rank)
                   .push({0, group_->name, op->ctx.op, op->ctx.seq, op->desc_dtype, op->desc_count,
                          -1, OpState::issued, world_->now(), 0, 0, l.step, op->v_issued, 0, 0});
  if (opt.record_timeline) {
    op->event = l.events.size();
    l.events.push_back({op->world_rank, Stream::comm, std::string(name_of(k)), op->ctx.op, l.step,
                        0, 0, is_send ? send.bytes() : recv.bytes(), group_->name, op->ctx.seq,
                        l.scope});
    l.p2p.push_back(op);
  }
  const int src = is_send ? rank_ : peer;
  const int dst = is_send ? peer : rank_;
  Channel& ch = group_->channels[{src, dst, tag}];
  auto& mine = is_send ? ch.sends : ch.recvs;
  auto& theirs = is_send ? ch.recvs : ch.sends;
  if (theirs.empty()) {
    mine.push_back(op);
  } else {
    std::shared_ptr<P2POp> other = theirs.front();
    theirs.pop_front();
    match(*world_, group_->name, is_send ? *op : *other, is_send ? *other : *op);
    world_->wake(other->world_rank);
  }
  return std::make_shared<P2PWork>(world_, std::move(op));
}

comm::WorkPtr SimCommunicator::do_send(comm::ConstBuffer buf, int peer, comm::P2POptions o) {
  return post_p2p(OpKind::send, buf, {}, peer, o.tag);
}

comm::WorkPtr SimCommunicator::do_recv(comm::Buffer buf, int peer, comm::P2POptions o) {
  return post_p2p(OpKind::recv, {}, buf, peer, o.tag);
}

}  // namespace shardcheck::sim
