"""A local Hugging Face Hub on 127.0.0.1 for tests, and the repos it serves.

:class:`LocalHub` serves folders as model repos over plain HTTP, speaking the part of the hub's
protocol that ``huggingface_hub`` uses to download (point ``HF_ENDPOINT`` at :attr:`LocalHub.endpoint`):

* ``HEAD|GET /{repo_id}/resolve/{revision}/{path}``: the file, with the headers the client requires
  (``X-Repo-Commit``, ``ETag``, ``Content-Length``); a missing file is a 404 with
  ``X-Error-Code: EntryNotFound``, an unknown repo one with ``RepoNotFound``.
* ``GET /api/models/{repo_id}[/revision/{revision}]``: the repo's info (``sha``, ``siblings``).
* ``GET /api/models/{repo_id}/tree/{revision}[/{path}]``: the file listing.

Every request is logged in :attr:`LocalHub.requests` as ``(method, path, status)``.

The ``*_repo`` functions write tiny models with random weights under famous hub names, with the files
those repos really hold (the loaders read these names), and return the model that was written.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import torch
from by_path import root_fixtures

# ----------------------------------------------------------------------------- the server


def _commit_of(repo_id: str) -> str:
    """A fixed 40-hex 'commit' per repo (the client stores files under snapshots/<commit>)."""
    return hashlib.sha1(f"commit of {repo_id}".encode()).hexdigest()


class _HubHandler(BaseHTTPRequestHandler):
    owner: LocalHub
    protocol_version = "HTTP/1.0"  # one request per connection: simple, and enough for tests

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence the default stderr log
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._route(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._route(body=True)

    # -- routing

    def _route(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        status = 404
        try:
            if path == "/":  # the home page, which hub_reachable asks for
                status = self._json({"hub": "local"}, body)
            elif path.startswith("/api/models/"):
                status = self._api(path[len("/api/models/") :], body)
            elif "/resolve/" in path:
                status = self._resolve(path.lstrip("/"), body)
            else:
                self._error(404, "RepoNotFound" if path.count("/") <= 2 else "", f"no route for {path}", body)
        finally:
            self.owner.requests.append((self.command, self.path, status))

    def _resolve(self, rest: str, body: bool) -> int:
        head, _, tail = rest.partition("/resolve/")
        repo_id = head if head in self.owner.repos else None
        if repo_id is None:
            return self._error(404, "RepoNotFound", f"Repository {head} not found", body)
        revision, _, filename = tail.partition("/")
        commit = _commit_of(repo_id)
        if revision not in ("main", commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body, commit=None)
        file = self.owner.repos[repo_id] / filename
        if not filename or not file.is_file():
            return self._error(404, "EntryNotFound", f"{filename} does not exist on {revision}", body, commit)
        data = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if body:
            self.wfile.write(data)
        return 200

    def _api(self, rest: str, body: bool) -> int:
        found = self.owner.split_repo(rest)
        if found is None:
            return self._error(404, "RepoNotFound", f"Repository {rest} not found", body)
        repo_id, tail = found
        commit = _commit_of(repo_id)
        files = self.owner.files(repo_id)
        if tail == "" or tail.startswith("revision/"):
            info = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [{"rfilename": f} for f in files],
            }
            return self._json(info, body)
        if tail.startswith("tree/"):
            _, _, sub = tail[len("tree/") :].partition("/")
            return self._json(self._tree(repo_id, sub.strip("/")), body)
        return self._error(404, "", f"no route for api/models/{rest}", body)

    def _tree(self, repo_id: str, sub: str) -> list[dict[str, Any]]:
        """The listing of folder ``sub`` (recursive, as the client asks it for the whole repo)."""
        root = self.owner.repos[repo_id]
        entries = []
        for name in self.owner.files(repo_id):
            if sub and not name.startswith(sub + "/"):
                continue
            data = (root / name).read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
            entries.append({"type": "file", "path": name, "size": len(data), "oid": blob})
        return entries

    # -- responses

    def _json(self, obj: Any, body: bool) -> int:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        return 200

    def _error(self, status: int, code: str, message: str, body: bool, commit: str | None = None) -> int:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        return status


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: ProxyStub
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _answer(self) -> None:
        self.owner.requests.append((self.command, self.path, self.owner.status))
        self.send_response(self.owner.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_CONNECT = do_GET = do_HEAD = do_POST = do_PUT = _answer  # noqa: N815


class _Server:
    """An HTTP server on 127.0.0.1 (a free port) in a daemon thread; ``with`` starts and stops it."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int]] = []  # (method, path or target, status), in arrival order
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "_Server":
        handler = type("Handler", (self.handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name=type(self).__name__, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class LocalHub(_Server):
    """Serves ``{repo_id: folder}`` as hub model repos; :attr:`endpoint` is the value for ``HF_ENDPOINT``."""

    handler = _HubHandler

    def __init__(self) -> None:
        super().__init__()
        self.repos: dict[str, Path] = {}

    def add(self, repo_id: str, folder: str | Path) -> None:
        """Serve ``folder`` (its files, recursively) as the model repo ``repo_id``."""
        self.repos[repo_id] = Path(folder)

    def split_repo(self, rest: str) -> tuple[str, str] | None:
        """``'owner/name/tail'`` -> ``('owner/name', 'tail')`` for a served repo (longest id first), else None."""
        for repo_id in sorted(self.repos, key=len, reverse=True):
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return repo_id, rest[len(repo_id) + 1 :]
        return None

    def files(self, repo_id: str) -> list[str]:
        root = self.repos[repo_id]
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class ProxyStub(_Server):
    """A forward proxy that forwards nothing: it logs every request (``CONNECT host:port`` or an absolute URL)
    and answers it with ``status`` (403: the proxy refuses). As ``HTTP(S)_PROXY`` it shows what tried to leave."""

    handler = _ProxyHandler

    def __init__(self, status: int = 403) -> None:
        super().__init__()
        self.status = status


# ----------------------------------------------------------------------------- repos under famous names


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2))


