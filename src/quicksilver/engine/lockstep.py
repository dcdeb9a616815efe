"""One engine over a tensor-parallel group: every rank runs the same ``Engine`` in lockstep.

Under tensor parallelism (models/tensor_parallel.py) each rank holds a shard of the model and every
forward pass is a collective, so every rank must run the same steps on the same rows. Rank 0 (the
server) runs a ``LockstepEngine``: at each step, before anything else, it broadcasts the adds and
cancels it is about to apply. The other ranks run ``follow``: receive that list, apply it to their
own ``Engine``, step. Admission, batching and sampling are deterministic functions of that list
(seeded generators, replicated logits), so the ranks never diverge and the collectives line up.
The broadcast goes over a gloo group (host objects), whatever the backend of the model's group.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..sampling.decoders.row_decoder import RowDecoder
from .engine import Engine, EngineConfig

STOP = None  # what rank 0 broadcasts when it shuts down


class LockstepEngine(Engine):
    """Rank 0's engine: each step's commands go to every rank before the step runs."""

    def __init__(self, decoder: RowDecoder[Any], config: EngineConfig | None, group: Any) -> None:
        super().__init__(decoder, config)
        self.group = group

    def _take_commands(self) -> list[tuple[str, Any]]:
        commands = super()._take_commands()
        wire = [(kind, arg.req if kind == "add" else arg) for kind, arg in commands]
        dist.broadcast_object_list([wire], src=0, group=self.group)
        return commands

    def close(self) -> None:
        """Release the followers (after the last step)."""
        dist.broadcast_object_list([STOP], src=0, group=self.group)


def follow(engine: Engine, group: Any) -> int:
    """A rank > 0: mirror rank 0's steps until it stops; returns the steps run."""
    steps = 0
    while True:
        box: list[Any] = [STOP]
        dist.broadcast_object_list(box, src=0, group=group)
        if box[0] is STOP:
            return steps
        for kind, arg in box[0]:
            if kind == "add":
                engine.add(arg)
            else:
                engine.cancel(arg)
        engine.step()
        steps += 1
