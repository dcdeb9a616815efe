"""``bench serve --vs-llama-cpp`` and ``bench agents``: quicksilver against llama.cpp's own server.

serve --vs-llama-cpp: held-out suite prompts (five tasks, the chat template applied) to every server
of ``peers.launch_peers`` at each concurrency (default 1, 8, 32), levels interleaved across servers
and repeated (medians); per server and level the per-request tok/s, TTFT p50/p99 and aggregate
tok/s; replies compared between servers and, per server, under load against its own replies at
concurrency 1 (batch invariance).

agents (in the manner of Artificial Analysis' AgentPerf): N agents at once, each replaying
multi-turn tool-calling episodes (the suite's ``tool_loop`` conversations: a call, its result, an
answer, a second call, its result, a second answer); every turn resends the whole conversation so
far. N ramps (1, 2, 4, ...) while the service level objective holds: TTFT p95 within ``--slo-ttft-ms``
and the median turn's output tok/s at least ``--slo-tok-s``. Reported per server and N: per-turn
latency p50/p95, tok/s, prefix-cache hit rate, and the largest N within the SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
from pathlib import Path
from typing import Any

from ..assets import resolve_model
from ..cli_util import add_revision_arg
from ..figures import save_figure
from ..models.checkpoint import load_tokenizer
from ..suite.render import prompt_text
from ..suite.tasks import get_task
from ..suite.tasks.base import Item
from ..tokenizer import Tokenizer
from .common import count_ticks, emit_json, hardware, print_table
from .peers import Completion, Level, Peer, complete, launch_peers, run_level, summary
from .serve import percentile

PROMPT_TASKS = ("chat", "multiply", "countdown3", "path_star", "tool_call")


def suite_prompts(tok: Tokenizer, n: int, seed: int) -> list[list[int]]:
    """``n`` held-out prompts, the five tasks in turn, as token ids through the chat template."""
    per = n // len(PROMPT_TASKS) + 1
    items = [get_task(t).test_items(per, seed, phrasing="held-out") for t in PROMPT_TASKS]
    mixed = [it for group in zip(*items) for it in group][:n]
    return [tok.encode(prompt_text(it, tok, instant=False)) for it in mixed]


def interleaved(
    peers: list[Peer], prompts: list[list[int]], c: int, repeats: int, max_tokens: int
) -> dict[str, list[Level]]:
    """Each server runs the level ``repeats`` times, the servers taking turns (order rotated)."""
    out: dict[str, list[Level]] = {p.label: [] for p in peers}
    for r in range(repeats):
        for p in peers[r % len(peers) :] + peers[: r % len(peers)]:
            out[p.label].append(asyncio.run(run_level(p, prompts, c, max_tokens)))
    return out


def same(a: Completion, b: Completion) -> bool:
    return a.ok and b.ok and a.text == b.text


def run_vs_llama_cpp(args: argparse.Namespace) -> int:
    levels = [int(x) for x in (args.concurrency or "1,8,32").split(",") if x]
    tok = load_tokenizer(resolve_model(args.model, revision=args.revision))
    base = suite_prompts(tok, args.prompts, args.seed)
    report: dict[str, Any] = {
        "bench": "serve_vs_llama_cpp",
        "prompts": len(base),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "date": datetime.date.today().isoformat(),
        "hardware": hardware(),
        "levels": [],
    }
    with launch_peers(max(levels), llama=True, model=args.model, revision=args.revision) as peers:
        for p in peers:  # first requests (connections, the servers' own warm-up) are not timed
            asyncio.run(run_level(p, base[:4], 2, 8))
        alone: dict[str, list[Completion]] = {}
        for c in levels:
            prompts = (base * (4 * c // len(base) + 1))[: max(len(base), 4 * c)]
            runs = interleaved(peers, prompts, c, args.repeats, args.max_tokens)
            row: dict[str, Any] = {"concurrency": c}
            for label, lvls in runs.items():
                s = summary(lvls, c)
                first = lvls[0].done
                alone.setdefault(label, first)
                ref = alone[label]
                s["identical_to_c1"] = sum(same(ref[i % len(ref)], x) for i, x in enumerate(first))
                s["compared_to_c1"] = len(first)
                row[label] = s
            row["identical_quicksilver_vs_llama"] = sum(
                map(same, runs["quicksilver"][0].done, runs["llama-server"][0].done)
            )
            if "quicksilver-ar" in runs:
                row["identical_twin_vs_llama"] = sum(
                    map(same, runs["quicksilver-ar"][0].done, runs["llama-server"][0].done)
                )
            qs, ll = row["quicksilver"], row["llama-server"]
            row["ratio_tok_s_per_request"] = (
                qs["tok_s_per_request_p50"] / ll["tok_s_per_request_p50"]
            )
            row["ratio_aggregate"] = qs["aggregate_tok_s"] / ll["aggregate_tok_s"]
            report["levels"].append(row)
    labels = [k for k in report["levels"][0] if isinstance(report["levels"][0][k], dict)]
    print_table(
        "bench serve --vs-llama-cpp — streamed /v1/completions, greedy, one thread per server",
        [
            "c",
            "server",
            "tok/s per req p50",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "agg tok/s",
            "same as c=1",
        ],
        [
            [
                lv["concurrency"],
                k,
                lv[k]["tok_s_per_request_p50"],
                lv[k]["ttft_p50_ms"],
                lv[k]["ttft_p99_ms"],
                lv[k]["aggregate_tok_s"],
                f"{lv[k]['identical_to_c1']}/{lv[k]['compared_to_c1']}",
            ]
            for lv in report["levels"]
            for k in labels
        ],
    )
    _plot_levels(report, labels, Path(args.out))
    report["plot"] = str(Path(args.out) / "serve_vs_llama_cpp.png")
    emit_json(report)
    return 0


def _plot_levels(report: dict[str, Any], labels: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = report["levels"]
    c = [x["concurrency"] for x in lv]
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    for k in labels:
        ax[0].plot(c, [x[k]["tok_s_per_request_p50"] for x in lv], "o-", label=k)
        ax[1].plot(c, [x[k]["aggregate_tok_s"] for x in lv], "o-", label=k)
        ax[2].plot(c, [x[k]["ttft_p50_ms"] for x in lv], "o-", label=k)
    ax[0].set(xscale="log", xlabel="concurrent clients", ylabel="tok/s", title="per request (p50)")
    ax[1].set(xscale="log", xlabel="concurrent clients", ylabel="tok/s", title="aggregate")
    ax[2].set(
        xscale="log", yscale="log", xlabel="concurrent clients", ylabel="ms", title="TTFT p50"
    )
    for a in ax:
        count_ticks(a, c)
        a.legend(fontsize=8)
    fig.suptitle(f"same weights, one thread per server — {report['hardware'].get('cpu', '')}")
    save_figure(fig, out / "serve_vs_llama_cpp.png")


# ---- agents ----------------------------------------------------------------------------------


def episodes(tok: Tokenizer, n: int, seed: int) -> list[list[list[int]]]:
    """``n`` tool_loop conversations as the prompts of their assistant turns, in order (each the
    whole conversation so far, the recorded replies and tool results included)."""
    items = [
        it
        for it in get_task("tool_loop").test_items(4 * n, seed, phrasing="held-out")
        if it.stratum == "second_answer"
    ][:n]
    out = []
    for it in items:
        msgs = it.messages or []
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"] + [len(msgs)]
        out.append([_prompt(tok, it, msgs[:i]) for i in turns])
    return out


def _prompt(tok: Tokenizer, item: Item, messages: list[dict[str, Any]]) -> list[int]:
    return tok.encode(
        tok.apply_chat_template(messages, tools=item.tools, add_generation_prompt=True)
    )


async def agents_level(
    peer: Peer, eps: list[list[list[int]]], n: int, per_agent: int, max_tokens: int
) -> list[Completion]:
    """``n`` agents at once, each replaying ``per_agent`` episodes turn by turn."""
    import httpx

    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:

        async def agent(a: int) -> list[Completion]:
            done = []
            for e in range(per_agent):
                for prompt in eps[(a * per_agent + e) % len(eps)]:
                    done.append(await complete(client, peer, prompt, max_tokens))
            return done

        return [c for turns in await asyncio.gather(*(agent(a) for a in range(n))) for c in turns]


def agents_summary(done: list[Completion], prompt_tokens: int, n: int) -> dict[str, Any]:
    ok = [c for c in done if c.ok and c.tokens]
    return {
        "agents": n,
        "turns": len(done),
        "failed": sum(not c.ok for c in done),
        "ttft_p50_ms": 1000 * percentile([c.ttft for c in ok], 0.5),
        "ttft_p95_ms": 1000 * percentile([c.ttft for c in ok], 0.95),
        "turn_p50_ms": 1000 * percentile([c.e2e for c in ok], 0.5),
        "turn_p95_ms": 1000 * percentile([c.e2e for c in ok], 0.95),
        "tok_s_p50": percentile([c.tok_s for c in ok], 0.5),
        "prefix_cache_hit_rate": sum(c.cached for c in done) / prompt_tokens
        if prompt_tokens
        else 0,
    }


def run_agents(args: argparse.Namespace) -> int:
    tok = load_tokenizer(resolve_model(args.model, revision=args.revision))
    eps = episodes(tok, args.episodes, args.seed)
    ramp = [int(x) for x in args.agents.split(",") if x]
    report: dict[str, Any] = {
        "bench": "agents",
        "slo": {"ttft_p95_ms": args.slo_ttft_ms, "tok_s_p50": args.slo_tok_s},
        "episodes": len(eps),
        "turns_per_episode": len(eps[0]),
        "max_tokens": args.max_tokens,
        "date": datetime.date.today().isoformat(),
        "hardware": hardware(),
        "servers": {},
    }
    peers_at = launch_peers(
        max(ramp), llama=not args.no_llama_cpp, model=args.model, revision=args.revision
    )
    with peers_at as peers:
        for p in peers:
            asyncio.run(agents_level(p, eps, 1, 1, 8))  # connections and first shapes, not timed
        live = {p.label: p for p in peers}
        for n in ramp:
            for p in list(live.values()):
                done = asyncio.run(agents_level(p, eps, n, args.per_agent, args.max_tokens))
                sent = sum(
                    len(prompt)
                    for a in range(n)
                    for e in range(args.per_agent)
                    for prompt in eps[(a * args.per_agent + e) % len(eps)]
                )
                s = agents_summary(done, sent, n)
                s["within_slo"] = (
                    s["failed"] == 0
                    and s["ttft_p95_ms"] <= args.slo_ttft_ms
                    and s["tok_s_p50"] >= args.slo_tok_s
                )
                report["servers"].setdefault(p.label, {"levels": []})["levels"].append(s)
                if not s["within_slo"]:
                    del live[p.label]  # past its SLO: the ramp stops for this server
    for r in report["servers"].values():
        r["max_agents_within_slo"] = max(
            (lv["agents"] for lv in r["levels"] if lv["within_slo"]), default=0
        )
    s = report["servers"]
    best = s["quicksilver"]["max_agents_within_slo"]
    for other in ("quicksilver-ar", "llama-server"):
        if other in s and s[other]["max_agents_within_slo"]:
            report[f"ratio_vs_{other}"] = best / s[other]["max_agents_within_slo"]
    print_table(
        f"bench agents — SLO TTFT p95 <= {args.slo_ttft_ms} ms, >= {args.slo_tok_s} tok/s a turn",
        [
            "server",
            "agents",
            "TTFT p50",
            "TTFT p95",
            "turn p95 ms",
            "tok/s p50",
            "cache hits",
            "SLO",
        ],
        [
            [
                k,
                lv["agents"],
                lv["ttft_p50_ms"],
                lv["ttft_p95_ms"],
                lv["turn_p95_ms"],
                lv["tok_s_p50"],
                lv["prefix_cache_hit_rate"],
                "yes" if lv["within_slo"] else "no",
            ]
            for k, r in s.items()
            for lv in r["levels"]
        ],
    )
    _plot_agents(report, Path(args.out))
    report["plot"] = str(Path(args.out) / "agents.png")
    emit_json(report)
    return 0


def _plot_agents(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ramp = sorted({lv["agents"] for r in report["servers"].values() for lv in r["levels"]})
    for k, r in report["servers"].items():
        n = [lv["agents"] for lv in r["levels"]]
        ax[0].plot(n, [lv["ttft_p95_ms"] for lv in r["levels"]], "o-", label=k)
        ax[1].plot(n, [lv["tok_s_p50"] for lv in r["levels"]], "o-", label=k)
    ax[0].axhline(report["slo"]["ttft_p95_ms"], color="grey", ls="--", label="SLO")
    ax[1].axhline(report["slo"]["tok_s_p50"], color="grey", ls="--", label="SLO")
    ax[0].set(xscale="log", yscale="log", xlabel="concurrent agents", ylabel="ms", title="TTFT p95")
    ax[1].set(
        xscale="log", xlabel="concurrent agents", ylabel="tok/s", title="output tok/s a turn (p50)"
    )
    for a in ax:
        count_ticks(a, ramp)
        a.legend(fontsize=8)
    save_figure(fig, out / "agents.png")


def add_agents_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint to serve (default: the embedded model and its twin)")
    add_revision_arg(p)
    p.add_argument("--agents", default="1,2,4,8,16,32", help="the ramp of concurrent agents")
    p.add_argument("--episodes", type=int, default=16, help="distinct tool_loop conversations")
    p.add_argument("--per-agent", type=int, default=2, dest="per_agent", help="episodes per agent")
    p.add_argument("--max-tokens", type=int, default=64, dest="max_tokens")
    p.add_argument("--slo-ttft-ms", type=float, default=100.0, dest="slo_ttft_ms")
    p.add_argument("--slo-tok-s", type=float, default=200.0, dest="slo_tok_s")
    p.add_argument(
        "--no-llama-cpp", action="store_true", dest="no_llama_cpp", help="quicksilver only"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench_agents")
