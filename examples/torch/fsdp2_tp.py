"""FSDP2 + TP (2-D), as torchtitan composes them: a (dp, tp) mesh, the TP + SP plan of tp.py on
the "tp" dimension, then fully_shard of each block and the root on the "dp" dimension. Each dp
rank takes its rows of the global batch (the tp ranks of a dp group see the same rows); the loss
is normalised by the global count of real tokens (FSDP averages over the dp ranks); gradients are
clipped by their global norm over both dimensions (clip_grad_norm_ on 2-D DTensors).
Planted bugs: mean_of_means (each dp rank normalises by its own token count) and
local_norm_clip (clipping by the norm of this rank's shards)."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

import common
import fsdp2
import tp


def train(rank, world, bug=None, steps=common.STEPS):
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"]
    model = parallelize_module(common.make_model(), mesh["tp"], tp.plan(None))
    for layer in model.layers:
        fully_shard(layer, mesh=dp)
    fully_shard(model, mesh=dp)
    opt = common.make_optimizer(model.parameters())
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        rows = common.shard_rows(len(tokens), dp.get_local_rank(), dp.size())
        loss_sum, count = common.token_loss_sum(model(tokens[rows]), targets[rows])
        stats = torch.tensor([loss_sum.item(), float(count)], dtype=torch.float64)
        dist.all_reduce(stats, group=dp.get_group())
        loss = loss_sum / count if bug == "mean_of_means" else loss_sum * dp.size() / stats[1]
        loss.backward()
        if bug == "local_norm_clip":
            norm = fsdp2.local_norm_clip(list(model.parameters()), common.MAX_NORM)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), common.MAX_NORM)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        opt.step()
        opt.zero_grad()
        record["loss"].append(float(stats[0] / stats[1]))
        record["grad_norm"].append(float(norm))
    record["params"] = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return record


if __name__ == "__main__":
    sys.exit(common.run_main(train, bugs=("mean_of_means", "local_norm_clip")))
