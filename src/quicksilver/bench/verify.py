"""The verify side of ``bench speed``: its methods, the exactness check against ``draft = 0``, the k plot.

``identity`` compares every item's verify output with the same weights decoded one token per pass
(``draft = 0``); where they differ it reports the first differing position and the top-2 gap of
the causal logits there (a multi-position pass may round a near-tie the other way; anything wider
is a bug).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import QuicksilverError
from ..models.transformer import Transformer
from ..pipeline import LoadConfig, Pipeline, load
from ..sampling import SamplerConfig
from .common import line_plot


def verify_configs(draft: int | None, sweep: list[int]) -> dict[str, SamplerConfig]:
    """Method name -> settings: verify at k (the model's when None), the same without copy
    drafts (the A/B of sampling/decoders/copy_drafts.py), draft 0, and the sweep's ks."""
    out = {
        "verify": SamplerConfig(policy="verify", draft=draft),
        "verify_no_copy": SamplerConfig(policy="verify", draft=draft, copy_drafts=False),
        "verify_ar": SamplerConfig(policy="verify", draft=0),
    }
    out |= {f"verify_k{k}": SamplerConfig(policy="verify", draft=k) for k in sweep}
    return out


@torch.no_grad()
def top2_gap(model: Transformer, ids: list[int]) -> float:
    """Top-1 minus top-2 logit of the next token after ``ids`` (one plain causal pass)."""
    logits = model(torch.tensor([ids], device=next(model.parameters()).device))[0, -1]  # (V,)
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def identity(
    model: Transformer,
    prompts: list[list[int]],
    ours: list[list[int]],
    ar: list[list[int]],
) -> dict[str, Any]:
    """The fraction of items where ``ours`` equals ``ar``, and each difference with its top-2 gap."""
    diffs = []
    for i, (p, a, b) in enumerate(zip(prompts, ours, ar)):
        if a == b:
            continue
        j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        diffs.append({"item": i, "position": j, "top2_gap": top2_gap(model, p + b[:j])})
    return {"identical_to_ar": 1 - len(diffs) / max(len(prompts), 1), "differences": diffs}


def k_plot(
    out: Path, summary: dict[str, dict[str, Any]], default_k: int, ar: dict[str, Any]
) -> Path | None:
    """tok/s of verify against the number of drafts k: draft 0 at k = 0, the default method at its
    ``default_k`` and the sweep's ks; by the median item and in aggregate, beside the AR twin's ``ar``."""
    runs = {int(m[len("verify_k") :]): summary[m] for m in summary if m.startswith("verify_k")}
    if not runs:
        return None
    runs |= {0: summary["verify_ar"], default_k: summary["verify"]}
    xs = sorted(runs)
    return line_plot(
        out / "verify_k.png",
        xs,
        {
            "verify tok/s (median item)": [runs[k]["tok_s"] for k in xs],
            "verify tok/s (aggregate)": [runs[k]["tok_s_aggregate"] for k in xs],
            "AR twin (median item)": [ar["tok_s"]] * len(xs),
            "AR twin (aggregate)": [ar["tok_s_aggregate"]] * len(xs),
        },
        "drafts per pass (k)",
        "single-stream verify decoding against the AR twin",
    )


def same_tokenizer(a: Path | None, b: Path | None) -> bool:
    """Whether two checkpoint directories ship the same tokenizer (the same prompts' token ids)."""
    if a is None or b is None:
        return False
    fa, fb = a / "tokenizer.json", b / "tokenizer.json"
    return fa.is_file() and fb.is_file() and fa.read_bytes() == fb.read_bytes()


def verify_pipeline(
    path: Path | None, explicit: bool, pipe: Pipeline, config: LoadConfig
) -> Pipeline | None:
    """The drafting model to time: ``pipe`` itself when it is one, else the causal checkpoint at
    ``path`` — the embedded default only where it shares ``pipe``'s tokenizer (the prompts are
    ``pipe``'s token ids); one named ``explicit``-ly must."""

    if pipe.config.attention == "causal" and pipe.config.draft_length > 0:
        return pipe
    if path is None or path == pipe.path:
        return None
    if not same_tokenizer(path, pipe.path):
        if explicit:
            raise QuicksilverError(f"{path}: its tokenizer differs from {pipe.path}'s")
        return None
    v = load(path, config)
    if v.config.attention != "causal":
        raise QuicksilverError(f"{path} is not a causal model; verify decodes causal drafters")
    return v


def verify_entry(
    summary: dict[str, dict[str, Any]],
    vpipe: Pipeline,
    draft: int | None,
    out: Path,
    peers: list[str],
) -> dict[str, Any]:
    """The verify method's entry at the top level of ``bench speed``'s JSON: its ratios (to the AR
    twin and to each of ``peers``, llama.cpp's ways, that ran), model, draft length and k plot."""
    v, ar = summary["verify"], summary["ar_kv_cache"]
    k = vpipe.config.draft_length if draft is None else draft
    entry = {
        "tok_s": v["tok_s"],
        "tpf": v["tpf"],
        "ratio_vs_ar": v["tok_s"] / ar["tok_s"],
        "aggregate_ratio_vs_ar": v["tok_s_aggregate"] / ar["tok_s_aggregate"],
        # the same without the prompt's pass, which both methods compute alike
        "decode_ratio_vs_ar": v["decode_tok_s"] / ar["decode_tok_s"],
        "identical_to_ar": v["identical_to_ar"],
        "model": str(vpipe.path),
        "draft": k,
        "backend": vpipe.runtime_name,
        "k_plot": str(k_plot(out, summary, k, ar) or ""),
    }
    for key in peers:
        if f"ratio_vs_{key}" in v:
            entry[f"ratio_vs_{key}"] = v[f"ratio_vs_{key}"]
    return entry
