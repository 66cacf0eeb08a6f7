// Known bugs planted in the reference, so tests can prove that the checks built on it fail when
// they should. They exist only in the test build of the reference (the shardcheck_reference_planted
// library, compiled with SHARDCHECK_PLANTED_BUGS): in every other build mutated() is a constant
// false and no switch exists. In the test build the switch is process-wide and not synchronised:
// set it only while no other thread runs reference code.
#pragma once

namespace shardcheck::ref::testing {

enum class Mutation {
  kNone,
  kMeanOfSequenceMeans,  // loss = mean over sequences of each sequence's token mean
  kRopeOffByOne,         // RoPE uses position + 1
  kNoDocumentMask,       // attention ignores document ids (causal only)
};

#ifdef SHARDCHECK_PLANTED_BUGS
inline Mutation& mutation() {
  static Mutation m = Mutation::kNone;
  return m;
}
inline bool mutated(Mutation m) {
  return mutation() == m;
}

// Sets a mutation for one scope; restores the previous one on exit (also on a failing ASSERT).
class ScopedMutation {
 public:
  explicit ScopedMutation(Mutation m) : previous_(mutation()) { mutation() = m; }
  ~ScopedMutation() { mutation() = previous_; }
  ScopedMutation(const ScopedMutation&) = delete;
  ScopedMutation& operator=(const ScopedMutation&) = delete;

 private:
  Mutation previous_;
};
#else
constexpr bool mutated(Mutation) {
  return false;
}
#endif

}  // namespace shardcheck::ref::testing
