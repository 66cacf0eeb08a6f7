// From a failed run's errors, deadlock picture and fired faults to one Diagnosis: the kind, the
// culprit ranks and a message that says who never arrived, where everyone else waits, and what
// the culprit last completed.
#include "sim/diagnosis.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "comm/errors.hpp"
#include "comm/memory.hpp"
#include "sim/state.hpp"

namespace shardcheck::sim {

std::string_view name_of(DiagnosisKind k) {
  switch (k) {
    case DiagnosisKind::deadlock:
      return "deadlock";
    case DiagnosisKind::hang:
      return "hang";
    case DiagnosisKind::crash:
      return "crash";
    case DiagnosisKind::mismatch:
      return "mismatch";
    case DiagnosisKind::corruption:
      return "corruption";
    case DiagnosisKind::oom:
      return "oom";
    case DiagnosisKind::error:
      return "error";
  }
  return "?";
}

namespace {

const FlightRecord* last_completed(const std::vector<FlightRecord>& recs) {
  for (auto it = recs.rbegin(); it != recs.rend(); ++it)
    if (it->state == OpState::completed) return &*it;
  return nullptr;
}

std::string last_of(const DiagnosisInput& in, int rank) {
  const FlightRecord* r = last_completed(in.records[static_cast<std::size_t>(rank)]);
  return "rank " + std::to_string(rank) + " last completed " +
         (r ? r->describe() : std::string("no communication op"));
}

const FiredFault* fired_of(const DiagnosisInput& in, std::initializer_list<FaultKind> kinds) {
  for (const FiredFault& f : in.fired)
    if (std::find(kinds.begin(), kinds.end(), f.fault.kind) != kinds.end()) return &f;
  return nullptr;
}

// "ranks [0-4,6-63] wait in all_reduce seq 7 of group world for [5]; rank 3 had finished."
std::string blocked_summary(const std::vector<RankPicture>& picture) {
  std::vector<std::pair<std::string, std::vector<int>>> lines;
  for (const RankPicture& p : picture) {
    std::string what;
    if (p.finished)
      what = "had finished";
    else if (p.hung)
      what = "hung " + p.op;
    else
      what = "\twait in " + p.op + " seq " + std::to_string(p.seq) + " of group " + p.group +
             " for " + rank_ranges(p.missing);
    auto it =
        std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == what; });
    if (it == lines.end())
      lines.push_back({what, {p.rank}});
    else
      it->second.push_back(p.rank);
  }
  std::ostringstream os;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& [what, who] = lines[i];
    std::string text = what;
    if (text[0] == '\t')  // a leading tab marks "wait", whose verb agrees with the rank count
      text = (who.size() == 1 ? "waits" : "wait") + text.substr(5);
    os << (i ? "; " : "")
       << (who.size() == 1 ? "rank " + std::to_string(who[0]) : "ranks " + rank_ranges(who)) << " "
       << text;
  }
  return os.str() + ".";
}

void from_context(Diagnosis& d, const comm::OpContext& c) {
  d.op = c.op;
  d.group = c.group;
  d.seq = c.seq;
}

void from_fired(Diagnosis& d, const FiredFault& f) {
  d.fault = f;
  d.op = f.op_index < 0 ? "step start" : f.op;
  d.group = f.group;
  d.seq = f.seq;
  d.step = f.step;
}

std::string where(const FiredFault& f) {
  if (f.op_index < 0) return "at the start of step " + std::to_string(f.step);
  return "at step " + std::to_string(f.step) + ", op " + std::to_string(f.op_index) + " (" + f.op +
         " seq " + std::to_string(f.seq) + " of group " + f.group + ")";
}

void diagnose_deadlock(const DiagnosisInput& in, const comm::DeadlockError& e, Diagnosis& d) {
  const std::vector<RankPicture>& pic = *in.picture;
  std::set<int> missing;
  for (const RankPicture& p : pic)
    if (!p.finished) missing.insert(p.missing.begin(), p.missing.end());
  std::ostringstream os;
  if (const FiredFault* h = fired_of(in, {FaultKind::hang})) {
    d.kind = DiagnosisKind::hang;
    d.ranks = {h->fault.rank};
    from_fired(d, *h);
    os << "Rank " << h->fault.rank << " hung (injected hang fault " << where(*h)
       << ") and never arrived; every other live rank then blocked waiting for it. ";
  } else if (const FiredFault* s = fired_of(in, {FaultKind::skip_collective})) {
    d.kind = DiagnosisKind::deadlock;
    d.ranks = {s->fault.rank};
    from_fired(d, *s);
    os << "Rank " << s->fault.rank << " skipped its " << s->op << " " << where(*s)
       << " (injected skip_collective fault), so its later ops no longer line up with its "
          "peers' and the run deadlocked. ";
  } else {
    d.kind = DiagnosisKind::deadlock;
    d.ranks.assign(missing.begin(), missing.end());
    from_context(d, e.context());
    os << "Deadlock: every live rank is blocked and none can progress; rank"
       << (d.ranks.size() == 1 ? " " + std::to_string(d.ranks[0]) : "s " + rank_ranges(d.ranks))
       << " never arrived where the others wait. ";
  }
  if (d.step == 0 && !d.ranks.empty()) d.step = in.steps[static_cast<std::size_t>(d.ranks[0])];
  os << "State: " << blocked_summary(pic);
  for (int r : d.ranks) os << " Last completed op: " << last_of(in, r) << ".";
  d.message = os.str();
}

}  // namespace

