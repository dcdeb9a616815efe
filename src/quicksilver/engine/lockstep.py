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

from typing import TYPE_CHECKING

import torch.distributed as dist

from ..sampling.decoders.row_decoder import R, RowDecoder
from .engine import Command, Engine, EngineConfig, EngineRequest

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# what rank 0 broadcasts when it shuts down
STOP = None
# one step's commands as they cross the wire: ("add", the request) or ("cancel", its id)
Wire = list[tuple[str, EngineRequest | str]]


class LockstepEngine(Engine[R]):
    """Rank 0's engine: each step's commands go to every rank before the step runs."""

    def __init__(
        self, decoder: RowDecoder[R], config: EngineConfig | None, group: ProcessGroup | None
    ) -> None:
        super().__init__(decoder, config)
        self.group = group

    def _take_commands(self) -> list[Command[R]]:
        commands = super()._take_commands()
        wire: Wire = [(kind, arg if isinstance(arg, str) else arg.req) for kind, arg in commands]
        dist.broadcast_object_list([wire], src=0, group=self.group)
        return commands

    def close(self) -> None:
        """Release the followers (after the last step)."""
        dist.broadcast_object_list([STOP], src=0, group=self.group)


def follow(engine: Engine[R], group: ProcessGroup | None) -> int:
    """A rank > 0: mirror rank 0's steps until it stops; returns the steps run."""
    steps = 0
    while True:
        box: list[Wire | None] = [STOP]
        dist.broadcast_object_list(box, src=0, group=group)
        wire = box[0]
        if wire is STOP:
            return steps
        for _, arg in wire:
            if isinstance(arg, str):
                engine.cancel(arg)
            else:
                engine.add(arg)
        engine.step()
        steps += 1
