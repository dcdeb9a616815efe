"""llama.cpp as a baseline of ``bench speed --vs-llama-cpp``: the AR twin exported to GGUF
(``quicksilver export gguf``) and decoded greedily by llama.cpp from the same prompt token ids as
quicksilver's methods, so every ratio compares the same weights, prompts and outputs. Two ways, each
where it is built: its Python binding (``LlamaCppRunner``, a Python loop over its tokens; ``make
test-llama-cpp``) and its own C++ server (``LlamaServerRunner``, ``make llama-server``), timed by the
server's own clock so that the ratio is against llama.cpp's C++ decode loop, HTTP left out.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import QuicksilverError
from ..models.gguf_export import export_gguf
from .peers import launch_llama_server, llama_server_binary


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


def binding_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# llama-server's own prompt-lookup speculation (``--spec-type ngram-simple``): a draft of up to
# ``size-m`` tokens copied from where the last ``size-n`` tokens occurred before in the context,
# verified in one batch. Its defaults (12 / 48) suit long documents; 3 / 16 matches the short
# n-grams of code edits (bench speed --tasks apply_edit,next_edit), the setting it does best at here.
NGRAM_FLAGS = (
    "--spec-type",
    "ngram-simple",
    "--spec-ngram-simple-size-n",
    "3",
    "--spec-ngram-simple-size-m",
    "16",
)


def server_has_ngram(binary: Path) -> bool:
    """Whether this ``llama-server`` build has n-gram speculation (newer than mid-2025)."""
    import subprocess

    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return "ngram-simple" in out.stdout + out.stderr


class LlamaServerRunner:
    """llama.cpp's ``llama-server`` (one slot, one thread) on the same GGUF; ``run`` sends the token
    ids to its native ``/completion`` (greedy, no prompt cache) and takes the tokens and the time
    its own ``timings`` report (prompt and generation, HTTP excluded). ``extra``: more server
    flags (``NGRAM_FLAGS``); forward passes then count each verified draft batch once."""

    def __init__(self, ar_dir: Path, dtype: str = "f32", extra: Sequence[str] = ()) -> None:
        self.binary = llama_server_binary()
        self.stack = contextlib.ExitStack()
        self.url = self.stack.enter_context(launch_llama_server(1, ar_dir, dtype, extra=extra))
        self.dtype = dtype
        self.extra = list(extra)

    def run(
        self, ids: Sequence[int], n: int, stops: Sequence[int]
    ) -> tuple[list[int], int, float, float]:
        """(tokens, forward passes, seconds, TTFT) of one greedy decode from ``ids``."""
        import httpx

        body = {
            "prompt": list(ids),
            "n_predict": n,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "return_tokens": True,
        }
        r = httpx.post(self.url + "/completion", json=body, timeout=120.0).json()
        out = [int(t) for t in r.get("tokens") or []]
        stop = next((i for i, t in enumerate(out) if t in stops), None)
        out = out if stop is None else out[:stop]
        t = r["timings"]
        per_token = t["predicted_ms"] / max(1, t["predicted_n"])
        seconds = (t["prompt_ms"] + t["predicted_ms"]) / 1000
        passes = 1 + t["predicted_n"] - t.get("draft_n_accepted", 0)
        return out, passes, seconds, (t["prompt_ms"] + per_token) / 1000

    def info(self) -> dict[str, Any]:
        return {"llama_server": str(self.binary), "gguf_dtype": self.dtype, "flags": self.extra}

    def close(self) -> None:
        self.stack.close()
