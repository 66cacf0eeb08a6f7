"""The reference model in torch ops: initialisation (Philox normal per element), RMSNorm, GELU,
SwiGLU, RoPE (model.rope: theta, interleaved or half layout, Llama 3.1 scaling), Philox-keyed
attention dropout, GQA attention with the document-causal mask, MLP (GELU or SwiGLU), top-k MoE
with capacity and aux loss, Block and Model ([in, out] weights named as in the dump), and init_
(plain or DTensor parameters)."""

import functools
import math

import numpy as np
import torch
import torch.nn as nn

from .config import Config, RopeConfig
from .rng import RngStream, _libm

ROPE_THETA = 10000.0  # RopeConfig's default theta
RMSNORM_EPS = 1e-5
GELU_C = 0.7978845608028654  # sqrt(2 / pi)


def init_values(model_cfg, seed, name, begin, end):
    """Elements [begin, end) (flat C order) of parameter `name`'s initialisation, float64."""
    n = np.arange(begin, end, dtype=np.uint64)
    if name.endswith("norm.weight"):
        return np.ones(len(n))
    std = 0.02
    if name.endswith(".attn.wo") or name.endswith(".w_down"):
        std /= math.sqrt(2.0 * model_cfg.layers)
    return std * RngStream(seed, name).normal(n)


def _param(shape, dtype):
    return nn.Parameter(torch.zeros(shape, dtype=dtype))


class Weight(nn.Module):
    """A module holding one parameter called `weight` (embed, norms, lm_head)."""

    def __init__(self, shape, dtype):
        super().__init__()
        self.weight = _param(shape, dtype)


def rmsnorm(x, w):
    """x / sqrt(mean(x²) + 1e-5) * w per row (the reference's operation order)."""
    inv = 1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + RMSNORM_EPS)
    return x * inv * w


