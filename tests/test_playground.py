"""The playground's server side, in process: the page and its assets (content types, no key needed,
nothing from another origin), the API key, cross-origin refusal and ``--allowed-origins`` (CORS),
the per-position ``cells`` of ``diffusing`` chunks, and the AR twin (its engine against
``ar_generate``, served beside a diffusion model under its own id)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from quicksilver.assets import (
    embedded_ar_model_path,
    embedded_diffusion_model_path,
)
from quicksilver.engine import Engine, EngineRequest
from quicksilver.errors import ConfigError
from quicksilver.sampling import SamplerConfig
from quicksilver.sampling.decoders.autoregressive import ar_generate
from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.playground import STATIC, parse_origins
from quicksilver.server.serving.generation import MASK_GLYPH
from quicksilver.server.twin import AR_DEFAULTS, build_twin, served_twin

KEY = "sk-play"
SAME = "http://testserver"  # TestClient's Host


def client(**overrides: Any) -> TestClient:
    cfg = ServerConfig(mock=True, **overrides)
    return TestClient(build_app(build_served_model(cfg), cfg))


def error_code(r: Any, status: int) -> str:
    assert r.status_code == status, r.text
    return str(r.json()["error"]["code"])


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none", **extra}


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in text.split("\n\n") if x.startswith("data: {")]


@pytest.mark.parametrize("key", [None, KEY])
def test_page_and_assets(key: str | None) -> None:
    with client(api_key=key) as c:
        for path in ("/", "/playground"):
            r = c.get(path)
            assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
            assert "default-src 'self'" in r.headers["content-security-policy"]
            assert '<script src="/playground/playground.js"' in r.text
        js = c.get("/playground/playground.js")
        assert js.headers["content-type"] == "text/javascript; charset=utf-8"
        assert "diffusing: true" in js.text
        css = c.get("/playground/playground.css")
        assert (
            css.headers["content-type"] == "text/css; charset=utf-8" and ".cell.masked" in css.text
        )
        missing = c.get("/playground/secret.py")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert c.get("/playground/playground.html").status_code == 404  # assets only, by name
        models = c.get("/v1/models")
        if key:  # the page is open, the API behind it is not
            assert error_code(models, 401) == "invalid_api_key"
            models = c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert models.status_code == 200


def test_assets_reference_nothing_outside_the_package() -> None:
    files = sorted(STATIC.iterdir())
    assert {f.name for f in files} == {"playground.html", "playground.js", "playground.css"}
    for f in files:
        text = f.read_text()
        urls = re.findall(r"https?://[^\s\"'`)]+", text)
        assert urls == [] or all(u == "http://www.w3.org/2000/svg" for u in urls), (f, urls)


def test_cross_origin_refused_unless_allowed() -> None:
    with client() as c:
        evil = {"Origin": "http://evil.example"}
        assert error_code(c.get("/v1/models", headers=evil), 403) == "origin_not_allowed"
        r = c.post("/v1/chat/completions", json=chat_body(), headers=evil)
        assert (
            error_code(r, 403) == "origin_not_allowed"
            and "access-control-allow-origin" not in r.headers
        )
        pre = c.options(
            "/v1/chat/completions",
            headers={**evil, "Access-Control-Request-Method": "POST"},
        )
        assert error_code(pre, 403) == "origin_not_allowed"
        assert error_code(c.get("/", headers={"Origin": "null"}), 403) == "origin_not_allowed"
        # the page's own origin, and clients that send no Origin (SDKs, curl), are served
        assert c.get("/v1/models", headers={"Origin": SAME}).status_code == 200
        assert c.post("/v1/chat/completions", json=chat_body()).status_code == 200


def test_allowed_origins_get_cors() -> None:
    app_origin = "http://app.example:3000"
    with client(allowed_origins=f"{app_origin}/, http://other.example", api_key=KEY) as c:
        pre = c.options(
            "/v1/chat/completions",
            headers={
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert pre.status_code == 200  # answered before the key check: preflights carry no key
        assert pre.headers["access-control-allow-origin"] == app_origin
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        auth = {"Origin": app_origin, "Authorization": f"Bearer {KEY}"}
        r = c.post("/v1/chat/completions", json=chat_body(), headers=auth)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        r = c.get("/v1/models", headers={"Origin": app_origin})  # still needs the key
        assert error_code(r, 401) == "invalid_api_key"
        other = {"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"}
        assert error_code(c.get("/v1/models", headers=other), 403) == "origin_not_allowed"
    with client(allowed_origins="*") as c:
        r = c.get("/v1/models", headers={"Origin": "http://anywhere.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert parse_origins(" a/ ,, b ") == ["a", "b"] and parse_origins(None) == []


def test_diffusing_chunks_carry_cells() -> None:
    with client() as c:
        r = c.post(
            "/v1/chat/completions",
            json=chat_body(stream=True, diffusing=True, threshold=0.95, block_length=8),
        )
        events = sse_events(r.text)
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    frames = [
        e["choices"][0]["canvas"] for e in events if e["choices"] and "canvas" in e["choices"][0]
    ]
    assert len(frames) >= 3
    for f in frames:
        cells = f["cells"]
        assert sum(c is None for c in cells) == f["masked"]
        assert all(cells[p] is not None for p in f["fresh"]) and len(f["fresh"]) == f["committed"]
        drawn = "".join(MASK_GLYPH if c is None else c for c in cells)
        assert drawn.replace("<|im_end|>", "") == f["text"]
    last = frames[-1]["cells"]
    assert last[-1] == "<|im_end|>" and "".join(last[:-1]) == content


# ---- the AR twin -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def causal_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quicksilver.models.init import init_model

    return init_model(
        tmp_path_factory.mktemp("ckpt") / "tiny-ar", "tiny", seed=3, attention="causal"
    )


def run_all(eng: Engine) -> list[Any]:
    events = []
    while eng.has_work:
        events += eng.step()
    return events


def test_twin_engine_matches_ar_generate(causal_ckpt: Path) -> None:
    """The twin's engine (the causal decoder with no drafts) is AR decoding, batched: two requests
    in one engine, one with a forced first token, each equal to ``ar_generate`` token for token at
    one committed token per forward pass; cancellation and bad requests as on any engine."""
    import quicksilver

    pipe = quicksilver.load(causal_ckpt)
    prompt = pipe.tokenizer.encode("hello there")
    want = ar_generate(pipe.model, prompt, 12, pipe.stop_ids)
    eng = Engine(pipe.decoder)
    cfg = SamplerConfig(max_new_tokens=12, record_canvas=True, **AR_DEFAULTS)
    eng.add(EngineRequest("a", prompt, cfg))
    eng.add(EngineRequest("b", prompt, cfg, prefill={0: want.tokens[0]}))  # a forced first token
    events = run_all(eng)
    for rid in ("a", "b"):
        mine = [e for e in events if e.request_id == rid]
        assert [t for e in mine for t in e.new_tokens] == want.tokens
        assert all(len(e.committed) <= 2 for e in mine) and mine[-1].done
        assert mine[-1].result is not None and mine[-1].result.tokens == want.tokens
    a = [e for e in events if e.request_id == "a"]
    assert a[-1].nfe == want.nfe and all(len(e.new_tokens) == 1 for e in a if e.new_tokens)
    assert eng.totals["forward_passes"] == want.nfe  # both rows rode the same passes
    eng.add(EngineRequest("c", prompt, cfg))
    eng.step()
    eng.cancel("c")
    assert [e.finish_reason for e in run_all(eng)] == ["cancelled"]
    for bad in (
        EngineRequest("e", prompt, cfg, suffix=[5]),
        EngineRequest("g", prompt, SamplerConfig(max_new_tokens=10_000, **AR_DEFAULTS)),
    ):
        with pytest.raises(ConfigError):
            eng.add(bad)


@pytest.fixture(scope="module")
def twin_client(causal_ckpt: Path) -> Iterator[TestClient]:
    cfg = ServerConfig(mock=True)
    twin = served_twin(causal_ckpt, "mock-ar", cfg)
    with TestClient(build_app(build_served_model(cfg), cfg, [twin])) as c:
        yield c


def test_twin_served_by_model_id(twin_client: TestClient) -> None:
    c = twin_client
    cards = {m["id"]: m["attention"] for m in c.get("/v1/models").json()["data"]}
    assert cards == {"quicksilver-mock": "bidirectional", "mock-ar": "causal"}
    assert c.get("/v1/models/mock-ar").json()["attention"] == "causal"
    ar = c.post("/v1/chat/completions", json=chat_body(model="mock-ar", max_tokens=8)).json()
    assert ar["model"] == "mock-ar" and ar["diffusion"]["tpf"] <= 1.0
    assert ar["usage"]["completion_tokens"] <= 8
    mock = c.post("/v1/chat/completions", json=chat_body(model="quicksilver-mock")).json()
    assert mock["model"] == "quicksilver-mock" and mock["diffusion"]["tpf"] > 1.0
    r = c.post(
        "/v1/chat/completions",
        json=chat_body(model="mock-ar", stream=True, diffusing=True, max_tokens=6),
    )
    frames = [
        e["choices"][0]["canvas"]
        for e in sse_events(r.text)
        if e["choices"] and "canvas" in e["choices"][0]
    ]
    assert frames and all(f["committed"] <= 1 for f in frames)  # one token per forward pass
    masked = [f["masked"] for f in frames]  # the canvas fills left to right, one position a step
    assert all(b in (a, a - 1) for a, b in zip(masked, masked[1:]))
    assert [f["step"] for f in frames] == list(range(1, len(frames) + 1))
    r = c.post(
        "/v1/chat/completions",
        json=chat_body(model="mock-ar", response_format={"type": "json_object"}, max_tokens=64),
    )
    assert r.status_code == 200 and r.json()["model"] == "mock-ar"  # the engine's structured path
    fim = c.post(
        "/v1/fim/completions",
        json={"model": "mock-ar", "prompt": "a", "suffix": "b", "max_tokens": 4},
    )
    assert fim.status_code == 200 and fim.json()["model"] == "mock-ar"  # through the FIM tokens
    assert error_code(c.post("/v1/chat/completions", json=chat_body(model="gpt-9")), 404) == (
        "model_not_found"
    )


def test_twin_only_beside_the_embedded_default(causal_ckpt: Path) -> None:
    assert build_twin(ServerConfig(mock=True), "x") is None
    assert build_twin(ServerConfig(model=str(causal_ckpt)), "x") is None
    assert build_twin(ServerConfig(ar_twin=False), "x") is None
    if embedded_ar_model_path() is not None:
        twin = build_twin(ServerConfig(), "quicksilver")
        assert twin is not None and twin.name == "quicksilver-ar" and twin.attention == "causal"
    emb = embedded_diffusion_model_path()
    if emb is not None:
        with pytest.raises(ConfigError, match="causal"):
            served_twin(emb, "bad", ServerConfig())  # the diffusion model cannot be the twin
