"""The recorder a training script calls to leave its run in the --dump-tensors layout, on any
backend (shardcheck, gloo under torchrun, NCCL): every parameter and gradient at full shape
(DTensors of FSDP2 / TP gathered with full_tensor(); plain tensors as they are), moved to the CPU,
written by one rank.

    rec = Recorder("out/run", model)         # records init/param/<p>
    ... backward ...
    rec.grads(step)                          # step<N>/grad/<p>, before clipping
    ... clip, optimizer.step() ...
    rec.step(step, loss=loss)                # step<N>/loss, step<N>/param/<p>
    rec.close()                              # index.json

grads(), step() and the constructor are collective where the model holds DTensors (every rank
calls them); only the writing rank (rank 0 by default) touches the disk. The C++ oracle's dump
(`shardcheck run --dump-tensors`) holds loss, gradients and parameters; step() also takes
grad_norm, clip_factor and lr for dumps compared with each other, which `shardcheck compare`
refuses against a dump that lacks them (a tensor in one dump only)."""

import torch.distributed as dist

from ..dump import Dump


def _full(t):
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone()


class Recorder:
    def __init__(self, path, model, *, writer=None, init=True):
        if writer is None:
            writer = not dist.is_initialized() or dist.get_rank() == 0
        self.model = model
        self.dump = Dump(path) if writer else None
        if init:
            self._tensors("init/param", ((k, v) for k, v in model.state_dict().items()))

    def _tensors(self, prefix, items):
        for name, value in items:
            full = _full(value)  # collective for DTensors: every rank gathers
            if self.dump is not None:
                self.dump.add(f"{prefix}/{name}", full)

    def grads(self, step):
        """Every parameter's gradient (accumulated, before clipping) of step `step`."""
        self._tensors(f"step{step}/grad",
                      ((k, p.grad) for k, p in self.model.named_parameters() if p.grad is not None))

    def step(self, step, *, loss, grad_norm=None, clip_factor=None, lr=None):
        """The step's scalars and every parameter after the update."""
        if self.dump is not None:
            self.dump.step(step, loss=float(loss), grad_norm=grad_norm, clip_factor=clip_factor,
                           lr=lr)
        self._tensors(f"step{step}/param", self.model.state_dict().items())

    def close(self):
        if self.dump is not None:
            self.dump.close()
