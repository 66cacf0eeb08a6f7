// Shared state of one simulated run: the world lock, per-rank run state, groups, their pending
// collective slots and point-to-point channels, the blocking primitive that detects deadlock and
// abort from global state, and each rank's own virtual clock, faults and timeline. Internal to
// sim/; users see SimWorld and comm::Communicator.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/errors.hpp"
#include "sim/diagnosis.hpp"
#include "sim/faults.hpp"
#include "sim/op.hpp"
#include "sim/options.hpp"
#include "sim/recorder.hpp"
#include "sim/timeline.hpp"
#include "sim/topology.hpp"

namespace shardcheck::sim {

struct SimGroup;

// "[0-4,6,9-63]": rank lists in messages, runs of three or more shortened.
std::string rank_ranges(const std::vector<int>& ranks);

// One collective in flight on a group: every member's arguments, indexed by group rank.
struct Slot {
  Slot(std::uint64_t s, int n, OpDesc d, int first);
  std::uint64_t seq;
  int size;
  OpDesc desc;
  int first_rank;  // group rank whose arguments set `desc`
  std::vector<comm::ConstBuffer> send;
  std::vector<comm::Buffer> recv;
  std::vector<std::vector<std::size_t>> send_counts, recv_counts;  // all_to_all_v
  std::vector<int> colors, keys;                                   // split
  std::vector<std::string> names;                                  // split
  std::vector<std::shared_ptr<SimGroup>> split_result;             // split, by group rank
  std::vector<bool> arrived_mask;
  int arrived = 0;
  int departed = 0;
  std::exception_ptr error;  // the op failed for every member (mismatch, corruption)
  // Virtual time: each member's arrival (max of its compute and comm streams at issue); the op's
  // run on the comm stream, set by the last member to arrive; the S of its cost formula.
  std::vector<double> arrival;
  double v_start = 0, v_end = 0, cost_bytes = 0;
  // Payload checksums taken at issue (checksum_payloads), by group rank.
  std::vector<std::uint64_t> checksum;
  std::vector<std::size_t> checksum_bytes;  // bytes covered; 0: no checksum
};

// One point-to-point operation; shared by the Work handle and its channel.
struct P2POp {
  bool is_send = false;
  comm::ConstBuffer send;
  comm::Buffer recv;
  int world_rank = 0;  // the rank that posted it
  int peer_world = 0;  // the rank it talks to
  comm::OpContext ctx;
  std::uint64_t record = 0;  // flight-recorder id on the posting rank
  bool done = false;
  std::exception_ptr error;
  // What the peer checks against: the buffer's count and dtype unless a mismatch fault altered
  // them.
  std::size_t desc_count = 0;
  comm::DType desc_dtype = comm::DType::u8;
  std::vector<std::byte> staged;   // a corrupted copy of the payload (corrupt_payload)
  std::size_t checksum_bytes = 0;  // 0: no checksum
  std::uint64_t checksum = 0;
  int step = 0;
  double v_issued = 0, v_start = 0, v_end = 0;  // v_start/v_end set at the match
  std::size_t event = 0;                        // its placeholder in the poster's timeline
  LinkCost link;
};

struct Channel {
  std::deque<std::shared_ptr<P2POp>> sends, recvs;
};

struct SimGroup {
  std::string name;          // e.g. "world", "tp[0,1]"
  std::vector<int> members;  // world ranks in group-rank order
  LinkCost link;             // the slowest link its ring crosses
  std::map<std::uint64_t, std::shared_ptr<Slot>> slots;
  std::map<std::tuple<int, int, int>, Channel> channels;  // (src group rank, dst, tag)
};

// A rank's own state: its virtual clock, step, faults, timeline. Touched only by that rank's
// thread while the run lasts (no lock), and read by SimWorld after every thread has joined.
struct RankLocal {
  double compute = 0;    // compute stream: when the rank's next compute op may start
  double comm_free = 0;  // comm stream: when the last collective issued on it ends
  int step = 0;          // current step (0 before the first begin_step)
  int op_index = 0;      // communication ops issued since begin_step(step)
  RankFaults faults;
  std::vector<FiredFault> fired;
  std::vector<TimelineEvent> events;
  std::vector<std::shared_ptr<P2POp>> p2p;  // posted p2p ops, resolved into `events` after the run
  std::vector<StepTime> steps;
  comm::WorkScope scope;  // the rank's Communicator::set_scope, stamped on its timeline events
  // Both streams drained: where the rank's last step ends.
  double now() const { return compute > comm_free ? compute : comm_free; }
};

class WorldState {
 public:
  WorldState(int n, const SimOptions& opts);

