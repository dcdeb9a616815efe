"""A bounded schemathesis run over the whole OpenAPI surface (the app with the mock engine, in
process): valid and invalid requests generated from the schema; any 5xx fails (issue 14).

Run with ``make test-fuzz`` (CI runs it after ``make test``). ``FUZZ_EXAMPLES`` sets the examples
per operation and mode (default 60: about 3,000 requests, two minutes on 2 shared cores); every response is
counted and the total printed, so a run can show how many requests it made.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from quicksilver.server import ServerConfig, build_app, build_backend

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
# small limits keep each generated request cheap on the mock engine, the checks are the same
CFG = ServerConfig(mock=True, max_tokens=64, default_max_tokens=16, max_reasoning_tokens=16)
APP = build_app(build_backend(CFG), CFG)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    no_shrink=True,
)
STATUSES: Counter[int] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report() -> object:
    yield
    total = sum(STATUSES.values())
    print(f"\nfuzz: {total} requests, statuses {dict(sorted(STATUSES.items()))}")


@pytest.mark.fuzz
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case: schemathesis.Case) -> None:
    response = case.call()
    STATUSES[response.status_code] += 1
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
