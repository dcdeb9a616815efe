"""Training: the loss on hand-computed examples, the two-copy layout matching inference conditions,
resume equivalence, the CLI mapping, and (slow) a 2-process torchrun/gloo run."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quicksilver.models.config import ModelConfig
from quicksilver.models.transformer import Transformer
from quicksilver.suite.render import render
from quicksilver.suite.tasks import get_task
from quicksilver.tokenizer import Tokenizer
from quicksilver.train.data import Mixture, collate
from quicksilver.train.objective import (
    NoiseConfig,
    ar_draft_loss,
    ar_loss,
    corrupt,
    diffusion_loss,
    two_copy_mask,
    weighted_ce,
)
from quicksilver.train.recipes import get_recipe
from quicksilver.train.trainer import Trainer, lr_at


def test_weighted_ce_hand_computed() -> None:
    # V=2. Row: pos0 logits (0,0) target 0 -> CE ln 2, masked at t=0.5; pos1 logits (ln 3, 0) target 0
    # -> CE ln(4/3), masked at t=0.25; pos2 visible. Loss = (ln2/0.5 + ln(4/3)/0.25) / 3 answer tokens.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 0.0]]])
    x0 = torch.tensor([[0, 0, 0]])
    masked = torch.tensor([[True, True, False]])
    t = torch.tensor([[0.5, 0.25, 1.0]])
    cfg = NoiseConfig(mask_id=1, block_size=4)
    loss = weighted_ce(
        logits, x0, masked, torch.zeros_like(masked), ~masked, t, torch.tensor([3]), cfg
    )
    assert loss.item() == pytest.approx(0.845674, abs=1e-5)
    # with substitution noise: a substituted position counts with sub_weight, untouched visible ones with keep_weight
    cfg2 = NoiseConfig(mask_id=1, block_size=4, sub_prob=0.1, sub_weight=1.0, keep_weight=0.5)
    subst = torch.tensor([[False, False, True]])
    loss2 = weighted_ce(logits, x0, masked, subst, ~masked, t, torch.tensor([3]), cfg2)
    ce2 = math.log(1 + math.exp(-5.0))
    assert loss2.item() == pytest.approx(0.845674 + ce2 / 3, abs=1e-5)


def test_certainty_forcing_adds_entropy_of_right_masked_guesses() -> None:
    # pos0: p = (1/3, 2/3), target 0 -> wrong, no entropy term; pos1: p = (3/4, 1/4), target 0 ->
    # right, entropy 0.562335; pos2 visible. Term = weight * 0.562335 / 3 answer tokens.
    logits = torch.tensor([[[0.0, math.log(2.0)], [math.log(3.0), 0.0], [5.0, 0.0]]])
    x0, masked = torch.tensor([[0, 0, 0]]), torch.tensor([[True, True, False]])
    t, denom = torch.tensor([[0.5, 0.25, 1.0]]), torch.tensor([3])
    args = (logits, x0, masked, torch.zeros_like(masked), ~masked, t, denom)
    plain = weighted_ce(*args, NoiseConfig(mask_id=1, block_size=4))
    forced = weighted_ce(*args, NoiseConfig(mask_id=1, block_size=4, certainty_weight=2.0))
    assert (forced - plain).item() == pytest.approx(2.0 * 0.562335 / 3, abs=1e-5)


class Uniform(torch.nn.Module):
    """A stand-in network with constant logits: every cross-entropy is ln V."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, ids: torch.Tensor, **kw) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return self.bias.expand(*ids.shape, self.vocab)


def _batch(block: int = 8, pad: bool = True, n: int = 3):
    tok = Tokenizer.byte_level(individual_digits=True)
    mix = Mixture({"multiply": 1, "path_star": 1}, tok)
    rng = random.Random(0)
    return tok, collate([mix.sample(rng) for _ in range(n)], block, 0, 1, pad)


def test_ar_loss_uniform_is_ln_v() -> None:
    _, b = _batch(pad=False)
    out = ar_loss(Uniform(300), b, NoiseConfig(2, 8), None)  # type: ignore[arg-type]
    assert out.loss.item() == pytest.approx(math.log(300), rel=1e-6)
    assert out.n_masked == int(b.answer.sum()) - 0  # every answer token (stop included) is a target


