"""``models.load`` of decoder language models: the names people use load as causal LMs with their tokenizer.

Online: a :class:`localhub.LocalHub` serves tiny random decoders (``localhub.decoder_repo``) under the famous
names; a subprocess whose ``HF_ENDPOINT`` points at it (and whose proxy refuses every other host) loads each name,
then a second run loads them again from the cache with the hub gone. Offline: every known decoder name fails at
once, naming an embedded model. A decoder saved in a folder loads as a causal LM too (before: a sequence classifier
with a random head).
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

from lrp_core.models.lm import KNOWN_DECODERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["The capital of France is", "Once upon a time, a small robot"]

#: name given to load -> (repo served under that name, family of localhub.decoder_repo)
CASES: dict[str, str] = {
    "gpt2": "gpt2",
    "distilgpt2": "gpt2",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "llama",
    "Qwen/Qwen2.5-0.5B": "qwen2",
    "Qwen/Qwen3-0.6B": "qwen3",
    "meta-llama/Llama-3.2-1B": "llama",
    "google/gemma-3-270m": "gemma3_text",
    "microsoft/Phi-3-mini-4k-instruct": "phi3",
}


def _hashes(model: torch.nn.Module) -> dict[str, str]:
    """sha256 of every tensor of the state dict (dtype, shape and bytes)."""
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        out[key] = hashlib.sha256(
            f"{t.dtype}{tuple(t.shape)}".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()
        ).hexdigest()
    return out


# ----------------------------------------------------------------------------- the subprocess


def _driver(out_file: str) -> None:
    """Load every case; record what came out (or the traceback)."""
    torch.set_num_threads(1)
    from lrp_core import explain
    from lrp_core.models import load

    results: dict[str, Any] = {}
    for name in CASES:
        try:
            m = load(name)
            inputs = dict(m.preprocess(TEXTS))
            with torch.no_grad():
                logits = m.model(**inputs).logits
            exp = explain(m.model, inputs, method="attnlrp")
            results[name] = {
                "class": type(m.model).__name__,
                "kind": m.kind,
                "info": m.info,
                "attn": m.model.config._attn_implementation,
                "training": m.model.training,
                "hashes": _hashes(m.model),
                "inputs": inputs,
                "logits": logits,
                "labels": (len(m.labels), [m.labels[i] for i in (0, 40, 41)]),
                "tokenizer": type(m.tokenizer).__name__,
                "explained": (exp.scores, exp.logits, exp.target, m.labels[int(exp.target[0])]),
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
    tmp = tmp_path_factory.mktemp("decoderhub")
    folders = {name: tmp / "repos" / name for name in CASES}
    models = {
        name: localhub.decoder_repo(folders[name], family, seed=i) for i, (name, family) in enumerate(CASES.items())
    }
    hf_home = tmp / "hf_home"
    with localhub.LocalHub() as hub, localhub.ProxyStub(403) as catcher:
        for name in CASES:
            hub.add(name, folders[name])
        online = _run_driver(tmp, "online", hub.endpoint, catcher.endpoint, hf_home)
        requests = list(hub.requests)
        cached = _run_driver(tmp, "cached", f"http://127.0.0.1:{_free_port()}", catcher.endpoint, hf_home)
        outside = list(catcher.requests)
    return dict(
        models=models, folders=folders, runs={"online": online, "cached": cached}, requests=requests, outside=outside
    )


def _case(served, run: str, name: str) -> dict[str, Any]:
    res = served["runs"][run][name]
    assert "error" not in res, f"load of {name!r} ({run}) failed:\n{res.get('error')}"
    return res


RUNS = ["online", "cached"]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_decoder_name_loads_the_served_causal_lm(served, run, name):
    """The causal LM class of the repo's config (not a sequence classifier), every served tensor, eval mode, sdpa."""
    res = _case(served, run, name)
    model = served["models"][name]
    assert res["class"] == type(model).__name__ and res["class"].endswith(("ForCausalLM", "LMHeadModel"))
    assert res["hashes"] == _hashes(model)
    assert res["kind"] == "text" and res["info"]["task"] == "causal-lm" and res["training"] is False
    assert res["attn"] == "sdpa"


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_preprocess_is_the_served_tokenizer_padded_and_logits_match(served, run, name):
    """preprocess = the served tokenizer on the texts, padded (with the end-of-text token where the tokenizer has
    no padding token); the loaded model's logits on it are the served model's; labels are the vocabulary."""
    from transformers import AutoTokenizer

    res = _case(served, run, name)
    tokenizer = AutoTokenizer.from_pretrained(served["folders"][name])
    ids, mask = res["inputs"]["input_ids"], res["inputs"]["attention_mask"]
    for row, text in enumerate(TEXTS):
        expected = tokenizer(text)["input_ids"]
        n = len(expected)
        real = mask[row].bool()
        assert int(real.sum()) == n and ids[row][real].tolist() == expected
    assert (mask.sum(1) < mask.shape[1]).any(), "the texts differ in length: one row is padded"
    assert (ids[mask == 0] == tokenizer.convert_tokens_to_ids("<|endoftext|>")).all()
    with torch.no_grad():
        expected_logits = served["models"][name](**res["inputs"]).logits
    torch.testing.assert_close(res["logits"], expected_logits, rtol=1e-5, atol=1e-5)
    size, some = res["labels"]
    assert size == served["models"][name].config.vocab_size
    assert some == [tokenizer.decode([i]) for i in (0, 40, 41)]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_the_loaded_lm_is_explained_at_each_rows_last_real_token(served, run, name):
    """explain(loaded.model, loaded.preprocess(texts), method="attnlrp"): one score per token, padding 0, the next-token
    logits of each row's last real token (whichever side the tokenizer pads), labels naming the target."""
    from transformers import AutoTokenizer

    res = _case(served, run, name)
    scores, logits, target, word = res["explained"]
    mask = res["inputs"]["attention_mask"]
    assert scores.shape == mask.shape and torch.isfinite(scores).all() and (scores[mask == 0] == 0).all()
    last = (torch.arange(mask.shape[1]) * mask).argmax(1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = served["models"][name](**res["inputs"], position_ids=positions).logits
    torch.testing.assert_close(logits, full[torch.arange(len(last)), last], rtol=1e-5, atol=1e-5)
    assert torch.equal(target, logits.argmax(1))
    assert word == AutoTokenizer.from_pretrained(served["folders"][name]).decode([int(target[0])])


@pytest.mark.parametrize("name", list(CASES))
def test_weights_came_over_http_from_the_hub(served, name):
    fetched = {
        p.rsplit("/", 1)[1]
        for method, p, status in served["requests"]
        if method == "GET" and status == 200 and p.startswith(f"/{name}/resolve/")
    }
    assert "model.safetensors" in fetched and "config.json" in fetched, served["requests"][:20]


def test_nothing_left_for_another_host(served):
    assert served["outside"] == []


# ----------------------------------------------------------------------------- in-process: offline, a local folder


@pytest.fixture
def offline(monkeypatch):
    """The hub unreachable and nothing cached, whatever the machine has."""
    import lrp_core.models.hub as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real = hub._hf_config

    def no_cache(name, online):
        if not online:
            raise OSError("not cached (test)")
        return real(name, online)

    monkeypatch.setattr(hub, "_hf_config", no_cache)


@pytest.mark.parametrize("name", list(KNOWN_DECODERS))
def test_known_decoders_fail_fast_offline_naming_an_embedded_model(offline, name):
    from lrp_core.models import EMBEDDED, load
    from lrp_core.models.hub import KNOWN_HF_MODELS, HubUnavailableError
    from lrp_core.models.lm import lm_alternative

    assert KNOWN_HF_MODELS[name][0] == "lm"
    with pytest.raises(HubUnavailableError) as err:
        load(name)
    message = str(err.value)
    assert name in message and "unreachable" in message and lm_alternative() in message
    assert any(f"load('{e}')" in message for e in EMBEDDED)


def test_an_unknown_decoder_name_offline_is_guessed_a_language_model(offline):
    from lrp_core.models import load
    from lrp_core.models.hub import HubUnavailableError
    from lrp_core.models.lm import lm_alternative

    with pytest.raises(HubUnavailableError) as err:
        load("someone/my-qwen2.5-finetune")
    assert lm_alternative() in str(err.value)


@pytest.mark.parametrize("family", list(localhub._DECODER_FAMILIES))
def test_a_decoder_saved_in_a_folder_loads_as_a_causal_lm(tmp_path, family):
    """Before: any text repo loaded with AutoModelForSequenceClassification (a Qwen became a classifier with a
    random head). Now the config's causal-LM architecture decides."""
    from lrp_core.models import load

    model = localhub.decoder_repo(tmp_path / family, family)
    m = load(str(tmp_path / family))
    assert type(m.model) is type(model) and m.info["task"] == "causal-lm"
    batch = dict(m.preprocess(["ab", "abcd"]))
    with torch.no_grad():
        torch.testing.assert_close(m.model(**batch).logits, model(**batch).logits, rtol=1e-6, atol=1e-6)
    assert m.labels[int(batch["input_ids"][0, 0])] == "a" and len(m.labels) == model.config.vocab_size
    with pytest.raises(IndexError, match="outside the vocabulary"):
        m.labels[len(m.labels)]


def test_a_text_classifier_still_loads_as_a_classifier(tmp_path):
    """The causal-LM switch reads the config's architectures: a sequence classifier's repo is unchanged."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from lrp_core.models import load

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=2,
        pad_token_id=0,
        architectures=["Qwen2ForSequenceClassification"],
    )
    Qwen2ForSequenceClassification(cfg).save_pretrained(tmp_path / "clf")
    localhub.decoder_repo(tmp_path / "tok", "qwen2")  # a tokenizer next to it
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "clf" / f).write_bytes((tmp_path / "tok" / f).read_bytes())
    m = load(str(tmp_path / "clf"))
    assert type(m.model).__name__ == "Qwen2ForSequenceClassification" and "task" not in m.info
    assert list(m.labels) == ["LABEL_0", "LABEL_1"]


if __name__ == "__main__":
    _driver(sys.argv[1])
