"""The `shardcheck` torch.distributed backend: a ProcessGroup whose every collective and
point-to-point op runs on the simulator's communicator of the calling rank (one thread per rank,
shardcheck.torch.spawn). Reductions happen in rank order, so results are bitwise the same run to
run; a mismatched op, count or dtype is a MismatchError on every member; a rank that never
arrives is a DeadlockError naming it; faults fire as on the C++ engine; every op lands on the
virtual timeline.

Both families of method names are implemented: those torch 2.13 calls (all_gather_single,
reduce_scatter_single, all_to_all_single, all_gather_single_coalesced,
reduce_scatter_single_coalesced) and the names before it (_allgather_base, _reduce_scatter_base,
alltoall_base, allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced).

Tensors must be on the CPU. Non-contiguous tensors are copied in and out; bool travels as u8.
reduce is the simulator's rooted reduce (a root mismatch across ranks is a MismatchError). gather
and scatter are carried by all_gather and broadcast (the simulator has no rooted gather or
scatter), so they appear under those names on the timeline; scatter's root is broadcast's, and
gather first issues a one-element rooted reduce to its dst, so ranks that disagree on the root of
either are a MismatchError naming both (op "broadcast" or "reduce")."""

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.futures import Future

from .. import sim

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.MAX: "max", _RED.MIN: "min",
        _RED.PRODUCT: "prod", _RED.PREMUL_SUM: "sum"}
# Bitwise reductions on bool are the logical ones, which u8 max/min carry.
_BOOL_OPS = {_RED.SUM: "max", _RED.MAX: "max", _RED.BOR: "max", _RED.MIN: "min",
             _RED.BAND: "min", _RED.PRODUCT: "min"}


class ShardcheckWork(dist.Work):
    """The simulator's Work handles of one torch op. The data is in place when the op returns
    (the simulator completes collectives at the rendezvous); wait() joins the rank's virtual
    clock to the ops' end, and for a receive first blocks until the matching send arrived.
    `after` runs once waited (copies out of staging buffers)."""

    def __init__(self, works, result=None, after=None, keep=None):
        super().__init__()
        self._works = list(works)
        self._result = result
        self._after = after
        self._keep = keep  # tensors a pending send or recv reads or writes
        self._done = False

    def wait(self, timeout=None):
        if not self._done:
            for w in self._works:
                w.wait()
            self._done = True
            if self._after is not None:
                self._after()
            self._keep = None
        return True

    def is_completed(self):
        return self._done or all(w.is_completed() for w in self._works) and self._after is None

    def is_success(self):
        return self._done

    def exception(self):
        return None

    def source_rank(self):
        return -1

    def result(self):
        return self._result if isinstance(self._result, list) else [self._result]

    def synchronize(self):
        self.wait()

    def get_future(self):
        self.wait()
        fut = Future()
        fut.set_result(self._result)
        return fut


def _is_bool(t):
    return t.dtype == torch.bool


def _wire(t):
    """A contiguous tensor the simulator can carry: t itself, or a copy (bool as u8)."""
    if _is_bool(t):
        return t.to(torch.uint8)
    return t if t.is_contiguous() else t.contiguous()


def _back(dst, src):
    """Copies src into dst when src is a staging copy of it."""
    if src is not dst and src.data_ptr() != dst.data_ptr():
        dst.copy_(src.to(dst.dtype) if src.dtype != dst.dtype else src)


def _reduce_op(op, dtype):
    kind = op.op if hasattr(op, "op") else op
    if dtype == torch.bool:
        name = _BOOL_OPS.get(kind)
    else:
        name = _OPS.get(kind)
    if name is None:
        raise ValueError(f"the shardcheck backend has no reduction {kind} for {dtype}")
    return name


def _premul(op, t):
    """For PREMUL_SUM, each rank's input scaled by the op's factor before the sum (as NCCL)."""
    kind = op.op if hasattr(op, "op") else op
    if kind != _RED.PREMUL_SUM:
        return t
    factor = op.factor
    if isinstance(factor, torch.Tensor):
        factor = factor.to(t.dtype)
    return t * factor


