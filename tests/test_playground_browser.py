"""The playground in a real browser: Debian's headless Chromium (``/usr/bin/chromium``, installed by
``make test`` when missing; no browser is ever downloaded) driven by Playwright, against a real
``quicksilver serve`` on the embedded model and its AR twin, with an API key.

Keyboard only (no mouse clicks): enter the key, set the decoding controls, send a prompt, watch the
canvas condense (at least three frames, masked cells becoming committed), compare the final text
with a non-streamed request at the same seed and temperature 0, step through the recorded frames,
then race the two models and check both panes finish with their stats. Screenshots (PNG) of a
mid-denoising frame and of race mode go to ``$QUICKSILVER_SCREENSHOTS`` (``make screenshots``
writes the README's, in docs/img/) or to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quicksilver.assets import embedded_ar_model_path, embedded_model_path


def find_chromium() -> Path | None:
    """Debian's /usr/bin/chromium, else the first Chromium on PATH."""
    if Path("/usr/bin/chromium").exists():
        return Path("/usr/bin/chromium")
    found = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    return Path(found) if found else None


CHROMIUM = find_chromium()
# Under CI (`.ci/run` sets CI) a missing browser fails the test instead of skipping it.
BROWSER_REQUIRED = bool(os.environ.get("CI"))
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None and not BROWSER_REQUIRED,
        reason="needs Chromium (make test installs Debian's chromium)",
    ),
    pytest.mark.skipif(
        embedded_model_path() is None or embedded_ar_model_path() is None,
        reason="this build ships no embedded model and AR twin",
    ),
]
sync_api = pytest.importorskip("playwright.sync_api")

from test_server_live import RemoteServer  # noqa: E402  (the live-server helper of the suite)

