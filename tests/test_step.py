"""The step's structure: one device-to-host transfer per batched step (counted), the pure batched
selection, the hooks (revision, stops, constraints) and the cache-mode registry, each on its own."""

from __future__ import annotations

import pytest
import torch

from quicksilver.bench.syncs import SyncCounter
from quicksilver.engine import Engine, EngineConfig, EngineRequest
from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.sampling import POLICIES, Decoder, SamplerConfig
from quicksilver.sampling.core.caches import CACHE_MODES, resolve_cache_mode
from quicksilver.sampling.core.hooks import apply_stop, commit_constrained, remask
from quicksilver.sampling.core.select import choose, forbid, forbid_host, policy_scores
from quicksilver.sampling.structured.canvas import BanTokens

MASK, EOS = 2, 1
INF = float("inf")


def _model(attention: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(preset("tiny", vocab_size=96, attention=attention, block_size=8)).eval()


def _mixed(i: int) -> SamplerConfig:
    """Settings that differ row to row: policy, temperature, threshold, steps, revision, blocks."""
    policies = sorted(p for p in POLICIES if POLICIES[p].rule != "verify")  # diffusion policies
    return SamplerConfig(
        max_new_tokens=6 + (i * 5) % 19,
        policy=policies[i % len(policies)],
        threshold=(0.05, 0.3, 0.9)[i % 3],
        steps=None if i % 4 else 6,
        temperature=(0.0, 0.8)[i % 2],
        seed=i,
        revise_threshold=0.6 if i % 3 == 0 else None,
        block_length=(None, 4, 8)[i % 3],
        stop_at_eos=i % 5 != 0,
        record_canvas=i % 2 == 0,
    )


def _prompt(i: int) -> list[int]:
    return [3 + (7 * i + j) % 90 for j in range(3 + (i * 3) % 11)]


def test_the_sync_counter_sees_every_kind_of_read() -> None:
    """The counter can fail: each way of reading a tensor on the host counts, plain math does not."""
    t = torch.arange(6.0)
    orig = torch.Tensor.tolist
    with SyncCounter() as c:
        y = (t * 2).softmax(-1).argsort()  # device work only
    assert c.total == 0 and y.shape == (6,)
    reads = [
        lambda: t.tolist(),
        lambda: t[2].item(),
        lambda: int(t[1]),
        lambda: bool((t > 3).any()),
        lambda: (t > 3).nonzero(),
        lambda: t[t > 3],
        lambda: t.masked_select(t > 2),
        lambda: t.cpu(),
        lambda: t.numpy(),
    ]
    for read in reads:
        with SyncCounter() as c:
            read()
        assert c.total == 1, (read, c.counts)
    assert torch.Tensor.tolist is orig  # the patches are undone on exit
    with SyncCounter() as c:
        torch.tensor([1, 2, 3])  # host data: an upload on a GPU
        t[0] = 5.0  # a scalar is passed by value: none
    assert (c.uploads, c.blocking_uploads, c.total) == (1, 0, 0)


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize(
    "attention,cache",
    [("block_causal", "auto"), ("bidirectional", "none"), ("bidirectional", "dual")],
)
def test_one_device_to_host_transfer_per_batched_step(
    batch: int, attention: str, cache: str
) -> None:
    dec = Decoder(_model(attention), MASK, [EOS], vocab_limit=96, cache_mode=cache)
    rows = [dec.new_row(_prompt(i), _mixed(i)) for i in range(batch)]
    per_step, uploads = [], []
    while not all(r.done for r in rows):
        with SyncCounter() as c:
            dec.step(rows)
        per_step.append(c.total)
        uploads.append(c.uploads)
    assert len(per_step) > 3 and max(per_step) == 1, per_step
    # host-built tensors per step, whatever the batch and the mix of policies: k and tau in one,
    # revision's bounds, the rows of each policy in one (13 at batch 4 before models/host.py)
    assert max(uploads) <= 3, uploads


def test_the_engine_step_keeps_one_transfer_with_the_prefix_cache() -> None:
    dec = Decoder(_model("block_causal"), MASK, [EOS], vocab_limit=96)
    eng = Engine(dec, EngineConfig(max_batch=4))
    shared = _prompt(0) * 3  # complete blocks the prefix cache can serve to later requests
    for i in range(6):
        eng.add(EngineRequest(f"r{i}", shared + _prompt(i), _mixed(i)))
    per_step = []
    while eng.has_work:
        with SyncCounter() as c:
            eng.step()
        per_step.append(c.total)
    assert max(per_step) == 1 and eng.prefix_cache is not None and eng.prefix_cache.hit_tokens > 0


def test_constraints_read_more_and_only_for_their_rows() -> None:
    """A constrained row (structured output) is off the fast path: its reads are extra; the same
    batch without it is back to one transfer."""
    dec = Decoder(_model("bidirectional"), MASK, [EOS], vocab_limit=96)
    cfg = SamplerConfig(max_new_tokens=10, threshold=0.2, stop_at_eos=False)

    def reads(constrained: bool) -> int:
        rows = [dec.new_row(_prompt(i), cfg) for i in range(3)]
        if constrained:
            rows.append(dec.new_row(_prompt(3), cfg, constraint=BanTokens([10, 11])))
        with SyncCounter() as c:
            dec.step(rows)
        return c.total

    assert reads(False) == 1 and reads(True) > 1


# ---- the pure selection -------------------------------------------------------------------------
def test_choose_takes_k_best_masked_and_everything_over_tau() -> None:
    score = torch.tensor([[0.9, 0.2, 0.95, 0.5], [0.1, 0.1, 0.1, 0.7], [0.3, 0.8, 0.8, 0.1]])
    masked = torch.tensor([[True, True, False, True], [True, True, True, False], [True] * 4])
    k = torch.tensor([2, 1, 1])
    tau = torch.tensor([INF, INF, 0.25])
    take, order = choose(score, masked, k, tau)
    assert take.tolist() == [
        [True, False, False, True],  # 0.95 is committed already: the two best masked ones
        [True, False, False, False],  # a tie: the leftmost; the 0.7 is not masked
        [True, True, True, False],  # k=1 plus all >= 0.25 (threshold rule)
    ]
    assert order[2, :2].tolist() == [1, 2]  # best first, ties left first


def test_a_row_is_scored_by_its_own_policy_whatever_its_batch_mates() -> None:
    torch.manual_seed(0)
    probs = torch.randn(3, 5, 11).softmax(-1)  # (R, W, V)
    x0 = probs.argmax(-1)
    noise = torch.rand(3, 5)
    names = ["margin", "entropy", "low_confidence"]
    mixed = policy_scores(probs, x0, noise, names)
    for i, name in enumerate(names):
        alone = policy_scores(probs[i : i + 1], x0[i : i + 1], noise[i : i + 1], [name])
        assert torch.equal(mixed[i], alone[0])


# ---- hooks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab_limit", [None, 90])
def test_the_host_ban_equals_the_device_ban(vocab_limit: int | None) -> None:
    """``forbid_host`` (numpy slices on the CPU) bans exactly what ``forbid`` does, in place."""
    x = torch.randn(3, 5, 96)  # (R, W, V)
    want = forbid(x.clone(), MASK, vocab_limit)
    got = forbid_host(x, MASK, vocab_limit)
    assert got.data_ptr() == x.data_ptr() and torch.equal(got, want)
    assert (got[..., MASK] == -INF).all() and (got[..., 3] > -INF).all()


def test_remask_only_committed_eligible_positions_below_their_rows_bound() -> None:
    probs = torch.full((2, 3, 4), 0.25)  # every token at p = 0.25
    cur = torch.tensor([[0, 1, 2], [3, 0, 1]])
    masked = torch.tensor([[False, True, False], [False, False, False]])
    eligible = torch.tensor([[True, True, False], [True, True, True]])
    bad = remask(probs, cur, masked, eligible, torch.tensor([0.5, 0.0]))
    assert bad.tolist() == [[True, False, False], [False, False, False]]  # row 1: no revision


def test_the_earliest_stop_token_ends_the_canvas() -> None:
    dec = Decoder(_model("bidirectional"), MASK, [EOS], vocab_limit=96)
    row = dec.new_row(_prompt(0), SamplerConfig(max_new_tokens=10))
    kept = apply_stop(row, [(2, 40), (6, EOS), (8, 41)])
    assert kept == [(2, 40), (6, EOS)] and row.end == 7 and row.stop_pos == 6
    assert row.host_tokens[7:] == [MASK] * 3 and not bool(row.committed[7:].any())
    assert apply_stop(row, [(6, 40)]) == [(6, 40)] and row.end == 7  # no stop: unchanged
    off = dec.new_row(_prompt(0), SamplerConfig(max_new_tokens=10, stop_at_eos=False))
    assert apply_stop(off, [(1, EOS)]) == [(1, EOS)] and off.end == 10


def test_a_constraint_that_refuses_everything_chosen_gets_the_best_allowed_token() -> None:
    class OnlySeven:
        def mask_logits(self, row, lo, logits):  # type: ignore[no-untyped-def]
            return logits

        def allow(self, row, pos, token):  # type: ignore[no-untyped-def]
            return token == 7

    dec = Decoder(_model("bidirectional"), MASK, [EOS], vocab_limit=96)
    row = dec.new_row(_prompt(0), SamplerConfig(max_new_tokens=4), constraint=OnlySeven())
    logits = torch.zeros(4, 96)
    logits[0, 7] = 1.0
    logits[1, 9] = 5.0
    got = commit_constrained(row, torch.tensor([1, 0, 2, 3]), [0, 1, 0, 0], [9, 9, 9, 9], logits)
    assert got == [(0, 7)] and int(row.canvas[0]) == 7  # position 1's 9 refused: fallback


# ---- cache modes ----------------------------------------------------------------------------
def test_cache_modes_are_chosen_once_from_the_registry() -> None:
    assert set(CACHE_MODES) == {"none", "block", "window", "prefix", "dual"}
    assert resolve_cache_mode("block_causal", "auto") == "block"
    assert resolve_cache_mode("bidirectional", "auto") == "none"
    assert resolve_cache_mode("block_causal", "dual") == "block"  # exact beats approximate
    assert resolve_cache_mode("causal", "block") == "none"
    assert resolve_cache_mode("block_causal", "auto", use_cache=False) == "none"
    with pytest.raises(ConfigError, match="block-causal"):
        resolve_cache_mode("bidirectional", "block")
    with pytest.raises(ConfigError, match="cache mode"):
        resolve_cache_mode("bidirectional", "paged")


def test_each_cache_mode_runs_the_positions_it_promises() -> None:
    cfg = SamplerConfig(max_new_tokens=16, block_length=8, policy="low_confidence", steps=16)
    prompt = _prompt(2)  # 9 tokens
    P = len(prompt)
    lengths = {}
    for mode in ("none", "prefix", "dual"):
        dec = Decoder(_model("bidirectional"), MASK, [EOS], vocab_limit=96, cache_mode=mode)
        row = dec.new_row(prompt, cfg)
        dec.step([row])  # the block's first step: a full pass (and a refresh for the caches)
        seg = row.segment()
        lengths[mode] = (seg.start, seg.length)
    assert lengths == {"none": (0, P + 16), "prefix": (P, 16), "dual": (P, 8)}
    dec = Decoder(_model("block_causal"), MASK, [EOS], vocab_limit=96)
    row = dec.new_row(prompt, cfg)
    first = row.segment()
    assert (first.start, first.append) == (0, P // 8 * 8)  # complete model blocks are kept


@pytest.mark.slow  # re-proves the GPU script on the CPU: ~2 min (make test-slow, CI)
def test_the_prepared_gpu_run_works_on_the_cpu_with_tiny_shapes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    out = tmp_path / "gpu"
    cmd = [sys.executable, "-m", "quicksilver.bench.gpu_run", "--tiny", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, last = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert "quicksilver gpu_run on CPU" in first  # the device is named
    summary = json.loads(last)
    stages = ["llada-8b", "dream-7b", "diffusiongemma-26b-a4b", "llada-8b-fp8", "llada-8b-graphs"]
    stages.append("speed")
    assert [s["stage"] for s in summary["stages"]] == stages
    assert all(s["rc"] == 0 for s in summary["stages"])
    decode = summary["stages"][0]["result"]["results"][0]["decode"]
    assert {(r["batch"], r["tokens_per_step"]) for r in decode} == {
        (b, k) for b in (1, 2) for k in (1, 5, "default")
    }
    forced = [r for r in decode if r["tokens_per_step"] != "default"]
    assert all(r["tpf"] == r["tokens_per_step"] for r in forced)
    assert all(r["syncs_per_step"] == 1 and r["peak_memory_bytes"] > 0 for r in decode)
    assert all(r["tok_s_aggregate"] >= r["tok_s_per_request"] for r in decode)
    gemma = summary["stages"][2]["result"]["results"][0]["rows"]
    assert [r["batch"] for r in gemma] == [1, 4]
    assert all(r["loop_tok_s_per_request"] > 0 and "peak_memory_bytes" in r for r in gemma)
    fp8 = summary["stages"][3]["result"]["results"][0]
    assert fp8["quantize"] == "fp8" and fp8["decode"][0]["tokens_per_step"] == 5
    graphs = summary["stages"][4]["result"]["results"][0]["decode"]
    assert {r["cuda_graphs"] for r in graphs} == {False, True}
    assert all("error" not in r for r in graphs)
