"""``gpushare estimator``: make data, train, predict and evaluate the retention estimator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from agent.cli import exits
from agent.cli.common import AllRequired
from agent.core.errors import ValidationError
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record, parse_lines, to_json


def _read(path: str, *, need_retention: bool) -> tuple[list[str], list[Record]]:
    try:
        lines = Path(path).read_text().splitlines()
        return lines, parse_lines(lines, need_retention=need_retention)
    except OSError as exc:
        click.echo(f"gpushare: cannot read {path}: {exc.strerror}", err=True)
        sys.exit(exits.CONFIG)
    except ValidationError as exc:
        click.echo(f"gpushare: {path}: {exc}", err=True)
        sys.exit(exits.CONFIG)


@click.group()
def estimator() -> None:
    """The retention estimator: how much of its solo speed a workload keeps when shared."""


@estimator.command(cls=AllRequired)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="JSON Lines file.")
@click.option("--runs", "count", default=2000, show_default=True, help="Co-location sets.")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--generator",
    type=click.Choice(["contention", "interference", "shares"]),
    default="contention",
    show_default=True,
    help="contention: the simulated node's model; interference: a second one with other "
    "physics and nvidia-smi counters only (to test on a world the model has not seen); "
    "shares: inference pairs under MPS at complementary thread shares, L2 and DRAM "
    "counters at the share, no gpu_util.",
)
def synth(out: str, count: int, seed: int, generator: str) -> None:
    """Write synthetic run records."""
    from agent.estimator import shares, synthetic
    from agent.sim import synth

    make = {"contention": synth.runs, "interference": synthetic.runs, "shares": shares.runs}
    records = make[generator](count, seed=seed)
    Path(out).write_text("".join(to_json(r) + "\n" for r in records))
    click.echo(f"wrote {len(records)} synthetic records ({generator}) to {out}")


@estimator.command()
@click.option(
    "--data", default=None, type=click.Path(exists=True, dir_okay=False), help="Run records."
)
@click.option(
    "--out", default=None, type=click.Path(file_okay=False), help="Model folder to write."
)
@click.option("--trees", default=100, show_default=True)
@click.option(
    "--folds",
    default=0,
    show_default=True,
    help="Cross-validation folds grouped by workload family; 0: leave one family out.",
)
@click.option(
    "--coverage",
    default=0.9,
    show_default=True,
    type=click.FloatRange(0.5, 0.99),
    help="Stated coverage of retention_lower (estimator.coverage overrides).",
)
@click.option(
    "--precision",
    "gate_precision",
    default=0.95,
    show_default=True,
    type=click.FloatRange(0.8, 0.99),
    help="The gate's precision to report (every level 0.80-0.99 is stored; "
    "estimator.gate_precision picks the one the agent runs at).",
)
@click.option("--provenance", default="", help="Where the data came from (stored).")
@click.option(
    "--from-node",
    is_flag=True,
    help="Ask the running agent to retrain on this node's own run records plus its base "
    "records, and to swap the model in only if it beats the current one.",
)
@click.pass_context
def train(
    ctx: click.Context,
    data: str | None,
    out: str | None,
    trees: int,
    folds: int,
    coverage: float,
    gate_precision: float,
    provenance: str,
    from_node: bool,
) -> None:
    """Train on run records (--data, --out): grouped cross-validation of the forest and a
    ridge line, the better one kept, the gate's operating point chosen, next to every
    baseline that applies. With --from-node: retrain the running agent's model instead."""
    if from_node:
        if data or out:
            _usage("--from-node trains on the node's records: it takes no --data or --out")
        _train_from_node(ctx)
        return
    if not data or not out:
        _usage("give --data and --out (or --from-node)")
    _train_file(data, out, trees, folds, coverage, gate_precision, provenance)


def _usage(message: str) -> NoReturn:
    click.echo(f"gpushare estimator train: {message}", err=True)
    sys.exit(exits.CONFIG)


def _train_file(
    data: str,
    out: str,
    trees: int,
    folds: int,
    coverage: float,
    gate_precision: float,
    provenance: str,
) -> None:
    from agent.estimator.training import data_hash, save
    from agent.estimator.training import train as fit

    lines, records = _read(data, need_retention=True)
    how = f"{folds}-fold" if folds else "leave-one-family-out (near twins held out together)"
    click.echo(f"training on {len(records)} records, {how} cross-validation ...", err=True)
    try:
        result = fit(
            records, folds=folds, trees=trees, coverage=coverage, gate_precision=gate_precision
        )
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
    save(
        result,
        Path(out),
        data_sha256=data_hash(lines),
        records=len(records),
        provenance=provenance or data,
    )
    for line in training_summary(result.cv, result.constraint_checks):
        click.echo(line)
    click.echo(f"model written to {out}")


