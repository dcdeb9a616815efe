"""The GSM8K harness (quicksilver.eval.gsm8k) and the GPU speed script (quicksilver.bench.gpu_families),
run on tiny random models: the plumbing and the answer extraction, not the numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

import quicksilver
from family_fixtures import write_tiny
from quicksilver.bench import gpu_families
from quicksilver.errors import ConfigError
from quicksilver.eval.gsm8k import (
    PRESETS,
    evaluate_gsm8k,
    extract_answer,
    load_items,
    normalize_number,
    run,
)

ROWS = [
    {
        "question": "Tom has 3 apples and buys 4 more. How many apples?",
        "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
    },
    {
        "question": "A pen costs $1,250 for 10. What is the cost of one?",
        "answer": "1250/10 = 125\n#### 125",
    },
    {"question": "What is 0.5 + 0.25?", "answer": "#### 0.75"},
]


@pytest.mark.parametrize(
    "text,want",
    [
        ("so 3 + 4 = 7.\n#### 7", "7"),
        ("The answer is 1,234.", "1234"),
        ("x = 5, y = 6 so \\boxed{42} and then 9", "42"),
        ("#### $18.00", "18"),
        ("she pays -3 dollars... then 12 more; final 0.750", "0.75"),
        ("no digits here", None),
        ("#### 3\nlater #### 4", "4"),
    ],
)
def test_extract_answer(text: str, want: str | None) -> None:
    assert extract_answer(text) == want


def test_normalize_number() -> None:
    assert normalize_number("1,000") == "1000" and normalize_number("7.") == "7"
    assert normalize_number("2.50") == "2.5" and normalize_number("abc") is None


def test_load_items_errors(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"d.jsonl:2: invalid JSON"):
        load_items(f)
    f.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ConfigError, match="####"):
        load_items(f)
    with pytest.raises(ConfigError, match="no such data file"):
        load_items(tmp_path / "missing.jsonl")


@pytest.fixture(scope="module")
def llada(tmp_path_factory: pytest.TempPathFactory) -> quicksilver.Pipeline:
    return quicksilver.load(write_tiny("llada", tmp_path_factory.mktemp("llada")), device="cpu")


def test_gsm8k_on_a_tiny_model(
    llada: quicksilver.Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    rep = evaluate_gsm8k(
        llada, data, preset="llada", max_new_tokens=16, steps=16
    )  # small canvas for CI
    assert (
        rep.total == 3
        and 0.0 <= rep.accuracy <= 1.0
        and rep.correct == sum(r.correct for r in rep.records)
    )
    assert (
        rep.settings["policy"] == "low_confidence" and rep.settings["block_length"] == 8
    )  # LLaDA's published
    assert [r.target for r in rep.records] == ["7", "125", "0.75"]
    assert (
        all(r.nfe == 16 for r in rep.records) and rep.chat
    )  # one token per step, through the chat template

    # fast-dllm preset: 5-shot plain prompts from the file itself (not scored), threshold decoding
    rep2 = evaluate_gsm8k(llada, data, preset="fast-dllm", num_fewshot=2, max_new_tokens=16)
    assert rep2.total == 1 and rep2.num_fewshot == 2 and not rep2.chat
    assert rep2.settings["policy"] == "threshold" and rep2.settings["threshold"] == 0.9

    args = argparse.Namespace(
        data=str(data),
        preset="llada",
        limit=2,
        num_fewshot=None,
        fewshot_data=None,
        batch_size=2,
        records=str(tmp_path / "rec.jsonl"),
    )
    assert run(llada, args, max_new_tokens=8, steps=8) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["benchmark"] == "gsm8k" and line["total"] == 2 and "records" not in line
    assert len((tmp_path / "rec.jsonl").read_text().splitlines()) == 2
    assert set(PRESETS) >= {"llada", "fast-dllm"}


def test_gpu_bench_tiny_runs_on_cpu(capsys: pytest.CaptureFixture) -> None:
    rc = gpu_families.main(
        ["--tiny", "--batch", "1", "2", "--iters", "1", "--warmup", "0", "--device", "cpu"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # ends with one line of JSON
    assert out["weights"] == "random" and out["tiny"] and len(out["results"]) == 2
    for res in out["results"]:
        assert [r["batch"] for r in res["rows"]] == [1, 2]
        assert all(
            r["block_fwd_per_s"] > 0 and r["projected_tok_s_per_request"]["2.0"] > 0
            for r in res["rows"]
        )


def test_gpu_bench_shapes_are_the_published_models() -> None:
    """The real shapes through the families' config mapping: LLaDA-8B has 8.02B parameters (model card)."""
    from quicksilver.models.transformer import Transformer

    counts = {}
    for name in ("llada-8b", "dream-7b"):
        cfg = gpu_families.shape_config(name, tiny=False)
        with torch.device("meta"):
            counts[name] = Transformer(cfg).num_params()
    assert round(counts["llada-8b"] / 1e9, 2) == 8.02
    assert round(counts["dream-7b"] / 1e9, 2) == 7.62  # Qwen2.5-7B


def test_gemma_shape_is_the_published_model(capsys: pytest.CaptureFixture) -> None:
    """DiffusionGemma-26B-A4B through the family's config mapping: ~25.2B parameters (the Gemma-4
    26B-A4B model card; the vision tower is not built); the tiny shape runs the real loop."""
    from quicksilver.bench import gemma_shape
    from quicksilver.models.families.diffusion_gemma import gemma_config
    from quicksilver.models.families.diffusion_gemma_net import DiffusionGemmaLM

    cfg = gemma_config(Path("<x>"), gemma_shape.shape_config(tiny=False, layers=None))
    with torch.device("meta"):
        n = DiffusionGemmaLM(cfg).num_params()
    assert 24.5e9 < n < 25.5e9
    assert cfg.layer_types.count("full_attention") == 5 and cfg.full.n_kv_heads == 2
    rc = gpu_families.main(
        ["--shapes", gemma_shape.SHAPE, "--tiny", "--batch", "1", "2", "--iters", "1"]
        + ["--canvases", "1", "--device", "cpu"]
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["results"][0]["layers"] == 2
    for row in out["results"][0]["rows"]:
        assert row["loop_tokens"] == 256 and row["loop_tok_s_per_request"] > 0
        assert row["decode_fwd_per_s"] > 0 and row["projected_tok_s_per_request"] > 0


@pytest.mark.slow  # the eval command in its own process on a family model: ~11 s (make test-slow, CI)
def test_eval_cli_runs_gsm8k(llada: quicksilver.Pipeline, tmp_path: Path) -> None:
    """`quicksilver eval --benchmark gsm8k --data FILE` is wired to the harness and ends with JSON."""
    import json
    import subprocess
    import sys

    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "What is 2+3?", "answer": "#### 5"}\n')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "quicksilver.cli",
            "eval",
            "--benchmark",
            "gsm8k",
            "--data",
            str(data),
            "--model",
            str(llada.path),
            "--preset",
            "family",
            "--limit",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["total"] == 1 and 0.0 <= out["accuracy"] <= 1.0
    bad = subprocess.run(
        [sys.executable, "-m", "quicksilver.cli", "eval", "--benchmark", "gsm8k"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--data" in bad.stderr and "Traceback" not in bad.stderr
