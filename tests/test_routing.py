"""Prefix-cache-aware routing (server/routing.py), without Ray: a conversation's turns map to the
replica that served the earlier turns, different conversations go to the least loaded replica, and
a swamped cache holder is skipped."""

from __future__ import annotations

import json
from typing import Any

from quicksilver.server.scale.routing import (
    BLOCK_CHARS,
    PrefixTable,
    block_hashes,
    prefer,
    prompt_text,
    route_key,
)

CHAT = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def _body(messages: list[Any]) -> bytes:
    return json.dumps({"model": "quicksilver", "tools": TOOLS, "messages": messages}).encode()


def _turns(topic: str) -> list[bytes]:
    msgs: list[Any] = [{"role": "user", "content": f"Tell me about {topic}, step by step, please."}]
    out = [_body(msgs)]
    for i in range(3):
        msgs = [
            *msgs,
            {"role": "assistant", "content": f"reply {i}"},
            {"role": "user", "content": "more"},
        ]
        out.append(_body(msgs))
    return out


def test_keys_are_cumulative_whole_block_hashes() -> None:
    text = "a" * (3 * BLOCK_CHARS + 5)
    keys = block_hashes(text)
    assert len(keys) == 3  # whole blocks only
    assert block_hashes(text[: 2 * BLOCK_CHARS]) == keys[:2]
    assert block_hashes("b" + text[1:])[0] != keys[0]
    assert route_key(CHAT, b"not json") == [] and route_key("/metrics", b"") == []


def test_a_later_turn_extends_the_earlier_turns_key() -> None:
    turns = _turns("lighthouses")
    k0, k3 = route_key(CHAT, turns[0]), route_key(CHAT, turns[3])
    assert len(k3) > len(k0) > 0 and k3[: len(k0)] == k0
    (h0, c0), (h3, c3) = prompt_text(CHAT, turns[0]), prompt_text(CHAT, turns[3])
    assert h0 == h3 and c3.startswith(c0)
    # field order in the JSON body does not matter
    flipped = json.dumps(
        {"messages": json.loads(turns[0])["messages"], "tools": TOOLS, "model": "quicksilver"}
    )
    assert route_key(CHAT, flipped.encode()) == k0


def test_turns_stick_and_conversations_spread() -> None:
    table, loads = PrefixTable(), {"r0": 0, "r1": 0}
    where: dict[str, set[str]] = {}
    for i, topic in enumerate(["lighthouses", "volcanoes", "glaciers", "comets"]):
        for body in _turns(topic):
            key = route_key(CHAT, body)
            chosen = prefer(table, key, loads)
            if chosen is None:  # the least loaded replica (the test alternates them)
                chosen = f"r{i % 2}"
            table.record(key, chosen)
            where.setdefault(topic, set()).add(str(chosen))
    assert all(len(v) == 1 for v in where.values())
    assert set().union(*where.values()) == {"r0", "r1"}


def test_dead_or_swamped_holders_are_skipped() -> None:
    table = PrefixTable()
    key = route_key(CHAT, _turns("comets")[2])
    table.record(key, "r0")
    assert prefer(table, key, {"r0": 1, "r1": 0}) == "r0"
    assert prefer(table, key, {"r0": 9, "r1": 0}, imbalance=4) is None  # too busy: spread
    assert prefer(table, key, {"r1": 0}) is None  # r0 is gone
    assert prefer(table, route_key(CHAT, _turns("comets")[0]), {"r0": 0, "r1": 0}) == "r0"


def test_a_shared_head_alone_does_not_glue_conversations() -> None:
    system = {"role": "system", "content": "You are an agent. " * 40}
    a = route_key(
        CHAT, _body([system, {"role": "user", "content": "Plan a trip to Oslo, please."}])
    )
    b = route_key(
        CHAT, _body([system, {"role": "user", "content": "Plan a trip to Rome, please."}])
    )
    assert a and b and not set(a) & set(b)
    assert route_key(CHAT, _body([system])) == []  # nothing but the head: least loaded


def test_the_table_is_bounded() -> None:
    table = PrefixTable(capacity=5)
    table.record([f"k{i}" for i in range(8)], "r0")
    assert len(table) == 5 and table.longest(["k0"], {"r0"}) == (None, 0)


def test_bench_routing_summary() -> None:
    from quicksilver.bench.serve import Result
    from quicksilver.bench.serve_replicas import routing_summary

    def res(replica: str, cached: int) -> Result:
        return Result(ok=True, prompt_tokens=100, cached_tokens=cached, replica=replica)

    runs = [
        ([1.0, 2.0], [res("a", 0), res("a", 80)]),
        ([3.0, 4.0], [res("a", 0), res("b", 0), Result(ok=False)]),
    ]
    s = routing_summary(runs)
    assert s["seconds_per_turn"] == [2.0, 3.0] and s["total_s"] == 5.0
    assert s["hit_rate"] == 0.2 and s["failed"] == 1
    assert s["replicas_per_conversation"] == 1.5
