"""The simulator from Python: a World of N ranks with its topology, faults and health checks (the
scenario's JSON vocabulary, scenarios/README.md), run with one Python function per rank on the
simulator's threads, and what the run leaves: the virtual timeline, step times, the faults that
fired, the diagnosis of a failed run, and a Perfetto (Chrome Trace Event Format) trace.

Buffers are host memory given as (address, element count, dtype name); `buffer()` makes one of a
contiguous NumPy array or CPU torch tensor."""

import json

from .errors import ConfigError  # noqa: F401  (re-exported: World's bad options raise it)

try:
    from . import _core
except ImportError as _missing:  # not built: buffer() and dtype_name() still work, World does not
    _core, _core_error = None, _missing

Communicator = getattr(_core, "Communicator", None)
Work = getattr(_core, "Work", None)

_NUMPY = {
    "float64": "f64", "float32": "f32", "float16": "f16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "bool": "u8",
}
_TORCH = {
    "torch.float64": "f64", "torch.float32": "f32", "torch.bfloat16": "bf16",
    "torch.float16": "f16", "torch.int32": "i32", "torch.int64": "i64", "torch.uint8": "u8",
    "torch.bool": "u8",
}


def dtype_name(t):
    """The simulator's dtype name of a NumPy dtype or torch.dtype; TypeError for one it lacks."""
    name = _TORCH.get(str(t)) or _NUMPY.get(str(t))
    if name is None:
        raise TypeError(f"the simulator carries f64, f32, bf16, f16, i32, i64 and u8, not {t}")
    return name


def buffer(x):
    """(address, count, dtype) of a contiguous NumPy array or CPU torch tensor (not copied)."""
    if hasattr(x, "data_ptr"):  # torch
        if x.device.type != "cpu" or not x.is_contiguous():
            raise ValueError("the simulator needs contiguous CPU tensors")
        return (x.data_ptr(), x.numel(), dtype_name(x.dtype))
    if not x.flags["C_CONTIGUOUS"]:
        raise ValueError("the simulator needs C-contiguous arrays")
    return (x.ctypes.data, x.size, dtype_name(x.dtype))


class World:
    """N simulated ranks. topology/faults/health are the scenario's objects (dicts); a bad one
    raises ConfigError naming its JSON path. Faults are keyed by step (1-based, as each rank's
    Communicator.begin_step numbers them) and op_index (the rank's ops since that step began)."""

    def __init__(self, ranks, *, topology=None, faults=None, health=None, seed=None,
                 max_steps=1_000_000):
        if _core is None:
            raise ImportError("shardcheck._core is not built: run scripts/setup, then build the "
                              "default preset (or set SHARDCHECK_BUILD_DIR)") from _core_error
        options = {}
        if topology is not None:
            options["topology"] = topology
        if faults is not None:
            options["faults"] = list(faults) if isinstance(faults, tuple) else faults
        if health is not None:
            options["health"] = health
        if seed is not None:
            options["seed"] = seed
        self._world = _core.World(ranks, json.dumps(options), max_steps)

    @property
    def size(self):
        return self._world.size

    def run(self, fn):
        """fn(communicator) on every rank, each on its own thread. Raises
        shardcheck.errors.RankFailure (rank, cause, diagnosis) for the first failing rank."""
        self._world.run(fn)

    def timeline(self):
        """One dict per op per rank: rank, stream, kind, name, step, start, end (virtual
        seconds), bytes, group, seq."""
        return self._world.timeline()

    def step_times(self):
        return self._world.step_times()

    def virtual_time(self):
        return self._world.virtual_time()

    def diagnosis(self):
        """None after a run that succeeded; else kind, ranks, op, group, seq, step, message."""
        return self._world.diagnosis()

    def fired_faults(self):
        return self._world.fired_faults()

    def trace(self):
        """The last run's timeline in the Chrome Trace Event Format (Perfetto opens it): a
        process per rank, a thread per stream, times in microseconds of the virtual clock."""
        events = []
        for r in range(self.size):
            events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                           "args": {"name": f"rank {r}"}})
            for tid, stream in enumerate(("compute", "comm")):
                events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                               "args": {"name": stream}})
        for e in self.timeline():
            args = {"step": e["step"], "bytes": e["bytes"]}
            if e["stream"] == "comm":
                args.update(group=e["group"], seq=e["seq"])
            events.append({"ph": "X", "name": e["name"], "cat": e["kind"], "pid": e["rank"],
                           "tid": 0 if e["stream"] == "compute" else 1,
                           "ts": e["start"] * 1e6, "dur": (e["end"] - e["start"]) * 1e6,
                           "args": args})
        for s in self.step_times():
            events.append({"ph": "i", "s": "p", "name": f"step {s['step']}", "pid": s["rank"],
                           "tid": 0, "ts": s["start"] * 1e6})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"clock": "shardcheck virtual time",
                              "faults_fired": self.fired_faults()}}

    def write_trace(self, path):
        with open(path, "w") as f:
            json.dump(self.trace(), f)
