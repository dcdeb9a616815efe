"""The engine: continuous batching, streaming events, cancellation, limits, errors, prefix cache."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from quicksilver.engine import Engine, EngineConfig, EngineOverloaded, EngineRequest
from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.sampling import Decoder, SamplerConfig
from quicksilver.sampling.decoders.verify import VerifyDecoder

MASK, EOS = 2, 1


def _decoder(attention: str = "block_causal", **kw) -> Decoder:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    m = Transformer(preset("tiny", vocab_size=96, attention=attention, block_size=8)).eval()
    return Decoder(m, MASK, [EOS], vocab_limit=96, **kw)


def _req(rid: str, prompt: list[int], n: int = 20, **kw) -> EngineRequest:  # type: ignore[no-untyped-def]
    return EngineRequest(
        rid,
        prompt,
        SamplerConfig(max_new_tokens=n, policy="threshold", threshold=0.2, stop_at_eos=False, **kw),
    )


def _drain(engine: Engine) -> dict[str, list]:  # type: ignore[type-arg]
    out: dict[str, list] = {}  # type: ignore[type-arg]
    for ev in engine.run_until_idle():
        out.setdefault(ev.request_id, []).append(ev)
    return out


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
def test_requests_joining_mid_run_get_the_same_answer_as_alone(attention: str) -> None:
    dec = _decoder(attention)
    prompts = {"a": list(range(10, 31)), "b": list(range(40, 47)), "c": list(range(50, 63))}
    alone = {}
    for rid, p in prompts.items():
        e = Engine(dec)
        e.add(_req(rid, p, n=17 + len(rid)))
        alone[rid] = _drain(e)[rid][-1].result.tokens
    e = Engine(dec, EngineConfig(max_batch=2))
    e.add(_req("a", prompts["a"], n=18))
    e.step()
    e.step()
    e.add(_req("b", prompts["b"], n=18))  # joins while a runs
    e.add(_req("c", prompts["c"], n=18))  # waits for a free slot (max_batch=2)
    events = _drain(e)
    for rid in prompts:
        final = events[rid][-1]
        assert final.done and final.result.tokens == alone[rid]
        streamed = [t for ev in events[rid] for t in ev.new_tokens]
        assert streamed == final.result.tokens  # the append-only stream adds up to the answer
    assert events["c"][-1].stats.queue_time > 0


def test_cancel_frees_the_request_and_its_cache() -> None:
    e = Engine(_decoder(), EngineConfig(prefix_cache_mb=0))
    e.add(_req("x", list(range(10, 40)), n=60))
    e.step()
    e.step()
    assert e.cache_bytes() > 0
    row = e._running["x"].row
    ref = weakref.ref(row.cache)
    del row
    e.cancel("x")
    events = e.step()
    assert events[0].finish_reason == "cancelled" and events[0].done
    assert e.cache_bytes() == 0 and not e.has_work
    gc.collect()
    assert ref() is None  # the cache's memory is gone


def test_limits_and_bad_requests() -> None:
    e = Engine(_decoder(), EngineConfig(max_waiting=2))
    e.add(_req("1", [5, 6, 7]))
    e.add(_req("2", [5, 6, 7]))
    with pytest.raises(EngineOverloaded):
        e.add(_req("3", [5, 6, 7]))
    with pytest.raises(ConfigError):
        e.add(_req("1", [5, 6, 7]))  # duplicate id while in flight
    with pytest.raises(ConfigError):
        e.add(EngineRequest("bad", [5, 6], SamplerConfig(threshold=2.0)))
    with pytest.raises(ConfigError):
        e.add(_req("long", list(range(5, 90)) * 20))


def test_a_failing_step_fails_its_requests_not_the_engine() -> None:
    dec = _decoder()
    e = Engine(dec)
    e.add(_req("x", [5, 6, 7, 8]))
    orig = dec.runtime.forward_segments
    dec.runtime.forward_segments = lambda segs: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore
    evs = e.step()
    assert evs[0].finish_reason == "error" and "boom" in (evs[0].error or "")
    dec.runtime.forward_segments = orig  # type: ignore[method-assign]
    e.add(_req("y", [5, 6, 7, 8]))
    assert _drain(e)["y"][-1].finish_reason == "length"


def test_prefix_cache_serves_shared_prompt_blocks_and_keeps_answers() -> None:
    dec = _decoder()
    system = list(range(10, 50))  # 5 whole blocks of 8
    plain = Engine(dec, EngineConfig(prefix_cache_mb=0))
    plain.add(_req("p", system + [60, 61, 62]))
    want = _drain(plain)["p"][-1].result.tokens
    e = Engine(dec)
    e.add(_req("first", system + [70, 71]))
    _drain(e)
    e.add(_req("second", system + [60, 61, 62]))
    final = _drain(e)["second"][-1]
    assert (
        final.cached_tokens == 40 and e.prefix_cache is not None and e.prefix_cache.hit_tokens == 40
    )
    assert final.result.tokens == want
    # an agent loop: the next turn's prompt starts with the previous prompt and answer
    turn2 = system + [60, 61, 62] + want + [80, 81]
    e.add(_req("turn2", turn2))
    assert _drain(e)["turn2"][-1].cached_tokens >= 40


def test_prefix_cache_evicts_beyond_its_budget() -> None:
    e = Engine(_decoder(), EngineConfig(prefix_cache_mb=1))
    assert e.prefix_cache is not None
    e.prefix_cache.max_bytes = 20_000
    for i in range(6):
        e.add(_req(f"r{i}", list(range(10 + i, 50 + i)), n=8))
    _drain(e)
    assert 0 < e.prefix_cache.bytes <= 20_000


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_approximate_caches_are_exact_when_refreshed_every_step(mode: str) -> None:
    torch.manual_seed(0)
    m = Transformer(preset("tiny", vocab_size=96)).eval()
    cfg = SamplerConfig(
        max_new_tokens=24, policy="low_confidence", steps=24, block_length=8, stop_at_eos=False
    )
    base = Decoder(m, MASK, [EOS], use_cache=False).generate([list(range(10, 30))], cfg)[0]
    fresh = Decoder(m, MASK, [EOS], cache_mode=mode, refresh_every=1).generate(
        [list(range(10, 30))], cfg
    )[0]
    approx = Decoder(m, MASK, [EOS], cache_mode=mode).generate([list(range(10, 30))], cfg)[0]
    assert fresh.tokens == base.tokens and len(approx.tokens) == 24 and approx.nfe == base.nfe
    with pytest.raises(ConfigError):
        Decoder(m, MASK, [EOS], cache_mode="block").new_row([5, 6], cfg)


def test_a_request_can_add_its_own_stop_tokens() -> None:
    """An extra stop token (the server's </think> for a reasoning phase) ends that request only."""
    dec = _decoder()
    e = Engine(dec)
    e.add(_req("plain", [5, 6, 7, 8], n=24))
    plain = _drain(e)["plain"][-1].result.tokens
    stop = plain[3]  # a token the model does produce at position 3
    e.add(
        EngineRequest(
            "own",
            [5, 6, 7, 8],
            SamplerConfig(max_new_tokens=24, policy="threshold", threshold=0.2),
            stop_token_ids=[stop],
        )
    )
    e.add(_req("other", [5, 6, 7, 8], n=24))
    out = _drain(e)
    own = out["own"][-1]
    assert (
        own.finish_reason == "stop"
        and stop not in own.result.tokens
        and len(own.result.tokens) <= 3
    )
    assert out["other"][-1].result.tokens == plain


def test_prefix_cache_serves_a_causal_stream_and_keeps_its_ar_output() -> None:
    """The shipped model is causal: every prefix of its stream is exact, so agent-loop turns start
    from the previous turn's blocks and still give the AR output (greedy verify, drafts on)."""
    torch.manual_seed(0)
    m = Transformer(preset("tiny", vocab_size=96, attention="causal", block_size=8)).eval()
    dec = VerifyDecoder(m, [EOS])

    def req(rid: str, prompt: list[int]) -> EngineRequest:
        cfg = SamplerConfig(max_new_tokens=16, policy="verify", draft=4, stop_at_eos=False)
        return EngineRequest(rid, prompt, cfg)

    system = list(range(10, 50))  # 5 whole blocks of 8
    plain = Engine(dec, EngineConfig(prefix_cache_mb=0))
    plain.add(req("p", system + [60, 61, 62]))
    want = _drain(plain)["p"][-1].result.tokens
    e = Engine(dec)
    assert e.prefix_cache is not None
    e.add(req("first", system + [70, 71]))
    _drain(e)
    e.add(req("second", system + [60, 61, 62]))
    final = _drain(e)["second"][-1]
    assert final.cached_tokens == 40 and final.result.tokens == want
    turn2 = system + [60, 61, 62] + want + [80, 81]
    plain.add(req("t2", turn2))
    e.add(req("t2", turn2))
    cached = _drain(e)["t2"][-1]
    assert (
        cached.cached_tokens >= 56 and cached.result.tokens == _drain(plain)["t2"][-1].result.tokens
    )


def test_a_prompt_only_prefix_cache_keeps_no_reply_blocks() -> None:
    """With an exported step the cache keeps only the prompt blocks a later prefill computes the
    same way (those before the prompt's last token), never a reply's."""
    from quicksilver.engine.prefix_cache import PrefixCache

    torch.manual_seed(0)
    m = Transformer(preset("tiny", vocab_size=96, attention="causal", block_size=8)).eval()
    dec = VerifyDecoder(m, [EOS], vocab_limit=96)
    prompt = list(range(10, 31))  # 21 tokens: two whole 8-token blocks before the last one
    for prompt_only, blocks in ((False, 4), (True, 2)):
        cache = PrefixCache(8, prompt_only=prompt_only)
        cfg = SamplerConfig(max_new_tokens=16, stop_at_eos=False, draft=0)
        row = dec.new_row(prompt, cfg)
        while not row.done:
            dec.step([row])
        cache.insert(row)  # 21 + 15 cached tokens: four whole blocks
        assert len(cache._entries) == blocks