def training_summary(cv: dict[str, Any], checks: dict[str, Any]) -> list[str]:
    """What ``train`` prints: the regressions against the mean, the gate at its operating
    point against the baselines that apply, the coverage and the constraints kept."""
    chosen = cv["selected"]
    keys = ["mae", "rmse", "accuracy_at_0.8", "accuracy_at_0.9"]
    lines = [f"{'estimate':<15}" + "".join(f"{k:>16}" for k in keys)]
    for name in ("forest", "linear", "mean", "util_sum_rule"):
        if name in cv:
            lines.append(f"{name:<15}" + "".join(f"{cv[name][k]:>16.4f}" for k in keys))
    folds = cv["folds"]
    lines.append(
        f"predicted_retention: the {chosen['regressor']}; MAE under the training mean's in "
        f"{folds['beating_mean']:.0f} of {folds['count']:.0f} held-out folds (worst ratio "
        f"{folds['worst_mae_ratio']:.2f})"
    )
    target = chosen["gate_precision_target"]
    lines.append(f"{'gate @0.85':<24}{'precision':>12}{'recall':>12}   (at precision {target:.2f})")
    rows = [
        (
            "model, grouped CV",
            chosen["gate_cv_precision_at_0.85"],
            chosen["gate_cv_recall_at_0.85"],
        ),
        (
            "model, held-out families",
            chosen["gate_heldout_precision_at_0.85"],
            chosen["gate_heldout_recall_at_0.85"],
        ),
    ]
    for name in ("util_sum_best", "util_sum_120", "admit_all"):
        if name in cv:
            rows.append((name, cv[name]["gate_precision_at_0.85"], cv[name]["gate_recall_at_0.85"]))
    lines += [f"{name:<24}{_figure(p):>12}{_figure(r):>12}" for name, p, r in rows]
    if "util_sum_best" not in cv:
        lines.append("(no utilisation-sum baseline: the records carry no gpu_util)")
    lines += choice_summary(cv.get("gate_choice"))
    bases = cv.get("retention_bases", {})
    if all(bases.get(b) for b in ("device", "share")):
        lines.append(
            f"warning: {bases['device']} records set retention against the whole device and "
            f"{bases['share']} against the workload's own share: under 100% threads the two "
            "mean different things (see retention_basis in docs/estimator.md)"
        )
    held = chosen["gate_heldout_precision_at_0.85"]
    if held is None or held < target - 1e-9:
        lines.append(
            f"warning: at floor 0.85 no threshold kept precision {target:.2f} on held-out "
            "families; the gate runs at the one that came closest and will admit little "
            "(more families, or counters that tell them apart, would help)"
        )
    lines.append(
        f"retention_lower coverage: nominal {chosen['coverage_nominal']:.2f}, achieved "
        f"{chosen['coverage_achieved']:.4f} on held-out families"
    )
    dropped = sorted(k for k, v in checks.items() if isinstance(v, dict) and not v["kept"])
    if checks:
        lines.append(
            "monotonic constraints: "
            + (f"dropped {', '.join(dropped)} (cost accuracy)" if dropped else "all kept")
        )
    return lines


def choice_summary(choice: dict[str, Any] | None) -> list[str]:
    """The estimate the gate decides on and its held-out recall beside the best rule's,
    each with its threshold chosen without the family it is scored on."""
    if not choice:
        return []
    floor = choice["floor"]
    lines = [
        f"gate decides on: {choice['estimate']} ({choice['reason']})",
        f"{'held out @' + str(floor):<24}{'precision':>12}{'recall':>12}",
        f"{'gate':<24}{_figure(choice['gate_heldout_precision']):>12}"
        f"{_figure(choice['gate_heldout_recall']):>12}",
    ]
    if choice.get("best_rule"):
        lines.append(
            f"{'best rule ' + choice['best_rule'][5:]:<24}"
            f"{_figure(choice['best_rule_heldout_precision']):>12}"
            f"{_figure(choice['best_rule_heldout_recall']):>12}"
        )
    return lines