def _randomise_norms(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial LayerNorm weights, so that a model loaded without them would give other logits."""
    root_fixtures()._perturb_norms(model, seed)


def _save_bin_checkpoint(folder: Path, model: torch.nn.Module) -> None:
    """The legacy layout of the older hub repos: config.json and pytorch_model.bin (no safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def timm_repo(folder: Path, hub_id: str, model_args: dict[str, Any] | None = None, seed: int = 0) -> torch.nn.Module:
    """A timm repo ``timm/<arch>.<tag>`` as timm's own ``save_for_hf`` writes it (config.json with the
    pretrained config and ``model_args``, model.safetensors, pytorch_model.bin), random weights.

    ``model_args`` shrink the architecture; only ``hf-hub:`` loads read them back, so a repo that is loaded by
    its plain timm name must keep the default arguments (full size).
    """
    import timm
    from timm.models import save_for_hf

    arch = hub_id.split("/", 1)[1]
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, **(model_args or {})).eval()
    _randomise_norms(model, seed)
    save_for_hf(model, str(folder), model_args=model_args, safe_serialization="both")
    return model


def bert_sst2_repo(
    folder: Path, vocab_file: Path, seed: int = 1, head: str = "BertForSequenceClassification", **config: Any
) -> torch.nn.Module:
    """``textattack/bert-base-uncased-SST-2``: config.json, pytorch_model.bin, vocab.txt, tokenizer_config.json,
    special_tokens_map.json (no tokenizer.json, no safetensors), with a 2-layer BERT over the real uncased
    word-piece vocabulary (``head``, ``config``: another head of it, e.g. :func:`bert_ner_repo`)."""
    import transformers

    vocab = vocab_file.read_text(encoding="utf-8")
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=len(vocab.splitlines()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        **{"num_labels": 2, "architectures": [head], "finetuning_task": "sst-2", **config},
    )
    model = getattr(transformers, head)(cfg).eval()
    _randomise_norms(model, seed)
    _save_bin_checkpoint(folder, model)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": 512})
    _write_json(
        folder / "special_tokens_map.json",
        {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
    )
    return model


def minilm_embedding_repo(folder: Path, vocab_file: Path, seed: int = 7) -> torch.nn.Module:
    """``sentence-transformers/all-MiniLM-L6-v2``: a 2-layer ``BertModel`` (architectures ``["BertModel"]``, no
    head) with the real uncased word pieces, safetensors, and the pipeline's modules.json / 1_Pooling config."""
    from transformers import BertConfig, BertModel

    vocab = vocab_file.read_text(encoding="utf-8")
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(vocab.splitlines()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        architectures=["BertModel"],
    )
    model = BertModel(cfg).eval()
    _randomise_norms(model, seed)
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": 512})
    _write_json(
        folder / "special_tokens_map.json",
        {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
    )
    _write_json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    (folder / "1_Pooling").mkdir(exist_ok=True)
    _write_json(
        folder / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
    )
    return model


def distilbert_sst2_repo(folder: Path, vocab_file: Path, seed: int = 2) -> torch.nn.Module:
    """``distilbert-base-uncased-finetuned-sst-2-english`` (legacy id without an owner): config.json with
    NEGATIVE / POSITIVE labels, model.safetensors, vocab.txt, tokenizer_config.json."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    vocab = vocab_file.read_text(encoding="utf-8")
    torch.manual_seed(seed)
    cfg = DistilBertConfig(
        vocab_size=len(vocab.splitlines()),
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
        finetuning_task="sst-2",
        initializer_range=0.3,
    )
    model = DistilBertForSequenceClassification(cfg).eval()
    _randomise_norms(model, seed)
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": 512})
    return model


def _byte_level_vocab(specials: list[str], suffix: str = "") -> dict[str, int]:
    """Specials, then the 256 byte-level symbols (and, with ``suffix``, each symbol + suffix): a BPE vocabulary
    with no merges that tokenizes any text, one byte per token."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    tokens = specials + symbols + ([s + suffix for s in symbols] if suffix else [])
    return {t: i for i, t in enumerate(tokens)}


def roberta_sentiment_repo(
    folder: Path, seed: int = 3, head: str = "RobertaForSequenceClassification", labels: dict | None = None
) -> torch.nn.Module:
    """``cardiffnlp/twitter-roberta-base-sentiment-latest``: config.json (negative / neutral / positive),
    pytorch_model.bin, vocab.json, merges.txt, special_tokens_map.json, as that repo has them (``head``,
    ``labels``: another head of it, e.g. :func:`roberta_squad_repo`)."""
    import transformers

    vocab = _byte_level_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    torch.manual_seed(seed)
    labels = labels or {0: "negative", 1: "neutral", 2: "positive"}
    cfg = transformers.RobertaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        architectures=[head],
    )
    model = getattr(transformers, head)(cfg).eval()
    _randomise_norms(model, seed)
    _save_bin_checkpoint(folder, model)
    _write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    _write_json(
        folder / "special_tokens_map.json",
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "sep_token": "</s>",
            "pad_token": "<pad>",
            "cls_token": "<s>",
            "mask_token": "<mask>",
        },
    )
    return model


def deberta_v3_repo(folder: Path, seed: int = 7) -> torch.nn.Module:
    """``microsoft/deberta-v3-base``: config.json (DeBERTa-v3's layout: relative attention with 256 buckets, shared
    position projections, the relative table normalised, no absolute positions, no token types), pytorch_model.bin
    and tokenizer_config.json as that repo has them; a tiny sentencepiece-style Unigram ``tokenizer.json`` stands for
    its spm.model (transformers 5 reads it without sentencepiece), and the checkpoint carries a classifier head, so
    that the loaded logits are the served model's (the real repo has none: loading adds a new head)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)] + ["\u2581" + chr(c) for c in range(97, 123)]
    vocab = [(t, 0.0) for t in specials] + [(w, -1.0 - 0.01 * i) for i, w in enumerate(pieces)]
    torch.manual_seed(seed)
    cfg = DebertaV2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=256,
        max_relative_positions=-1,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        pad_token_id=0,
    )
    model = DebertaV2ForSequenceClassification(cfg).eval()
    _randomise_norms(model, seed)
    _save_bin_checkpoint(folder, model)
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "DebertaV2Tokenizer",
            "do_lower_case": False,
            "model_max_length": 512,
            **dict(zip(("pad_token", "cls_token", "sep_token", "unk_token", "mask_token"), specials)),
        },
    )
    return model


def bert_ner_repo(folder: Path, vocab_file: Path, seed: int = 5) -> torch.nn.Module:
    """``dslim/bert-base-NER``: a BertForTokenClassification with the CoNLL-2003 tags, files as bert_sst2_repo."""
    tags = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
    id2label = dict(enumerate(tags))
    return bert_sst2_repo(
        folder,
        vocab_file,
        seed,
        head="BertForTokenClassification",
        num_labels=len(tags),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        finetuning_task="ner",
    )


def roberta_squad_repo(folder: Path, seed: int = 6) -> torch.nn.Module:
    """``deepset/roberta-base-squad2``: a RobertaForQuestionAnswering (start, end), files as roberta_sentiment_repo."""
    labels = {0: "LABEL_0", 1: "LABEL_1"}  # the two columns, start and end
    return roberta_sentiment_repo(folder, seed, head="RobertaForQuestionAnswering", labels=labels)


def deit_image_repo(folder: Path, seed: int = 4) -> torch.nn.Module:
    """``facebook/deit-small-patch16-224``: config.json (ViTForImageClassification, 224 px, 16 px patches),
    pytorch_model.bin and the legacy preprocessor_config.json (DeiTFeatureExtractor, resize 256, crop 224)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    labels = {i: f"imagenet class {i}" for i in range(10)}
    cfg = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        architectures=["ViTForImageClassification"],
    )
    model = ViTForImageClassification(cfg).eval()
    _randomise_norms(model, seed)
    _save_bin_checkpoint(folder, model)
    _write_json(
        folder / "preprocessor_config.json",
        {
            "crop_size": 224,
            "do_center_crop": True,
            "do_normalize": True,
            "do_resize": True,
            "feature_extractor_type": "DeiTFeatureExtractor",
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
            "resample": 3,
            "size": 256,
        },
    )
    return model


