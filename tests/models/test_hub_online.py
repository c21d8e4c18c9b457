"""The online path of ``models.load``: famous hub names downloaded from a local hub, then explained.

A :class:`localhub.LocalHub` on 127.0.0.1 serves repos built here (random weights, the real repos' file
names) under the names the notebooks load with ``ONLINE = True``. A subprocess whose ``HF_ENDPOINT`` points
at it (huggingface_hub reads the variable once, at import), with an empty ``HF_HOME``, runs
``load(name)`` then ``explain`` for each name (:func:`_driver`, this file run as a script). Its
``HTTP(S)_PROXY`` is a local stub proxy that records and refuses any request for another host, so nothing
can reach the real hub. A second run, with the hub gone, loads the same names from the cache the first
filled. The tests compare what was loaded with what was served: weights, preprocessing, logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for localhub
import localhub  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The plot is thin, but the acting is wonderful and the ending made me smile.",
    "An unwatchable mess with a few beautiful shots.",
]
PROMPTS = ["a photo of a dog", "a photo of a cat", "a red car"]

#: name given to load -> (repo served, input kind, method the notebooks use on it)
CASES: dict[str, tuple[str, str, str]] = {
    "deit_small_patch16_224": ("timm/deit_small_patch16_224.fb_in1k", "image", "transformer_attribution"),
    "timm/vit_medium_patch16_gap_256.sw_in12k_ft_in1k": (
        "timm/vit_medium_patch16_gap_256.sw_in12k_ft_in1k",
        "image",
        "transformer_attribution",
    ),
    "textattack/bert-base-uncased-SST-2": ("textattack/bert-base-uncased-SST-2", "text", "transformer_attribution"),
    "distilbert-base-uncased-finetuned-sst-2-english": (
        "distilbert-base-uncased-finetuned-sst-2-english",
        "text",
        "transformer_attribution",
    ),
    "cardiffnlp/twitter-roberta-base-sentiment-latest": (
        "cardiffnlp/twitter-roberta-base-sentiment-latest",
        "text",
        "attnlrp",
    ),
    "microsoft/deberta-v3-base": ("microsoft/deberta-v3-base", "text", "attnlrp"),
    "facebook/deit-small-patch16-224": ("facebook/deit-small-patch16-224", "image", "transformer_attribution"),
    "openai/clip-vit-base-patch32": ("openai/clip-vit-base-patch32", "clip", "generic_attention"),
    "facebook/dinov2-with-registers-small": ("facebook/dinov2-with-registers-small", "image", "cp_lrp"),
    "microsoft/beit-base-patch16-224": ("microsoft/beit-base-patch16-224", "image", "attnlrp"),
    # a base model (sentence embeddings): explained with target=Projection(ones, "mean"), logits (B, 1)
    "sentence-transformers/all-MiniLM-L6-v2": ("sentence-transformers/all-MiniLM-L6-v2", "embedding", "cp_lrp"),
}

#: names that are on no hub: an HF repo id, and a timm hub repo
MISSING = ("nobody/not-on-this-hub", "timm/nobody_model.x")


def _build_repo(repo: str, folder: Path, vocab: Path) -> torch.nn.Module:
    if repo == "timm/deit_small_patch16_224.fb_in1k":  # loaded by its plain name: full size (22 M weights)
        return localhub.timm_repo(folder, repo)
    if repo.startswith("timm/"):  # loaded as timm/<repo>: timm reads model_args from config.json, so tiny
        return localhub.timm_repo(folder, repo, model_args=dict(embed_dim=48, depth=2, num_heads=3))
    builders = {
        "textattack/bert-base-uncased-SST-2": lambda f: localhub.bert_sst2_repo(f, vocab),
        "distilbert-base-uncased-finetuned-sst-2-english": lambda f: localhub.distilbert_sst2_repo(f, vocab),
        "cardiffnlp/twitter-roberta-base-sentiment-latest": localhub.roberta_sentiment_repo,
        "microsoft/deberta-v3-base": localhub.deberta_v3_repo,
        "facebook/deit-small-patch16-224": localhub.deit_image_repo,
        "openai/clip-vit-base-patch32": localhub.clip_repo,
        "facebook/dinov2-with-registers-small": localhub.dinov2_registers_repo,
        "microsoft/beit-base-patch16-224": localhub.beit_repo,
        "sentence-transformers/all-MiniLM-L6-v2": lambda f: localhub.minilm_embedding_repo(f, vocab),
    }
    return builders[repo](folder)


def _hashes(model: torch.nn.Module) -> dict[str, str]:
    """sha256 of every tensor of the state dict (bytes, dtype and shape)."""
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        out[key] = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + raw).hexdigest()
    return out


def _logits(model: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """(B, C) logits: timm output, a classifier's ``.logits``, or CLIP's image-to-prompt ``logits_per_image``; a
    base model's mean-pooled embedding projected on the ones vector, (B, 1) (``Projection(ones, "mean")``)."""
    with torch.no_grad():
        out = model(inputs) if isinstance(inputs, torch.Tensor) else model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    if getattr(out, "logits", None) is None and hasattr(out, "last_hidden_state"):
        m = inputs["attention_mask"].to(out.last_hidden_state.dtype)[..., None]
        return ((out.last_hidden_state * m).sum(1) / m.sum(1)).sum(-1, keepdim=True)
    return out.logits_per_image if hasattr(out, "logits_per_image") else out.logits


