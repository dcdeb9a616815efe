"""GSM8K accuracy of a loaded model on the user's own JSONL file, with the published decoding settings.

``quicksilver eval --benchmark gsm8k --data FILE.jsonl --model DIR`` (nothing is downloaded: the
file is the user's, one ``{"question": ..., "answer": "... #### 42"}`` per line, as in the GSM8K
release). Presets carry the settings of the published numbers (the LLaDA paper, arXiv 2502.09992, and the Fast-dLLM paper, arXiv 2505.22618):

- ``llada``: LLaDA-8B-Instruct, 0-shot chat, gen_length 256, semi-AR blocks of 8, steps = 256,
  low-confidence remasking, greedy -> GSM8K 78.6 (internal) / 78.9 (OpenCompass).
- ``llada-block32``: the same with blocks of 32 (Fast-dLLM's baseline setting, 79.3 5-shot).
- ``fast-dllm``: 5-shot ``Question: ...\\nAnswer:`` prompts (lm-eval format), gen_length 256,
  blocks of 32, threshold 0.9 (parallel decoding; the published 78.5 also used its KV cache).
- ``family``: the loaded family's own defaults with a 256-token canvas.

The reply's final number is extracted (``#### N``, else ``\\boxed{N}``, else "answer is N", else
the last number) and compared numerically with the reference after ``####``. Ends with one line
of JSON: accuracy, counts, the decoding settings and the TPF they ran at.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from ..errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    "llada": {
        "chat": True,
        "num_fewshot": 0,
        "sampler": {
            "max_new_tokens": 256,
            "block_length": 8,
            "steps": 256,
            "policy": "low_confidence",
            "temperature": 0.0,
        },
    },
    "llada-block32": {
        "chat": True,
        "num_fewshot": 0,
        "sampler": {
            "max_new_tokens": 256,
            "block_length": 32,
            "steps": 256,
            "policy": "low_confidence",
            "temperature": 0.0,
        },
    },
    "fast-dllm": {
        "chat": False,
        "num_fewshot": 5,
        "sampler": {
            "max_new_tokens": 256,
            "block_length": 32,
            "policy": "threshold",
            "threshold": 0.9,
            "temperature": 0.0,
        },
    },
    "family": {"chat": True, "num_fewshot": 0, "sampler": {"max_new_tokens": 256}},
}

_NUM = r"-?[$]?\d[\d,]*(?:\.\d+)?"
_PATTERNS = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"answer is\s*:?\s*(" + _NUM + ")", re.IGNORECASE),
]
_ANY_NUM = re.compile(_NUM)


@dataclass
class Item:
    question: str
    answer: str  # the reference number, normalised
    solution: str  # the full reference answer (worked solution + '#### N'), for few-shot prompts
    line: int


@dataclass
class Record:
    line: int
    target: str
    predicted: str | None
    correct: bool
    text: str
    tokens: int
    nfe: int


@dataclass
class Report:
    benchmark: str
    accuracy: float
    correct: int
    total: int
    preset: str
    settings: dict[str, Any]
    num_fewshot: int
    chat: bool
    tpf: float
    nfe: int
    output_tokens: int
    seconds: float
    records: list[Record] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("records")
        return d


def normalize_number(s: str) -> str | None:
    """'$1,234.50' -> '1234.5', '18.0' -> '18', '7.' -> '7'; None if it is not a number."""
    s = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The final number of a reply: '#### N', else \\boxed{N}, else 'answer is N', else the last number."""
    for pat in _PATTERNS:
        found = pat.findall(text)
        if found:
            return normalize_number(found[-1])
    nums = _ANY_NUM.findall(text)
    return normalize_number(nums[-1]) if nums else None


def load_items(path: str | Path) -> list[Item]:
    """Read a GSM8K-format JSONL file; a malformed line is a ConfigError naming it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such data file")
    items: list[Item] = []
    for n, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{n}: invalid JSON ({e.msg})") from None
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("question"), str)
            or not isinstance(obj.get("answer"), str)
        ):
            raise ConfigError(
                f"{p}:{n}: expected an object with string fields 'question' and 'answer'"
            )
        m = re.search(r"####\s*(.+?)\s*$", obj["answer"])
        target = normalize_number(m.group(1)) if m else None
        if target is None:
            raise ConfigError(f"{p}:{n}: the answer has no final '#### <number>'")
        items.append(Item(obj["question"], target, obj["answer"], n))
    if not items:
        raise ConfigError(f"{p}: no items")
    return items


def fewshot_prefix(shots: Sequence[dict[str, str]]) -> str:
    """lm-eval's gsm8k format: 'Question: ...\\nAnswer: <worked answer>' blocks separated by blank lines."""
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def _read_shots(path: str | Path, n: int) -> list[dict[str, str]]:
    return [{"question": it.question, "answer": it.solution} for it in load_items(path)[:n]]


