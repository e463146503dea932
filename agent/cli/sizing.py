"""``gpushare size``: the memory a model needs, to ask for the right ``--memory``."""

from __future__ import annotations

import sys

import click

from agent.admission.sizing import DTYPE_BYTES, Mode, SizingSpec, size
from agent.cli import exits
from agent.cli.common import CONTEXT, AllRequired
from agent.cli.render import table
from agent.core.errors import ValidationError
from agent.core.units import format_bytes

INFERENCE_FLAGS = ("layers", "kv_heads", "head_dim", "context_length")
FOR_INFERENCE = "Required with --mode inference."


@click.command("size", cls=AllRequired, context_settings=CONTEXT)
@click.option("--parameters", required=True, type=float, help="Model parameters, e.g. 7e9.")
@click.option("--mode", type=click.Choice([m.value for m in Mode]), required=True)
@click.option("--dtype", type=click.Choice(list(DTYPE_BYTES)), default="bf16", show_default=True)
@click.option("--layers", type=int, default=0, help=f"Transformer layers. {FOR_INFERENCE}")
@click.option("--kv-heads", type=int, default=0, help=f"Key/value heads. {FOR_INFERENCE}")
@click.option("--head-dim", type=int, default=0, help=f"Size of one head. {FOR_INFERENCE}")
@click.option("--context-length", type=int, default=0, help=f"Tokens per sequence. {FOR_INFERENCE}")
@click.option(
    "--sequences", type=int, default=1, show_default=True, help="Concurrent sequences (inference)."
)
def size_command(
    parameters: float,
    mode: str,
    dtype: str,
    layers: int,
    kv_heads: int,
    head_dim: int,
    context_length: int,
    sequences: int,
) -> None:
    """Memory a model needs: 16 B/parameter to train (mixed-precision Adam); weights plus
    KV cache (2 x layers x kv_heads x head_dim x dtype bytes per token) to serve."""
    spec = SizingSpec(
        int(parameters), Mode(mode), dtype, layers, kv_heads, head_dim, context_length, sequences
    )
    missing = [f"--{n.replace('_', '-')}" for n in INFERENCE_FLAGS if getattr(spec, n) <= 0]
    if spec.mode is Mode.INFERENCE and missing:
        click.echo(f"gpushare: --mode inference needs {', '.join(missing)}", err=True)
        sys.exit(exits.CONFIG)
    try:
        result = size(spec)
    except ValidationError as exc:
        flag = "--sequences" if exc.field == "concurrent_sequences" else f"--{exc.field}"
        click.echo(f"gpushare: {flag.replace('_', '-')}: {exc}", err=True)
        sys.exit(exits.CONFIG)
    parts = [
        ("weights", result.weights_bytes),
        ("kv cache", result.kv_cache_bytes),
        ("optimizer + grads", result.optimizer_bytes),
        ("total", result.total_bytes),
    ]
    click.echo(table(["PART", "BYTES", "SIZE"], [[p, n, format_bytes(n)] for p, n in parts]))
