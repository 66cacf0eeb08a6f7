"""The single-process trainer and its dump: Trainer runs the reference's steps (global batch,
microbatches with the global loss weights, norm and clipping, scheduled AdamW) and writes the
C++ oracle's --dump-tensors layout; train_and_dump does both from scratch."""

import dataclasses
import os

import torch

from .data import FIELDS, global_batch, token_weights
from .loss import LossParts, loss_parts, objective
from .model import Model, init_
from .optim import ReferenceAdamW, clip_


def bf16_round(t):
    """t rounded to the nearest bfloat16 (ties to even), kept in t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


@dataclasses.dataclass
class StepRecord:
    step: int
    loss: float
    loss_sum: float
    tokens: int
    aux: float
    sequences: int
    grad_norm: float
    clip_factor: float
    lr: float


class Trainer:
    """The reference's Trainer in one process: per step the global batch (global_batch(cfg, n)),
    its microbatches in order (forward, backward of objective() with the global weights,
    gradients accumulated), the norm and the reference clipping, the scheduled AdamW update.
    `grads` holds the accumulated gradients of the latest step before clipping; `init_params`
    the initial parameters. Precision "bf16" runs the reference's recipe on f32 parameters (the
    master): `round_weights` makes the step's working weights, `round_grads` rounds each
    microbatch's gradients before the f32 accumulation (both bf16_round)."""

    round_weights = staticmethod(bf16_round)
    round_grads = staticmethod(bf16_round)

    def __init__(self, cfg, model=None):
        self.cfg = cfg
        self.model = model if model is not None else init_(Model(cfg), cfg)
        self.optimizer = ReferenceAdamW(self.model.parameters(), cfg)
        self.steps_done = 0
        self.grads = None
        self.init_params = self.params()

    def params(self):
        return {k: v.detach().clone() for k, v in self.model.named_parameters()}

    def step(self, n=None, batch=None):
        """Runs step n (default: the next one) on `batch` (default: the sampler's global batch
        n) and returns its StepRecord."""
        n = self.steps_done + 1 if n is None else n
        if n != self.steps_done + 1:
            raise ValueError(f"step {n} requested; the next step is {self.steps_done + 1}")
        batch = global_batch(self.cfg, n) if batch is None else batch
        if len(batch) != self.cfg.train.global_batch:
            raise ValueError(f"batch of {len(batch)} sequences != train.global_batch")
        if not torch.equal(batch.index, torch.arange(len(batch))):
            raise ValueError("batch.index must be the positions 0..B-1 in the global batch")
        tw, sw = token_weights(batch)
        self.optimizer.zero_grad(set_to_none=False)
        params = list(self.model.parameters())
        bf16 = self.cfg.train.precision == "bf16"
        if bf16:
            # the bf16 recipe: the working weights are the f32 master rounded to bf16 (RNE) for
            # this whole step; each microbatch's gradients (from zero) are rounded to bf16 and
            # added to an f32 accumulator; the master comes back before clipping and AdamW.
            master = [p.detach().clone() for p in params]
            acc = [torch.zeros_like(p) for p in params]
            with torch.no_grad():
                for p in params:
                    p.copy_(self.round_weights(p))
        parts = None
        try:
            for mb in batch.microbatches(self.cfg.train.micro_batch):
                logits, aux = self.model(mb.tokens, mb.doc_ids, mb.positions, mb.index, n)
                p = loss_parts(logits, mb.targets, mb.loss_mask, aux)
                objective(p, tw, sw).backward()
                p = LossParts(p.loss_sum.detach(), p.tokens, p.aux_sum.detach(), p.sequences)
                parts = p if parts is None else parts + p
                if bf16:
                    with torch.no_grad():
                        for a, q in zip(acc, params):
                            if q.grad is not None:
                                a.add_(self.round_grads(q.grad))
                                q.grad.zero_()
        finally:
            if bf16:
                with torch.no_grad():
                    for q, m in zip(params, master):
                        q.copy_(m)
        if bf16:
            for q, a in zip(params, acc):
                q.grad = a
        self.grads = {k: v.grad.detach().clone() for k, v in self.model.named_parameters()}
        norm, factor = clip_(self.model.parameters(), self.cfg.train.clip_grad_norm)
        self.optimizer.step()
        self.steps_done = n
        return StepRecord(n, parts.loss(), float(parts.loss_sum), parts.tokens,
                          float(parts.aux_sum) / parts.sequences, parts.sequences, norm, factor,
                          self.optimizer.last_lr)

    def run(self, steps=None, dump=None, scalars=False):
        """Runs steps until `steps` (default cfg.train.steps) are done; with `dump` (a directory)
        writes the C++ oracle's dump layout: init/param/<p>, batch/<k>/<field> (step 1, int32
        [micro_batch, S]), step<N>/loss (f64 scalar), step<N>/grad/<p> (before clipping),
        step<N>/param/<p> (after the update); `scalars` adds step<N>/grad_norm, clip_factor, lr.
        Returns the StepRecords."""
        steps = self.cfg.train.steps if steps is None else steps
        d = None
        if dump is not None:
            from ...dump import Dump

            d = Dump(os.fspath(dump))
        records = []
        try:
            while self.steps_done < steps:
                n = self.steps_done + 1
                if d is not None and n == 1:
                    for name, value in self.init_params.items():
                        d.add("init/param/" + name, value)
                    batch = global_batch(self.cfg, 1)
                    for k, mb in enumerate(batch.microbatches(self.cfg.train.micro_batch)):
                        for f in FIELDS:
                            d.add(f"batch/{k}/{f}", getattr(mb, f).to(torch.int32))
                rec = self.step(n)
                records.append(rec)
                if d is not None:
                    d.add(f"step{n}/loss", float(rec.loss))
                    for name, g in self.grads.items():
                        d.add(f"step{n}/grad/{name}", g)
                    for name, p in self.params().items():
                        d.add(f"step{n}/param/{name}", p)
                    if scalars:
                        d.step(n, grad_norm=rec.grad_norm, clip_factor=rec.clip_factor, lr=rec.lr)
        finally:
            if d is not None:
                d.close()
        return records


def train_and_dump(cfg, path, steps=None):
    """Trains cfg's run from scratch and writes its dump to `path`; returns the StepRecords."""
    return Trainer(cfg).run(steps, dump=path)
