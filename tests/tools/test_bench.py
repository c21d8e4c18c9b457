"""The benchmark's machinery on the seconds-fast stand-ins (tiny-vit, tiny-bert, tiny-llama); no timed assertions."""

from __future__ import annotations

import json

import pytest
import torch

from lrp_core.api import METHODS
from lrp_core.methods.registry import DECODER_METHODS
from lrp_core.tools import bench, bench_models, bench_table
from lrp_core.tools.bench_table import BASELINE, Case, Settings

FAST = Settings(repeat=1, budget=5.0, threads=1, ablation_max=20)


def test_cases_cover_the_grid():
    cases = bench.make_cases(["tiny-vit", "tiny-bert"], batches=None, lengths=[8, 16])
    assert [c.size for c in cases if c.model == "tiny-vit"] == ["1 × 17", "8 × 17", "16 × 17"]
    assert [c.size for c in cases if c.model == "tiny-bert"] == ["1 × 8", "1 × 16", "8 × 8", "8 × 16"]


def test_inputs_match_the_case():
    model, x = bench.prepare(Case("tiny-vit", 2, 17))
    assert x.shape == (2, 3, 32, 32)
    model, inputs = bench.prepare(Case("tiny-bert", 3, 12))
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape == (3, 12)
    assert bool(inputs["attention_mask"].eq(1).all())


def test_decoder_cases_are_the_issue_sizes_unless_a_grid_is_given():
    assert [c.size for c in bench.make_cases(["llama"])] == ["1 × 512", "1 × 1024", "1 × 4096", "8 × 512"]
    assert [c.size for c in bench.make_cases(["llama"], batches=[2], lengths=[64, 128])] == ["2 × 64", "2 × 128"]
    cfg = bench_models.llama_config()
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg._attn_implementation,
    ) == (512, 8, 8, 2, 1376, 32000, "sdpa")


def test_the_mixture_of_experts_row_is_a_qwen3_moe_of_the_llama_rows_shape():
    assert [c.size for c in bench.make_cases(["qwen3-moe"])] == ["1 × 1024"]
    assert bench._models(bench._parser(), None, quick=False, decoders=True) == ["llama", "qwen3-moe"]
    cfg = bench_models.qwen3_moe_config()
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.vocab_size,
        cfg._attn_implementation,
    ) == (512, 8, 8, 2, 8, 2, 32000, "sdpa")
    with torch.device("meta"):  # the engine takes it (an adapter row, not a refusal)
        from lrp_core.adapters import get_adapter

        assert type(get_adapter(bench_models.build_model("qwen3-moe"))).__name__ == "Qwen3MoeAdapter"


def test_decoder_inputs_and_baseline():
    """tiny-llama: unpadded ids; the baseline's backward reaches the LM head and leaves no gradients behind."""
    model, inputs = bench.prepare(Case("tiny-llama", 2, 16))
    assert inputs["input_ids"].shape == (2, 16) and bool(inputs["attention_mask"].eq(1).all())
    seen = []
    model.lm_head.weight.register_hook(lambda g: seen.append(g))
    bench.forward_backward(model, inputs)
    assert len(seen) == 1 and seen[0].abs().sum() > 0
    # the loss is the argmax next-token logit of each row at its last position
    logits = model(**inputs).logits[:, -1]
    assert torch.equal(seen[0].ne(0).any(1).nonzero().flatten().sort().values, logits.argmax(1).unique().sort().values)
    assert all(p.grad is None for p in model.parameters())


def test_token_ablation_is_skipped_only_over_the_limit():
    assert bench.skip_reason(Case("m", 1, 17), "token_ablation", FAST) is None
    assert "one forward pass per token" in bench.skip_reason(Case("m", 2, 17), "token_ablation", FAST)
    assert bench.skip_reason(Case("m", 64, 512), "rollout", FAST) is None


