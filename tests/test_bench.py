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
    # the headline is what `quicksilver serve` decodes with; the diffusion default keeps its own
    assert out["headline"] == "verify" and out["tok_s"] == v["tok_s"] and out["tpf"] == v["tpf"]
    assert out["ratio_vs_ar"] == out["verify"]["ratio_vs_ar"] == v["ratio_vs_ar"]
    d = out["methods"]["default"]
    assert d["ratio_vs_ar"] == d["tok_s"] / out["methods"]["ar_kv_cache"]["tok_s"]
    for key in ("aggregate_ratio_vs_ar", "step_vs_ar_token", "accuracy_vs_one_per_step"):
        assert isinstance(d[key], float) and isinstance(v[key], float) and key in out
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


def _speed_vs_llama(pair: tuple[Path, Path], tmp_path: Path) -> dict[str, Any]:
    """bench speed --vs-llama-cpp on a tiny causal twin with the shipped BPE vocabulary (llama.cpp
    needs merges), one sudoku4 item."""
    from quicksilver.assets import embedded_ar_model_path
    from quicksilver.models.init import init_model
    from quicksilver.tokenizer import Tokenizer

    diff, _ = pair
    shipped = embedded_ar_model_path()
    assert shipped is not None
    ar = init_model(
        tmp_path / "ar", "tiny", seed=1, attention="causal", tokenizer=Tokenizer.from_dir(shipped)
    )
    args = ["--model", str(diff), "--ar-model", str(ar), "--tasks", "sudoku4", "--limit", "1"]
    r = qs(
        "bench", "speed", *args, "--repeats", "1", "--skip-reference", "--vs-llama-cpp",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_bench_speed_vs_llama_cpp(pair: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="optional: make test-llama-cpp")
    out = _speed_vs_llama(pair, tmp_path)
    assert isinstance(out["ratio_vs_llama_cpp"], float)
    ours, theirs = out["methods"]["ar_kv_cache"], out["methods"]["llama_cpp_ar"]
    assert ours["task_accuracy"] == theirs["task_accuracy"] and ours["tokens"] == theirs["tokens"]


def test_bench_speed_vs_llama_server(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """llama.cpp's own C++ loop (llama-server, timed by its own clock) on the same token ids."""
    from quicksilver.bench.peers import llama_server_built

    if not llama_server_built():
        pytest.skip("optional: make llama-server")
    out = _speed_vs_llama(pair, tmp_path)
    assert isinstance(out["ratio_vs_llama_server"], float)
    ours, theirs = out["methods"]["ar_kv_cache"], out["methods"]["llama_server_ar"]
    assert ours["tokens"] == theirs["tokens"] and theirs["tok_s"] > 0
    ngram = out["methods"].get("llama_server_ngram")  # where this build has n-gram speculation
    if ngram is not None:  # greedy speculation is lossless: the same tokens
        assert ngram["tokens"] == ours["tokens"] and out["ratio_vs_llama_cpp_best"] > 0


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


@pytest.mark.slow  # a served model at two concurrency levels, end to end (make test-slow, CI)
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


def test_peer_prompts_and_agent_episodes_come_from_the_suite() -> None:
    """``bench serve --vs-llama-cpp`` sends chat-templated token ids of the five tasks in turn;
    ``bench agents`` replays tool_loop conversations, each turn the whole conversation so far."""
    from quicksilver.assets import resolve_model
    from quicksilver.bench.serve_vs import episodes, suite_prompts
    from quicksilver.models.checkpoint import load_tokenizer

    tok = load_tokenizer(resolve_model(None))
    prompts = suite_prompts(tok, 10, 0)
    assert len(prompts) == 10 and len({len(p) for p in prompts}) > 5
    eps = episodes(tok, 3, 0)
    assert len(eps) == 3
    for turns in eps:
        assert len(turns) == 4  # call, answer, second call, second answer
        assert all(a == b[: len(a)] for a, b in zip(turns, turns[1:]))  # each resends the last


@pytest.mark.slow  # a served embedded model and its twin, warmed up: ~1 min (make test-slow, CI)
def test_bench_agents_ramps_until_the_slo_breaks(tmp_path: Path) -> None:
    out = qs(
        "bench",
        "agents",
        "--no-llama-cpp",
        "--agents",
        "1,2",
        "--episodes",
        "2",
        "--per-agent",
        "1",
        "--max-tokens",
        "16",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for server in ("quicksilver", "quicksilver-ar"):
        levels = report["servers"][server]["levels"]
        assert levels[0]["agents"] == 1 and levels[0]["failed"] == 0 and levels[0]["turns"] == 4
    assert (tmp_path / "agents.png").is_file()


@pytest.mark.slow
def test_bench_serve_vs_llama_server(tmp_path: Path) -> None:
    from quicksilver.bench.peers import llama_server_binary
    from quicksilver.errors import QuicksilverError

    try:
        llama_server_binary()
    except QuicksilverError:
        pytest.skip("llama.cpp's server is not built (make llama-server)")
    out = qs(
        "bench",
        "serve",
        "--vs-llama-cpp",
        "--concurrency",
        "1,4",
        "--prompts",
        "5",
        "--repeats",
        "1",
        "--max-tokens",
        "32",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for lv in report["levels"]:
        qs_row = lv["quicksilver"]
        assert qs_row["failed"] == 0 and qs_row["identical_to_c1"] == qs_row["compared_to_c1"]
        assert lv["identical_twin_vs_llama"] >= 4  # the same weights, greedy


METHODS = [
    "ar_kv_cache",
    "reference",
    "one_token_per_step",
    "default",
    "verify",
    "verify_ar",
    "verify_k4",
    "verify_k6",
    "llama_cpp_ar",
    "llama_server_ar",
]


def _draw_every_bench_plot(out: Path) -> None:
    """Each bench plot, drawn from a small synthetic result shaped like the bench's own."""
    from quicksilver.bench import common, serve, serve_replicas, serve_vs, shapes, verify

    n = len(METHODS)
    common.bar_plot(
        out / "speed.png",
        METHODS,
        {
            "tok/s (median)": [1738.0 + 97 * i for i in range(n)],
            "tokens per forward": [0.3 + 0.31 * i for i in range(n)],
            "accuracy": [0.33 + 0.04 * i for i in range(n)],
        },
        "single-stream decoding, same model and items",
    )
    run = {"tok_s": 1785.0, "tok_s_aggregate": 1568.0}
    ks = {"verify_ar": run, "verify": run, "verify_k2": run, "verify_k4": run, "verify_k6": run}
    verify.k_plot(out, ks, 8, run)
    c = [1, 2, 4, 8, 16, 32, 64]
    peers = ["quicksilver", "quicksilver-ar", "llama-server"]
    row = {"tok_s_per_request_p50": 1074.0, "aggregate_tok_s": 1219.0, "ttft_p50_ms": 8.6}
    levels = [{"concurrency": x, **{k: row for k in peers}} for x in c]
    serve_vs._plot_levels({"levels": levels, "hardware": {"cpu": "AMD EPYC"}}, peers, out)
    agents = [{"agents": x, "ttft_p95_ms": 10.0 * x, "tok_s_p50": 900.0 / x} for x in c]
    serve_vs._plot_agents(
        {
            "servers": {k: {"levels": agents} for k in peers},
            "slo": {"ttft_p95_ms": 100.0, "tok_s_p50": 200.0},
        },
        out,
    )
    turns = [0.92, 0.22, 0.71, 0.22, 0.46, 0.3, 0.5, 0.2, 0.4, 0.3, 0.5, 0.2]
    lv = [
        {"concurrency": x, "aggregate_tok_s": 150.0 * x, "ttft_p50_ms": 8.0 * x, "e2e_p50_s": 0.1}
        for x in c
    ]
    loop = {"prefix_cache": turns, "no_prefix_cache": turns}
    serve._plot({"levels": lv, "agent_loop": {"seconds_per_turn": loop}}, out)
    serve_replicas._plot(
        {
            "replicas": [1, 2],
            "levels": [{**x, "replicas": r} for r in (1, 2) for x in lv],
            "agent_loop": {"routing": {"prefix": {"seconds_per_turn": turns}}},
        },
        out,
    )
    windows, kk = [1, 4, 8, 16, 32], range(1, 9)
    fmt = {
        "format": "int4",
        "step_ms": {str(w): 100.0 + 10 * w for w in windows},
        "tok_s_at_k": {str(k): 2.0 * k for k in kk},
        "ar_tok_s": 3.0,
        "llama_cpp": {
            "type": "Q4_0",
            "ar_token_ms": 190.0,
            "step_ms": {str(w): 200.0 + 30 * w for w in windows[1:]},
        },
    }
    shapes.plot([{"shape": "sdar-1.7b", "formats": [fmt] * 3}], windows, out / "shapes.png")


def _in_view(axis: Any, at: float) -> bool:
    """Whether a tick at ``at`` is drawn (the axis also keeps labels for ticks past its limits)."""
    lo, hi = sorted(axis.get_view_interval())
    return bool(lo - 1e-9 * abs(hi - lo) <= at <= hi + 1e-9 * abs(hi - lo))


def test_every_bench_plot_has_legible_tick_labels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No two tick labels of a bench figure overlap, and every one lies inside the figure (the
    speed plot's nine rotated method names once ran into each other)."""
    from quicksilver import figures
    from quicksilver.bench import common, serve, serve_replicas, serve_vs, shapes

    checked: list[str] = []

    def check(fig: Any, path: str | Path) -> Path:
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        inside = fig.bbox
        boxes = [
            (t.get_text(), t.get_window_extent(renderer))
            for ax in fig.axes
            for i, axis in enumerate((ax.xaxis, ax.yaxis))
            for t in axis.get_ticklabels(which="both")
            if t.get_visible() and t.get_text() and _in_view(axis, t.get_position()[i])
        ]
        assert boxes, path
        for i, (a, box) in enumerate(boxes):
            assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1, (path, a)
            for b, other in boxes[i + 1 :]:
                assert not box.overlaps(other), f"{Path(path).name}: {a!r} overlaps {b!r}"
        checked.append(Path(path).name)
        return figures.save_figure(fig, path)

    for module in (common, serve, serve_replicas, serve_vs, shapes):
        monkeypatch.setattr(module, "save_figure", check)
    _draw_every_bench_plot(tmp_path)
    # every place a bench writes a figure was drawn once (a new plot joins _draw_every_bench_plot)
    sources = Path(common.__file__).parent.glob("*.py")
    assert sum(p.read_text().count("save_figure(fig,") for p in sources) == len(checked)
    assert sorted(checked) == sorted(
        [
            "speed.png",
            "verify_k.png",
            "serve_vs_llama_cpp.png",
            "agents.png",
            "serve.png",
            "serve_replicas.png",
            "shapes.png",
        ]
    )


def test_live_tools_scoring_needs_one_right_call() -> None:
    from types import SimpleNamespace as NS

    from quicksilver.bench.live_tools import LIVE, calls_of, live_right

    table = LIVE[0]
    good = {"name": "reserve_table", "arguments": {"party_size": 2, "time": "7pm"}}
    assert live_right(table, [good])
    assert not live_right(table, [good, good])  # one call, not two
    assert not live_right(table, [{**good, "name": "get_weather"}])
    assert not live_right(table, [{**good, "arguments": {"party_size": "2", "time": "7"}}])
    assert not live_right(table, [{**good, "arguments": None}])
    msg = NS(tool_calls=[NS(function=NS(name="reserve_table", arguments="{bad"))])
    assert calls_of(msg) == [{"name": "reserve_table", "arguments": None}]
    assert all(c.name in {t["function"]["name"] for t in c.tools} for c in LIVE)


def test_serve_bench_edit_routes_send_the_user_message_alone() -> None:
    from quicksilver.bench.serve import ROUTES, chat_bodies

    for route in ("apply", "edit"):
        bodies = chat_bodies(4, 0, 64, route)
        assert len(bodies) == 4
        for b in bodies:
            assert [m["role"] for m in b["messages"]] == ["user"]
            assert "<|" in b["messages"][0]["content"]  # the route's tagged sections
            assert "model" not in b  # the route picks its edit model
    assert ROUTES["apply"][0] == "/v1/apply/completions"


def test_edit_routes_default_to_their_answer_budget() -> None:
    """bench serve --route apply|edit lets a whole file be written unless --max-tokens says less."""
    from quicksilver.bench.serve import route_max_tokens
    from quicksilver.suite.tasks import get_task

    assert route_max_tokens("chat") == 96
    assert route_max_tokens("apply") == get_task("apply_edit").max_answer_tokens + 8
    assert route_max_tokens("edit") == get_task("next_edit").max_answer_tokens + 8
