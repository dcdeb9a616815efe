"""LLaDA2.1's editing decode, token for token against diffusers' ``LLaDA2Pipeline`` +
``BlockRefinementScheduler`` (an independent implementation of the same rule).

A tiny random LLaDA2 checkpoint (``family_fixtures.write_tiny``, blocks of 8) with its output head
scaled up, so that predictions are confident enough to cross the thresholds and to change as the
context fills in: committed tokens then really get rewritten. The pipeline's model is our own
network run without a cache over the whole window it is given, returning the logits our decoder
sees (the mask id forbidden); our decoder runs its default path (block KV cache). Greedy, a prompt
that ends inside a block, several blocks; quality mode (0.7 / 0.5), speed mode (0.5 / 0.0 — diffusers
turns editing off at 0, so it gets the smallest positive bound, which every top token exceeds) and
editing off. Stops are off on both sides: after a stop token our canvas ends (honest length) while
the pipeline's keeps its tail in the attention window, so the two agree only up to that block.

diffusers (>= 0.42, the dev extra) is the reference; the file skips where it is not installed.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import quicksilver
from family_fixtures import write_tiny
from quicksilver.models.families import generation_defaults
from quicksilver.sampling import SamplerConfig

BLOCK = 8
GEN = 3 * BLOCK + 3  # with a 5-token prompt: a first block shared with the prompt, then 3 more
PROMPT = [17, 42, 99, 7, 250]
MODES = {  # name: (threshold, our editing_threshold, diffusers' editing_threshold)
    "quality": (0.7, 0.5, 0.5),
    "speed": (0.5, 0.0, 1e-12),
    "off": (0.5, None, None),
}


def checkpoint(out: Path, seed: int, head_scale: float) -> Path:
    write_tiny("llada2", out, seed=seed, layers=2, block=BLOCK)
    (f,) = list(out.glob("*.safetensors"))
    state = load_file(str(f))
    state["lm_head.weight"] = state["lm_head.weight"] * head_scale  # confident predictions
    save_file(state, str(f))
    return out


class Reference(torch.nn.Module):
    """What ``LLaDA2Pipeline`` calls: ``model(ids, attention_mask=, position_ids=).logits``."""

    def __init__(self, pipe: Any) -> None:
        super().__init__()
        self.net = pipe.model
        self.mask_id = pipe.config.mask_token_id
        self.vocab = pipe.tokenizer.vocab_size

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        logits = self.net(input_ids).float()  # (B, T, V) block-causal, no cache
        logits[..., self.mask_id] = float("-inf")  # as our decoder: the mask is never a prediction
        logits[..., self.vocab :] = float("-inf")
        return SimpleNamespace(logits=logits)


def reference(pipe: Any, threshold: float, editing: float | None) -> tuple[list[int], int]:
    """diffusers' tokens and how many committed tokens it rewrote."""
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline

    edits = [0]

    def count(_pipe: Any, _step: int, _t: int, kw: dict[str, Any]) -> dict[str, Any]:
        edits[0] += int(kw["editing_transfer_index"].sum())
        return {}

    ref = LLaDA2Pipeline(model=Reference(pipe), scheduler=BlockRefinementScheduler())
    ref.set_progress_bar_config(disable=True)
    out = ref(
        input_ids=torch.tensor([PROMPT]),
        use_chat_template=False,
        gen_length=GEN,
        block_length=BLOCK,
        num_inference_steps=BLOCK,
        temperature=0.0,
        sampling_method="greedy",
        threshold=threshold,
        editing_threshold=editing,
        max_post_steps=16,
        eos_early_stop=False,
        mask_token_id=pipe.config.mask_token_id,
        output_type="seq",
        callback_on_step_end=count,
        callback_on_step_end_tensor_inputs=["editing_transfer_index"],
    )
    return out.sequences[0].tolist(), edits[0]


@pytest.fixture(scope="module")
def diffusers_available() -> None:
    pytest.importorskip("diffusers")
    pytest.importorskip("diffusers.pipelines.llada2")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed", [0, 1])
def test_editing_matches_diffusers(
    diffusers_available: None, tmp_path: Path, mode: str, seed: int
) -> None:
    threshold, ours_edit, ref_edit = MODES[mode]
    pipe = quicksilver.load(checkpoint(tmp_path / "LLaDA2.1-tiny", seed, 6.0))
    cfg = SamplerConfig(
        max_new_tokens=GEN,
        policy="threshold",
        threshold=threshold,
        editing_threshold=ours_edit,
        max_post_steps=16,
        block_length=BLOCK,
        window=BLOCK,
        temperature=0.0,
        stop_at_eos=False,
    ).validate()
    (res,) = pipe.decoder.generate([PROMPT], cfg)
    want, ref_edits = reference(pipe, threshold, ref_edit)
    assert res.tokens == want, f"{mode}: ours {res.tokens}\nref  {want}"
    assert res.edits == ref_edits
    if ours_edit is not None:
        assert ref_edits > 0, f"{mode}: no committed token was rewritten; the test lost its edge"


def test_llada21_checkpoints_decode_in_quality_mode(tmp_path: Path) -> None:
    arch = "LLaDA2MoeModelLM"
    for name, want in [("LLaDA2.1-mini", 0.5), ("LLaDA2.0-mini", None)]:
        d = write_tiny("llada2", tmp_path / name, block=BLOCK)
        assert generation_defaults(arch, d).get("editing_threshold") == want
    hub = tmp_path / "hub/models--inclusionAI--LLaDA2.1-flash/snapshots/abc"
    assert generation_defaults(arch, write_tiny("llada2", hub, block=BLOCK))["threshold"] == 0.7
    d = tmp_path / "LLaDA2.0-mini"
    speed = generation_defaults(arch, d, mode="speed")
    assert (speed["threshold"], speed["editing_threshold"]) == (0.5, 0.0)
    pipe = quicksilver.load(tmp_path / "LLaDA2.1-mini", decoding_mode="speed")
    assert pipe.sampler_config().editing_threshold == 0.0
    assert quicksilver.load(d).sampler_config().editing_threshold is None
    with pytest.raises(quicksilver.errors.ConfigError, match="decoding mode"):
        generation_defaults(arch, d, mode="turbo")
