"""``quicksilver bench tools``: tools the model has never seen, called through the live API.

A new user brings their own tools and asks in their own words. This starts ``quicksilver serve``
(real HTTP), and through the ``openai`` SDK sends, with ``tool_choice: "auto"`` and temperature 0:

- the four ``LIVE`` prompts below, written before the model was trained on ``tool_open`` and never
  changed after: each offers the tool it needs and a distractor, and is right when the reply calls
  the expected tool with every argument's value among the accepted spellings;
- ``--held-out N`` items of ``tool_open``'s test split in its held-out wording: tools, argument
  names and request wordings never trained on, right when the one call equals the expected one.

Ends with one line of JSON: ``live`` (right of 4, with each reply) and ``held_out`` (accuracy).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from ..cli_util import add_revision_arg
from ..suite.tasks import get_task
from .serve import launch_server


def fn(name: str, about: str, **params: tuple[str, str]) -> dict[str, Any]:
    """An OpenAI tool: ``params`` maps each argument to (JSON type, description)."""
    props = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": about,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


@dataclass(frozen=True)
class Live:
    prompt: str
    tools: list[dict[str, Any]]
    name: str  # the tool to call
    accept: dict[str, tuple[Any, ...]]  # argument -> accepted values


TABLE = fn(
    "reserve_table",
    "Reserve a table at the restaurant.",
    party_size=("integer", "Number of guests."),
    time=("string", "Time of the reservation."),
)
LIGHTS = fn("turn_off_lights", "Turn off the lights in a room.", room=("string", "Room name."))
RIDE = fn(
    "request_ride",
    "Request a ride from a car service.",
    destination=("string", "Where to go."),
    pickup_time=("string", "When to be picked up."),
)
THERMOSTAT = fn(
    "set_thermostat",
    "Set the thermostat's target temperature.",
    temperature=("integer", "Target temperature in degrees."),
)
WEATHER = fn("get_weather", "Get the weather for a city.", city=("string", "City name."))
MUSIC = fn("play_music", "Play a song.", song=("string", "Song title."))

LIVE = [
    Live(
        "can you get me a table for two at 7?",
        [WEATHER, TABLE],
        "reserve_table",
        {"party_size": (2,), "time": ("7", "7pm", "7 pm", "7:00", "19:00", "7:00 pm")},
    ),
    Live(
        "switch off the lights in the bedroom",
        [LIGHTS, MUSIC],
        "turn_off_lights",
        {"room": ("bedroom", "the bedroom")},
    ),
    Live(
        "I need a ride to the airport at 6:30",
        [TABLE, RIDE],
        "request_ride",
        {"destination": ("airport", "the airport"), "pickup_time": ("6:30", "6:30am", "06:30")},
    ),
    Live(
        "set the thermostat to 21 degrees",
        [MUSIC, THERMOSTAT],
        "set_thermostat",
        {"temperature": (21,)},
    ),
]


def calls_of(message: Any) -> list[dict[str, Any]]:
    """The reply's tool calls as {"name", "arguments"} (arguments None when not a JSON object)."""
    out = []
    for c in message.tool_calls or []:
        try:
            args = json.loads(c.function.arguments or "{}")
        except json.JSONDecodeError:
            args = None
        out.append({"name": c.function.name, "arguments": args})
    return out


def live_right(case: Live, calls: list[dict[str, Any]]) -> bool:
    if len(calls) != 1 or calls[0]["name"] != case.name:
        return False
    args = calls[0]["arguments"]
    return isinstance(args, dict) and all(args.get(k) in ok for k, ok in case.accept.items())


def ask(client: Any, model: str, messages: list[dict[str, Any]], tools: list[Any]) -> Any:
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice="auto",
        temperature=0,
        max_tokens=96,
        extra_body={"reasoning_effort": "none"},
    )
    return r.choices[0].message


def run(args: argparse.Namespace) -> int:
    import openai

    task = get_task("tool_open")
    items = task.test_items(args.held_out, phrasing="held-out") if args.held_out else []
    with launch_server(args.model, [], revision=args.revision) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        live: list[dict[str, Any]] = []
        for case in LIVE:
            msg = ask(client, model, [{"role": "user", "content": case.prompt}], case.tools)
            calls = calls_of(msg)
            live.append({"prompt": case.prompt, "right": live_right(case, calls), "calls": calls})
            print(f"{'ok ' if live[-1]['right'] else 'NO '} {case.prompt!r} -> {calls}", flush=True)
        right = 0
        for it in items:
            calls = calls_of(ask(client, model, it.messages or [], it.tools or []))
            right += calls == [it.data["call"]]
    n_live = sum(bool(c["right"]) for c in live)
    report: dict[str, Any] = {
        "bench": "tools",
        "model": args.model or "embedded",
        "live": {"right": n_live, "of": len(LIVE), "cases": live},
        "held_out": {"n": len(items), "accuracy": right / max(len(items), 1)},
    }
    print(
        f"live prompts: {n_live}/{len(LIVE)}; held-out tool_open: "
        f"{report['held_out']['accuracy']:.3f} of {len(items)}",
        flush=True,
    )
    print(json.dumps(report))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint to serve (default: the embedded model)")
    add_revision_arg(p)
    p.add_argument(
        "--held-out", type=int, default=50, help="tool_open held-out items to send (default 50)"
    )
