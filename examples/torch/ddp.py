"""DistributedDataParallel as a team writes it: each rank takes its rows of the global batch,
the loss is normalised by the global count of real tokens (DDP averages gradients over ranks, so
each rank's sum is scaled by world size / global count), gradients are clipped by their global
norm, AdamW steps. Planted bug: mean_of_means (each rank normalises by its own token count)."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def train(rank, world, bug=None, steps=common.STEPS):
    model = DDP(common.make_model())
    opt = common.make_optimizer(model.parameters())
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        rows = common.shard_rows(len(tokens), rank, world)
        loss_sum, count = common.token_loss_sum(model(tokens[rows]), targets[rows])
        stats = torch.tensor([loss_sum.item(), float(count)], dtype=torch.float64)
        dist.all_reduce(stats)  # the global loss sum and token count
        if bug == "mean_of_means":
            loss = loss_sum / count
        else:
            loss = loss_sum * world / stats[1]
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), common.MAX_NORM)
        opt.step()
        opt.zero_grad()
        record["loss"].append(float(stats[0] / stats[1]))
        record["grad_norm"].append(float(norm))
    record["params"] = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return record


if __name__ == "__main__":
    sys.exit(common.run_main(train, bugs=("mean_of_means",)))