def _figure(value: float | None) -> str:
    """A precision or recall to 4 places; "-" where nothing was admitted to measure."""
    return "-" if value is None else f"{value:.4f}"


def _train_from_node(ctx: click.Context) -> None:
    from agent.cli.client import retrain_estimator
    from agent.cli.common import agent_where, guarded

    where = agent_where(ctx)
    click.echo(
        "retraining on this node's run records and its base records (a minute or more) ...",
        err=True,
    )
    answer = guarded(lambda: retrain_estimator(where))
    click.echo(f"node records: {answer.node_records}")
    for name, value in sorted(answer.figures.items()):
        click.echo(f"  {name}: {int(value) if value.is_integer() else round(value, 4)}")
    verdict = "swapped in: " if answer.swapped else "kept the current model: "
    click.echo(verdict + answer.reason)
    if answer.model_dir:
        click.echo(f"model: {answer.model_dir}")


COVERAGE = click.option(
    "--coverage",
    type=click.FloatRange(0.5, 0.99),
    default=None,
    help="Coverage of retention_lower (default: the model's).",
)


PRECISION = click.option(
    "--precision",
    "gate_precision",
    type=click.FloatRange(0.8, 0.99),
    default=None,
    help="The gate's precision (default: the one the model was trained for, as "
    "estimator.gate_precision sets it in the agent).",
)


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@COVERAGE
@click.option(
    "--floor",
    default=0.85,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="The retention floor p_keep and gate_admit are for.",
)
@PRECISION
def predict(
    model_dir: str, data: str, coverage: float | None, floor: float, gate_precision: float | None
) -> None:
    """Print the records back as JSON Lines, each with predicted_retention (the
    regression's estimate), retention_lower (the explained conservative estimate) and its
    coverage, p_keep (P(retention >= --floor)) and gate_admit (what the admission gate would
    decide for a workload with that floor)."""
    _lines, records = _read(data, need_retention=False)
    model = _load(model_dir, coverage)
    precision = gate_precision or float(model.metadata.get("gate", {}).get("precision", 0.95))
    if not records:
        return
    found = model.estimate(records)
    p_keep, admit = model.admits(found, floor, precision)
    extra: dict[str, Any] = {} if model.coverage is None else {"retention_coverage": model.coverage}
    for at, record in enumerate(records):
        click.echo(
            to_json(
                record,
                predicted_retention=round(float(found.mean[at]), 6),
                retention_lower=round(float(found.lower[at]), 6),
                **extra,
                p_keep=round(float(p_keep[at]), 6),
                gate_admit=bool(admit[at]),
            )
        )


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@COVERAGE
@PRECISION
@click.option(
    "--report",
    type=click.Path(file_okay=False),
    default=None,
    help="Also write plots (PNG) and summary.md into this folder (needs matplotlib): "
    "calibration, predicted against true, the gate's precision/recall curve per floor with "
    "its operating point, and the model's learned-on-node history.",
)
def evaluate(
    model_dir: str,
    data: str,
    coverage: float | None,
    gate_precision: float | None,
    report: str | None,
) -> None:
    """Metrics of a model on labelled records, as JSON: MAE, RMSE, decision accuracy; the
    gate at its operating point (precision, recall, threshold) at floors 0.8, 0.85 and 0.9
    with the precision it kept on held-out families in training; the retention_lower gate
    and its coverage (nominal and achieved); and every baseline that applies."""
    from agent.estimator.report import evaluate as run
    from agent.estimator.report import write

    _lines, records = _read(data, need_retention=True)
    if not records:
        click.echo(f"gpushare: {data}: no records to evaluate on", err=True)
        sys.exit(exits.CONFIG)
    model = _load(model_dir, coverage)
    result = run(model, records, gate_precision)
    if report is not None:
        try:
            written = write(Path(report), result, model, Path(data).name)
        except ValidationError as exc:
            click.echo(f"gpushare: {exc}", err=True)
            sys.exit(exits.CONFIG)
        click.echo(f"report written to {', '.join(str(p) for p in written)}", err=True)
    click.echo(json.dumps(result["metrics"], indent=2))


def _load(model_dir: str, coverage: float | None = None) -> RetentionModel:
    try:
        model = RetentionModel.load(Path(model_dir))
        return model if coverage is None else model.with_coverage(coverage)
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
