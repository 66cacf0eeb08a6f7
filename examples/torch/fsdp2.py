"""FSDP2 (fully_shard) as a team writes it: each block and the root sharded over the data-parallel
ranks, reshard after forward on (ZeRO-3) or off (ZeRO-2), or HSDP (replicate x shard on a 2-D
mesh); the loss normalised by the global count of real tokens, gradients clipped by their global
norm (clip_grad_norm_ on DTensor gradients), AdamW, the full parameters gathered at the end.
Planted bugs: mean_of_means (each rank normalises by its own token count) and local_norm_clip
(clipping by the norm of this rank's gradient shards)."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import common


def shard(model, world, mode):
    if mode == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    reshard = mode != "no_reshard"
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def local_norm_clip(params, max_norm):
    """The bug: the norm of this rank's shards only, then clipping by it."""
    grads = [p.grad.to_local() for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor)
    return norm


def train(rank, world, bug=None, steps=common.STEPS, mode="reshard"):
    model = shard(common.make_model(), world, mode)
    opt = common.make_optimizer(model.parameters())
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        rows = common.shard_rows(len(tokens), rank, world)
        loss_sum, count = common.token_loss_sum(model(tokens[rows]), targets[rows])
        stats = torch.tensor([loss_sum.item(), float(count)], dtype=torch.float64)
        dist.all_reduce(stats)
        loss = loss_sum / count if bug == "mean_of_means" else loss_sum * world / stats[1]
        loss.backward()
        if bug == "local_norm_clip":
            norm = local_norm_clip(list(model.parameters()), common.MAX_NORM)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), common.MAX_NORM)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        opt.zero_grad()
        record["loss"].append(float(stats[0] / stats[1]))
        record["grad_norm"].append(float(norm))
    record["params"] = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return record


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--mode", choices=("reshard", "no_reshard", "hsdp"), default="reshard")
    a, rest = p.parse_known_args()
    sys.exit(common.run_main(lambda r, w, bug=None: train(r, w, bug, mode=a.mode), rest,
                             bugs=("mean_of_means", "local_norm_clip")))