@pytest.mark.slow
def test_scaling_run_in_subprocesses(tmp_path):
    """Each (case, method) in a fresh process: positive times, peak ≥ pre-call RSS, consistent ratios."""
    path = tmp_path / "rows.json"
    printed: list[str] = []
    rows = bench.run(
        [Case("tiny-vit", 1, 17), Case("tiny-bert", 1, 24)],
        ["rollout", "token_ablation"],
        FAST,
        isolate=True,
        printer=printed.append,
        json_path=str(path),
    )
    assert [(r["model"], r["method"]) for r in rows] == [
        ("tiny-vit", BASELINE),
        ("tiny-vit", "rollout"),
        ("tiny-vit", "token_ablation"),
        ("tiny-bert", BASELINE),
        ("tiny-bert", "rollout"),
        ("tiny-bert", "token_ablation"),
    ]
    timed = [r for r in rows if r["ms_per_sample"] is not None]
    assert len(timed) == 5  # token_ablation on tiny-bert 1 × 24 is over the limit of 20
    skipped = rows[-1]
    assert skipped["ratio"] is None and "not timed" in skipped["note"]
    for r in timed:
        base = next(b for b in rows if b["model"] == r["model"] and b["method"] == BASELINE)
        assert not r["note"], r["note"]
        assert r["seconds"] > 0 and r["ms_per_sample"] == pytest.approx(1000 * r["seconds"])
        assert r["runs"] >= 1 and r["threads"] == 1
        assert r["ratio"] == pytest.approx(r["seconds"] / base["seconds"])
        assert r["ratio"] == pytest.approx(r["ms_per_sample"] / base["ms_per_sample"])
        assert r["peak_mb"] > 0 and r["call_mb"] >= 0  # peak RSS ≥ the RSS before the first call
        assert r["peak_ratio"] == pytest.approx(r["peak_mb"] / base["peak_mb"])
    assert any(line.startswith("tiny-bert") and "token_ablation" in line for line in printed)
    saved = json.loads(path.read_text())
    assert saved["rows"] == rows and saved["settings"]["repeat"] == 1


def test_worker_failure_is_a_row_not_a_crash():
    rows = bench.run([Case("tiny-bert", 1, 600)], [], FAST, printer=lambda s: None)  # > 512 positions
    assert [r["method"] for r in rows] == [BASELINE]
    assert rows[0]["ms_per_sample"] is None and rows[0]["note"].startswith("error: tiny-bert 1 × 600")
    assert "error²" in bench_table.markdown(rows)


def test_quick_markdown_has_one_row_per_case_and_method(capsys, tmp_path):
    methods = ["rollout", "raw_attention", "token_ablation"]
    bench.main(
        [
            "--quick",
            "--models",
            "tiny-vit",
            "--batches",
            "1,2",
            "--methods",
            ",".join(methods),
            "--repeat",
            "1",
            "--threads",
            "1",
            "--ablation-max",
            "20",
            "--markdown",
            "--json",
            str(tmp_path / "q.json"),
        ]
    )
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("| tiny-vit")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    assert [(c[1], c[2]) for c in cells] == [
        (size, m) for size in ("1 × 17", "2 × 17") for m in [BASELINE] + [f"`{m}`" for m in methods]
    ]
    assert cells[-1][3] == "—¹" and "¹ `token_ablation`" in out  # 2 × 17 > 20: not timed, with a footnote
    assert all(c[6] == "—" for c in cells)  # in-process: no memory columns
    # the check's cost: every timed method also without the check, the baseline has no check
    assert all((c[5] == "—") == (c[2] == BASELINE or c[3] == "—¹") for c in cells)
    assert len(json.loads((tmp_path / "q.json").read_text())["rows"]) == len(table)


def test_quick_decoders_run_every_decoder_method(capsys):
    """``--quick --decoders``: tiny-llama at 1 × 32 and 2 × 32, the baseline and every method that runs on decoders
    (all of them, the Captum baselines included)."""
    rows = bench.main(["--quick", "--decoders", "--repeat", "1", "--threads", "1", "--ablation-max", "40"])
    assert [(r["batch"], r["tokens"], r["method"]) for r in rows] == [
        (b, 32, m) for b in (1, 2) for m in (BASELINE,) + tuple(DECODER_METHODS)
    ]
    for r in rows:
        if r["method"] == "token_ablation" and r["batch"] == 2:  # 64 tokens > 40: not timed
            assert r["ms_per_sample"] is None and "not timed" in r["note"]
            continue
        assert r["model"] == "tiny-llama" and not r["note"], r
        assert r["seconds"] > 0 and r["ratio"] > 0 and r["peak_mb"] is None


