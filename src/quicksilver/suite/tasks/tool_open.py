"""``tool_open``: calls to tools the model has never seen, asked for in the user's own words.

``tool_call`` builds its tools from one small (verb, noun) lexicon and its requests say "book the
hotel in Paris for 3 nights". A user of the live API brings their own tools (``reserve_table`` with
``party_size`` and ``time``) and asks "can you get me a table for two at 7?". This task trains and
measures that: each item offers 1-3 tools drawn from ~90 objects (``table``, ``thermostat``,
``parking spot``, ...), each tool with a generated name (the object and one of its action's verbs:
``reserve_table``, ``book_table``), a one-line description, and 1-3 typed arguments whose names and
descriptions vary (``party_size`` / ``guests`` / ``headcount``: "Number of people"). The request
names the object, often with a verb other than the tool's ("get me", "I need"), and carries each
argument in natural form: counts as words or digits ("for two"), times ("at 6:30"), days, places,
people, amounts ("$40"), levels, durations, titles.

The call copies values as the user gave them, except counts, amounts, levels and minutes, which are
JSON integers ("two" -> 2). Distractor tools are other objects', so the right tool is the one whose
name and description name what the user asked for.

Split rules: a quarter of the objects (and every object of ``eval/live_tools.py``'s prompts) are
test-only, so every test item calls a tool never seen in training; ``held-out`` adds argument names
and request wordings never trained on. The verifier is ``tool_call``'s: exactly one call, name and
arguments equal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .base import Item, held_out
from .phrasing import roughen
from .tool_call import CITIES, NAMES, PLACES, TITLES, Exchange, ToolCall

NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
DAYS = ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
ROOMS = ["kitchen", "bedroom", "living room", "office", "garage", "hallway", "bathroom", "attic"]
SPOTS = ["airport", "station", "office", "beach", "museum", "stadium", "library", "harbor", "mall"]


@dataclass(frozen=True)
class Slot:
    """An argument kind: its JSON type, names (training, held-out), descriptions, phrasings."""

    type: str
    names: tuple[str, ...]
    held_names: tuple[str, ...]
    about: tuple[str, ...]
    phrases: tuple[str, ...]  # with {v}: the value as said


SLOTS: dict[str, Slot] = {
    "count": Slot(
        "integer",
        ("party_size", "guests", "people", "seats", "quantity", "num_people"),
        ("headcount", "group_size"),
        ("Number of people.", "How many."),
        ("for {v}", "for {v} people", "for a party of {v}"),
    ),
    "time": Slot(
        "string",
        ("time", "at", "start_time", "hour"),
        ("when_time", "slot_time"),
        ("Time of day, as the user said it.", "When, e.g. 7 or 6:30."),
        ("at {v}", "around {v}"),
    ),
    "day": Slot(
        "string",
        ("day", "date", "on_day"),
        ("which_day",),
        ("Day, as the user said it.",),
        ("{v}",),
    ),
    "city": Slot(
        "string",
        ("city", "location", "where"),
        ("in_city", "locale"),
        ("City name.",),
        ("in {v}",),
    ),
    "person": Slot(
        "string",
        ("name", "person", "recipient", "contact"),
        ("who", "for_person"),
        ("Who it is for.", "Person's name."),
        ("for {v}", "to {v}"),
    ),
    "amount": Slot(
        "integer",
        ("amount", "dollars", "price", "budget"),
        ("sum", "usd"),
        ("Amount in dollars.",),
        ("${v}", "{v} dollars"),
    ),
    "room": Slot(
        "string",
        ("room", "area", "zone"),
        ("space", "part_of_house"),
        ("Room of the house.",),
        ("in the {v}",),
    ),
    "level": Slot(
        "integer",
        ("level", "value", "target", "temperature"),
        ("setpoint", "degrees"),
        ("Target level.", "The number to set."),
        ("to {v}", "to {v} degrees"),
    ),
    "minutes": Slot(
        "integer",
        ("minutes", "duration", "length"),
        ("mins", "duration_min"),
        ("Length in minutes.",),
        ("for {v} minutes",),
    ),
    "title": Slot(
        "string",
        ("title", "name_of", "label"),
        ("called",),
        ("Its title.",),
        ("called {v}", '"{v}"'),
    ),
    "venue": Slot(
        "string",
        ("restaurant", "venue", "place"),
        ("spot", "establishment"),
        ("Where.",),
        ("at {v}",),
    ),
    "destination": Slot(
        "string",
        ("destination", "to", "dropoff"),
        ("target_place", "going_to"),
        ("Where to.",),
        ("to the {v}",),
    ),
}

# action -> (tool verbs, description verb, request wordings with {a} {obj} {args}); wordings after
# the bar are held out (never trained on)
ACTIONS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], tuple[str, ...]]] = {
    "reserve": (
        ("reserve", "book"),
        "Reserve",
        (
            "can you get me {a} {obj} {args}?",
            "book {a} {obj} {args}",
            "I need {a} {obj} {args}.",
            "reserve {a} {obj} {args} please",
            "could you grab me {a} {obj} {args}?",
        ),
        ("any chance of {a} {obj} {args}?", "we'd like {a} {obj} {args}."),
    ),
    "order": (
        ("order", "buy"),
        "Order",
        ("order {a} {obj} {args}", "I want {a} {obj} {args}.", "get me {a} {obj} {args}"),
        ("can I have {a} {obj} {args}?",),
    ),
    "cancel": (
        ("cancel",),
        "Cancel",
        ("cancel my {obj} {args}", "please call off the {obj} {args}.", "drop the {obj} {args}"),
        ("I no longer need the {obj} {args}, cancel it",),
    ),
    "check": (
        ("get", "check"),
        "Look up",
        ("what's the {obj} {args}?", "check the {obj} {args}", "how is the {obj} {args}?"),
        ("tell me about the {obj} {args}",),
    ),
    "on": (
        ("turn_on", "start"),
        "Turn on",
        ("turn on the {obj} {args}", "switch the {obj} on {args}", "start the {obj} {args}"),
        ("fire up the {obj} {args}",),
    ),
    "off": (
        ("turn_off", "stop"),
        "Turn off",
        ("turn off the {obj} {args}", "switch the {obj} off {args}", "stop the {obj} {args}"),
        ("kill the {obj} {args}",),
    ),
    "set": (
        ("set", "adjust"),
        "Set",
        ("set the {obj} {args}", "change the {obj} {args}", "put the {obj} {args}"),
        ("make the {obj} go {args}",),
    ),
    "send": (
        ("send",),
        "Send",
        ("send {a} {obj} {args}", "please send {a} {obj} {args}.", "shoot {a} {obj} {args}"),
        ("I want {a} {obj} sent {args}",),
    ),
}
PREFIXES = ("", "", "hey, ", "please ", "hi! ", "ok, ")
HELD_PREFIXES = ("so, ", "quick question: ")

# object (as said) -> (actions, slots); "parking spot" names tools ``..._parking_spot``
OBJECTS: dict[str, tuple[str, str]] = {
    "table": ("reserve cancel", "count time"),
    "ride": ("reserve cancel", "destination time"),
    "lights": ("on off", "room"),
    "thermostat": ("set", "level"),
    "taxi": ("reserve cancel", "destination time"),
    "haircut": ("reserve cancel", "day time"),
    "massage": ("reserve cancel", "day time"),
    "court": ("reserve cancel", "day time count"),
    "room": ("reserve cancel", "city day"),
    "parking spot": ("reserve", "venue time"),
    "tour": ("reserve cancel", "city count"),
    "lesson": ("reserve cancel", "day time"),
    "cabin": ("reserve", "city count"),
    "campsite": ("reserve", "day count"),
    "boat": ("reserve", "city time"),
    "bike": ("reserve", "city minutes"),
    "desk": ("reserve", "day"),
    "tickets": ("order", "title count"),
    "pizza": ("order", "count venue"),
    "coffee": ("order", "count venue"),
    "groceries": ("order", "day amount"),
    "flowers": ("order send", "person amount"),
    "cake": ("order", "person day"),
    "sandwich": ("order", "count venue"),
    "gift card": ("order send", "person amount"),
    "postcard": ("send", "person city"),
    "invite": ("send", "person day"),
    "reminder": ("send", "person time"),
    "invoice": ("send", "person amount"),
    "payment": ("send cancel", "person amount"),
    "refund": ("send", "person amount"),
    "note": ("send", "person title"),
    "photo": ("send", "person title"),
    "playlist": ("send", "person title"),
    "fan": ("on off set", "room level"),
    "heater": ("on off set", "room level"),
    "oven": ("on off set", "level minutes"),
    "radio": ("on off", "room"),
    "tv": ("on off", "room"),
    "sprinkler": ("on off", "minutes"),
    "alarm": ("set cancel", "time day"),
    "timer": ("set cancel", "minutes"),
    "volume": ("set", "level room"),
    "blinds": ("set", "level room"),
    "speaker": ("on off set", "room level"),
    "washer": ("on off", "minutes"),
    "dryer": ("on off", "minutes"),
    "vacuum": ("on off", "room"),
    "camera": ("on off", "room"),
    "kettle": ("on off", "minutes"),
    "weather": ("check", "city day"),
    "forecast": ("check", "city day"),
    "traffic": ("check", "destination"),
    "balance": ("check", "person"),
    "score": ("check", "title"),
    "schedule": ("check", "person day"),
    "menu": ("check", "venue"),
    "rates": ("check", "city"),
    "air quality": ("check", "city"),
    "tide": ("check", "city day"),
    "delivery": ("check cancel", "person day"),
    "subscription": ("cancel", "title"),
    "appointment": ("reserve cancel", "person day time"),
    "meeting": ("reserve cancel", "person day time"),
    "call": ("reserve cancel", "person time"),
    "dinner": ("reserve cancel", "venue count time"),
    "brunch": ("reserve", "venue count day"),
    "seat": ("reserve", "title count"),
    "locker": ("reserve", "venue day"),
    "shuttle": ("reserve cancel", "destination time"),
    "car": ("reserve cancel", "city day"),
    "van": ("reserve", "city day"),
    "studio": ("reserve", "day minutes"),
    "sauna": ("reserve on off", "time minutes"),
    "pool": ("reserve", "day count"),
    "babysitter": ("reserve cancel", "day time"),
    "cleaner": ("reserve cancel", "day room"),
    "plumber": ("reserve", "day room"),
    "vet": ("reserve", "person day"),
    "dentist": ("reserve", "day time"),
    "doctor": ("reserve cancel", "day time"),
    "stock level": ("check", "title"),
    "exchange rate": ("check", "city"),
    "bus times": ("check", "destination"),
    "train times": ("check", "destination day"),
    "parcel": ("send check", "person city"),
    "letter": ("send", "person city"),
    "message": ("send", "person title"),
    "budget": ("set", "amount"),
    "limit": ("set", "amount"),
}
# the objects of eval/live_tools.py's four prompts: never in training
LIVE_OBJECTS = ("table", "ride", "lights", "thermostat")


def object_split(obj: str) -> str:
    return "test" if obj in LIVE_OBJECTS or held_out(("tool_open", obj), 25) else "train"


def say_value(rng: random.Random, kind: str) -> tuple[Any, str]:
    """(the JSON value, how the user says it) for one argument kind."""
    if kind == "count":
        c = rng.randint(1, 10)
        return c, rng.choice([NUMBER_WORDS[c - 1], str(c)])
    if kind == "time":
        h = rng.randint(1, 12)
        said = rng.choice([str(h), f"{h}:{rng.choice([15, 30, 45]):02d}", f"{h}pm", f"{h}am"])
        return said, said
    if kind == "day":
        d = rng.choice(DAYS)
        return d, d if d in ("today", "tomorrow") else f"on {d}"
    simple = {"city": CITIES, "person": NAMES, "room": ROOMS, "title": TITLES, "venue": PLACES}
    if kind in simple:
        v = rng.choice(simple[kind])
        return v, v
    if kind == "destination":
        v = rng.choice(SPOTS)
        return v, v
    lo, hi = {"amount": (5, 500), "level": (1, 30), "minutes": (5, 90)}[kind]
    n = rng.randint(lo, hi)
    return n, str(n)


def phrase(rng: random.Random, kind: str, value_said: str) -> str:
    if kind == "day":
        return value_said
    return rng.choice(SLOTS[kind].phrases).format(v=value_said)


def tool_name(obj: str, verb: str) -> str:
    return f"{verb}_{obj.replace(' ', '_')}"


def build_tool(
    rng: random.Random, w: random.Random, obj: str, action: str, held: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """A tool's schema and its slot -> argument name map."""
    verbs, desc_verb, _, _ = ACTIONS[action]
    kinds = OBJECTS[obj][1].split()
    names: dict[str, str] = {}
    props: dict[str, Any] = {}
    for k in kinds:
        s = SLOTS[k]
        pool = s.held_names if held and w.random() < 0.6 else s.names
        name = w.choice([n for n in pool if n not in names.values()] or [k])
        names[k] = name
        props[name] = {"type": s.type, "description": w.choice(s.about)}
    schema = {
        "type": "function",
        "function": {
            "name": tool_name(obj, rng.choice(verbs)),
            "description": f"{desc_verb} {article(obj)} {obj}.",
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    return schema, names


def article(obj: str) -> str:
    if obj.endswith("s"):
        return "some"
    return "an" if obj[0] in "aeiou" else "a"


class ToolOpen(ToolCall):
    name = "tool_open"
    strata: tuple[str, ...] = ("call",)
    max_answer_tokens = 80

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        w = wording or rng
        held = split == "test" and phrasing == "held-out"
        objs = sorted(o for o in OBJECTS if object_split(o) == split)
        obj = rng.choice(objs)
        action = rng.choice(OBJECTS[obj][0].split())
        schema, names = build_tool(rng, w, obj, action, held)
        values = {k: say_value(rng, k) for k in OBJECTS[obj][1].split()}
        args = [phrase(rng, k, said) for k, (_, said) in values.items()]
        rng.shuffle(args)
        _, _, wordings, held_wordings = ACTIONS[action]
        template = w.choice(held_wordings if held else wordings)
        prefix = w.choice(HELD_PREFIXES if held else PREFIXES)
        if split == "train":
            template = roughen(w, template)
        request = prefix + template.format(a=article(obj), obj=obj, args=" ".join(args))
        others = [o for o in OBJECTS if o != obj and object_split(o) == "train"]
        tools = [schema]
        for o in rng.sample(others, rng.randint(0, 2)):
            tools.append(build_tool(rng, w, o, rng.choice(OBJECTS[o][0].split()), held)[0])
        rng.shuffle(tools)
        call = {
            "name": schema["function"]["name"],
            "arguments": {names[k]: v for k, (v, _) in values.items()},
        }
        ex = Exchange(request, obj, tools, call)
        return self._call_item([{"role": "user", "content": request}], ex, "call")
