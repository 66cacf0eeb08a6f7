"""shardcheck's reference model ("the oracle") in PyTorch, exact to the C++ one in float64.

reference/README.md pins the model, the synthetic data and sampler, the loss, the initialisation,
every random draw, AdamW, the schedule and the clipping rule; this module rebuilds all of it with
torch ops, so that a team's PyTorch training of the same model (DDP, FSDP2, TP, ...) can be
compared tensor by tensor with the C++ oracle's dump (`shardcheck run S --dump-tensors DIR`):
parameter names are the dump's, shapes are [in, out] with y = x @ W, and the random numbers come
from the same counter-based Philox, keyed by global indices, so any split of the work draws the
same initialisation and dropout masks.

    import shardcheck.torch.oracle as so

    cfg = so.Config.from_scenario("scenarios/parity/data_parallel_dense.json")
    trainer = so.Trainer(cfg)
    records = trainer.run(dump="out/torch-oracle")     # all cfg.train.steps, in the dump layout

and the pieces a distributed script needs:

    model = so.Model(cfg); so.init_(model, cfg)        # same init on every rank (pure function)
    opt = so.ReferenceAdamW(model.parameters(), cfg)   # plain or DTensor (FSDP2) parameters
    batch = so.global_batch(cfg, step)                 # the step's global batch (Batch)
    tw, sw = so.token_weights(batch)                   # 1 / global mask count, 1 / #sequences
    mine = batch.rank_slice(rank, world)               # keeps the global sequence indices
    for mb in mine.microbatches(cfg.train.micro_batch):
        logits, aux = model(mb.tokens, mb.doc_ids, mb.positions, mb.index, step)
        parts = so.loss_parts(logits, mb.targets, mb.loss_mask, aux, len(mb))
        (so.objective(parts, tw, sw) * world).backward()  # * world: DDP/FSDP average over ranks
    norm, factor = so.clip_(model.parameters(), cfg.train.clip_grad_norm)
    opt.step(); opt.zero_grad()

Precision: "f64" (exact to float64 rounding), "f32" (parameters, gradients, activations and
moments in float32, init = the f64 init rounded), "bf16" (the Trainer's: f32 master weights and
moments, working weights = the master rounded to bf16 each step, f32 forward/backward, each
microbatch's gradients rounded to bf16 and accumulated in f32; the tied-embedding variant that
rounds the two uses apart is not implemented: the dumped reference rounds their sum). MoE layers
(top-k routing with capacity and the aux loss, one routing group per sequence), the GELU or
SwiGLU MLP (model.mlp) and RoPE as the model families define it (model.rope: theta, layout
"interleaved" or "half", Llama 3.1's "llama3" frequency scaling; RopeConfig) are implemented.

Not bitwise: the C++ reference sums in plain loops, torch in its own (blocked, vectorised) order,
so f64 results agree to a few ulps per op (measured on the f64 scenarios of scenarios/parity,
2-3 steps: max relative error per tensor ≤ 3e-16 on the loss, ≤ 2e-13 on gradients, ≤ 4e-13 on
parameters). Bitwise: initialisation (the same libm calls), batches, dropout masks and the RoPE
angles (frequencies, cos and sin: rope_frequencies is RopeConfig::frequencies op for op).

Submodules, each importing only those before it: rng (Philox, RngStream), config (Config,
RopeConfig, param_shapes), data (corpus, packing, sampler, Batch, global_batch, token_weights),
model (Model, init_ and its pieces), loss (LossParts, loss_parts, objective), optim (lr_at, clip_,
ReferenceAdamW), train (Trainer, bf16_round, train_and_dump). Everything public is re-exported here;
patch a function where it is used (e.g. shardcheck.torch.oracle.model.rope), not on this package."""

from .config import (  # noqa: F401
    Config, DataConfig, ModelConfig, MoeConfig, OptimizerConfig, RopeConfig, RopeScaling,
    TrainConfig, param_shapes)
from .data import (  # noqa: F401
    FIELDS, Batch, Dataset, dataset, global_batch, global_counts, make_documents, pack_documents,
    permutation, token_weights)
from .loss import LossParts, global_loss, loss_parts, objective, token_losses  # noqa: F401
from .model import (  # noqa: F401
    GELU_C, RMSNORM_EPS, ROPE_THETA, MLP, Attention, Block, Context, Model, MoE, Weight,
    dropout_scale, gelu, init_, init_values, moe_capacity, rmsnorm, rope, rope_frequencies,
    rope_tables, swiglu)
from .optim import ReferenceAdamW, clip_, clip_factor, grad_norm, lr_at  # noqa: F401
from .rng import RngStream, fnv1a32, philox4x32_10  # noqa: F401
from .train import StepRecord, Trainer, bf16_round, train_and_dump  # noqa: F401
