"""``quicksilver bench soak`` end to end on the mock engine: streams, disconnects and refused bursts,
zero failures, hostile schemas refused meanwhile, RSS read from the server process, and the JSON
last line (issues 14, 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # a server, a poller process and 6 s of soak: ~20 s (make test-slow, CI)
def test_bench_soak_on_the_mock_engine_reports_zero_failures() -> None:
    cmd = [sys.executable, "-m", "quicksilver.cli", "bench", "soak", "--mock"]
    cmd += ["--streams", "4", "--minutes", "0.1", "--burst", "6", "--burst-every", "1"]
    cmd += ["--disconnect", "0.3", "--hostile", "1"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["bench"] == "soak" and report["failures"] == 0, report["first_failures"]
    o = report["outcomes"]
    assert o["completed"] > 0 and o.get("disconnected", 0) > 0
    assert o["refused"] > 0  # bursts above --max-concurrent are refused with Retry-After
    assert o["hostile_refused"] > 0 and report["hostile_400_p99_ms"] > 0  # schemas over budget: 400
    assert report["rss_start_mb"] > 0 and report["rss_end_mb"] > 0
    assert report["health_p50_ms"] is not None and report["e2e_p99_s"] >= report["e2e_p50_s"]
