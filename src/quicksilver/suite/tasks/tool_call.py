"""``tool_call``: a two-turn agent loop over OpenAI-style tool schemas.

Turn 1 (stratum ``call``): the system turn lists 1-2 tools, the user asks for something, and the
assistant replies ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Turn 2 (stratum
``answer``): after the tool's result (a ``tool`` message) the assistant answers in words, quoting
the result's values. Tools are built from (verb, noun) pairs over a shared lexicon (``book_hotel``,
``track_order``, ...), so selecting the tool and filling its arguments is copying and matching, a
skill that transfers. Split rules: 20% of the (verb, noun) tools and a set of request phrasings are
test-only, so every test item asks for a tool and uses a phrasing never seen in training.
The verifier parses the call (exactly one, valid JSON) and compares name and arguments exactly.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import Item, Task, held_out
from .phrasing import roughen

CITIES = [
    "Paris",
    "Tokyo",
    "Lima",
    "Oslo",
    "Cairo",
    "Delhi",
    "Rome",
    "Berlin",
    "Madrid",
    "Seoul",
    "Boston",
    "Denver",
    "Dublin",
    "Prague",
    "Vienna",
    "Sydney",
    "Nairobi",
    "Quito",
    "Hanoi",
    "Austin",
]
NAMES = [
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivan",
    "Jo",
    "Kai",
    "Lena",
    "Mia",
    "Noor",
]
TOPICS = [
    "sports",
    "science",
    "music",
    "travel",
    "budget",
    "lunch",
    "the report",
    "the launch",
    "football",
    "art",
]
DISHES = [
    "pasta",
    "curry",
    "ramen",
    "tacos",
    "soup",
    "paella",
    "salad",
    "pancakes",
    "risotto",
    "falafel",
]
SYMBOLS = ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "IBM", "INTC", "ORCL", "SAP", "SONY"]
LANGS = ["French", "German", "Spanish", "Italian", "Japanese", "Hindi", "Greek", "Dutch"]
WORDS = ["hello", "thank you", "good night", "see you soon", "where is the station", "I am hungry"]
TITLES = [
    "Blue Sky",
    "Night Drive",
    "Golden Hour",
    "Paper Moon",
    "Red River",
    "Silver Lining",
    "Old Town",
]
TASKS_ = ["call mom", "buy milk", "pay rent", "water plants", "walk the dog", "book a doctor"]
PLACES = ["Luigi's", "Sakura", "The Olive", "Blue Door", "Casa Rosa", "Green Leaf", "Dragon Inn"]

ValueGen = Callable[[random.Random], Any]


def _pick(xs: list[str]) -> ValueGen:
    return lambda rng: rng.choice(xs)


def _int(lo: int, hi: int) -> ValueGen:
    return lambda rng: rng.randint(lo, hi)


# param name -> (json type, value generator, phrasings with {v})
PARAMS: dict[str, tuple[str, ValueGen, list[str]]] = {
    "city": ("string", _pick(CITIES), ["in {v}", "for {v}"]),
    "origin": ("string", _pick(CITIES), ["from {v}"]),
    "destination": ("string", _pick(CITIES), ["to {v}"]),
    "nights": ("integer", _int(1, 9), ["for {v} nights"]),
    "order_id": ("integer", _int(1000, 9999), ["number {v}", "with id {v}"]),
    "symbol": ("string", _pick(SYMBOLS), ["for {v}", "of {v}"]),
    "minutes": ("integer", _int(1, 60), ["for {v} minutes"]),
    "to": ("string", _pick(NAMES), ["to {v}"]),
    "subject": ("string", _pick(TOPICS), ["about {v}"]),
    "dish": ("string", _pick(DISHES), ["for {v}"]),
    "topic": ("string", _pick(TOPICS), ["about {v}", "on {v}"]),
    "text": ("string", _pick(WORDS), ['"{v}"']),
    "language": ("string", _pick(LANGS), ["into {v}", "in {v}"]),
    "title": ("string", _pick(TITLES), ["called {v}", "named {v}"]),
    "task": ("string", _pick(TASKS_), ["to {v}"]),
    "hour": ("integer", _int(1, 12), ["at {v} o'clock"]),
    "restaurant": ("string", _pick(PLACES), ["at {v}"]),
    "people": ("integer", _int(1, 8), ["for {v} people"]),
    "tracking_number": ("integer", _int(10000, 99999), ["number {v}"]),
    "name": ("string", _pick(NAMES), ["for {v}", "with {v}"]),
}

# noun -> (words used in requests, params, verbs that make sense, result fields)
NOUNS: dict[str, tuple[str, list[str], list[str], dict[str, ValueGen]]] = {
    "weather": (
        "weather",
        ["city"],
        ["get", "check"],
        {"temp_c": _int(-5, 35), "sky": _pick(["sunny", "cloudy", "rainy"])},
    ),
    "time": (
        "time",
        ["city"],
        ["get", "check"],
        {"time": lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"},
    ),
    "flight": (
        "flight",
        ["origin", "destination"],
        ["book", "search", "cancel", "check"],
        {
            "status": _pick(["booked", "on time", "delayed", "cancelled"]),
            "code": lambda r: f"QS{r.randint(100, 999)}",
        },
    ),
    "hotel": (
        "hotel",
        ["city", "nights"],
        ["book", "find", "cancel"],
        {"status": _pick(["booked", "available", "cancelled"]), "price": _int(50, 400)},
    ),
    "order": (
        "order",
        ["order_id"],
        ["track", "cancel", "check"],
        {"status": _pick(["shipped", "cancelled", "packed"])},
    ),
    "stock": ("stock price", ["symbol"], ["get", "check"], {"price": _int(10, 900)}),
    "timer": ("timer", ["minutes"], ["set", "cancel"], {"status": _pick(["set", "cancelled"])}),
    "email": ("email", ["to", "subject"], ["send", "draft"], {"status": _pick(["sent", "saved"])}),
    "song": (
        "song",
        ["title"],
        ["play", "find"],
        {"status": _pick(["playing", "found"]), "artist": _pick(NAMES)},
    ),
    "recipe": (
        "recipe",
        ["dish"],
        ["find", "get"],
        {"minutes": _int(10, 90), "steps": _int(3, 12)},
    ),
    "news": (
        "news",
        ["topic"],
        ["get", "search"],
        {
            "headline": lambda r: (
                f"{r.choice(TOPICS).title()} {r.choice(['wins', 'grows', 'returns'])}"
            )
        },
    ),
    "translation": (
        "translation",
        ["text", "language"],
        ["get"],
        {"result": lambda r: r.choice(["bonjour", "hallo", "hola", "ciao", "salut"])},
    ),
    "distance": ("distance", ["origin", "destination"], ["get", "check"], {"km": _int(10, 9000)}),
    "reminder": (
        "reminder",
        ["task", "hour"],
        ["set", "create", "cancel"],
        {"status": _pick(["set", "cancelled"])},
    ),
    "table": (
        "table",
        ["restaurant", "people"],
        ["book", "cancel"],
        {"status": _pick(["booked", "cancelled"]), "hour": _int(5, 10)},
    ),
    "package": (
        "package",
        ["tracking_number"],
        ["track", "check"],
        {"status": _pick(["in transit", "delivered"])},
    ),
    "movie": (
        "movie",
        ["title"],
        ["find", "play"],
        {"status": _pick(["playing", "found"]), "year": _int(1960, 2024)},
    ),
    "meeting": (
        "meeting",
        ["name", "hour"],
        ["create", "cancel", "schedule"],
        {"status": _pick(["scheduled", "cancelled"])},
    ),
}

VERB_WORDS = {
    "get": "get",
    "check": "check",
    "book": "book",
    "search": "search for",
    "cancel": "cancel",
    "find": "find",
    "track": "track",
    "set": "set",
    "send": "send",
    "draft": "draft",
    "play": "play",
    "create": "create",
    "schedule": "schedule",
}

# request phrasings: {verb} {noun} {args}. TEST_TEMPLATES are the test split's (the ``templated``
# phrasing, as first shipped); HELD_OUT_TEMPLATES only the ``held-out`` phrasing's. Training never
# sees either.
TRAIN_TEMPLATES = [
    "Please {verb} the {noun} {args}.",
    "Can you {verb} the {noun} {args}?",
    "I need you to {verb} the {noun} {args}.",
    "{Verb} the {noun} {args}, please.",
    "Could you {verb} the {noun} {args}?",
    "Help me {verb} the {noun} {args}.",
    "{verb} the {noun} {args}",
    "I'd like you to {verb} the {noun} {args}.",
    "Time to {verb} the {noun} {args}.",
    "Hey, can you {verb} my {noun} {args}?",
    "Let's {verb} the {noun} {args}.",
    "Need to {verb} a {noun} {args}.",
    "Use the tool to {verb} the {noun} {args}.",
    "My request: {verb} the {noun} {args}.",
]
TEST_TEMPLATES = [
    "Would you {verb} the {noun} {args}?",
    "Go ahead and {verb} the {noun} {args}.",
    "I want to {verb} the {noun} {args}.",
    "Quick: {verb} the {noun} {args}!",
]
HELD_OUT_TEMPLATES = [
    "Could you please {verb} the {noun} {args} for me?",
    "I would love it if you could {verb} the {noun} {args}.",
    "Any chance you can {verb} a {noun} {args}?",
    "Task for you: {verb} the {noun} {args}.",
    "{verb} {noun} {args} now",
]

ALL_TOOLS = [(verb, noun) for noun, (_, _, verbs, _) in NOUNS.items() for verb in verbs]


def tool_split(verb: str, noun: str) -> str:
    return "test" if held_out(("tool", verb, noun), 20) else "train"


# other names a tool may give an argument: (training-only aliases, held-out-only aliases)
PARAM_ALIASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "city": (("location", "town"), ("place",)),
    "origin": (("from_city", "source"), ("departure",)),
    "destination": (("to_city", "target"), ("arrival",)),
    "nights": (("num_nights",), ("stay_length",)),
    "order_id": (("order_number", "id"), ("order_no",)),
    "symbol": (("ticker",), ("stock_symbol",)),
    "minutes": (("duration", "mins"), ("length_minutes",)),
    "to": (("recipient",), ("send_to",)),
    "subject": (("about",), ("regarding",)),
    "dish": (("meal",), ("food",)),
    "topic": (("query",), ("theme",)),
    "text": (("phrase",), ("source_text",)),
    "language": (("target_language", "lang"), ("into_language",)),
    "title": (("name_of_item",), ("item_title",)),
    "task": (("todo",), ("what",)),
    "hour": (("time_hour", "at_hour"), ("clock_hour",)),
    "restaurant": (("venue",), ("place_name",)),
    "people": (("guests", "party_size"), ("num_people",)),
    "tracking_number": (("tracking_id",), ("parcel_number",)),
    "name": (("person",), ("attendee",)),
}


def param_names(w: random.Random, params: list[str], split: str, phrasing: str) -> dict[str, str]:
    """The argument names a tool uses: canonical in the ``templated`` test split, otherwise some
    renamed to a training alias (train) or to a held-out alias (``held-out``)."""
    if split == "test" and phrasing == "templated":
        return {p: p for p in params}
    side, rate = (1, 0.6) if split == "test" else (0, 0.35)
    return {p: w.choice(PARAM_ALIASES[p][side]) if w.random() < rate else p for p in params}


def tool_schema(verb: str, noun: str, names: dict[str, str] | None = None) -> dict[str, Any]:
    words, params, _, _ = NOUNS[noun]
    names = names or {p: p for p in params}
    return {
        "type": "function",
        "function": {
            "name": f"{verb}_{noun}",
            "description": f"{verb.capitalize()} a {words}.",
            "parameters": {
                "type": "object",
                "properties": {names[p]: {"type": PARAMS[p][0]} for p in params},
                "required": [names[p] for p in params],
            },
        },
    }


CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_tool_calls(reply: str) -> list[dict[str, Any]] | None:
    """Every ``<tool_call>{json}</tool_call>`` in a reply; None if any is not a JSON call object."""
    calls = []
    for m in CALL_RE.finditer(reply):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            return None
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("name"), str)
            or not isinstance(obj.get("arguments"), dict)
        ):
            return None
        calls.append(obj)
    return calls


def tool_template(rng: random.Random, w: random.Random, split: str, phrasing: str) -> str:
    """The request template: drawn from ``rng`` as first shipped (so the puzzles that follow stay
    the same), then for ``held-out`` replaced by a held-out one and in training roughened, from ``w``."""
    shipped = rng.choice(TEST_TEMPLATES if split == "test" else TRAIN_TEMPLATES)
    if split == "test":
        return shipped if phrasing == "templated" else roughen(w, w.choice(HELD_OUT_TEMPLATES))
    return roughen(w, shipped)


@dataclass
class Exchange:
    """One request for one tool: the user's words, the tools offered, the expected call."""

    request: str
    noun: str
    schemas: list[dict[str, Any]]
    call: dict[str, Any]

    def call_text(self) -> str:
        return "<tool_call>" + json.dumps(self.call, ensure_ascii=False) + "</tool_call>"

    def assistant_turn(self) -> dict[str, Any]:
        fn = {"name": self.call["name"], "arguments": self.call["arguments"]}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": fn}],
        }


