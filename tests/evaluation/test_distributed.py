"""The evaluation spread over processes (torchrun, gloo on CPU) and resumed after an interruption.

A run with 2 processes must write what a run with one writes: the results
JSON and the plot byte for byte, the meta JSON equal except ``seconds`` (time)
and ``processes`` (1 or 2), and ``command`` after a resume (as typed:
``--resume`` shows). The per-sample values in the meta are compared exactly
(JSON floats round-trip, so ``==`` is bitwise). The one-process runs happen in
this process (``main``), the 2-process ones under torchrun in subprocesses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrp_core.errors import InputError
from lrp_core.evaluation import shards
from lrp_core.evaluation.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
MAY_DIFFER = {"seconds", "processes"}
"""Meta fields that record how a run was done, not what it found."""

IMAGE_ARGS = [
    "--model",
    "toy-vit",
    "--methods",
    "transformer_attribution,rollout",
    "--samples",
    "12",
    "--batch-size",
    "4",
    "--quiet",
    "--threads",
    "1",
]
"""12 scenes in 3 blocks of 4: with 2 processes rank 0 gets blocks 0 and 2, rank 1 block 1."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], cwd: Path, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node processes -m lrp_core.evaluation args`` in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "lrp_core.evaluation",
    ]
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([*launch, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _alone(args: list[str], cwd: Path) -> int:
    """``python -m lrp_core.evaluation args`` run by this process in ``cwd`` (its exit status)."""
    here, threads = os.getcwd(), torch.get_num_threads()
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        os.chdir(cwd)
        return main(args)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _same_run(
    a: Path,
    b: Path,
    stem: str,
    plot: bool,
    may_differ: set[str] = MAY_DIFFER,
) -> None:
    """Results (and plot) byte-identical; meta equal, floats bit for bit, but for ``may_differ``."""
    assert (a / f"{stem}.json").read_bytes() == (b / f"{stem}.json").read_bytes()
    meta_a = json.loads((a / f"{stem}.meta.json").read_text())
    meta_b = json.loads((b / f"{stem}.meta.json").read_text())
    assert list(meta_a) == list(meta_b)
    for key in meta_a.keys() - may_differ:
        assert meta_a[key] == meta_b[key], key  # json floats round-trip exactly: == is bitwise
    if plot:
        png = next(a.glob("perturbation_*.png")).name
        assert (a / png).read_bytes() == (b / png).read_bytes()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: the toy ViT run by one plain process."""
    pytest.importorskip("lrp_core.models.toy_vit")
    where = tmp_path_factory.mktemp("one")
    assert _alone([*IMAGE_ARGS, "--out", "toy.json"], where) == 0
    meta = json.loads((where / "toy.meta.json").read_text())
    assert meta["processes"] == 1 and meta["n"] == 12
    # the per-image lists the bootstrap reads cover all 12 scenes, in order
    per = meta["curves"]["rollout"]["positive_predicted_auc_per_image"]
    assert len(per) == 12
    assert len(meta["curves"]["rollout"]["deletion_order_per_case"]) == 24
    return where


def test_two_processes_write_what_one_writes(one_process, tmp_path):
    proc = _ok(_torchrun([*IMAGE_ARGS, "--out", "toy.json"], tmp_path))
    assert "2 processes" in proc.stdout
    assert json.loads((tmp_path / "toy.meta.json").read_text())["processes"] == 2
    _same_run(one_process, tmp_path, "toy", plot=True)
    assert not (tmp_path / "toy.json.partial").exists()  # checkpoints removed at the end


def test_an_interrupted_run_resumes_to_the_same_result(one_process, tmp_path, capsys):
    # 2 processes stop after one block each (blocks 0 and 1 of 3 done), as if killed
    proc = _torchrun([*IMAGE_ARGS, "--out", "toy.json", "--stop-after-blocks", "1"], tmp_path)
    assert proc.returncode != 0 and not (tmp_path / "toy.json").exists()
    partial = tmp_path / "toy.json.partial"
    done = ["block-000000.pkl", "block-000001.pkl"]
    assert sorted(p.name for p in partial.glob("block-*")) == done
    # a different run cannot resume from these blocks
    bad = [a if a != "4" else "6" for a in IMAGE_ARGS]  # --batch-size 6
    assert _alone([*bad, "--out", "toy.json", "--resume"], tmp_path) == 2
    assert "holds a different run" in capsys.readouterr().err
    assert sorted(p.name for p in partial.glob("block-*")) == done
    # one process resumes: it loads blocks 0 and 1 and computes block 2 only
    assert _alone([*IMAGE_ARGS, "--out", "toy.json", "--resume"], tmp_path) == 0
    err = capsys.readouterr().err
    assert "2 block(s) resumed" in err and "1 computed" in err
    _same_run(one_process, tmp_path, "toy", plot=True, may_differ=MAY_DIFFER | {"command"})
    assert not partial.exists()


def test_text_model_two_processes(tmp_path):
    """minilm-sentiment: 8 reviews in 2 blocks of 4, one block per process."""
    args = [
        "--model",
        "minilm-sentiment",
        "--methods",
        "cdam",
        "--samples",
        "8",
        "--batch-size",
        "4",
        "--quiet",
        "--threads",
        "1",
        "--out",
        "text.json",
    ]
    assert _alone(args, tmp_path / "one") == 0
    _ok(_torchrun(args, tmp_path / "two"))
    _same_run(tmp_path / "one", tmp_path / "two", "text", plot=False)
    meta = json.loads((tmp_path / "two" / "text.meta.json").read_text())
    assert len(meta["curves"]["cdam"]["comprehensiveness_per_document"]) == 8
    # CDAM's correlation with token ablation pools the word-pieces of both blocks
    assert json.loads((tmp_path / "two" / "text.json").read_text())["cdam"]["tam_correlation"] is not None


LEAVE_SCRIPT = """
import os, sys
import torch
from lrp_core.evaluation import shards
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
shard, _ = shards.from_environment("cpu")
import torch.distributed.nn   # model code imports it (through torch._dynamo) once the group exists
squares = shard.map(4, lambda b: b * b)
assert squares == ([0, 1, 4, 9] if shard.rank == 0 else None), squares
shards.leave()
print(f"rank {shard.rank}: {before} threads before joining, {threads()} after leaving")
sys.exit(0 if threads() == before else 3)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_leaving_joins_the_group_threads(tmp_path):
    """After ``leave`` the gloo worker threads are gone while Python still runs.

    Left running into interpreter shutdown, a worker that frees a gathered
    tensor needs the GIL and aborts the process (seen in CI as a SIGABRT of
    rank 1 in about 1 run in 50).
    """
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(script),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _ok(proc)
    assert proc.stdout.count("after leaving") == 2


# ----------------------------------------------------------------------------- the machinery
def test_blocks_and_their_owners():
    assert shards.block_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert shards.Shard(rank=1, world=3).mine(8) == [1, 4, 7]
    every = sorted(b for r in range(3) for b in shards.Shard(rank=r, world=3).mine(8))
    assert every == list(range(8))  # each block exactly once
    with pytest.raises(InputError, match="batch_size"):
        shards.block_spans(10, 0)


def test_checkpoints_resume_and_refuse_another_run(tmp_path):
    calls: list[int] = []

    def compute(b: int) -> dict:
        calls.append(b)
        return {"block": b, "square": b * b}

    folder = tmp_path / "x.json.partial"
    config = {"model": "m", "n": 5}
    first = shards.Shard(folder=folder, stop_after=2)
    first.start(config)
    with pytest.raises(SystemExit) as stop:
        first.map(5, compute)
    assert stop.value.code == shards.INTERRUPTED and calls == [0, 1]
    again = shards.Shard(folder=folder, resume=True)
    again.start(config)
    assert again.map(5, compute) == [{"block": b, "square": b * b} for b in range(5)]
    assert calls == [0, 1, 2, 3, 4]  # blocks 0, 1 were loaded, not redone
    with pytest.raises(InputError, match="different run.*n: 5 there, 6 now"):
        shards.Shard(folder=folder, resume=True).start({"model": "m", "n": 6})
    shards.Shard(folder=folder).start({"model": "m", "n": 6})  # without --resume: afresh
    assert [p.name for p in folder.iterdir()] == ["config.json"]
