"""Every examples/torch/ script passes against the single-process oracle on the shardcheck
backend, and every planted user bug makes its comparison fail."""

import pytest

import common
import shardcheck.torch as sct

ORACLE = common.reference()
_ORACLES = {}


def oracle_of(module):
    """The single-process run of the example's model (TinyLM, or the module's make_model)."""
    make = getattr(__import__(module), "make_model", None)
    if make is None:
        return ORACLE
    if module not in _ORACLES:
        _ORACLES[module] = common.reference(make=make)
    return _ORACLES[module]


def run(module, bug=None, world=4, **kw):
    train = __import__(module).train
    return common.compare(oracle_of(module),
                          sct.spawn(lambda r: train(r, world, bug, **kw), world)[0])


CASES = [
    ("ddp", {}),
    ("fsdp2", {"mode": "reshard"}),
    ("fsdp2", {"mode": "no_reshard"}),
    ("fsdp2", {"mode": "hsdp"}),
    ("tp", {}),
    ("fsdp2_tp", {}),
    ("pipeline", {"schedule": "gpipe"}),
    ("pipeline", {"schedule": "1f1b"}),
    ("pipeline", {"schedule": "interleaved", "world": 2}),
    ("cp", {}),
    ("cp", {"world": 2}),
]
BUGS = [
    ("ddp", "mean_of_means", {}),
    ("fsdp2", "mean_of_means", {"mode": "reshard"}),
    ("fsdp2", "local_norm_clip", {"mode": "reshard"}),
    ("fsdp2", "local_norm_clip", {"mode": "hsdp"}),
    ("tp", "sp_norm_local", {}),
    ("fsdp2_tp", "mean_of_means", {}),
    ("fsdp2_tp", "local_norm_clip", {}),
    ("pipeline", "mean_of_means", {"schedule": "1f1b"}),
    ("pipeline", "local_norm_clip", {"schedule": "gpipe"}),
    ("pipeline", "mean_of_means", {"schedule": "interleaved", "world": 2}),
    ("cp", "rope_offset", {}),
    ("cp", "mean_of_means", {}),
]


def name(*parts):
    return "-".join(str(v) for p in parts for v in (p.values() if isinstance(p, dict) else [p]))


@pytest.mark.parametrize("module,kw", CASES, ids=[name(m, k) for m, k in CASES])
def test_example_has_parity_with_the_oracle(module, kw):
    assert run(module, **kw) == []


@pytest.mark.parametrize("module,bug,kw", BUGS, ids=[name(m, b, k) for m, b, k in BUGS])
def test_planted_bug_fails_the_comparison(module, bug, kw):
    bad = run(module, bug, **kw)
    assert bad, f"{module} with {bug} still has parity"


def test_dcp_resume_on_another_mesh_has_parity():
    import dcp

    assert common.compare(ORACLE, dcp.run()) == []


def test_dcp_resume_without_the_optimizer_state_fails_the_comparison():
    import dcp

    assert common.compare(ORACLE, dcp.run("optimizer_not_restored")) != []


def test_dcp_rank_local_load_on_another_mesh_fails_loudly():
    import dcp

    from shardcheck import errors

    with pytest.raises(errors.RankFailure, match="must match the size"):
        dcp.run("rank_local_load")
