"""Prefix-cache-aware routing for several replicas (``serve --replicas N``), as pure functions.

Agent loops resend the whole conversation every turn, and each replica's engine keeps a prefix
cache of the prompts it served. A request should therefore go to the replica that served its
prefix. The ingress cannot tokenize (that needs the chat template, tools and the model), so the
key is built from the request's prompt *text*, in two parts, each written as canonical JSON:

- the *head*, shared by every conversation of one agent: the model, the tools and the leading
  system/developer messages (or the Responses API's ``instructions``);
- the *conversation*: the other messages in order (or ``prompt``, or ``input``), so a later turn's
  text starts with the earlier turn's text.

The conversation text is cut into whole blocks of ``BLOCK_CHARS`` characters and hashed
cumulatively from a digest of the head: key ``i`` is the hash of head + blocks ``0..i``. Two
conversations of one agent share the head but no key, so they can spread over the replicas, while
every turn of one conversation extends the keys of the turns before it.

``PrefixTable`` remembers which replica served each key (bounded, least recently used first out);
``prefer`` picks the live replica holding the longest known prefix, unless it is more than
``imbalance`` requests busier than the least loaded one. With no usable match the router falls
back to the least loaded replica (Ray Serve's own queue-length probe; ties at random).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

R = TypeVar("R", bound=Hashable)  # a replica id
BLOCK_CHARS = 32  # characters per hashed block (about 8-16 tokens of English text)
MAX_BLOCKS = 1024  # keys per request (32 KiB of conversation text); longer ones keep their head
TABLE_SIZE = 100_000  # keys the router remembers
HEAD_ROLES = ("system", "developer")


def _split(path: str, body: Mapping[str, object]) -> tuple[list[object], list[object]]:
    """(head, conversation): the prompt-bearing fields of a request body, in rendering order."""
    head: list[object] = [body.get("model"), body.get("tools")]
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        msgs = messages if isinstance(messages, list) else []
        n = 0
        while n < len(msgs) and isinstance(msgs[n], dict) and msgs[n].get("role") in HEAD_ROLES:
            n += 1
        return head + msgs[:n], msgs[n:]
    if path.endswith("/responses"):
        inp = body.get("input")
        return head + [body.get("instructions")], inp if isinstance(inp, list) else [inp]
    if path.endswith("/completions"):  # completions and fim/completions
        return head, [body.get("prompt")]
    return head, []


def _canon(parts: list[object]) -> str:
    return "".join(json.dumps(p, sort_keys=True, separators=(",", ":")) + "\x1e" for p in parts)


def prompt_text(path: str, body: bytes) -> tuple[str, str]:
    """The canonical (head, conversation) text of a request (empty for bodies without a prompt)."""
    try:
        payload = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return "", ""
    if not isinstance(payload, dict):
        return "", ""
    head, conversation = _split(path, payload)
    return _canon(head), _canon(conversation)


def block_hashes(
    text: str, seed: str = "", block: int = BLOCK_CHARS, limit: int = MAX_BLOCKS
) -> list[str]:
    """Cumulative hashes of the whole blocks of ``text`` after ``seed``: entry ``i`` covers
    ``seed`` and blocks ``0..i``."""
    h = hashlib.blake2b(seed.encode(), digest_size=12)
    out = []
    for i in range(min(len(text) // block, limit)):
        h.update(text[i * block : (i + 1) * block].encode())
        out.append(h.copy().hexdigest())
    return out


def route_key(path: str, body: bytes) -> list[str]:
    """What the router matches on: the request's cumulative prefix-block hashes."""
    head, conversation = prompt_text(path, body)
    return block_hashes(conversation, seed=head) if conversation else []


class PrefixTable(Generic[R]):
    """Which replica served each prefix key; the oldest keys are forgotten past ``capacity``."""

    def __init__(self, capacity: int = TABLE_SIZE) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[str, R] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def longest(self, keys: Sequence[str], live: Mapping[R, object]) -> tuple[R | None, int]:
        """The live replica that served the longest prefix of ``keys``, and how many blocks match."""
        for n in range(len(keys), 0, -1):
            owner = self._owner.get(keys[n - 1])
            if owner is not None and owner in live:
                return owner, n
        return None, 0

    def record(self, keys: Sequence[str], replica: R) -> None:
        for k in keys:
            self._owner[k] = replica
            self._owner.move_to_end(k)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)


def prefer(
    table: PrefixTable[R], keys: Sequence[str], loads: Mapping[R, int], imbalance: int = 4
) -> R | None:
    """The replica to try first for ``keys`` (None: route to the least loaded). ``loads`` maps every
    live replica to its ongoing requests."""
    owner, _ = table.longest(keys, loads)
    if owner is None:
        return None
    if loads[owner] > min(loads.values()) + imbalance:
        return None  # the cache holder is swamped: spread instead
    return owner