def _free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- the subprocess


def _driver(spec_file: str, out_file: str) -> None:
    """Load and explain every case of the spec; write what came out (or the traceback) per case."""
    torch.set_num_threads(1)
    from lrp_core import Projection, explain
    from lrp_core.models import load
    from lrp_core.models.hub import hub_reachable

    spec = json.loads(Path(spec_file).read_text())
    image = np.load(spec["image"])
    results: dict[str, Any] = {"hub_reachable": hub_reachable(), "cases": {}}
    for name, (_, kind, method) in CASES.items():
        try:
            start = time.perf_counter()
            m = load(name)
            loaded = time.perf_counter()
            if kind == "image":
                inputs = m.preprocess(image)
            elif kind in ("text", "embedding"):
                inputs = dict(m.preprocess(SENTENCES))
            else:
                inputs = dict(m.preprocess(image, PROMPTS))
            logits = _logits(m.model, inputs)
            target = 1 if kind == "clip" else None
            if kind == "embedding":
                target = Projection(torch.ones(m.model.config.hidden_size), pooling="mean")
            exp = explain(m.model, inputs, method=method, target=target)
            res = {
                "class": type(m.model).__name__,
                "kind": m.kind,
                "labels": list(m.labels),
                "info": m.info,
                "hashes": _hashes(m.model),
                "inputs": inputs,
                "logits": logits,
                "scores": exp.scores,
                "exp_logits": exp.logits,
                "target": exp.target,
                "grid": exp.grid,
                "seconds": {"load": loaded - start, "explain": time.perf_counter() - loaded},
            }
            if kind == "clip":
                text_exp = explain(m.model, dict(inputs, explain="text"), method=method, target=0)
                res["text_scores"] = text_exp.scores
            results["cases"][name] = res
        except Exception:
            results["cases"][name] = {"error": traceback.format_exc()}
    results["errors"] = {}
    for missing in MISSING:
        try:
            load(missing)
            results["errors"][missing] = None
        except Exception as err:
            results["errors"][missing] = {"types": [c.__name__ for c in type(err).__mro__], "message": str(err)}
    torch.save(results, out_file)


