// The optimizer side of the mesh engine (mesh_engine.hpp): gradient sums over each parameter
// class's group, the global norm's share of a rank, AdamW, and ZeRO on the data-parallel axes
// (Megatron's distributed optimizer / DeepSpeed ZeRO semantics).
//
// A rank's local parameter slices fall in two classes, each with its own gradient-sum group whose
// members hold identical slices: non-expert (dp x cp, "dense") and expert (edp = dp x cp / ep,
// "expert DP"). Each class is one flat buffer (the local slices in canonical order, N elements);
// with ZeRO (zero >= 1) the group of D ranks splits it into shards of S = ceil(N / D) (padded P = D
// * S, the padding zeros at the end) and group rank r owns [r*S, (r+1)*S):
//   zero 0: every member holds the moments (and the bf16 master) of all N; gradients all_reduced.
//   zero 1: moments and bf16 master of the owned shard only; gradients all_reduced; each rank
//           updates its shard, then all_gather of the updated (working) parameters.
//   zero 2: as 1, but the gradient is reduce_scattered (each rank keeps its reduced shard). The
//           accumulation over microbatches stays full (Megatron's grad buffer: one reduce_scatter
//           per step, after the pipeline flush), so grads shrink to S from the reduction on.
//   zero 3: as 2, but the parameters are sharded too (FSDP): each class is cut further by wrap
//           unit (Env::unit_of), and each unit's flat buffer (FSDP's FlatParameter) is padded and
//           sharded on its own. Its gradient is reduce_scattered every microbatch, as soon as
//           the backward has written it (issue_unit_reduce; which buffers and when:
//           mesh_grad_units.hpp), and only the shard is accumulated; buffers two chunks write
//           (the tied embedding under a pipeline) are reduced at the step's end as under zero 2.
//           Between uses a rank keeps only its owned range of each unit (the rest of its local
//           slices is poisoned with NaN, so a use without a gather cannot pass parity); the engine
//           (mesh_residency.hpp) calls issue_gather() / complete_gather() for a unit before its use
//           and release_unit() after. One all_gather per unit and class (bf16 recipe: in bf16); no
//           all_gather after the update (the owner keeps its shard). hybrid_shard: the shards live
//           on a shard group inside each class's group and are replicated across the others
//           (Env::*_replicas): the reduce_scatter runs in the shard group, then an all_reduce of
//           the shard over the replicas; replica 0 counts.
// Every element is counted once in the world (norm, full_params, export): by its shard owner
// (zero >= 1) or the group's rank 0 (zero 0), never on the tied embedding's last-stage copy, and
// TP-replicated parameters only on TP rank 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/memory.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_class_comm.hpp"
#include "parallel/mp/mesh_classes.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/state.hpp"
#include "parallel/testing.hpp"
#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

template <class T>
class MeshOptimizer {
  struct Class : ShardedClass {
    std::vector<T> m, v, master;  // [shard]; master: bf16 only
    std::vector<uint8_t> decay;   // [shard]
    std::vector<T> grad;          // zero 2: the reduced shard [shard]
  };
  // The optimizer's buffers for its collectives (ClassComm's D, mesh_class_comm.hpp): gradients
  // read from grads and written to grads_out, parameters read from params and written to
  // params_out; what a collective moves is counted as temporary memory.
  struct Data {
    struct Buf {
      std::vector<T> flat;
      std::vector<comm::bf16> staging;  // the bf16 recipe's all_gathers
      comm::TrackedBytes tmp;
    };
    const MeshOptimizer* o = nullptr;
    const ref::ParamMap<T>* grads = nullptr;
    ref::ParamMap<T>* grads_out = nullptr;
    const ref::ParamMap<T>* params = nullptr;
    ref::ParamMap<T>* params_out = nullptr;
    Buf pack(const Class& c, const FlatRanges& r, int64_t padded_to) const;
    Buf take(const Class& c) const;
    void unpack(const Class& c, const FlatRanges& r, const Buf& b) const;
    static Buf slice(const Buf& b, int64_t at, int64_t n);
    static void keep(Class& c, Buf& shard, bool accumulate);
    Buf owned_padded(const Class& c, bool temporary) const;
    static std::size_t staged_bytes(const Buf& b) { return b.staging.size() * 2; }
    using Held = comm::TrackedBytes;
    Held hold(std::size_t bytes) const {
      return comm::TrackedBytes(*o->mem_, comm::MemCategory::temporary, bytes);
    }
    void unpack_full(const Class& c, Buf& b) const;
    static comm::Buffer view(Buf& b);
  };

