"""A live terminal view of the canvas being refined (``quicksilver generate --show``)."""

from __future__ import annotations

import time
from collections.abc import Generator

from rich.console import Console
from rich.live import Live
from rich.text import Text

from .pipeline import GenerationResult
from .sampling.core.state import RowEvent
from .tokenizer import Tokenizer

MASK_GLYPH = "░"


def render(ev: RowEvent, tok: Tokenizer, mask_id: int) -> Text:
    new = {p for p, _ in ev.committed}
    redo = set(ev.remasked)
    out = Text()
    out.append(
        f"step {ev.step:>3}  nfe {ev.row.nfe:>3}  +{len(ev.committed):<3} ", style="bold cyan"
    )
    out.append(f"{'done' if ev.done else ''}\n", style="bold green")
    for pos, t in enumerate(ev.canvas or []):
        if t == mask_id:
            out.append(MASK_GLYPH, style="red" if pos in redo else "grey42")
        else:
            piece = tok.decode([t], skip_special_tokens=False)
            out.append(piece, style="bold green" if pos in new else "")
    return out


def show(
    stream: Generator[RowEvent, None, GenerationResult],
    tok: Tokenizer,
    mask_id: int,
    delay: float = 0.0,
    console: Console | None = None,
) -> GenerationResult:
    console = console or Console()
    with Live(Text(""), console=console, refresh_per_second=30, transient=False) as live:
        while True:
            try:
                ev = next(stream)
            except StopIteration as stop:
                return stop.value
            live.update(render(ev, tok, mask_id))
            if delay:
                time.sleep(delay)
