"""The speed and serving benchmarks run end to end on tiny checkpoints and end with their JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def qs(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quicksilver.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from quicksilver.models.init import init_model

    d = tmp_path_factory.mktemp("bench")
    return (
        init_model(
            d / "diff", "tiny", seed=0, attention="block_causal", block_size=16, max_seq_len=2048
        ),
        init_model(d / "ar", "tiny", seed=1, attention="causal"),
    )


def test_bench_speed_reports_all_four_methods_and_ratios(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    from quicksilver.models.init import init_model

    diff, ar = pair
    drafter = init_model(tmp_path / "drafter", "tiny", seed=2, attention="causal", draft_length=4)
    r = qs(
        "bench",
        "speed",
        "--model",
        str(diff),
        "--ar-model",
        str(ar),
        "--verify-model",
        str(drafter),
        "--tasks",
        "chat,sudoku4",
        "--limit",
        "1",
        "--repeats",
        "1",
        "--interleave",
        "--draft-sweep",
        "2",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"ar_kv_cache", "reference", "one_token_per_step", "default"} <= set(out["methods"])
    assert out["interleave"] is True and out["aggregate_ratio_vs_ar"] > 0
    assert all(m["tok_s_aggregate"] > 0 for m in out["methods"].values())
    v = out["methods"]["verify"]  # a random drafter: verify runs beside, exactly AR all the same
    assert v["identical_to_ar"] == 1.0 and v["differences"] == [] and sum(v["accepted_hist"])
    assert 0.0 <= v["wide_pass_fraction"] <= 1.0
    assert out["verify"]["ratio_vs_ar"] > 0 and out["verify"]["tpf"] > 0.5  # ~1: random drafts
    assert out["verify"]["decode_ratio_vs_ar"] > 0 and out["verify"]["draft"] == 4
    assert out["methods"]["verify_k2"]["identical_to_ar"] == 1.0
    assert Path(out["verify"]["k_plot"]).stat().st_size > 1000
    for key in (
        "tok_s",
        "tpf",
        "accuracy",
        "ratio_vs_ar",
        "ratio_vs_reference",
        "step_vs_ar_token",
        "ar_ms_per_token",
    ):
        assert isinstance(out[key], float)
    assert out["step_vs_ar_token"] > 0 and "ratio_vs_llama_cpp" not in out
    ref = out["methods"]["reference"]
    assert ref["nfe"] >= ref["tokens"] - 1  # the reference runs one forward per canvas position
    assert out["methods"]["ar_kv_cache"]["tpf"] <= 1.0
    for m in ("ar_kv_cache", "default"):  # streamed methods: tok/s after the first token too
        assert out["methods"][m]["decode_tok_s"] > 0
    assert (tmp_path / "speed.png").stat().st_size > 1000


def test_the_k_plot_has_draft_0_the_default_and_the_sweep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from quicksilver.bench import verify

    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        verify, "line_plot", lambda path, xs, series, *a: seen.update(xs=xs, s=series)
    )
    run = {"tok_s": 1.0, "tok_s_aggregate": 2.0}
    summary = {"verify_ar": run, "verify": {**run, "tok_s": 3.0}, "verify_k4": run}
    assert verify.k_plot(tmp_path, {"verify": run, "verify_ar": run}, 8, run) is None  # no sweep
    verify.k_plot(tmp_path, summary, 8, run)
    assert seen["xs"] == [0, 4, 8] and seen["s"]["verify tok/s (median item)"] == [1.0, 1.0, 3.0]


def test_repeats_run_back_to_back_or_round_robin() -> None:
    from quicksilver.bench.speed import run_order

    names = ["a", "b", "c"]
    assert run_order(names, 1, 2, False) == [
        ("b", 0),
        ("b", 1),
        ("c", 0),
        ("c", 1),
        ("a", 0),
        ("a", 1),
    ]
    # interleaved: every repeat visits every method once, and who goes first turns with the repeat
    got = run_order(names, 1, 3, True)
    assert [n for n, _ in got] == ["b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [r for _, r in got] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_bench_speed_vs_llama_cpp(pair: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="optional: make test-llama-cpp")
    from quicksilver.assets import embedded_ar_model_path
    from quicksilver.models.init import init_model
    from quicksilver.tokenizer import Tokenizer

    diff, _ = pair
    shipped = embedded_ar_model_path()
    assert shipped is not None  # a real BPE vocabulary (llama.cpp needs merges)
    ar = init_model(
        tmp_path / "ar", "tiny", seed=1, attention="causal", tokenizer=Tokenizer.from_dir(shipped)
    )
    args = ["--model", str(diff), "--ar-model", str(ar), "--tasks", "sudoku4", "--limit", "1"]
    r = qs(
        "bench",
        "speed",
        *args,
        "--repeats",
        "1",
        "--skip-reference",
        "--vs-llama-cpp",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out["ratio_vs_llama_cpp"], float)
    ours, theirs = out["methods"]["ar_kv_cache"], out["methods"]["llama_cpp_ar"]
    assert ours["task_accuracy"] == theirs["task_accuracy"] and ours["tokens"] == theirs["tokens"]


def test_bench_speed_refuses_a_non_causal_baseline(pair: tuple[Path, Path]) -> None:
    diff, _ = pair
    r = qs("bench", "speed", "--model", str(diff), "--ar-model", str(diff), "--limit", "1")
    assert r.returncode == 2 and "not a causal" in r.stderr and "Traceback" not in r.stderr


def bench_serve(diff: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = qs(
        "bench",
        "serve",
        "--model",
        str(diff),
        "--concurrency",
        "1,2",
        "--min-requests",
        "2",
        "--max-requests",
        "2",
        "--max-tokens",
        "16",
        "--out",
        str(out),
        *extra,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        assert lv["failed"] == 0 and lv["requests"] == 2 and lv["aggregate_tok_s"] > 0
    assert (out / "serve.png").stat().st_size > 1000
    return report


def test_bench_serve_levels(pair: tuple[Path, Path], tmp_path: Path) -> None:
    assert "agent_loop" not in bench_serve(pair[0], tmp_path, "--agent-turns", "0")


@pytest.mark.slow  # two more servers, with and without the prefix cache: ~30 s (make test-slow, CI)
def test_bench_serve_agent_loop(pair: tuple[Path, Path], tmp_path: Path) -> None:
    loop = bench_serve(pair[0], tmp_path, "--agent-turns", "2")["agent_loop"]
    assert (
        len(loop["seconds_per_turn"]["prefix_cache"]) == 2
        and len(loop["seconds_per_turn"]["no_prefix_cache"]) == 2
    )


def test_json_line_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    from quicksilver.bench.common import emit_json

    emit_json({"ratio": float("nan"), "xs": [1.5, float("inf")], "nested": {"y": -float("inf")}})
    line = capsys.readouterr().out.strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard {c}")) == {
        "ratio": None,
        "xs": [1.5, None],
        "nested": {"y": None},
    }