def _run_driver(tmp: Path, tag: str, endpoint: str, catcher: str, hf_home: Path) -> dict[str, Any]:
    spec = tmp / f"spec-{tag}.json"
    spec.write_text(json.dumps({"image": str(tmp / "image.npy")}))
    out = tmp / f"out-{tag}.pt"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH_HOME"))
        and not k.lower().endswith("_proxy")
    }
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        TORCH_HOME=str(hf_home / "torch"),
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
        [sys.executable, __file__, str(spec), str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The repos (built here), the runs of the driver against the hub and then from the cache alone."""
    tmp = tmp_path_factory.mktemp("localhub")
    from lrp_core.models.minilm import encoder_dir

    vocab = encoder_dir() / "vocab.txt"  # the uncased BERT word pieces, shipped with minilm-sentiment
    torch.manual_seed(0)
    models, folders = {}, {}
    for name, (repo, _, _) in CASES.items():
        folders[name] = tmp / "repos" / repo
        models[name] = _build_repo(repo, folders[name], vocab)
    image = (np.random.default_rng(0).random((240, 320, 3)) * 255).astype(np.uint8)
    np.save(tmp / "image.npy", image)
    hf_home = tmp / "hf_home"
    with localhub.LocalHub() as hub, localhub.ProxyStub(403) as catcher:
        for name, (repo, _, _) in CASES.items():
            hub.add(repo, folders[name])
        online = _run_driver(tmp, "online", hub.endpoint, catcher.endpoint, hf_home)
        hub_requests = list(hub.requests)
        # the hub gone (a port nobody listens on): the same names must come from the cache just filled
        cached = _run_driver(tmp, "cached", f"http://127.0.0.1:{_free_port()}", catcher.endpoint, hf_home)
        outside = list(catcher.requests)
    return dict(
        models=models,
        folders=folders,
        image=image,
        runs={"online": online, "cached": cached},
        hub_requests=hub_requests,
        outside=outside,
    )


def _case(served, run: str, name: str) -> dict[str, Any]:
    res = served["runs"][run]["cases"][name]
    assert "error" not in res, f"load/explain of {name!r} ({run}) failed:\n{res.get('error')}"
    return res


RUNS = ["online", "cached"]


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_load_returns_the_served_weights(served, run, name):
    """Every tensor of the loaded model equals the one served (none missing, none extra)."""
    res = _case(served, run, name)
    expected = _hashes(served["models"][name])
    assert res["class"] == type(served["models"][name]).__name__
    assert sorted(res["hashes"]) == sorted(expected)
    differing = [k for k in expected if res["hashes"][k] != expected[k]]
    assert differing == [], f"tensors that differ from the served ones: {differing[:5]}"


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_preprocess_is_the_served_one_and_logits_match(served, run, name):
    """load's preprocess gives what the served repo's own processor gives, and the loaded model's logits on
    it are the served model's."""
    from PIL import Image

    res = _case(served, run, name)
    repo, kind, _ = CASES[name]
    folder, model = served["folders"][name], served["models"][name]
    pil = Image.fromarray(served["image"])
    if repo.startswith("timm/"):
        from timm.data import create_transform, resolve_data_config

        expected = create_transform(**resolve_data_config({}, model=model))(pil).unsqueeze(0)
    elif kind == "image":
        from transformers import AutoImageProcessor

        expected = AutoImageProcessor.from_pretrained(folder)(images=pil, return_tensors="pt")["pixel_values"]
    elif kind in ("text", "embedding"):
        from transformers import AutoTokenizer

        expected = dict(
            AutoTokenizer.from_pretrained(folder)(SENTENCES, padding=True, truncation=True, return_tensors="pt")
        )
    else:
        from transformers import CLIPProcessor

        expected = dict(
            CLIPProcessor.from_pretrained(folder)(text=PROMPTS, images=pil, padding=True, return_tensors="pt")
        )
    got = res["inputs"]
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(res["logits"], _logits(model, got), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_explain_runs_on_the_loaded_model(served, run, name):
    """explain returns finite, non-zero token scores of the model's token count, for the predicted class."""
    res = _case(served, run, name)
    _, kind, _ = CASES[name]
    scores, logits = res["scores"], res["logits"]
    batch = logits.shape[0]
    if kind in ("text", "embedding"):
        tokens = res["inputs"]["input_ids"].shape[1]
    else:
        pixels = res["inputs"] if kind == "image" else res["inputs"]["pixel_values"]
        tokens = res["grid"][0] * res["grid"][1]
        patch = pixels.shape[-1] // res["grid"][1]
        assert pixels.shape[-2:] == (res["grid"][0] * patch, res["grid"][1] * patch)
    assert scores.shape == (batch, tokens)
    assert torch.isfinite(scores).all() and (scores.abs().sum(1) > 0).all()
    torch.testing.assert_close(res["exp_logits"], logits, rtol=1e-5, atol=1e-5)
    expected_target = torch.full((batch,), 1) if kind == "clip" else logits.argmax(1)
    assert torch.equal(res["target"], expected_target)
    if kind == "clip":  # the text side: one row per prompt, padding scored 0
        mask = res["inputs"]["attention_mask"]
        assert res["text_scores"].shape == mask.shape and torch.isfinite(res["text_scores"]).all()
        assert (res["text_scores"][mask == 0] == 0).all()


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", list(CASES))
def test_labels_and_kind(served, run, name):
    res = _case(served, run, name)
    repo, kind, _ = CASES[name]
    assert res["kind"] == ("text" if kind in ("text", "embedding") else "image")
    if kind == "embedding":
        assert res["labels"] == [] and res["info"]["task"] == "embedding" and res["class"] == "BertModel"
    elif repo.startswith("timm/"):
        assert len(res["labels"]) == 1000 and res["labels"][0] == "tench"
    elif kind == "clip":
        assert res["labels"] == []  # CLIP has no classes: its targets are the prompts
    else:
        cfg = served["models"][name].config
        assert res["labels"] == [cfg.id2label[i] for i in range(cfg.num_labels)]


@pytest.mark.parametrize("name", list(CASES))
def test_weights_came_over_http_from_the_hub(served, name):
    """The first run downloaded each repo's weights file from the local hub (HF_ENDPOINT was honoured)."""
    repo = CASES[name][0]
    weights = {"model.safetensors", "pytorch_model.bin"} & set(os.listdir(served["folders"][name]))
    fetched = {
        p.rsplit("/", 1)[1]
        for method, p, status in served["hub_requests"]
        if method == "GET" and status == 200 and p.startswith(f"/{repo}/resolve/")
    }
    assert fetched & weights, f"no weights of {repo} were downloaded; requests: {served['hub_requests'][:20]}"


@pytest.mark.parametrize("missing", MISSING)
def test_a_name_missing_from_a_live_hub_is_an_input_error_not_unreachable(served, missing):
    err = served["runs"]["online"]["errors"][missing]
    assert err is not None, f"load({missing!r}) did not raise"
    assert "InputError" in err["types"] and "ValueError" in err["types"]
    assert missing in err["message"] and "unreachable" not in err["message"]
    assert "http://127.0.0.1:" in err["message"]  # it names the hub it asked


@pytest.mark.parametrize("missing", MISSING)
def test_a_name_not_cached_with_the_hub_gone_is_hub_unavailable(served, missing):
    err = served["runs"]["cached"]["errors"][missing]
    assert err is not None and "HubUnavailableError" in err["types"]
    assert missing in err["message"] and "unreachable" in err["message"]


@pytest.mark.parametrize("name", [n for n, (repo, _, _) in CASES.items() if repo.startswith("timm/")])
def test_timm_names_say_where_their_weights_came_from(served, name):
    assert _case(served, "online", name)["info"]["source"] == "timm pretrained (downloaded)"
    assert _case(served, "cached", name)["info"]["source"].startswith("timm pretrained (cache: ")


def test_hub_reachable_in_the_subprocesses(served):
    """HF_ENDPOINT set before import: reachable while the local hub runs, not once it is gone."""
    assert served["runs"]["online"]["hub_reachable"] is True
    assert served["runs"]["cached"]["hub_reachable"] is False


def test_nothing_left_for_another_host(served):
    """Every request the subprocesses made for a host other than 127.0.0.1 went to the recording proxy:
    there were none."""
    assert served["outside"] == []


# ----------------------------------------------------------------------------- hub_reachable in-process


@pytest.fixture
def endpoint(monkeypatch):
    """Set the endpoint huggingface_hub uses (it read HF_ENDPOINT at import, so patch the constant)."""
    from huggingface_hub import constants

    for var in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return lambda url: monkeypatch.setattr(constants, "ENDPOINT", url)


def test_hub_reachable_true_for_a_live_hub_false_for_a_refusing_port(endpoint):
    from lrp_core.models import hub_reachable as from_models
    from lrp_core.models.hub import hub_endpoint, hub_reachable

    with localhub.LocalHub() as hub:
        endpoint(hub.endpoint)
        assert hub_endpoint() == hub.endpoint
        assert hub_reachable() is True and from_models() is True
        # the server logs a request after answering it: wait for the handler thread, not for a time limit
        for _ in range(200):
            if len(hub.requests) >= 2:
                break
            time.sleep(0.01)
        assert [(m, p) for m, p, _ in hub.requests] == [("HEAD", "/"), ("HEAD", "/")]
    endpoint(f"http://127.0.0.1:{_free_port()}")
    assert hub_reachable() is False and from_models() is False


def test_hub_reachable_false_in_offline_mode_even_with_a_live_hub(endpoint, monkeypatch):
    from huggingface_hub import constants

    from lrp_core.models.hub import hub_reachable

    with localhub.LocalHub() as hub:
        endpoint(hub.endpoint)
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.setenv(var, "1")
            assert hub_reachable() is False
            monkeypatch.delenv(var)
        assert hub_reachable() is True
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline when huggingface_hub was imported
        assert hub_reachable() is False


@pytest.mark.parametrize("bad", ["", "http://", "http://127.0.0.1:notaport", "http://[::1", "http://\udcff/"])
def test_hub_reachable_never_raises_on_a_malformed_endpoint(endpoint, bad):
    from lrp_core.models.hub import hub_reachable

    endpoint(bad)
    assert hub_reachable() is False


@pytest.mark.parametrize("status,reachable", [(200, True), (404, True), (401, True), (503, False), (403, False)])
def test_hub_reachable_is_an_http_answer_that_is_not_a_refusal(endpoint, status, reachable):
    """Any answer of the hub counts (a mirror may have no home page: 404); 403 / 407 / 5xx from the gateway
    mean the hub did not serve it."""
    from lrp_core.models.hub import hub_reachable

    with localhub.ProxyStub(status) as server:
        endpoint(server.endpoint)
        assert hub_reachable() is reachable
        assert [(m, path) for m, path, _ in server.requests] == [("HEAD", "/")]


@pytest.mark.parametrize("status,reachable", [(200, True), (403, False)])
def test_hub_reachable_goes_through_the_proxy_unless_no_proxy_exempts_the_host(
    endpoint, monkeypatch, status, reachable
):
    from lrp_core.models.hub import hub_reachable

    hub = f"http://127.0.0.1:{_free_port()}"  # the hub itself refuses connections
    endpoint(hub)
    with localhub.ProxyStub(status) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.endpoint)
        assert hub_reachable() is reachable  # what the proxy answers decides
        assert [(m, path) for m, path, _ in proxy.requests] == [("HEAD", hub + "/")]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert hub_reachable() is False  # exempt: a direct connection, refused
        assert len(proxy.requests) == 1


def test_hub_reachable_is_false_when_the_proxy_refuses_the_tunnel(endpoint, monkeypatch):
    """The CI case: HTTPS goes through a proxy that lets the package registries through, not the hub."""
    from lrp_core.models.hub import hub_reachable

    endpoint("https://huggingface.co")
    with localhub.ProxyStub(403) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.endpoint)
        assert hub_reachable() is False
        assert proxy.requests == [("CONNECT", "huggingface.co:443", 403)]


if __name__ == "__main__":
    _driver(sys.argv[1], sys.argv[2])
