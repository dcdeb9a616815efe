"""llama.cpp as a baseline of ``bench speed --vs-llama-cpp``: the AR twin exported to GGUF
(``quicksilver export gguf``) and decoded greedily by llama.cpp through its Python binding, from the
same prompt token ids as quicksilver's methods, so every ratio compares the same weights, prompts and
outputs. The binding is optional (``make test-llama-cpp`` builds it); it is imported only here.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import QuicksilverError
from ..models.gguf_export import export_gguf


class LlamaCppRunner:
    """One llama.cpp model on the CPU; ``run`` decodes greedily until a stop id or ``n`` tokens."""

    def __init__(self, ar_dir: Path, threads: int, dtype: str = "f32", n_ctx: int = 1024) -> None:
        try:
            import llama_cpp
        except ImportError:
            raise QuicksilverError(
                "--vs-llama-cpp needs llama-cpp-python: run `make test-llama-cpp` once"
            ) from None
        self.dir = tempfile.TemporaryDirectory(prefix="qs-gguf-")
        self.path = Path(self.dir.name) / "ar.gguf"
        self.export = export_gguf(ar_dir, self.path, dtype)
        self.llm = llama_cpp.Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_ctx,
            type_k=0,  # f32 KV cache (GGML type 0): the same arithmetic as quicksilver's
            type_v=0,
            verbose=False,
        )
        self.version = getattr(llama_cpp, "__version__", "unknown")

    def run(
        self, ids: Sequence[int], n: int, stops: Sequence[int]
    ) -> tuple[list[int], int, float, float]:
        """(tokens, forward passes, seconds, TTFT) of one greedy decode from ``ids``."""
        self.llm.reset()
        out: list[int] = []
        t0 = time.perf_counter()
        ttft = None
        for tok in self.llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
            if tok in stops:
                break
            if ttft is None:
                ttft = time.perf_counter() - t0
            out.append(int(tok))
            if len(out) >= n:
                break
        dt = time.perf_counter() - t0
        return out, len(out) + 1, dt, ttft if ttft is not None else dt

    def info(self) -> dict[str, Any]:
        return {"llama_cpp_python": self.version, "gguf_dtype": self.export["dtype"]}
