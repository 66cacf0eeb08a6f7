"""shardcheck under torch.distributed: the `shardcheck` backend and a launcher.

    import shardcheck.torch as sct

    def train(rank):
        # torch.distributed is initialised on the `shardcheck` backend already
        model = DDP(Net())
        ...
        return loss.item()

    losses = sct.spawn(train, 4, faults=[{"kind": "straggler", "rank": 2, ...}], trace="t.json")

spawn runs fn(rank) on every rank, one thread per rank in this process, as PyTorch's threaded
test backend does (a thread-local c10d world, thread-isolation mode, one in-memory store), over
the simulator's ranks: reductions in rank order (bitwise the same run to run), MismatchError,
DeadlockError and fault injection as on the C++ engine, every op on the virtual timeline. The
first failing rank's error is raised as shardcheck.errors.RankFailure with the run's diagnosis;
its `cause` is the rank's own exception (a shardcheck.errors.CommError subclass for the
simulator's errors, which keeps rank, group, op and sequence number).

Steps: step 1 begins with fn; call begin_step(n) at the top of each later training step so that
faults keyed by step fire where intended and the timeline shows steps."""

import datetime
import threading

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.multi_threaded_pg import ThreadLocalWorld

from .. import sim
from ..errors import RankFailure  # noqa: F401  (spawn raises it)
from . import checkpoint  # noqa: F401  (sct.checkpoint: DCP save/verify/load with a seal)
from .backend import ShardcheckProcessGroup, ShardcheckWork  # noqa: F401

BACKEND = "shardcheck"
_local = threading.local()


def _communicator():
    comm = getattr(_local, "comm", None)
    if comm is None:
        raise RuntimeError("the shardcheck backend runs only inside shardcheck.torch.spawn")
    return comm


def _create(dist_opts, backend_opts):
    """Backend creator (extended API): the group's ranks, in group-rank order, come as global
    ranks; an empty list is the whole world. Groups are keyed by torch's group name, the same on
    every member."""
    world = _communicator()
    members = list(dist_opts.global_ranks_in_group)
    if not members or members == list(range(world.size)):
        comm = world
    else:
        name = str(dist_opts.group_id)
        comm = world.group(name, members, f"pg{name}")
    return ShardcheckProcessGroup(comm, dist_opts.group_rank, dist_opts.group_size)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


def begin_step(step):
    """Training step `step` (1-based) begins on the calling rank."""
    _communicator().begin_step(step)


def compute(name, flops=0.0, bytes=0.0):
    """Advances the calling rank's virtual compute clock by the simulator's cost of a kernel."""
    _communicator().compute(name, float(flops), float(bytes))


class Results(list):
    """fn's return value on each rank, in rank order; `world` is the simulated world of the run
    (timeline(), step_times(), virtual_time(), fired_faults(), trace())."""

    world = None


_spawn_lock = threading.Lock()


def spawn(fn, world_size, *, topology=None, faults=None, health=None, trace=None, seed=None,
          timeout=datetime.timedelta(seconds=120)):
    """Runs fn(rank) on world_size simulated ranks with torch.distributed initialised on the
    `shardcheck` backend; returns Results. Raises RankFailure for the first failing rank.
    topology, faults and health take the scenario's JSON vocabulary (scenarios/README.md);
    trace, a path, receives the run's Perfetto trace (also after a failure); timeout bounds
    what the simulator cannot see (the store's waits inside new_group)."""
    world = sim.World(world_size, topology=topology, faults=faults, health=health, seed=seed)
    out = Results([None] * world_size)
    out.world = world
    with _spawn_lock:
        old_world = dist.distributed_c10d._world
        dist.distributed_c10d._world = ThreadLocalWorld()
        store = dist.HashStore()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        threads_ctx = torch.autograd.set_multithreading_enabled(False)

        def rank_main(comm):
            _local.comm = comm
            try:
                dist.init_process_group(BACKEND, rank=comm.rank, world_size=world_size,
                                        store=store, timeout=timeout)
                try:
                    comm.begin_step(1)
                    out[comm.rank] = fn(comm.rank)
                finally:
                    dist.destroy_process_group()
            finally:
                _local.comm = None

        try:
            world.run(rank_main)
        finally:
            threads_ctx.__exit__(None, None, None)
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            dist.distributed_c10d._world = old_world
            if trace is not None:
                world.write_trace(trace)
    return out
