"""DiffusionGemma through the one decoder contract (sampling/decoders/noise_decoder.py), the pipeline, the engine
and the command line, on a tiny random checkpoint in save_pretrained's layout
(tests/diffusion_gemma_fixture.py). Random weights write gibberish: these test the contract —
determinism, batch invariance, the row equal to the generation loop, streaming, constraints that
always validate, one-line errors — not content."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

import quicksilver
from diffusion_gemma_fixture import CANVAS, STEPS, write_tiny_diffusion_gemma
from quicksilver.engine import Engine, EngineRequest
from quicksilver.errors import CheckpointError, ConfigError
from quicksilver.models.checkpoint import load_checkpoint
from quicksilver.pipeline import Pipeline
from quicksilver.sampling.core.state import DecodeResult
from quicksilver.sampling.decoders.noise_canvas import generate
from quicksilver.sampling.decoders.noise_decoder import NoiseCanvasDecoder, NoiseRow
from quicksilver.sampling.structured.canvas import AllowTokens, build_canvas
from quicksilver.sampling.structured.constrained import Budgets, schema_pieces

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dg") / "tiny-diffusion-gemma")


@pytest.fixture(scope="module")
def pipe(ckpt: Path) -> Pipeline:
    return quicksilver.load(ckpt, device="cpu")


@pytest.fixture(scope="module")
def prompt(pipe: Pipeline) -> list[int]:
    return pipe.encode_prompt("What is 7 * 6?", chat=True)


def drive(decoder: NoiseCanvasDecoder, rows: Sequence[NoiseRow]) -> list[DecodeResult]:
    gen = decoder.drive(rows)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def test_loads_as_its_own_family(pipe: Pipeline, ckpt: Path) -> None:
    assert isinstance(pipe.decoder, NoiseCanvasDecoder)
    assert pipe.decoder.base.max_denoising_steps == STEPS  # generation_config.json
    assert pipe.generation_defaults == {"temperature": 1.0, "max_new_tokens": 256}
    assert pipe.stop_ids == [1, 4] and pipe.mask_id == -1 and pipe.attention == "block_causal"
    assert pipe.tokenizer.chat_template is not None  # chat_template.jinja
    with pytest.raises(ConfigError, match="network of its own"):
        pipe.model  # noqa: B018  (benchmarks, export and tensor parallelism need the transformer)
    with pytest.raises(CheckpointError, match="network of its own"):
        load_checkpoint(ckpt)


def test_seeded_deterministic_and_batch_invariant(pipe: Pipeline) -> None:
    prompts = ["What is 7 * 6?", "Name a city."]
    alone = [pipe.generate(p, chat=True, max_new_tokens=24, seed=3) for p in prompts]
    assert pipe.generate(prompts[0], chat=True, max_new_tokens=24, seed=3).tokens == alone[0].tokens
    batch = pipe.generate_batch(prompts, chat=True, max_new_tokens=24, seed=3)
    assert [r.tokens for r in batch] == [r.tokens for r in alone]
    for r in alone:
        assert 0 < len(r.tokens) <= 24 and r.finish_reason in ("stop", "length")
        assert r.nfe <= 2 * STEPS and r.steps == r.nfe  # two canvases of CANVAS cover 24
    other = pipe.generate(prompts[0], chat=True, max_new_tokens=24, seed=4)
    assert other.tokens != alone[0].tokens
    greedy = [pipe.generate(prompts[0], chat=True, max_new_tokens=24, temperature=0) for _ in "ab"]
    assert greedy[0].tokens == greedy[1].tokens  # temperature 0 without a seed: seed 0


def test_a_row_is_the_generation_loop_on_a_batch_of_one(pipe: Pipeline, prompt: list[int]) -> None:
    """The same draws from the same seed: token for token and pass for pass with
    ``noise_canvas.generate`` (whose parity with transformers is tested in the 5.x venv)."""
    decoder = pipe.decoder
    assert isinstance(decoder, NoiseCanvasDecoder)
    cfg = pipe.sampler_config(max_new_tokens=2 * CANVAS, seed=5, stop_at_eos=False)
    (res,) = decoder.generate([prompt], cfg)
    base = replace(decoder.base, max_new_tokens=2 * CANVAS, eos_token_ids=(), pad_token_id=None)
    ids = torch.tensor([prompt])
    ref = generate(decoder.model, ids, base, torch.Generator().manual_seed(5))
    assert res.tokens == ref.new_tokens[0].tolist()
    assert res.nfe == int(ref.decoder_passes[0]) and res.finish_reason == "length"


def test_the_engine_streams_what_the_pipeline_returns(pipe: Pipeline, prompt: list[int]) -> None:
    engine: Engine[Any] = Engine(pipe.decoder)
    for seed in (1, 2):
        cfg = pipe.sampler_config(max_new_tokens=40, seed=seed, record_canvas=True)
        engine.add(EngineRequest(f"r{seed}", prompt, cfg))
    streamed: dict[str, list[int]] = {"r1": [], "r2": []}
    finals: dict[str, list[int]] = {}
    views = 0
    for ev in engine.run_until_idle():
        streamed[ev.request_id] += ev.new_tokens
        views += bool(ev.canvas)
        assert ev.canvas is None or len(ev.canvas) <= 40
        if ev.done:
            assert ev.result is not None
            finals[ev.request_id] = ev.result.tokens
    assert streamed == finals and views > 0
    for seed in (1, 2):
        (alone,) = pipe.decoder.generate(
            [prompt], pipe.sampler_config(max_new_tokens=40, seed=seed)
        )
        assert finals[f"r{seed}"] == alone.tokens  # batched with a neighbour, same tokens


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 1), (1.0, 2), (1.5, 3)])
def test_a_schema_canvas_always_validates(
    pipe: Pipeline, prompt: list[int], temperature: float, seed: int | None
) -> None:
    """Skeleton fixed, slots drawn from the constrained distribution and committed through the
    constraint, across canvas boundaries (the layout is longer than a canvas)."""
    tok, decoder = pipe.tokenizer, pipe.decoder
    assert isinstance(decoder, NoiseCanvasDecoder) and tok.pad_id is not None
    pieces = schema_pieces(SCHEMA, True, tok.encode, Budgets(string=6, integer=4))
    canvas = build_canvas(pieces, tok, tok.pad_id)
    assert canvas.length > CANVAS
    cfg = pipe.sampler_config(max_new_tokens=canvas.length, temperature=temperature, seed=seed)
    row = decoder.new_row(prompt, cfg, prefill=canvas.prefill, constraint=canvas.constraint)
    (res,) = drive(decoder, [row])
    assert all(res.tokens[p] == t for p, t in canvas.prefill.items())
    jsonschema.validate(json.loads(tok.decode(res.tokens)), SCHEMA)
    assert res.finish_reason == "length" and len(res.tokens) == canvas.length


def test_a_one_position_choice(pipe: Pipeline, prompt: list[int]) -> None:
    """The server's "does another call follow?" canvas: one position that may hold only
    ``<tool_call>`` (7) or a stop token."""
    decoder = pipe.decoder
    assert isinstance(decoder, NoiseCanvasDecoder)
    for seed in range(4):
        cfg = pipe.sampler_config(max_new_tokens=1, seed=seed)
        row = decoder.new_row(prompt, cfg, constraint=AllowTokens([7, *pipe.stop_ids]))
        (res,) = drive(decoder, [row])
        assert (res.tokens, res.finish_reason) in (([7], "length"), ([], "stop"))


def test_refused_requests(pipe: Pipeline, prompt: list[int]) -> None:
    decoder = pipe.decoder
    with pytest.raises(ConfigError, match="policy verify"):
        decoder.new_row(prompt, pipe.sampler_config(policy="verify"))
    with pytest.raises(ConfigError, match="infilling"):
        decoder.new_row(prompt, pipe.sampler_config(), suffix=[5, 6])


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    from quicksilver.cli import main

    def run(*args: str) -> tuple[int | str | None, str, str]:
        try:
            code: int | str | None = main(list(args))
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err

    yield run


def test_the_command_line(ckpt: Path, cli: Any) -> None:
    code, out, _ = cli("generate", "hi", "--model", str(ckpt), "--json", "--max-tokens", "16")
    res = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and len(res["tokens"]) <= 16 and res["runtime"] == "torch"
    code, out, _ = cli("info", str(ckpt), "--json")
    info = json.loads(out)
    assert code == 0 and info["architecture"] == "DiffusionGemmaForBlockDiffusion"
    assert info["block_size"] == CANVAS and info["mask_token_id"] is None


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--backend", "onnx"], "generic transformer only"),
        (["--cache", "prefix"], "generic transformer only"),
        (["--decoding-mode", "speed"], "decoding mode 'speed'"),
        (["--policy", "verify"], "policy verify"),
    ],
)
def test_what_does_not_apply_is_one_line(ckpt: Path, cli: Any, args: list[str], msg: str) -> None:
    code, _, err = cli("generate", "hi", "--model", str(ckpt), "--max-tokens", "8", *args)
    assert code == 2 and msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_chat_checkpoint_without_a_template_is_refused(tmp_path: Path) -> None:
    d = write_tiny_diffusion_gemma(tmp_path / "no-template", template=False)
    with pytest.raises(CheckpointError, match="no chat template"):
        quicksilver.load(d, device="cpu")