def draw_exchange(
    rng: random.Random,
    w: random.Random,
    split: str,
    phrasing: str,
    exclude: frozenset[str] = frozenset(),
) -> Exchange:
    """A request for one of the split's tools (none of the nouns in ``exclude``) with 0-1 distractor
    tools; puzzle values from ``rng``, wording and argument names from ``w``."""
    tools = [t for t in ALL_TOOLS if tool_split(*t) == split and t[1] not in exclude]
    verb, noun = rng.choice(tools)
    words, params, _, _ = NOUNS[noun]
    args = {p: PARAMS[p][1](rng) for p in params}
    if "origin" in args and args["origin"] == args.get("destination"):
        args["destination"] = rng.choice([c for c in CITIES if c != args["origin"]])
    arg_text = " ".join(rng.choice(PARAMS[p][2]).format(v=args[p]) for p in params)
    template = tool_template(rng, w, split, phrasing)
    vw = VERB_WORDS[verb]
    request = template.format(verb=vw, Verb=vw.capitalize(), noun=words, args=arg_text)
    distract = [
        t
        for t in ALL_TOOLS
        if t != (verb, noun) and t[1] not in exclude and tool_split(*t) == "train"
    ]
    listed = [(verb, noun), *rng.sample(distract, rng.randint(0, 1))]
    rng.shuffle(listed)
    names = {n: param_names(w, NOUNS[n][1], split, phrasing) for _, n in listed}
    schemas = [tool_schema(v, n, names[n]) for v, n in listed]
    call = {"name": f"{verb}_{noun}", "arguments": {names[noun][p]: v for p, v in args.items()}}
    return Exchange(request, noun, schemas, call)


