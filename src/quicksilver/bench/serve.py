"""``quicksilver bench serve``: load on a live server, and an agent loop with and without prefix caching.

Load: for each concurrency level (default 1, 4, 16, 64) requests arrive as a Poisson process
(``--rate`` per second, default 32; ``inf`` sends them as fast as the concurrency cap allows), at most that many
in flight, bounded in count and time. Each request streams (SSE) with usage; per level we report TTFT,
inter-token latency (gaps between content chunks) and end-to-end latency p50/p99, aggregate output
tok/s (all output tokens / wall time of the level) and failed requests.

Agent loop: a multi-turn tool-calling conversation resent in full every turn (as agent frameworks
do); seconds per turn, measured against a server with the prefix cache and one without.
Both end with one JSON line and write a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_util import add_revision_arg
from ..errors import QuicksilverError
from ..figures import save_figure
from ..suite.render import to_openai_messages
from ..suite.tasks import get_task
from .common import count_ticks, emit_json, hardware, median, print_table


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def launch_server(
    model: str | None,
    extra: list[str],
    timeout: float = 180.0,
    pids: list[int] | None = None,
    revision: str | None = None,
) -> Iterator[str]:
    """Start ``quicksilver serve`` on a free port (``--model model --revision revision`` where
    given); yield its base URL; stop it afterwards (its pid is appended to ``pids`` when given)."""

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "quicksilver.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]
    if model:
        cmd += ["--model", model]
    if revision:
        cmd += ["--revision", revision]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    url = f"http://127.0.0.1:{port}"
    if pids is not None:
        pids.append(proc.pid)
    with healthy(proc, url, timeout, "server", stop_wait=30.0):  # Ray Serve drains its replicas
        yield url


@contextlib.contextmanager
def healthy(
    proc: subprocess.Popen[Any], url: str, timeout: float, name: str, stop_wait: float = 10.0
) -> Iterator[None]:
    """Wait until ``proc`` answers ``url/health`` with 200 (its error if it exits first); stop it
    when the block ends."""
    import httpx

    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read()[-400:] if proc.stderr else f"code {proc.returncode}"
                raise QuicksilverError(f"{name} exited: {err}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.time() - t0 > timeout:
                raise QuicksilverError(f"{name} did not become healthy in time")
            time.sleep(0.3)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(stop_wait)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Result:
    ok: bool
    ttft: float = float("nan")
    e2e: float = float("nan")
    itl: list[float] = field(default_factory=list)
    out_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the server's prefix cache served
    replica: str = ""  # x-quicksilver-replica (serve --replicas)
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


# ``--route``: the path requests go to, and the held-out tasks their bodies come from
ROUTES = {
    "chat": (
        "/v1/chat/completions",
        ("path_star", "sudoku4", "countdown3", "multiply", "tool_call", "chat"),
    ),
    "apply": ("/v1/apply/completions", ("apply_edit",)),
    "edit": ("/v1/edit/completions", ("next_edit",)),
}


async def stream_chat(
    client: Any,
    url: str,
    body: dict[str, Any],
    api_key: str | None,
    path: str = "/v1/chat/completions",
) -> Result:
    """One streamed completion of a chat-shaped route (``path``), timed chunk by chunk."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    last = None
    res = Result(ok=False)
    calls: dict[int, dict[str, Any]] = {}
    try:
        async with client.stream("POST", url + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            res.replica = r.headers.get("x-quicksilver-replica", "")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if usage := chunk.get("usage"):
                    res.out_tokens = int(usage.get("completion_tokens", 0))
                    res.prompt_tokens = int(usage.get("prompt_tokens", 0))
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens", 0))
                for ch in chunk.get("choices", []):
                    delta = ch.get("delta") or {}
                    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    for tc in delta.get("tool_calls") or []:
                        c = calls.setdefault(
                            tc.get("index", 0), {"id": tc.get("id"), "name": "", "arguments": ""}
                        )
                        fn = tc.get("function") or {}
                        c["name"] += fn.get("name") or ""
                        c["arguments"] += fn.get("arguments") or ""
                        text += fn.get("arguments") or ""
                    res.content += delta.get("content") or ""
                    if text:
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - t0
                        else:
                            res.itl.append(now - last)
                        last = now
        res.e2e = time.perf_counter() - t0
        res.tool_calls = [calls[i] for i in sorted(calls)]
        res.ok = True
    except Exception as e:  # noqa: BLE001 - a failed request is a data point, not a crash
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_level(
    url: str,
    bodies: list[dict[str, Any]],
    concurrency: int,
    rate: float,
    time_limit: float,
    api_key: str | None,
    seed: int,
    path: str = "/v1/chat/completions",
) -> tuple[list[Result], float]:
    import httpx

    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    results: list[Result] = []
    deadline = time.perf_counter() + time_limit
    async with httpx.AsyncClient(timeout=httpx.Timeout(time_limit + 30)) as client:

        async def one(body: dict[str, Any]) -> None:
            async with sem:
                if time.perf_counter() > deadline:
                    return
                results.append(await stream_chat(client, url, body, api_key, path))

        t0 = time.perf_counter()
        tasks = []
        for body in bodies:
            tasks.append(asyncio.create_task(one(body)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return results, wall


def level_summary(results: list[Result], wall: float, concurrency: int) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    itl = [x for r in ok for x in r.itl]
    out = sum(r.out_tokens for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "ttft_p50_ms": 1000 * percentile([r.ttft for r in ok], 0.5),
        "ttft_p99_ms": 1000 * percentile([r.ttft for r in ok], 0.99),
        "itl_p50_ms": 1000 * percentile(itl, 0.5),
        "itl_p99_ms": 1000 * percentile(itl, 0.99),
        "e2e_p50_s": percentile([r.e2e for r in ok], 0.5),
        "e2e_p99_s": percentile([r.e2e for r in ok], 0.99),
        "output_tokens": out,
        "wall_s": wall,
        "aggregate_tok_s": out / wall if wall > 0 else 0.0,
        "single_request_tok_s_p50": median([r.out_tokens / r.e2e for r in ok if r.e2e > 0]),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
    }


def route_max_tokens(route: str) -> int:
    """Each request's max_tokens by default: 96 on chat, the tasks' answer budget on the edit
    routes (a merged file is a few hundred tokens)."""
    if route == "chat":
        return 96
    return max(get_task(t).max_answer_tokens for t in ROUTES[route][1]) + 8


def chat_bodies(n: int, seed: int, max_tokens: int, route: str = "chat") -> list[dict[str, Any]]:
    """Requests from the held-out task suite (so the server does real work), cycled to ``n``; on
    the edit routes the user message alone (their system prompt is the server's)."""
    tasks = ROUTES[route][1]
    items = [
        it
        for name in tasks
        for it in get_task(name).test_items(max(2, n // len(tasks) + 1), seed)
        if it.is_chat
    ]
    if route != "chat":
        for it in items:
            it.messages = [m for m in it.messages or [] if m["role"] != "system"]
    random.Random(seed).shuffle(items)
    bodies = []
    for it in (items * (n // max(len(items), 1) + 1))[:n]:
        body: dict[str, Any] = {
            "messages": to_openai_messages(it.messages or []),
            "max_tokens": max_tokens,
        }
        if route == "chat":
            body["model"] = "quicksilver"  # the edit routes name none: they pick the edit model
        if it.tools:
            body["tools"] = it.tools
        bodies.append(body)
    return bodies


def turn_body(messages: list[dict[str, Any]], tools: list[Any], max_tokens: int) -> dict[str, Any]:
    """One agent turn's request: the whole conversation so far, greedy."""
    return {
        "model": "quicksilver",
        "messages": messages,
        "tools": tools,
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def tool_turn(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant's tool call and the tool's (fixed) answer, as the next messages."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"] or "call_0",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": call["arguments"] or "{}",
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call["id"] or "call_0",
            "content": json.dumps({"value": 42}),
        },
    ]


async def agent_loop(
    url: str, turns: int, seed: int, max_tokens: int, served: list[Result] | None = None
) -> tuple[list[float], list[str]]:
    """A tool-calling conversation resent in full every turn: seconds per turn (NaN for a failed turn)
    and the errors (each turn's ``Result`` is appended to ``served`` when given). Kept compact (short system prompt and tool results) so that five turns fit a
    384-token context (the v1 embedded model's)."""
    import httpx

    task = get_task("tool_call")
    items = [it for it in task.test_items(turns + 4, seed) if it.stratum == "call"]
    tools = items[0].tools or []
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."}]
    times: list[float] = []
    errors: list[str] = []

    async def turn(client: httpx.AsyncClient) -> Result:
        r = await stream_chat(client, url, turn_body(messages, tools, max_tokens), None)
        times.append(r.e2e if r.ok else float("nan"))
        errors.extend([r.error] if not r.ok else [])
        if served is not None:
            served.append(r)
        return r

    async with httpx.AsyncClient(timeout=120) as client:
        k = 0
        while len(times) < turns:
            it = items[k % len(items)]
            k += 1
            user = next(
                (m for m in (it.messages or []) if m["role"] == "user"), {"content": "hello"}
            )
            messages.append({"role": "user", "content": user["content"]})
            r = await turn(client)
            if r.tool_calls and len(times) < turns:
                messages.extend(tool_turn(r.tool_calls[0]))
                r2 = await turn(client)
                messages.append({"role": "assistant", "content": r2.content})
            else:
                messages.append({"role": "assistant", "content": r.content})
    return times[:turns], errors


def print_levels(report: dict[str, Any], path: str) -> None:
    """The table of latencies and throughput per concurrency level."""
    print_table(
        f"bench serve — streamed completions on {path}, Poisson arrivals",
        [
            "concurrency",
            "requests",
            "failed",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "ITL p50 ms",
            "ITL p99 ms",
            "e2e p50 s",
            "e2e p99 s",
            "agg tok/s",
            "× c=1",
        ],
        [
            [
                lv["concurrency"],
                lv["requests"],
                lv["failed"],
                lv["ttft_p50_ms"],
                lv["ttft_p99_ms"],
                lv["itl_p50_ms"],
                lv["itl_p99_ms"],
                lv["e2e_p50_s"],
                lv["e2e_p99_s"],
                lv["aggregate_tok_s"],
                lv["speedup_vs_concurrency_1"],
            ]
            for lv in report["levels"]
        ],
    )


def agent_loop_report(args: argparse.Namespace) -> dict[str, Any]:
    """``--agent-turns``: the agent loop's seconds per turn with and without the prefix cache."""
    loop: dict[str, list[float]] = {}
    loop_errors: list[str] = []
    for label, flags in (("prefix_cache", []), ("no_prefix_cache", ["--prefix-cache-mb=0"])):
        with launch_server(args.model, flags, revision=args.revision) as url:
            # warm-up
            asyncio.run(agent_loop(url, 2, args.seed + 99, args.agent_max_tokens))
            runs = []
            # the same conversation again: median per turn
            for _ in range(max(1, args.agent_repeats)):
                times, errs = asyncio.run(
                    agent_loop(url, args.agent_turns, args.seed, args.agent_max_tokens)
                )
                runs.append(times)
                loop_errors += errs
            loop[label] = [median(list(ts)) for ts in zip(*runs)]
    on, off = sum(loop["prefix_cache"]), sum(loop["no_prefix_cache"])
    print_table(
        "agent loop — seconds per turn",
        ["turn", "prefix cache", "no prefix cache"],
        [
            [i + 1, a, b]
            for i, (a, b) in enumerate(zip(loop["prefix_cache"], loop["no_prefix_cache"]))
        ],
    )
    return {
        "turns": args.agent_turns,
        "repeats": args.agent_repeats,
        "max_tokens": args.agent_max_tokens,
        "seconds_per_turn": loop,
        "total_s": {"prefix_cache": on, "no_prefix_cache": off},
        "time_cut": 1 - on / off if off else float("nan"),
        "errors": sorted(set(loop_errors))[:3],
    }


def run_serve_bench(args: argparse.Namespace) -> int:
    levels = [int(x) for x in (args.concurrency or "1,4,16,64").split(",") if x]
    rate = float(args.rate)
    path = ROUTES[args.route][0]
    extra = [f"--max-batch={max(levels)}"] if not args.url else []
    report: dict[str, Any] = {
        "bench": "serve",
        "route": path,
        "levels": [],
        "arrival_rate_per_s": args.rate,
        "max_tokens": args.max_tokens,
        "date": datetime.date.today().isoformat(),
        "hardware": hardware(),
    }
    ctx = (
        contextlib.nullcontext(args.url)
        if args.url
        else launch_server(args.model, extra, revision=args.revision)
    )
    with ctx as url:
        for c in levels:
            n = min(args.max_requests, max(args.min_requests, 2 * c))
            bodies = chat_bodies(n, args.seed + c, args.max_tokens, args.route)
            results, wall = asyncio.run(
                run_level(url, bodies, c, rate, args.time_limit, args.api_key, args.seed, path)
            )
            report["levels"].append(level_summary(results, wall, c))
    base = report["levels"][0]["aggregate_tok_s"] if report["levels"] else float("nan")
    for lv in report["levels"]:
        lv["speedup_vs_concurrency_1"] = lv["aggregate_tok_s"] / base if base else float("nan")
    print_levels(report, path)
    if args.agent_turns and not args.url and args.route == "chat":
        report["agent_loop"] = agent_loop_report(args)
    _plot(report, Path(args.out))
    report["plot"] = str(Path(args.out) / "serve.png")
    emit_json(report)
    return 0


def _plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = report["levels"]
    c = [x["concurrency"] for x in lv]
    fig, ax = plt.subplots(1, 3 if "agent_loop" in report else 2, figsize=(13, 3.8))
    ax[0].plot(c, [x["aggregate_tok_s"] for x in lv], "o-")
    ax[0].set(
        xscale="log", xlabel="concurrency", ylabel="aggregate output tok/s", title="throughput"
    )
    ax[1].plot(c, [x["ttft_p50_ms"] for x in lv], "o-", label="TTFT p50")
    ax[1].plot(c, [x["e2e_p50_s"] * 1000 for x in lv], "s-", label="e2e p50")
    ax[1].set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title="latency")
    ax[1].legend()
    count_ticks(ax[0], c)
    count_ticks(ax[1], c)
    if "agent_loop" in report:
        al = report["agent_loop"]["seconds_per_turn"]
        for k, v in al.items():
            ax[2].plot(range(1, len(v) + 1), v, "o-", label=k)
        ax[2].set(xlabel="turn", ylabel="seconds", title="agent loop")
        count_ticks(ax[2], range(1, max(len(v) for v in al.values()) + 1))
        ax[2].legend()
    save_figure(fig, out / "serve.png")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint to serve (default: the embedded model)")
    add_revision_arg(p)
    p.add_argument("--url", help="benchmark an already running server instead of starting one")
    p.add_argument("--api-key", dest="api_key", help="API key of a running server")
    p.add_argument(
        "--concurrency",
        help="comma-separated concurrency levels (default 1,4,16,64; with --vs-llama-cpp 1,8,32)",
    )
    p.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        dest="vs_llama_cpp",
        help="quicksilver with no flags and its twin against llama.cpp's llama-server (make "
        "llama-server) on the same prompts, interleaved (bench/serve_vs.py)",
    )
    p.add_argument("--prompts", type=int, default=40, help="with --vs-llama-cpp: distinct prompts")
    p.add_argument("--repeats", type=int, default=3, help="with --vs-llama-cpp: runs of each level")
    p.add_argument(
        "--rate",
        default="32",
        help="Poisson arrival rate per second (inf: all at once, as fast as the "
        "concurrency cap allows)",
    )
    p.add_argument("--min-requests", type=int, default=32, dest="min_requests")
    p.add_argument("--max-requests", type=int, default=128, dest="max_requests")
    p.add_argument(
        "--time-limit", type=float, default=300.0, dest="time_limit", help="seconds per level"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        dest="max_tokens",
        help="max_tokens of each request (default: 96 on chat; on apply and edit the task's "
        "answer budget, so that a whole file is written)",
    )
    p.add_argument(
        "--route",
        choices=sorted(ROUTES),
        default="chat",
        help="chat: /v1/chat/completions on the suite's chat tasks (default); apply: "
        "/v1/apply/completions on apply_edit; edit: /v1/edit/completions on next_edit",
    )
    p.add_argument(
        "--agent-turns", type=int, default=5, dest="agent_turns", help="0 skips the agent loop"
    )
    p.add_argument(
        "--agent-max-tokens",
        type=int,
        default=48,
        dest="agent_max_tokens",
        help="max_tokens of each agent-loop turn",
    )
    p.add_argument(
        "--agent-repeats",
        type=int,
        default=3,
        dest="agent_repeats",
        help="times the agent conversation is replayed (median per turn)",
    )
    p.add_argument(
        "--replicas",
        help="comma-separated replica counts (e.g. 1,2): each level on `serve --replicas N` "
        "(Ray Serve), and the agent loop on the largest with prefix vs random routing",
    )
    p.add_argument(
        "--conversations",
        type=int,
        default=4,
        help="agent conversations run at once in the routing comparison (--replicas)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench_serve")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
