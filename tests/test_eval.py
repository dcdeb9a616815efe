"""Evaluation: the --json shape for a diffusion and an AR model, summaries, the sweep grid and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quicksilver.cli import main
from quicksilver.models.init import init_model
from quicksilver.suite.evaluate import ItemResult, summarize
from quicksilver.suite.tasks import get_task
from quicksilver.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("eval_models")
    tok = Tokenizer.byte_level(individual_digits=True)
    return {
        att: init_model(d / att, "tiny", tokenizer=tok, attention=att, max_seq_len=1536)
        for att in ("block_causal", "causal")
    }


@pytest.mark.parametrize("attention", ["block_causal", "causal"])
def test_eval_json_shape(
    models: dict[str, Path], attention: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "eval",
                "--model",
                str(models[attention]),
                "--tasks",
                "sudoku4,tool_call",
                "--limit",
                "4",
                "--json",
                "--stream-items",
                "1",
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(rep) >= {"tasks", "settings", "mean_accuracy"}
    for name in ("sudoku4", "tool_call"):
        r = rep["tasks"][name]
        assert {"accuracy", "tpf", "nfe", "strata", "n", "tok_s"} <= set(r)
        assert r["n"] == 4 and 0 <= r["accuracy"] <= 1 and r["nfe"] >= 1
        assert set(r["strata"]) <= set(get_task(name).strata)
    assert "parseable" in rep["tasks"]["tool_call"] or all(
        s != "call" for s in rep["tasks"]["tool_call"]["strata"]
    )
    assert rep["settings"]["attention"] == attention
    if attention == "causal":
        assert rep["settings"]["decoding"]["draft"] == 0  # a model that never drafted: AR
        assert rep["tasks"]["sudoku4"]["tpf"] <= 1.0
    else:
        assert rep["settings"]["decoding"]["policy"] == "threshold"


def test_summarize_counts_strata_and_tpf() -> None:
    task = get_task("sudoku4")
    items = task.test_items(4)
    res = [
        ItemResult(it, it.answer if i % 2 == 0 else "bad", i % 2 == 0, 10, 5, 0.1)
        for i, it in enumerate(items)
    ]
    s = summarize("sudoku4", res)
    assert s["accuracy"] == 0.5 and s["tpf"] == 2.0 and s["nfe"] == 5.0
    assert sum(v["n"] for v in s["strata"].values()) == 4


def test_eval_rejects_bad_input(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--model", str(models["block_causal"]), "--tasks", "nope", "--limit", "2"])
    assert "unknown task" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(
            ["eval", "--model", str(models["causal"]), "--tasks", "fim", "--limit", "2", "--sweep"]
        )


def test_plots(tmp_path: Path) -> None:
    from quicksilver.eval.plots import plot_accuracy_vs_tpf, plot_learning_curves

    rows = [
        {"group": "threshold", "short": "t=0.9", "tpf": 3.0, "accuracy": 0.8},
        {"group": "threshold", "short": "t=0.5", "tpf": 5.0, "accuracy": 0.6},
    ]
    assert plot_accuracy_vs_tpf(rows, tmp_path / "a.png").stat().st_size > 1000
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "tokens": 10, "loss": 1.0})
        + "\n"
        + json.dumps({"step": 2, "tokens": 2e6, "eval": {"sudoku4": 0.5, "fim": 0.1}})
        + "\n"
    )
    assert plot_learning_curves({"d": run}, tmp_path / "c.png").stat().st_size > 1000


def test_curves_count_the_steps_of_every_earlier_stage(tmp_path: Path) -> None:
    from quicksilver.eval.plots import read_curve

    def stage(name: str, steps: int, init: Path | None) -> Path:
        d = tmp_path / name
        (d / "final").mkdir(parents=True)
        (d / "step_1").mkdir()
        cfg = json.dumps({"init_from": str(init) if init else ""})
        for sub in ("final", "step_1"):
            (d / sub / "train_config.json").write_text(cfg)
        (d / "final" / "train_state.json").write_text(json.dumps({"step": steps}))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval": {"fim": 0.5}}) + "\n")
        return d

    one = stage("one", 600, None)
    two = stage("two", 5000, one / "final")
    three = stage("three", 1000, two / "final")
    assert [r["step"] for r in read_curve(three)] == [5601]
    assert [r["step"] for r in read_curve(one)] == [1]


def test_eval_held_out_phrasing(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", "--model", str(models["block_causal"]), "--tasks", "multiply", "--limit", "2"]
    assert main([*args, "--json", "--stream-items", "0", "--phrasing", "held-out"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["settings"]["phrasing"] == "held-out" and rep["tasks"]["multiply"]["n"] == 2
    with pytest.raises(SystemExit) as exc:  # argparse's one-line usage error, not a traceback
        main([*args, "--phrasing", "typos"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_eval_compare_reports_both_on_the_same_items(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", "--model", str(models["block_causal"]), "--compare", str(models["causal"])]
    assert main([*args, "--tasks", "sudoku4", "--limit", "3", "--stream-items", "0"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rep = json.loads(out[-1])
    other = rep["compare"]
    assert other["settings"]["model"] == str(models["causal"])
    assert other["tasks"]["sudoku4"]["n"] == rep["tasks"]["sudoku4"]["n"] == 3
    assert other["settings"]["decoding"]["draft"] == 0  # a causal model that never drafted: AR
    assert any(line.startswith("mean") and line.count(".") == 2 for line in out)


def test_eval_runs_single_rows_on_the_chosen_backend(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from quicksilver.assets import embedded_model_path
    from quicksilver.runtime.cpu_backends import ExportedStep

    passes = []
    step = ExportedStep.forward_segment
    monkeypatch.setattr(
        ExportedStep, "forward_segment", lambda self, seg: passes.append(1) or step(self, seg)
    )

    args = ["eval", "--model", str(embedded_model_path()), "--tasks", "chat", "--limit", "3"]
    args += ["--batch-size", "1", "--stream-items", "0", "--json"]
    reps = {}
    for backend in ("torch", "onnx"):
        assert main([*args, "--backend", backend]) == 0
        reps[backend] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reps["onnx"]["settings"]["backend"] == "onnx" and passes  # the rows ran on ONNX Runtime
    assert reps["onnx"]["tasks"]["chat"]["accuracy"] == reps["torch"]["tasks"]["chat"]["accuracy"]
