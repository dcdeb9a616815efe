"""Ray Serve request routers for the quicksilver replicas (``serve --routing prefix|random``).

``PrefixAffinityRouter`` ranks first the replica that served the longest prefix of the request
(``routing.py``: cumulative hashes of the prompt text's whole blocks, sent by the ingress as the
``route_key`` keyword); the other replicas form the second rank, where Ray Serve picks the least
loaded one. A request with no known prefix goes to the least loaded replica (ties at random). ``RandomRouter`` is
the baseline of the benchmark: one replica drawn at random.

Both are Ray Serve custom request routers (``ray.serve.request_router.RequestRouter``, alpha API);
Ray Serve probes each chosen rank's queue lengths and moves to the next rank when a replica is full.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from .routing import PrefixTable, prefer


def _key(pending: PendingRequest | None) -> list[str]:
    if pending is None:
        return []
    key = pending.kwargs.get("route_key")
    return list(key) if isinstance(key, (list, tuple)) else []


class PrefixAffinityRouter(RequestRouter):
    """The replica holding the request's prefix first, then the least loaded."""

    def initialize_state(self, imbalance: int = 4, **kwargs: Any) -> None:
        self.table: PrefixTable[ReplicaID] = PrefixTable()
        self.imbalance = imbalance

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(rid) or 0 for rid in by_id}
        first = prefer(self.table, _key(pending_request), loads, self.imbalance)
        if first is None:  # Ray Serve takes the least loaded of the rank, the first among equals
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        rest = [r for rid, r in by_id.items() if rid != first]
        return [[by_id[first]], rest] if rest else [[by_id[first]]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self.table.record(_key(pending_request), replica_id)


class RandomRouter(RequestRouter):
    """One replica at random (the baseline routing of ``bench serve``)."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        return [[random.choice(candidate_replicas)]] if candidate_replicas else []


ROUTERS = {
    "prefix": f"{__name__}:PrefixAffinityRouter",
    "random": f"{__name__}:RandomRouter",
}