@pytest.mark.slow
def test_decoder_row_in_a_subprocess():
    """A decoder cell in a fresh process: peak memory columns and the ratio to the baseline's peak."""
    rows = bench.run([Case("tiny-llama", 1, 24)], ["attnlrp"], FAST, isolate=True, printer=lambda s: None)
    assert [r["method"] for r in rows] == [BASELINE, "attnlrp"]
    base, r = rows
    assert not r["note"], r["note"]
    assert r["peak_mb"] > 0 and r["call_mb"] >= 0 and r["peak_ratio"] == pytest.approx(r["peak_mb"] / base["peak_mb"])


def test_a_cell_over_the_available_memory_is_not_run():
    """The estimate (an upper bound) decides: TA on the decoder at 1 × 4096 keeps one H×N×N map per block
    (about 15 GiB estimated), AttnLRP none."""
    big = Case("llama", 1, 4096)
    free = 10 * 2**30
    assert bench.memory_reason(big, "attnlrp", free) is None
    reason = bench.memory_reason(big, "transformer_attribution", free)
    assert reason.startswith("not run: estimated peak") and "10.0 GiB available" in reason
    assert bench.memory_reason(big, "transformer_attribution", None) is None  # unknown free memory: run
    rows = bench.run([Case("tiny-llama", 1, 16)], ["attnlrp"], FAST, isolate=False, printer=lambda s: None)
    row = bench_table.make_row(big, "transformer_attribution", None, None, note=reason)
    md = bench_table.markdown(rows + [row])
    assert "| llama | 1 × 4096 | `transformer_attribution` | —³ |" in md and "³ not run" in md
    assert "error²" not in md


def test_markdown_columns():
    row = bench_table.make_row(
        Case("m", 8, 197),
        "lrp",
        {"seconds": 2.0, "seconds_unchecked": 1.5, "runs": 3, "rss_before_kb": 1024, "peak_rss_kb": 3072},
        {"seconds": 1.0, "runs": 3, "rss_before_kb": 1024, "peak_rss_kb": 2048},
    )
    lines = bench_table.markdown([row]).splitlines()
    assert lines[0].startswith(
        "| model | batch × tokens | method | ms/sample | × fwd+bwd | × fwd+bwd without the check | peak MB |"
    )
    assert lines[2] == "| m | 8 × 197 | `lrp` | 250.0 | 2.00 | 1.50 | 3 | 2 | 1.50 |"


