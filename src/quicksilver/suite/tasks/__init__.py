"""The task suite: a registry of seeded generators with exact verifiers (see base.py)."""

from __future__ import annotations

from ...errors import ConfigError
from .apply_edit import ApplyEdit
from .arith import Countdown, Multiply
from .base import Item, Task, split_reply
from .chat import Chat
from .copy_text import CopyCode, CopyText
from .fim import Fim
from .next_edit import NextEdit
from .path_star import PathStar
from .sudoku4 import Sudoku4
from .tool_call import ToolCall, ToolLoop
from .tool_open import ToolOpen

TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        PathStar(),
        Sudoku4(),
        Countdown(3),
        Countdown(4),
        Multiply(),
        ToolCall(),
        ToolLoop(),
        ToolOpen(),
        Chat(),
        Fim(),
        ApplyEdit(),
        NextEdit(),
        CopyText("copy_text", 260),
        CopyText("copy_short", 60),
        CopyCode(),
        ApplyEdit("apply_edit_made_up", made_up=True),
        NextEdit("next_edit_made_up", made_up=True),
        CopyCode("copy_code_made_up", made_up=True),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    return TASKS[name]


__all__ = ["TASKS", "Item", "Task", "get_task", "split_reply"]
