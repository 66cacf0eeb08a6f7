"""The oracle's configuration: a scenario's model, train and data objects and its seed, with the
defaults of scenarios/README.md (Config.from_scenario), and param_shapes, the parameters' names
and shapes in the reference's order (the dump contract)."""

import dataclasses
import json
import os

import torch

MLP_KINDS = ("gelu", "swiglu")
ROPE_LAYOUTS = ("interleaved", "half")


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency scaling ("rope_type": "llama3", Meta's apply_scaling), its published
    values as defaults: wavelengths 2π/f longer than original_max_position_embeddings /
    low_freq_factor take f / factor, those shorter than original / high_freq_factor keep f, and
    those between blend the two linearly in original / wavelength."""

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        w = "model.rope.scaling"
        if self.rope_type != "llama3":
            raise ValueError(f"{w}.rope_type must be \"llama3\", got {self.rope_type!r}")
        for name, lo, hi in (("factor", 1.0, 1e6), ("low_freq_factor", 1e-6, 1e6),
                             ("high_freq_factor", 1e-6, 1e6)):
            v = getattr(self, name)
            if not _is_number(v) or not lo <= v <= hi:
                raise ValueError(f"{w}.{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"{w}.high_freq_factor must be greater than low_freq_factor "
                             f"({self.low_freq_factor!r}), got {self.high_freq_factor!r}")
        v = self.original_max_position_embeddings
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{w}.original_max_position_embeddings must be a positive integer, "
                             f"got {v!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            object.__setattr__(self, name, float(getattr(self, name)))


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding as the model families define it (scenario key model.rope):
    pair j < d/2 of each head turns by position · theta^(-2j/d), rescaled by `scaling` (None or
    RopeScaling); layout "interleaved" pairs channels (2j, 2j+1) (Meta's Llama code,
    torchtitan), "half" pairs (j, j + d/2) (GPT-NeoX, Hugging Face's rotate_half). The angles
    are model.rope_frequencies(self, d)."""

    theta: float = 10000.0
    layout: str = "interleaved"
    scaling: RopeScaling = None

    def __post_init__(self):
        if not _is_number(self.theta) or not 1.0 < self.theta <= 1e12:
            raise ValueError(f"model.rope.theta must be a number > 1 and <= 1e12, got "
                             f"{self.theta!r}")
        if self.layout not in ROPE_LAYOUTS:
            raise ValueError(f"model.rope.layout must be \"interleaved\" or \"half\", got "
                             f"{self.layout!r}")
        if self.scaling is not None and not isinstance(self.scaling, RopeScaling):
            raise ValueError(f"model.rope.scaling must be None or a RopeScaling, got "
                             f"{self.scaling!r}")
        object.__setattr__(self, "theta", float(self.theta))

    @classmethod
    def from_json(cls, r):
        """From a scenario's model.rope (None or absent: the defaults; "scaling": {} is the
        llama3 defaults); unknown keys and values refused naming the key."""
        if r is None:
            return cls()
        _known(r, [f.name for f in dataclasses.fields(cls)], "$.model.rope")
        scaling = r.get("scaling")
        if scaling is not None:
            _known(scaling, [f.name for f in dataclasses.fields(RopeScaling)],
                   "$.model.rope.scaling")
            scaling = RopeScaling(**scaling)
        return cls(theta=r.get("theta", cls.theta), layout=r.get("layout", cls.layout),
                   scaling=scaling)


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    experts: int = 4
    top_k: int = 2
    capacity_factor: float = 1.25
    every: int = 2
    aux_loss: float = 0.01


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    # Tensor parallelism's vocabulary padding (masked, never updated): a layout, not the math;
    # the oracle computes over the logical vocabulary.
    vocab_pad_multiple: int = 1
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 64
    mlp: str = "gelu"  # gelu(x·w_up)·w_down, or "swiglu": (silu(x·w_gate) * x·w_up)·w_down
    seq_len: int = 16
    tie_embeddings: bool = True
    dropout: float = 0.0
    rope: RopeConfig = RopeConfig()
    moe: MoeConfig = None

    def __post_init__(self):
        m = self.vocab_pad_multiple
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 65536:
            raise ValueError(f"model.vocab_pad_multiple must be an integer in [1, 65536], got {m!r}")
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"model.mlp must be \"gelu\" or \"swiglu\", got {self.mlp!r}")
        if not isinstance(self.rope, RopeConfig):
            raise ValueError(f"model.rope must be a RopeConfig, got {self.rope!r}")

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def gated_mlp(self):
        """True for SwiGLU: every MLP (dense and each expert) has w_gate besides w_up, w_down."""
        return self.mlp == "swiglu"

    def is_moe_layer(self, i):
        return self.moe is not None and (i + 1) % self.moe.every == 0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup: int = 1
    min_lr: float = 1e-4


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 3
    global_batch: int = 8
    micro_batch: int = 1
    precision: str = "f64"
    optimizer: OptimizerConfig = OptimizerConfig()
    clip_grad_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    documents: int = 256
    min_len: int = 4
    max_len: int = 24
    packing: bool = True
    drop_last: bool = True


