"""Token budgets of one turn: how the context left after the prompt is split between the answer
canvas, the reasoning phase and the tool-call canvases.

The rule: the server's own defaults always fit. A request that names no ``max_tokens`` gets an
answer sized to the room left (``default_max_tokens`` at most), the reasoning phase gets what is
left after the answer and any reserved call canvas (or is skipped below ``MIN_REASONING``), and a
structured canvas is shrunk to fit. Only a client's explicit number that cannot fit is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.errors import bad_request

MIN_REASONING = 8  # a reasoning budget smaller than this is skipped


@dataclass(frozen=True)
class Split:
    answer: int  # the answer phase's canvas (content, or the structured layout)
    reasoning: int  # the reasoning phase's budget (0: answer at once)


def check_prompt(ids: list[int], max_prompt: int, context: int, param: str) -> None:
    """A prompt is not empty and leaves at least one position of the context for the answer."""
    if not ids:
        raise bad_request("the prompt is empty", param)
    limit = min(max_prompt, context - 1)
    if len(ids) > limit:
        raise bad_request(
            f"the prompt has {len(ids)} tokens; at most {limit} are accepted",
            param,
            "context_length_exceeded",
        )


def check_explicit(
    max_tokens: int | None, room: int, cap: int, context: int, prompt: int, param: str
) -> None:
    """A client's own ``max_tokens`` must be within the server's cap and fit beside the prompt."""
    if max_tokens is None:
        return
    if max_tokens > cap:
        raise bad_request(f"{param}={max_tokens} is above this server's limit of {cap}", param)
    if max_tokens > room:
        raise bad_request(
            f"{param}={max_tokens} plus a prompt of {prompt} tokens exceeds the context of "
            f"{context}; at most {room} fit",
            param,
            "context_length_exceeded",
        )


def split(
    room: int,
    answer: int | None,
    reasoning: int,
    default: int,
    reserved: int = 0,
) -> Split:
    """Split ``room`` (context minus the answer-phase prompt) into answer and reasoning budgets.

    ``answer``: a fixed answer size (the client's max_tokens, or a structured canvas), else the
    default is sized to fit; ``reasoning``: what the effort would like; ``reserved``: tokens kept for
    tool-call canvases after the answer. Always ``answer + reasoning + reserved <= room`` when
    ``reserved < room`` and a fixed answer fits, and ``answer >= 1``."""
    free = max(1, room - reserved)
    if answer is None:
        answer = max(1, min(default, max(free - reasoning, free // 2)))
    think = min(reasoning, room - reserved - answer)
    return Split(answer, think if think >= MIN_REASONING else 0)
