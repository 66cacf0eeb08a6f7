"""Pipeline parallelism with torch.distributed.pipelining, as a team writes it: TinyLM cut into
four stages (embedding, block 0, block 1, final norm and head), four microbatches, GPipe or 1F1B
with one stage per rank on 4 ranks, or interleaved 1F1B with two stages per rank on 2 ranks.
The loss is the sum over a microbatch's real tokens divided by the global batch's count of real
tokens, so the microbatches' gradients add up to the full batch's (scale_grads=False); gradients
are clipped by the norm over every stage (squared norms summed over the ranks). The full
parameters are gathered to every rank with all_gather_object at the end.
Planted bugs: mean_of_means (each microbatch's loss a mean over its own tokens and the schedule's
default scaling by 1 / microbatches) and local_norm_clip (each rank clips by its stages' norm)."""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining import ScheduleInterleaved1F1B

import common

MICROBATCHES = 4
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


class Chunk(nn.Module):
    """Stage `index` of 4 of a TinyLM, keeping the full model's parameter names."""

    def __init__(self, model, index):
        super().__init__()
        self.index = index
        if index == 0:
            self.embed = model.embed
        elif index in (1, 2):
            self.layers = nn.ModuleDict({str(index - 1): model.layers[index - 1]})
        else:
            self.norm, self.head = model.norm, model.head

    def forward(self, x):
        if self.index == 0:
            return self.embed(x)
        if self.index in (1, 2):
            return self.layers[str(self.index - 1)](x)
        return self.head(self.norm(x))


def train(rank, world, bug=None, steps=common.STEPS, schedule="1f1b"):
    chunks_per_rank = 4 // world
    stage_ids = [rank + world * i for i in range(chunks_per_rank)]
    model = common.make_model()
    chunks = [Chunk(model, s) for s in stage_ids]
    stages = [PipelineStage(c, s, 4, torch.device("cpu")) for c, s in zip(chunks, stage_ids)]
    params = [p for c in chunks for p in c.parameters()]
    opt = common.make_optimizer(params)
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        total = int((targets != -100).sum())

        def loss_fn(logits, target):
            loss_sum, count = common.token_loss_sum(logits, target)
            return loss_sum / count if bug == "mean_of_means" else loss_sum / total

        kind = SCHEDULES[schedule]
        stage = stages if schedule == "interleaved" else stages[0]
        sched = kind(stage, MICROBATCHES, loss_fn=loss_fn, scale_grads=bug == "mean_of_means")
        losses = []
        if 0 in stage_ids:
            sched.step(tokens, target=targets, losses=losses)
        elif 3 in stage_ids:
            sched.step(target=targets, losses=losses)
        else:
            sched.step()
        squares = sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)
        stats = torch.tensor([squares, sum(x.item() for x in losses)],
                             dtype=torch.float64)
        local_norm = squares ** 0.5
        dist.all_reduce(stats)
        norm = local_norm if bug == "local_norm_clip" else float(stats[0]) ** 0.5
        factor = min(common.MAX_NORM / (norm + 1e-6), 1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)
        opt.step()
        opt.zero_grad()
        loss = float(stats[1]) / MICROBATCHES if bug == "mean_of_means" else float(stats[1])
        record["loss"].append(loss)
        record["grad_norm"].append(float(stats[0]) ** 0.5)
    mine = {k: v.detach().clone() for c in chunks for k, v in c.state_dict().items()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    record["params"] = {k: v for part in everyone for k, v in part.items()}
    return record


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    a, rest = p.parse_known_args()
    world = 2 if a.schedule == "interleaved" else 4
    sys.exit(common.run_main(lambda r, w, bug=None: train(r, w, bug, schedule=a.schedule), rest,
                             world_size=world, bugs=("mean_of_means", "local_norm_clip")))
