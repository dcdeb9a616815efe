"""Tokenizer: a `tokenizers` fast tokenizer plus special-token roles and a sandboxed chat template.

A checkpoint carries ``tokenizer.json`` (the fast tokenizer) and ``tokenizer_config.json`` (special
tokens by role — mask, eos, bos, pad, end-of-turn — and a Jinja chat template). Templates render
in Jinja's immutable sandbox under a time and output budget (``template_guard``): a checkpoint can
never run code through its template, nor hang the process with one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from .errors import CheckpointError, ConfigError
from .template_guard import render_bounded, template_env

# Special tokens of quicksilver's own models, at fixed ids 0..15; byte-level BPE pieces follow.
SPECIAL_TOKENS: list[tuple[str, bool]] = [  # (text, special: hidden when decoding for users)
    ("<|pad|>", True),
    ("<|endoftext|>", True),
    ("<|mask|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_middle|>", True),
    ("<|reserved_0|>", True),
    ("<|reserved_1|>", True),
]

# ChatML with tools (schemas in the system turn, calls as <tool_call>{json}</tool_call>, results in
# a tool turn) and reasoning (<think>…</think> before the answer; `reasoning=false` pre-fills an
# empty one so the model answers at once).
DEFAULT_CHAT_TEMPLATE = """\
{%- set ns = namespace(sys=[]) -%}
{%- for m in messages if m['role'] in ('system', 'developer') -%}{%- set ns.sys = ns.sys + [m['content']] -%}{%- endfor -%}
{%- if tools -%}
{%- set ns.sys = ns.sys + ['You can call these tools. To call one, reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\\n<tools>\\n' ~ (tools | map('tojson') | join('\\n')) ~ '\\n</tools>'] -%}
{%- endif -%}
{%- if ns.sys -%}{{- '<|im_start|>system\\n' ~ (ns.sys | join('\\n\\n')) ~ '<|im_end|>\\n' -}}{%- endif -%}
{%- for m in messages if m['role'] not in ('system', 'developer') -%}
{%- if m['role'] == 'tool' -%}
{{- '<|im_start|>tool\\n<tool_response>' ~ m['content'] ~ '</tool_response><|im_end|>\\n' -}}
{%- elif m['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if m.get('reasoning_content') -%}{{- '<think>' ~ m['reasoning_content'] ~ '</think>' -}}{%- endif -%}
{{- m['content'] or '' -}}
{%- for c in (m.get('tool_calls') or []) -%}
{{- '<tool_call>' ~ ({'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson) ~ '</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] ~ '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if reasoning is defined and not reasoning -%}{{- '<think></think>' -}}{%- endif -%}
{%- endif -%}"""


class Tokenizer:
    """Encode/decode plus the special-token roles a diffusion decoder needs."""

    def __init__(self, fast: FastTokenizer, config: dict[str, Any]) -> None:
        self.fast = fast
        self.config = config
        self.chat_template: str | None = config.get("chat_template")
        self._compiled = (
            template_env().from_string(self.chat_template) if self.chat_template else None
        )

        def tid(role: str) -> int | None:
            tok = config.get(role)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return None if tok is None else fast.token_to_id(tok)

        self.mask_id = tid("mask_token")
        self.eos_id = tid("eos_token")
        self.bos_id = tid("bos_token")
        self.pad_id = tid("pad_token")
        extra = [fast.token_to_id(t) for t in config.get("stop_tokens", [])]
        self.stop_ids: list[int] = sorted({i for i in [self.eos_id, *extra] if i is not None})

    def set_chat_template(self, template: str) -> None:
        """Replace the chat template (``serve --chat-template FILE``); it renders in the same sandbox."""
        try:
            compiled = template_env().from_string(template)
        except TemplateError as e:
            raise ConfigError(f"the chat template does not compile ({e})") from None
        self.chat_template, self._compiled = template, compiled

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        tj, tc = path / "tokenizer.json", path / "tokenizer_config.json"
        if not tj.is_file():
            raise CheckpointError(f"{path}: missing tokenizer.json")
        try:
            fast = FastTokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises plain Exception on bad JSON
            raise CheckpointError(
                f"{tj}: not a valid tokenizer ({str(e).splitlines()[0]})"
            ) from None
        config: dict[str, Any] = {}
        if tc.is_file():
            try:
                config = json.loads(tc.read_text())
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{tc}: invalid JSON ({e})") from None
        if not config.get("chat_template") and (path / "chat_template.jinja").is_file():
            config["chat_template"] = (path / "chat_template.jinja").read_text()
        try:
            return cls(fast, config)
        except TemplateError as e:
            raise CheckpointError(f"{tc}: chat template does not compile ({e})") from None

    @classmethod
    def byte_level(
        cls,
        merges_from: Iterable[str] | None = None,
        vocab_size: int = 512,
        individual_digits: bool = False,
    ) -> Tokenizer:
        """Quicksilver's tokenizer: 16 specials, 256 byte pieces, optional BPE merges trained on text.

        ``individual_digits`` splits every digit into its own piece before BPE (better arithmetic).
        """
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        vocab = {t: i for i, (t, _) in enumerate(SPECIAL_TOKENS)}
        for ch in sorted(alphabet):
            vocab[ch] = len(vocab)
        bpe = models.BPE(vocab=vocab, merges=[])
        fast = FastTokenizer(bpe)
        byte_pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        fast.pre_tokenizer = (
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_pre])
            if individual_digits
            else byte_pre
        )
        fast.decoder = decoders.ByteLevel()
        if merges_from is not None:
            from tokenizers import trainers

            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=[t for t, _ in SPECIAL_TOKENS],
                initial_alphabet=alphabet,
                show_progress=False,
            )
            fast.train_from_iterator(merges_from, trainer=trainer)
        fast.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, s in SPECIAL_TOKENS if not s]
        )
        fast.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, s in SPECIAL_TOKENS if s]
        )
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|pad|>",
            "mask_token": "<|mask|>",
            "stop_tokens": ["<|im_end|>"],
            "chat_template": DEFAULT_CHAT_TEMPLATE,
            "model_max_length": 1024,
            "add_bos_token": False,
            "add_eos_token": False,
        }
        return cls(fast, config)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.fast.save(str(path / "tokenizer.json"))
        cfg = dict(self.config)
        cfg["added_tokens_decoder"] = {
            str(i): {"content": t.content, "special": t.special}
            for i, t in sorted(self.fast.get_added_tokens_decoder().items())
        }
        (path / "tokenizer_config.json").write_text(
            json.dumps(cfg, indent=2, ensure_ascii=False) + "\n"
        )

    # ---- use ----------------------------------------------------------------------------------
    @functools.cached_property
    def vocab_size(self) -> int:
        """Tokens including the added ones (asked once: the tokenizers call walks the vocabulary)."""
        return int(self.fast.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return self.fast.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.fast.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.fast.token_to_id(token)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if self._compiled is None:
            raise ConfigError("this tokenizer has no chat template; pass a plain prompt instead")
        special = {k: self.config.get(k) for k in ("bos_token", "eos_token")}
        special = {
            k: (v.get("content") if isinstance(v, dict) else v) or "" for k, v in special.items()
        }
        try:
            return render_bounded(
                self._compiled,
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **special,
                **kwargs,
            )
        except TemplateError as e:
            raise ConfigError(f"chat template failed: {e}") from None
        except (RecursionError, TypeError, ValueError, ArithmeticError, LookupError) as e:
            raise ConfigError(f"chat template failed: {type(e).__name__}: {e}") from None
