"""How much device memory a model needs. Pure.

Training with mixed precision and Adam: 16 bytes per parameter (fp16 weights and gradients,
fp32 master weights and two Adam moments); activations come on top and are not modelled.
Inference: the weights at the serving dtype, plus a KV cache of
``2 x layers x kv_heads x head_dim x dtype_bytes`` per token, for ``context_length x
concurrent_sequences`` tokens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.core.errors import ValidationError

TRAINING_BYTES_PER_PARAM = 16
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


class Mode(enum.StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"


@dataclass(frozen=True, slots=True)
class SizingSpec:
    parameters: int
    mode: Mode
    dtype: str = "bf16"
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    context_length: int = 0
    concurrent_sequences: int = 1


@dataclass(frozen=True, slots=True)
class Sizing:
    weights_bytes: int
    kv_cache_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.optimizer_bytes


def size(spec: SizingSpec) -> Sizing:
    if spec.parameters <= 0:
        raise ValidationError("parameters", "must be a positive number of parameters")
    if spec.mode is Mode.TRAINING:
        total = spec.parameters * TRAINING_BYTES_PER_PARAM
        weights = spec.parameters * 2
        return Sizing(weights_bytes=weights, kv_cache_bytes=0, optimizer_bytes=total - weights)
    if spec.dtype not in DTYPE_BYTES:
        raise ValidationError("dtype", f"must be one of {', '.join(DTYPE_BYTES)}")
    for name in ("layers", "kv_heads", "head_dim", "context_length", "concurrent_sequences"):
        if getattr(spec, name) <= 0:
            raise ValidationError(name, "must be positive for an inference sizing")
    dtype_bytes = DTYPE_BYTES[spec.dtype]
    weights = int(spec.parameters * dtype_bytes)
    per_token = 2 * spec.layers * spec.kv_heads * spec.head_dim * dtype_bytes
    tokens = spec.context_length * spec.concurrent_sequences
    return Sizing(weights_bytes=weights, kv_cache_bytes=int(per_token * tokens), optimizer_bytes=0)