class Lookup(torch.nn.Module):
    """A stand-in network whose logits at a position are a learned row of its token: every row
    starts as the same vector ``v``."""

    def __init__(self, v: torch.Tensor) -> None:
        super().__init__()
        self.rows = torch.nn.Parameter(v.repeat(len(v), 1))  # (V, V)

    def forward(self, ids: torch.Tensor, **kw) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return self.rows[ids]  # (B, T, V)


@pytest.mark.parametrize("teacher", ["data", "self"])
def test_draft_teacher_self_trains_blocks_on_the_streams_own_detached_logits(teacher: str) -> None:
    """With every row equal to v, the stream's distribution is softmax(v) everywhere: the "self"
    draft loss is its entropy exactly (the data's tokens play no part), and its gradient reaches
    only the mask token's row (the teacher is detached); the "data" loss is the data's CE."""
    _, b = _batch(pad=False)
    v = torch.randn(300, generator=torch.Generator().manual_seed(0))
    net = Lookup(v)
    cfg = NoiseConfig(2, 8, draft_len=4, draft_blocks=2, draft_teacher=teacher)
    out = ar_draft_loss(net, b, cfg, torch.Generator().manual_seed(1))  # type: ignore[arg-type]
    p = v.softmax(-1)
    entropy = -(p * p.log()).sum().item()
    draft = out.parts["draft"]
    assert (abs(draft.item() - entropy) < 1e-4) == (teacher == "self"), (draft.item(), entropy)
    draft.backward()
    touched = net.rows.grad.abs().sum(-1).nonzero().flatten().tolist()  # type: ignore[union-attr]
    assert touched == [2]  # the mask id: the blocks' only input
    assert out.parts["ar"].item() > 0


