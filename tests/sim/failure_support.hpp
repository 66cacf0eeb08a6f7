// Test support for runs that must fail: expect_failure<E>(n, fn) runs fn on n simulated ranks and
// returns the RankFailure and its cause as E, failing the test if the run passes or fails with
// another cause.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <stdexcept>
#include <utility>

#include "comm/communicator.hpp"
#include "sim/world.hpp"

namespace shardcheck::testing {

template <class E>
std::pair<sim::RankFailure, E> expect_failure(int n,
                                              const std::function<void(comm::Communicator&)>& fn) {
  sim::SimWorld w(n);
  try {
    w.run(fn);
  } catch (const sim::RankFailure& f) {
    try {
      f.rethrow_cause();
    } catch (const E& e) {
      return {f, e};
    } catch (const std::exception& other) {
      ADD_FAILURE() << "failure of the wrong type: " << other.what();
      throw;
    }
  }
  ADD_FAILURE() << "the run did not fail";
  throw std::logic_error("no failure");
}

}  // namespace shardcheck::testing