def _known(obj, keys, where):
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object")
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(keys)}")


@dataclasses.dataclass(frozen=True)
class Config:
    """A scenario's model, train and data objects and its seed (the parts the oracle reads)."""

    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    seed: int = 1234

    @classmethod
    def from_scenario(cls, scenario):
        """From a scenario JSON file's path or its parsed dict, with scenarios/README.md's
        defaults for every key left out. Other top-level keys (parallel, matrix, ...) are
        ignored."""
        if not isinstance(scenario, dict):
            with open(os.fspath(scenario)) as f:
                scenario = json.load(f)
        m = scenario.get("model") or {}
        _known(m, [f.name for f in dataclasses.fields(ModelConfig)], "$.model")
        moe = None
        if m.get("moe") is not None:
            mo = m["moe"]
            _known(mo, [f.name for f in dataclasses.fields(MoeConfig)], "$.model.moe")
            moe = MoeConfig(**{k: mo[k] for k in mo})
        heads = int(m.get("heads", ModelConfig.heads))
        model = ModelConfig(
            vocab=int(m.get("vocab", ModelConfig.vocab)),
            vocab_pad_multiple=m.get("vocab_pad_multiple", 1),
            hidden=int(m.get("hidden", ModelConfig.hidden)),
            layers=int(m.get("layers", ModelConfig.layers)),
            heads=heads,
            kv_heads=int(m.get("kv_heads", heads)),
            ffn=int(m.get("ffn", ModelConfig.ffn)),
            mlp=m.get("mlp", ModelConfig.mlp),
            seq_len=int(m.get("seq_len", ModelConfig.seq_len)),
            tie_embeddings=bool(m.get("tie_embeddings", True)),
            dropout=float(m.get("dropout", 0.0)),
            rope=RopeConfig.from_json(m.get("rope")),
            moe=moe)
        t = scenario.get("train") or {}
        _known(t, ["steps", "global_batch", "micro_batch", "precision", "optimizer",
                   "clip_grad_norm", "activation_checkpointing"], "$.train")
        o = t.get("optimizer") or {}
        _known(o, ["lr", "betas", "eps", "weight_decay", "warmup", "min_lr"], "$.train.optimizer")
        lr = float(o.get("lr", OptimizerConfig.lr))
        betas = o.get("betas") or [OptimizerConfig.beta1, OptimizerConfig.beta2]
        opt = OptimizerConfig(
            lr=lr, beta1=float(betas[0]), beta2=float(betas[1]),
            eps=float(o.get("eps", OptimizerConfig.eps)),
            weight_decay=float(o.get("weight_decay", OptimizerConfig.weight_decay)),
            warmup=int(o.get("warmup", OptimizerConfig.warmup)),
            min_lr=float(o.get("min_lr", min(OptimizerConfig.min_lr, lr))))
        train = TrainConfig(
            steps=int(t.get("steps", TrainConfig.steps)),
            global_batch=int(t.get("global_batch", TrainConfig.global_batch)),
            micro_batch=int(t.get("micro_batch", TrainConfig.micro_batch)),
            precision=str(t.get("precision", "f64")),
            optimizer=opt,
            clip_grad_norm=float(t.get("clip_grad_norm", TrainConfig.clip_grad_norm)))
        d = scenario.get("data") or {}
        _known(d, [f.name for f in dataclasses.fields(DataConfig)], "$.data")
        min_len = int(d.get("min_len", DataConfig.min_len))
        data = DataConfig(
            documents=int(d.get("documents", DataConfig.documents)),
            min_len=min_len,
            max_len=int(d.get("max_len", max(DataConfig.max_len, min_len))),
            packing=bool(d.get("packing", True)),
            drop_last=bool(d.get("drop_last", True)))
        cfg = cls(model=model, train=train, data=data, seed=int(scenario.get("seed", 1234)))
        cfg.validate()
        return cfg

    def validate(self):
        m, t, d, o = self.model, self.train, self.data, self.train.optimizer
        checks = [
            (m.vocab >= 3, "model.vocab must be >= 3 (synthetic data)"),
            (m.hidden % m.heads == 0, "model.hidden must be divisible by model.heads"),
            (m.heads % m.kv_heads == 0, "model.heads must be divisible by model.kv_heads"),
            (m.head_dim % 2 == 0, "the head dimension hidden / heads must be even (RoPE)"),
            (m.seq_len >= 2, "model.seq_len must be >= 2"),
            (0.0 <= m.dropout < 1.0, "model.dropout must be in [0, 1)"),
            (m.moe is None or 1 <= m.moe.top_k <= m.moe.experts,
             "model.moe.top_k must be in [1, experts]"),
            (m.moe is None or 1 <= m.moe.every <= m.layers,
             "model.moe.every must be in [1, layers]"),
            (t.global_batch % t.micro_batch == 0, "train.micro_batch must divide global_batch"),
            (t.precision in ("f64", "f32", "bf16"), "train.precision: f64, f32 or bf16"),
            (0 <= o.warmup <= t.steps, "train.optimizer.warmup must be in [0, steps]"),
            (1 <= d.min_len <= d.max_len, "data: 1 <= min_len <= max_len"),
        ]
        for ok, what in checks:
            if not ok:
                raise ValueError(what)

    @property
    def dtype(self):
        """The torch dtype of parameters, gradients, activations and moments: float64 for f64,
        float32 for f32 and for bf16 (whose master weights, moments, activations and accumulated
        gradients are f32; the Trainer rounds the working weights and each microbatch's
        gradients to bf16 on top)."""
        if self.train.precision == "f64":
            return torch.float64
        return torch.float32


