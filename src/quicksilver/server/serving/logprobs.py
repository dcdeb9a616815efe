"""Log-probabilities of a diffusion decode, and their OpenAI shapes.

A diffusion model has no left-to-right distribution: each position is predicted at every step
until it is committed. The log-probability of an output token is defined here as its
log-probability **at the step it was committed** — the distribution the decoder chose it from
(after any structured-output mask, so under a schema it is renormalised over the allowed tokens;
temperature and top-p are not applied to it). ``top_logprobs`` lists the most likely tokens of
that same distribution. A token prefilled by a structured skeleton was never predicted: it is
reported with log-probability 0 (certain) and no alternatives.

``LogprobRecorder`` gets them without touching the decoder: it is the row's ``Constraint`` (wrapping
the real one, if any), so it sees the window's logits of every step (``mask_logits``) and each
commit as it happens (``allow``, asked with the token about to be committed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...sampling.core.hooks import CanvasRow, Constraint
from ...tokenizer import Tokenizer


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, logprob), most likely first


class LogprobRecorder:
    """A ``Constraint`` that records each committed token's log-probability at its commit step."""

    def __init__(self, inner: Constraint | None, top: int) -> None:
        self.inner, self.top = inner, top
        self.values: dict[int, TokenLogprob] = {}  # canvas position -> at its commit
        self._fresh: list[int] = []  # positions recorded since the last ``take``
        self._lo = 0
        self._lp: torch.Tensor | None = None  # (n, V) log-softmax of this step's window

    def mask_logits(self, row: CanvasRow, lo: int, logits: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            logits = self.inner.mask_logits(row, lo, logits)
        self._lo, self._lp = lo, logits.float().log_softmax(-1)  # (n, V)
        return logits

    def allow(self, row: CanvasRow, pos: int, token: int) -> bool:
        if self.inner is not None and not self.inner.allow(row, pos, token):
            return False
        if self._lp is not None and 0 <= pos - self._lo < self._lp.shape[0]:
            lp = self._lp[pos - self._lo]  # (V,)
            top: list[tuple[int, float]] = []
            if self.top:
                vals, ids = lp.topk(min(self.top, lp.shape[0]))
                top = [(int(i), float(v)) for i, v in zip(ids, vals) if v > float("-inf")]
            self.values[pos] = TokenLogprob(int(token), float(lp[token]), top)
            self._fresh.append(pos)
        return True

    def take(self) -> dict[int, TokenLogprob]:
        """What was recorded since the last call (an engine in another process sends it back)."""
        fresh, self._fresh = self._fresh, []
        return {p: self.values[p] for p in fresh}

    def put(self, values: dict[int, TokenLogprob]) -> None:
        """Values ``take`` returned in the engine's process, into this (the server's) copy."""
        self.values.update(values)

    def entries(self, tokens: list[int], hidden: set[int]) -> list[TokenLogprob]:
        """One entry per output token that shows as text (pads of a structured canvas hidden)."""
        out = []
        for pos, t in enumerate(tokens):
            if t in hidden:
                continue
            v = self.values.get(pos)
            out.append(v if v is not None and v.token == t else TokenLogprob(t, 0.0, []))
        return out


def _piece(tok: Tokenizer, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False)


def chat_logprobs(tok: Tokenizer, entries: list[TokenLogprob]) -> dict[str, object]:
    """``choices[].logprobs`` of a chat completion: ``{"content": [{token, logprob, bytes,
    top_logprobs}]}``."""

    def one(t: int, lp: float) -> dict[str, object]:
        s = _piece(tok, t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode())}

    return {
        "content": [
            {**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
            for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(tok: Tokenizer, entries: list[TokenLogprob]) -> dict[str, object]:
    """``choices[].logprobs`` of a text completion: parallel lists and character offsets."""
    tokens = [_piece(tok, e.token) for e in entries]
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_piece(tok, t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }
