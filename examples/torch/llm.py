"""A scenario's model trained by a torch data-parallel script and judged against shardcheck's C++
oracle, tensor by tensor. The model is shardcheck.torch.oracle's PyTorch port of the reference
(reference/README.md: the same parameter names, initialisation, batches and dropout, so no RNG has
to agree); the script is what a team writes around it — DDP, FSDP2 or HSDP, each rank its slice
of the global batch in microbatches, the loss weighted by the global batch's counts, clipping by
the global norm, AdamW — and it records every step with shardcheck.torch.record.Recorder (loss,
gradients before clipping, parameters after the update) in the --dump-tensors layout:

    build/default/harness/shardcheck run SCENARIO --dump-tensors out/oracle
    .venv/bin/python examples/torch/llm.py SCENARIO --strategy fsdp2 --dump out/run
    build/default/harness/shardcheck compare out/oracle out/run --report out/compare

Planted bugs: mean_of_means (each microbatch's loss a mean over its own tokens) and
local_norm_clip (FSDP2: clipping by the norm of this rank's gradient shards)."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import common  # noqa: F401  (puts python/ on the path)
import shardcheck.torch as sct
import shardcheck.torch.oracle as so
from shardcheck.torch.record import Recorder

STRATEGIES = ("ddp", "fsdp2", "hsdp")
BUGS = ("mean_of_means", "local_norm_clip")


def wrap(model, strategy, world, device):
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model.to(device)), model
    from torch.distributed.fsdp import fully_shard

    if strategy == "hsdp":
        mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh), model


def local_norm_clip(params, max_norm):
    """The bug: the reference rule, but on the norm of this rank's shards."""
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    factor = so.clip_factor(norm, max_norm)
    for g in grads:
        g.mul_(factor)
    return norm, factor


def train(rank, world, cfg, strategy="fsdp2", bug=None, device="cpu", dump=None):
    """Trains cfg.train.steps steps; with `dump`, rank 0 records the run there (Recorder).
    device "cuda": each rank on its GPU (under torchrun with NCCL)."""
    device = torch.device(device)
    model = so.Model(cfg)
    if strategy == "ddp":
        so.init_(model, cfg)
        ddp, model = wrap(model, strategy, world, device)
        forward = ddp
    else:
        forward, model = wrap(model, strategy, world, device)
        so.init_(model, cfg)
    rec = Recorder(dump, model, writer=rank == 0) if dump else None
    opt = so.ReferenceAdamW(model.parameters(), cfg)
    for step in range(1, cfg.train.steps + 1):
        batch = so.global_batch(cfg, step)
        tw, sw = so.token_weights(batch)
        parts = []
        for mb in batch.rank_slice(rank, world).microbatches(cfg.train.micro_batch):
            tokens, doc_ids, positions, index, targets, mask = (
                t.to(device) for t in (mb.tokens, mb.doc_ids, mb.positions, mb.index, mb.targets,
                                       mb.loss_mask))
            logits, aux = forward(tokens, doc_ids, positions, index, step)
            p = so.loss_parts(logits, targets, mask, aux)
            if bug == "mean_of_means":
                objective = p.loss_sum / max(p.tokens, 1) + p.aux_sum / p.sequences
                objective = objective / (len(batch.index) // cfg.train.micro_batch)
            else:
                objective = so.objective(p, tw, sw)
            (objective * world).backward()  # DDP and FSDP average over the ranks
            parts.append(p)
        sums = torch.tensor([float(sum(p.loss_sum.detach() for p in parts)),
                             float(sum(p.tokens for p in parts)),
                             float(sum(p.aux_sum.detach() for p in parts)),
                             float(sum(p.sequences for p in parts))], dtype=torch.float64,
                            device=device)
        dist.all_reduce(sums)
        sums = sums.cpu()
        loss = so.LossParts(sums[0], int(sums[1]), sums[2], int(sums[3])).loss()
        if rec:
            rec.grads(step)
        if bug == "local_norm_clip":
            local_norm_clip(list(model.parameters()), cfg.train.clip_grad_norm)
        else:
            so.clip_(model.parameters(), cfg.train.clip_grad_norm)
        opt.step()
        opt.zero_grad()
        if rec:
            rec.step(step, loss=loss)
    if rec:
        rec.close()


def run(scenario, world=4, strategy="fsdp2", bug=None, dump=None):
    """The job on the shardcheck backend; rank 0 records it in `dump` if given."""
    cfg = so.Config.from_scenario(scenario)
    sct.spawn(lambda r: train(r, world, cfg, strategy, bug, dump=dump), world)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="a scenario JSON (its model, train, data and seed)")
    p.add_argument("--strategy", choices=STRATEGIES, default="fsdp2")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--bug", choices=BUGS, default=None, help="plant a user bug")
    p.add_argument("--dump", required=True, help="write the run's tensors here")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="under torchrun: cpu (gloo) or cuda (NCCL, a GPU per rank)")
    a = p.parse_args(argv)
    if "RANK" in os.environ:  # under torchrun: one process per rank, gloo or NCCL
        device = "cpu"
        if a.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            device = f"cuda:{torch.cuda.current_device()}"
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        cfg = so.Config.from_scenario(a.scenario)
        train(dist.get_rank(), dist.get_world_size(), cfg, a.strategy, a.bug, device, a.dump)
        dist.destroy_process_group()
    else:
        run(a.scenario, a.world_size, a.strategy, a.bug, a.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
