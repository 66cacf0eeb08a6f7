// DDP's bucket all_reduces overlap backward: with a communicator that logs compute and
// collectives in issue order, the first buckets are issued before the last block's backward has
// run (PyTorch DDP order), and none before the last microbatch's backward; overlap off issues them
// all after backward. Compute reports carry FLOPs (parallel/flops.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/flops.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

// Forwards everything to `inner`, logging compute names and collective kinds.
class LoggingComm final : public comm::Communicator {
 public:
  explicit LoggingComm(comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  const std::vector<int>& members() const override { return inner_.members(); }
  std::vector<std::string> log;
  double flops = 0;

 protected:
  comm::WorkPtr do_all_reduce(comm::ConstBuffer s, comm::Buffer r, comm::ReduceOptions o) override {
    log.push_back("all_reduce " + std::to_string(r.count));
    return inner_.all_reduce(s, r, o);
  }
  comm::WorkPtr do_reduce_scatter(comm::ConstBuffer s, comm::Buffer r,
                                  comm::ReduceOptions o) override {
    log.push_back("reduce_scatter");
    return inner_.reduce_scatter(s, r, o);
  }
  comm::WorkPtr do_all_gather(comm::ConstBuffer s, comm::Buffer r) override {
    log.push_back("all_gather");
    return inner_.all_gather(s, r);
  }
  comm::WorkPtr do_broadcast(comm::ConstBuffer s, comm::Buffer r,
                             comm::BroadcastOptions o) override {
    return inner_.broadcast(s, r, o);
  }
  comm::WorkPtr do_all_to_all(comm::ConstBuffer s, comm::Buffer r) override {
    return inner_.all_to_all(s, r);
  }
  comm::WorkPtr do_all_to_all_v(comm::ConstBuffer s, std::span<const std::size_t> sc,
                                comm::Buffer r, std::span<const std::size_t> rc) override {
    return inner_.all_to_all_v(s, sc, r, rc);
  }
  comm::WorkPtr do_send(comm::ConstBuffer b, int peer, comm::P2POptions o) override {
    return inner_.send(b, peer, o);
  }
  comm::WorkPtr do_recv(comm::Buffer b, int peer, comm::P2POptions o) override {
    return inner_.recv(b, peer, o);
  }
  comm::WorkPtr do_barrier() override { return inner_.barrier(); }
  std::unique_ptr<comm::Communicator> do_split(int color, int key,
                                               const comm::SplitOptions& o) override {
    return inner_.split(color, key, o);
  }
  void do_compute(const comm::ComputeCost& c) override {
    log.push_back(std::string(c.name));
    flops += c.flops;
    inner_.compute(c);
  }
  void do_begin_step(int step) override { inner_.begin_step(step); }
  comm::MemoryTracker& do_memory() override { return inner_.memory(); }

 private:
  comm::Communicator& inner_;
};

std::vector<std::string> ddp_log(bool overlap, double* flops) {
  Scenario s = dense_setup();
  s.train.steps = 1;
  s.model.dropout = 0.0;
  const ref::Dataset ds = dataset_of(s);
  std::vector<std::string> out;
  sim::SimWorld(2).run([&](comm::Communicator& c) {
    LoggingComm lc(c);
    DataParallelEngine e(lc, s.model, s.train, s.seed,
                         {.strategy = Strategy::ddp, .bucket_elems = 500, .overlap = overlap});
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size()));
    if (c.rank() == 0) {
      out = lc.log;
      *flops = lc.flops;
    }
  });
  return out;
}

TEST(DdpOverlap, BucketsAreIssuedDuringTheLastBackward) {
  double flops = 0;
  const auto log = ddp_log(true, &flops);
  const auto last_bwd0 = std::find(log.rbegin(), log.rend(), "backward layers.0").base() - 1;
  const auto last_bwd1 = std::find(log.rbegin(), log.rend(), "backward layers.1").base() - 1;
  const auto first_bucket = std::find_if(log.begin(), log.end(), [](const std::string& x) {
    return x.starts_with("all_reduce") && x != "all_reduce 3" && x != "all_reduce 2";
  });
  ASSERT_NE(first_bucket, log.end());
  EXPECT_GT(first_bucket, last_bwd1);  // not before its gradients exist
  EXPECT_LT(first_bucket, last_bwd0);  // but before backward is over: overlapped
  // Every microbatch's forward and backward reported its FLOPs: 3x forward per sequence.
  const Scenario s = dense_setup();
  const double per_seq = model_forward_flops(s.model, s.model.seq_len);
  EXPECT_NEAR(flops - 0.0, 3 * per_seq * s.train.global_batch / 2, 0.2 * flops);

  const auto serial = ddp_log(false, &flops);
  const auto bwd0 = std::find(serial.rbegin(), serial.rend(), "backward layers.0").base() - 1;
  for (auto it = serial.begin(); it != bwd0; ++it)
    EXPECT_TRUE(!it->starts_with("all_reduce") || *it == "all_reduce 3") << *it;
}

}  // namespace
}  // namespace shardcheck::parallel::test
