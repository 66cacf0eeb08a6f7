// The simulator's rendezvous (SimCommunicator::collective) with its virtual clock, payload
// checksums and fault injection, plus compute() and begin_step(). The ops themselves are in
// collectives.cpp and p2p.cpp. Disagreement between members is found at arrival (MismatchError for
// every member); the last member to arrive times the op and verifies payloads.
#include "sim/communicator.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

namespace shardcheck::sim {

namespace {

// The descriptor a mismatch fault makes the rank issue instead of the true one.
OpDesc altered(OpDesc d, MismatchWhat what) {
  switch (what) {
    case MismatchWhat::count:
      d.count += 1;
      break;
    case MismatchWhat::dtype:
      d.dtype = d.dtype == comm::DType::f32 ? comm::DType::f64 : comm::DType::f32;
      break;
    case MismatchWhat::op:
      if (comm::info(d.kind).reduces)
        d.redop = d.redop == comm::ReduceOp::sum ? comm::ReduceOp::max : comm::ReduceOp::sum;
      else
        d.kind = d.kind == OpKind::all_reduce ? OpKind::barrier : OpKind::all_reduce;
      break;
  }
  return d;
}

std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

void SimWork::wait() {
  RankLocal& l = world_->local(rank_);
  l.compute = std::max(l.compute, end_);
}

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
  if (b.count > 0 && b.data == nullptr && !meta())
    invalid(k,
            std::string(which) + " buffer is null with " + std::to_string(b.count) + " elements");
}

comm::WorkPtr SimCommunicator::work(const std::shared_ptr<Slot>& slot) const {
  if (!slot) return std::make_shared<comm::CompletedWork>();
  return std::make_shared<SimWork>(world_, world_rank(), slot->v_end);
}

std::optional<Fault> SimCommunicator::next_op(const std::string& op, std::uint64_t seq) {
  RankLocal& l = local();
  const int index = l.op_index++;
  if (l.step <= 0) return std::nullopt;
  std::optional<Fault> f = l.faults.at_op(l.step, index);
  if (!f) return f;
  l.fired.push_back({*f, l.step, index, group_->name, op, seq, l.compute, {}});
  if (f->kind == FaultKind::crash)
    throw InjectedCrash(
        world_rank(), l.step, index,
        "before " + op + " seq " + std::to_string(seq) + " of group " + group_->name);
  return f;
}

void SimCommunicator::hang_here(std::unique_lock<std::mutex>& lk, const std::string& where) {
  WorldState::WaitInfo info{group_->name, where, seq_, {}, true};
  world_->block(lk, world_rank(), info, [] { return false; });
  SC_CHECK(false, "an injected hang never resumes");
}

void SimCommunicator::time_slot(Slot& s) const {
  const OpDesc& d = s.desc;
  const double elem = static_cast<double>(comm::size_of(d.dtype));
  const double p = s.size;
  double count = static_cast<double>(d.count);
  if (d.kind == OpKind::all_to_all_v) {
    std::size_t most = 0;  // the most any member sends to, or receives from, the others
    for (std::size_t i = 0; i < s.send_counts.size(); ++i) {
      std::size_t out = 0, in = 0;
      for (std::size_t j = 0; j < s.send_counts[i].size(); ++j)
        if (j != i) {
          out += s.send_counts[i][j];
          in += s.recv_counts[i][j];
        }
      most = std::max({most, out, in});
    }
    count = static_cast<double>(most);
  }
  const double bytes = comm::cost_bytes(d.kind, count, elem, p);  // the op table's byte rule
  s.cost_bytes = bytes;
  s.v_start = *std::max_element(s.arrival.begin(), s.arrival.end());
  s.v_end = s.v_start + op_seconds(d.kind, s.size, bytes, group_->link);
}

std::exception_ptr SimCommunicator::verify_payloads(const Slot& s) const {
  for (std::size_t r = 0; r < s.checksum_bytes.size(); ++r) {
    if (s.checksum_bytes[r] == 0) continue;
    const std::uint64_t got = XXH3_64bits(s.send[r].data, s.checksum_bytes[r]);
    if (got == s.checksum[r]) continue;
    const int src = group_->members[r];
    const comm::OpContext ctx{src, group_->name, std::string(name_of(s.desc.kind)), s.seq};
    return std::make_exception_ptr(comm::CorruptionError(
        ctx,
        "payload corrupted in flight: the contribution of rank " + std::to_string(src) + " to " +
            ctx.op + " seq " + std::to_string(s.seq) + " of group " + group_->name +
            " has checksum " + hex(got) + " on arrival but " + hex(s.checksum[r]) + " when issued",
        src));
  }
  return nullptr;
}

std::shared_ptr<Slot> SimCommunicator::collective(const OpDesc& desc, comm::ConstBuffer payload,
                                                  const Register& reg, const Data& data,
                                                  const Complete& complete) {
  const int me = world_rank();
  RankLocal& l = local();
  const SimOptions& opt = world_->options();
  const std::string op_name(name_of(desc.kind));
  std::optional<Fault> fault;
  if (desc.kind != OpKind::split) fault = next_op(op_name, seq_);
  const FaultKind fk = fault ? fault->kind : FaultKind::straggler;  // straggler: nothing here
  if (fault && fk == FaultKind::skip_collective) return nullptr;
  const OpDesc sent = fault && fk == FaultKind::mismatch ? altered(desc, fault->what) : desc;

  // Checksum and corruption touch payload bytes: done before taking the world lock.
  const bool has_payload = !opt.meta && payload.count > 0;
  std::uint64_t sum = 0;
  if (opt.checksum_payloads && has_payload) sum = XXH3_64bits(payload.data, payload.bytes());
  std::vector<std::byte> corrupted;
  if (fault && fk == FaultKind::corrupt_payload) {
    if (has_payload) {
      const auto* p = static_cast<const std::byte*>(payload.data);
      corrupted.assign(p, p + payload.bytes());
      const std::size_t i =
          corrupt_index(opt.faults.seed, me, l.step, l.op_index - 1, payload.count);
      flip_element(corrupted.data(), comm::size_of(payload.dtype), i);
      l.fired.back().detail = "element " + std::to_string(i) + " of " +
                              std::to_string(payload.count) + " flipped (bit 6 of its top byte)";
    } else {
      l.fired.back().detail = "no payload to corrupt (meta mode, empty, or not the root)";
    }
  }
  const double v_issue = l.now();

  std::unique_lock lk(world_->mu);
  const comm::OpContext ctx = context(desc.kind);
  world_->check_usable(ctx);
  if (fault && fk == FaultKind::hang)
    hang_here(lk,
              "before " + op_name + " seq " + std::to_string(seq_) + " of group " + group_->name);
  auto& entry = group_->slots[seq_];
  if (!entry) entry = std::make_shared<Slot>(seq_, size(), sent, rank_);
  std::shared_ptr<Slot> slot = entry;
  ++seq_;
  FlightRecord record{0,
                      group_->name,
                      op_name,
                      slot->seq,
                      sent.dtype,
                      sent.count,
                      comm::info(desc.kind).rooted ? desc.root : -1,
                      OpState::issued,
                      world_->now(),
                      0,
                      0,
                      l.step,
                      v_issue,
                      0,
                      0};
  const std::uint64_t rec = world_->recorder(me).push(std::move(record));
  if (slot->error) {
    world_->mark(me, rec, OpState::failed);
    std::rethrow_exception(slot->error);
  }
  if (!(slot->desc == sent)) {
    world_->mark(me, rec, OpState::failed);
    const int other = group_->members[static_cast<std::size_t>(slot->first_rank)];
    std::ostringstream os;
    os << "collective mismatch in group " << group_->name << " at seq " << slot->seq << ": rank "
       << other << " called " << slot->desc.describe() << " but rank " << me << " called "
       << sent.describe();
    comm::MismatchError e(ctx, os.str(), {other, me});
    slot->error = std::make_exception_ptr(e);
    world_->wake_all(group_->members);
    throw e;
  }
  reg(*slot);
  const auto ur = static_cast<std::size_t>(rank_);
  slot->arrival[ur] = v_issue;
  if (!corrupted.empty())
    slot->send[ur] = {corrupted.data(), payload.count, payload.dtype, payload.device};
  if (opt.checksum_payloads && has_payload) {
    slot->checksum[ur] = sum;
    slot->checksum_bytes[ur] = payload.bytes();
  }
  slot->arrived_mask[ur] = true;
  if (++slot->arrived == slot->size) {
    time_slot(*slot);
    if (opt.checksum_payloads) slot->error = verify_payloads(*slot);
    if (complete && !slot->error) {
      try {
        complete(*slot);
      } catch (...) {
        slot->error = std::current_exception();
      }
    }
    world_->wake_all(group_->members);
  }
  auto group = group_;
  WorldState::WaitInfo info{group_->name, op_name, slot->seq,
                            [slot, group] {
                              std::vector<int> missing;
                              for (std::size_t r = 0; r < slot->arrived_mask.size(); ++r)
                                if (!slot->arrived_mask[r]) missing.push_back(group->members[r]);
                              return missing;
                            },
                            false};
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

  std::exception_ptr data_error;
  if (opt.meta) {
    // No data moves, so nobody reads this rank's buffers: leave without waiting for the others.
    if (++slot->departed == slot->size) group_->slots.erase(slot->seq);
  } else {
    lk.unlock();
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
  }
  world_->mark(me, rec, data_error ? OpState::failed : OpState::completed, slot->v_start,
               slot->v_end);
  lk.unlock();
  if (data_error) std::rethrow_exception(data_error);

  l.comm_free = slot->v_end;
  if (desc.kind == OpKind::split) l.compute = std::max(l.compute, slot->v_end);  // it blocks
  if (opt.record_timeline)
    l.events.push_back({me, Stream::comm, op_name, op_name, l.step, slot->v_start, slot->v_end,
                        static_cast<std::size_t>(slot->cost_bytes), group_->name, slot->seq,
                        l.scope});
  return slot;
}

void SimCommunicator::do_compute(const comm::ComputeCost& c) {
  RankLocal& l = local();
  const double dt = compute_seconds(world_->options().topology, c) * l.faults.slowdown(l.step);
  if (world_->options().record_timeline)
    l.events.push_back({world_rank(),
                        Stream::compute,
                        "compute",
                        std::string(c.name),
                        l.step,
                        l.compute,
                        l.compute + dt,
                        static_cast<std::size_t>(c.bytes),
                        {},
                        0,
                        l.scope});
  l.compute += dt;
}

void SimCommunicator::do_begin_step(int step) {
  RankLocal& l = local();
  if (step == l.step) return;  // marked already (through another group of this rank)
  if (!l.steps.empty()) l.steps.back().end = l.compute;
  l.steps.push_back({world_rank(), step, l.compute, l.compute});
  l.step = step;
  l.op_index = 0;
  const std::optional<Fault> f = l.faults.at_step_start(step);
  if (!f) return;
  l.fired.push_back({*f, step, -1, {}, {}, 0, l.compute, {}});
  if (f->kind == FaultKind::crash) throw InjectedCrash(world_rank(), step, -1, "");
  std::unique_lock lk(world_->mu);
  world_->check_usable(context(OpKind::barrier));
  WorldState::WaitInfo info{"-", "at the start of step " + std::to_string(step), 0, {}, true};
  world_->block(lk, world_rank(), info, [] { return false; });
  SC_CHECK(false, "an injected hang never resumes");
}

void SimCommunicator::do_set_scope(const comm::WorkScope& s) {
  local().scope = s;
}

comm::MemoryTracker& SimCommunicator::do_memory() {
  return world_->memory(world_rank());
}

}  // namespace shardcheck::sim
