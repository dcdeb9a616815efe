"""The command line: generate/info/init-model/bench work, and bad input is one line + exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def qs(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quicksilver.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def test_generate_json_on_an_init_model_checkpoint(tiny_ckpt: Path) -> None:
    r = qs(
        "generate",
        "What is 2+2?",
        "--model",
        str(tiny_ckpt),
        "--json",
        "--max-tokens",
        "16",
        "--policy",
        "low_confidence",
        "--steps",
        "8",
        "--seed",
        "1",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"text", "tokens", "nfe", "steps", "tpf", "seconds"} <= set(out)
    assert out["nfe"] <= 8 and len(out["tokens"]) <= 16
    assert out["tpf"] == pytest.approx(len(out["tokens"]) / out["nfe"])


def test_generate_show_and_raw(tiny_ckpt: Path) -> None:
    r = qs("generate", "abc", "--model", str(tiny_ckpt), "--show", "--raw", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "forward passes" in r.stdout and "step" in r.stdout


def test_info_and_init_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    r = qs(
        "init-model",
        str(out),
        "--preset",
        "tiny",
        "--attention",
        "block_causal",
        "--block-size",
        "16",
    )
    assert r.returncode == 0, r.stderr
    from quicksilver.cli import main  # the rest in this process: the same commands, no start-up

    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (
        info["attention"] == "block_causal" and info["block_size"] == 16 and info["parameters"] > 0
    )
    with pytest.raises(SystemExit) as e:
        main(["init-model", str(out)])
    assert e.value.code == 2 and "not empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--model", "/nonexistent/ckpt"], "no such checkpoint"),
        (["--policy", "bogus"], "unknown policy"),
        (["--threshold", "0"], "threshold must be in (0, 1]"),
        (["--threshold", "1.01"], "threshold must be in (0, 1]"),
        (["--max-tokens", "0"], "max_new_tokens must be a positive integer"),
        (["--max-tokens", "100000"], "exceeds the context"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tiny_ckpt: Path, args: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (the command's own error path; a real process's below): exit 2, one line."""
    from quicksilver.cli import main

    model = [] if "--model" in args else ["--model", str(tiny_ckpt)]
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", *model, *args])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_input_in_a_real_process_is_one_line_and_exit_2(tiny_ckpt: Path) -> None:
    r = qs("generate", "hi", "--model", str(tiny_ckpt), "--policy", "bogus")
    assert r.returncode == 2
    assert "unknown policy" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_prompt_longer_than_context(tiny_ckpt: Path) -> None:
    r = qs("generate", "x " * 2000, "--model", str(tiny_ckpt), "--raw")
    assert (
        r.returncode == 2 and "does not fit the context" in r.stderr and "Traceback" not in r.stderr
    )


def test_malformed_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{oops")
    r = qs("info", str(tmp_path))
    assert r.returncode == 2 and "invalid JSON" in r.stderr and "Traceback" not in r.stderr


def test_bench_decode_ends_with_json(tiny_ckpt: Path, tmp_path: Path) -> None:
    r = qs(
        "bench",
        "decode",
        "--model",
        str(tiny_ckpt),
        "--prompts",
        "2",
        "--repeats",
        "1",
        "--max-tokens",
        "16",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(last["methods"]) == {"one_token_per_step", "threshold", "reference"}
    for m in last["methods"].values():
        assert m["nfe"] > 0 and m["tok_s"] > 0
    assert (tmp_path / "decode.png").stat().st_size > 1000


@pytest.mark.slow  # bench decode runs in test_bench_decode_ends_with_json; this re-proves its default model: ~7 s (make test-slow, CI)
def test_bench_decode_defaults_to_the_embedded_diffusion_model(tmp_path: Path) -> None:
    """The default model decodes by verify, not by the policies this bench compares."""
    r = qs(*"bench decode --prompts 1 --repeats 1 --max-tokens 16 --out".split(), str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["methods"]["threshold"]["nfe"] > 0


def test_folded_flags_leave_help_but_still_parse() -> None:
    """Options of no use on any served target (and explicit choices behind `auto`) are out of
    `serve --help` and the benches' help; documented, they still parse and reach the config."""
    import dataclasses

    from quicksilver.cli import build_parser
    from quicksilver.cli_util import dataclass_from_args
    from quicksilver.server.config import LOAD_HIDDEN, SERVER_HIDDEN, ServerConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    serve_help = sub["serve"].format_help()
    for name in SERVER_HIDDEN | {"mock_step_delay"}:
        assert f"--{name.replace('_', '-')} " not in serve_help, name
    for flag in ("--backend", "--dtype", "--max-batch", "--prefix-cache-mb", "--engine"):
        assert flag in serve_help
    args = parser.parse_args(
        ["serve", "--compile", "--refresh-every", "2", "--cache", "none", "--routing", "random",
         "--attention-layout", "per_sequence", "--cuda-graphs", "--backend", "torch",
         "--mock-step-delay", "0.1"]
    )  # fmt: skip
    cfg = dataclass_from_args(ServerConfig, args)
    assert (cfg.compile, cfg.refresh_every, cfg.cache, cfg.routing) == (True, 2, "none", "random")
    assert (cfg.attention_layout, cfg.cuda_graphs, cfg.backend) == ("per_sequence", True, "torch")
    assert args.mock_step_delay == 0.1 and ServerConfig().backend == "auto"
    assert {f.name for f in dataclasses.fields(ServerConfig)} >= SERVER_HIDDEN
    bench = sub["bench"]._actions[-1].choices["speed"]
    assert "--compile" not in bench.format_help() and "--backend" in bench.format_help()
    assert parser.parse_args(["bench", "speed", "--compile"]).compile is True
    families = sub["bench"]._actions[-1].choices["families"].format_help()
    assert "--cuda-graphs" in families  # the bench's own flag, not the load option
    assert LOAD_HIDDEN <= SERVER_HIDDEN