class ShardcheckProcessGroup(dist.ProcessGroup):
    """One rank's view of one group: `comm` is the simulator communicator of that group."""

    def __init__(self, comm, rank, size, state=None):
        super().__init__(rank, size)
        self._comm = comm
        self._state = state  # shardcheck.torch.RankState: the step, nan_gradient faults
        self._rank = rank
        self._size = size

    # --- identity -------------------------------------------------------------------------
    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def getBackendName(self):
        return "shardcheck"

    @property
    def group_name(self):
        """torch's name of this group (the key of the simulator's group), as c10d registered it
        in the rank's thread-local world."""
        return c10d._world.pg_names[self]

    pg_name = group_name

    def __repr__(self):
        return f"ShardcheckProcessGroup({self._comm.name} rank {self._rank} of {self._size})"

    # --- reductions -----------------------------------------------------------------------
    def _nan_fault(self, t):
        """The rank's nan_gradient fault, if it is due: a NaN in t's first element."""
        if self._state is not None and t.is_floating_point() and t.numel() and \
                self._state.take_nan():
            with torch.no_grad():
                t[(0,) * t.dim()] = float("nan")

    def _all_reduce_one(self, t, op):
        self._nan_fault(t)
        w = _wire(_premul(op, t) if not _is_bool(t) else t)
        b = sim.buffer(w)
        work = self._comm.all_reduce(b, b, _reduce_op(op, t.dtype))
        _back(t, w)
        return work

    def allreduce(self, tensors, opts=c10d.AllreduceOptions()):
        works = [self._all_reduce_one(t, opts.reduceOp) for t in tensors]
        return ShardcheckWork(works, tensors)

    def allreduce_coalesced(self, tensors, opts=c10d.AllreduceCoalescedOptions()):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=c10d.ReduceOptions()):
        """The simulator's rooted reduce: ranks that name another root (dst) are a MismatchError;
        only the root's tensor changes (non-roots' inputs are sent from a copy, as NCCL leaves
        them)."""
        works = []
        root, op = opts.rootRank, opts.reduceOp
        for t in tensors:
            src = t.clone()
            self._nan_fault(src)
            w = _wire(_premul(op, src) if not _is_bool(src) else src)
            if self._rank == root:
                out = _wire(t)
                works.append(self._comm.reduce(sim.buffer(w), sim.buffer(out), root,
                                               _reduce_op(op, t.dtype)))
                _back(t, out)
            else:
                works.append(self._comm.reduce(sim.buffer(w), (0, 0, sim.dtype_name(w.dtype)),
                                               root, _reduce_op(op, t.dtype)))
        return ShardcheckWork(works, tensors)

    def _reduce_scatter_flat(self, out, flat, op):
        self._nan_fault(flat)
        src = _wire(_premul(op, flat) if not _is_bool(flat) else flat)
        dst = _wire(out) if out.is_contiguous() and not _is_bool(out) else _wire(out.clone())
        work = self._comm.reduce_scatter(sim.buffer(src), sim.buffer(dst), _reduce_op(op, out.dtype))
        _back(out, dst)
        return work

    def reduce_scatter(self, outputs, input_lists, opts=c10d.ReduceScatterOptions()):
        works = [self._reduce_scatter_flat(o, torch.cat([x.reshape(-1) for x in ins]), opts.reduceOp)
                 for o, ins in zip(outputs, input_lists, strict=True)]
        return ShardcheckWork(works, outputs)

    def reduce_scatter_single(self, output, input, opts=c10d.ReduceScatterOptions()):
        work = self._reduce_scatter_flat(output, input.reshape(-1), opts.reduceOp)
        return ShardcheckWork([work], output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=c10d.ReduceScatterOptions()):
        works = [self._reduce_scatter_flat(o, i.reshape(-1), opts.reduceOp)
                 for o, i in zip(outputs, inputs, strict=True)]
        return ShardcheckWork(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --- gathers and broadcast ------------------------------------------------------------
    def _all_gather_flat(self, out_flat, inp):
        src = _wire(inp)
        dst = _wire(out_flat) if not _is_bool(out_flat) else out_flat.to(torch.uint8)
        work = self._comm.all_gather(sim.buffer(src), sim.buffer(dst))
        _back(out_flat, dst)
        return work

    def allgather(self, output_lists, inputs, opts=c10d.AllgatherOptions()):
        works = []
        for outs, inp in zip(output_lists, inputs, strict=True):
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype)
            works.append(self._all_gather_flat(flat, inp))
            for o, chunk in zip(outs, flat.chunk(self._size), strict=True):
                o.copy_(chunk.view(o.shape))
        return ShardcheckWork(works, output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=c10d.AllgatherOptions()):
        works = []
        for outs, inp in zip(output_lists, inputs, strict=True):
            works += self.allgather([outs], [inp], opts)._works
        return ShardcheckWork(works, output_lists)

    def all_gather_single(self, output, input, opts=c10d.AllgatherOptions()):
        if output.is_contiguous() and not _is_bool(output):
            work = self._all_gather_flat(output.view(-1), input)
        else:
            flat = torch.empty(output.numel(), dtype=output.dtype)
            work = self._all_gather_flat(flat, input)
            output.copy_(flat.view(output.shape))
        return ShardcheckWork([work], output)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=c10d.AllgatherOptions()):
        works = [self.all_gather_single(o, i, opts)._works[0]
                 for o, i in zip(outputs, inputs, strict=True)]
        return ShardcheckWork(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=c10d.GatherOptions()):
        # The root is checked by a rooted reduce of one element to dst (the simulator compares
        # the roots of rooted ops); the data travels in an all_gather.
        root = c10d.ReduceOptions()
        root.rootRank = opts.rootRank
        root.reduceOp = dist.ReduceOp.SUM
        check = self.reduce([torch.zeros(1, dtype=torch.int32)], root)._works[0]
        inp = inputs[0]
        flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype)
        work = self._all_gather_flat(flat, inp)
        if self._rank == opts.rootRank:
            for o, chunk in zip(output_lists[0], flat.chunk(self._size), strict=True):
                o.copy_(chunk.view(o.shape))
        return ShardcheckWork([check, work], output_lists)

    def broadcast(self, tensors, opts=c10d.BroadcastOptions()):
        works = []
        for t in tensors:
            w = _wire(t)
            b = sim.buffer(w)
            works.append(self._comm.broadcast(b, b, opts.rootRank))
            _back(t, w)
        return ShardcheckWork(works, tensors)

    def scatter(self, outputs, input_lists, opts=c10d.ScatterOptions()):
        out = outputs[0]
        if self._rank == opts.rootRank:
            flat = torch.cat([x.reshape(-1) for x in input_lists[0]])
        else:
            flat = torch.empty(out.numel() * self._size, dtype=out.dtype)
        w = _wire(flat)
        b = sim.buffer(w)
        work = self._comm.broadcast(b, b, opts.rootRank)
        out.copy_(w.to(out.dtype).chunk(self._size)[self._rank].view(out.shape))
        return ShardcheckWork([work], outputs)

    # --- all-to-all -----------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_splits, input_splits,
                          opts=c10d.AllToAllOptions()):
        src = _wire(input)
        dst = _wire(output) if output.is_contiguous() and not _is_bool(output) else \
            _wire(output.clone())
        if not output_splits and not input_splits:
            work = self._comm.all_to_all(sim.buffer(src), sim.buffer(dst))
        else:
            in_row = input[0].numel() if input.dim() and input.shape[0] else 1
            out_row = output[0].numel() if output.dim() and output.shape[0] else 1
            n = self._size
            sc = [s * in_row for s in input_splits] if input_splits else [input.numel() // n] * n
            rc = [s * out_row for s in output_splits] if output_splits else \
                [output.numel() // n] * n
            work = self._comm.all_to_all_v(sim.buffer(src), sc, sim.buffer(dst), rc)
        _back(output, dst)
        return ShardcheckWork([work], output)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=c10d.AllToAllOptions()):
        src = _wire(torch.cat([x.reshape(-1) for x in inputs]))
        dst = torch.empty(sum(o.numel() for o in outputs), dtype=src.dtype)
        work = self._comm.all_to_all_v(sim.buffer(src), [x.numel() for x in inputs],
                                       sim.buffer(dst), [o.numel() for o in outputs])
        for o, piece in zip(outputs, dst.split([o.numel() for o in outputs]), strict=True):
            o.copy_(piece.view(o.shape).to(o.dtype))
        return ShardcheckWork([work], outputs)

    # --- point to point and barrier --------------------------------------------------------
    def send(self, tensors, dst, tag):
        works, keep = [], []
        for t in tensors:
            w = _wire(t)
            keep.append(w)
            works.append(self._comm.send(sim.buffer(w), dst, tag))
        return ShardcheckWork(works, tensors, keep=keep)

    def recv(self, tensors, src, tag):
        works, staged = [], []
        for t in tensors:
            w = _wire(t) if not _is_bool(t) else torch.empty(t.shape, dtype=torch.uint8)
            staged.append((t, w))
            works.append(self._comm.recv(sim.buffer(w), src, tag))

        def after():
            for t, w in staged:
                _back(t, w)

        return ShardcheckWork(works, tensors, after=after, keep=staged)

    def recv_anysource(self, tensors, tag):
        raise NotImplementedError(
            "the shardcheck backend matches every receive to a named source (as NCCL does); "
            "recv without src is not supported")

    def barrier(self, opts=c10d.BarrierOptions()):
        return ShardcheckWork([self._comm.barrier()], None)
