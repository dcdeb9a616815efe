"""Dream-v0 (Dream-org Dream-v0-Base-7B / -Instruct-7B): Qwen2.5 weights run bidirectionally, shifted logits.

Facts (config.json and remote code of huggingface.co/Dream-org/Dream-v0-Instruct-7B): architecture ``DreamModel`` (``model_type`` "Dream");
Qwen2 config keys and weight names (q/k/v biases, no o_proj bias, untied head); attention is never
causal; the hidden state at position i predicts token i+1, so logits are re-aligned by one
(``logit_shift``). ``mask_token_id`` 151666 (``<|mask|>``), eos = pad 151643, ``<|im_end|>`` ends a
turn. The tokenizer ships only ``vocab.json`` + ``merges.txt`` (a remote-code slow Qwen2
tokenizer): we build the fast byte-level BPE from them. Context (prompt + output) is 2048 tokens.
Decoding as published (``diffusion_generate``): the whole canvas at once, one token per step,
``alg`` = ``entropy`` (README) — our ``entropy`` policy; ``maskgit_plus`` maps to
``low_confidence`` and ``topk_margin`` to ``margin`` (see ``DREAM_ALGORITHMS``).
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import State, read_safetensors
from ..config import ModelConfig
from .common import Fields, fast_tokenizer_loader, qwen_config, token_id
from .registry import Family, register_family

MASK_TOKEN, MASK_ID = "<|mask|>", 151666
BOS_TOKEN = "<|beginoftext|>"
EOT_TOKEN = "<|im_end|>"
CONTEXT = 2048  # "context length (input+output) of Dream currently is 2048" (HKUNLP/Dream README)
WHOLE_CANVAS = CONTEXT  # a block at least as long as any canvas: no semi-AR blocks

# Dream's diffusion_generate ``alg`` -> our unmasking policy.
DREAM_ALGORITHMS = {
    "maskgit_plus": "low_confidence",
    "topk_margin": "margin",
    "entropy": "entropy",
    "origin": "random",
}


def load_dream(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    f = Fields(path, cj, "Dream")
    cfg = qwen_config(
        path,
        cj,
        "Dream",
        qkv_bias=True,
        attention="bidirectional",
        logit_shift=True,
        max_seq_len=min(CONTEXT, f.int("max_position_embeddings", CONTEXT)),
        mask_token_id=token_id(path, f, "mask_token_id", MASK_TOKEN, MASK_ID),
    )
    return cfg, read_safetensors(path)  # Qwen2 names are our names


DREAM = register_family(
    Family(
        name="dream",
        architectures=("DreamModel",),
        load=load_dream,
        tokenizer=fast_tokenizer_loader(
            {"mask_token": MASK_TOKEN, "bos_token": BOS_TOKEN}, [EOT_TOKEN]
        ),
        defaults={"policy": "entropy", "block_length": WHOLE_CANVAS, "temperature": 0.0},
        checkpoints=("Dream-org/Dream-v0-Base-7B", "Dream-org/Dream-v0-Instruct-7B"),
        doc="bidirectional masked diffusion, Qwen2.5-shaped, logits shifted by one",
    )
)
