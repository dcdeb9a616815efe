"""Distillation data: only verified teacher replies are kept (or all, each marked), the file resumes
exactly, and the trainer mixes it in without changing runs that do not use it; unverified replies
train the drafts only."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quicksilver.assets import embedded_ar_model_path
from quicksilver.errors import ConfigError
from quicksilver.suite.render import prompt_text
from quicksilver.suite.tasks import get_task, split_reply
from quicksilver.tokenizer import Tokenizer
from quicksilver.train.data import Example, Mixture
from quicksilver.train.distill import distill, item_stream, load_distilled

MIX = "sudoku4:1,multiply:1"


@pytest.fixture(scope="module")
def teacher() -> Path:
    path = embedded_ar_model_path()
    assert path is not None
    return path


@pytest.fixture(scope="module")
def full(teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("distill") / "ar.jsonl"
    return out, distill(teacher, out, 64, MIX, seed=5, instant_frac=0.5)


def test_only_verified_replies_are_kept(teacher: Path, full: tuple[Path, dict]) -> None:
    out, rep = full
    tok = Tokenizer.from_dir(teacher)
    items = {}
    stream = item_stream({"sudoku4": 1.0, "multiply": 1.0}, 5, 0.5)
    for _ in range(64):
        it, instant = next(stream)
        items[prompt_text(it, tok, instant)] = it
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sum(rep["tried"].values()) == 64 and len(lines) == sum(rep["kept"].values())
    assert 0 < len(lines) < 64 or all(v == 1.0 for v in rep["kept_frac"].values())
    for r in lines:  # re-verified independently of the writer
        item = items[r["prompt"]]
        assert get_task(item.task).verify(item, split_reply(r["reply"])[1])
    assert {r["instant"] for r in lines} == {True, False}


def test_rerun_resumes_exactly(teacher: Path, full: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = full
    lines = out.read_text().splitlines()
    part = tmp_path / "part.jsonl"
    part.write_text("".join(x + "\n" for x in lines if json.loads(x)["chunk"] == 0))
    rep = distill(teacher, part, 64, MIX, seed=5, instant_frac=0.5)
    assert rep["resumed_chunks"] == 1
    assert part.read_text().splitlines() == lines


def test_mixture_draws_distilled_examples(teacher: Path, full: tuple[Path, dict]) -> None:
    tok = Tokenizer.from_dir(teacher)
    ex = load_distilled(full[0], tok)
    assert all(e.answer[-1] == tok.token_to_id("<|im_end|>") for e in ex)
    weights = {"sudoku4": 1.0}
    only = Mixture(weights, tok, distilled=ex, distill_frac=1.0)
    assert all(only.sample(random.Random(i)) in ex for i in range(20))
    # without distillation data the stream is what it always was (resumed runs stay exact)
    a, b = Mixture(weights, tok), Mixture(weights, tok, distilled=[], distill_frac=0.9)
    ra, rb = random.Random(1), random.Random(1)
    assert [a.sample(ra) for _ in range(10)] == [b.sample(rb) for _ in range(10)]
    assert isinstance(ex[0], Example)


def test_bad_distillation_files_are_clear_errors(tmp_path: Path, teacher: Path) -> None:
    tok = Tokenizer.from_dir(teacher)
    with pytest.raises(ConfigError, match="not found"):
        load_distilled(tmp_path / "none.jsonl", tok)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no usable"):
        load_distilled(tmp_path / "empty.jsonl", tok)
    with pytest.raises(ConfigError, match="positive"):
        distill(teacher, tmp_path / "x.jsonl", 0, MIX)


def test_trainer_trains_on_distillation_data(full: tuple[Path, dict], tmp_path: Path) -> None:
    import torch

    from quicksilver.train.recipes import get_recipe
    from quicksilver.train.trainer import Trainer

    torch.set_num_threads(1)
    cfg = get_recipe("tiny", out=str(tmp_path / "t"), steps=2, distill_data=str(full[0]))
    trainer = Trainer(cfg)
    assert trainer.mix.distilled and trainer.mix.distill_frac == 0.5
    trainer.run()
    assert (tmp_path / "t" / "final" / "model.safetensors").is_file()


def test_keep_all_marks_every_reply(teacher: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.jsonl"
    rep = distill(teacher, out, 32, MIX, seed=6, instant_frac=0.5, keep="all")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == sum(rep["tried"].values()) == 32
    tok = Tokenizer.from_dir(teacher)
    stream = item_stream({"sudoku4": 1.0, "multiply": 1.0}, 6, 0.5)
    items = {}
    for _ in range(32):
        it, instant = next(stream)
        items[prompt_text(it, tok, instant)] = it
    for r in lines:  # each mark re-verified independently of the writer
        item = items[r["prompt"]]
        assert r["correct"] == get_task(item.task).verify(item, split_reply(r["reply"])[1])
    # verified replies take the next-token loss unless the recipe says drafts only; the rest never
    ex = load_distilled(out, tok)
    assert [e.ar for e in ex] == [r["correct"] for r in lines]
    assert not any(e.ar for e in load_distilled(out, tok, ar=False))
    with pytest.raises(ConfigError, match="--keep"):
        distill(teacher, tmp_path / "x.jsonl", 4, MIX, keep="some")


def test_draft_only_rows_take_no_next_token_loss() -> None:
    import torch

    from quicksilver.train.data import collate
    from quicksilver.train.objective import next_token_ce

    g = torch.Generator().manual_seed(0)
    a = Example([5, 6, 7], [8, 9, 1], "x")
    b = Example([5, 6, 7], [10, 11, 1], "x", ar=False)
    logits = torch.randn(2, 5, 16, generator=g)  # (B, L-1, V)
    both, n = next_token_ce(logits, collate([a, b], 4, 0, 1, pad_answers=False))
    alone, n_alone = next_token_ce(logits[:1], collate([a], 4, 0, 1, pad_answers=False))
    assert n == n_alone == 3
    assert torch.allclose(both, alone)
    b.ar = True  # the same row with its loss: now it counts
    assert not torch.allclose(next_token_ce(logits, collate([a, b], 4, 0, 1, False))[0], alone)
