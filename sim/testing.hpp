// Test-only switches that plant known bugs in the simulator's collectives, so tests can show that
// the checks guarding them fail. Never set outside tests; the default is no mutation.
#pragma once

namespace shardcheck::sim::testing {

enum class Mutation {
  none,
  reverse_order_on_odd_chunks,  // reduce odd chunks in reverse rank order (breaks bitwise order)
  skip_last_element_of_chunk,   // chunk boundary bug: a chunk's last element is never reduced
};

void set_mutation(Mutation m);
Mutation mutation();

// Sets a mutation for one scope.
class ScopedMutation {
 public:
  explicit ScopedMutation(Mutation m) { set_mutation(m); }
  ~ScopedMutation() { set_mutation(Mutation::none); }
  ScopedMutation(const ScopedMutation&) = delete;
  ScopedMutation& operator=(const ScopedMutation&) = delete;
};

}  // namespace shardcheck::sim::testing
