"""Tensor parallelism inside one replica, with ``torch.distributed``'s tensor-parallel API.

``parallelize(model, mesh)`` shards a loaded ``Transformer`` over a 1-D device mesh (one rank per
GPU; a gloo group of CPU processes in the tests) with ``parallelize_module`` plans, Megatron-style:

- attention: ``q_proj``/``k_proj``/``v_proj`` column-wise (each rank keeps ``n_heads / tp`` query
  heads and ``n_kv_heads / tp`` key/value heads, so its KV cache holds only those), ``o_proj``
  row-wise (one all-reduce);
- the dense MLP, and for the MoE families every routed expert and the shared expert: ``gate_proj``
  and ``up_proj`` column-wise, ``down_proj`` row-wise (one all-reduce). The router, the norms, the
  embedding and the LM head stay replicated, so every rank computes the same routing and the same
  logits, and the decoder above runs unchanged on every rank (SPMD).

The sharded linears hold ``DTensor`` weights and return local tensors; the fused q/k/v and gate/up
matmuls of the single-device path are switched off (they concatenate weights across modules).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from ..errors import ConfigError
from .moe import MoE
from .transformer import MLP, Attention, Transformer


def _swiglu(prefix: str) -> dict[str, ParallelStyle]:
    return {
        f"{prefix}.gate_proj": ColwiseParallel(),
        f"{prefix}.up_proj": ColwiseParallel(),
        f"{prefix}.down_proj": RowwiseParallel(),
    }


def shard_plan(model: Transformer) -> dict[str, ParallelStyle]:
    """Module path -> parallel style for every sharded linear of ``model``."""
    plan: dict[str, ParallelStyle] = {}
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}"
        for name in ("q_proj", "k_proj", "v_proj"):
            plan[f"{p}.self_attn.{name}"] = ColwiseParallel()
        plan[f"{p}.self_attn.o_proj"] = RowwiseParallel()
        mlp = layer.mlp
        if isinstance(mlp, MoE):
            for e in range(mlp.cfg.n_experts):
                plan.update(_swiglu(f"{p}.mlp.experts.{e}"))
            if mlp.shared_experts is not None:
                plan.update(_swiglu(f"{p}.mlp.shared_experts"))
        else:
            plan.update(_swiglu(f"{p}.mlp"))
    return plan


def check_divisible(model: Transformer, tp: int) -> None:
    """Every sharded dimension must split evenly over ``tp`` ranks (a one-line error otherwise)."""
    cfg = model.config
    sizes = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads}
    for layer in model.model.layers:
        mlp = layer.mlp
        if isinstance(mlp, MoE):
            sizes["expert_hidden"] = mlp.cfg.expert_hidden
            if mlp.shared_experts is not None:
                sizes["shared_hidden"] = mlp.cfg.shared_hidden
        else:
            sizes["mlp_hidden"] = cfg.mlp_hidden
    bad = [f"{k}={v}" for k, v in sizes.items() if v % tp]
    if bad:
        raise ConfigError(f"--tensor-parallel {tp} does not divide {', '.join(bad)}")


def parallelize(model: Transformer, mesh: DeviceMesh) -> Transformer:
    """Shard ``model`` in place over ``mesh`` (1-D) and return it."""
    tp = mesh.size()
    check_divisible(model, tp)
    if tp == 1:
        return model
    parallelize_module(model, mesh, shard_plan(model))  # type: ignore[arg-type]
    for m in model.modules():
        if isinstance(m, Attention):
            m.n_heads, m.n_kv, m.fused = m.n_heads // tp, m.n_kv // tp, False
            m.__dict__.pop("_fused_cache", None)
        elif isinstance(m, MLP):
            m.fused = False
            m.__dict__.pop("_fused_cache", None)
    model.kv_heads = model.config.n_kv_heads // tp
    return model
