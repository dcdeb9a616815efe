"""Cross-request prefix cache: keys/values of whole model blocks, found by a hash of all tokens so far.

Agent loops resend the whole conversation every turn. For a block-causal model the keys/values of a
complete block depend only on the tokens of that block and the blocks before it, so a new request
whose prompt starts with blocks another request already ran can start with those keys/values
(exact, like vLLM's automatic prefix caching). Entries are chained by hash (parent hash, block
tokens); least recently used entries are evicted beyond a byte budget. A causal model's stream
(``verify`` rows) is the same case with every prefix exact: its blocks are cut at the same size.
Bidirectional models have no exact prefix cache (their prompt attends to the canvas), so rows in
other cache modes are skipped.
"""

from __future__ import annotations

import array
import collections
import hashlib
from dataclasses import dataclass

import torch

from ..sampling.decoders.row_decoder import RowLike

CACHED_MODES = ("block", "window", "verify")  # cache modes whose finished blocks are exact


@dataclass
class _Entry:
    kv: torch.Tensor  # (n_layers, 2, Hkv, block, hd)
    nbytes: int


class PrefixCache:
    def __init__(
        self, block_size: int, max_bytes: int = 256 << 20, prompt_only: bool = False
    ) -> None:
        self.block = block_size
        self.max_bytes = max_bytes
        # only the prompt blocks a later prompt's prefill would compute the same way (an exported
        # step's block-sized prefill passes, runtime/cpu_backends.py): never a reply's blocks, which
        # decode passes computed in other shapes
        self.prompt_only = prompt_only
        self._entries: collections.OrderedDict[bytes, _Entry] = collections.OrderedDict()
        self.bytes = 0
        self.query_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which served from the cache

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def _keys(self, tokens: list[int], n_blocks: int) -> list[bytes]:
        keys, h = [], b""
        for i in range(n_blocks):
            blk = tokens[i * self.block : (i + 1) * self.block]
            h = hashlib.blake2b(h + array.array("q", blk).tobytes(), digest_size=16).digest()
            keys.append(h)
        return keys

    def attach(self, row: RowLike) -> int:
        """Fill a fresh row's cache with the longest cached run of its prompt's complete blocks.

        Returns the number of prompt tokens served. At least the prompt's last token is left to
        compute, so the first pass always has a window to predict."""
        if row.cache is None or row.cache_mode not in CACHED_MODES or row.cache.length:
            return 0
        prompt = row.prompt_ids
        n_blocks = max(0, (len(prompt) - 1) // self.block)
        self.query_tokens += len(prompt)
        hits: list[_Entry] = []
        for key in self._keys(prompt, n_blocks):
            e = self._entries.get(key)
            if e is None:
                break
            self._entries.move_to_end(key)
            hits.append(e)
        if not hits:
            return 0
        kv = torch.cat([e.kv for e in hits], dim=3)  # (n_layers, 2, Hkv, n*block, hd)
        n_layers, _, n_kv, n, hd = kv.shape
        cache = row.cache
        cache.reserve(n_layers, 1, n_kv, hd, n, kv.dtype, kv.device)
        for li in range(n_layers):
            cache.k[li][0, :, :n] = kv[li, 0]
            cache.v[li][0, :, :n] = kv[li, 1]
        cache.write_meta(torch.arange(n, device=kv.device)[None], None)
        cache.commit(n)
        row.take_prefix(n)
        self.hit_tokens += n
        return n

    def insert(self, row: RowLike) -> None:
        """Remember the complete blocks a row has in its cache (prompt and finished answer blocks)."""
        cache = row.cache
        if cache is None or row.cache_mode not in CACHED_MODES:
            return
        final = row.exact_prefix()  # a verify row's cache holds only final tokens after a pass
        tokens = row.host_sequence()
        n_blocks = min(final, len(tokens)) // self.block
        if self.prompt_only:
            n_blocks = min(n_blocks, (len(row.prompt_ids) - 1) // self.block)
        for i, key in enumerate(self._keys(tokens, n_blocks)):
            if key in self._entries:
                self._entries.move_to_end(key)
                continue
            a, b = i * self.block, (i + 1) * self.block
            kv = torch.stack(
                [torch.stack((k[0, :, a:b], v[0, :, a:b])) for k, v in zip(cache.k, cache.v)]
            ).clone()
            e = _Entry(kv, kv.numel() * kv.element_size())
            self._entries[key] = e
            self.bytes += e.nbytes
        while self.bytes > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
