"""Tensor parallel with sequence parallel, as torchtitan plans a model with DTensor: the embedding
row-wise (vocabulary sharded) producing sequence shards, each block's norm sequence-parallel, its
up projection column-wise and its down projection row-wise back to sequence shards, the final
norm sequence-parallel and the head column-wise with replicated logits. Every rank sees the whole
batch; the mesh is one TP group. Gradients are clipped by their global norm (clip_grad_norm_ on
DTensors), AdamW steps, the full parameters are gathered at the end.
Planted bug: sp_norm_local (the blocks' norms left out of the plan, so they run on the local
sequence shard as plain modules and their weight gradients are never summed over the TP group:
Megatron's missing all-reduce of sequence-parallel norm gradients)."""

import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

import common


def plan(bug):
    p = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(common.LAYERS):
        if bug != "sp_norm_local":
            p[f"layers.{i}.norm"] = SequenceParallel()
        p[f"layers.{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
        p[f"layers.{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
    return p


def clip(params, max_norm):
    """clip_grad_norm_ where every parameter is a DTensor; with plain tensors among them (the
    bug's norms) the user's own version: DTensor norms made full, plain ones taken as they are."""
    params = list(params)
    if all(isinstance(p, DTensor) for p in params):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    norms = [torch.linalg.vector_norm(p.grad.full_tensor() if isinstance(p.grad, DTensor)
                                      else p.grad) for p in params]
    norm = torch.linalg.vector_norm(torch.stack(norms))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(factor)
    return norm


def train(rank, world, bug=None, steps=common.STEPS):
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = parallelize_module(common.make_model(), mesh, plan(bug))
    opt = common.make_optimizer(model.parameters())
    record = {"loss": [], "grad_norm": []}
    for step in range(1, steps + 1):
        tokens, targets = common.batch(step)
        loss_sum, count = common.token_loss_sum(model(tokens), targets)
        loss = loss_sum / count
        loss.backward()
        norm = clip(model.parameters(), common.MAX_NORM)
        opt.step()
        opt.zero_grad()
        record["loss"].append(loss.item())
        record["grad_norm"].append(float(norm))
    record["params"] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                        for k, v in model.state_dict().items()}
    return record


if __name__ == "__main__":
    sys.exit(common.run_main(train, bugs=("sp_norm_local",)))
