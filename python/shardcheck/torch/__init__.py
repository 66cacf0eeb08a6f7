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

Steps: step 1 begins with fn, and each optimizer.step() on a rank begins that rank's next step
(torch.optim's global post-step hook), so faults keyed by step fire where intended and the
timeline shows steps with no change to the script. A job with several optimizers per rank, or
none, passes auto_steps=False and calls begin_step(n) itself.

nan_gradient faults are injected here, above the simulator (as the C++ harness injects them above
its engines): at the fault's step, the rank's first floating-point reduction issued during
backward (DDP's gradient buckets, FSDP2's reduce-scatters) gets a NaN in its first element before
it is reduced. Jobs that reduce gradients only after backward returns are not reached by it."""

import datetime
import threading

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
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
    return ShardcheckProcessGroup(comm, dist_opts.group_rank, dist_opts.group_size, _state())


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


class RankState:
    """What the backend keeps per rank beside its communicator: the step it is in and the steps
    of its nan_gradient faults (fired ones are listed in Results.nan_fired)."""

    def __init__(self, rank, nan_steps, fired, auto_steps):
        self.rank = rank
        self.step = 1
        self.auto_steps = auto_steps
        self.nan_steps = set(nan_steps)
        self.fired = fired

    def take_nan(self):
        """True once per nan_gradient step, for the first call made during backward."""
        if self.step in self.nan_steps and torch._C._current_graph_task_id() != -1:
            self.nan_steps.discard(self.step)
            self.fired.append(f"nan_gradient on rank {self.rank} at step {self.step}")
            return True
        return False


def _state():
    return getattr(_local, "state", None)


def begin_step(step):
    """Training step `step` (1-based) begins on the calling rank (again: nothing happens)."""
    comm = _communicator()
    if step != _local.state.step:
        comm.begin_step(step)
        _local.state.step = step


def _after_optimizer_step(optimizer, args, kwargs):
    state = _state()
    if state is not None and state.auto_steps:
        begin_step(state.step + 1)


def compute(name, flops=0.0, bytes=0.0):
    """Advances the calling rank's virtual compute clock by the simulator's cost of a kernel."""
    _communicator().compute(name, float(flops), float(bytes))


def full_params(module):
    """{name: full tensor} of a module's state dict: DTensors (FSDP2, TP) gathered with
    full_tensor(), which is collective (every rank of their mesh calls it), others as they are."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in module.state_dict().items()}


class Results(list):
    """fn's return value on each rank, in rank order; `world` is the simulated world of the run
    (timeline(), step_times(), virtual_time(), fired_faults(), trace()); nan_fired lists the
    nan_gradient faults that fired."""

    world = None
    nan_fired = ()


_spawn_lock = threading.Lock()


def spawn(fn, world_size, *, topology=None, faults=None, health=None, trace=None, seed=None,
          timeout=datetime.timedelta(seconds=120), auto_steps=True):
    """Runs fn(rank) on world_size simulated ranks with torch.distributed initialised on the
    `shardcheck` backend; returns Results. Raises RankFailure for the first failing rank.
    topology, faults and health take the scenario's JSON vocabulary (scenarios/README.md);
    trace, a path, receives the run's Perfetto trace (also after a failure); timeout bounds
    what the simulator cannot see (the store's waits inside new_group)."""
    world = sim.World(world_size, topology=topology, faults=faults, health=health, seed=seed)
    out = Results([None] * world_size)
    out.world = world
    out.nan_fired = []
    nan_steps = {r: [f.get("step", 1) for f in (faults or [])
                     if f.get("kind") == "nan_gradient" and f.get("rank") == r]
                 for r in range(world_size)}
    with _spawn_lock:
        old_world = dist.distributed_c10d._world
        dist.distributed_c10d._world = ThreadLocalWorld()
        store = dist.HashStore()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        threads_ctx = torch.autograd.set_multithreading_enabled(False)
        step_hook = register_optimizer_step_post_hook(_after_optimizer_step)

        def rank_main(comm):
            _local.comm = comm
            _local.state = RankState(comm.rank, nan_steps[comm.rank], out.nan_fired, auto_steps)
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
                _local.state = None

        try:
            world.run(rank_main)
        finally:
            step_hook.remove()
            threads_ctx.__exit__(None, None, None)
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            dist.distributed_c10d._world = old_world
            if trace is not None:
                world.write_trace(trace)
    return out
