#!/usr/bin/env python3
"""Independent re-implementation of the reference model from reference/README.md alone, in plain
Python (no NumPy), checked against a --dump-tensors directory: initial parameters (Philox init),
the parameters' names, order and shapes, the step-1 loss (forward incl. RoPE with its theta,
layout and Llama 3.1 scaling, GQA, document mask, dropout, MoE, the GELU or SwiGLU MLP), the
step-1 gradients (central differences of that loss along fixed ±1 directions: the RoPE'd
projections wq and wk, each MLP matrix kind, every parameter) and the step-1 AdamW update.
Not a trainer: it recomputes one step. Usage: check_dump.py DIR (DIR holds index.json, config.json)
or check_dump.py --run REFERENCE_TESTS_BINARY (writes the dumps through the test binary first)."""

import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

MASK = 0xFFFFFFFF


# ---- Philox-4x32-10 and the draws (README "Randomness") ----
def philox(ctr, key):
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & MASK, (k[1] + 0xBB67AE85) & MASK]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & MASK, p1 & MASK, ((p0 >> 32) ^ c[3] ^ k[1]) & MASK, p0 & MASK]
    return c


def fnv1a32(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & MASK
    return h


def block(seed, name, step, index):
    return philox([index & MASK, index >> 32, step, fnv1a32(name)], [seed & MASK, seed >> 32])


def uniform(seed, name, step, index):
    w = block(seed, name, step, index)
    return ((w[0] << 32 | w[1]) >> 11) * 2.0**-53


def normal(seed, name, index):
    w = block(seed, name, 0, index)
    u1 = (((w[0] << 32 | w[1]) >> 11) + 1) * 2.0**-53
    u2 = ((w[2] << 32 | w[3]) >> 11) * 2.0**-53
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


# ---- .npy reading ----
def load_npy(path):
    raw = open(path, "rb").read()
    assert raw[:6] == b"\x93NUMPY" and raw[6] == 1 and raw[7] == 0, path
    hlen = raw[8] | raw[9] << 8
    assert (10 + hlen) % 64 == 0, path
    header = eval(raw[10:10 + hlen].decode("latin1"))  # a Python dict literal, by the format
    fmt = {"<f8": "d", "<f4": "f", "<i4": "i", "<i8": "q"}[header["descr"]]
    assert not header["fortran_order"]
    n = 1
    for d in header["shape"]:
        n *= d
    data = list(struct.unpack("<%d%s" % (n, fmt), raw[10 + hlen:]))
    return list(header["shape"]), data


def rows(flat, ncols):
    return [flat[i:i + ncols] for i in range(0, len(flat), ncols)]


def matmul(x, w):  # x [n][in], w [in][out]
    out = len(w[0])
    return [[sum(xr[i] * w[i][o] for i in range(len(xr))) for o in range(out)] for xr in x]


def transpose(m):
    return [list(c) for c in zip(*m)]


def rmsnorm(x, w):
    out = []
    for r in x:
        inv = 1.0 / math.sqrt(sum(v * v for v in r) / len(r) + 1e-5)
        out.append([v * inv * wi for v, wi in zip(r, w)])
    return out


def gelu(v):
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


def silu(v):
    return v / (1 + math.exp(-v))


ROPE_KEYS = {"theta": 10000.0, "layout": "interleaved", "scaling": None}
ROPE_SCALING_KEYS = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_config(cfg):
    """config.json's "rope" with the defaults filled in (absent or null: theta 10000,
    interleaved, no scaling; "scaling": {} is Llama 3.1's llama3 values); raises ValueError
    naming the key for an unknown key or value."""
    def number(v, key):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("rope.%s: expected a number, got %r" % (key, v))
        return float(v)

    r = cfg.get("rope")
    r = {} if r is None else r
    if not isinstance(r, dict):
        raise ValueError("rope: expected an object, got %r" % (r,))
    unknown = sorted(set(r) - set(ROPE_KEYS))
    if unknown:
        raise ValueError("rope: unknown key(s) %s" % unknown)
    out = dict(ROPE_KEYS, **r)
    out["theta"] = number(out["theta"], "theta")
    if not out["theta"] > 1.0:
        raise ValueError("rope.theta: expected > 1, got %r" % out["theta"])
    if out["layout"] not in ("interleaved", "half"):
        raise ValueError("rope.layout: expected \"interleaved\" or \"half\", got %r"
                         % out["layout"])
    if out["scaling"] is not None:
        sc = out["scaling"]
        if not isinstance(sc, dict):
            raise ValueError("rope.scaling: expected an object or null, got %r" % (sc,))
        unknown = sorted(set(sc) - set(ROPE_SCALING_KEYS))
        if unknown:
            raise ValueError("rope.scaling: unknown key(s) %s" % unknown)
        sc = dict(ROPE_SCALING_KEYS, **sc)
        if sc["rope_type"] != "llama3":
            raise ValueError("rope.scaling.rope_type: expected \"llama3\", got %r"
                             % sc["rope_type"])
        for k in ROPE_SCALING_KEYS:
            if k != "rope_type":
                sc[k] = number(sc[k], "scaling." + k)
        if not (sc["factor"] >= 1 and 0 < sc["low_freq_factor"] < sc["high_freq_factor"]
                and sc["original_max_position_embeddings"] > 0):
            raise ValueError("rope.scaling: expected factor >= 1, 0 < low_freq_factor < "
                             "high_freq_factor, original_max_position_embeddings > 0: %r" % sc)
        out["scaling"] = sc
    return out


def rope_frequencies(r, d):
    """Angle per position of pair j < d/2: theta^(-2j/d) (the C library's pow); with Llama 3.1's
    scaling (Meta's apply_scaling), by wavelength 2π/f against original / low_freq_factor (longer:
    f / factor) and original / high_freq_factor (not shorter: the two blended linearly in
    original / wavelength; shorter: f kept)."""
    out = []
    for j in range(d // 2):
        f = r["theta"] ** (-2.0 * j / d)
        sc = r["scaling"]
        if sc is not None:
            wavelen = 2.0 * math.pi / f
            old = sc["original_max_position_embeddings"]
            lo, hi = sc["low_freq_factor"], sc["high_freq_factor"]
            if wavelen > old / lo:
                f = f / sc["factor"]
            elif wavelen >= old / hi:
                smooth = (old / wavelen - lo) / (hi - lo)
                f = (1.0 - smooth) * f / sc["factor"] + smooth * f
        out.append(f)
    return out


def rope(x, pos, heads, r):
    """Rotates pair j of every head by pos · f_j: channels (2j, 2j+1) when r["layout"] is
    "interleaved", (j, j + d/2) when "half"; (a, b) -> (a cos - b sin, a sin + b cos)."""
    d = len(x[0]) // heads
    freqs = rope_frequencies(r, d)
    half = r["layout"] == "half"
    out = [list(row) for row in x]
    for t, p in enumerate(pos):
        for h in range(heads):
            for j in range(d // 2):
                ang = p * freqs[j]
                c0, c1 = h * d + (j if half else 2 * j), h * d + (j + d // 2 if half else 2 * j + 1)
                a, b = x[t][c0], x[t][c1]
                out[t][c0] = a * math.cos(ang) - b * math.sin(ang)
                out[t][c1] = a * math.sin(ang) + b * math.cos(ang)
    return out


class Model:
    def __init__(self, cfg, params, seed, step):
        self.c, self.p, self.seed, self.step = cfg, params, seed, step
        self.routing = []  # per MoE call: its top-k choices and the kept assignments
        self.rope = rope_config(cfg)

    def w(self, name):
        return self.p[name]

    def attention(self, i, a, seq, b_index):
        c = self.c
        heads, kv, d = c["heads"], c["kv_heads"], c["hidden"] // c["heads"]
        pre = "layers.%d.attn." % i
        q = rope(matmul(a, self.w(pre + "wq")), seq["positions"], heads, self.rope)
        k = rope(matmul(a, self.w(pre + "wk")), seq["positions"], kv, self.rope)
        v = matmul(a, self.w(pre + "wv"))
        s = len(a)
        o = [[0.0] * (heads * d) for _ in range(s)]
        rate = c["dropout"]
        for h in range(heads):
            g = h // (heads // kv)
            for qi in range(s):
                vis = [j for j in range(qi + 1) if seq["doc_ids"][j] == seq["doc_ids"][qi]]
                sc = [sum(q[qi][h * d + x] * k[j][g * d + x] for x in range(d)) / math.sqrt(d) for j in vis]
                mx = max(sc)
                e = [math.exp(z - mx) for z in sc]
                tot = sum(e)
                for j, ej in zip(vis, e):
                    p = ej / tot
                    if rate > 0:
                        idx = ((b_index * heads + h) * s + qi) * s + j
                        keep = uniform(self.seed, "dropout/layers.%d" % i, self.step, idx) >= rate
                        p = p / (1 - rate) if keep else 0.0
                    for x in range(d):
                        o[qi][h * d + x] += p * v[j][g * d + x]
        return matmul(o, self.w(pre + "wo"))

    def mlp(self, x, prefix):
        """The MLP (dense or one expert) whose weights are prefix + w_gate/w_up/w_down: GELU is
        gelu(x·w_up)·w_down, SwiGLU (silu(x·w_gate) * (x·w_up))·w_down."""
        up = matmul(x, self.w(prefix + "w_up"))
        if self.c.get("mlp", "gelu") == "swiglu":
            gate = matmul(x, self.w(prefix + "w_gate"))
            act = [[silu(g) * u for g, u in zip(gr, ur)] for gr, ur in zip(gate, up)]
        else:
            act = [[gelu(z) for z in r] for r in up]
        return matmul(act, self.w(prefix + "w_down"))

    def moe(self, i, x, seq):
        c, m = self.c, self.c["moe"]
        E, k = m["experts"], m["top_k"]
        pre = "layers.%d.moe." % i
        logits = matmul(x, self.w(pre + "router"))
        probs = []
        for r in logits:
            mx = max(r)
            e = [math.exp(z - mx) for z in r]
            probs.append([z / sum(e) for z in e])
        s = len(x)
        routed = [t for t in range(s) if seq["doc_ids"][t] >= 0]
        choice, gate = {}, {}
        for t in routed:
            order = sorted(range(E), key=lambda e: (-probs[t][e], e))[:k]
            tot = sum(probs[t][e] for e in order)
            for ci, e in enumerate(order):
                choice[t, ci], gate[t, ci] = e, probs[t][e] / tot
        cap = math.ceil(m["capacity_factor"] * s * k / E - 1e-9)
        load, kept = [0] * E, set()
        for ci in range(k):
            for t in routed:
                e = choice[t, ci]
                if load[e] < cap:
                    load[e] += 1
                    kept.add((t, ci))
        self.routing.append((sorted(choice.items()), sorted(kept)))
        y = [[0.0] * len(x[0]) for _ in range(s)]
        for t in routed:
            for ci in range(k):
                if (t, ci) in kept:
                    out = self.mlp([x[t]], pre + "experts.%d." % choice[t, ci])[0]
                    y[t] = [a + gate[t, ci] * b for a, b in zip(y[t], out)]
        aux = 0.0
        if routed:
            T = len(routed)
            for e in range(E):
                f = sum(1 for t in routed for ci in range(k) if choice[t, ci] == e) / (k * T)
                P = sum(probs[t][e] for t in routed) / T
                aux += f * P
            aux *= m["aux_loss"] * E
        return y, aux

    def sequence_loss(self, seq, b_index):
        c = self.c
        x = [list(self.w("embed.weight")[t]) for t in seq["tokens"]]
        aux = 0.0
        for i in range(c["layers"]):
            pre = "layers.%d." % i
            att = self.attention(i, rmsnorm(x, self.w(pre + "attn_norm.weight")[0]), seq, b_index)
            x = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(x, att)]
            hN = rmsnorm(x, self.w(pre + "mlp_norm.weight")[0])
            if c.get("moe") and (i + 1) % c["moe"]["every"] == 0:
                y, a = self.moe(i, hN, seq)
                aux += a
            else:
                y = self.mlp(hN, pre + "mlp.")
            x = [[a + b for a, b in zip(r1, r2)] for r1, r2 in zip(x, y)]
        y = rmsnorm(x, self.w("final_norm.weight")[0])
        head = transpose(self.w("embed.weight")) if c["tie_embeddings"] else self.w("lm_head.weight")
        logits = matmul(y, head)
        total, count = 0.0, 0
        for t, r in enumerate(logits):
            if seq["loss_mask"][t]:
                mx = max(r)
                total += mx + math.log(sum(math.exp(z - mx) for z in r)) - r[seq["targets"][t]]
                count += 1
        return total, count, aux


def param_shapes(cfg):
    """[(name, shape)] in README "Parameters" order; with "mlp": "swiglu" each MLP (dense or
    expert) has w_gate [h, f] before its w_up. Shapes with f = cfg["ffn"] (None when the config
    does not say)."""
    h, v, f = cfg["hidden"], cfg["vocab"], cfg.get("ffn")
    a, kv, d = cfg["heads"], cfg["kv_heads"], cfg["hidden"] // cfg["heads"]
    gated = cfg.get("mlp", "gelu") == "swiglu"

    def mlp(p):
        return ([(p + "w_gate", [h, f])] if gated else []) + [(p + "w_up", [h, f]),
                                                               (p + "w_down", [f, h])]

    out = [("embed.weight", [v, h])]
    for i in range(cfg["layers"]):
        p = "layers.%d." % i
        out += [(p + "attn_norm.weight", [h]), (p + "attn.wq", [h, a * d]),
                (p + "attn.wk", [h, kv * d]), (p + "attn.wv", [h, kv * d]),
                (p + "attn.wo", [a * d, h]), (p + "mlp_norm.weight", [h])]
        if cfg.get("moe") and (i + 1) % cfg["moe"]["every"] == 0:
            out.append((p + "moe.router", [h, cfg["moe"]["experts"]]))
            for e in range(cfg["moe"]["experts"]):
                out += mlp(p + "moe.experts.%d." % e)
        else:
            out += mlp(p + "mlp.")
    out.append(("final_norm.weight", [h]))
    if not cfg["tie_embeddings"]:
        out.append(("lm_head.weight", [h, v]))
    return out


def init_value(cfg, seed, name, index):
    if name.endswith("norm.weight"):
        return 1.0
    std = 0.02
    if name.endswith(".attn.wo") or name.endswith(".w_down"):
        std /= math.sqrt(2.0 * cfg["layers"])
    return std * normal(seed, name, index)


def lr_at(o, step, total):
    if o["warmup"] > 0 and step <= o["warmup"]:
        return o["lr"] * step / o["warmup"]
    n = total - o["warmup"]
    if n <= 0:
        return o["lr"]
    prog = min(1.0, (step - o["warmup"]) / n)
    return o["min_lr"] + (o["lr"] - o["min_lr"]) * 0.5 * (1 + math.cos(math.pi * prog))


def below(seed, name, step, index, n):
    w = block(seed, name, step, index)
    return (w[0] << 32 | w[1]) % n


def make_document(seed, d, vocab, min_len, max_len):
    length = min_len + below(seed, "data/length", 0, d, max_len - min_len + 1)
    stride = 1 + below(seed, "data/stride", 0, d, 3)
    out = []
    for t in range(length):
        idx = d << 32 | t
        if t == 0 or uniform(seed, "data/noise", 0, idx) < 0.1:
            out.append(1 + below(seed, "data/token", 0, idx, vocab - 1))
        else:
            out.append(1 + (out[-1] - 1 + stride) % (vocab - 1))
    return out


def packed_samples(cfg):
    """The dataset's sequences as (tokens, targets, loss_mask, doc_ids, positions) lists."""
    data, S = cfg["data"], cfg["seq_len"]
    docs = [make_document(cfg["seed"], d, cfg["vocab"], data["min_len"], data["max_len"])
            for d in range(data["documents"])]

    def stream(d, doc):
        return [(tok, doc[p + 1] if p + 1 < len(doc) else 0, 1 if p + 1 < len(doc) else 0, d, p)
                for p, tok in enumerate(doc)]

    pad = (0, 0, 0, -1, 0)
    if data["packing"]:
        toks = [x for d, doc in enumerate(docs) for x in stream(d, doc)]
        seqs = [toks[i:i + S] for i in range(0, len(toks), S)]
    else:
        seqs = [stream(d, doc)[:S] for d, doc in enumerate(docs)]
    return [[list(f) for f in zip(*(s + [pad] * (S - len(s))))] for s in seqs]


def permutation(seed, epoch, n):
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = below(seed, "sampler/shuffle", epoch, i, i + 1)
        p[i], p[j] = p[j], p[i]
    return p


FD_EPS = 3e-6  # central-difference step along a ±1 direction (parameters are ~0.02)
FD_BOUND = 1e-6  # of sum|grad|; measured ≤ 3e-8 (wq, wk; the rest ≤ 3e-9), a wrong gradient
# formula is off by far more


def step_loss(cfg, params, seed, t):
    """The step-1 loss of the dumped global batch (its microbatches in order) at `params`, and
    the MoE routing it took."""
    model = Model(cfg, params, seed, 1)
    total, count, aux, b_index = 0.0, 0, 0.0, 0
    k = 0
    while "batch/%d/tokens" % k in t:
        fields = {f: t["batch/%d/%s" % (k, f)] for f in ("tokens", "targets", "loss_mask", "doc_ids", "positions")}
        nseq, s = fields["tokens"][0]
        for r in range(nseq):
            seq = {f: v[1][r * s:(r + 1) * s] for f, v in fields.items()}
            lt, ct, at = model.sequence_loss(seq, b_index)
            total, count, aux, b_index = total + lt, count + ct, aux + at, b_index + 1
        k += 1
    return total / count + aux / b_index, model.routing


def check(dirname):
    cfg = json.load(open(os.path.join(dirname, "config.json")))
    index = json.load(open(os.path.join(dirname, "index.json")))
    t = {e["name"]: load_npy(os.path.join(dirname, e["file"])) for e in index}
    seed, failures = cfg["seed"], []

    def expect(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    if cfg.get("mlp", "gelu") not in ("gelu", "swiglu"):
        expect(False, "config.json: mlp %r is neither \"gelu\" nor \"swiglu\"" % cfg["mlp"])
        return failures
    try:
        r = rope_config(cfg)
    except ValueError as e:
        expect(False, "config.json: %s" % e)
        return failures
    sc, hd = r["scaling"], cfg["hidden"] // cfg["heads"]
    unscaled = rope_frequencies(dict(r, scaling=None), hd)
    regime = ["kept" if f == f0 else "divided" if f == f0 / sc["factor"] else "blended"
              for f, f0 in zip(rope_frequencies(r, hd), unscaled)] if sc else []
    print("     rope theta %g, layout %s, scaling %s" % (
        r["theta"], r["layout"], "none" if sc is None else "llama3 factor %g low %g high %g "
        "original %g: pairs %s" % (sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"],
                                   sc["original_max_position_embeddings"], " ".join(regime))))
    names = [e["name"][len("init/param/"):] for e in index if e["name"].startswith("init/param/")]
    expected = param_shapes(cfg)
    got = [(n, t["init/param/" + n][0]) for n in names]
    if cfg.get("ffn") is None:  # an older config.json: names only
        expected, got = [n for n, _ in expected], names
    expect(got == expected, "%d parameters' names, order and shapes (mlp %s)"
           % (len(names), cfg.get("mlp", "gelu")))
    if [n for n, _ in param_shapes(cfg)] != names:
        return failures
    worst = 0.0
    for n in names:
        shape, data = t["init/param/" + n]
        for i, v in enumerate(data):
            worst = max(worst, abs(v - init_value(cfg, seed, n, i)))
    expect(worst <= 1e-17, "init of %d tensors from Philox (max abs diff %.3g)" % (len(names), worst))

    params = {}
    for n in names:
        shape, data = t["init/param/" + n]
        params[n] = rows(data, shape[-1]) if len(shape) == 2 else [data]
    loss, routing = step_loss(cfg, params, seed, t)
    if "data" in cfg:
        samples = packed_samples(cfg)
        ids = permutation(seed, 0, len(samples))[:cfg["global_batch"]]
        got, b = [], 0
        while "batch/%d/tokens" % b in t:
            fields = [t["batch/%d/%s" % (b, f)] for f in ("tokens", "targets", "loss_mask", "doc_ids", "positions")]
            nseq, s = fields[0][0]
            for r in range(nseq):
                got.append([f[1][r * s:(r + 1) * s] for f in fields])
            b += 1
        expect(got == [samples[i] for i in ids],
               "step-1 batch regenerated from the corpus, packing and sampler (samples %s)" % ids)
    ref = t["step1/loss"][1][0]
    expect(abs(loss - ref) <= 1e-12 * abs(ref), "step-1 loss %.15f vs dump %.15f" % (loss, ref))

    # The dumped step-1 gradients against central differences of the loss along a fixed
    # pseudo-random ±1 direction over the RoPE'd projections (wq, wk: RoPE's backward), each
    # MLP matrix kind and every parameter.
    groups = [(kind, [n for n in names if n.endswith("." + kind)])
              for kind in ("wq", "wk", "w_gate", "w_up", "w_down")]
    for label, group in [g for g in groups if g[1]] + [("every parameter", names)]:
        rng = random.Random(label)
        d = {n: [rng.choice((-1.0, 1.0)) for _ in t["init/param/" + n][1]] for n in group}
        want = sum(g * di for n in group for g, di in zip(t["step1/grad/" + n][1], d[n]))
        l1 = sum(abs(g) for n in group for g in t["step1/grad/" + n][1])  # no cancellation

        def moved(step):
            p = dict(params)
            for n in group:
                shape, data = t["init/param/" + n]
                flat = [v + step * di for v, di in zip(data, d[n])]
                p[n] = rows(flat, shape[-1]) if len(shape) == 2 else [flat]
            return step_loss(cfg, p, seed, t)

        # The loss is smooth where the MoE routing (top-k ties, capacity) stays put: a step
        # that changes it is halved.
        eps = FD_EPS
        for _ in range(6):
            (up, r_up), (down, r_down) = moved(eps), moved(-eps)
            if r_up == routing and r_down == routing:
                break
            eps /= 2
        else:
            expect(False, "step-1 gradient of %s: the routing changes at every step tried" % label)
            continue
        fd = (up - down) / (2 * eps)
        err = abs(fd - want) / max(l1, 1e-300)
        expect(err <= FD_BOUND, "step-1 gradient of %s (%d tensors) along a ±1 direction: "
               "dump %.12g, central difference (step %.2g) %.12g (diff / sum|grad| %.2g)"
               % (label, len(group), want, eps, fd, err))

    o = cfg["optimizer"]
    lr = lr_at(o, 1, cfg["steps"])
    norm = math.sqrt(sum(g * g for n in names for g in t["step1/grad/" + n][1]))
    clip = cfg["clip_grad_norm"]
    scale = clip / (norm + 1e-6) if clip > 0 and norm > clip else 1.0
    worst = 0.0
    for n in names:
        shape, p0 = t["init/param/" + n]
        g = t["step1/grad/" + n][1]
        p1 = t["step1/param/" + n][1]
        for i in range(len(p0)):
            gi = g[i] * scale
            p = p0[i] * (1 - lr * o["weight_decay"]) if len(shape) == 2 else p0[i]
            m, v = (1 - o["beta1"]) * gi, (1 - o["beta2"]) * gi * gi
            p -= lr * (m / (1 - o["beta1"])) / (math.sqrt(v / (1 - o["beta2"])) + o["eps"])
            worst = max(worst, abs(p - p1[i]))
    expect(worst <= 1e-15, "step-1 AdamW update, clip scale %.6g (max abs diff %.3g)" % (scale, worst))
    return failures


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--run":
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, SHARDCHECK_ORACLE_DUMP_DIR=d)
            subprocess.run([sys.argv[2], "--gtest_filter=OracleDump.*"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            failures = []
            for sub in sorted(os.listdir(d)):
                print("==", sub)
                failures += check(os.path.join(d, sub))
    elif len(sys.argv) == 2:
        failures = check(sys.argv[1])
    else:
        print(__doc__)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