def param_shapes(model_cfg):
    """[(name, shape)] in the reference's order (the dump contract)."""
    m = model_cfg
    h, v, f, d = m.hidden, m.vocab, m.ffn, m.head_dim

    def mlp(prefix):  # SwiGLU's w_gate comes before w_up
        gate = [(prefix + "w_gate", (h, f))] if m.gated_mlp else []
        return gate + [(prefix + "w_up", (h, f)), (prefix + "w_down", (f, h))]

    out = [("embed.weight", (v, h))]
    for i in range(m.layers):
        p = f"layers.{i}."
        out += [(p + "attn_norm.weight", (h,)), (p + "attn.wq", (h, m.heads * d)),
                (p + "attn.wk", (h, m.kv_heads * d)), (p + "attn.wv", (h, m.kv_heads * d)),
                (p + "attn.wo", (m.heads * d, h)), (p + "mlp_norm.weight", (h,))]
        if m.is_moe_layer(i):
            out.append((p + "moe.router", (h, m.moe.experts)))
            for e in range(m.moe.experts):
                out += mlp(p + f"moe.experts.{e}.")
        else:
            out += mlp(p + "mlp.")
    out.append(("final_norm.weight", (h,)))
    if not m.tie_embeddings:
        out.append(("lm_head.weight", (h, v)))
    return out