 public:
  struct Env {
    comm::Communicator* dense = nullptr;   // non-expert gradient-sum group (dp x cp)
    comm::Communicator* expert = nullptr;  // expert gradient-sum group (edp)
    comm::Communicator* world = nullptr;   // compute reports
    // hybrid_shard: dense / expert are the shard groups, these the groups across which each
    // shard is replicated; null: no replication (dense / expert are the gradient-sum groups).
    comm::Communicator* dense_replicas = nullptr;
    comm::Communicator* expert_replicas = nullptr;
    // zero 3: the wrap unit of each parameter (one flat buffer per unit and class); null: one.
    std::function<int(const LocalParam&)> unit_of;
    int zero = 0;
    bool bf16 = false;  // separate f32 master; params hold the bf16-rounded working weights
    int tp_rank = 0;
    ref::OptimizerConfig optimizer;
    Recipe recipe;
    testing::Mutation planted = testing::Mutation::kNone;  // kWrongShardOffset, kSkipReplicaSum
  };
  // params: this rank's local slices at their initial (master) values; bf16: rounded in place.
  MeshOptimizer(Env env, const std::vector<LocalParam>& specs, ref::ParamMap<T>& params);
  ~MeshOptimizer();
  MeshOptimizer(const MeshOptimizer&) = delete;
  MeshOptimizer& operator=(const MeshOptimizer&) = delete;

  // Which of this rank's parameters an operation covers.
  using Pick = std::function<bool(const LocalParam&)>;

  // Sums each class's gradient over its group: all_reduce (zero 0/1) or reduce_scatter (zero 2/3).
  // Gradients already issued with issue_reduce are waited for and written back, the rest summed.
  void reduce(ref::ParamMap<T>& grads);
  // zero 0/1: issues the all_reduce of the bucket's gradients (indices into the specs) now,
  // asynchronously (DDP's buckets, issued during the last backward as soon as they are complete);
  // every member issues the same buckets in the same order. The buffers stay untouched until
  // reduce(). Each element is summed as one reduce() would sum it (rank order on the simulator):
  // the same bits.
  void issue_reduce(const ref::ParamMap<T>& grads, const std::vector<std::size_t>& bucket);
  // zero 3 (mesh_grad_units.hpp): the classes (flat_classes' order) whose gradient is
  // reduce_scattered every microbatch during the backward; reduce() leaves them out.
  void reduce_each_microbatch(std::vector<bool> classes);
  // Before a step's first backward: the shards those reductions accumulate into are zeroed.
  void begin_accumulation();
  // One microbatch's reduce_scatter of class `cls`, in flight: its packed (padded) gradient.
  using UnitReduce = typename ClassComm<Data>::UnitReduce;
  // Packs class cls's gradient out of grads (which it zeroes) and issues its reduce_scatter;
  // complete_unit_reduce waits, adds the rank's shard into the accumulated one (hybrid_shard:
  // after its all_reduce over the replicas).
  UnitReduce issue_unit_reduce(std::size_t cls, ref::ParamMap<T>& grads);
  void complete_unit_reduce(UnitReduce& r);
  // Gradient elements this rank accumulates over a step's microbatches: the shard of each class
  // reduced every microbatch, every element of the others.
  int64_t accumulated_grad_elems() const;
  // Elements of reduced gradient this rank keeps after reduce() (zero 2/3: the shards).
  int64_t reduced_grad_elems() const;
  // Sum of squares of the reduced gradient elements this rank counts.
  double sum_squares(const ref::ParamMap<T>& grads) const;
  // Sum of squares of this rank's local (unreduced) gradient (planted kLocalNormClip).
  double local_sum_squares(const ref::ParamMap<T>& grads) const;
  // Clip (factor != 1: each g = T(double(g) * factor)) and AdamW on the owned ranges, then share
  // the updated working parameters over each group (zero 1/2; zero 3 keeps only the shards).
  void update(const ref::ParamMap<T>& grads, double clip_factor, double lr,
              ref::ParamMap<T>& params);
  int64_t owned_elems() const;  // optimizer elements this rank holds (with padding)
  // Parameter elements a rank holds between uses: zero 3 its shards (owned_elems()), else all.
  int64_t resident_elems() const;

