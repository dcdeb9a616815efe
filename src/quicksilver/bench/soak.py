"""``quicksilver bench soak``: N concurrent streams for T minutes against a live server, with a mix
of clients that disconnect mid-stream and bursts beyond the open-request limit.

Each of ``--streams`` workers loops until the time is up: a streamed chat completion read to its
end — or, with probability ``--disconnect``, dropped after its first chunks; a refused worker
waits the ``Retry-After`` it was given, as a well-behaved client does. Every few seconds a
burst of ``--burst`` extra requests arrives at once, above the server's ``--max-concurrent``, and
must be refused with 429/503 and ``Retry-After``. ``--hostile`` clients send schemas over the
server's budgets (a 20,000-value enum, ``minLength: 1e8``, 4,096 ``anyOf`` paths, …) back to back,
each of which must be a 400. A poller in its own process times ``GET /health`` throughout.

A **failure** is anything a client could not have expected: a status other than 200 (or a refusal
without ``Retry-After``), a stream without ``data: [DONE]``, an error event, a transport error.
Reported: requests by outcome, failures (first reasons), end-to-end and TTFT p50/p99 of full
streams, ``/health`` latency p50/p99/max, the hostile 400s' p50/p99, and the server's RSS after
warm-up and at the end (growth in %).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli_util import add_revision_arg
from .common import emit_json, hardware, print_table
from .serve import launch_server, percentile

if TYPE_CHECKING:
    import httpx

PROMPTS = ["Tell me about rivers.", "Count to ten.", "What is 12 + 30?", "Write a short poem."]


def _fanout(width: int, levels: int) -> dict[str, Any]:
    """``width``-way ``anyOf`` through ``$ref`` at each of ``levels`` levels: width**levels paths."""
    defs: dict[str, Any] = {f"l{levels}": {"type": "string"}}
    for k in range(levels - 1, -1, -1):
        defs[f"l{k}"] = {"anyOf": [{"$ref": f"#/$defs/l{k + 1}"} for _ in range(width)]}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


# schemas over the server's budgets: each must be a fast 400, whatever else is running
HOSTILE_SCHEMAS: list[dict[str, Any]] = [
    {"enum": [f"value-{i}" for i in range(20_000)]},
    {"type": "string", "minLength": 100_000_000},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 10_000_000},
    _fanout(4, 6),
    {"type": "object", "properties": {f"p{i}": {"enum": [f"v{i}-{k:04}" for k in range(200)]}
                                      for i in range(12)}},
]  # fmt: skip


@dataclass
class Soak:
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)  # seconds to each hostile request's 400

    def fail(self, why: str) -> None:
        self.outcomes["failed"] += 1
        if len(self.failures) < 10:
            self.failures.append(why)


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of ``pid`` and its descendants (an engine process counts with its server)."""
    if pid is None:
        return None
    total, todo = 0, [pid]
    try:
        while todo:
            p = todo.pop()
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return None if total == 0 else total / 1024
    return total / 1024


async def one_stream(
    client: Any, url: str, body: dict[str, Any], drop_after: int | None, s: Soak
) -> float:
    """One request; ``drop_after`` chunks then hang up (a disconnecting client), or read it all.
    Returns the seconds a refusal asked the client to wait (``Retry-After``), else 0."""
    t0 = time.perf_counter()
    first: float | None = None
    done, chunks = False, 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code in (429, 503):
                s.outcomes["refused"] += 1
                if "retry-after" not in r.headers:
                    s.fail(f"HTTP {r.status_code} without Retry-After")
                    return 0.0
                return float(r.headers["retry-after"])
            if r.status_code != 200:
                s.fail(f"HTTP {r.status_code}: {(await r.aread())[:160]!r}")
                return 0.0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    s.fail(f"error event: {event['error'].get('message', '')[:160]}")
                    return 0.0
                chunks += 1
                if first is None and any(
                    (c.get("delta") or {}).get("content") for c in event.get("choices", [])
                ):
                    first = time.perf_counter() - t0
                if drop_after is not None and chunks >= drop_after:
                    s.outcomes["disconnected"] += 1
                    return 0.0  # leaving the block closes the connection mid-stream
    except Exception as e:  # noqa: BLE001 - a transport error is a failure to report, not a crash
        s.fail(f"{type(e).__name__}: {e}"[:200])
        return 0.0
    if not done:
        s.fail("stream ended without [DONE]")
        return 0.0
    s.outcomes["completed"] += 1
    s.e2e.append(time.perf_counter() - t0)
    if first is not None:
        s.ttft.append(first)
    return 0.0


async def hostile_client(client: httpx.AsyncClient, url: str, end: float, s: Soak) -> None:
    """Until ``end``: post the hostile schemas in turn; each must be a 400 with an error body."""
    bodies = [
        json.dumps(
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "hostile", "schema": schema},
                },
            }
        )
        for schema in HOSTILE_SCHEMAS
    ]
    k = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            r = await client.post(
                url + "/v1/chat/completions",
                content=bodies[k % len(bodies)],
                headers={"content-type": "application/json"},
            )
            if r.status_code in (429, 503) and "retry-after" in r.headers:
                # a burst filled every slot: overload comes first
                s.outcomes["refused"] += 1
                await asyncio.sleep(float(r.headers["retry-after"]))
            elif r.status_code != 400 or "error" not in r.json():
                s.fail(f"hostile schema: HTTP {r.status_code}")
            else:
                s.outcomes["hostile_refused"] += 1
                s.refusals.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            s.fail(f"hostile schema: {type(e).__name__}")
        k += 1


async def soak(url: str, args: argparse.Namespace, s: Soak) -> None:
    import httpx

    rng = random.Random(args.seed)
    end = time.perf_counter() + args.minutes * 60
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.streams + args.burst + args.hostile + 8)
    async with httpx.AsyncClient(timeout=120, headers=headers, limits=limits) as client:

        def body() -> dict[str, Any]:
            return {
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                "max_tokens": args.max_tokens,
                "reasoning_effort": "none",
                "stream": True,
            }

        async def worker() -> None:
            while time.perf_counter() < end:
                drop = rng.randint(1, 3) if rng.random() < args.disconnect else None
                await asyncio.sleep(await one_stream(client, url, body(), drop, s))  # as asked

        async def hostile() -> None:
            await hostile_client(client, url, end, s)

        async def bursts() -> None:
            while time.perf_counter() < end:
                await asyncio.sleep(args.burst_every)
                if args.burst:
                    await asyncio.gather(
                        *(one_stream(client, url, body(), 1, s) for _ in range(args.burst))
                    )

        ctx = multiprocessing.get_context("spawn")
        results = ctx.SimpleQueue()
        poller = ctx.Process(
            target=poll_health,
            args=(url, time.time() + end - time.perf_counter(), headers, results),
        )
        poller.start()
        await asyncio.gather(
            *(worker() for _ in range(args.streams)),
            *(hostile() for _ in range(args.hostile)),
            bursts(),
        )
        times, failures = await asyncio.to_thread(results.get)
        await asyncio.to_thread(poller.join)
        s.health += times
        for why in failures:
            s.fail(why)


def poll_health(url: str, deadline: float, headers: dict[str, str], out: Any) -> None:
    """Time ``GET /health`` every 0.25 s until the wall-clock ``deadline``, the soak's end, however
    long this process took to start (in its own process, so that the soak client's busy event
    loop is not part of the figure); put (latencies, failures) on ``out``."""
    import httpx

    times: list[float] = []
    failures: list[str] = []
    with httpx.Client(timeout=10, headers=headers) as client:
        while not times or time.time() < deadline:  # at least one, however late it started
            t0 = time.perf_counter()
            try:
                r = client.get(url + "/health")
                if r.status_code != 200:
                    failures.append(f"/health {r.status_code}")
            except httpx.HTTPError as e:
                failures.append(f"/health {type(e).__name__}")
            times.append(time.perf_counter() - t0)
            time.sleep(0.25)
    out.put((times, failures))


