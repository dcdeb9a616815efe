"""Chat templates rendered with a time and output-size budget, so a checkpoint's template can never
hang or exhaust the process.

Jinja's immutable sandbox already stops templates from running code; it does not stop them from
looping for ever (``{% for i in range(100000) %}{% for j in range(100000) %}``) or from building a
gigabyte string (``'x' * 10**9``). Templates compile to Python, so ``render_bounded`` traces the
rendering thread (``sys.settrace``: every line of the template's code checks the deadline), streams
the output through ``generate()`` and counts it (time is the rendering thread's CPU time), and the environment intercepts ``*``/``**`` to
refuse oversized results before they are built. ``include``/``import``/``extends`` reach a loader
that refuses them with a clear message (a template names no other files).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from jinja2 import BaseLoader, Environment, Template, TemplateError, TemplateNotFound
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_RENDER_SECONDS = 1.0
MAX_RENDER_CHARS = 4 * 1024 * 1024
MAX_BINOP_ITEMS = 1024 * 1024  # length of a sequence built by ``*``; bit length of a ``**`` result


class TemplateBudgetError(TemplateError):
    """The template ran past its time or output budget."""


@dataclass(frozen=True)
class RenderBudget:
    seconds: float = MAX_RENDER_SECONDS
    chars: int = MAX_RENDER_CHARS


class _NoLoader(BaseLoader):
    def get_source(self, environment: Environment, template: str) -> Any:
        raise TemplateNotFound(
            f"{template!r}: a chat template may not include, import or extend other templates"
        )


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus bounded ``*`` and ``**``."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, str | list | tuple) and isinstance(n, int):
                if len(seq) * n > MAX_BINOP_ITEMS:
                    raise SecurityError(f"a sequence of {len(seq) * n} items is too large")
        if operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > MAX_BINOP_ITEMS:
                raise SecurityError("the power is too large")
        return super().call_binop(context, operator, left, right)


def _raise(msg: str) -> None:
    raise TemplateError(msg)


def template_env() -> GuardedEnvironment:
    """The environment every chat template compiles in (HF's ``raise_exception`` and ``tojson``)."""
    env = GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=_NoLoader())
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env


def render_bounded(template: Template, budget: RenderBudget | None = None, **ctx: Any) -> str:
    """Render in this thread under ``budget`` (raises ``TemplateBudgetError`` past it)."""
    b = budget or RenderBudget()
    deadline = time.thread_time() + b.seconds  # this thread's CPU time: a paused process, or a
    # thread waiting for the interpreter while another decodes, is not a template that loops

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if time.thread_time() > deadline:
            raise TemplateBudgetError(f"the chat template ran longer than {b.seconds:g} s")
        return tracer

    out: list[str] = []
    size = 0
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for chunk in template.generate(**ctx):
            size += len(chunk)
            if size > b.chars:
                raise TemplateBudgetError(f"the chat template wrote more than {b.chars} characters")
            out.append(chunk)
    finally:
        sys.settrace(previous)
    return "".join(out)