@pytest.mark.parametrize(
    "argv, accepted",
    [
        (["--methods", "rollout,nope"], ", ".join(METHODS)),
        (["--models", "not_a_model"], "bert-base"),
        (["--batches", "1,x"], "positive integers"),
        (["--lengths", "0"], "positive integers"),
        (["--repeat", "0"], "--repeat must be ≥ 1"),
    ],
)
def test_bad_flags_name_what_is_accepted(argv, accepted, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert accepted in err


def test_quick_sources_rows_count_their_passes(capsys):
    """``--quick --sources``: tiny-llama at 1 × 64 with 32 equal sources; each row records its passes per
    explanation: leave-one-out one forward per source plus the full row (S + 1), ContextCite one per ablation plus
    the full row (n_ablations + 1), AttnLRP / CP-LRP one forward and one backward."""
    rows = bench.main(["--quick", "--sources", "--repeat", "1", "--threads", "1", "--markdown"])
    assert [(r["model"], r["batch"], r["tokens"], r["method"]) for r in rows] == [
        ("tiny-llama", 1, 64, m) for m in (BASELINE,) + bench.SOURCE_BENCH_METHODS
    ]
    S, n = bench.N_SOURCES, bench.N_ABLATIONS
    expected = {
        BASELINE: (1, 1),
        "attnlrp": (1, 1),
        "cp_lrp": (1, 1),
        "leave_one_out": (S + 1, 0),
        "context_cite": (n + 1, 0),
    }
    for r in rows:
        assert not r["note"], r
        assert (r["forward_passes"], r["backward_passes"]) == expected[r["method"]], r
        assert r["seconds"] > 0 and r["ratio"] > 0 and r["peak_mb"] is None
    out = capsys.readouterr().out
    assert "| tiny-llama | 1 × 64 | `leave_one_out` |" in out and f"| {S + 1} / 0 |" in out
    assert f"| {n + 1} / 0 |" in out and f"{S} equal sources" in out


def test_equal_spans_cover_the_context_before_the_last_token():
    spans = bench.equal_spans(4096, 32)
    assert len(spans) == 32 and spans[0][0] == 0 and spans[-1][1] == 4095
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
    assert {e - s for s, e in spans} == {127, 128}  # 4095 tokens in 32 nearly equal parts
    with pytest.raises(ValueError, match="32 sources need at least 32 context tokens"):
        bench.equal_spans(32, 32)


def test_source_methods_need_the_sources_flag(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--methods", "leave_one_out"])
    assert "leave_one_out, context_cite with --sources" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--sources", "--lengths", "16"])
    assert "--lengths must be > 32" in capsys.readouterr().err


def test_source_methods_are_priced_at_the_bench_batch_size(monkeypatch):
    """The memory gate prices leave-one-out at the ablated sequences per forward the bench gives it (one), not
    at the option's default 64; ``check_memory=False`` (``--ignore-estimate``) runs a cell over the estimate."""
    from lrp_core.methods import registry
    from lrp_core.runtime import memory

    case = Case("llama", 1, 2048)
    one = memory.estimate(
        registry.get("leave_one_out").memory, bench.case_facts("llama", 2048), 1, batch_size=bench.SOURCE_BATCH_SIZE
    )
    assert one < memory.estimate(registry.get("leave_one_out").memory, bench.case_facts("llama", 2048), 1)
    assert bench.memory_reason(case, "leave_one_out", one) is None
    assert bench.memory_reason(case, "leave_one_out", one - 1).startswith("not run: estimated peak")
    monkeypatch.setattr(bench.memory, "available", lambda device: 1)  # a machine with 1 byte free
    small = [Case("tiny-llama", 1, 16)]
    gated = bench.run(small, ["attnlrp"], FAST, isolate=False, printer=lambda s: None)
    assert gated[1]["ms_per_sample"] is None and gated[1]["note"].startswith("not run")
    ungated = bench.run(small, ["attnlrp"], FAST, isolate=False, printer=lambda s: None, check_memory=False)
    assert ungated[1]["seconds"] > 0 and not ungated[1]["note"]


def test_the_vlm_row_is_a_llava_of_the_issue_shape():
    """``--vlm``: one row of 196 image tokens (CLIP ViT-B/16 at 224 px, [CLS] dropped) + 64 text tokens, the
    language model of the llama rows; the LRP family and the layer products by default, pa_lrp refused."""
    assert [c.size for c in bench.make_cases(["llava"])] == ["1 × 260"]
    assert bench._models(bench._parser(), None, quick=False, vlm=True) == ["llava"]
    assert bench._methods(bench._parser(), "all", vlm=True)[:3] == ("attnlrp", "cp_lrp", "lrp")
    with torch.device("meta"):
        model = bench_models.build_model("llava")
    v, t = model.config.vision_config, model.config.text_config
    assert (v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size) == (768, 12, 224, 16)
    assert (t.hidden_size, t.num_hidden_layers, model.config.vision_feature_select_strategy) == (512, 8, "default")
    inputs = bench_models.make_inputs(model, Case("llava", 1, 260))
    assert inputs["input_ids"].shape == (1, 260) and inputs["pixel_values"].shape == (1, 3, 224, 224)
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 196
    assert "refused on VLMs" in bench.skip_reason(Case("llava", 1, 260), "pa_lrp", FAST)


def test_quick_vlm_row_runs_in_process():
    rows = bench.main(["--quick", "--vlm", "--methods", "attnlrp,lrp", "--repeat", "1", "--threads", "1"])
    assert [(r["model"], r["tokens"], r["method"]) for r in rows] == [
        ("tiny-llava", 24, m) for m in (BASELINE, "attnlrp", "lrp")
    ]
    assert all(not r["note"] and r["seconds"] > 0 and r["ratio"] > 0 for r in rows)