def run_soak_bench(args: argparse.Namespace) -> int:
    s = Soak()
    pids: list[int] = []
    slots = args.streams + args.hostile  # the bursts go beyond these
    extra = ["--max-concurrent", str(slots), "--engine", args.engine]
    extra += ["--mock"] if args.mock else []
    if args.mock:
        extra += ["--mock-step-delay", str(args.mock_step_delay)]
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(
            launch_server(args.model, extra, pids=pids, revision=args.revision)
        )
        pid = pids[0] if pids else args.pid
        warm = argparse.Namespace(**{**vars(args), "minutes": min(0.25, args.minutes / 4)})
        asyncio.run(soak(url, warm, Soak()))  # warm-up: caches and allocator settle first
        rss_start = rss_mb(pid)
        t0 = time.perf_counter()
        asyncio.run(soak(url, args, s))
        wall = time.perf_counter() - t0
        rss_end = rss_mb(pid)
    report = soak_report(args, s, wall, rss_start, rss_end)
    print_soak(report, s)
    emit_json(report)
    return 0 if not s.outcomes["failed"] else 1


def soak_report(
    args: argparse.Namespace, s: Soak, wall: float, rss_start: float | None, rss_end: float | None
) -> dict[str, Any]:
    """The soak's JSON: outcomes, latency percentiles, /health under load, RSS growth."""
    growth = (
        100.0 * (rss_end - rss_start) / rss_start if rss_start and rss_end is not None else None
    )
    return {
        "bench": "soak",
        "streams": args.streams,
        "minutes": args.minutes,
        "wall_s": round(wall, 1),
        "requests": sum(s.outcomes.values()),
        "outcomes": dict(s.outcomes),
        "failures": s.outcomes["failed"],
        "first_failures": s.failures,
        "e2e_p50_s": percentile(s.e2e, 0.5),
        "e2e_p99_s": percentile(s.e2e, 0.99),
        "ttft_p50_s": percentile(s.ttft, 0.5),
        "ttft_p99_s": percentile(s.ttft, 0.99),
        "health_p50_ms": 1000 * percentile(s.health, 0.5),
        "health_p99_ms": 1000 * percentile(s.health, 0.99),
        "health_max_ms": 1000 * max(s.health, default=float("nan")),
        "hostile_400_p50_ms": 1000 * percentile(s.refusals, 0.5),
        "hostile_400_p99_ms": 1000 * percentile(s.refusals, 0.99),
        "rss_start_mb": rss_start,
        "rss_end_mb": rss_end,
        "rss_growth_pct": growth,
        "settings": {
            "model": "mock" if args.mock else (args.model or "embedded"),
            "max_tokens": args.max_tokens,
            "disconnect": args.disconnect,
            "burst": args.burst,
            "hostile_clients": args.hostile,
            "engine": args.engine,
            "burst_every_s": args.burst_every,
        },
        "hardware": hardware(),
    }


def print_soak(report: dict[str, Any], s: Soak) -> None:
    """The soak's one-row table."""
    print_table(
        "soak",
        [
            "requests",
            "completed",
            "disconnected",
            "refused",
            "failed",
            "e2e p50/p99 s",
            "health p99 ms",
            "RSS MB",
        ],
        [
            [
                report["requests"],
                s.outcomes["completed"],
                s.outcomes["disconnected"],
                s.outcomes["refused"],
                s.outcomes["failed"],
                f"{report['e2e_p50_s']:.2f}/{report['e2e_p99_s']:.2f}",
                f"{report['health_p99_ms']:.1f}",
                f"{report['rss_start_mb']} -> {report['rss_end_mb']}",
            ]
        ],
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint to serve (default: the embedded model)")
    add_revision_arg(p)
    p.add_argument("--mock", action="store_true", help="serve the mock engine (no weights)")
    p.add_argument("--mock-step-delay", type=float, default=0.02, dest="mock_step_delay")
    p.add_argument("--url", help="soak an already running server instead of starting one")
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for its RSS")
    p.add_argument("--api-key", dest="api_key", help="API key of a running server")
    p.add_argument(
        "--streams", type=int, default=64, help="concurrent streams (= --max-concurrent)"
    )
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=32, dest="max_tokens")
    p.add_argument("--disconnect", type=float, default=0.1, help="share of clients that hang up")
    p.add_argument("--burst", type=int, default=8, help="extra requests per burst (refused)")
    p.add_argument("--burst-every", type=float, default=5.0, dest="burst_every", help="seconds")
    p.add_argument(
        "--hostile",
        type=int,
        default=0,
        help="clients that send schemas over the server's budgets in a loop (each must be a 400)",
    )
    p.add_argument(
        "--engine",
        default="thread",
        choices=("thread", "process"),
        help="where the served engine steps (serve --engine)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