def draw_result(rng: random.Random, noun: str) -> tuple[dict[str, Any], str]:
    """The tool's result and the answer that quotes it."""
    result = {k: g(rng) for k, g in NOUNS[noun][3].items()}
    said = ", ".join(f"The {k.replace('_', ' ')} is {v}" for k, v in result.items())
    return result, f"Done. {said}."


def tool_message(result: dict[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "content": json.dumps(result, ensure_ascii=False)}


class ToolCall(Task):
    name = "tool_call"
    strata: tuple[str, ...] = ("call", "answer")
    max_answer_tokens = 64

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        ex = draw_exchange(rng, wording or rng, split, phrasing)
        messages: list[dict[str, Any]] = [{"role": "user", "content": ex.request}]
        if rng.random() < 0.5:  # turn 1: emit the call
            return self._call_item(messages, ex, "call")
        result, answer = draw_result(rng, ex.noun)
        messages += [ex.assistant_turn(), tool_message(result)]
        return self._answer_item(messages, ex.schemas, answer, result, "answer")

    def _call_item(
        self,
        messages: list[dict[str, Any]],
        ex: Exchange,
        stratum: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> Item:
        return Item(
            self.name,
            messages,
            answer=ex.call_text(),
            tools=tools or ex.schemas,
            stratum=stratum,
            data={"call": ex.call},
        )

    def _answer_item(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        answer: str,
        result: dict[str, Any],
        stratum: str,
    ) -> Item:
        return Item(
            self.name,
            messages,
            answer=answer,
            tools=tools,
            stratum=stratum,
            data={"result": result},
        )

    def verify(self, item: Item, reply: str) -> bool:
        if item.stratum.endswith("call"):  # exactly one call and nothing else
            calls = parse_tool_calls(reply)
            return (
                calls is not None
                and len(calls) == 1
                and calls[0] == item.data["call"]
                and not CALL_RE.sub("", reply).strip()
            )
        if "<tool_call>" in reply:
            return False
        return all(str(v) in reply for v in item.data["result"].values())

    @staticmethod
    def parseable(item: Item, reply: str) -> bool:
        calls = parse_tool_calls(reply)
        return calls is not None and len(calls) == 1


class ToolLoop(ToolCall):
    """``tool_loop``: the agent loop's later turns. A first exchange is finished (call, result,
    answer), then the user asks for something that needs another of the offered tools: the reply is
    that second call (``second_call``) or, after its result, the answer (``second_answer``). Long
    prompts (300-600 tokens): needs the 1,024-token context."""

    name = "tool_loop"
    strata = ("second_call", "second_answer")

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        w = wording or rng
        first = draw_exchange(rng, w, split, phrasing)
        result1, answer1 = draw_result(rng, first.noun)
        nouns = frozenset(s["function"]["name"].split("_", 1)[1] for s in first.schemas)
        second = draw_exchange(rng, w, split, phrasing, exclude=nouns)
        tools = first.schemas + second.schemas
        rng.shuffle(tools)
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": first.request},
            first.assistant_turn(),
            tool_message(result1),
            {"role": "assistant", "content": answer1},
            {"role": "user", "content": second.request},
        ]
        if rng.random() < 0.5:
            return self._call_item(messages, second, "second_call", tools)
        result2, answer2 = draw_result(rng, second.noun)
        messages += [second.assistant_turn(), tool_message(result2)]
        return self._answer_item(messages, tools, answer2, result2, "second_answer")
