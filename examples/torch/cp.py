"""Context parallel as a team writes it where PyTorch's own does not run (torch's
context_parallel has no sharding strategy for the CPU's attention kernel): a causal ring
attention written with torch ops. The sequence is cut into one contiguous shard per rank; each
rank keeps its queries and passes keys and values around the ring (batch_isend_irecv), merging
blocks with a running log-sum-exp; the backward pass sends the keys' and values' gradients around
the ring with them, back to their owner. RoPE takes each shard's global positions. The model is
an attention LM (embedding, a pre-norm attention block with RoPE, the MLP block, final norm,
head); parameters are replicated, so their gradients are summed over the ranks after backward.
Planted bugs: rope_offset (each shard's positions start at 0) and mean_of_means (each rank's
loss a mean over its own real tokens)."""

import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import common

HEADS = 2
HEAD_DIM = common.DIM // HEADS


def rope(x, positions):
    """Rotary embedding (rotate-half form, base 10000) of x [B, H, S, D] at `positions` [S]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=x.dtype) / half))
    angles = positions.to(x.dtype)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def full_attention(q, k, v):
    """Causal softmax attention over the whole sequence (the single-process model's)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        dt = common.DTYPE
        self.attn_norm = nn.LayerNorm(common.DIM, dtype=dt)
        self.wq = nn.Linear(common.DIM, common.DIM, bias=False, dtype=dt)
        self.wk = nn.Linear(common.DIM, common.DIM, bias=False, dtype=dt)
        self.wv = nn.Linear(common.DIM, common.DIM, bias=False, dtype=dt)
        self.wo = nn.Linear(common.DIM, common.DIM, bias=False, dtype=dt)

    def forward(self, x, positions, attention):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        o = attention(rope(q, positions), rope(k, positions), v)
        return x + self.wo(o.transpose(1, 2).reshape(b, s, common.DIM))


class AttnLM(nn.Module):
    def __init__(self):
        super().__init__()
        dt = common.DTYPE
        self.embed = nn.Embedding(common.VOCAB, common.DIM, dtype=dt)
        self.attn = Attention()
        self.mlp = common.Block()
        self.norm = nn.LayerNorm(common.DIM, dtype=dt)
        self.head = nn.Linear(common.DIM, common.VOCAB, bias=False, dtype=dt)

    def forward(self, tokens, positions=None, attention=full_attention):
        if positions is None:
            positions = torch.arange(tokens.shape[1])
        x = self.attn(self.embed(tokens), positions, attention)
        return self.head(self.norm(self.mlp(x)))


def make_model():
    return common.make_model(AttnLM)


def _ring_pass(tensors, rank, world):
    """Sends `tensors` to the next rank and receives the previous rank's (batch_isend_irecv)."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt) for t in tensors]
    ops += [dist.P2POp(dist.irecv, g, prv) for g in got]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return got


def _block(q, k, scale, causal):
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over every rank's keys and values, shards in rank
    order (rank r holds positions [r*c, (r+1)*c))."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        kv = (k, v)
        for i in range(world):
            src = (rank - i) % world
            nxt = _ring_pass(kv, rank, world) if i < world - 1 else None
            if src <= rank:
                s = _block(q, kv[0], scale, causal=src == rank)
                block_lse = torch.logsumexp(s, dim=-1)
                block_out = torch.exp(s - block_lse[..., None]) @ kv[1]
                new_lse = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new_lse)[..., None] + \
                    block_out * torch.exp(block_lse - new_lse)[..., None]
                lse = new_lse
            kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        # The block of rank `src` travels with its gradient accumulators and comes home after
        # `world` passes.
        kb, vb, dk, dv = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for i in range(world):
            src = (rank - i) % world
            if src <= rank:
                p = torch.exp(_block(q, kb, scale, causal=src == rank) - lse[..., None])
                dv = dv + p.transpose(-1, -2) @ dout
                ds = p * (dout @ vb.transpose(-1, -2) - delta)
                dq = dq + ds @ kb * scale
                dk = dk + ds.transpose(-1, -2) @ q * scale
            kb, vb, dk, dv = _ring_pass((kb, vb, dk, dv), rank, world)
        return dq, dk, dv


def train(rank, world, bug=None, steps=common.STEPS):
    model = make_model()
    opt = common.make_optimizer(model.parameters())
    chunk = common.SEQ // world
    cols = slice(rank * chunk, (rank + 1) * chunk)
    positions = torch.arange(chunk) if bug == "rope_offset" else torch.arange(cols.start, cols.stop)
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        logits = model(tokens[:, cols], positions, RingAttention.apply)
        loss_sum, count = common.token_loss_sum(logits, targets[:, cols].contiguous())
        stats = torch.tensor([loss_sum.item(), float(count)], dtype=torch.float64)
        dist.all_reduce(stats)
        loss = loss_sum / max(count, 1) / world if bug == "mean_of_means" else loss_sum / stats[1]
        loss.backward()
        for p in model.parameters():  # replicated parameters: the full gradient is the sum
            dist.all_reduce(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), common.MAX_NORM)
        opt.step()
        opt.zero_grad()
        record["loss"].append(float(stats[0] / stats[1]))
        record["grad_norm"].append(float(norm))
    record["params"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return record


if __name__ == "__main__":
    sys.exit(common.run_main(train, bugs=("rope_offset", "mean_of_means"), make=make_model))
