// Shared state of one simulated run: the world lock, per-rank run state, groups, their pending
// collective slots and point-to-point channels, and the blocking primitive that detects deadlock
// and abort from global state. Internal to sim/; users see SimWorld and comm::Communicator.
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
#include "sim/recorder.hpp"

namespace shardcheck::sim {

enum class OpKind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all,
  all_to_all_v,
  barrier,
  split,
  send,
  recv
};
std::string_view name_of(OpKind k);

// What every member of a group must agree on at one sequence number.
struct OpDesc {
  OpKind kind = OpKind::barrier;
  comm::DType dtype = comm::DType::u8;
  std::size_t count = 0;
  comm::ReduceOp redop = comm::ReduceOp::sum;
  int root = 0;
  friend bool operator==(const OpDesc&, const OpDesc&) = default;
  std::string describe() const;
};

struct SimGroup;

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
  std::exception_ptr error;  // the op failed for every member (mismatch)
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
};

struct Channel {
  std::deque<std::shared_ptr<P2POp>> sends, recvs;
};

struct SimGroup {
  std::string name;          // e.g. "world", "tp[0,1]"
  std::vector<int> members;  // world ranks in group-rank order
  std::map<std::uint64_t, std::shared_ptr<Slot>> slots;
  std::map<std::tuple<int, int, int>, Channel> channels;  // (src group rank, dst, tag)
};

class WorldState {
 public:
  explicit WorldState(int n);

  enum class RunState : std::uint8_t { running, blocked, finished };
  struct WaitInfo {
    std::string group;
    std::string op;
    std::uint64_t seq = 0;
    std::function<std::vector<int>()>
        missing;  // world ranks that have not arrived (evaluated late)
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

  // Flight recorder of each rank (lock held), and seconds since the run started.
  FlightRecorder& recorder(int rank) { return ranks_[static_cast<std::size_t>(rank)].recorder; }
  // Tracked-allocator books of each rank: touched only by that rank's thread (no lock needed).
  comm::MemoryTracker& memory(int rank) { return ranks_[static_cast<std::size_t>(rank)].memory; }
  double now() const;
  // Sets the state (and the matching timestamp) of a record, if still in the ring (lock held).
  void mark(int rank, std::uint64_t record, OpState state);

 private:
  struct RankInfo {
    RunState state = RunState::running;
    WaitInfo wait;
    std::condition_variable cv;
    std::exception_ptr deadlock;
    FlightRecorder recorder;
    comm::MemoryTracker memory;
  };
  void detect_deadlock();
  [[noreturn]] void throw_for(RankInfo& me, int rank);

  std::vector<RankInfo> ranks_;
  int active_;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failure_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace shardcheck::sim
