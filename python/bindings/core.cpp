// shardcheck._core: the simulator as a Python module. A World of N ranks (topology, faults and
// health in the scenario's JSON vocabulary), each rank's Communicator (every comm::Communicator op
// on host buffers given as (address, element count, dtype name), split, and the simulator's
// id-keyed groups), Work handles, the virtual clock's timeline and step times, and the run's
// diagnosis. Each rank runs the Python function on its own simulator thread; the GIL is released
// while a rank waits in an op. comm::CommError subclasses become shardcheck.errors exceptions that
// keep rank, group, op and sequence number, and carry the C++ error so the simulator still tells a
// root cause from the failures it caused.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/errors.hpp"
#include "harness/json_reader.hpp"
#include "harness/sim_options.hpp"
#include "sim/communicator.hpp"
#include "sim/world.hpp"

namespace py = pybind11;
using namespace shardcheck;

namespace {

// A rank's Python function raised an exception of its own (not one of the simulator's).
class PythonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

py::module_ errors() {
  return py::module_::import("shardcheck.errors");
}

// The Python exception for a C++ one, with the C++ error attached as `_cause` (a capsule).
py::object to_python(std::exception_ptr ep) {
  const py::module_ e = errors();
  py::object exc;
  try {
    std::rethrow_exception(ep);
  } catch (const comm::MismatchError& x) {
    const auto& c = x.context();
    exc = e.attr("MismatchError")(x.what(), c.rank, c.group, c.op, c.seq, x.ranks());
  } catch (const comm::PeerError& x) {
    const auto& c = x.context();
    exc = e.attr("PeerError")(x.what(), c.rank, c.group, c.op, c.seq, x.peer());
  } catch (const comm::DeadlockError& x) {
    const auto& c = x.context();
    exc = e.attr("DeadlockError")(x.what(), c.rank, c.group, c.op, c.seq, x.missing());
  } catch (const comm::CorruptionError& x) {
    const auto& c = x.context();
    exc = e.attr("CorruptionError")(x.what(), c.rank, c.group, c.op, c.seq, x.source());
  } catch (const comm::AbortedError& x) {
    const auto& c = x.context();
    exc = e.attr("AbortedError")(x.what(), c.rank, c.group, c.op, c.seq);
  } catch (const comm::InvalidArgument& x) {
    const auto& c = x.context();
    exc = e.attr("InvalidArgument")(x.what(), c.rank, c.group, c.op, c.seq);
  } catch (const comm::CommError& x) {
    const auto& c = x.context();
    exc = e.attr("CommError")(x.what(), c.rank, c.group, c.op, c.seq);
  } catch (const sim::InjectedCrash& x) {
    exc = e.attr("InjectedCrash")(x.what(), x.rank(), x.step(), x.op_index());
  } catch (const harness::ScenarioError& x) {
    exc = e.attr("ConfigError")(x.what());
  } catch (const std::exception& x) {
    exc = py::module_::import("builtins").attr("RuntimeError")(x.what());
  }
  exc.attr("_cause") = py::capsule(new std::exception_ptr(ep),
                                   [](void* p) { delete static_cast<std::exception_ptr*>(p); });
  return exc;
}

[[noreturn]] void raise(std::exception_ptr ep) {
  py::object exc = to_python(ep);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// Runs f without the GIL; a C++ error becomes its Python exception.
template <class F>
auto released(F&& f) {
  std::exception_ptr ep;
  {
    py::gil_scoped_release nogil;
    try {
      return f();
    } catch (...) {
      ep = std::current_exception();
    }
  }
  raise(ep);
}

using PyBuffer = std::tuple<std::uintptr_t, std::size_t, std::string>;  // address, count, dtype

comm::DType dtype_of(const std::string& name) {
  auto t = comm::parse_dtype(name);
  if (!t) throw py::value_error("unknown dtype '" + name + "' (f64, f32, bf16, f16, i32, i64, u8)");
  return *t;
}
comm::Buffer buffer(const PyBuffer& b) {
  return {reinterpret_cast<void*>(std::get<0>(b)), std::get<1>(b), dtype_of(std::get<2>(b))};
}
comm::ConstBuffer cbuffer(const PyBuffer& b) {
  return {reinterpret_cast<const void*>(std::get<0>(b)), std::get<1>(b), dtype_of(std::get<2>(b))};
}
comm::ReduceOp reduce_op(const std::string& op) {
  if (op == "sum") return comm::ReduceOp::sum;
  if (op == "avg") return comm::ReduceOp::avg;
  if (op == "max") return comm::ReduceOp::max;
  if (op == "min") return comm::ReduceOp::min;
  if (op == "prod") return comm::ReduceOp::prod;
  throw py::value_error("unknown reduce op '" + op + "' (sum, avg, max, min, prod)");
}

// Ends with the run that made it: its communicators must not be used after World.run returns.
using Alive = std::shared_ptr<std::atomic<bool>>;

class Work {
 public:
  Work(comm::WorkPtr w, Alive alive) : w_(std::move(w)), alive_(std::move(alive)) {}
  void wait() {
    released([&] { w_->wait(); });
  }
  bool is_completed() { return w_->is_completed(); }

 private:
  comm::WorkPtr w_;
  Alive alive_;
};

class Communicator {
 public:
  Communicator(comm::Communicator* c, std::shared_ptr<comm::Communicator> owned, Alive alive)
      : c_(c), owned_(std::move(owned)), alive_(std::move(alive)) {}

  comm::Communicator& get() const {
    if (!alive_->load()) throw std::runtime_error("this communicator's World.run has returned");
    return *c_;
  }
  Work wrap(comm::WorkPtr w) const { return Work(std::move(w), alive_); }
  std::optional<Communicator> child(std::unique_ptr<comm::Communicator> c) const {
    if (!c) return std::nullopt;
    std::shared_ptr<comm::Communicator> owned(std::move(c));
    return Communicator(owned.get(), owned, alive_);
  }
  sim::SimCommunicator& as_sim() const {
    auto* s = dynamic_cast<sim::SimCommunicator*>(&get());
    if (!s) throw std::runtime_error("not a simulator communicator");
    return *s;
  }

 private:
  comm::Communicator* c_;
  std::shared_ptr<comm::Communicator> owned_;  // null for the world communicator of a run
  Alive alive_;
};

struct RunFailure {
  int rank = -1;
  std::string message;
};

class World {
 public:
  World(int ranks, const std::string& options, int max_steps)
      : world_(ranks, make_options(ranks, options, max_steps)) {}

  static sim::SimOptions make_options(int ranks, const std::string& options, int max_steps) {
    if (ranks < 1) throw py::value_error("a world needs at least one rank");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(options);
    } catch (const nlohmann::json::exception& e) {
      throw py::value_error(std::string("options are not JSON: ") + e.what());
    }
    try {
      return harness::sim_world_options(j, ranks, max_steps);
    } catch (...) {
      raise(std::current_exception());
    }
  }

  // Runs fn(communicator) on every rank; raises shardcheck.errors.RankFailure for the first
  // failing rank, from that rank's own exception.
  void run(const py::function& fn) {
    const int n = world_.size();
    std::vector<py::object> raised(static_cast<std::size_t>(n));
    auto alive = std::make_shared<std::atomic<bool>>(true);
    std::optional<RunFailure> failure;
    {
      py::gil_scoped_release nogil;
      try {
        world_.run([&](comm::Communicator& c) {
          py::gil_scoped_acquire gil;
          try {
            fn(Communicator(&c, nullptr, alive));
          } catch (py::error_already_set& e) {
            py::object value = e.value();
            raised[static_cast<std::size_t>(c.world_rank())] = value;
            if (py::hasattr(value, "_cause")) {
              auto* ep = static_cast<std::exception_ptr*>(
                  value.attr("_cause").cast<py::capsule>().get_pointer());
              std::rethrow_exception(*ep);
            }
            throw PythonError(std::string(py::str(py::repr(value))));
          }
        });
      } catch (const sim::RankFailure& f) {
        failure = RunFailure{f.rank(), f.what()};
      } catch (const sim::ThreadStartError& e) {
        failure = RunFailure{-1, e.what()};
      }
    }
    alive->store(false);
    if (!failure) return;
    py::object cause = py::none();
    if (failure->rank >= 0) cause = raised[static_cast<std::size_t>(failure->rank)];
    std::string diagnosis;
    if (world_.diagnosis()) diagnosis = world_.diagnosis()->message;
    py::object exc =
        errors().attr("RankFailure")(failure->message, failure->rank, cause, diagnosis);
    exc.attr("__cause__") = cause;
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
  }

  sim::SimWorld& get() { return world_; }

 private:
  sim::SimWorld world_;
};

py::dict diagnosis_dict(const sim::Diagnosis& d) {
  py::dict o;
  o["kind"] = std::string(sim::name_of(d.kind));
  o["ranks"] = d.ranks;
  o["op"] = d.op;
  o["group"] = d.group;
  o["seq"] = d.seq;
  o["step"] = d.step;
  o["message"] = d.message;
  o["fault"] = d.fault ? py::object(py::str(d.fault->describe())) : py::object(py::none());
  return o;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "shardcheck's deterministic multi-rank simulator (C++), one Python thread per rank";

  py::class_<Work>(m, "Work")
      .def("wait", &Work::wait,
           "Blocks until the op completed on this rank (joins the virtual clock)")
      .def("is_completed", &Work::is_completed);

  py::class_<Communicator>(m, "Communicator")
      .def_property_readonly("rank", [](const Communicator& c) { return c.get().rank(); })
      .def_property_readonly("size", [](const Communicator& c) { return c.get().size(); })
      .def_property_readonly("name", [](const Communicator& c) { return c.get().name(); })
      .def_property_readonly("members", [](const Communicator& c) { return c.get().members(); })
      .def_property_readonly("world_rank",
                             [](const Communicator& c) { return c.get().world_rank(); })
      .def("all_reduce",
           [](const Communicator& c, const PyBuffer& s, const PyBuffer& r, const std::string& op) {
             auto o = comm::ReduceOptions{reduce_op(op)};
             return c.wrap(released([&] { return c.get().all_reduce(cbuffer(s), buffer(r), o); }));
           })
      .def("reduce_scatter",
           [](const Communicator& c, const PyBuffer& s, const PyBuffer& r, const std::string& op) {
             auto o = comm::ReduceOptions{reduce_op(op)};
             return c.wrap(
                 released([&] { return c.get().reduce_scatter(cbuffer(s), buffer(r), o); }));
           })
      .def("all_gather",
           [](const Communicator& c, const PyBuffer& s, const PyBuffer& r) {
             return c.wrap(released([&] { return c.get().all_gather(cbuffer(s), buffer(r)); }));
           })
      .def("broadcast",
           [](const Communicator& c, const PyBuffer& s, const PyBuffer& r, int root) {
             return c.wrap(released(
                 [&] { return c.get().broadcast(cbuffer(s), buffer(r), {.root = root}); }));
           })
      .def(
          "reduce",
          [](const Communicator& c, const PyBuffer& s, const PyBuffer& r, int root,
             const std::string& op) {
            auto o = comm::ReduceOptions{reduce_op(op)};
            return c.wrap(released([&] { return c.get().reduce(cbuffer(s), buffer(r), root, o); }));
          })
      .def("all_to_all",
           [](const Communicator& c, const PyBuffer& s, const PyBuffer& r) {
             return c.wrap(released([&] { return c.get().all_to_all(cbuffer(s), buffer(r)); }));
           })
      .def("all_to_all_v",
           [](const Communicator& c, const PyBuffer& s, const std::vector<std::size_t>& sc,
              const PyBuffer& r, const std::vector<std::size_t>& rc) {
             return c.wrap(
                 released([&] { return c.get().all_to_all_v(cbuffer(s), sc, buffer(r), rc); }));
           })
      .def("send",
           [](const Communicator& c, const PyBuffer& b, int peer, int tag) {
             return c.wrap(released([&] { return c.get().send(cbuffer(b), peer, {.tag = tag}); }));
           })
      .def("recv",
           [](const Communicator& c, const PyBuffer& b, int peer, int tag) {
             return c.wrap(released([&] { return c.get().recv(buffer(b), peer, {.tag = tag}); }));
           })
      .def(
          "barrier",
          [](const Communicator& c) { return c.wrap(released([&] { return c.get().barrier(); })); })
      .def("split",
           [](const Communicator& c, int color, int key, const std::string& name) {
             return c.child(
                 released([&] { return c.get().split(color, key, comm::SplitOptions{name}); }));
           })
      .def("group",
           [](const Communicator& c, const std::string& id, const std::vector<int>& members,
              const std::string& name) {
             auto g = released([&] { return c.as_sim().group(id, members, name); });
             return *c.child(std::move(g));
           })
      .def("compute",
           [](const Communicator& c, const std::string& name, double flops, double bytes) {
             c.get().compute(comm::ComputeCost{.name = name, .flops = flops, .bytes = bytes});
           })
      .def("begin_step", [](const Communicator& c, int step) { c.get().begin_step(step); });

  py::class_<World>(m, "World")
      .def(py::init<int, const std::string&, int>(), py::arg("ranks"), py::arg("options") = "{}",
           py::arg("max_steps") = 1000000)
      .def_property_readonly("size", [](World& w) { return w.get().size(); })
      .def("run", &World::run)
      .def("virtual_time", [](World& w) { return w.get().virtual_time(); })
      .def("diagnosis",
           [](World& w) -> py::object {
             const auto& d = w.get().diagnosis();
             return d ? py::object(diagnosis_dict(*d)) : py::object(py::none());
           })
      .def("fired_faults",
           [](World& w) {
             std::vector<std::string> out;
             for (const auto& f : w.get().fired_faults()) out.push_back(f.describe());
             return out;
           })
      .def("step_times",
           [](World& w) {
             py::list out;
             for (const auto& s : w.get().step_times())
               out.append(py::dict(py::arg("rank") = s.rank, py::arg("step") = s.step,
                                   py::arg("start") = s.start, py::arg("end") = s.end));
             return out;
           })
      .def("timeline", [](World& w) {
        py::list out;
        for (const auto& e : w.get().timeline())
          out.append(py::dict(
              py::arg("rank") = e.rank, py::arg("stream") = std::string(sim::name_of(e.stream)),
              py::arg("kind") = e.kind, py::arg("name") = e.name, py::arg("step") = e.step,
              py::arg("start") = e.start, py::arg("end") = e.end, py::arg("bytes") = e.bytes,
              py::arg("group") = e.group, py::arg("seq") = e.seq));
        return out;
      });
}