Diagnosis diagnose(DiagnosisInput in) {
  Diagnosis d;
  const RankOutcome& o = (*in.outcomes)[static_cast<std::size_t>(in.chosen)];
  const int chosen = in.chosen;
  d.step = in.steps[static_cast<std::size_t>(chosen)];
  try {
    std::rethrow_exception(o.error);
  } catch (const comm::DeadlockError& e) {
    diagnose_deadlock(in, e, d);
  } catch (const comm::MismatchError& e) {
    d.kind = DiagnosisKind::mismatch;
    from_context(d, e.context());
    std::ostringstream os;
    if (const FiredFault* f = fired_of(in, {FaultKind::mismatch, FaultKind::skip_collective})) {
      d.ranks = {f->fault.rank};
      d.fault = *f;
      d.step = f->step;
      os << "Rank " << f->fault.rank << " caused it: injected " << name_of(f->fault.kind)
         << " fault " << where(*f)
         << (f->fault.kind == FaultKind::skip_collective
                 ? ", so its next op met a different op of its peers. "
                 : " issued it with an altered " + std::string(name_of(f->fault.what)) + ". ");
    } else {
      d.ranks = e.ranks();
      os << "Ranks " << rank_ranges(e.ranks()) << " called different collectives at the same seq. ";
    }
    os << e.what() << ".";
    for (int r : e.ranks()) os << " " << last_of(in, r) << ".";
    d.message = os.str();
  } catch (const comm::CorruptionError& e) {
    d.kind = DiagnosisKind::corruption;
    d.ranks = {e.source()};
    from_context(d, e.context());
    d.step = in.steps[static_cast<std::size_t>(e.source())];
    std::ostringstream os;
    os << "The contribution of rank " << e.source() << " to " << e.context().op << " seq "
       << e.context().seq << " of group " << e.context().group
       << " failed its checksum; every member of the group stopped before using it. " << e.what()
       << ".";
    if (const FiredFault* f = fired_of(in, {FaultKind::corrupt_payload})) {
      d.fault = *f;
      d.step = f->step;
      os << " Injected: corrupt_payload fault " << where(*f) << ", " << f->detail << ".";
    }
    d.message = os.str();
  } catch (const comm::OutOfMemoryError& e) {
    d.kind = DiagnosisKind::oom;
    d.ranks = {e.rank()};
    d.op = std::string(comm::name_of(e.category()));
    d.step = in.steps[static_cast<std::size_t>(e.rank())];
    std::ostringstream os;
    os << "Rank " << e.rank() << " ran out of its memory budget at step " << d.step << ": "
       << e.what() << ". Peak held before the failing allocation: " << e.held().describe() << ".";
    if (const FiredFault* f = fired_of(in, {FaultKind::memory_budget})) d.fault = *f;
    d.message = os.str();
  } catch (const InjectedCrash& e) {
    d.kind = DiagnosisKind::crash;
    d.ranks = {e.rank()};
    std::ostringstream os;
    os << "Rank " << e.rank() << " crashed: " << e.what() << ". ";
    if (const FiredFault* f = fired_of(in, {FaultKind::crash})) from_fired(d, *f);
    std::vector<int> peers;
    for (const RankOutcome& x : *in.outcomes)
      if (!x.ok && !x.root_cause) peers.push_back(x.rank);
    if (!peers.empty())
      os << "Ranks " << rank_ranges(peers) << " failed because of it (PeerError/AbortedError). ";
    os << "Last completed op: " << last_of(in, e.rank()) << ".";
    d.message = os.str();
  } catch (const comm::CommError& e) {
    d.kind = DiagnosisKind::error;
    d.ranks = {chosen};
    from_context(d, e.context());
    d.message = "Rank " + std::to_string(chosen) + " failed: " + e.what() + ". " +
                last_of(in, chosen) + ".";
  } catch (const std::exception& e) {
    d.kind = DiagnosisKind::error;
    d.ranks = {chosen};
    d.message = "Rank " + std::to_string(chosen) + " failed: " + e.what() + ". " +
                last_of(in, chosen) + ".";
  } catch (...) {
    d.kind = DiagnosisKind::error;
    d.ranks = {chosen};
    d.message = "Rank " + std::to_string(chosen) + " failed: " + o.message;
  }
  d.flight_records = std::move(in.records);
  return d;
}

}  // namespace shardcheck::sim
