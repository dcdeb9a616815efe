"""Incremental detokenization for append-only streams: text deltas that never split a character.

Built on ``tokenizers``' ``DecodeStream``, which decodes each new token against a short window of
the ones before it (the library's own prefix handling), so a push costs O(new tokens), not a
re-decode of the whole output. A token that ends inside a multi-byte character yields nothing until
the character is complete; ``flush`` releases what is still held (as replacement characters).
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from ..tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed final tokens as they come; get the new text."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.held: list[int] = []  # tokens pushed whose text has not come out yet
        self.text = ""  # text emitted so far

    def push(self, new_ids: list[int]) -> str:
        out = []
        for t in new_ids:
            self.held.append(int(t))
            piece = self.stream.step(self.tok.fast, int(t))
            if piece is not None:
                out.append(piece)
                self.held = []
        delta = "".join(out)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end: whatever is still held, replacement characters included."""
        delta = self.tok.decode(self.held, skip_special_tokens=self.skip) if self.held else ""
        self.held = []
        self.text += delta
        return delta
