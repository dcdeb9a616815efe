"""A mock engine that needs no weights: the real ``Engine`` over a decoder whose "model" is a script.

``MockEngine`` has the engine's interface (add/cancel/step/has_work) because it *is* an ``Engine``;
only the forward pass is replaced: a script maps the prompt's text to a reply, and each step the
scripted decoder hands the real ``Row`` logits that favour the reply's token at each canvas
position, with a confidence that varies by position so the threshold policy commits several tokens
in some steps and one in others. Everything downstream of the network is real — canvases, blocks,
prefilled skeletons, constraints, stop tokens, cancellation, stats — so protocol tests exercise the
same code paths as a served model, just fast and deterministically.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from ..engine import Engine, EngineConfig
from ..sampling import SamplerConfig
from ..sampling.core.hooks import Constraint
from ..sampling.core.policies import POLICIES
from ..sampling.core.state import Row, RowEvent
from ..sampling.decoders.diffusion import refine
from ..sampling.decoders.row_decoder import RowDecoder, row_stops
from ..tokenizer import Tokenizer

Script = Callable[[str], str]  # prompt text (special tokens kept) -> reply text

TOOLS_RE = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
MOCK_REASONING = "The user wants an answer. I will give a short one."
MOCK_ANSWER = "Hello! I am the quicksilver mock engine."


def _example(schema: dict) -> object:
    t = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if t == "integer":
        return 3
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        return [_example(schema.get("items", {}))]
    if t == "object":
        return {k: _example(v) for k, v in (schema.get("properties") or {}).items()}
    return "Paris"


def continuing(prompt: str, reply: str) -> str:
    """The part of ``reply`` the prompt's open assistant turn has not written yet: the server decodes
    a turn in phases (content, then each tool call), and each phase's prompt holds what came before."""
    turn = prompt.rsplit("<|im_start|>assistant\n", 1)[-1] if "<|im_start|>" in prompt else ""
    written = re.sub(r"^<think>.*?</think>", "", turn, flags=re.S)
    return reply[len(written) :] if written and reply.startswith(written) else reply


def _calls(prompt: str, tools_json: str) -> str:
    """A call of each offered tool the user's last message names (in the order offered), else of
    the first tool."""
    # one JSON object per "\n" line (not splitlines: it also splits at U+2028 and the other
    # separators that json.dumps leaves inside strings)
    fns = [json.loads(line) for line in tools_json.split("\n") if line.strip()]
    fns = [f.get("function", f) for f in fns]
    user = prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
    chosen = [f for f in fns if f["name"] in user] or fns[:1]
    return "".join(
        "<tool_call>"
        + json.dumps({"name": f["name"], "arguments": _example(f.get("parameters") or {})})
        + "</tool_call>"
        for f in chosen
    )


def default_script(prompt: str) -> str:
    """Replies that exercise the protocol: reasoning when the prompt leaves room for it, calls of the
    tools the user names (or the first tool) when tools are offered, an answer quoting the tool's
    result after a tool turn."""
    last_turn = prompt.rsplit("<|im_start|>", 1)[-1]
    if "<|fim_middle|>" in prompt:
        return "middle"
    if "<|im_start|>" not in prompt:
        return " and so on."  # plain completion
    if prompt.endswith("assistant\n"):  # a reasoning phase: think first
        return f"<think>{MOCK_REASONING}</think>"
    tool_turn = prompt.rsplit("<|im_start|>", 2)[-2] if prompt.count("<|im_start|>") >= 2 else ""
    if tool_turn.startswith("tool\n"):
        result = re.search(r"<tool_response>(.*?)</tool_response>", tool_turn, re.S)
        return f"The tool says {result.group(1) if result else 'nothing'}."
    tools = TOOLS_RE.search(prompt)
    if tools and last_turn.startswith("assistant"):
        return continuing(prompt, _calls(prompt, tools.group(1)))
    return MOCK_ANSWER


@dataclass
class ScriptedRow(Row):
    """A real ``Row`` that knows the reply it is scripted to give."""

    script_target: list[int] = field(default_factory=list)


class ScriptedDecoder(RowDecoder[ScriptedRow]):
    """Builds real ``Row``s and steps them with scripted logits instead of a network."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        script: Script,
        max_context: int = 2048,
        step_delay: float = 0.0,
        block_length: int = 32,
    ) -> None:
        self.tok, self.script, self.max_context = tokenizer, script, max_context
        self.step_delay, self.default_block = step_delay, block_length
        assert tokenizer.mask_id is not None
        self.mask_id = tokenizer.mask_id
        self.stop_ids = frozenset(tokenizer.stop_ids)
        self.end_id = tokenizer.token_to_id("<|im_end|>") or tokenizer.stop_ids[0]
        self.vocab = tokenizer.vocab_size
        self.step_count = 0
        self.forward_passes = 0
        # what the engine asks of a decoder's runtime: a bidirectional "network" with no KV cache
        self.runtime = SimpleNamespace(
            config=SimpleNamespace(
                attention="bidirectional", block_size=block_length, max_seq_len=max_context
            )
        )

    def new_row(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        tag: object = None,
        prefill: dict[int, int] | None = None,
        suffix: Sequence[int] | None = None,
        constraint: Constraint | None = None,
        extra_stops: Sequence[int] | None = None,
    ) -> ScriptedRow:
        self.check_request(prompt_ids, cfg, prefill, len(suffix or ()))
        gen = None
        if cfg.temperature > 0 or POLICIES[cfg.policy].needs_noise:
            gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else 0)
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        if suffix:
            text += "<|fim_middle|>"
        stops = row_stops(self.stop_ids, extra_stops)
        stop = self.end_id if "<|im_start|>" in text else (self.tok.eos_id or self.end_id)
        return ScriptedRow(
            prompt=torch.tensor(list(prompt_ids), dtype=torch.long),
            cfg=cfg,
            mask_id=self.mask_id,
            stop_ids=stops,
            block_length=cfg.block_length or min(self.default_block, cfg.max_new_tokens),
            aligned=False,
            model_block=None,
            vocab_limit=self.vocab,
            generator=gen,
            tag=tag,
            prefill=prefill,
            constraint=constraint,
            suffix=torch.tensor(list(suffix), dtype=torch.long) if suffix else None,
            script_target=self.tok.encode(self.script(text)) + [stop],
        )

    def _logits(self, row: ScriptedRow, lo: int, hi: int) -> torch.Tensor:
        target = row.script_target
        logits = torch.zeros(hi - lo, self.vocab)  # (n, V)
        for i, pos in enumerate(range(lo, hi)):
            tok = target[pos] if pos < len(target) else target[-1]
            # confident at some positions, not others
            logits[i, tok] = 6.0 + 6.0 * ((pos * 7 + 3) % 4) / 3.0
        return logits

    def step(self, rows: Sequence[ScriptedRow]) -> list[RowEvent]:
        rows = [r for r in rows if not r.done]
        if not rows:
            return []
        if self.step_delay:
            time.sleep(self.step_delay)
        self.step_count += 1
        self.forward_passes += 1
        return refine(rows, [self._logits(r, *r.block_span()) for r in rows], self.step_count)


class MockEngine(Engine[ScriptedRow]):
    """``Engine`` over a ``ScriptedDecoder``: the same interface, scripted replies, no weights."""

    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        script: Script = default_script,
        config: EngineConfig | None = None,
        max_context: int = 2048,
        step_delay: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer or Tokenizer.byte_level()
        self.max_context = max_context
        super().__init__(
            ScriptedDecoder(self.tokenizer, script, max_context, step_delay),
            config,
        )
