// Known bugs a test can plant in the simulator's collectives, so tests can show that the checks
// guarding them fail. A planted bug travels in SimOptions::planted (internal use by tests) to the
// reduction kernels of that world only: there is no process-wide switch.
#pragma once

namespace shardcheck::sim::testing {

enum class Mutation {
  none,
  reverse_order_on_odd_chunks,  // reduce odd chunks in reverse rank order (breaks bitwise order)
  skip_last_element_of_chunk,   // chunk boundary bug: a chunk's last element is never reduced
};

}  // namespace shardcheck::sim::testing