KEY = "playground-key"
PROMPT = "Hello! What can you do?"
SETTINGS = {"c-effort": "none", "c-threshold": "0.95", "c-block": "8", "c-max": "64"}
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
]
# Records every live canvas render (the page sets data-step on each one) with its cell counts.
WATCH = """() => {
  window.__seen = [];
  const box = document.querySelector('#canvas');
  new MutationObserver(() => window.__seen.push({
    step: Number(box.dataset.step), phase: box.dataset.phase,
    masked: box.querySelectorAll('.cell.masked').length,
    committed: box.querySelectorAll('.cell.fresh, .cell.old').length,
  })).observe(box, {childList: true});
}"""
CELLS = """() => {
  const box = document.querySelector('#canvas');
  return {masked: box.querySelectorAll('[data-state=masked]').length,
          fresh: box.querySelectorAll('[data-state=fresh]').length,
          old: box.querySelectorAll('[data-state=old]').length};
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[RemoteServer]:
    srv = RemoteServer(key=KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.fail("CI is set and no Chromium was found (/usr/bin/chromium or PATH)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1440, "height": 1000},
        )
        yield ctx
        ctx.close()


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("QUICKSILVER_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def open_page(context: Any, server: RemoteServer, width: int = 1440) -> Any:
    """Load the page and give it the key, typed as a person would (the page asks for it)."""
    page = context.new_page()
    page.set_viewport_size({"width": width, "height": 1000})
    page.goto(server.url + "/")
    page.wait_for_selector("#key-form:not([hidden])")
    assert page.evaluate("document.activeElement.id") == "api-key"
    page.keyboard.type(KEY)
    page.keyboard.press("Enter")
    page.wait_for_selector("#c-model option:nth-child(2)", state="attached")  # both models listed
    return page


def send(page: Any, text: str) -> None:
    """Type a message, send it with Enter, wait until its reply is finished."""
    before = page.locator(".msg.assistant[data-state='done']").count()
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")
    page.locator(".msg.assistant[data-state='done']").nth(before).wait_for(timeout=60_000)


def new_chat(page: Any) -> None:
    page.locator("#clear").focus()
    page.keyboard.press("Enter")
    assert page.locator(".msg").count() == 0


def set_controls(page: Any, values: dict[str, str]) -> None:
    for el_id, value in values.items():
        el = page.locator("#" + el_id)
        if el.evaluate("e => e.tagName") == "SELECT":
            el.select_option(value)
        else:
            el.fill(value)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_chat_canvas_and_step_through(server: RemoteServer, context: Any, shots: Path) -> None:
    page = open_page(context, server)
    set_controls(page, SETTINGS)
    page.evaluate(WATCH)
    send(page, PROMPT)
    reply = page.locator(".msg.assistant").last
    shown = reply.locator(".answer").inner_text()

    # the same request, not streamed, through the official client: the same text
    r = server.client(KEY).chat.completions.create(
        model="quicksilver",
        messages=[{"role": "user", "content": PROMPT}],
        reasoning_effort="none",
        max_tokens=64,
        temperature=0,
        seed=0,
        extra_body={"threshold": 0.95, "block_length": 8},
    )
    assert shown == r.choices[0].message.content and shown.strip()

    # live: the canvas drawn while it decodes, masked cells becoming committed. The embedded model
    # answers this in ~9 passes, and frames that arrive within one task of the page are drawn (and
    # observed) once, so live frames are at least two; the replay below checks every frame
    seen = page.evaluate("window.__seen")
    answer = [s for s in seen if s["phase"] == "answer"]
    assert len({s["step"] for s in answer}) >= 2
    assert answer[0]["masked"] > 0 and answer[-1]["masked"] == 0
    assert answer[-1]["committed"] > answer[0]["committed"]
    stats = {
        dd.get_attribute("data-stat"): dd.inner_text() for dd in reply.locator(".stats dd").all()
    }
    assert int(stats["nfe"]) == r.model_extra["diffusion"]["nfe"]
    assert int(stats["tokens"]) == r.usage.completion_tokens
    assert float(stats["tpf"]) > 1.0 and stats["tps"] != "–" and stats["ttft"].endswith("ms")

    # step through the recorded frames with the keyboard
    reply.locator(".step-through").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "replay-range"
    n = int(page.locator("#replay-range").get_attribute("max")) + 1
    assert n >= 3
    frames = [page.evaluate(CELLS)]
    for _ in range(n - 1):
        page.keyboard.press("ArrowRight")
        frames.append(page.evaluate(CELLS))
    assert frames[0]["masked"] > 0 and frames[-1]["masked"] == 0
    assert all(a["masked"] >= b["masked"] for a, b in zip(frames, frames[1:]))
    assert any(f["fresh"] and f["old"] for f in frames)  # new commits beside earlier ones
    mid = max(
        range(n), key=lambda i: min(frames[i]["masked"], frames[i]["old"] + frames[i]["fresh"])
    )
    page.locator("#replay-range").fill(str(mid))
    assert page.locator("#replay-label").inner_text() == f"frame {mid + 1} of {n}"
    page.screenshot(path=str(shots / "playground-canvas.png"))
    assert_png(shots / "playground-canvas.png")
    page.locator("#replay-close").focus()
    page.keyboard.press("Enter")
    assert page.locator("#replay").is_hidden()

    # a reasoning phase: its own canvas frames, its text collapsed apart from the answer
    new_chat(page)
    set_controls(page, {"c-effort": "medium"})
    page.evaluate(WATCH)
    send(page, "Compute 347*28.")
    reply = page.locator(".msg.assistant").last
    assert "reasoning" in {s["phase"] for s in page.evaluate("window.__seen")}
    details = reply.locator("details.reasoning")
    assert details.is_visible() and details.get_attribute("open") is None
    assert reply.locator(".reasoning-text").text_content().strip()

    # a tool call is drawn as a call, not as text
    new_chat(page)
    set_controls(page, {"c-effort": "none"})
    page.locator("#c-tool").focus()
    page.keyboard.press("Space")
    send(page, "What is the weather in Paris?")
    call = page.locator(".msg.assistant").last.locator(".tool-calls code")
    assert re.fullmatch(r"call \w+\(\{.*\}\)", call.inner_text())


def test_race_mode(server: RemoteServer, context: Any, shots: Path) -> None:
    page = open_page(context, server)
    set_controls(page, SETTINGS)
    page.locator("#tab-chat").focus()
    page.keyboard.press("ArrowRight")  # tabs move with the arrow keys
    assert page.locator("#race-view").is_visible()
    page.locator("#race-prompt").fill(PROMPT)
    page.locator("#race-go").focus()
    page.keyboard.press("Enter")
    for pane in ("#pane-diffusion", "#pane-ar"):
        page.locator(f"{pane}[data-state='done']").wait_for(timeout=60_000)
    stats = {}
    for pane in ("diffusion", "ar"):
        dds = page.locator(f"#pane-{pane} .counters dd").all()
        stats[pane] = {dd.get_attribute("data-stat"): dd.inner_text() for dd in dds}
        assert int(stats[pane]["tokens"]) > 0 and int(stats[pane]["nfe"]) > 0
        assert stats[pane]["tps"] != "–" and stats[pane]["ttft"].endswith("ms")
        assert page.locator(f"#pane-{pane} .pane-text").inner_text().strip()
    assert float(stats["ar"]["tpf"]) <= 1.0 < float(stats["diffusion"]["tpf"])
    page.screenshot(path=str(shots / "playground-race.png"))
    assert_png(shots / "playground-race.png")


@pytest.mark.parametrize("width", [375, 1440])
def test_layout_and_keyboard_reach(server: RemoteServer, context: Any, width: int) -> None:
    page = open_page(context, server, width)
    for tab in ("chat", "race"):
        page.locator(f"#tab-{tab}").focus()
        page.keyboard.press("Enter")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.locator("#tab-chat").focus()
    page.keyboard.press("Enter")
    reached = set()
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.id"))
    assert {"prompt", "send", "c-effort", "c-threshold", "c-seed", "tab-chat"} <= reached


def test_without_key_and_without_twin(context: Any) -> None:
    """A server with no API key (the page never asks for one) and no AR twin (race mode says so)."""
    srv = RemoteServer("--mock", key=None)
    try:
        page = context.new_page()
        page.goto(srv.url + "/playground")
        page.wait_for_selector("#c-model option", state="attached")
        assert page.locator("#key-form").is_hidden()
        assert page.locator("#c-model").input_value() == "quicksilver-mock"
        send(page, "Hi")
        reply = page.locator(".msg.assistant").last
        assert reply.locator(".answer").inner_text() == "Hello! I am the quicksilver mock engine."
        page.locator("#tab-race").focus()
        page.keyboard.press("Enter")
        assert page.locator("#race-go").is_disabled()
        assert "no AR twin" in page.locator("#race-note").inner_text()
    finally:
        srv.stop()
