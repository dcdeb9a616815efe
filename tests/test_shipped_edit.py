"""The shipped edit model (``assets/model-edit``, ``quicksilver-edit``) behind the edit routes of the
app ``make run`` serves: it is loaded beside the default, the routes reach it with no ``model``
named and with Mercury Edit's ids, and it merges held-out apply_edit items exactly through
``/v1/apply/completions``. The 200-item figures are the slow check (docs/MODEL.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from quicksilver.assets import embedded_edit_model_path, embedded_model_path
from quicksilver.eval.served import EDIT_ROUTES, edit_body, served_edits
from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.twin import build_companions
from quicksilver.suite.tasks import get_task

pytestmark = pytest.mark.skipif(
    embedded_edit_model_path() is None or embedded_model_path() is None,
    reason="this build ships no edit model",
)


@pytest.fixture(scope="module")
def make_run() -> Iterator[TestClient]:
    """The app of ``make run``: the default model with its AR twin and the edit model."""
    cfg = ServerConfig()
    served = build_served_model(cfg)
    with TestClient(build_app(served, cfg, build_companions(cfg, served.name))) as c:
        yield c


def test_make_run_lists_and_routes_to_the_edit_model(make_run: TestClient) -> None:
    ids = [m["id"] for m in make_run.get("/v1/models").json()["data"]]
    assert ids == ["quicksilver", "quicksilver-ar", "quicksilver-edit"]
    task = get_task("apply_edit")
    (item,) = task.test_items(1, 1234)
    for model in (None, "mercury-edit", "quicksilver-edit"):
        body = edit_body(item.messages or [], task.max_answer_tokens + 8, model)
        r = make_run.post(EDIT_ROUTES["apply_edit"], json=body).json()
        assert r["model"] == "quicksilver-edit"
    body = edit_body(item.messages or [], 16, "quicksilver")
    assert make_run.post(EDIT_ROUTES["apply_edit"], json=body).json()["model"] == "quicksilver"


def test_held_out_merges_are_exact(make_run: TestClient) -> None:
    """Eight templated apply_edit test items through the route: the four it merged exactly when it
    shipped (items 0, 3, 6, 7; one may flip), at several tokens a pass (the copy drafts)."""
    task = get_task("apply_edit")
    exact, tokens, nfe = 0, 0, 0
    for item in task.test_items(8, 1234):
        body = edit_body(item.messages or [], task.max_answer_tokens + 8, None)
        r = make_run.post(EDIT_ROUTES["apply_edit"], json=body).json()
        exact += task.verify(item, r["choices"][0]["message"]["content"])
        tokens, nfe = tokens + r["usage"]["completion_tokens"], nfe + r["diffusion"]["nfe"]
    assert exact >= 3
    assert tokens / nfe >= 4


@pytest.mark.slow
@pytest.mark.parametrize("phrasing", ["templated", "held-out"])
def test_edit_model_accuracy_through_the_routes(phrasing: str) -> None:
    """The model card's figures, 200 items a task through the routes (greedy)."""
    rep = served_edits(["apply_edit"], 200, 1234, phrasing)
    assert all(r["model"] == "quicksilver-edit" and r["failed"] == 0 for r in rep.values())
    # e1 measured 0.305 / 0.125 (docs/MODEL.md)
    floor = {"templated": 0.25, "held-out": 0.09}[phrasing]
    assert rep["apply_edit"]["accuracy"] >= floor


def test_eval_routes_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """``quicksilver eval --routes``: the edit tasks through their routes, one JSON line; a task
    with no route is a one-line error."""
    import json

    from quicksilver.cli import main

    assert main(["eval", "--routes", "--tasks", "apply_edit", "--limit", "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["routes"]["apply_edit"]["model"] == "quicksilver-edit"
    assert rep["routes"]["apply_edit"]["n"] == 1
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--routes", "--tasks", "multiply", "--limit", "1"])
    assert exit_.value.code != 0 and "--routes scores" in capsys.readouterr().err
