"""Servers side by side: quicksilver and llama.cpp's own C++ ``llama-server`` on the same prompts.

``bench serve --vs-llama-cpp`` and ``bench agents`` start every server once, all up together: the
embedded model and its AR twin in one ``quicksilver serve`` with no flags (the runtime a user of
``make run`` gets), and ``llama-server`` (built by ``make llama-server`` from the llama.cpp source
vendored in the registry's ``llama-cpp-python`` sdist) on the twin's weights exported to GGUF with
``-np`` slots for the concurrency. Each server gets one thread. Every request goes to
``/v1/completions`` as token ids (so both engines see the same tokens: no tokenizer or chat
template of llama.cpp's in the way), greedy, streamed with usage, and is timed chunk by chunk.
Levels run interleaved: the servers take turns, level by level, repeat by repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assets import embedded_ar_model_path
from ..errors import QuicksilverError
from ..models.gguf_export import export_gguf
from .serve import free_port, healthy, launch_server, percentile

LLAMA_SERVER = Path(".venv/llama.cpp/bin/llama-server")  # where `make llama-server` puts it


@dataclass
class Peer:
    """One server under test: a label, its base URL and the ``model`` name it is asked for."""

    label: str
    url: str
    model: str


@dataclass
class Completion:
    ok: bool
    ttft: float = float("nan")
    e2e: float = float("nan")
    tokens: int = 0
    cached: int = 0
    text: str = ""
    error: str = ""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.e2e if self.ok and self.e2e > 0 else float("nan")


@dataclass
class Level:
    """What one server did at one concurrency: its completions in prompt order and the wall time."""

    done: list[Completion] = field(default_factory=list)
    wall: float = 0.0


def llama_server_built() -> bool:
    try:
        llama_server_binary()
    except QuicksilverError:
        return False
    return True


def llama_server_binary() -> Path:
    found = os.environ.get("QUICKSILVER_LLAMA_SERVER") or shutil.which("llama-server")
    path = Path(found) if found else LLAMA_SERVER
    if not path.is_file():
        raise QuicksilverError("--vs-llama-cpp needs llama.cpp's server: run `make llama-server`")
    return path


@contextlib.contextmanager
def launch_llama_server(
    slots: int,
    ar: Path | None = None,
    dtype: str = "bf16",
    ctx_per_slot: int = 1024,
    timeout: float = 120.0,
    extra: Sequence[str] = (),
) -> Iterator[str]:
    """``llama-server`` on a causal checkpoint's GGUF (default: the AR twin's, bf16), one
    thread, ``slots`` parallel sequences, ``extra`` flags (its speculative decoding, say)."""
    ar = ar or embedded_ar_model_path()
    if ar is None:
        raise QuicksilverError("this build ships no AR twin to export for llama.cpp")
    with tempfile.TemporaryDirectory(prefix="qs-llama-") as tmp:
        gguf = Path(tmp) / "twin.gguf"
        export_gguf(ar, gguf, dtype)
        port = free_port()
        cmd = [str(llama_server_binary()), "-m", str(gguf), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "-t", "1", "-tb", "1", "-np", str(slots)]
        cmd += ["-c", str(ctx_per_slot * slots), "--no-webui", "--log-disable", *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        with healthy(proc, url, timeout, "llama-server"):
            yield url


@contextlib.contextmanager
def launch_peers(
    slots: int, llama: bool, model: str | None = None, revision: str | None = None
) -> Iterator[list[Peer]]:
    """quicksilver (no flags but one thread and enough batch slots) with its twin, and llama-server."""
    flags = [
        "--threads",
        "1",
        f"--max-batch={max(16, slots)}",
        f"--max-concurrent={max(64, 2 * slots)}",
    ]
    with contextlib.ExitStack() as stack:
        qs = stack.enter_context(launch_server(model, flags, timeout=300.0, revision=revision))
        peers = [Peer("quicksilver", qs, "quicksilver")]
        if model is None:
            peers.append(Peer("quicksilver-ar", qs, "quicksilver-ar"))
        if llama:
            peers.append(
                Peer("llama-server", stack.enter_context(launch_llama_server(slots)), "twin")
            )
        yield peers


async def complete(client: Any, peer: Peer, prompt: list[int], max_tokens: int) -> Completion:
    """One streamed greedy completion of token ids, timed from the request to each text chunk."""
    body = {
        "model": peer.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    res, t0 = Completion(ok=False), time.perf_counter()
    try:
        async with client.stream("POST", peer.url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if usage := chunk.get("usage"):
                    res.tokens = int(usage.get("completion_tokens", 0))
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached = int(details.get("cached_tokens", 0) or 0)
                for ch in chunk.get("choices") or []:
                    if ch.get("text"):
                        if not res.text:
                            res.ttft = time.perf_counter() - t0
                        res.text += ch["text"]
        res.e2e = time.perf_counter() - t0
        res.ok = True
    except Exception as e:  # noqa: BLE001 - a failed request is a data point, not a crash
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_level(
    peer: Peer, prompts: list[list[int]], concurrency: int, max_tokens: int
) -> Level:
    """Every prompt once, at most ``concurrency`` in flight; completions in prompt order."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:

        async def one(p: list[int]) -> Completion:
            async with sem:
                return await complete(client, peer, p, max_tokens)

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(p) for p in prompts))
        return Level(list(done), time.perf_counter() - t0)


def summary(levels: list[Level], concurrency: int) -> dict[str, Any]:
    """Medians over repeats of one server's level: per-request tok/s, TTFT, aggregate tok/s."""
    ok = [c for lv in levels for c in lv.done if c.ok]
    aggregate = [sum(c.tokens for c in lv.done if c.ok) / lv.wall for lv in levels if lv.wall > 0]
    return {
        "concurrency": concurrency,
        "requests": sum(len(lv.done) for lv in levels),
        "failed": sum(not c.ok for lv in levels for c in lv.done),
        "tok_s_per_request_p50": percentile([c.tok_s for c in ok], 0.5),
        "ttft_p50_ms": 1000 * percentile([c.ttft for c in ok if c.tokens], 0.5),
        "ttft_p99_ms": 1000 * percentile([c.ttft for c in ok if c.tokens], 0.99),
        "aggregate_tok_s": percentile(aggregate, 0.5),
        "output_tokens": sum(c.tokens for c in ok),
    }
