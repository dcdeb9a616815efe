"""The embedded joint model (assets/model): causal, drafts by diffusion, verifies itself.

Greedy ``verify`` must give exactly what the same weights give one token per pass, on every task,
alone and batched, on torch and on the exported CPU runtimes; and the drafts must pay (tokens per
pass well above one). docs/MODEL.md has the 200-item figures.
"""

from __future__ import annotations

import json

import pytest

import quicksilver
from quicksilver.assets import embedded_model_path
from quicksilver.runtime.cpu_backends import available
from quicksilver.sampling import SamplerConfig
from quicksilver.suite.evaluate import decode_items
from quicksilver.suite.render import prompt_text
from quicksilver.suite.tasks import get_task

PATH = embedded_model_path()
pytestmark = pytest.mark.skipif(PATH is None, reason="no embedded model in this build")
TASKS = ["path_star", "sudoku4", "countdown3", "multiply", "tool_call", "chat", "fim", "tool_loop"]
# torch (every check, batched and without copy drafts too) in the default suite; the exported CPU
# runtimes under -m slow (make test-slow, CI)
BACKENDS = [
    "torch",
    *(
        pytest.param(b, marks=pytest.mark.slow)
        for b in ("onnx", "openvino", "openvino-bf16")
        if available(b)
    ),
]


def test_size_and_format() -> None:
    assert PATH is not None
    size = sum(f.stat().st_size for f in PATH.iterdir() if f.is_file())
    assert size <= 25 * 2**20
    cfg = json.loads((PATH / "config.json").read_text())
    assert cfg["attention"] == "causal" and cfg["draft_length"] >= 2 and not cfg["logit_shift"]
    assert (PATH / "train_config.json").is_file()


def prompts(pipe: quicksilver.Pipeline, n: int) -> list[tuple[list[int], int]]:
    out = []
    for t in TASKS:
        task = get_task(t)
        for it in task.test_items(n):
            out.append(
                (
                    pipe.tokenizer.encode(prompt_text(it, pipe.tokenizer, False)),
                    task.max_answer_tokens + 8,
                )
            )
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_is_the_ar_output_on_every_task(backend: str) -> None:
    """Token for token: verify (alone, in one batch, without copy drafts) == the same weights one
    token per pass."""
    pipe = quicksilver.load(PATH, backend=backend)
    items = prompts(pipe, 3)
    dec = pipe.decoder
    cfg = SamplerConfig(policy="verify")
    ar = [dec.generate([p], cfg.replace(draft=0, max_new_tokens=n))[0] for p, n in items]
    alone = [dec.generate([p], cfg.replace(max_new_tokens=n))[0] for p, n in items]
    batched = dec.generate([p for p, _ in items], [cfg.replace(max_new_tokens=n) for _, n in items])
    no_copy = [
        dec.generate([p], cfg.replace(max_new_tokens=n, copy_drafts=False))[0] for p, n in items
    ]
    same = [a.tokens == b.tokens for a, b in zip(ar, alone)]
    if backend == "openvino-bf16":  # bf16 over a multi-position pass may round a near-tie apart
        assert sum(same) >= len(same) - 1
    else:
        assert all(same)
    assert [a.tokens for a in alone] == [b.tokens for b in batched] or backend != "torch"
    assert [a.tokens for a in alone] == [b.tokens for b in no_copy] or backend != "torch"
    tpf = sum(len(r.tokens) for r in alone) / sum(r.nfe for r in alone)
    assert tpf >= 1.8, tpf  # the drafts pay: ~2.4 on this suite at v3


# Today's greedy counts (verify == the model's AR output) minus one; docs/MODEL.md has 200 items.
@pytest.mark.parametrize(
    "task,phrasing,n,need",
    [
        ("chat", "held-out", 10, 9),
        ("sudoku4", "templated", 12, 10),
        ("sudoku4", "held-out", 12, 9),
        ("countdown3", "templated", 12, 5),
        ("multiply", "templated", 12, 11),
        ("tool_call", "templated", 12, 8),
        ("tool_loop", "templated", 12, 10),
        ("tool_loop", "held-out", 12, 5),
    ],
)
def test_solves_fixed_items(task: str, phrasing: str, n: int, need: int) -> None:
    pipe = quicksilver.load(PATH)
    items = get_task(task).test_items(n, phrasing=phrasing)
    res = decode_items(pipe.model, pipe.tokenizer, items, SamplerConfig(policy="verify"))
    assert sum(r.correct for r in res) >= need, [r.reply for r in res]


