"""``quicksilver bench serve --replicas 1,2``: the load levels on Ray Serve replicas, and the agent
loop with prefix-cache-aware against random routing.

For each replica count the server runs as ``serve --replicas N --threads 1`` (one engine thread
per replica; on a 2-core machine two replicas use both cores, one replica one core) and the same
Poisson load levels as ``bench serve`` run against it. Then, on the largest count, several agent
conversations run at once (``--conversations``), each resent in full every turn, once with
``--routing prefix`` and once with ``--routing random``: seconds per turn (median over the
conversations), the prefix-cache hit rate (cached / prompt tokens, from each reply's usage) and
how many replicas each conversation touched. Ends with one JSON line and writes a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
from pathlib import Path
from typing import Any

from ..figures import save_figure
from .common import count_ticks, emit_json, hardware, median, print_table
from .serve import Result, agent_loop, chat_bodies, launch_server, level_summary, run_level

RAY_START_S = 300.0  # Ray, the proxy and N model replicas on a busy 2-core machine


def _replica_flags(n: int, routing: str, max_batch: int) -> list[str]:
    return [
        "--replicas",
        str(n),
        "--threads",
        "1",
        "--routing",
        routing,
        f"--max-batch={max_batch}",
    ]


def _levels(args: argparse.Namespace, url: str, levels: list[int]) -> list[dict[str, Any]]:
    out = []
    for c in levels:
        n = min(args.max_requests, max(args.min_requests, 2 * c))
        bodies = chat_bodies(n, args.seed + c, args.max_tokens)
        results, wall = asyncio.run(
            run_level(url, bodies, c, float(args.rate), args.time_limit, args.api_key, args.seed)
        )
        out.append(level_summary(results, wall, c))
    return out


async def _conversations(url: str, k: int, turns: int, seed: int, max_tokens: int) -> list[Any]:
    async def one(i: int) -> tuple[list[float], list[Result]]:
        served: list[Result] = []
        times, _ = await agent_loop(url, turns, seed + 1000 * i, max_tokens, served)
        return times, served

    return list(await asyncio.gather(*(one(i) for i in range(k))))


def routing_summary(runs: list[tuple[list[float], list[Result]]]) -> dict[str, Any]:
    """Per-turn median seconds, the hit rate and the replicas per conversation of one routing."""
    per_turn = [median(list(ts)) for ts in zip(*(times for times, _ in runs))]
    served = [r for _, rs in runs for r in rs if r.ok]
    prompt = sum(r.prompt_tokens for r in served)
    return {
        "seconds_per_turn": per_turn,
        "total_s": sum(per_turn),
        "hit_rate": sum(r.cached_tokens for r in served) / prompt if prompt else float("nan"),
        "replicas_per_conversation": median(
            [float(len({r.replica for r in rs if r.ok})) for _, rs in runs]
        ),
        "failed": sum(1 for _, rs in runs for r in rs if not r.ok),
        "errors": sorted({r.error for _, rs in runs for r in rs if not r.ok})[:3],
    }


def run_replicas_bench(args: argparse.Namespace) -> int:
    counts = [int(x) for x in args.replicas.split(",") if x]
    levels = [int(x) for x in args.concurrency.split(",") if x]
    report: dict[str, Any] = {
        "bench": "serve_replicas",
        "replicas": counts,
        "arrival_rate_per_s": args.rate,
        "max_tokens": args.max_tokens,
        "date": datetime.date.today().isoformat(),
        "hardware": hardware(),
        "levels": [],
    }
    for n in counts:
        flags = _replica_flags(n, "prefix", max(levels))
        with launch_server(args.model, flags, timeout=RAY_START_S, revision=args.revision) as url:
            report["levels"] += [{"replicas": n, **lv} for lv in _levels(args, url, levels)]
    print_table(
        "bench serve --replicas — streamed chat completions on Ray Serve, Poisson arrivals",
        ["replicas", "concurrency", "requests", "failed", "TTFT p50 ms", "e2e p50 s", "agg tok/s"],
        [
            [lv["replicas"], lv["concurrency"], lv["requests"], lv["failed"], lv["ttft_p50_ms"]]
            + [lv["e2e_p50_s"], lv["aggregate_tok_s"]]
            for lv in report["levels"]
        ],
    )
    if args.agent_turns and max(counts) > 1:
        routing: dict[str, Any] = {}
        for policy in ("prefix", "random"):
            flags = _replica_flags(max(counts), policy, 16)
            with launch_server(
                args.model, flags, timeout=RAY_START_S, revision=args.revision
            ) as url:
                asyncio.run(agent_loop(url, 2, args.seed + 99, args.agent_max_tokens))  # warm-up
                runs = asyncio.run(
                    _conversations(
                        url, args.conversations, args.agent_turns, args.seed, args.agent_max_tokens
                    )
                )
            routing[policy] = routing_summary(runs)
        report["agent_loop"] = {
            "replicas": max(counts),
            "conversations": args.conversations,
            "turns": args.agent_turns,
            "max_tokens": args.agent_max_tokens,
            "routing": routing,
        }
        print_table(
            f"agent loop — {args.conversations} conversations at once on {max(counts)} replicas",
            ["routing", "total s (median turns)", "hit rate", "replicas / conversation", "failed"],
            [
                [k, v["total_s"], v["hit_rate"], v["replicas_per_conversation"], v["failed"]]
                for k, v in routing.items()
            ],
        )
    _plot(report, Path(args.out))
    report["plot"] = str(Path(args.out) / "serve_replicas.png")
    emit_json(report)
    return 0


def _plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    for n in report["replicas"]:
        lv = [x for x in report["levels"] if x["replicas"] == n]
        ax[0].plot([x["concurrency"] for x in lv], [x["aggregate_tok_s"] for x in lv], "o-")
        ax[0].lines[-1].set_label(f"{n} replica(s)")
    ax[0].set(
        xscale="log", xlabel="concurrency", ylabel="aggregate output tok/s", title="throughput"
    )
    count_ticks(ax[0], sorted({x["concurrency"] for x in report["levels"]}))
    ax[0].legend()
    turns = 0
    for k, v in report.get("agent_loop", {}).get("routing", {}).items():
        turns = max(turns, len(v["seconds_per_turn"]))
        ax[1].plot(range(1, len(v["seconds_per_turn"]) + 1), v["seconds_per_turn"], "o-", label=k)
    ax[1].set(xlabel="turn", ylabel="seconds (median)", title="agent loop routing")
    count_ticks(ax[1], range(1, turns + 1))
    ax[1].legend()
    save_figure(fig, out / "serve_replicas.png")
