"""Per-worker status rows, the progress line and the status table (pure).

``process_status`` is what a launcher reports: ``{worker: {"state": str,
"exit_code": int | None}}``. It overrides the state read from records
(waiting / training / finished), because only the launcher knows that a
process failed or was never started.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping

from ddlkit.metrics.records import Record
from ddlkit.metrics.series import RunData

ProcessStatus = Mapping[str, Mapping[str, object]]


@dataclasses.dataclass(frozen=True)
class StatusRow:
    worker: str
    color: str
    state: str
    epoch: str
    step: str
    loss: str
    accuracy: str
    examples_per_sec: str
    age: str


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _state(data_state: str, process: Mapping[str, object] | None) -> str:
    if not process:
        return data_state
    state = str(process.get("state", data_state))
    code = process.get("exit_code")
    return f"{state} (exit {code})" if code is not None else state


def status_rows(
    data: RunData,
    process_status: ProcessStatus | None = None,
    ages: Mapping[str, float] | None = None,
) -> list[StatusRow]:
    """One row per worker known from records or from the launcher."""
    process_status = process_status or {}
    ages = ages or {}
    for name in process_status:
        data.worker(name)
    rows = []
    for name, worker in data.workers.items():
        latest = worker.latest
        if latest is None:
            state = "waiting"
        else:
            state = "finished" if worker.ended else "training"
        last_step = worker.latest  # the freshest values of any kind
        source = _freshest_values(worker.latest, worker.latest_epoch)
        epochs = worker.epochs_total
        epoch = ""
        if last_step is not None:
            epoch = f"{last_step.epoch + 1}" + (f"/{epochs}" if epochs else "")
        rows.append(
            StatusRow(
                worker=name,
                color=worker.color,
                state=_state(state, process_status.get(name)),
                epoch=epoch,
                step="" if last_step is None else str(last_step.step),
                loss=_fmt(source.loss if source else None, ".4f"),
                accuracy=_fmt(source.accuracy if source else None, ".4f"),
                examples_per_sec=_fmt(source.examples_per_sec if source else None, ",.0f"),
                age="" if name not in ages else f"{ages[name]:.0f} s",
            )
        )
    return rows


def _freshest_values(latest: Record | None, latest_epoch: Record | None) -> Record | None:
    """The newest step or epoch record (events carry no values)."""
    if latest is not None and latest.kind != "event":
        return latest
    return latest_epoch


def status_html(rows: list[StatusRow]) -> str:
    """The status table as HTML, each worker's name in its line colour."""
    head = "".join(
        f"<th style='padding:2px 10px;text-align:{align}'>{title}</th>"
        for title, align in (
            ("worker", "left"),
            ("state", "left"),
            ("epoch", "right"),
            ("step", "right"),
            ("loss", "right"),
            ("accuracy", "right"),
            ("examples/sec", "right"),
            ("last update", "right"),
        )
    )
    body = []
    for row in rows:
        cells = [
            f"<td style='padding:2px 10px'><span style='color:{row.color}'>&#9632;</span> "
            f"{html.escape(row.worker)}</td>",
            f"<td style='padding:2px 10px'>{html.escape(row.state)}</td>",
        ] + [
            f"<td style='padding:2px 10px;text-align:right'>{html.escape(value)}</td>"
            for value in (
                row.epoch,
                row.step,
                row.loss,
                row.accuracy,
                row.examples_per_sec,
                row.age,
            )
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        "<table class='ddlkit-status' style='border-collapse:collapse;font-size:12px'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def progress_text(data: RunData, total_steps: int | None, elapsed: float | None) -> str:
    """E.g. ``"938/1407 steps · epoch 2/3 · 41 s"``."""
    done = data.steps_done()
    parts = [f"{done}/{total_steps} steps" if total_steps else f"{done} steps"]
    epochs = [w.epochs_total for w in data.workers.values() if w.epochs_total]
    latest = [w.latest.epoch for w in data.workers.values() if w.latest is not None]
    if latest:
        parts.append(f"epoch {min(latest) + 1}" + (f"/{max(epochs)}" if epochs else ""))
    if elapsed is not None:
        parts.append(f"{elapsed:.0f} s")
    return " · ".join(parts)


def epoch_line(record: Record, epochs_total: int | None, total_steps: int | None) -> str:
    """The one line static mode prints per epoch record."""
    parts = [
        f"{record.worker}: epoch {record.epoch + 1}" + (f"/{epochs_total}" if epochs_total else ""),
        f"step {record.step}" + (f"/{total_steps}" if total_steps else ""),
    ]
    if record.loss is not None:
        parts.append(f"loss {record.loss:.4f}")
    if record.accuracy is not None:
        parts.append(f"accuracy {record.accuracy:.4f}")
    if record.examples_per_sec is not None:
        parts.append(f"{record.examples_per_sec:,.0f} examples/s")
    for key, value in sorted(record.metrics.items()):
        if key.startswith("val_"):
            parts.append(f"{key} {value:.4f}")
    return "  ".join(parts)
