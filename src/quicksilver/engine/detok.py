"""Incremental detokenization for append-only streams: text deltas that never split a character."""

from __future__ import annotations

from ..tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed final tokens as they come; get the new text. Holds back an incomplete UTF-8 tail."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # text emitted so far

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        full = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        if full.endswith("\ufffd"):  # a multi-byte character still missing bytes: wait
            full = full.rstrip("\ufffd")
        if not full.startswith(self.text):  # decoding changed earlier text (rare merges): resync
            delta = full[len(self.text) :] if len(full) > len(self.text) else ""
        else:
            delta = full[len(self.text) :]
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end: whatever is left, replacement characters included."""
        full = self.tok.decode(self.ids, skip_special_tokens=self.skip)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += delta
        return delta