def _hf_image_repo(folder: Path, cls: str, config_cls: str, seed: int, **config: Any) -> torch.nn.Module:
    """A tiny Hugging Face image classifier ``cls`` (224 px, 16 px patches, width 48, 2 layers, 10 classes):
    config.json, pytorch_model.bin and a ViT-style preprocessor_config.json (resize 224, ImageNet mean / std)."""
    import transformers

    torch.manual_seed(seed)
    labels = {i: f"imagenet class {i}" for i in range(10)}
    cfg = getattr(transformers, config_cls)(
        image_size=224,
        patch_size=16,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        architectures=[cls],
        **config,
    )
    model = getattr(transformers, cls)(cfg).eval()
    _randomise_norms(model, seed)
    _save_bin_checkpoint(folder, model)
    _write_json(
        folder / "preprocessor_config.json",
        {
            "do_normalize": True,
            "do_resize": True,
            "image_processor_type": "ViTImageProcessor",
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
            "resample": 3,
            "size": {"height": 224, "width": 224},
        },
    )
    return model


def dinov2_registers_repo(folder: Path, seed: int = 6) -> torch.nn.Module:
    """``facebook/dinov2-with-registers-small``: a tiny Dinov2WithRegistersForImageClassification, 4 registers."""
    return _hf_image_repo(
        folder, "Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig", seed, num_register_tokens=4
    )


