"""A team's data-parallel script (examples/torch/llm.py: DDP, FSDP2, HSDP) on the oracle model,
judged by `shardcheck compare` against the C++ oracle's dump (`shardcheck run --dump-tensors`):
exit 0 on parity, 1 naming the step and tensor for each planted bug, 2 for a run dump that lacks
a tensor or has another shape."""

import copy
import json
import os
import subprocess

import numpy as np
import pytest

import llm

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
BUILD = os.environ.get("SHARDCHECK_BUILD_DIR") or os.path.join(ROOT, "build", "default")
CLI = os.path.join(BUILD, "harness", "shardcheck")
pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason=f"no shardcheck CLI at {CLI}")


def oracle_dump(tmp_path_factory, name, **train):
    """scenarios/parity/<name>.json without its matrix (train settings overridden) and the C++
    oracle's dump of it: (scenario path, dump directory)."""
    with open(os.path.join(ROOT, "scenarios", "parity", name + ".json")) as f:
        s = copy.deepcopy(json.load(f))
    s.pop("matrix")
    s["train"].update(train)
    d = tmp_path_factory.mktemp(name)
    path = str(d / "scenario.json")
    with open(path, "w") as f:
        json.dump(s, f)
    subprocess.run([CLI, "run", path, "--dump-tensors", str(d / "dump")], check=True,
                   capture_output=True, timeout=120)
    return path, str(d / "dump")


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """data_parallel_dense (MQA, tied head, dropout, clipping active) on a smaller batch."""
    return oracle_dump(tmp_path_factory, "data_parallel_dense", steps=2, global_batch=16)


def compare(oracle_dump, run_dump, *extra):
    return subprocess.run([CLI, "compare", oracle_dump, run_dump, *extra], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("strategy", llm.STRATEGIES)
def test_a_data_parallel_script_has_parity_with_the_cpp_oracle(oracle, tmp_path, strategy):
    run = str(tmp_path / "run")
    llm.run(oracle[0], 4, strategy, dump=run)
    r = compare(oracle[1], run, "--report", str(tmp_path / "report"),
                "--junit", str(tmp_path / "junit.xml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("failed") and ", 0 failed" in r.stdout
    report = json.load(open(tmp_path / "report" / "report.json"))
    assert report["failed"] == 0 and report["passed"] > 0


@pytest.mark.parametrize("bug", llm.BUGS)
def test_a_planted_bug_fails_naming_step_and_tensor(oracle, tmp_path, bug):
    run = str(tmp_path / "run")
    llm.run(oracle[0], 4, "fsdp2", bug, dump=run)
    r = compare(oracle[1], run)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first failure: step 1 tensor " in r.stdout


@pytest.fixture(scope="module")
def llama_oracle(tmp_path_factory):
    """A Llama 3.1-style model (SwiGLU, GQA 4/2, untied head, RoPE theta 500000 half-rotated with
    Llama 3.1 scaling): scenarios/parity/llama_rope.json, on the batch llm.py splits over 4."""
    return oracle_dump(tmp_path_factory, "llama_rope")


@pytest.mark.parametrize("strategy", ("fsdp2", "hsdp"))
def test_a_llama_script_has_parity_with_the_cpp_oracle(llama_oracle, tmp_path, strategy):
    # A torchtitan-style Llama under FSDP2 / HSDP: w_gate, w_up, w_down and the RoPE the config
    # names, judged step by step as the GPT model is.
    run = str(tmp_path / "run")
    llm.run(llama_oracle[0], 4, strategy, dump=run)
    r = compare(llama_oracle[1], run)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ", 0 failed" in r.stdout
    index = json.load(open(os.path.join(run, "index.json")))
    assert any(e["name"].endswith("mlp.w_gate") for e in index)


def test_a_llama_script_with_a_planted_bug_fails(llama_oracle, tmp_path):
    run = str(tmp_path / "run")
    llm.run(llama_oracle[0], 4, "fsdp2", "local_norm_clip", dump=run)
    r = compare(llama_oracle[1], run)
    assert r.returncode == 1, r.stdout + r.stderr


def test_a_run_dump_lacking_a_tensor_or_with_another_shape_is_bad_input(oracle, tmp_path):
    run = str(tmp_path / "run")
    llm.run(oracle[0], 2, "ddp", dump=run)
    index_path = os.path.join(run, "index.json")
    index = json.load(open(index_path))
    json.dump([e for e in index if e["name"] != "step2/param/embed.weight"], open(index_path, "w"))
    r = compare(oracle[1], run)
    assert r.returncode == 2 and "step2/param/embed.weight" in r.stderr + r.stdout
    json.dump(index, open(index_path, "w"))
    entry = next(e for e in index if e["name"] == "step1/grad/final_norm.weight")
    np.save(os.path.join(run, entry["file"]), np.zeros((2, 9)))
    entry["shape"] = [2, 9]
    json.dump(index, open(index_path, "w"))
    r = compare(oracle[1], run)
    assert r.returncode == 2 and "final_norm.weight" in r.stderr + r.stdout
