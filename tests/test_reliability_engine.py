"""The engine's one threading rule under stress: threads adding, cancelling and reading sizes while
another thread steps (``Engine.add`` once iterated the command deque while the engine thread popped
from it: "deque mutated during iteration") — every request ends exactly once (issue 14)."""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from quicksilver.engine import EngineConfig, EngineOverloaded, EngineRequest
from quicksilver.sampling import SamplerConfig
from quicksilver.server.mock_engine import MockEngine

SUBMITTERS, PER_THREAD = 4, 150


@pytest.fixture()
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("round", range(3))  # the old race showed in about half the rounds
def test_add_cancel_and_step_from_different_threads(fast_switching: None, round: int) -> None:
    engine = MockEngine(config=EngineConfig(max_batch=8, max_waiting=PER_THREAD * SUBMITTERS))
    prompt = engine.tokenizer.encode("Tell me more")
    errors: list[BaseException] = []
    finals: Counter[str] = Counter()
    added: list[str] = []
    lock = threading.Lock()
    submitting = threading.Event()
    submitting.set()

    def submit(t: int) -> None:
        rng = random.Random(t + 10 * round)
        try:
            for i in range(PER_THREAD):
                rid = f"t{t}-{i}"
                engine.add(EngineRequest(rid, prompt, SamplerConfig(max_new_tokens=4)))
                with lock:
                    added.append(rid)
                _ = engine.num_waiting, engine.has_work  # readers race the engine thread too
                if rng.random() < 0.5:
                    engine.cancel(rid)
        except EngineOverloaded:
            pass
        except BaseException as e:
            errors.append(e)

    def step() -> None:
        try:
            while submitting.is_set() or engine.has_work:
                for ev in engine.step():
                    if ev.done:
                        finals[ev.request_id] += 1
        except BaseException as e:
            errors.append(e)
            submitting.clear()

    stepper = threading.Thread(target=step)
    stepper.start()
    threads = [threading.Thread(target=submit, args=(t,)) for t in range(SUBMITTERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    submitting.clear()
    stepper.join(120)
    assert not errors, errors[:3]
    assert len(added) == SUBMITTERS * PER_THREAD
    assert set(finals) == set(added) and set(finals.values()) == {1}  # each ends exactly once
    assert not engine.has_work and engine.num_waiting == 0 and not engine._pending_ids
