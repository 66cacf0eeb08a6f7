"""What the torch examples share: a small language model as a team would write it (token
embedding, pre-norm MLP blocks, final norm, untied head), its initial weights and every step's
batch made here from fixed seeds (so no rank's RNG has to agree with another's), the
single-process reference run of the same training (the oracle the examples are judged against),
and the comparison.

A batch is `global_batch` sequences of `seq` tokens with a different number of padded tokens in
each, so that every rank's share holds a different number of real tokens: the loss is the mean
over all real tokens of the global batch, and a mean of rank means differs from it."""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

DTYPE = torch.float64
VOCAB, DIM, HIDDEN, LAYERS, SEQ = 32, 16, 32, 2, 8
GLOBAL_BATCH, STEPS, SEED = 8, 3, 1234
LR, WEIGHT_DECAY, MAX_NORM = 1e-2, 0.1, 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM, dtype=DTYPE)
        self.up = nn.Linear(DIM, HIDDEN, dtype=DTYPE)
        self.down = nn.Linear(HIDDEN, DIM, dtype=DTYPE)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, dtype=DTYPE)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM, dtype=DTYPE)
        self.head = nn.Linear(DIM, VOCAB, bias=False, dtype=DTYPE)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_model(cls=None):
    """TinyLM (or `cls`) with weights drawn from a generator of its own, the same on every rank
    and in the reference, whatever any other code did to torch's global RNG."""
    model = (cls or TinyLM)()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=DTYPE))
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=DTYPE) / math.sqrt(p.shape[-1]))
    return model


def batch(step):
    """Step `step`'s global batch: tokens [B, SEQ], targets [B, SEQ] with -100 on padding."""
    g = torch.Generator().manual_seed(SEED * 1000 + step)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=g)
    targets = tokens[:, 1:].clone()
    for i in range(GLOBAL_BATCH):  # sequence i keeps (i * 3) % SEQ + 1 real tokens: 1, 4, 7,
        targets[i, (i * 3) % SEQ + 1:] = -100  # 2, 5, 8, 3, 6 (halves and quarters differ)
    return tokens[:, :-1].contiguous(), targets


def token_loss_sum(logits, targets):
    """(sum of the real tokens' cross-entropy, their count)."""
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss, int((targets != -100).sum())


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)


def reference(steps=STEPS, make=None):
    """The single-process run of the model `make` builds (TinyLM by default): per step the loss
    (mean over real tokens), the gradient norm before clipping, and at the end every parameter."""
    model = (make or make_model)()
    opt = make_optimizer(model.parameters())
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = batch(step)
        loss_sum, count = token_loss_sum(model(tokens), targets)
        loss = loss_sum / count
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        record["loss"].append(loss.item())
        record["grad_norm"].append(float(norm))
    record["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return record


def compare(oracle, run, rtol=1e-9):
    """Failures of `run` against `oracle` (empty: parity): each loss and grad norm, each
    parameter, within rtol of the oracle's value (relative to the tensor's largest entry)."""
    bad = []
    for key in ("loss", "grad_norm"):
        if len(run[key]) != len(oracle[key]):
            bad.append(f"{key}: {len(run[key])} steps, the oracle has {len(oracle[key])}")
            continue
        for step, (a, b) in enumerate(zip(oracle[key], run[key]), start=1):
            if abs(a - b) > rtol * max(abs(a), 1e-30):
                bad.append(f"step {step} {key}: {b!r}, the oracle's {a!r}")
    missing = sorted(set(oracle["params"]) - set(run["params"]))
    if missing:
        bad.append(f"parameters missing from the run: {missing}")
    for name, ref in oracle["params"].items():
        got = run["params"].get(name)
        if got is None:
            continue
        if tuple(got.shape) != tuple(ref.shape):
            bad.append(f"{name}: shape {tuple(got.shape)}, the oracle's {tuple(ref.shape)}")
            continue
        err = float((got.to(ref.dtype) - ref).abs().max())
        scale = float(ref.abs().max()) or 1.0
        if err > rtol * scale:
            bad.append(f"{name}: max |error| {err:.3g} (relative {err / scale:.3g}) after "
                       f"{len(oracle['loss'])} steps")
    return bad


def shard_rows(n_rows, rank, world):
    """The rows of a global batch that `rank` of `world` data-parallel ranks takes."""
    per = n_rows // world
    return slice(rank * per, (rank + 1) * per)


def run_main(train, argv=None, world_size=4, bugs=(), make=None):
    """Command line of an example: runs `train` on the shardcheck backend (or, under torchrun,
    on the backend torchrun's environment names) and compares rank 0's record with the oracle.
    Exit 0 on parity, 1 when the comparison fails."""
    import argparse

    p = argparse.ArgumentParser(description=train.__doc__)
    p.add_argument("--world-size", type=int, default=world_size)
    p.add_argument("--bug", choices=list(bugs), default=None, help="plant a user bug")
    p.add_argument("--trace", default=None, help="write the run's Perfetto trace here")
    p.add_argument("--dump", default=None,
                   help="write the run's tensors here (the --dump-tensors layout)")
    p.add_argument("--oracle-dump", default=None,
                   help="write the single-process oracle's tensors here")
    a = p.parse_args(argv)
    if "RANK" in os.environ:  # under torchrun: one process per rank, e.g. gloo
        import torch.distributed as dist

        dist.init_process_group(os.environ.get("SHARDCHECK_TORCH_BACKEND", "gloo"))
        record = train(dist.get_rank(), dist.get_world_size(), bug=a.bug)
        dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return 0
    else:
        import shardcheck.torch as sct

        record = sct.spawn(lambda r: train(r, a.world_size, bug=a.bug), a.world_size,
                           trace=a.trace)[0]
    oracle = reference(make=make)
    if a.dump or a.oracle_dump:
        from shardcheck.dump import write_record

        if a.dump:
            write_record(a.dump, record)
        if a.oracle_dump:
            write_record(a.oracle_dump, oracle)
    bad = compare(oracle, record)
    for line in bad:
        print("FAIL", line)
    print("parity with the single-process oracle" if not bad else f"{len(bad)} checks failed")
    return 1 if bad else 0