def gelu(x):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))."""
    return 0.5 * x * (1.0 + torch.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def swiglu(gate, up):
    """silu(gate) * up, silu(g) = g / (1 + exp(−g)) (the reference's operation order)."""
    return gate / (1.0 + torch.exp(-gate)) * up


def rope_frequencies(rope_cfg, head_dim):
    """The angle per position of pair j < head_dim / 2, a tuple of floats computed as the C++
    RopeConfig::frequencies does (bitwise): theta^(-2j/d) with the C library's pow; with
    Llama 3.1's scaling (Meta's apply_scaling), wavelength = 2π / f, longer than original /
    low_freq_factor: f / factor; not shorter than original / high_freq_factor: (1 − smooth) ·
    f / factor + smooth · f with smooth = (original / wavelength − low) / (high − low); else f."""
    r = rope_cfg
    out = []
    for j in range(head_dim // 2):
        freq = math.pow(float(r.theta), -2.0 * j / head_dim)
        s = r.scaling
        if s is not None:
            wavelen = 2.0 * math.pi / freq
            old = float(s.original_max_position_embeddings)
            if wavelen > old / s.low_freq_factor:
                freq /= s.factor
            elif wavelen >= old / s.high_freq_factor:
                smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor
                                                                - s.low_freq_factor)
                freq = (1.0 - smooth) * freq / s.factor + smooth * freq
        out.append(freq)
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _rope_table(max_pos, freqs):
    """cos and sin [max_pos + 1, len(freqs)] in float64 of angle = pos · freqs[j], with the C
    library's cos and sin (bitwise the C++'s)."""
    angle = np.arange(max_pos + 1, dtype=np.float64)[:, None] * np.array(freqs)[None, :]
    return (torch.from_numpy(_libm(math.cos, angle)), torch.from_numpy(_libm(math.sin, angle)))


def rope_tables(positions, head_dim, dtype, rope_cfg=None):
    """cos, sin [..., 1, head_dim / 2] for int64 positions [...] (broadcast over heads), at the
    angles of rope_cfg (a RopeConfig; None: the default, theta 10000 without scaling), computed
    in float64 and cast to dtype as the C++ does."""
    freqs = rope_frequencies(RopeConfig() if rope_cfg is None else rope_cfg, head_dim)
    max_pos = int(positions.max()) if positions.numel() else 0
    cos, sin = _rope_table(max(64, 1 << max(max_pos, 0).bit_length()), freqs)
    pos = positions.cpu().long()
    dev = positions.device
    return (cos[pos].to(dtype=dtype, device=dev).unsqueeze(-2),
            sin[pos].to(dtype=dtype, device=dev).unsqueeze(-2))


def rope(x, cos, sin, layout="interleaved"):
    """RoPE on the last dimension of x [..., heads, d], cos/sin [..., 1, d/2]: pair j is channels
    (2j, 2j+1) for layout "interleaved", (j, j + d/2) for "half"; (x0, x1) → (x0 cos − x1 sin,
    x0 sin + x1 cos)."""
    if layout == "half":
        h = x.shape[-1] // 2
        x0, x1 = x[..., :h], x[..., h:]
        return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    if layout != "interleaved":
        raise ValueError(f"RoPE layout must be \"interleaved\" or \"half\", got {layout!r}")
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def dropout_scale(seed, layer, step, seq_index, total_heads, seq_len, rate, heads=None,
                  rows=None, cols=None):
    """The attention-dropout multipliers, float64 NumPy [B, len(heads), len(rows), len(cols)]:
    1 / (1 - rate) where uniform("dropout/layers.<layer>", step, ((b·a + head)·S + i)·S + j)
    >= rate, else 0; b = the sequences' global indices, head the GLOBAL query heads (default
    all), i, j global positions (default 0..S-1), S the full sequence length."""
    heads = np.arange(total_heads) if heads is None else np.asarray(heads)
    rows = np.arange(seq_len) if rows is None else np.asarray(rows)
    cols = np.arange(seq_len) if cols is None else np.asarray(cols)
    b = np.asarray(seq_index, dtype=np.uint64).reshape(-1)
    a, s = np.uint64(total_heads), np.uint64(seq_len)
    idx = (((b[:, None, None, None] * a + heads.astype(np.uint64)[None, :, None, None]) * s
            + rows.astype(np.uint64)[None, None, :, None]) * s
           + cols.astype(np.uint64)[None, None, None, :])
    keep = RngStream(seed, f"dropout/layers.{layer}", step).uniform(idx) >= rate
    return np.where(keep, 1.0 / (1.0 - rate), 0.0)


class Context:
    """What every block needs besides x: doc ids, positions, the sequences' global indices, the
    step, and what derives from them (mask, RoPE tables), computed once per forward."""

    def __init__(self, cfg, seed, doc_ids, positions, seq_index, step, dtype):
        self.cfg, self.seed, self.step, self.dtype = cfg, seed, step, dtype
        self.doc_ids, self.positions = doc_ids, positions
        self.seq_index = torch.as_tensor(seq_index)
        s = doc_ids.shape[-1]
        causal = torch.ones(s, s, dtype=torch.bool, device=doc_ids.device).tril()
        # visible[b, 1, i, j]: j <= i and doc_ids[j] == doc_ids[i] (padding, doc -1, sees padding)
        self.visible = (causal & (doc_ids[:, :, None] == doc_ids[:, None, :])).unsqueeze(1)
        self.cos, self.sin = rope_tables(positions, cfg.head_dim, dtype, cfg.rope)

    def dropout(self, layer, head_offset=0, local_heads=None, total_heads=None):
        rate = self.cfg.dropout
        if rate <= 0.0:
            return None
        if self.step is None:
            raise ValueError("attention dropout is keyed by the optimizer step: pass step")
        total = total_heads or self.cfg.heads
        local = local_heads or total
        scale = dropout_scale(self.seed, layer, self.step, self.seq_index.cpu().numpy(), total,
                              self.doc_ids.shape[-1], rate,
                              heads=np.arange(head_offset, head_offset + local))
        return torch.from_numpy(scale).to(dtype=self.dtype, device=self.doc_ids.device)


class Attention(nn.Module):
    """GQA attention with RoPE, the document-causal mask and dropout on the probabilities.
    A head-sharded (TP) caller that gives the module a slice of the heads sets `heads`,
    `kv_heads` (local counts) and `head_offset` (its first global query head): dropout is keyed
    by the global head."""

    def __init__(self, cfg, layer, dtype):
        super().__init__()
        h, d = cfg.hidden, cfg.head_dim
        self.cfg, self.layer = cfg, layer
        self.heads, self.kv_heads, self.head_offset = cfg.heads, cfg.kv_heads, 0
        self.wq = _param((h, cfg.heads * d), dtype)
        self.wk = _param((h, cfg.kv_heads * d), dtype)
        self.wv = _param((h, cfg.kv_heads * d), dtype)
        self.wo = _param((cfg.heads * d, h), dtype)

    def forward(self, n, ctx):
        cfg = self.cfg
        b, s, _ = n.shape
        a, kv, d = self.heads, self.kv_heads, cfg.head_dim
        layout = cfg.rope.layout
        q = rope((n @ self.wq).view(b, s, a, d), ctx.cos, ctx.sin, layout).transpose(1, 2)
        k = rope((n @ self.wk).view(b, s, kv, d), ctx.cos, ctx.sin, layout).transpose(1, 2)
        v = (n @ self.wv).view(b, s, kv, d).transpose(1, 2)
        if kv != a:  # query head g uses kv head g / (a / kv)
            k = k.repeat_interleave(a // kv, dim=1)
            v = v.repeat_interleave(a // kv, dim=1)
        scale = float(1.0 / torch.tensor(float(d), dtype=n.dtype).sqrt())  # T(1) / sqrt(T(d))
        scores = (q @ k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~ctx.visible, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        drop = ctx.dropout(self.layer, self.head_offset, a, cfg.heads)
        if drop is not None:
            p = p * drop
        o = (p @ v).transpose(1, 2).reshape(b, s, a * d)
        return o @ self.wo


class MLP(nn.Module):
    """The dense MLP and each expert: GELU, gelu(x · w_up) · w_down; SwiGLU (cfg.mlp "swiglu"),
    swiglu(x · w_gate, x · w_up) · w_down, with w_gate registered before w_up (the dump's
    order)."""

    def __init__(self, cfg, dtype):
        super().__init__()
        if cfg.gated_mlp:
            self.w_gate = _param((cfg.hidden, cfg.ffn), dtype)
        self.w_up = _param((cfg.hidden, cfg.ffn), dtype)
        self.w_down = _param((cfg.ffn, cfg.hidden), dtype)

    def forward(self, x):
        if hasattr(self, "w_gate"):
            return swiglu(x @ self.w_gate, x @ self.w_up) @ self.w_down
        return gelu(x @ self.w_up) @ self.w_down


def moe_capacity(moe, seq_len):
    """C = ceil(capacity_factor · S · k / E − 1e-9), in f64."""
    return int(math.ceil(moe.capacity_factor * seq_len * moe.top_k / moe.experts - 1e-9))


class MoE(nn.Module):
    """Top-k MoE, one routing group per sequence (README "MoE"): padding not routed, top-k ties
    to the lower expert, gates renormalised over the top-k, capacity filled first choices first
    in token order, outputs summed in choice order; aux = α·E·Σ_e f_e·P̄_e per sequence."""

    def __init__(self, cfg, dtype):
        super().__init__()
        self.cfg = cfg
        self.router = _param((cfg.hidden, cfg.moe.experts), dtype)
        self.experts = nn.ModuleList(MLP(cfg, dtype) for _ in range(cfg.moe.experts))

    def forward(self, x, ctx):
        moe = self.cfg.moe
        b, s, _ = x.shape
        e_n, k = moe.experts, moe.top_k
        probs = torch.softmax(x @ self.router, dim=-1)  # [B, S, E]
        routed = ctx.doc_ids >= 0  # [B, S]
        with torch.no_grad():
            choice = torch.sort(probs.detach(), dim=-1, descending=True, stable=True)[1][..., :k]
            cap = moe_capacity(moe, s)
            load = torch.zeros(b, e_n, dtype=torch.int64, device=x.device)
            kept = []
            for c in range(k):
                hot = torch.nn.functional.one_hot(choice[..., c], e_n) * routed[..., None]
                slot = load[:, None, :] + hot.cumsum(dim=1) - 1  # [B, S, E]
                kept.append((slot.gather(-1, choice[..., c:c + 1]).squeeze(-1) < cap) & routed)
                load = torch.clamp(load + hot.sum(dim=1), max=cap)
            kept = torch.stack(kept, dim=-1)  # [B, S, k]
            n_routed = routed.sum(dim=1)  # T per sequence
            counts = torch.nn.functional.one_hot(choice, e_n).mul(routed[..., None, None]).sum(
                dim=(1, 2)).to(torch.float64)  # [B, E], before capacity
            f = counts / (k * n_routed.clamp(min=1)).to(torch.float64)[:, None]
        top = probs.gather(-1, choice)  # [B, S, k]
        gates = top / top.sum(dim=-1, keepdim=True)
        outs = torch.stack([expert(x) for expert in self.experts])  # [E, B, S, h]
        bi = torch.arange(b, device=x.device)[:, None]
        si = torch.arange(s, device=x.device)[None, :]
        y = torch.zeros_like(x)
        for c in range(k):
            w = torch.where(kept[..., c], gates[..., c], torch.zeros_like(gates[..., c]))
            y = y + w[..., None] * outs[choice[..., c], bi, si]
        # aux: gradient through P̄ only; computed in f64 as the reference does
        p_mean = (probs.to(torch.float64) * routed[..., None]).sum(dim=1)  # Σ_t P[t, e]
        t = n_routed.to(torch.float64).clamp(min=1)[:, None]
        aux = (f * p_mean / t).sum(dim=-1) * (moe.aux_loss * e_n)
        aux = torch.where(n_routed > 0, aux, torch.zeros_like(aux))
        return y, aux.sum()


class Block(nn.Module):
    def __init__(self, cfg, layer, dtype):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.attn_norm = Weight((cfg.hidden,), dtype)
        self.attn = Attention(cfg, layer, dtype)
        self.mlp_norm = Weight((cfg.hidden,), dtype)
        if cfg.is_moe_layer(layer):
            self.moe = MoE(cfg, dtype)
        else:
            self.mlp = MLP(cfg, dtype)

    def forward(self, x, ctx):
        """(x after the block, this block's aux-loss sum over the sequences (0 if dense))."""
        x = x + self.attn(rmsnorm(x, self.attn_norm.weight), ctx)
        n = rmsnorm(x, self.mlp_norm.weight)
        if self.cfg.is_moe_layer(self.layer):
            y, aux = self.moe(n, ctx)
            return x + y, aux
        return x + self.mlp(n), None


class Model(nn.Module):
    """The reference model. named_parameters() / state_dict() keys are the dump's names, in its
    order (embed.weight, layers.<i>.attn_norm.weight, layers.<i>.attn.wq, ..., final_norm.weight,
    lm_head.weight when untied), with its shapes ([in, out]: y = x @ W). Parameters start at zero:
    init_(model, cfg) gives the reference initialisation."""

    def __init__(self, cfg, dtype=None):
        super().__init__()
        if isinstance(cfg, Config):
            self.seed = cfg.seed
            dtype = dtype or cfg.dtype
            cfg = cfg.model
        else:
            self.seed = None
        dtype = dtype or torch.float64
        if dtype not in (torch.float64, torch.float32):
            raise NotImplementedError("the torch oracle runs in float64 or float32 (no bf16)")
        self.cfg = cfg
        self.embed = Weight((cfg.vocab, cfg.hidden), dtype)
        self.layers = nn.ModuleList(Block(cfg, i, dtype) for i in range(cfg.layers))
        self.final_norm = Weight((cfg.hidden,), dtype)
        if not cfg.tie_embeddings:
            self.lm_head = Weight((cfg.hidden, cfg.vocab), dtype)

    def forward(self, tokens, doc_ids, positions, seq_index=None, step=None, seed=None):
        """logits [B, S, V] and the MoE aux-loss sum over the sequences and MoE layers (a 0-dim
        tensor, zero for a dense model). seq_index [B]: each sequence's position in the step's
        global batch (default 0..B-1); step: the optimizer step, 1-based (keys dropout); seed:
        the run seed (default the Config's)."""
        seed = self.seed if seed is None else seed
        if self.cfg.dropout > 0 and seed is None:
            raise ValueError("dropout needs the run seed: build Model from a Config or pass seed")
        if seq_index is None:
            seq_index = torch.arange(tokens.shape[0], device=tokens.device)
        dtype = self.embed.weight.dtype
        ctx = Context(self.cfg, seed, doc_ids, positions, seq_index, step, dtype)
        x = self.embed.weight[tokens]
        aux = torch.zeros((), dtype=torch.float64, device=x.device)
        for layer in self.layers:
            x, a = layer(x, ctx)
            if a is not None:
                aux = aux + a
        y = rmsnorm(x, self.final_norm.weight)
        if self.cfg.tie_embeddings:
            logits = y @ self.embed.weight.t()
        else:
            logits = y @ self.lm_head.weight
        return logits, aux


@torch.no_grad()
def init_(model, cfg, seed=None):
    """Fills every parameter with the reference initialisation (README "Initialisation"):
    element n of `name` from Philox normal(seed, name, n) at step 0; f32 = the f64 value rounded.
    A DTensor parameter gets its local shard's slice of the full initialisation."""
    mcfg = cfg.model if isinstance(cfg, Config) else cfg
    seed = cfg.seed if seed is None else seed
    for name, p in model.named_parameters():
        full = torch.from_numpy(init_values(mcfg, seed, name, 0, p.numel()).reshape(p.shape))
        _copy_full(p, full)
    return model


def _is_dtensor(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(t, DTensor)


def _copy_full(p, full):
    """p ← full (a CPU float64 tensor of p's global shape), p plain or DTensor (every rank holds
    the same `full`, so each takes its own shard without communicating)."""
    if _is_dtensor(p):
        from torch.distributed.tensor import distribute_tensor

        d = distribute_tensor(full.to(dtype=p.dtype, device=p.to_local().device), p.device_mesh,
                              p.placements, src_data_rank=None)
        p.to_local().copy_(d.to_local())
    else:
        p.copy_(full.to(dtype=p.dtype, device=p.device))
