"""The pass planner at a real size: measured pass times cap the drafts a verify pass feeds."""

from __future__ import annotations

import torch

from quicksilver.models.config import ModelConfig
from quicksilver.models.transformer import Transformer
from quicksilver.runtime.pass_plan import (
    RUNTIMES,
    PassPlanner,
    best_draft_count,
    expected_tokens,
)
from quicksilver.runtime.runtime import Runtime


def test_expected_tokens_is_the_kept_prefix_sum() -> None:
    assert expected_tokens(0, 0.7) == 1.0
    assert abs(expected_tokens(8, 0.7) - 3.1) < 0.1  # the shipped model's 3.16 a pass at k = 8


def test_flat_costs_feed_every_draft_steep_ones_fewer() -> None:
    flat = {k: 1.0 for k in (1, 2, 4, 8)}  # a small model: every width costs the same
    assert best_draft_count(flat) == 8
    # int8 at Fast-dLLM v2 1.5B on an AVX2 CPU (issue 53): 4 positions 133 ms, 8: 286, 16: 509
    real = {3: 133.0, 7: 286.0, 15: 509.0}
    assert best_draft_count(real) == 3
    assert best_draft_count({1: 100.0, 2: 100.0, 4: 400.0}, accept=0.99) == 2


def test_the_cap_bounds_drafts_and_masks_but_not_copied_runs() -> None:
    capped = PassPlanner(RUNTIMES["cpu"], max_drafts=3)
    assert capped.plan([], 8, room=100, fed=1, unread=0) == (0, 3)
    assert capped.plan([0.99, 0.99, 0.99], 8, room=100, fed=1, unread=0) == (3, 3)
    assert PassPlanner(RUNTIMES["cpu"]).plan([], 8, room=100, fed=1, unread=0) == (0, 8)
    copied = capped.plan([1.0] * 20, 8, room=100, fed=1, unread=0, width=31)
    assert copied[0] == 20  # a copied run is fed whole


def test_runtime_measures_its_passes_and_its_planner_reads_them() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=64, n_layers=1, n_heads=2, n_kv_heads=2, d_model=16, mlp_hidden=32,
        max_seq_len=128, attention="causal", mask_token_id=63,
    )  # fmt: skip
    rt = Runtime(Transformer(cfg).eval())
    assert rt.planner.max_drafts is None  # nothing measured: k as asked
    ms = rt.measure_passes(ks=(1, 2, 4), context=8, iters=1)
    assert set(ms) == {1, 2, 4} and all(t > 0 for t in ms.values())
    assert rt.planner.max_drafts == best_draft_count(ms)
