"""The simulator from Python (shardcheck.sim over shardcheck._core): results in rank order and
bitwise reproducible, the simulator's errors as typed exceptions that keep rank, group, op and
sequence number, faults, bad options naming their JSON path, and the Perfetto trace."""

import json

import numpy as np
import pytest

from shardcheck import errors, sim


def run(world, fn):
    out = {}
    world.run(lambda c: out.__setitem__(c.rank, fn(c)))
    return [out[r] for r in range(world.size)]


def cause(world, fn):
    with pytest.raises(errors.RankFailure) as info:
        world.run(fn)
    return info.value


def noisy(rank):
    return np.random.default_rng(rank).standard_normal(1000).astype(np.float32) * 10 ** rank


def test_all_reduce_sums_in_rank_order_and_is_bitwise_reproducible():
    def fn(c):
        c.begin_step(1)
        a = noisy(c.rank)
        c.all_reduce(sim.buffer(a), sim.buffer(a), "sum").wait()
        return a

    expected = noisy(0)
    for r in range(1, 4):
        expected = expected + noisy(r)  # left to right, in f32, as the simulator reduces
    first = run(sim.World(4), fn)
    for _ in range(3):
        again = run(sim.World(4), fn)
        for a, b in zip(first, again):
            assert a.tobytes() == b.tobytes()
    assert first[0].tobytes() == expected.tobytes()
    assert all(a.tobytes() == first[0].tobytes() for a in first)


def test_split_groups_and_id_keyed_groups():
    def fn(c):
        c.begin_step(1)
        half = c.split(c.rank % 2, c.rank, "half")
        x = np.array([float(c.rank)])
        half.all_reduce(sim.buffer(x), sim.buffer(x), "sum")
        y = np.array([1.0])
        if c.rank != 1:
            g = c.group("g", [3, 0, 2], "three")
            g.all_reduce(sim.buffer(y), sim.buffer(y), "sum")
        return half.members, x[0], y[0]

    got = run(sim.World(4), fn)
    assert got[0] == ([0, 2], 2.0, 3.0)
    assert got[1] == ([1, 3], 4.0, 1.0)
    assert got[3] == ([1, 3], 4.0, 3.0)


def test_mismatch_names_both_ranks_and_the_op():
    def fn(c):
        c.begin_step(1)
        a = np.zeros(4 if c.rank == 2 else 8, dtype=np.float32)
        c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")

    f = cause(sim.World(4), fn)
    assert isinstance(f.cause, errors.MismatchError)
    assert 2 in f.cause.ranks and len(f.cause.ranks) == 2
    assert (f.cause.group, f.cause.op, f.cause.seq) == ("world", "all_reduce", 0)
    assert "count=4" in str(f.cause) and "count=8" in str(f.cause)


def test_a_rank_that_never_arrives_is_a_deadlock_naming_it():
    def fn(c):
        c.begin_step(1)
        a = np.zeros(2)
        if c.rank != 2:
            c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")

    w = sim.World(4)
    f = cause(w, fn)
    assert isinstance(f.cause, errors.DeadlockError)
    assert f.cause.missing == [2]
    assert w.diagnosis()["kind"] == "deadlock"
    assert "rank 2 never arrived" in f.diagnosis


@pytest.mark.parametrize("kind,cls", [("crash", errors.InjectedCrash),
                                      ("hang", errors.DeadlockError)])
def test_faults_fire_on_the_named_rank_step_and_op(kind, cls):
    def fn(c):
        for step in (1, 2):
            c.begin_step(step)
            a = np.ones(2)
            c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")
            c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")

    w = sim.World(3, faults=[{"kind": kind, "rank": 1, "step": 2, "op_index": 1}])
    f = cause(w, fn)
    assert w.fired_faults() and "rank 1" in w.fired_faults()[0]
    assert isinstance(f.cause, cls) or isinstance(f.__cause__, cls)
    assert w.diagnosis()["step"] == 2


def test_corrupt_payload_changes_the_result_and_nothing_else():
    def fn(c):
        c.begin_step(1)
        a = np.arange(16, dtype=np.float64) * (c.rank + 1)
        c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")
        return a

    clean = run(sim.World(2), fn)
    bad = run(sim.World(2, faults=[{"kind": "corrupt_payload", "rank": 0, "step": 1,
                                    "op_index": 0}]), fn)
    assert (clean[0] != bad[0]).sum() == 1


def test_a_python_error_on_one_rank_ends_the_run_with_that_error():
    def fn(c):
        c.begin_step(1)
        if c.rank == 1:
            raise KeyError("mine")
        a = np.zeros(2)
        c.all_reduce(sim.buffer(a), sim.buffer(a), "sum")

    f = cause(sim.World(3), fn)
    assert f.rank == 1 and isinstance(f.cause, KeyError)


def test_bad_options_name_their_json_path():
    with pytest.raises(errors.ConfigError, match=r"faults\[0\]\.rank"):
        sim.World(4, faults=[{"kind": "crash", "rank": 9, "step": 1, "op_index": 0}])
    with pytest.raises(errors.ConfigError, match="topology"):
        sim.World(4, topology={"gpus_per_node": "eight"})


def test_timeline_and_trace(tmp_path):
    def fn(c):
        c.begin_step(1)
        c.compute("matmul", 1e9, 0)
        a = np.zeros(1024, dtype=np.float32)
        c.all_reduce(sim.buffer(a), sim.buffer(a), "sum").wait()

    w = sim.World(2)
    w.run(fn)
    comm = [e for e in w.timeline() if e["stream"] == "comm"]
    assert [e["rank"] for e in comm] == [0, 1] or sorted(e["rank"] for e in comm) == [0, 1]
    assert all(e["name"] == "all_reduce" and e["bytes"] == 4096 for e in comm)
    assert w.virtual_time() > 0
    path = tmp_path / "trace.json"
    w.write_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("name") == "all_reduce"} == {0, 1}
