"""``gpushare readiness``: make data, train and evaluate the readiness predictor."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.common import AllRequired
from agent.core.errors import GpushareError, ValidationError
from agent.estimator.readiness_data import Dataset, from_asi_csv, from_history, to_asi_csv

SYNTHETIC = "synthetic (agent.sim.readiness_synth, calibrated to 47.3% ready)"


@click.group()
def readiness() -> None:
    """The readiness predictor: P(a lease's workload ever starts) from nine attributes."""


def _source(csv_path: str | None, db: str | None, machine: str) -> tuple[Dataset, str]:
    if bool(csv_path) == bool(db):
        click.echo("gpushare: give exactly one of --csv and --history-db", err=True)
        sys.exit(exits.CONFIG)
    try:
        if csv_path:
            with open(csv_path, newline="") as f:
                return from_asi_csv(f), f"ASI execution summary {Path(csv_path).name}"
        assert db is not None
        if not Path(db).is_file():
            raise GpushareError(f"no such state database {db}")
        history = from_history(asyncio.run(_history(db)), machine=machine)
        if not len(history):
            click.echo(
                f"gpushare: no history yet in {db}: the agent records a lease when it ends; "
                "come back once leases have ended, or use --csv",
                err=True,
            )
            sys.exit(exits.CONFIG)
        return history, "agent lease history"
    except OSError as exc:
        click.echo(f"gpushare: cannot read {csv_path or db}: {exc.strerror}", err=True)
    except (ValidationError, GpushareError) as exc:
        click.echo(f"gpushare: {csv_path or db}: {exc}", err=True)
    sys.exit(exits.CONFIG)


async def _history(db: str) -> list:  # type: ignore[type-arg]
    from agent.state.sqlite import SqliteStateStore

    store = SqliteStateStore(db, sync="normal")
    await store.start()
    try:
        return await store.history()
    finally:
        await store.aclose()


_CSV = click.option(
    "--csv", "csv_path", type=click.Path(dir_okay=False), help="ASI execution-summary CSV."
)
_DB = click.option(
    "--history-db", "db", type=click.Path(dir_okay=False), help="The agent's state database."
)
_MACHINE = click.option("--machine", default="this-node", help="Group name for history rows.")


@readiness.command(cls=AllRequired)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="CSV file.")
@click.option("--jobs", default=20000, show_default=True)
@click.option("--seed", default=0, show_default=True)
def synth(out: str, jobs: int, seed: int) -> None:
    """Write SYNTHETIC jobs in the ASI execution-summary columns."""
    from agent.sim.readiness_synth import generate

    made = generate(jobs, seed=seed)
    data = Dataset(made.rows, made.labels, made.groups)
    Path(out).write_text("\n".join(to_asi_csv(data)) + "\n")
    click.echo(f"wrote {jobs} synthetic jobs to {out}")


@readiness.command(cls=AllRequired)
@_CSV
@_DB
@_MACHINE
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Model folder.")
@click.option("--trees", default=60, show_default=True)
@click.option("--seed", default=0, show_default=True)
def train(
    csv_path: str | None, db: str | None, machine: str, out: str, trees: int, seed: int
) -> None:
    """Train on an ASI CSV or on the agent's own history; write a model folder."""
    from agent.estimator.readiness_training import train as fit

    data, provenance = _source(csv_path, db, machine)
    click.echo(f"training on {len(data)} rows ({provenance}) ...", err=True)
    try:
        model = fit(data, trees=trees, seed=seed, provenance=provenance)
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
    model.save(Path(out))
    click.echo(f"model written to {out} ({len(data)} rows, {data.labels.count(True)} ready)")


@readiness.command(cls=AllRequired)
@_CSV
@_DB
@_MACHINE
@click.option("--folds", default=5, show_default=True, help="Grouped by machine.")
@click.option("--trees", default=60, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def evaluate(
    csv_path: str | None, db: str | None, machine: str, folds: int, trees: int, as_json: bool
) -> None:
    """K-fold grouped by machine: the predictor against two lookup baselines."""
    from agent.estimator.readiness_training import evaluate as run

    data, provenance = _source(csv_path, db, machine)
    click.echo(f"evaluating on {len(data)} rows ({provenance}), {folds} folds ...", err=True)
    try:
        report = run(data, folds=folds, trees=trees)
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
    except ValueError as exc:
        click.echo(f"gpushare: cannot evaluate: {exc}", err=True)
        sys.exit(exits.CONFIG)
    if as_json:
        click.echo(json.dumps({k: v for k, v in report.items() if k != "per_fold"}))
        return
    how = "grouped by machine" if report["grouped_by_machine"] else "NOT grouped (one machine)"
    click.echo(
        f"{report['rows']} rows, {report['machines']} machines, {report['folds']} folds "
        f"{how}; {report['ready_share']:.1%} ready"
    )
    click.echo(f"{'METHOD':<16} {'ROC-AUC':>8} {'PR-AUC':>8} {'ECE':>8}")
    for method, m in report["methods"].items():
        click.echo(f"{method:<16} {m['roc_auc']:>8.3f} {m['pr_auc']:>8.3f} {m['ece']:>8.3f}")
