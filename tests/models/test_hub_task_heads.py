"""``models.load`` of the task heads people share: ``dslim/bert-base-NER`` (token classification) and
``deepset/roberta-base-squad2`` (question answering) load as those heads with their tokenizer, and are explained.

A :class:`localhub.LocalHub` serves tiny random repos under the two names (``localhub.bert_ner_repo``,
``localhub.roberta_squad_repo``); a subprocess whose ``HF_ENDPOINT`` points at it (and whose proxy refuses every
other host) loads each name and explains it at a token, then a second run does the same from the cache with the
hub gone.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for localhub
import localhub  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["George Washington went to Washington", "Where is the cat? The cat is on the mat"]
#: name -> (the head's class, the keywords it is explained with)
CASES: dict[str, tuple[str, dict]] = {
    "dslim/bert-base-NER": ("BertForTokenClassification", dict(target=3, position=1)),
    "deepset/roberta-base-squad2": ("RobertaForQuestionAnswering", dict(target="end")),
}


def _hashes(model: torch.nn.Module) -> dict[str, str]:
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        out[key] = hashlib.sha256(
            f"{t.dtype}{tuple(t.shape)}".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()
        ).hexdigest()
    return out


def _driver(out_file: str) -> None:
    """Load and explain every case; record what came out (or the traceback)."""
    torch.set_num_threads(1)
    from lrp_core import explain
    from lrp_core.models import load

    results: dict[str, Any] = {}
    for name, (_, kw) in CASES.items():
        try:
            m = load(name)
            inputs = dict(m.preprocess(TEXTS))
            exp = explain(m.model, inputs, method="cp_lrp", **kw)
            results[name] = {
                "class": type(m.model).__name__,
                "kind": m.kind,
                "task": m.info.get("task"),
                "labels": list(m.labels),
                "hashes": _hashes(m.model),
                "inputs": inputs,
                "explained": (exp.scores, exp.logits, exp.target),
            }
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    torch.save(results, out_file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_driver(tmp: Path, tag: str, endpoint: str, catcher: str, hf_home: Path) -> dict[str, Any]:
    out = tmp / f"out-{tag}.pt"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("HF_", "HUGGINGFACE", "TRANSFORMERS_")) and not k.lower().endswith("_proxy")
    }
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        HTTP_PROXY=catcher,
        HTTPS_PROXY=catcher,
        NO_PROXY="127.0.0.1,localhost",
        http_proxy=catcher,
        https_proxy=catcher,
        no_proxy="127.0.0.1,localhost",
    )
    proc = subprocess.run(
        [sys.executable, __file__, str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The repos, the driver's run against the local hub, and its run from the cache with the hub gone."""
    from lrp_core.models.minilm import encoder_dir

    tmp = tmp_path_factory.mktemp("headhub")
    vocab = encoder_dir() / "vocab.txt"  # the uncased BERT word pieces, shipped with minilm-sentiment
    folders = {name: tmp / "repos" / name for name in CASES}
    models = {
        "dslim/bert-base-NER": localhub.bert_ner_repo(folders["dslim/bert-base-NER"], vocab),
        "deepset/roberta-base-squad2": localhub.roberta_squad_repo(folders["deepset/roberta-base-squad2"]),
    }
    hf_home = tmp / "hf_home"
    with localhub.LocalHub() as hub, localhub.ProxyStub(403) as catcher:
        for name in CASES:
            hub.add(name, folders[name])
        online = _run_driver(tmp, "online", hub.endpoint, catcher.endpoint, hf_home)
        cached = _run_driver(tmp, "cached", f"http://127.0.0.1:{_free_port()}", catcher.endpoint, hf_home)
        outside = list(catcher.requests)
    return dict(models=models, runs={"online": online, "cached": cached}, outside=outside)


@pytest.mark.parametrize("run", ["online", "cached"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_task_head_name_loads_that_head_and_is_explained_at_a_token(served, run, name):
    res = served["runs"][run][name]
    assert "error" not in res, f"load of {name!r} ({run}) failed:\n{res.get('error')}"
    model = served["models"][name]
    cls, kw = CASES[name]
    assert res["class"] == cls == type(model).__name__ and res["kind"] == "text"
    assert res["hashes"] == _hashes(model)
    scores, logits, target = res["explained"]
    inputs = res["inputs"]
    mask = inputs["attention_mask"]
    assert scores.shape == mask.shape and (scores[mask == 0] == 0).all()
    with torch.no_grad():
        out = model(**inputs)
    rows = torch.arange(mask.shape[0])
    if res["task"] == "token-classification":
        assert res["labels"][3] == "B-PER"
        torch.testing.assert_close(logits, out.logits[rows, kw["position"]], rtol=1e-5, atol=1e-6)
    else:
        assert res["task"] == "question-answering" and target.tolist() == [1, 1]
        best = out.end_logits.masked_fill(mask == 0, float("-inf")).max(dim=1).values  # the default position
        torch.testing.assert_close(logits, best, rtol=1e-5, atol=1e-6)


def test_nothing_left_for_another_host(served):
    assert served["outside"] == []


if __name__ == "__main__":
    _driver(sys.argv[1])
