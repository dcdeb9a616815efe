"""A thread-safe LRU bounded by bytes, for compiled structured-output layouts.

A layout's memory is not fixed: its slot grammars memoize token transitions while requests decode
under it, so sizes are re-measured (``size_of``) whenever an entry is added and the oldest entries
go until the total fits. Compiling happens outside the lock (two threads may build the same key;
the second result is dropped), so a slow compile never blocks a cache hit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")
LAYOUT_CACHE_BYTES = 256 * 1024 * 1024


class ByteLRU(Generic[V]):
    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes, self.size_of = max_bytes, size_of
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def nbytes(self) -> int:
        with self._lock:
            return sum(self.size_of(v) for v in self._items.values())

    def get_or_build(self, key: str, build: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            self._evict()
        return value

    def _evict(self) -> None:
        sizes = [self.size_of(v) for v in self._items.values()]
        total = sum(sizes)
        for size in sizes[:-1]:  # the newest entry always stays
            if total <= self.max_bytes:
                break
            self._items.popitem(last=False)
            total -= size
