"""The edit and open-tool tasks: what their generators promise beyond the suite-wide checks in
test_tasks.py (every reference answer verifies, mutations fail, splits are fixed)."""

from __future__ import annotations

import json
import random
import re

from quicksilver.assets import resolve_model
from quicksilver.models.checkpoint import load_tokenizer
from quicksilver.suite.edit_format import CURSOR
from quicksilver.suite.render import render
from quicksilver.suite.tasks import get_task
from quicksilver.suite.tasks.codegen import HELD_LISTS, HELD_WORDS, LISTS, TYPES, WORDS
from quicksilver.suite.tasks.tool_open import LIVE_OBJECTS, OBJECTS, SLOTS, object_split

NEXT = get_task("next_edit")
OPEN = get_task("tool_open")
APPLY = get_task("apply_edit")
NAMES = ("apply_edit", "next_edit", "copy_code")  # the tasks with a made-up-name variant


def _region(item) -> str:
    text = item.messages[-1]["content"]
    return text.split("<|code_to_edit|>\n")[1].split("\n<|/code_to_edit|>")[0]


def test_next_edit_region_holds_the_cursor_and_still_needs_the_edit() -> None:
    rng = random.Random(0)
    for split, phrasing in (("train", "templated"), ("test", "templated"), ("test", "held-out")):
        for _ in range(40):
            item = NEXT.sample(rng, split, phrasing)
            region = _region(item)
            assert region.count(CURSOR) == 1
            before = region.replace(CURSOR, "")
            assert before.split("\n") != item.answer.split("\n")  # the started edit goes on
            assert len(before.split("\n")) == len(item.answer.split("\n"))  # line for line
            assert NEXT.verify(item, "<|updated_code|>\n" + item.answer + "\n<|/updated_code|>")
            assert not NEXT.verify(item, before)  # leaving the region as it was is wrong


def test_next_edit_history_is_a_unified_diff_of_the_file() -> None:
    item = NEXT.sample(random.Random(3), "train")
    history = item.messages[-1]["content"].split("<|edit_diff_history|>\n")[1]
    assert history.startswith("--- ") and "\n+++ " in history and "\n@@ " in history


def test_next_edit_held_out_directories_never_train() -> None:
    rng = random.Random(1)
    train_paths = {NEXT.sample(rng, "train").data["path"].split("/")[0] for _ in range(300)}
    held = {NEXT.sample(rng, "test", "held-out").data["path"].split("/")[0] for _ in range(60)}
    assert held and not held & train_paths


def test_edit_tasks_split_by_their_file_key() -> None:
    for task in (APPLY, NEXT):
        rng = random.Random(2)
        train = {tuple(task.sample(rng, "train").data["key"]) for _ in range(200)}
        test = {tuple(task.sample(rng, "test").data["key"]) for _ in range(50)}
        assert test and not train & test, task.name


def test_tool_open_tests_only_tools_never_trained() -> None:
    assert all(object_split(o) == "test" for o in LIVE_OBJECTS)
    rng = random.Random(4)
    train = [OPEN.sample(rng, "train") for _ in range(600)]
    test = [OPEN.sample(rng, "test", p) for p in ("templated", "held-out") for _ in range(100)]
    called_train = {it.data["call"]["name"] for it in train}
    offered_train = {t["function"]["name"] for it in train for t in it.tools}
    for it in test:
        assert it.data["call"]["name"] not in offered_train
    assert not any(n.endswith(("_table", "_ride", "_lights", "_thermostat")) for n in called_train)


def test_tool_open_held_out_wording_and_argument_names_never_train() -> None:
    rng = random.Random(5)
    held_names = {n for s in SLOTS.values() for n in s.held_names}
    train_args = set()
    for _ in range(600):
        it = OPEN.sample(rng, "train")
        train_args |= {p for t in it.tools for p in t["function"]["parameters"]["properties"]}
    assert not train_args & held_names
    held = [OPEN.sample(rng, "test", "held-out") for _ in range(100)]
    used = {p for it in held for t in it.tools for p in t["function"]["parameters"]["properties"]}
    assert used & held_names


def test_tool_open_counts_are_integers_and_values_come_from_the_request() -> None:
    rng = random.Random(6)
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    for _ in range(200):
        it = OPEN.sample(rng, "train")
        request = it.messages[0]["content"]
        schema = next(t for t in it.tools if t["function"]["name"] == it.data["call"]["name"])
        props = schema["function"]["parameters"]["properties"]
        for name, value in it.data["call"]["arguments"].items():
            assert props[name]["type"] == ("integer" if isinstance(value, int) else "string")
            said = str(value)
            assert said in request or (isinstance(value, int) and words[value - 1] in request)
        assert json.loads(re.search(r"<tool_call>(.*)</tool_call>", it.answer).group(1))


def test_tool_open_covers_every_object_and_slot() -> None:
    for obj, (actions, slots) in OBJECTS.items():
        assert slots.split() and all(s in SLOTS for s in slots.split()), obj
        assert actions.split(), obj


def test_copy_drills_ask_for_the_original_unchanged_within_their_budget() -> None:
    """copy_text / copy_short / copy_code: the apply route with an update snippet that is only a
    marker; the answer is the original exactly (random text within the task's character budget,
    or a generated two-function file)."""
    rng = random.Random(3)
    for name, budget in (("copy_text", 260), ("copy_short", 60), ("copy_code", 1000)):
        task = get_task(name)
        for split in ("train", "test"):
            for _ in range(40):
                item = task.sample(rng, split)
                user = item.messages[-1]["content"]
                original = user.split("<|original_code|>\n")[1].split("\n<|/original_code|>")[0]
                snippet = user.split("<|update_snippet|>\n")[1].split("\n<|/update_snippet|>")[0]
                assert original == item.answer and len(item.answer) <= budget
                assert snippet.endswith("... existing code ...") and "\n" not in snippet
                assert task.verify(item, item.answer) and not task.verify(item, item.answer[:-1])


def test_edit_tasks_fit_their_budgets_in_the_shipped_tokenizer() -> None:
    """Answer <= max_answer_tokens and prompt + answer <= 1,000 (the recipes' max_len), counted by
    the shipped tokenizer, for the edit tasks and their made-up-name variants (made-up names cost
    more tokens than the lexicon's); apply_edit's prompt <= 600 as its docstring says."""
    tok = load_tokenizer(resolve_model(None))
    rng = random.Random(5)
    for name in NAMES + tuple(f"{n}_made_up" for n in NAMES):
        task = get_task(name)
        for split, phrasing in (("train", "templated"), ("test", "held-out")):
            for _ in range(60):
                prompt, answer = render(task.sample(rng, split, phrasing), tok)
                assert len(answer) <= task.max_answer_tokens, name
                assert len(prompt) <= (600 if "apply" in name else 1000 - len(answer)), name


def test_made_up_variants_name_nothing_from_the_lexicon() -> None:
    """``*_made_up`` items: every identifier is a made-up word, so none of the lexicon's (training
    or held-out) appears as a name; the verifier is the base task's."""
    lexicon = set(WORDS + HELD_WORDS + LISTS + HELD_LISTS + TYPES)
    rng = random.Random(6)
    for name in NAMES:
        task = get_task(f"{name}_made_up")
        for split in ("train", "test"):
            item = task.sample(rng, split)
            names = set(re.findall(r"[A-Za-z]+", item.answer.replace("_", " ")))
            assert not {n.lower() for n in names} & lexicon, (name, names & lexicon)
            assert task.verify(item, item.answer) and not task.verify(item, item.answer + "x")
