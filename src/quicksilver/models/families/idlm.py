"""I-DLM: causal diffusion LMs on a Qwen3 body, served by the verify decoder (sampling/decoders/verify.py).

I-DLM (Introspective Diffusion Language Models, arXiv 2604.11035; code github
Introspective-Diffusion/I-DLM, read through the public copy thuEcstasy/I-DLM at commit 3342a17)
converts Qwen3-8B/32B into a diffusion LM that keeps the AR model's behaviour: strict causal
attention over clean and masked tokens, the hidden state at i predicts token i+1 (what I-DLM calls
the "Dream shift" is the HF causal-LM convention, so ``logit_shift=False`` here), and an all-masked
training objective. Each decoding pass ("introspective strided decoding") feeds
``[pending, N-1 drafts, N-1 masks]``, checks the drafts against the causal logits (p/q test) and
drafts the next N-1 tokens from the masks: exactly the layout of our ``VerifyDecoder`` with
``draft_length = N - 1``.

Confirmed from the sources (read, not guessed):
- weights are Qwen3's, names included (QK-norm per head before RoPE, ``head_dim``, no biases);
  config.json holds Qwen3-8B's keys (``training/model/Qwen3-8B-b*-allmasked/config.json``);
- the mask is ``<|MASK|>`` = 151669 (``mask_token_id`` in those configs, and the id the bundled
  SGLang fork hard-codes in ``inference/sglang/sglang/srt/dllm/config.py`` for ``SDARForCausalLM``
  and ``Qwen3ForCausalLM``); eos ``<|im_end|>`` 151645 (config ``eos_token_id``), bos/pad
  ``<|endoftext|>`` 151643. Third-party: a fork's copy of an I-DLM model directory
  (rjagalamari/I-DLM ``model_n8/``) declares ``"mask_token": "<|MASK|>"`` in tokenizer_config.json
  and ``<|MASK|>`` at 151669 in added_tokens.json;
- the training configs' ``block_size`` is the number of masks per block, N - 1 ("block_size=3 ...
  3 mask tokens, ready for N=4 ISD stride", ``training/README.md``);
- published decoding (``inference/configs/idlm_blockN4_config.yaml``, the one the README
  recommends for I-DLM-8B and -32B): N = 4 (``gen_block_size: 4``, 2N - 1 = 7 positions per
  pass, ``num_masks = gen_block_size - 1``), temperature 1.0, top_p 0.95, top_k 50, p/q
  verification on (``use_spec_verify: true``), confidence threshold 0;
- checkpoints: yifanyu/I-DLM-8B, yifanyu/I-DLM-32B (README model zoo); yifanyu/I-DLM-8B-lora-r128
  is a gated LoRA adapter on Qwen/Qwen3-8B (not a full checkpoint; not loaded here).

Assumed (no stored copy of the published checkpoints' own config.json was found):
- the released directories most likely declare ``architectures: ["SDARForCausalLM"]`` with
  ``model_type "sdar"`` and remote code, like the training configs and the model card in that
  fork's ``model_n8/README.md`` ("Architecture | SDARForCausalLM (Qwen3-8B based)"); diffusers'
  ``IDLMPipeline`` docs load yifanyu/I-DLM-8B with ``trust_remote_code=True`` and rely on its
  ``config.use_regular_causal=True``. That name belongs to the SDAR family here
  (block-causal, qwen_block.py), so such a directory dispatches to SDAR, not to this loader.
  This module answers to ``IDLM_ARCHITECTURES`` = ``Qwen3ForCausalLM`` (the name the bundled SGLang
  fork also serves I-DLM under): a Qwen3 directory that carries a mask token (``mask_token_id`` in
  config.json, or ``<|MASK|>`` among the tokenizer's added tokens). A plain Qwen3 without one is
  refused with a one-line error. To serve a released SDAR-named I-DLM directory, set its
  config.json ``architectures`` to ``["Qwen3ForCausalLM"]`` (the weights need no change);
- draft length: config.json ``block_size`` when present (the training meaning above), else 3
  (the published N = 4);
- our draft block attends bidirectionally within itself (models/masks.py ``draft_horizon``),
  I-DLM's causally; greedy output is the model's AR output either way (the stream is causal and
  verifies every draft), but draft acceptance may differ from I-DLM's own runtime. top_k has no
  SamplerConfig field and is not applied.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import CheckpointError
from ..checkpoint import State, read_safetensors
from ..config import ModelConfig
from .common import Fields, added_tokens, fast_tokenizer_loader, qwen_config
from .registry import Family, register_family

MASK_TOKEN, MASK_ID = "<|MASK|>", 151669  # the published token and id (the loader reads the files)
EOT_TOKEN = "<|im_end|>"
DEFAULT_DRAFT = 3  # masks per pass: the published N = 4 keeps <= 3 drafts + 1 bonus token a pass
# The config.json `architectures` this family answers to (see the module docstring: assumed).
IDLM_ARCHITECTURES = ("Qwen3ForCausalLM",)


def idlm_mask_id(path: Path, f: Fields) -> int:
    """config.json ``mask_token_id``, else the id of ``<|MASK|>`` in the tokenizer files; a Qwen3
    directory with neither is a plain AR model and is refused."""
    v = f.int("mask_token_id", None)
    if v is not None:
        return int(v)
    found = added_tokens(path).get(MASK_TOKEN)
    if found is None:
        raise CheckpointError(
            f"{path}: a Qwen3 checkpoint without a mask token (no 'mask_token_id' in config.json, "
            f"no {MASK_TOKEN} in the tokenizer files): a plain AR model, not an I-DLM"
        )
    return found


def load_idlm(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    f = Fields(path, cj, "I-DLM")
    if cj.get("num_experts"):
        raise CheckpointError(f"{path}/config.json: I-DLM is a dense Qwen3; 'num_experts' is set")
    bias = f.bool("attention_bias", False)
    cfg = qwen_config(
        path,
        cj,
        "I-DLM",
        qkv_bias=bias,
        o_bias=bias,  # Qwen3's attention_bias covers o_proj too
        qk_norm=True,
        attention="causal",
        logit_shift=False,  # hidden state i predicts token i + 1 (the HF causal-LM convention)
        mask_token_id=idlm_mask_id(path, f),
        draft_length=f.int("block_size", DEFAULT_DRAFT),
    )
    return cfg, read_safetensors(path)  # Qwen3 names are our names; a tied head is dropped later


IDLM = register_family(
    Family(
        name="idlm",
        architectures=IDLM_ARCHITECTURES,
        load=load_idlm,
        tokenizer=fast_tokenizer_loader({"mask_token": MASK_TOKEN}, [EOT_TOKEN]),
        defaults={"policy": "verify", "temperature": 1.0, "top_p": 0.95},  # draft: the model's
        checkpoints=("yifanyu/I-DLM-8B", "yifanyu/I-DLM-32B"),
        doc="causal (I-DLM), Qwen3-shaped (QK-norm), no shift, verify decoding with 3 drafts/pass",
    )
)