  // zero 3: one wrap unit's all_gathers (one per class holding it), in flight.
  using UnitGather = typename ClassComm<Data>::Gather;
  // Issues them asynchronously (every member of each class's group issues the same units in the
  // same order), then complete_gather waits and writes the unit's full local slices into params.
  UnitGather issue_gather(int unit, const ref::ParamMap<T>& params);
  void complete_gather(UnitGather& g, ref::ParamMap<T>& params) const;
  // zero 3: frees a unit's gathered copies (the non-owned elements: NaN).
  void release_unit(int unit, ref::ParamMap<T>& params) const;
  // The unit's unsharded (padded) elements on this rank: what a gather makes resident.
  int64_t unit_elems(int unit) const;
  int steps_taken() const { return t_; }

  // fn(spec, local index, master value) for every element this rank counts.
  void for_each_counted(const ref::ParamMap<T>& params,
                        const std::function<void(const LocalParam&, int64_t, T)>& fn) const;
  // "param", "master" (bf16), "exp_avg", "exp_avg_sq" pieces of the elements this rank counts.
  void export_pieces(const ref::ParamMap<T>& params, std::vector<StatePiece>& out) const;
  // Every working-parameter element this rank holds ("param/<name>", the working dtype as f64 or
  // f32 values), every replica included: TP- and kv-replicated slices, the tied embedding's copy,
  // DP replicas; ZeRO-3 / FSDP hold only their shards between steps.
  void export_held(const ref::ParamMap<T>& params, std::vector<StatePiece>& out) const;
  // Reads params (full local slices) and the owned optimizer state; steps_taken from "optimizer/
  // step".
  void import_pieces(const StateReader& read, ref::ParamMap<T>& params);
  // The gradient reductions' operation: a sum (an average under kGradAveragedNotSummed).
  comm::ReduceOptions sum() const {
    return {env_.planted == testing::Mutation::kGradAveragedNotSummed ? comm::ReduceOp::avg
                                                                      : comm::ReduceOp::sum};
  }

 private:
  using SegmentFn =
      std::function<void(const LocalParam&, int64_t local, int64_t count, int64_t flat)>;
  void segments(const Class& c, int64_t begin, int64_t end, const SegmentFn& fn) const;
  std::vector<T> pack(const Class& c, const ref::ParamMap<T>& m, int64_t begin, int64_t end) const;
  void unpack(const Class& c, std::span<const T> flat, int64_t begin, ref::ParamMap<T>& m) const;
  // Whether this rank counts p's elements (each element once in the world); `norm`: for the
  // gradient norm (where a test may plant kNormOverWrongGroup).
  bool counts(const LocalParam& p, bool norm = false) const;
  void adam(Class& c, std::span<T> p, std::span<const T> g, double lr) const;
  void release_class(const Class& c, ref::ParamMap<T>& params) const;

  Env env_;
  std::vector<LocalParam> specs_;
  std::vector<Class> classes_;
  ClassComm<Data> comm_;  // the collectives (mesh_class_comm.hpp)
  comm::MemoryTracker* mem_ = nullptr;
  std::size_t tracked_ = 0;
  int t_ = 0;
};

}  // namespace shardcheck::parallel
