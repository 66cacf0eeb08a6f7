// Internal to parallel/: the engine behind DataParallelEngine, templated on the master type
// (double: f64; float: f32 and the bf16 recipe). One code path for every strategy: wrap units
// ("groups": one flat buffer each) that are replicated or sharded, gradients accumulated either in
// full (DDP, ZeRO-1: bucketed all_reduce at the end) or as shards (reduce_scatter per microbatch).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/ledger.hpp"

namespace shardcheck::parallel {

struct DataParallelEngine::Impl {
  virtual ~Impl() = default;
  virtual ref::StepRecord step(const ref::Batch& local) = 0;
  virtual ref::ParamMap<double> full_params() = 0;
  virtual std::vector<StatePiece> export_state() const = 0;
  virtual void import_state(const StateReader& read) = 0;
  virtual std::size_t param_elems() const = 0;
  virtual std::size_t optimizer_elems() const = 0;
  virtual std::size_t padding() const = 0;
  FlatLayout layout{std::vector<std::pair<std::string, ref::Shape>>{}, 1};
  Strategy strategy = Strategy::ddp;
  std::vector<CollectiveCall> calls;
  StepHealth health;
  int skipped = 0;
  comm::MemoryBreakdown model_state;
};

// One wrap unit's flat buffer and the optimizer state of the range this rank owns.
template <class T>
struct Group {
  Group(FlatLayout l, std::vector<int> u) : layout(std::move(l)), units(std::move(u)) {}
  FlatLayout layout;
  std::vector<int> units;  // layerwise units, in order
  bool sharded = false;    // parameters held as the owned shard only (ZeRO-3 / FSDP)
  Range owned;             // optimizer range; DDP / no_shard: [0, N)
  std::vector<T> params;   // working parameters: replicated, the padded buffer; sharded, the shard
  std::vector<T> master;   // bf16 recipe: f32 master weights of the owned range
  std::vector<T> m, v;     // AdamW moments of the owned range
  std::vector<std::uint8_t> decay;  // per owned element
  std::vector<T> acc;               // step: gradient accumulator (padded full, or the owned shard)
  int ready = 0;                    // units whose microbatch gradient is complete
  // Sharded groups, while unsharded for compute:
  bool held = false;
  comm::WorkPtr pending;            // in-flight all_gather (prefetch)
  std::vector<T> full;              // all_gather target (f64 / f32)
  std::vector<comm::bf16> staging;  // bf16 recipe: all_gather target in bf16
};

// A reduction issued during backward and completed at the end of the microbatch.
template <class T>
struct PendingReduce {
  int group = 0;
  std::vector<T> buffer;  // padded unit gradient (in place: this rank's chunk after the call)
  comm::WorkPtr work;
  comm::TrackedBytes tracked;
};

template <class T>
class EngineImpl final : public DataParallelEngine::Impl {
 public:
  EngineImpl(comm::Communicator& dp, const ref::ModelConfig& model, const ref::TrainConfig& train,
             uint64_t seed, DataParallelOptions options);
  ~EngineImpl() override;
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;
  ref::StepRecord step(const ref::Batch& local) override;
  ref::ParamMap<double> full_params() override;
  std::vector<StatePiece> export_state() const override;
  void import_state(const StateReader& read) override;
  std::size_t param_elems() const override;
  std::size_t optimizer_elems() const override;
  std::size_t padding() const override;

 private:
  enum class GradMode { full_buckets, per_microbatch };
  void add_group(std::vector<int> units, int shards, int shard_rank, bool sharded, bool own_all);
  void init_group(Group<T>& g);
  Group<T>& group_of(int unit) {
    return groups_[static_cast<std::size_t>(group_of_[static_cast<std::size_t>(unit)])];
  }

  // Microbatch hooks (layerwise.hpp).
  const ref::ParamMap<T>& acquire(int unit);
  void release(int unit);
  ref::ParamMap<T>& grads(int unit);
  void grads_ready(int unit);
  void issue_gather(int group);
  void finish_gather(int group);
  void free_gather(int group);
  void unpack_units(const Group<T>& g, std::span<const T> full);
  void issue_ready_buckets(bool all);
  void complete_reductions();

  void optimizer_step(double clip_factor, double lr);
  void adam(Group<T>& g, std::span<T> p, std::span<const T> grad, double lr);
  void share_updated(Group<T>& g);
  std::span<T> master_of(Group<T>& g);
  // The elements of a group this rank writes on export: replicated state is split evenly over
  // the DP group; sharded state is written by its owner (replica 0 under hybrid_shard).
  Range write_range(const Group<T>& g, bool replicated) const;

  bool planted(testing::Mutation m) const { return options_.planted == m; }
  template <class U>
  comm::WorkPtr issue(const char* op, const char* what, comm::Communicator& c, std::span<U> s);
  void track(comm::MemCategory c, std::size_t bytes) { mem_.allocate(c, bytes); }
  void untrack(comm::MemCategory c, std::size_t bytes) { mem_.release(c, bytes); }

  comm::Communicator& dp_;
  comm::Communicator* shard_ = nullptr;  // sharded groups' group: dp_, or the hybrid shard group
  std::unique_ptr<comm::Communicator> shard_own_, replicate_;  // hybrid_shard only
  comm::MemoryTracker& mem_;
  ref::ModelConfig model_;
  ref::TrainConfig train_;
  uint64_t seed_;
  DataParallelOptions options_;
  Recipe recipe_;
  bool bf16_ = false;
  int rank_, size_;
  GradMode mode_ = GradMode::full_buckets;
  bool sharded_grads_ = false;  // accumulators are shards (norm: all_reduce of shard squares)
  bool no_shard_ = false;       // FSDP no_shard: all_reduce per unit per microbatch
  std::vector<Group<T>> groups_;
  std::vector<int> group_of_;  // layerwise unit -> group
  std::unordered_map<std::string, std::pair<int, const FlatParam*>> param_index_;
  std::unique_ptr<ResidencyPlan> plan_;  // sharded groups

  // Step state.
  int steps_ = 0;
  int adam_t_ = 0;
  int microbatch_ = 0;
  bool last_microbatch_ = false;
  bool nonfinite_ = false;
  std::size_t acquire_cursor_ = 0, release_cursor_ = 0;
  std::vector<ref::ParamMap<T>> work_;      // per unit: full parameters for compute
  std::vector<ref::ParamMap<T>> mb_grads_;  // per unit: this microbatch's gradient
  std::vector<bool> mb_grads_live_;
  std::vector<bool> unit_done_;  // last microbatch: unit gradient complete (bucket readiness)
  std::vector<Range> buckets_;
  std::vector<std::vector<int>> bucket_units_;
  std::size_t next_bucket_ = 0;
  std::vector<comm::WorkPtr> bucket_work_;
  std::vector<PendingReduce<T>> pending_;
};

}  // namespace shardcheck::parallel
