"""The `shardcheck` torch.distributed backend under shardcheck.torch.spawn: every collective the
c10d front end, DDP, FSDP2, DTensor and pipelining issue (both method-name families, PREMUL_SUM,
bool, non-contiguous tensors, subgroups, objects, batched p2p), bitwise reproducible results,
MismatchError / DeadlockError / injected faults on a torch job, and its trace."""

import json

import pytest
import torch
import torch.distributed as dist

import shardcheck.torch as sct
from shardcheck import errors

N = 4


def spawn(fn, n=N, **kw):
    return sct.spawn(fn, n, **kw)


def failure(fn, n=N, **kw):
    with pytest.raises(errors.RankFailure) as info:
        spawn(fn, n, **kw)
    return info.value


def test_collectives_of_the_c10d_front_end():
    def fn(rank):
        out = {}
        t = torch.arange(6, dtype=torch.float32) + rank
        dist.all_reduce(t)
        out["all_reduce"] = t
        m = torch.tensor([float(rank)])
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        out["max"] = m
        a = torch.tensor([2.0 * (rank + 1)])
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        out["avg"] = a
        lst = [torch.empty(2) for _ in range(N)]
        dist.all_gather(lst, torch.full((2,), float(rank)))
        out["all_gather"] = torch.stack(lst)
        big = torch.empty(2 * N)
        dist.all_gather_into_tensor(big, torch.full((2,), float(rank)))
        out["all_gather_into_tensor"] = big
        rs = torch.empty(2)
        dist.reduce_scatter_tensor(rs, torch.arange(2.0 * N))
        out["reduce_scatter_tensor"] = rs
        rl = torch.empty(2)
        dist.reduce_scatter(rl, [torch.full((2,), float(i + rank)) for i in range(N)])
        out["reduce_scatter"] = rl
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=2)
        out["broadcast"] = b
        r = torch.tensor([float(rank + 1)])
        dist.reduce(r, dst=1)
        out["reduce"] = r
        a2a = torch.empty(N)
        dist.all_to_all_single(a2a, torch.arange(float(N)) + 10 * rank)
        out["all_to_all_single"] = a2a
        # uneven splits: rank r sends i + 1 rows to rank i
        send = torch.full((sum(range(1, N + 1)), 2), float(rank))
        recv = torch.empty(((rank + 1) * N, 2))
        dist.all_to_all_single(recv, send, [rank + 1] * N, list(range(1, N + 1)))
        out["all_to_all_v"] = recv[:, 0]
        outs = [torch.empty(1) for _ in range(N)]
        dist.all_to_all(outs, [torch.tensor([float(rank * 10 + i)]) for i in range(N)])
        out["all_to_all"] = torch.cat(outs)
        gl = [torch.empty(1) for _ in range(N)] if rank == 0 else None
        dist.gather(torch.tensor([float(rank)]), gl, dst=0)
        out["gather"] = torch.cat(gl) if gl else None
        sc = torch.empty(1)
        dist.scatter(sc, [torch.tensor([float(i * 7)]) for i in range(N)] if rank == 3 else None,
                     src=3)
        out["scatter"] = sc
        objs = [None] * N
        dist.all_gather_object(objs, {"rank": rank})
        out["objects"] = objs
        bl = [rank * 10, "x"]
        dist.broadcast_object_list(bl, src=2)
        out["broadcast_object"] = bl
        dist.barrier()
        return out

    res = spawn(fn)
    for rank, o in enumerate(res):
        assert o["all_reduce"].tolist() == [6.0 + 4 * i for i in range(6)]
        assert o["max"].item() == 3.0 and o["avg"].item() == 5.0
        assert o["all_gather"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert o["all_gather_into_tensor"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        assert o["reduce_scatter_tensor"].tolist() == [8.0 * rank, 8.0 * rank + 4]
        assert o["reduce_scatter"].tolist() == [4.0 * rank + 6] * 2
        assert o["broadcast"].tolist() == [2.0] * 3
        if rank == 1:
            assert o["reduce"].item() == 10.0
        assert o["all_to_all_single"].tolist() == [rank + 10.0 * i for i in range(N)]
        assert o["all_to_all_v"].tolist() == sum(([float(i)] * (rank + 1) for i in range(N)), [])
        assert o["all_to_all"].tolist() == [10.0 * i + rank for i in range(N)]
        assert o["scatter"].item() == 7.0 * rank
        assert o["objects"] == [{"rank": r} for r in range(N)]
        assert o["broadcast_object"] == [20, "x"]
    assert res[0]["gather"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_both_method_name_families_premul_sum_bool_and_strided():
    def fn(rank):
        pg = dist.group.WORLD
        o = {}
        for name in ("all_gather_single", "_allgather_base"):
            out = torch.empty(N)
            getattr(pg, name)(out, torch.tensor([float(rank)])).wait()
            o[name] = out.tolist()
        for name in ("reduce_scatter_single", "_reduce_scatter_base"):
            out = torch.empty(1)
            getattr(pg, name)(out, torch.arange(float(N))).wait()
            o[name] = out.item()
        for name in ("all_gather_single_coalesced", "allgather_into_tensor_coalesced"):
            outs = [torch.empty(N), torch.empty(2 * N)]
            getattr(pg, name)(outs, [torch.tensor([1.0 * rank]), torch.ones(2)]).wait()
            o[name] = [x.tolist() for x in outs]
        for name in ("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced"):
            outs = [torch.empty(1), torch.empty(1)]
            getattr(pg, name)(outs, [torch.ones(N), torch.arange(float(N))]).wait()
            o[name] = [x.item() for x in outs]
        for name in ("all_to_all_single", "alltoall_base"):
            out = torch.empty(N)
            getattr(pg, name)(out, torch.arange(float(N)) + 10 * rank, [], []).wait()
            o[name] = out.tolist()
        p = torch.full((2,), 2.0 * (rank + 1), dtype=torch.float64)
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.25))
        o["premul"] = p.tolist()
        b = torch.tensor([rank == 1, False])
        dist.all_reduce(b)
        o["bool"] = b.tolist()
        s = torch.zeros(3, 4)[:, 1]  # a strided view
        s += rank
        dist.all_reduce(s)
        o["strided"] = s.tolist()
        return o

    for rank, o in enumerate(spawn(fn)):
        assert o["all_gather_single"] == o["_allgather_base"] == [0.0, 1.0, 2.0, 3.0]
        assert o["reduce_scatter_single"] == o["_reduce_scatter_base"] == 4.0 * rank
        assert o["all_gather_single_coalesced"] == o["allgather_into_tensor_coalesced"]
        assert o["all_gather_single_coalesced"][0] == [0.0, 1.0, 2.0, 3.0]
        assert o["reduce_scatter_single_coalesced"] == o["reduce_scatter_tensor_coalesced"] == \
            [4.0, 4.0 * rank]
        assert o["all_to_all_single"] == o["alltoall_base"] == [rank + 10.0 * i for i in range(N)]
        assert o["premul"] == [0.25 * 2 * (1 + 2 + 3 + 4)] * 2
        assert o["bool"] == [True, False]
        assert o["strided"] == [6.0] * 3


def test_subgroups_device_mesh_and_batched_p2p():
    from torch.distributed.device_mesh import init_device_mesh

    def fn(rank):
        g = dist.new_group([0, 2])
        x = torch.tensor([float(rank)])
        if rank in (0, 2):
            dist.all_reduce(x, group=g)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        y = torch.tensor([float(rank)])
        dist.all_reduce(y, group=mesh.get_group("tp"))
        nxt, prv = (rank + 1) % N, (rank - 1) % N
        send, recv = torch.full((2,), float(rank)), torch.empty(2)
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if rank == 0:
            dist.send_object_list([{"from": 0}], dst=1)
            obj = None
        elif rank == 1:
            got = [None]
            dist.recv_object_list(got, src=0)
            obj = got[0]
        else:
            obj = None
        return x.item(), y.item(), recv.tolist(), obj

    res = spawn(fn)
    assert [r[0] for r in res] == [2.0, 1.0, 2.0, 3.0]
    assert [r[1] for r in res] == [1.0, 1.0, 5.0, 5.0]
    assert [r[2] for r in res] == [[3.0, 3.0], [0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert res[1][3] == {"from": 0}


def test_a_ddp_job_is_bitwise_reproducible():
    import ddp

    runs = [spawn(lambda r: ddp.train(r, N))[0] for _ in range(2)]
    for name, p in runs[0]["params"].items():
        assert torch.equal(p, runs[1]["params"][name]), name
    assert runs[0]["loss"] == runs[1]["loss"]


def test_a_mismatched_count_is_a_mismatch_error_naming_both_ranks():
    def fn(rank):
        dist.all_reduce(torch.ones(3 if rank == 1 else 4))

    f = failure(fn)
    assert isinstance(f.cause, errors.MismatchError)
    assert 1 in f.cause.ranks and len(f.cause.ranks) == 2
    assert f.cause.op == "all_reduce" and f.cause.seq == 0


def test_reduce_to_a_dst_the_ranks_disagree_on_is_a_mismatch_naming_both():
    def fn(rank):
        dist.reduce(torch.tensor([float(rank + 1)]), dst=2 if rank == 3 else 1)

    f = failure(fn)
    assert isinstance(f.cause, errors.MismatchError)
    assert 3 in f.cause.ranks and len(f.cause.ranks) == 2
    assert f.cause.op == "reduce" and f.cause.seq == 0
    assert "root=2" in str(f.cause) and "root=1" in str(f.cause)


def test_gather_and_scatter_to_a_root_the_ranks_disagree_on_are_mismatches_naming_both():
    def gather(rank):
        gl = [torch.empty(1) for _ in range(4)] if rank in (1, 2) else None
        dist.gather(torch.tensor([float(rank)]), gl, dst=2 if rank == 2 else 1)

    f = failure(gather)
    assert isinstance(f.cause, errors.MismatchError)
    assert 2 in f.cause.ranks and len(f.cause.ranks) == 2
    assert f.cause.op == "reduce" and f.cause.seq == 0
    assert "root=2" in str(f.cause) and "root=1" in str(f.cause)

    def scatter(rank):
        src = 0 if rank == 3 else 1
        sc = torch.empty(1)
        dist.scatter(sc, [torch.tensor([float(i)]) for i in range(4)] if rank == src else None,
                     src=src)

    f = failure(scatter)
    assert isinstance(f.cause, errors.MismatchError)
    assert 3 in f.cause.ranks and len(f.cause.ranks) == 2
    assert f.cause.op == "broadcast" and f.cause.seq == 0


def test_reduce_to_an_agreed_dst_changes_only_the_dst():
    def fn(rank):
        t = torch.arange(4, dtype=torch.float32) + rank
        dist.reduce(t, dst=2)
        m = torch.tensor([float(rank)])
        dist.reduce(m, dst=3, op=dist.ReduceOp.MAX)
        b = torch.tensor([rank == 1, False])
        dist.reduce(b, dst=0, op=dist.ReduceOp.MAX)
        s = (torch.arange(8.0) + rank).view(4, 2)[:, 0]  # strided
        dist.reduce(s, dst=1)
        return t, m, b, s

    res = spawn(fn)
    for rank, (t, m, b, s) in enumerate(res):
        assert t.tolist() == ([6.0 + 4 * i for i in range(4)] if rank == 2 else
                              [float(rank + i) for i in range(4)])
        assert m.item() == (3.0 if rank == 3 else float(rank))
        assert b.tolist() == ([True, False] if rank == 0 else [rank == 1, False])
        assert s.tolist() == ([6.0 + 8 * i for i in range(4)] if rank == 1 else
                              [float(rank + 2 * i) for i in range(4)])


def test_a_rank_that_skips_a_collective_is_a_deadlock_naming_it():
    def fn(rank):
        if rank != 3:
            dist.all_reduce(torch.ones(4))

    f = failure(fn)
    assert isinstance(f.cause, errors.DeadlockError)
    assert f.cause.missing == [3]
    assert "rank 3" in f.diagnosis


def steps_of_all_reduce(rank):
    for step in (1, 2):
        if step > 1:
            sct.begin_step(step)
        sct.compute("forward", flops=1e12)
        t = torch.arange(8, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(t)
    return t


@pytest.mark.parametrize("kind,cls", [("crash", errors.InjectedCrash),
                                      ("hang", errors.DeadlockError)])
def test_crash_and_hang_faults_on_a_torch_job(kind, cls):
    f = failure(steps_of_all_reduce,
                faults=[{"kind": kind, "rank": 2, "step": 2, "op_index": 0}])
    assert isinstance(f.cause, cls) or isinstance(f.__cause__, cls)
    assert "rank 2" in str(f) + f.diagnosis


def test_straggler_and_corruption_faults_on_a_torch_job():
    clean = spawn(steps_of_all_reduce)
    slow = spawn(steps_of_all_reduce, faults=[{"kind": "straggler", "rank": 1, "slowdown": 3.0}])
    assert slow.world.virtual_time() > 2 * clean.world.virtual_time()
    assert torch.equal(slow[0], clean[0])
    bad = spawn(steps_of_all_reduce,
                faults=[{"kind": "corrupt_payload", "rank": 0, "step": 2, "op_index": 0}])
    assert int((bad[0] != clean[0]).sum()) == 1


def test_the_jobs_collectives_are_on_the_timeline_and_in_the_trace(tmp_path):
    path = tmp_path / "trace.json"
    res = spawn(steps_of_all_reduce, trace=str(path))
    comm = [e for e in res.world.timeline() if e["stream"] == "comm"]
    assert sorted((e["rank"], e["step"]) for e in comm) == \
        sorted((r, s) for r in range(N) for s in (1, 2))
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("name") == "all_reduce"} == set(range(N))


def test_the_backend_refuses_use_outside_spawn():
    with pytest.raises(RuntimeError, match="inside shardcheck.torch.spawn"):
        sct.begin_step(1)


@pytest.mark.parametrize("module", ["ddp", "fsdp2"])
def test_nan_gradient_fault_reaches_the_gradient_reduction(module):
    train = __import__(module).train
    clean = spawn(lambda r: train(r, N))
    res = spawn(lambda r: train(r, N), faults=[{"kind": "nan_gradient", "rank": 1, "step": 2}])
    assert res.nan_fired == ["nan_gradient on rank 1 at step 2"]
    for rec in res:
        assert rec["grad_norm"][0] == clean[0]["grad_norm"][0]
        assert rec["grad_norm"][1] != rec["grad_norm"][1]  # NaN on every rank after the reduction


def test_steps_follow_optimizer_step_in_an_unmodified_script():
    import ddp

    res = spawn(lambda r: ddp.train(r, N))
    steps = {e["step"] for e in res.world.timeline() if e["stream"] == "comm"}
    assert {1, 2, 3} <= steps
    f = failure(lambda r: ddp.train(r, N),
                faults=[{"kind": "hang", "rank": 3, "step": 3, "op_index": 1}])
    assert "Rank 3 hung (injected hang fault at step 3, op 1" in f.diagnosis


def test_functional_collectives_go_through_the_backend():
    import torch.distributed._functional_collectives as funcol

    def fn(rank):
        w = dist.group.WORLD
        return (funcol.all_reduce(torch.ones(2) * rank, "sum", w).tolist(),
                funcol.all_gather_tensor(torch.tensor([float(rank)]), 0, w).tolist(),
                funcol.reduce_scatter_tensor(torch.arange(float(N)), "sum", 0, w).tolist(),
                funcol.all_to_all_single(torch.arange(float(N)) + 10 * rank, None, None,
                                         w).tolist())

    res = spawn(fn)
    for rank, (ar, ag, rs, a2a) in enumerate(res):
        assert ar == [6.0, 6.0] and ag == [0.0, 1.0, 2.0, 3.0] and rs == [4.0 * rank]
        assert a2a == [rank + 10.0 * i for i in range(N)]
    assert len([e for e in res.world.timeline() if e["rank"] == 0]) == 4


@pytest.mark.parametrize("kwargs,error,text", [
    ({"world_size": 0}, ValueError, "at least one rank"),
    ({"world_size": 2, "faults": [{"kind": "crash", "rank": 5, "step": 1}]}, errors.ConfigError,
     r"\$\.faults\[0\]\.rank: expected an integer in \[0, 1\], got 5"),
    ({"world_size": 2, "faults": [{"kind": "bogus", "rank": 0}]}, errors.ConfigError,
     r"\$\.faults\[0\]\.kind: expected one of"),
    ({"world_size": 2, "faults": "crash"}, errors.ConfigError, r"\$\.faults: expected an array"),
    ({"world_size": 2, "topology": {"nope": 1}}, errors.ConfigError,
     r"\$\.topology\.nope: unknown key"),
])
def test_bad_launch_options_are_refused_before_any_rank_runs(kwargs, error, text):
    ran = []
    with pytest.raises(error, match=text):
        sct.spawn(lambda r: ran.append(r), **kwargs)
    assert ran == []