@pytest.mark.parametrize("spread,sizes", [(None, set(range(4, 13))), (1, {7, 8, 9}), (0, {8})])
def test_draft_blocks_are_sized_around_the_decode_k(spread: int | None, sizes: set[int]) -> None:
    """Block sizes are drawn from draft_len ± draft_spread (default ± draft_len // 2), one per
    batch: the forward positions are the stream's plus blocks x k."""
    _, b = _batch(pad=False)
    net = Lookup(torch.zeros(300))
    cfg = NoiseConfig(2, 8, draft_len=8, draft_blocks=3, draft_spread=spread)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(60):
        out = ar_draft_loss(net, b, cfg, gen)  # type: ignore[arg-type]
        seen.add((out.forward_tokens - int(b.valid.sum())) // (3 * b.ids.shape[0]))
    assert seen == sizes


def test_diffusion_loss_uniform_matches_formula() -> None:
    # with constant logits the loss is ln V * mean_i(sum_masked 1/t / answer_len_i); recompute it from
    # the same noise draws
    _, b = _batch()
    cfg = NoiseConfig(2, 8)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out = diffusion_loss(Uniform(300), b, cfg, g1)  # type: ignore[arg-type]
    start = torch.div(b.prompt_len, 8, rounding_mode="floor") * 8
    nv = b.valid.sum(1)
    N = int((nv - start).max())
    j = torch.arange(N)[None]
    npos = (start[:, None] + j).clamp_max(b.ids.shape[1] - 1)
    nans = b.answer.gather(1, npos) & (j < (nv - start)[:, None])
    _, masked, _, t = corrupt(
        b.ids.gather(1, npos), nans, npos // 8 - (start // 8)[:, None], cfg, g2, b.ids[b.answer]
    )
    expect = math.log(300) * ((masked.float() / t).sum(1) / b.answer.sum(1)).mean().item()
    assert out.loss.item() == pytest.approx(expect, rel=1e-5)
    assert out.n_masked == int(masked.sum()) > 0


def test_mdm_loss_masks_the_answer_with_one_rate_per_sequence() -> None:
    from quicksilver.train.objective import mdm_loss

    _, b = _batch()
    cfg = NoiseConfig(2, 8)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    out = mdm_loss(Uniform(300), b, cfg, g1)  # type: ignore[arg-type]
    _, masked, _, t = corrupt(b.ids, b.answer, torch.zeros_like(b.ids), cfg, g2, b.ids[b.answer])
    assert not (masked & ~b.answer).any()  # the prompt is never masked
    assert all(
        len(set(t[i][b.answer[i]].tolist())) == 1 for i in range(t.shape[0])
    )  # one t per row
    expect = math.log(300) * ((masked.float() / t).sum(1) / b.answer.sum(1)).mean().item()
    assert out.loss.item() == pytest.approx(expect, rel=1e-5)


def test_two_copy_layout_equals_inference_conditions() -> None:
    """Each noisy block's logits equal a plain block-causal pass with clean earlier blocks and no later ones."""
    tok, b = _batch()
    bs = 8
    cfg = ModelConfig(
        vocab_size=320,
        d_model=32,
        n_layers=2,
        n_heads=2,
        n_kv_heads=2,
        mlp_hidden=64,
        max_seq_len=512,
        attention="block_causal",
        block_size=bs,
        mask_token_id=2,
    )
    torch.manual_seed(0)
    m = Transformer(cfg).eval()
    ids, valid = b.ids, b.valid
    B, L = ids.shape
    start = b.prompt_len // bs * bs
    nv = valid.sum(1)
    N = int((nv - start).max())
    j = torch.arange(N)[None]
    npos = (start[:, None] + j).clamp_max(L - 1)
    nvalid = j < (nv - start)[:, None]
    x0 = ids.gather(1, npos)
    g = torch.Generator().manual_seed(0)
    xt, *_ = corrupt(
        x0,
        b.answer.gather(1, npos) & nvalid,
        npos // bs - (start // bs)[:, None],
        NoiseConfig(2, bs, sub_prob=0.2),
        g,
        ids[b.answer],
    )
    seq = torch.cat((ids, xt), 1)
    pos = torch.cat((torch.arange(L)[None].expand(B, L), npos), 1)
    noisy = torch.cat((torch.zeros(B, L, dtype=torch.bool), torch.ones(B, N, dtype=torch.bool)), 1)
    with torch.no_grad():
        lg = m(
            seq,
            positions=pos,
            attn_mask=two_copy_mask(pos, noisy, torch.cat((valid, nvalid), 1), bs),
        )[:, L:]
        for i in range(B):
            for blk in range(int(start[i]) // bs, int(nv[i]) // bs):
                lo, hi = blk * bs, (blk + 1) * bs
                x = ids[i, :hi].clone()
                x[lo:hi] = xt[i, lo - start[i] : hi - start[i]]
                ref = m(x[None])[0, lo:hi]
                torch.testing.assert_close(
                    ref, lg[i, lo - start[i] : hi - start[i]], atol=1e-5, rtol=1e-5
                )


def test_shifted_two_copy_layout_equals_inference_conditions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the one-position shift (an AR-initialised model), each noisy position's logits come from
    its predecessor as inference sees it: the noisy block itself, or the clean block before it."""
    import quicksilver.train.objective as obj

    _, b = _batch()
    bs = 8
    cfg = ModelConfig(
        vocab_size=320,
        d_model=32,
        n_layers=2,
        n_heads=2,
        n_kv_heads=2,
        mlp_hidden=64,
        max_seq_len=512,
        attention="block_causal",
        block_size=bs,
        mask_token_id=2,
        logit_shift=True,
    )
    torch.manual_seed(0)
    m = Transformer(cfg).eval()
    seen = {}
    real = obj.weighted_ce

    def spy(logits, x0, *a):  # type: ignore[no-untyped-def]
        seen["logits"], seen["x0"] = logits, x0
        return real(logits, x0, *a)

    monkeypatch.setattr(obj, "weighted_ce", spy)
    g = torch.Generator().manual_seed(0)
    ncfg = NoiseConfig(2, bs, sub_prob=0.2)
    with torch.no_grad():
        obj.diffusion_loss(m, b, ncfg, g)
    ids, nv = b.ids, b.valid.sum(1)
    start = b.prompt_len // bs * bs
    g2 = torch.Generator().manual_seed(0)  # the same noise, to rebuild the noisy blocks
    N = int((nv - start).max())
    j = torch.arange(N)[None]
    npos = (start[:, None] + j).clamp_max(ids.shape[1] - 1)
    xt, *_ = corrupt(
        ids.gather(1, npos),
        b.answer.gather(1, npos) & (j < (nv - start)[:, None]),
        npos // bs - (start // bs)[:, None],
        ncfg,
        g2,
        ids[b.answer],
    )
    with torch.no_grad():
        for i in range(ids.shape[0]):
            for blk in range(int(start[i]) // bs, int(nv[i]) // bs):
                lo, hi = blk * bs, (blk + 1) * bs
                x = ids[i, :hi].clone()
                x[lo:hi] = xt[i, lo - start[i] : hi - start[i]]
                ref = m(x[None])[
                    0, lo:hi
                ]  # the model's own shifted logits under inference conditions
                torch.testing.assert_close(
                    ref, seen["logits"][i, lo - start[i] : hi - start[i]], atol=1e-5, rtol=1e-5
                )


def test_render_layout_and_pads() -> None:
    tok = Tokenizer.byte_level(individual_digits=True)
    item = get_task("multiply").sample(random.Random(0), "train")
    p, a = render(item, tok)
    assert tok.decode(a, skip_special_tokens=False).startswith("<think>")
    assert a[-1] == tok.token_to_id("<|im_end|>")
    p2, a2 = render(item, tok, instant=True)
    assert tok.decode(p2, skip_special_tokens=False).endswith("<think></think>")
    assert tok.decode(a2) == item.answer
    b = collate([Mixture({"multiply": 1}, tok).sample(random.Random(1))], 32, 0, 1)
    assert b.ids.shape[1] % 32 == 0
    n = int(b.content_len[0])
    assert bool((b.ids[0, n:] == 1).all())  # trailing <|endoftext|> pads to the block end
    assert bool(b.answer[0, n:].all()) and not bool(b.answer[0, : int(b.prompt_len[0])].any())


def test_lr_schedule() -> None:
    cfg = get_recipe("tiny", steps=100, warmup=10, lr=1e-3, min_lr_frac=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    assert lr_at(55, cfg) == pytest.approx(0.55e-3)


def test_resume_equals_straight_run(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    straight = Trainer(get_recipe("tiny", out=str(tmp_path / "a"), steps=6, ckpt_every=100))
    straight.run()
    cfg = get_recipe("tiny", out=str(tmp_path / "b"), steps=6, ckpt_every=100)
    first = Trainer(cfg)
    for _ in range(3):
        first.train_step()
    first.save_state()
    resumed = Trainer(cfg)
    assert resumed.step == 3
    resumed.run()
    for (k, v1), v2 in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values()
    ):
        torch.testing.assert_close(v1, v2, atol=0, rtol=0, msg=k)
    assert (tmp_path / "b" / "final" / "model.safetensors").is_file()
    # and it can fail: one step fewer gives different weights (the same tokenizer: built once)
    other = Trainer(get_recipe("tiny", out=str(tmp_path / "c"), steps=5, ckpt_every=100))
    other.run()
    assert not torch.equal(
        other.model.model.embed_tokens.weight, straight.model.model.embed_tokens.weight
    )


def test_cli_maps_flags_onto_fields(capsys: pytest.CaptureFixture[str]) -> None:
    from quicksilver.cli import main

    assert (
        main(
            [
                "train",
                "--recipe",
                "tiny",
                "--steps",
                "7",
                "--sub-prob",
                "0.25",
                "--no-resume",
                "--print-config",
            ]
        )
        == 0
    )
    cfg = json.loads(capsys.readouterr().out)
    assert (
        cfg["steps"] == 7
        and cfg["sub_prob"] == 0.25
        and cfg["resume"] is False
        and cfg["d_model"] == 64
    )
    with pytest.raises(SystemExit):
        main(["train", "--recipe", "nope"])


@pytest.mark.slow
def test_torchrun_gloo_two_processes(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            torchrun,
            "--nproc_per_node",
            "2",
            "--master_port",
            "29517",
            "-m",
            "quicksilver.cli",
            "train",
            "--recipe",
            "tiny",
            "--steps",
            "4",
            "--out",
            str(tmp_path / "ddp"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "ddp" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "ddp" / "ckpt.rank1.pt").is_file()
    lines = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert lines and '"step": 4' in lines[-1]


def test_every_recipe_starts_from_a_run_that_a_recipe_or_a_stage_builds() -> None:
    """A recipe names the run it continues, never the asset path (which holds whatever ships now),
    and its distillation data is a file a stage of the shipped lineage writes."""
    from quicksilver.train.recipes import RECIPES
    from quicksilver.train.reproduce import LINEAGE

    outs = {r.out for r in RECIPES.values()}
    distilled = {s.distill.out for s in LINEAGE if s.distill}
    for name, r in RECIPES.items():
        if r.init_from:
            run = r.init_from.removesuffix("/final").split("/step_")[0]
            assert run in outs, (name, r.init_from)
        if r.distill_data:
            assert r.distill_data in distilled, (name, r.distill_data)


ASSETS = Path(__file__).parent.parent / "src" / "quicksilver" / "assets"
# fields that change how a run is driven, not the weights it ends with (Trainer.load_state)
VOLATILE = {"threads", "time_limit", "stop_at", "resume", "eval_every", "eval_limit", "log_every"}


def test_the_staged_recipe_builds_each_input_before_it_is_read() -> None:
    from quicksilver.train.recipes import RECIPES
    from quicksilver.train.reproduce import EDIT_STAGES, LINEAGE, STAGES, end

    assert LINEAGE == [*STAGES, *EDIT_STAGES]
    names = [s.name for s in LINEAGE]
    assert len(set(names)) == len(names)
    written: set[str] = set()
    for s in LINEAGE:
        assert all(p in written for p in s.reads), (s.name, s.reads, "read before written")
        assert s.writes not in written, s.name  # no run is written by two stages
        written.add(s.writes)
        if not s.distill:  # a schedule only moves forward: each segment stops past the last
            ends = [end(c) for c in s.configs()]
            assert ends == sorted(set(ends)), (s.name, ends)
    # every stage leads to a shipped model (no dead ends), and each line's last one ships
    needed = {s.writes for s in LINEAGE if s.ships}
    for s in reversed(LINEAGE):
        if s.writes in needed:
            needed |= set(s.reads)
    assert needed == written and STAGES[-1].ships and EDIT_STAGES[-1].ships
    # recipes.py holds the shipped models' runs only, the CLI's default and the tests' tiny run
    lineage = {s.recipe for s in LINEAGE if s.recipe}
    assert set(RECIPES) == lineage | {"small", "tiny"}


def test_the_stages_that_ship_end_with_the_assets_training_config() -> None:
    from quicksilver.train.reproduce import EDIT_STAGES, LINEAGE

    shipped = {s.ships: s for s in LINEAGE if s.ships}
    assets = {d.name for d in ASSETS.iterdir() if (d / "train_config.json").is_file()}
    # every asset is a stage's final; the edit model's stages may run before it ships
    assert assets <= set(shipped) and set(shipped) - assets <= {EDIT_STAGES[-1].ships}
    for asset in sorted(assets):
        s = shipped[asset]
        record = json.loads((ASSETS / asset / "train_config.json").read_text())
        cfg = s.configs()[-1].to_dict()
        assert s.writes == record["out"] + "/final"
        diff = {k: (v, cfg[k]) for k, v in record.items() if k in cfg and k not in VOLATILE}
        assert {k: d for k, d in diff.items() if d[0] != d[1]} == {}, asset
        steps = json.loads((ASSETS / asset / "train_state.json").read_text())["step"]
        assert steps == cfg["steps"]


def test_from_assets_places_what_ships_and_runs_only_the_edit_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from quicksilver.train import reproduce as rp

    monkeypatch.chdir(tmp_path)
    assert rp.place_assets(rp.EDIT_STAGES) == ["runs/small-ar-draft-sd/final"]
    assert rp.done(rp.STAGES[[s.name for s in rp.STAGES].index("draft-sd")])
    assert rp.place_assets(rp.EDIT_STAGES) == []  # already there
    calls: list[str] = []
    fit, _ = _fake_run(calls)
    assert rp.reproduce(rp.EDIT_STAGES, fit=fit) == [s.name for s in rp.EDIT_STAGES]
    assert calls[0] == "runs/edit-drill:800" and calls[-1] == "runs/edit:600"
    capsys.readouterr()
    assert rp.main(["--from-assets", "--list"]) == 0
    out = capsys.readouterr().out
    heads = [line.split()[0] for line in out.splitlines() if not line[0].isspace()]
    assert heads == [s.name for s in rp.EDIT_STAGES] and "edit  [done]" in out


def _fake_run(calls: list[str]):  # type: ignore[no-untyped-def]
    """A trainer and a distiller that only write what the real ones leave behind."""
    from quicksilver.train.distill import CHUNK

    def fit(cfg) -> None:  # type: ignore[no-untyped-def]
        calls.append(f"{cfg.out}:{cfg.stop_at or cfg.steps}")
        final = Path(cfg.out) / "final"
        final.mkdir(parents=True, exist_ok=True)
        (final / "train_state.json").write_text(json.dumps({"step": cfg.stop_at or cfg.steps}))

    def decode(teacher, out, n, tasks, seed, batch_size):  # type: ignore[no-untyped-def]
        assert (Path(teacher) / "train_state.json").is_file()
        calls.append(str(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps({"chunk": c}) + "\n" for c in range(-(-n // CHUNK))))
        return {}

    return fit, decode


def test_reproduce_runs_each_stage_once_and_stops_after_the_named_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from quicksilver.train.reproduce import STAGES, main, reproduce

    monkeypatch.chdir(tmp_path)
    calls: list[str] = []
    fit, decode = _fake_run(calls)
    assert reproduce(STAGES, "ar-v2", fit=fit, decode=decode) == ["ar-v1", "ar-v2"]
    assert calls == ["runs/small-ar:2000", "runs/small-ar:7900", "runs/small-ar-v2:600"]
    calls.clear()
    ran = reproduce(STAGES, fit=fit, decode=decode)
    assert ran == [s.name for s in STAGES[2:]]
    assert "runs/small-ar2d-v2:200" in calls and "runs/distill3/self_v37.jsonl" in calls
    assert reproduce(STAGES, fit=fit, decode=decode) == []  # all done: nothing runs again
    capsys.readouterr()
    assert main(["--list", "--stage", "ar-v2"]) == 0
    out = capsys.readouterr().out
    assert "ar-v1  [done]" in out and "--stop-at 7900" in out
    assert [line.split()[0] for line in out.splitlines() if not line[0].isspace()] == [
        "ar-v1",
        "ar-v2",
    ]
    with pytest.raises(SystemExit):
        main(["--list", "--stage", "nope"])


def test_a_staged_schedule_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real tiny run on a stopped-then-extended schedule: a stage killed after saving its stop
    but before exporting it is exported, not trained past the stop, and a finished one is skipped."""
    from quicksilver.train.reproduce import Stage, final_step, reproduce

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    stage = Stage("t", "tiny", "tiny", ({"steps": 6, "stop_at": 3}, {"steps": 6}))
    first = Stage("t", "tiny", "tiny", stage.schedule[:1])
    assert reproduce([first]) == ["t"] and final_step(Path("runs/tiny")) == 3
    shutil.rmtree("runs/tiny/final")

    def never(cfg: object) -> None:
        raise AssertionError("trained past its stop")

    assert reproduce([first], fit=never) == ["t"] and final_step(Path("runs/tiny")) == 3
    assert reproduce([stage]) == ["t"] and final_step(Path("runs/tiny")) == 6
    assert reproduce([stage], fit=never) == []