  enum class RunState : std::uint8_t { running, blocked, finished };
  struct WaitInfo {
    std::string group;
    std::string op;
    std::uint64_t seq = 0;
    std::function<std::vector<int>()>
        missing;        // world ranks that have not arrived (evaluated late)
    bool hung = false;  // an injected hang: waits for nothing, forever
  };

  std::mutex mu;

  // Blocks `rank` (lock held) until pred() is true. Throws DeadlockError when every live rank is
  // blocked, PeerError when another rank failed. With ignore_abort it waits regardless: used where
  // peers are guaranteed to finish and may still be writing into this rank's buffers.
  template <class Pred>
  void block(std::unique_lock<std::mutex>& lk, int rank, const WaitInfo& info, Pred pred,
             bool ignore_abort = false) {
    RankInfo& me = ranks_[static_cast<std::size_t>(rank)];
    while (!pred()) {
      if (!ignore_abort) {
        if (me.deadlock) throw_for(me, rank);
        if (aborted_) throw_for(me, rank);
      }
      if (me.state != RunState::blocked) {
        me.state = RunState::blocked;
        me.wait = info;
        --active_;
        detect_deadlock();
        continue;
      }
      me.cv.wait(lk);
    }
    if (me.state == RunState::blocked) {
      me.state = RunState::running;
      ++active_;
    }
  }

  void wake(int rank);                                     // lock held
  void wake_all(const std::vector<int>& ranks);            // lock held
  void finish(int rank);                                   // lock held
  void abort(int failed_rank, const std::string& reason);  // lock held
  bool aborted() const { return aborted_; }
  // Throws AbortedError for a new op issued after a failure (lock held).
  void check_usable(const comm::OpContext& ctx) const;
  // The group registered under `id` (lock held): made over `members` by the first call, the same
  // one (whatever its members) for every later call.
  std::shared_ptr<SimGroup> named_group(const std::string& id, const std::vector<int>& members);
  int world_size() const { return static_cast<int>(ranks_.size()); }

  // Flight recorder of each rank (lock held), and seconds since the run started.
  FlightRecorder& recorder(int rank) { return ranks_[static_cast<std::size_t>(rank)].recorder; }
  // Tracked-allocator books of each rank: touched only by that rank's thread (no lock needed).
  comm::MemoryTracker& memory(int rank) { return ranks_[static_cast<std::size_t>(rank)].memory; }
  // Clock, faults and timeline of each rank: that rank's thread only (no lock needed).
  RankLocal& local(int rank) { return ranks_[static_cast<std::size_t>(rank)].local; }
  const SimOptions& options() const { return opts_; }
  double now() const;
  // Sets the state (and the matching timestamp) of a record, if still in the ring (lock held).
  void mark(int rank, std::uint64_t record, OpState state);
  // The same, with the op's virtual run on the comm stream (lock held).
  void mark(int rank, std::uint64_t record, OpState state, double v_start, double v_end);
  // What the deadlock detector saw (empty unless it fired), and the first rank that failed (-1).
  const std::vector<RankPicture>& deadlock_picture() const { return picture_; }
  int failed_rank() const { return failed_rank_; }

 private:
  struct RankInfo {
    RunState state = RunState::running;
    WaitInfo wait;
    std::condition_variable cv;
    std::exception_ptr deadlock;
    FlightRecorder recorder;
    comm::MemoryTracker memory;
    RankLocal local;
  };
  void detect_deadlock();
  [[noreturn]] void throw_for(RankInfo& me, int rank);

  std::vector<RankInfo> ranks_;
  int active_;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failure_;
  SimOptions opts_;
  std::vector<RankPicture> picture_;
  std::map<std::string, std::shared_ptr<SimGroup>> named_groups_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace shardcheck::sim