def split_shots(
    items: list[Item], k: int, fewshot_data: str | Path | None
) -> tuple[list[Item], list[dict[str, str]]]:
    """(items to score, few-shot examples): the shots from ``fewshot_data``, or else the first ``k``
    items, which are then not scored."""
    if fewshot_data is not None:
        return items, _read_shots(fewshot_data, k)
    return items[k:], [{"question": it.question, "answer": it.solution} for it in items[:k]]


def batch_prompts(chunk: list[Item], prefix: str, shots: bool, chat: bool) -> list[Any]:
    """One batch's prompts: the few-shot prefix and 'Question: ...\\nAnswer:' as plain text, or as a
    chat turn (the bare question when there are no shots)."""
    if not chat:
        return [prefix + f"Question: {it.question}\nAnswer:" for it in chunk]
    return [
        [
            {
                "role": "user",
                "content": prefix + f"Question: {it.question}\nAnswer:" if shots else it.question,
            }
        ]
        for it in chunk
    ]


def evaluate_gsm8k(
    pipe: Any,
    data: str | Path,
    preset: str = "llada",
    limit: int | None = None,
    num_fewshot: int | None = None,
    fewshot_data: str | Path | None = None,
    chat: bool | None = None,
    batch_size: int = 1,
    progress: bool = False,
    **sampler: Any,
) -> Report:
    """Decode every question with ``pipe`` (a ``quicksilver.Pipeline``) and score the final numbers.

    Few-shot examples come from ``fewshot_data`` or else the first ``num_fewshot`` items of ``data``
    (which are then not scored). ``sampler`` options override the preset's.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown gsm8k preset {preset!r}; choose one of {sorted(PRESETS)}")
    if batch_size <= 0:
        raise ConfigError("batch_size must be positive")
    spec = PRESETS[preset]
    k = spec["num_fewshot"] if num_fewshot is None else num_fewshot
    use_chat = (spec["chat"] if chat is None else chat) and pipe.tokenizer.chat_template is not None
    items, shots = split_shots(load_items(data), k, fewshot_data)
    if limit is not None:
        items = items[:limit]
    if not items:
        raise ConfigError("no items left to score (fewer lines than num_fewshot + 1?)")
    cfg = pipe.sampler_config(**{**spec["sampler"], **sampler})
    opts = asdict(cfg)
    prefix = fewshot_prefix(shots)
    records: list[Record] = []
    t0 = time.perf_counter()
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        prompts = batch_prompts(chunk, prefix, bool(shots), use_chat)
        results = pipe.generate_batch(prompts, chat=use_chat, **opts)
        for it, res in zip(chunk, results):
            text = res.text if use_chat else re.split(r"\n\s*\n|Question:", res.text)[0]
            pred = extract_answer(text)
            records.append(
                Record(
                    it.line, it.answer, pred, pred == it.answer, res.text, len(res.tokens), res.nfe
                )
            )
        if progress:
            done = len(records)
            acc = sum(r.correct for r in records) / done
            print(f"gsm8k {done}/{len(items)}  accuracy {acc:.3f}", file=sys.stderr)
    seconds = time.perf_counter() - t0
    correct = sum(r.correct for r in records)
    out_tokens = sum(r.tokens for r in records)
    nfe = sum(r.nfe for r in records)
    settings = {k2: v for k2, v in opts.items() if k2 != "record_canvas"}
    return Report(
        "gsm8k",
        correct / len(records),
        correct,
        len(records),
        preset,
        settings,
        len(shots),
        use_chat,
        out_tokens / max(nfe, 1),
        nfe,
        out_tokens,
        round(seconds, 3),
        records,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``quicksilver eval --benchmark gsm8k`` (besides --model)."""
    p.add_argument(
        "--data", required=True, help="GSM8K-format JSONL: question, answer ending in '#### N'"
    )
    p.add_argument(
        "--preset", default="llada", choices=sorted(PRESETS), help="published decoding settings"
    )
    p.add_argument("--limit", type=int, default=None, help="score only the first N items")
    p.add_argument("--num-fewshot", type=int, default=None, dest="num_fewshot")
    p.add_argument(
        "--fewshot-data", default=None, dest="fewshot_data", help="JSONL of few-shot examples"
    )
    p.add_argument("--batch-size", type=int, default=1, dest="batch_size")
    p.add_argument("--records", default=None, help="write one JSON line per item to this file")


def run(pipe: Any, args: argparse.Namespace, **sampler: Any) -> int:
    """Run with parsed flags (``sampler``: SamplerConfig overrides from the command line); prints the JSON line."""
    rep = evaluate_gsm8k(
        pipe,
        args.data,
        preset=args.preset,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        fewshot_data=args.fewshot_data,
        batch_size=args.batch_size,
        progress=True,
        **sampler,
    )
    if args.records:
        Path(args.records).parent.mkdir(parents=True, exist_ok=True)
        Path(args.records).write_text("".join(json.dumps(asdict(r)) + "\n" for r in rep.records))
    print(json.dumps(rep.summary()))
    return 0