def beit_repo(folder: Path, seed: int = 7) -> torch.nn.Module:
    """``microsoft/beit-base-patch16-224``: a tiny BeitForImageClassification (per-layer relative position bias,
    LayerScale, mean pooling), its bias tables random."""
    model = _hf_image_repo(
        folder, "BeitForImageClassification", "BeitConfig", seed, use_relative_position_bias=True, use_mean_pooling=True
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    _save_bin_checkpoint(folder, model)
    return model


def clip_repo(folder: Path, seed: int = 5) -> torch.nn.Module:
    """``openai/clip-vit-base-patch32``: config.json, model.safetensors, the legacy preprocessor_config.json
    (CLIPFeatureExtractor, 224 px) and the tokenizer files (vocab.json, merges.txt, tokenizer.json,
    tokenizer_config.json); 224 px images in 32 px patches, 77 text positions, a byte-level vocabulary."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    vocab = _byte_level_vocab(["<|startoftext|>", "<|endoftext|>"], suffix="</w>")
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    _write_json(
        folder / "preprocessor_config.json",
        {
            "crop_size": 224,
            "do_center_crop": True,
            "do_normalize": True,
            "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor",
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "resample": 3,
            "size": 224,
        },
    )
    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        ),
        vision_config=dict(
            image_size=224,
            patch_size=32,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=3,
        ),
        projection_dim=24,
    )
    model = CLIPModel(cfg).eval()
    _randomise_norms(model, seed)
    model.save_pretrained(folder)
    return model


# ----------------------------------------------------------------------------- decoder LMs under famous names

#: tiny causal-LM configurations per family: (transformers config class, model class, config arguments)
_DECODER_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=2, n_positions=64)),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=True,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=4,
            query_pre_attn_scalar=8,
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=None,
        ),
    ),
}


def decoder_repo(folder: Path, family: str, seed: int = 6) -> torch.nn.Module:
    """A causal LM repo as the hub's decoder repos hold it: config.json (``architectures`` = the causal-LM class),
    model.safetensors and a byte-level BPE tokenizer — GPT-2's vocab.json + merges.txt for ``gpt2``, a
    tokenizer.json + tokenizer_config.json (fast tokenizer, end-of-text token, no padding token) for the others.
    ``family`` is a key of :data:`_DECODER_FAMILIES`; tiny sizes, random weights, norms perturbed."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    eos = "<|endoftext|>"
    vocab = _byte_level_vocab([eos])
    config_class, model_class, sizes = _DECODER_FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    if family == "gpt2":
        _write_json(folder / "vocab.json", vocab)
        (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
        transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    else:
        bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=eos).save_pretrained(folder)
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(
        vocab_size=len(vocab), bos_token_id=0, eos_token_id=0, architectures=[model_class], **sizes
    )
    model = getattr(transformers, model_class)(cfg).eval()
    _randomise_norms(model, seed)
    model.save_pretrained(folder)
    return model
