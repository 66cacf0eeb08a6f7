"""Drills for a torch job's DCP checkpoints (shardcheck.torch.checkpoint): a rank killed during
dcp.save leaves no committed checkpoint and the drill says so; a truncated or altered .distcp and
a .metadata naming a missing file are refused at load with the file named, where dcp.load alone
loads altered bytes silently; the resharded resume (4 ranks to 2) continues with parity."""

import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

import common
import dcp as example
import shardcheck.torch as sct
from shardcheck import errors
from shardcheck.torch.checkpoint import CheckpointError, verify

ORACLE = common.reference()


def save_job(ckpt, faults=None):
    """Step 1 on 4 FSDP2 ranks, then (step 2) a sealed DCP save; returns rank 0's record."""

    def fn(rank):
        model, opt, mesh = example.build(4)
        record = {"loss": [], "grad_norm": []}
        example.step_once(model, opt, mesh, 1, record)
        sct.begin_step(2)
        msd, osd = get_state_dict(model, opt)
        sct.checkpoint.save({"model": msd, "optim": osd}, ckpt)
        return record

    return sct.spawn(fn, 4, faults=faults)[0]


def load_job(ckpt, check=True):
    """Loads the checkpoint on 2 ranks (verify first unless check=False) and trains step 2."""

    def fn(rank):
        model, opt, mesh = example.build(2)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        if check:
            sct.checkpoint.load(state, ckpt)
        else:
            import torch.distributed.checkpoint as dcp

            dcp.load(state, checkpoint_id=ckpt)
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        record = {"loss": [], "grad_norm": []}
        example.step_once(model, opt, mesh, 2, record)
        record["params"] = {k: v.full_tensor().detach().clone()
                            for k, v in model.state_dict().items()}
        return record

    return sct.spawn(fn, 2)[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    first = save_job(ckpt)
    return ckpt, first


def copy_of(good, tmp_path):
    import shutil

    dst = str(tmp_path / "ckpt")
    shutil.copytree(good[0], dst)
    return dst


def alter_a_weight(ckpt, fqn):
    """Adds 1 to the first element of `fqn`'s saved shard in place (same file size); returns
    the file. DCP stores each item as a torch.save archive at the offset .metadata names."""
    import io
    import struct

    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(ckpt).read_metadata()
    info = next(v for k, v in meta.storage_data.items() if k.fqn == fqn)
    path = os.path.join(ckpt, info.relative_path)
    with open(path, "r+b") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
        first = float(torch.load(io.BytesIO(blob)).reshape(-1)[0])
        at = blob.find(struct.pack("<d", first))
        assert at >= 0
        f.seek(info.offset + at)
        f.write(struct.pack("<d", first + 1.0))
    return path


@pytest.mark.parametrize("op_index", [0, 5], ids=["before-writes", "after-writes"])
def test_a_rank_killed_during_save_leaves_no_committed_checkpoint(tmp_path, op_index):
    ckpt = str(tmp_path)
    with pytest.raises(errors.RankFailure) as info:
        save_job(ckpt, faults=[{"kind": "crash", "rank": 2, "step": 2, "op_index": op_index}])
    assert isinstance(info.value.cause, errors.InjectedCrash) or "crash" in str(info.value)
    assert not os.path.exists(os.path.join(ckpt, ".metadata"))
    with pytest.raises(CheckpointError, match=r"not a committed checkpoint: \.metadata is absent"):
        verify(ckpt)


def test_a_good_checkpoint_verifies_and_resumes_on_another_mesh_with_parity(good):
    verify(good[0])
    second = load_job(good[0])
    oracle = common.reference(steps=2)
    run = {"loss": good[1]["loss"] + second["loss"],
           "grad_norm": good[1]["grad_norm"] + second["grad_norm"], "params": second["params"]}
    assert common.compare(oracle, run) == []


def test_a_truncated_distcp_is_refused_naming_it(good, tmp_path):
    ckpt = copy_of(good, tmp_path)
    victim = os.path.join(ckpt, "__1_0.distcp")
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp: truncated") as info:
        verify(ckpt)
    assert info.value.path == victim
    with pytest.raises(errors.RankFailure) as failed:
        load_job(ckpt)
    assert isinstance(failed.value.cause, CheckpointError)


def test_an_altered_distcp_is_refused_where_dcp_alone_loads_it(good, tmp_path):
    ckpt = copy_of(good, tmp_path)
    victim = alter_a_weight(ckpt, "model.embed.weight")
    assert victim.endswith("__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: contents differ from the seal"):
        verify(ckpt)
    # The planted gap: without the check, DCP loads the altered bytes and training goes on.
    second = load_job(ckpt, check=False)
    run = {"loss": good[1]["loss"] + second["loss"],
           "grad_norm": good[1]["grad_norm"] + second["grad_norm"], "params": second["params"]}
    assert common.compare(common.reference(steps=2), run) != []


def test_metadata_naming_a_missing_file_is_refused_naming_it(good, tmp_path):
    ckpt = copy_of(good, tmp_path)
    os.remove(os.path.join(ckpt, "__3_0.distcp"))
    with pytest.raises(CheckpointError, match=r"__3_0\.distcp: named by \.metadata but missing"):
        verify(ckpt, sealed=False)
    with pytest.raises(CheckpointError, match=r"__3_0\.distcp"):
        verify(ckpt)


def test_an_unsealed_checkpoint_is_refused_by_the_sealed_check(good, tmp_path):
    ckpt = copy_of(good, tmp_path)
    os.remove(os.path.join(ckpt, ".shardcheck-seal.json"))
    verify(ckpt, sealed=False)
    with pytest.raises(CheckpointError, match="no .shardcheck-seal.json"):
        verify(ckpt)
    assert torch is not None