def test_threshold_is_the_lossy_mode_of_the_same_weights() -> None:
    """Policy threshold keeps confident drafts unverified: more tokens per pass than verify at a
    low bound (and a different, lossy output)."""
    pipe = quicksilver.load(PATH)
    items = [it for t in ("sudoku4", "chat", "multiply") for it in get_task(t).test_items(4)]
    exact = decode_items(pipe.model, pipe.tokenizer, items, SamplerConfig(policy="verify"))
    lossy = decode_items(
        pipe.model, pipe.tokenizer, items, SamplerConfig(policy="threshold", threshold=0.3)
    )

    def tpf(rs: list) -> float:  # type: ignore[type-arg]
        return sum(r.tokens for r in rs) / sum(r.nfe for r in rs)

    assert tpf(lossy) > tpf(exact)
    assert [r.reply for r in lossy] != [r.reply for r in exact]


@pytest.mark.slow
@pytest.mark.parametrize("phrasing", ["templated", "held-out"])
def test_verify_is_the_ar_output_on_the_whole_suite(phrasing: str) -> None:
    """200 items per task: greedy verify (batched) == one token per pass, every item; any
    difference must be a near-tie (top-2 gap < 1e-3 at the first differing token), listed."""
    from quicksilver.bench.verify import identity

    pipe = quicksilver.load(PATH)
    items = [it for t in TASKS for it in get_task(t).test_items(200, phrasing=phrasing)]
    ids = [pipe.tokenizer.encode(prompt_text(it, pipe.tokenizer, False)) for it in items]
    cfgs = [
        SamplerConfig(policy="verify", max_new_tokens=get_task(it.task).max_answer_tokens + 8)
        for it in items
    ]
    ours, ar = [], []
    for i in range(0, len(ids), 32):  # batches of 32, as eval runs them
        ours += [r.tokens for r in pipe.decoder.generate(ids[i : i + 32], cfgs[i : i + 32])]
        zero = [c.replace(draft=0) for c in cfgs[i : i + 32]]
        ar += [r.tokens for r in pipe.decoder.generate(ids[i : i + 32], zero)]
    rep = identity(pipe.model, ids, ours, ar)
    print(f"{phrasing}: identical {rep['identical_to_ar']:.4f} of {len(items)}", rep["differences"])
    assert all(d["top2_gap"] < 1e-3 for d in rep["differences"]), rep["differences"]


# The shipped joint model's 200-item accuracy per phrasing (8-task mean) and suite tokens per pass
# (torch, batches of 32, the CPU's mask gate), as measured for docs/MODEL.md; the slow check allows
# one point and 0.05 tokens per pass.
MEASURED = {"templated": (0.680, 3.55), "held-out": (0.566, 3.17)}


@pytest.mark.slow
@pytest.mark.parametrize("phrasing", ["templated", "held-out"])
def test_the_200_item_suite_holds_its_measured_accuracy(phrasing: str) -> None:
    pipe = quicksilver.load(PATH)
    means, tokens, passes = [], 0, 0
    for t in TASKS:
        res = decode_items(
            pipe.model,
            pipe.tokenizer,
            get_task(t).test_items(200, phrasing=phrasing),
            SamplerConfig(policy="verify"),
        )
        means.append(sum(r.correct for r in res) / len(res))
        tokens, passes = tokens + sum(r.tokens for r in res), passes + sum(r.nfe for r in res)
    acc, tpf = MEASURED[phrasing]
    assert sum(means) / len(means) >= acc - 0.01, means
    assert tokens / passes >= tpf - 0.05, tokens / passes
