"""Checkpoint and resume with torch.distributed.checkpoint (DCP), as a team writes it: FSDP2 on 4
ranks trains steps 1-2 and saves model and optimizer state (get_state_dict) with dcp.save; a new
job on another mesh (2 ranks, or the 4 ranks in reversed order, as after a node was replaced)
loads it with dcp.load, which reshards, and trains step 3. Judged against the single-process
oracle of all three steps.
Planted bugs: optimizer_not_restored (the new job loads the model only, so AdamW's moments
restart: silent) and rank_local_load (each rank saves its own shards with torch.save and the new
job loads its rank's file into its shards, skipping resharding: on another mesh the shapes
disagree and the load fails).

A DeviceMesh whose ranks are not in ascending order (DeviceMesh("cpu", [3, 2, 1, 0])) is not
offered: torch builds its group with the ranks sorted, so FSDP2 places shards by group rank while
DTensor and DCP locate them by mesh coordinate, and a correct dcp.load into such a mesh does not
restore the parameters (found on this backend)."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

import common


def build(world, reversed_mesh=False):
    if reversed_mesh:
        mesh = DeviceMesh("cpu", list(reversed(range(world))), mesh_dim_names=("dp",))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = common.make_model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, common.make_optimizer(model.parameters()), mesh


def step_once(model, opt, mesh, step, record):
    tokens, targets = common.batch(step)
    rows = common.shard_rows(len(tokens), mesh.get_local_rank(), mesh.size())
    loss_sum, count = common.token_loss_sum(model(tokens[rows]), targets[rows])
    stats = torch.tensor([loss_sum.item(), float(count)], dtype=torch.float64)
    dist.all_reduce(stats)
    (loss_sum * mesh.size() / stats[1]).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), common.MAX_NORM)
    opt.step()
    opt.zero_grad()
    record["loss"].append(float(stats[0] / stats[1]))
    record["grad_norm"].append(float(norm.full_tensor() if isinstance(norm, DTensor) else norm))


def local_leaves(state):
    leaves, _ = tree_flatten(state)
    return [x.to_local() if isinstance(x, DTensor) else x for x in leaves]


def save(rank, world, ckpt, bug=None):
    """Steps 1-2 on `world` ranks, then the checkpoint; returns the record so far."""
    model, opt, mesh = build(world, False)
    record = {"loss": [], "grad_norm": []}
    for step in (1, 2):
        step_once(model, opt, mesh, step, record)
    msd, osd = get_state_dict(model, opt)
    if bug == "rank_local_load":
        torch.save(local_leaves({"model": msd, "optim": osd}), os.path.join(ckpt, f"rank{rank}.pt"))
    else:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    return record


def resume(rank, world, ckpt, bug=None, reversed_mesh=False):
    """Loads the checkpoint on `world` ranks (reversed: mesh order world-1..0) and trains step 3."""
    model, opt, mesh = build(world, reversed_mesh)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    if bug == "rank_local_load":
        saved = torch.load(os.path.join(ckpt, f"rank{rank}.pt"), weights_only=False)
        for mine, theirs in zip(local_leaves(state), saved, strict=True):
            if isinstance(mine, torch.Tensor):
                mine.copy_(theirs)
    elif bug == "optimizer_not_restored":
        dcp.load({"model": state["model"]}, checkpoint_id=ckpt)
    else:
        dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    record = {"loss": [], "grad_norm": []}
    step_once(model, opt, mesh, 3, record)
    record["params"] = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return record


def run(bug=None, resume_world=2, reversed_mesh=False, save_world=4):
    """Both jobs on the shardcheck backend; the record of steps 1-3 as rank 0 of each saw it."""
    import shardcheck.torch as sct

    with tempfile.TemporaryDirectory() as ckpt:
        first = sct.spawn(lambda r: save(r, save_world, ckpt, bug), save_world)[0]
        second = sct.spawn(lambda r: resume(r, resume_world, ckpt, bug, reversed_mesh),
                           resume_world)
        last = second[resume_world - 1 if reversed_mesh else 0]
    return {"loss": first["loss"] + last["loss"],
            "grad_norm": first["grad_norm"] + last["grad_norm"], "params": last["params"]}


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume-on", choices=("2", "reversed"), default="2")
    p.add_argument("--bug", choices=("optimizer_not_restored", "rank_local_load"), default=None)
    a = p.parse_args()
    rec = run(a.bug, 4 if a.resume_on == "reversed" else 2, a.resume_on == "reversed")
    bad = common.compare(common.reference(), rec)
    for line in bad:
        print("FAIL", line)
    print("parity with the single-process oracle" if not bad else f"{len(bad)} checks failed")
    sys.exit(1 if bad else 0)
