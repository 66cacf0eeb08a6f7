"""Optimizer, schedule and clipping (reference/README.md "Optimizer and schedule"): lr_at (warmup
then cosine), the global gradient norm and the reference clipping rule (plain or DTensor
gradients), and ReferenceAdamW, AdamW in the reference's operation order."""

import math

import torch

from .config import Config
from .model import _is_dtensor

def _opt(cfg):
    if isinstance(cfg, Config):
        return cfg.train.optimizer, cfg.train.steps
    if isinstance(cfg, tuple):
        return cfg
    raise TypeError("expected a Config (or (OptimizerConfig, total_steps))")


def lr_at(cfg, step):
    """The learning rate of step `step` (1-based): linear warmup, then cosine to min_lr at the
    last step."""
    o, total = _opt(cfg)
    if o.warmup > 0 and step <= o.warmup:
        return o.lr * step / o.warmup
    decay = total - o.warmup
    if decay <= 0:
        return o.lr
    progress = min(1.0, (step - o.warmup) / decay)
    return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _grads(params):
    """Parameters' .grad (those that have one) or, for tensors that need no grad, the tensors
    themselves (a list of gradients)."""
    out = []
    for p in params:
        g = p.grad if p.requires_grad else p
        if g is not None:
            out.append(g)
    return out


def grad_norm(params):
    """sqrt(Σ g²) over every gradient element, accumulated in float64; for DTensor gradients the
    global norm (each shard once, replicas once). `params`: parameters (their .grad) or grads."""
    total = torch.zeros((), dtype=torch.float64)
    for g in _grads(list(params)):
        gd = g.detach().to(torch.float64)
        s = (gd * gd).sum()
        if _is_dtensor(s):
            s = s.full_tensor()
        total = total + s.cpu()
    return math.sqrt(float(total))


def clip_factor(norm, max_norm):
    """max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1 (the reference
    rule, not torch's min(1, ·))."""
    if max_norm <= 0.0 or not norm > max_norm:
        return 1.0
    return max_norm / (norm + 1e-6)


@torch.no_grad()
def clip_(params, max_norm):
    """The reference clipping: returns (norm before clipping, factor); gradients are multiplied
    by the factor (computed in f64; each element g ← dtype(double(g) · factor)) only when
    norm > max_norm > 0. Works on plain and DTensor gradients."""
    params = list(params)
    norm = grad_norm(params)
    factor = clip_factor(norm, max_norm)
    if factor != 1.0:
        for g in _grads(params):
            if g.dtype == torch.float64:
                g.mul_(factor)
            else:
                g.copy_(g.to(torch.float64).mul(factor).to(g.dtype))
    return norm, factor


def _in_dtype(x, dtype):
    """The Python float x rounded to `dtype` (as the reference's static_cast<T>)."""
    return float(torch.tensor(x, dtype=torch.float64).to(dtype))


class ReferenceAdamW(torch.optim.Optimizer):
    """AdamW as the reference writes it, element by element in the parameters' dtype with the
    scalar coefficients computed in f64 first and rounded to it:

        p ← p · (1 − lr·wd)         only for rank-2 tensors (the GLOBAL rank for a DTensor)
        m ← β1 m + (1 − β1) g ;  v ← β2 v + (1 − β2) g·g
        p ← p − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)

    Works on plain tensors and DTensors (FSDP2 shards: the math is elementwise). The update
    count t is kept per parameter in its state ("step", as torch's AdamW, so a restored state
    resumes the count); by default the learning rate of update t is lr_at(cfg, t) (the
    reference schedule; `schedule=False` takes each group's "lr" as it is). `last_lr` is the
    rate of the latest update."""

    def __init__(self, params, cfg, schedule=True):
        o, _ = _opt(cfg)
        super().__init__(params, dict(lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                      weight_decay=o.weight_decay))
        self.cfg, self.schedule, self.last_lr = cfg, schedule, None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = int(st["step"])
                if self.schedule:
                    group["lr"] = lr_at(self.cfg, t)
                lr = self.last_lr = group["lr"]
                bc1, bc2 = 1.0 - beta1**t, 1.0 - beta2**t
                dt = p.dtype
                b1, b2 = _in_dtype(beta1, dt), _in_dtype(beta2, dt)
                omb1 = float(torch.tensor(1.0, dtype=dt) - torch.tensor(beta1, dtype=dt))
                omb2 = float(torch.tensor(1.0, dtype=dt) - torch.tensor(beta2, dtype=dt))
                m, v = st["exp_avg"], st["exp_avg_sq"]
                if p.ndim == 2:
                    p.mul_(_in_dtype(1.0 - lr * group["weight_decay"], dt))
                m.mul_(b1).add_(g * omb1)
                v.mul_(b2).add_(g * omb2 * g)
                mhat = m / _in_dtype(bc1, dt)
                vhat = v / _in_dtype(bc2, dt)
                p.sub_(mhat * _in_dtype(lr, dt) / (vhat.sqrt() + _in_dtype(group["eps"], dt)))
        return loss
