"""Task suite: every verifier accepts right answers (including alternative valid ones) and rejects
wrong ones; train and test splits are disjoint by each task's rule; generation is deterministic."""

from __future__ import annotations

import json
import random

import pytest

from quicksilver.suite.tasks import TASKS, get_task, split_reply
from quicksilver.suite.tasks.arith import eval_expression
from quicksilver.suite.tasks.sudoku4 import all_grids, is_valid, render
from quicksilver.suite.tasks.tool_call import parse_tool_calls

N = 150


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reference_answers_verify(name: str) -> None:
    task = TASKS[name]
    rng = random.Random(0)
    for split in ("train", "test"):
        for _ in range(N):
            item = task.sample(rng, split)
            assert task.verify(item, item.answer), (name, item)
            assert item.stratum in task.strata


def _mutations(name: str, answer: str) -> list[str]:
    """Wrong replies derived from a right one."""
    out = ["", "garbage", answer + "9", answer[:-1]]
    digits = [i for i, c in enumerate(answer) if c.isdigit()]
    if digits:
        i = digits[len(digits) // 2]
        out.append(answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :])
    return out


@pytest.mark.parametrize("name", sorted(TASKS))
def test_verifiers_reject_wrong_answers(name: str) -> None:
    task = TASKS[name]
    rng = random.Random(1)
    for _ in range(60):
        item = task.sample(rng, "test")
        for wrong in _mutations(name, item.answer):
            if wrong == item.answer:
                continue
            if name.startswith("countdown") and task.verify(item, wrong):
                continue  # a mutation can still be a valid expression by chance; checked below
            if (
                name.startswith("tool_")
                and item.stratum.endswith("answer")
                and task.verify(item, wrong)
            ):
                continue  # appending to a reply that quotes every value is still a right reply
            assert not task.verify(item, wrong), (name, item.answer, wrong)


def test_countdown_accepts_other_solutions_and_checks_numbers() -> None:
    task = get_task("countdown3")
    item = task.sample(random.Random(2), "train")
    item.data = {"numbers": [45, 12, 7], "target": 64}
    assert task.verify(item, "(45+12)+7")
    assert task.verify(item, "7+(12+45)")  # another valid expression
    assert task.verify(item, "45+12+7")
    assert not task.verify(item, "45+12+7+0")  # a number not given
    assert not task.verify(item, "45+19")  # 19 is not given / numbers missing
    assert not task.verify(item, "(45+12)*7")  # wrong value
    assert not task.verify(item, "45/0+64")
    assert eval_expression("(3+4)*2") is not None and eval_expression("(3+4") is None


def test_sudoku_accepts_any_valid_completion() -> None:
    task = get_task("sudoku4")
    assert len(all_grids()) == 288
    g1 = all_grids()[0]
    # blank everything: every valid grid is a right answer, an invalid one is not
    item = task.sample(random.Random(3), "train")
    item.data = {"puzzle": [0] * 16}
    assert task.verify(item, render(g1)) and task.verify(item, render(all_grids()[7]))
    bad = list(g1)
    bad[0], bad[1] = bad[1], bad[0]
    assert not is_valid(bad) and not task.verify(item, render(bad))
    # givens must be kept
    item.data = {"puzzle": list(g1[:8]) + [0] * 8}
    others = [g for g in all_grids() if g[:8] == g1[:8] and g != g1]
    assert all(task.verify(item, render(g)) for g in others)
    assert not any(task.verify(item, render(g)) for g in all_grids() if g[:8] != g1[:8])


def test_path_star_checks_edges() -> None:
    task = get_task("path_star")
    item = task.sample(random.Random(4), "test")
    nodes = item.answer.split(">")
    assert not task.verify(item, ">".join(nodes[:1] + nodes[2:]))  # skips an edge
    assert not task.verify(item, ">".join(reversed(nodes)))
    assert not task.verify(item, item.answer.replace(">", ","))


def test_tool_call_parsing_and_argument_order() -> None:
    task = get_task("tool_call")
    rng = random.Random(5)
    item = next(
        it
        for it in (task.sample(rng, "test") for _ in range(50))
        if it.stratum == "call" and len(it.data["call"]["arguments"]) == 2
    )
    call = item.data["call"]
    swapped = {"name": call["name"], "arguments": dict(reversed(list(call["arguments"].items())))}
    assert task.verify(
        item, "<tool_call>" + json.dumps(swapped) + "</tool_call>"
    )  # key order is free
    wrong = {"name": call["name"] + "x", "arguments": call["arguments"]}
    assert not task.verify(item, "<tool_call>" + json.dumps(wrong) + "</tool_call>")
    assert not task.verify(item, '<tool_call>{"name": </tool_call>')
    assert parse_tool_calls("<tool_call>{bad json}</tool_call>") is None
    assert not task.verify(item, item.answer + item.answer)  # exactly one call


@pytest.mark.parametrize(
    "name,key",
    [
        (
            "path_star",
            lambda it: (it.data["start"], it.data["goal"], tuple(map(tuple, it.data["edges"]))),
        ),
        ("sudoku4", lambda it: tuple(v == 0 for v in it.data["puzzle"])),
        ("countdown3", lambda it: it.data["target"]),
        ("multiply", lambda it: (it.data["a"], it.data["b"])),
        (
            "tool_call",
            lambda it: (
                it.answer.split('"name": "')[1].split('"')[0] if it.stratum == "call" else None
            ),
        ),
        ("chat", lambda it: it.messages[0]["content"].lower()),
        ("fim", lambda it: it.raw_prompt.split("<|fim_suffix|>")[0].split(", ")[:2][0]),
    ],
)
def test_splits_are_disjoint_by_rule(name: str, key) -> None:
    task = TASKS[name]
    rng = random.Random(6)
    train = {key(task.sample(rng, "train")) for _ in range(1500)} - {None}
    test = {key(task.sample(rng, "test")) for _ in range(300)} - {None}
    if (
        name == "fim"
    ):  # the rule is on (start, step); the first term alone may coincide, so check the rule
        from quicksilver.suite.tasks.base import held_out

        for _ in range(300):
            it = task.sample(rng, "test")
            terms = [
                int(x)
                for x in it.raw_prompt.split("<|fim_prefix|>")[1]
                .split("<|fim_suffix|>")[0]
                .split(", ")
                if x
            ]
            step = int(it.data["middle"].split(", ")[0]) - terms[-1]
            assert held_out(("fim", terms[0], step))
        return
    assert test and not (train & test), (name, sorted(train & test)[:5])


def test_test_split_is_fixed() -> None:
    for task in TASKS.values():
        a = [(i.answer, i.stratum) for i in task.test_items(20)]
        assert a == [(i.answer, i.stratum) for i in task.test_items(20)]


def test_split_reply() -> None:
    assert split_reply("<think>1+2=3</think> 3") == ("1+2=3", "3")
    assert split_reply("42") == ("", "42")
