"""Natural requests: many wordings per task, whole templates held out for the test split, values
never touched by the noise, the templated split unchanged, every answer still verifiable."""

from __future__ import annotations

import random
import re

import pytest

from quicksilver.suite.tasks import TASKS, get_task
from quicksilver.suite.tasks.arith import COUNTDOWN_PHRASES, MULTIPLY_PHRASES
from quicksilver.suite.tasks.path_star import PATH_PHRASES
from quicksilver.suite.tasks.phrasing import Phrasings, roughen, typo
from quicksilver.suite.tasks.sudoku4 import SUDOKU_PHRASES, render
from quicksilver.suite.tasks.tool_call import (
    HELD_OUT_TEMPLATES,
    PARAM_ALIASES,
    TEST_TEMPLATES,
    TRAIN_TEMPLATES,
)

PHRASES = [COUNTDOWN_PHRASES, MULTIPLY_PHRASES, PATH_PHRASES, SUDOKU_PHRASES]
WORDED = ["path_star", "sudoku4", "countdown3", "countdown4", "multiply", "tool_call"]


@pytest.mark.parametrize("ph", PHRASES)
def test_training_never_draws_a_held_out_template(ph: Phrasings) -> None:
    rng = random.Random(0)
    drawn = {ph.choose(rng, "train", "held-out") for _ in range(3000)}
    assert drawn == {ph.canonical, *ph.train}  # all of them, and nothing held out
    held = {ph.choose(rng, "test", "held-out") for _ in range(500)}
    assert held == set(ph.test)
    assert {ph.choose(rng, "test", "templated") for _ in range(50)} == {ph.canonical}


def test_tool_templates_are_disjoint() -> None:
    assert not set(TRAIN_TEMPLATES) & (set(TEST_TEMPLATES) | set(HELD_OUT_TEMPLATES))
    assert not set(TEST_TEMPLATES) & set(HELD_OUT_TEMPLATES)
    for train, held in PARAM_ALIASES.values():
        assert not set(train) & set(held)


def test_overlapping_templates_are_refused() -> None:
    with pytest.raises(ValueError, match="held-out"):
        Phrasings("a {x}", ("b {x}", "c {x}"), ("c {x}",))


def test_roughen_keeps_slots_and_typo_swaps_letters() -> None:
    rng = random.Random(1)
    for _ in range(300):
        out = roughen(rng, "Use {numbers} to make {target}, Please.")
        assert "{numbers}" in out and "{target}" in out
    assert typo(random.Random(0), "12 + 7") == "12 + 7"  # no word to misspell: unchanged
    t = typo(random.Random(0), "solve this")
    assert sorted(t) == sorted("solve this") and t != "solve this"


def test_templated_split_keeps_the_canonical_wording() -> None:
    for it in get_task("multiply").test_items(20):
        assert re.fullmatch(r"What is \d{3}\*\d{2}\?", it.messages[0]["content"])
    for it in get_task("sudoku4").test_items(20):
        assert it.messages[0]["content"] == f"Solve the sudoku: {render(it.data['puzzle'])}"
    for it in get_task("tool_call").test_items(20):
        assert it.tools is not None
        for schema in it.tools:  # canonical argument names only
            assert set(schema["function"]["parameters"]["properties"]) <= set(PARAM_ALIASES)


@pytest.mark.parametrize("name", WORDED)
def test_held_out_phrasing_same_puzzles_new_words(name: str) -> None:
    task = get_task(name)
    plain, worded = task.test_items(60), task.test_items(60, phrasing="held-out")
    assert [i.stratum for i in plain] == [i.stratum for i in worded]
    assert [i.data.get("puzzle") or i.data.get("numbers") for i in plain] == [
        i.data.get("puzzle") or i.data.get("numbers") for i in worded
    ]
    changed = sum(
        p.messages[0]["content"] != w.messages[0]["content"] for p, w in zip(plain, worded)
    )
    assert changed >= 0.9 * len(plain)
    assert worded == task.test_items(60, phrasing="held-out")  # fixed, like the templated split


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("phrasing", ["templated", "held-out"])
def test_reference_answers_verify_in_every_wording(name: str, phrasing: str) -> None:
    task = get_task(name)
    rng = random.Random(3)
    items = task.test_items(40, phrasing=phrasing) + [task.sample(rng, "train") for _ in range(80)]
    for it in items:
        assert task.verify(it, it.answer), (name, it.messages, it.answer)


def test_held_out_tool_arguments_use_unseen_names() -> None:
    train_names = {a for train, _ in PARAM_ALIASES.values() for a in train}
    held_names = {a for _, held in PARAM_ALIASES.values() for a in held}
    seen = set()
    for it in get_task("tool_call").test_items(200, phrasing="held-out"):
        for schema in it.tools or []:
            seen |= set(schema["function"]["parameters"]["properties"])
    assert seen & held_names and not seen & train_names
    rng = random.Random(5)
    trained = set()
    for _ in range(800):
        it = get_task("tool_call").sample(rng, "train")
        for schema in it.tools or []:
            trained |= set(schema["function"]["parameters"]["properties"])
    assert trained & train_names and not trained & held_names


def test_requests_come_in_many_notations() -> None:
    rng = random.Random(7)
    texts = [get_task("multiply").sample(rng, "train").messages[0]["content"] for _ in range(400)]
    for op in ("×", " x ", " times ", "*"):
        assert any(op in t for t in texts), op
    assert any(t != t.lower() for t in texts) and any(t == t.lower() for t in texts)
    grids = [get_task("sudoku4").sample(rng, "train").messages[0]["content"] for _ in range(200)]
    assert any("/" in g for g in grids) and any("/" not in g and "\n" in g for g in grids)


def test_tool_loop_is_a_finished_exchange_then_a_second_tool() -> None:
    task = get_task("tool_loop")
    for it in task.test_items(30):
        roles = [m["role"] for m in it.messages or []]
        assert roles[:5] == ["user", "assistant", "tool", "assistant", "user"]
        offered = {s["function"]["name"] for s in it.tools or []}
        first = it.messages[1]["tool_calls"][0]["function"]["name"]
        assert first in offered
        if it.stratum == "second_call":
            assert it.data["call"]["name"] in offered and it.data["call"]["name"] != first
        else:
            assert roles[5:] == ["assistant", "tool"]
        assert task.verify(it, it.answer) and not task.verify(it, "Done.")
