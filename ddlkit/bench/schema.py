"""bench.json as typed data: the model its writer (:mod:`.run`) and reader (:mod:`.results`) share.

    doc = BenchFile.from_json(json.loads(text), path)   # checks every field, names the fix
    doc.to_json()                                       # the dict written to bench.json
    write_atomic(doc, path); read(path)                 # the file itself

Every class checks itself when built (a wrong value raises :class:`SchemaError`, a
``ValueError``) and ``from_json`` turns a malformed document into one
:class:`~ddlkit.errors.ConfigError` naming the file, the field and the fix.
``from_json(x.to_json()) == x`` for every class (tested). Schema 1 files (before time to
target, communication and machine details) still read: what they lack stays ``None``.
One concern: the bench.json schema, in one module; its length is the schema's.

bench.json (``SCHEMA_VERSION`` 3; every number is a plain float, None when absent)::

    schema: 3, benchmark: "strategies", bench_id: str, created: float (unix time),
    created_utc: str (ISO 8601), quick: bool, wall_seconds: float,
    command: str (how the benchmark was started), target_accuracy: float,
    machine: {cores: [int], cores_per_worker: int, cpu_model: str, python: str,
              tensorflow: str | None, horovod: str | None,
              load_start: [1, 5, 15 min load averages], load_end: [...]},
    cases: [ {
        name: "multi_worker-x2", strategy: str (reference, single, independent, mirrored,
        multi_worker, parameter_server, horovod; independent-xN: N single-device
        processes that never communicate, the machine's scaling ceiling), workers: int,
        steps: int,
        batch: int (per replica), repeats: int, model: str (data set of the CNN),
        eval_every: int (0: no held-out evals), eval_examples: int,
        skipped: str | None (why the case did not run), error: str | None,
        runs: [ {run_id, examples_per_sec, step_time (s), test_accuracy, wall_seconds,
                 seconds_to_target | None, best_eval_accuracy | None, evals: int,
                 foreign_cpu | None (0..1 share of the case's cores used by other
                 processes), comm_ms_per_step | None} ],
        examples_per_sec, step_time, test_accuracy, foreign_cpu:
            {median, min, max, n} | None   (over the runs),
        seconds_to_target: {median, min, max, n} | None  (over the runs that reached it),
        target_reached: "k/n" runs, target_note: str | None (e.g. "not reached in 60
            steps (best 0.93)"),
        speedup: float | None (throughput / the same strategy's x1; independent: single-x1),
        efficiency: float | None (speedup / workers),
        vs_single: float | None (throughput / single-x1's),
        vs_reference: float | None (throughput / reference-x1's: the bare tf-keras
            loop, run by the same benchmark on the same cores; schema 3),
        vs_ceiling: float | None (xN: throughput / independent-xN's; schema 3),
        repeat_ratio: float | None (max/min of the runs' examples_per_sec; schema 3),
        unstable: str | None (repeats that disagree, max/min > 1.10: how they split,
            "bimodal: ..." for two speeds; never averaged silently; schema 3),
        arch: str (what was trained on `model`: "cnn", its tutorial CNN, or "small_resnet",
            name "<strategy>-x<N>-resnet"; absent in older files: "cnn"; every ratio above
            compares a case only with cases of its own arch; schema 3),
        comm: {share: float | None (0..1 of a step), ms_per_step: float | None,
               how: str (measured how, estimated how, or why not measured)},
        profile_run: a run as in runs | None (Horovod x2+: the extra run with the timeline
            on that comm is measured in; not part of the medians),
    } ],
    overhead: {by_hand: [examples/s], kit: [...], ratios: [...], ratio_median: float,
               ratio_min: float, ratio_max: float, order: ["hand-first" | "kit-first"],
               workers: int, steps: int} | None,
    overhead_error: str | None
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ddlkit.errors import ConfigError

SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
RUN_FIX = (
    "Fix: run `ddlkit bench --quick` (or `ddlkit bench`) and pass its "
    "runs/<bench-id> directory or the bench.json in it."
)


class SchemaError(ValueError):
    """A bench.json value that breaks the schema: says which and why."""


def _number(value: Any, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(f"{where} is {value!r}, not a number")
    if not math.isfinite(value):
        raise SchemaError(f"{where} holds a value that is not a finite number")
    return float(value)


def _floats(values: Any, where: str) -> tuple[float, ...]:
    if not isinstance(values, list | tuple):
        raise SchemaError(f"{where} is {values!r}, not a list of numbers")
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(values))


def _opt(value: Any, kind: type = float) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class Spread:
    """Median of repeated measurements and their range."""

    median: float
    min: float
    max: float
    n: int

    def __post_init__(self) -> None:
        for name in ("median", "min", "max"):
            _number(getattr(self, name), f"spread {name}")
        if not self.min <= self.median <= self.max or self.n < 1:
            raise SchemaError(f"spread {self} is not min <= median <= max with n >= 1")

    @property
    def rel_range(self) -> float:
        """(max - min) / median: 0 when every repeat agreed."""
        return (self.max - self.min) / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}

    to_json = to_dict

    @classmethod
    def from_json(cls, raw: Any) -> Spread:
        try:
            return cls(float(raw["median"]), float(raw["min"]), float(raw["max"]), int(raw["n"]))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"is not a median/min/max/n record ({exc!r})") from None


@dataclass(frozen=True)
class RunMeasure:
    """One finished run of a case.

    ``seconds_to_target``: training seconds (evaluations left out) until the held-out
    accuracy first reached the target, None when it did not (or nothing evaluated);
    ``best_eval_accuracy``: the best held-out accuracy seen; ``foreign_cpu``: the share of
    the run's cores other processes used while it ran (:mod:`ddlkit.bench.cpu`);
    ``comm_ms_per_step``: measured communication per step where the strategy shows it
    (Horovod's timeline), else None.
    """

    run_id: str
    examples_per_sec: float
    step_time: float
    test_accuracy: float | None  # None: the model has no accuracy metric (dk.experiment)
    wall_seconds: float
    seconds_to_target: float | None = None
    best_eval_accuracy: float | None = None
    evals: int = 0
    foreign_cpu: float | None = None
    comm_ms_per_step: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self)[1:]:
            optional = f.default is None or f.name == "test_accuracy"
            _number(getattr(self, f.name), f"run {self.run_id} {f.name}", optional=optional)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, raw: Any) -> RunMeasure:
        try:
            return cls(
                run_id=str(raw["run_id"]),
                examples_per_sec=float(raw["examples_per_sec"]),
                step_time=float(raw["step_time"]),
                test_accuracy=_opt(raw["test_accuracy"]),
                wall_seconds=float(raw["wall_seconds"]),
                seconds_to_target=_opt(raw.get("seconds_to_target")),
                best_eval_accuracy=_opt(raw.get("best_eval_accuracy")),
                evals=int(raw.get("evals") or 0),
                foreign_cpu=_opt(raw.get("foreign_cpu")),
                comm_ms_per_step=_opt(raw.get("comm_ms_per_step")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"a run is malformed ({exc!r})") from None


@dataclass(frozen=True)
class Communication:
    """The share of a step spent communicating, or why there is none (``how``)."""

    share: float | None
    ms_per_step: float | None
    how: str

    def __post_init__(self) -> None:
        _number(self.share, "comm share", optional=True)
        _number(self.ms_per_step, "comm ms_per_step", optional=True)

    def to_dict(self) -> dict[str, Any]:
        return {"share": self.share, "ms_per_step": self.ms_per_step, "how": self.how}

    to_json = to_dict

    @classmethod
    def from_json(cls, raw: Any) -> Communication:
        try:
            return cls(
                _opt(raw.get("share")), _opt(raw.get("ms_per_step")), str(raw.get("how") or "")
            )
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"comm is malformed ({exc!r})") from None


@dataclass(frozen=True)
class CaseRecord:
    """One case as bench.json holds it: what was planned, every run, and the summaries."""

    name: str
    strategy: str
    workers: int
    steps: int = 0
    batch: int = 0
    repeats: int = 0
    model: str = ""
    eval_every: int = 0
    eval_examples: int = 0
    skipped: str | None = None
    error: str | None = None
    runs: tuple[RunMeasure, ...] = ()
    examples_per_sec: Spread | None = None
    step_time: Spread | None = None
    test_accuracy: Spread | None = None
    foreign_cpu: Spread | None = None
    seconds_to_target: Spread | None = None
    target_reached: str = ""
    target_note: str | None = None
    comm: Communication | None = None
    profile_run: RunMeasure | None = None
    speedup: float | None = None
    efficiency: float | None = None
    vs_single: float | None = None
    vs_reference: float | None = None
    vs_ceiling: float | None = None
    repeat_ratio: float | None = None
    unstable: str | None = None
    arch: str | None = None  # None: a file from before the field, whose cases are CNNs

    SPREADS = ("examples_per_sec", "step_time", "test_accuracy", "foreign_cpu", "seconds_to_target")
    REQUIRED = ("name", "strategy", "workers", "examples_per_sec", "step_time")
    # schema 3's fields: left out of the JSON while None, so older files read and write
    # back unchanged
    OPTIONAL = ("vs_reference", "vs_ceiling", "repeat_ratio", "unstable", "arch")

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise SchemaError(f"case {self.name!r} has workers={self.workers}")
        for name in (
            "speedup",
            "efficiency",
            "vs_single",
            "vs_reference",
            "vs_ceiling",
            "repeat_ratio",
        ):
            _number(getattr(self, name), f"case {self.name!r} {name}", optional=True)

    @property
    def architecture(self) -> str:
        """What the case trained: ``arch``, or ``"cnn"`` in files written before it."""
        return self.arch or "cnn"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            if f.name == "runs":
                value = [r.to_json() for r in value]
            elif value is not None and hasattr(value, "to_json"):
                value = value.to_json()
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, raw: Any, index: int = 0) -> CaseRecord:
        if not isinstance(raw, Mapping):
            raise SchemaError(f"case {index} is not an object")
        missing = [k for k in cls.REQUIRED if k not in raw]
        if missing:
            raise SchemaError(f"case {index} lacks {', '.join(missing)}")
        where = f"case {raw['name']!r}"
        spreads = {}
        for name in cls.SPREADS:
            try:
                spreads[name] = None if raw.get(name) is None else Spread.from_json(raw[name])
            except SchemaError as exc:
                raise SchemaError(f"{where} {name} {exc}") from None
        try:
            comm = None if raw.get("comm") is None else Communication.from_json(raw["comm"])
            profile = raw.get("profile_run")
            return cls(
                name=str(raw["name"]),
                strategy=str(raw["strategy"]),
                workers=int(raw["workers"]),
                steps=int(raw.get("steps") or 0),
                batch=int(raw.get("batch") or 0),
                repeats=int(raw.get("repeats") or 0),
                model=str(raw.get("model") or ""),
                eval_every=int(raw.get("eval_every") or 0),
                eval_examples=int(raw.get("eval_examples") or 0),
                skipped=_opt(raw.get("skipped") or None, str),
                error=_opt(raw.get("error") or None, str),
                runs=tuple(RunMeasure.from_json(r) for r in raw.get("runs") or []),
                target_reached=str(raw.get("target_reached") or ""),
                target_note=_opt(raw.get("target_note") or None, str),
                comm=comm,
                profile_run=None if profile is None else RunMeasure.from_json(profile),
                speedup=_opt(raw.get("speedup")),
                efficiency=_opt(raw.get("efficiency")),
                vs_single=_opt(raw.get("vs_single")),
                vs_reference=_opt(raw.get("vs_reference")),
                vs_ceiling=_opt(raw.get("vs_ceiling")),
                repeat_ratio=_opt(raw.get("repeat_ratio")),
                unstable=_opt(raw.get("unstable") or None, str),
                arch=_opt(raw.get("arch") or None, str),
                **spreads,
            )
        except SchemaError as exc:
            if str(exc).startswith("case "):
                raise
            raise SchemaError(f"{where}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise SchemaError(f"{where}: a count, a run or comm is malformed ({exc!r})") from None


@dataclass(frozen=True)
class OverheadRecord:
    """The kit vs by hand (:mod:`.overhead`): examples/s pair by pair and the median ratio."""

    ratio_median: float
    ratios: tuple[float, ...] = ()
    by_hand: tuple[float, ...] = ()
    kit: tuple[float, ...] = ()
    ratio_min: float | None = None
    ratio_max: float | None = None
    order: tuple[str, ...] = ()
    workers: int | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        _number(self.ratio_median, "overhead ratio_median")
        _floats(self.ratios, "overhead ratios")

    def to_json(self) -> dict[str, Any]:
        out = {
            "by_hand": list(self.by_hand),
            "kit": list(self.kit),
            "order": list(self.order),
            "steps": self.steps,
            "workers": self.workers,
            "ratios": list(self.ratios),
            "ratio_median": self.ratio_median,
            "ratio_min": self.ratio_min,
            "ratio_max": self.ratio_max,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, raw: Any) -> OverheadRecord:
        try:
            return cls(
                ratio_median=float(raw["ratio_median"]),
                ratios=_floats(raw.get("ratios") or (), "overhead ratios"),
                by_hand=_floats(raw.get("by_hand") or (), "overhead by_hand"),
                kit=_floats(raw.get("kit") or (), "overhead kit"),
                ratio_min=_opt(raw.get("ratio_min")),
                ratio_max=_opt(raw.get("ratio_max")),
                order=tuple(str(o) for o in raw.get("order") or ()),
                workers=_opt(raw.get("workers"), int),
                steps=_opt(raw.get("steps"), int),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SchemaError(f"overhead lacks ratio_median or ratios ({exc!r})") from None


@dataclass(frozen=True)
class Machine:
    """Where the benchmark ran: its cores, each worker's share, and what else was recorded
    (``details``: cpu_model, python, tensorflow, horovod, load_start, load_end, in the
    order written; a key the writer did not know stays absent)."""

    cores: tuple[int, ...]
    cores_per_worker: int
    details: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.cores_per_worker < 1 or not self.cores:
            raise SchemaError(f"machine has cores {self.cores}, {self.cores_per_worker} per worker")

    def detail(self, key: str) -> Any:
        return dict(self.details).get(key)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cores": list(self.cores), "cores_per_worker": self.cores_per_worker}
        for key, value in self.details:
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def of(cls, cores: Any, cores_per_worker: int, details: Mapping[str, Any]) -> Machine:
        """From the writer's values (lists become tuples, as :meth:`from_json` reads them)."""
        return cls.from_json({"cores": cores, "cores_per_worker": cores_per_worker, **details})

    @classmethod
    def from_json(cls, raw: Any) -> Machine:
        try:
            cores = tuple(int(c) for c in raw["cores"])
            per_worker = int(raw["cores_per_worker"])
            details = tuple(
                (str(k), tuple(v) if isinstance(v, list) else v)
                for k, v in raw.items()
                if k not in ("cores", "cores_per_worker")
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SchemaError(f"machine lacks cores or cores_per_worker ({exc!r})") from None
        return cls(cores, per_worker, details)


TOP_FIELDS = (
    "schema",
    "benchmark",
    "bench_id",
    "created",
    "created_utc",
    "quick",
    "wall_seconds",
    "command",
    "target_accuracy",
    "machine",
    "cases",
    "overhead",
    "overhead_error",
)


@dataclass(frozen=True)
class BenchFile:
    """A whole bench.json: one benchmark's cases, where it ran and the kit's overhead."""

    bench_id: str
    created: float  # unix time the benchmark started
    machine: Machine
    cases: tuple[CaseRecord, ...]
    quick: bool = False
    wall_seconds: float = 0.0
    command: str | None = None
    target_accuracy: float | None = None
    overhead: OverheadRecord | None = None
    overhead_error: str | None = None
    schema: int = SCHEMA_VERSION
    extra: tuple[tuple[str, Any], ...] = ()  # top-level keys this ddlkit does not know

    def __post_init__(self) -> None:
        if not self.cases:
            raise SchemaError("it has no cases")
        _number(self.created, "created")
        _number(self.wall_seconds, "wall_seconds")
        _number(self.target_accuracy, "target_accuracy", optional=True)

    @property
    def created_utc(self) -> str:
        return datetime.fromtimestamp(self.created, UTC).isoformat()

    def to_json(self) -> dict[str, Any]:
        out = {
            "schema": self.schema,
            "benchmark": "strategies",
            "bench_id": self.bench_id,
            "created": self.created,
            "created_utc": self.created_utc,
            "quick": self.quick,
            "wall_seconds": self.wall_seconds,
            "command": self.command,
            "target_accuracy": self.target_accuracy,
            "machine": self.machine.to_json(),
            "cases": [c.to_json() for c in self.cases],
            "overhead": self.overhead.to_json() if self.overhead else None,
            "overhead_error": self.overhead_error,
        }
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, doc: Any, path: str | Path = "bench.json") -> BenchFile:
        """The typed file from a parsed JSON document; :class:`ConfigError` naming `path`,
        the broken field and the fix when it is not a ddlkit benchmark result."""
        path = Path(path)
        if not isinstance(doc, Mapping) or doc.get("benchmark") != "strategies":
            raise invalid(path, "it has no 'benchmark': 'strategies' field")
        schema = doc.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise ConfigError(
                f"{path} has bench.json schema {schema!r}; this ddlkit reads schemas "
                f"{', '.join(map(str, READABLE_SCHEMAS))}. Fix: run `ddlkit bench` again with "
                f"this ddlkit, or update ddlkit."
            )
        missing = [k for k in ("bench_id", "created", "machine", "cases") if k not in doc]
        if missing:
            raise invalid(path, f"it lacks {', '.join(missing)}")
        if not isinstance(doc["cases"], list) or not doc["cases"]:
            raise invalid(path, "it has no cases")
        try:
            overhead = doc.get("overhead")
            target = doc.get("target_accuracy")
            return cls(
                bench_id=str(doc["bench_id"]),
                created=float(doc["created"]),
                machine=Machine.from_json(doc["machine"]),
                cases=tuple(CaseRecord.from_json(c, i) for i, c in enumerate(doc["cases"])),
                quick=bool(doc.get("quick")),
                wall_seconds=float(doc.get("wall_seconds") or 0.0),
                command=_opt(doc.get("command"), str),
                target_accuracy=None if target is None else float(target),
                overhead=OverheadRecord.from_json(overhead) if overhead else None,
                overhead_error=_opt(doc.get("overhead_error") or None, str),
                schema=int(schema),
                extra=tuple((k, v) for k, v in doc.items() if k not in TOP_FIELDS),
            )
        except (TypeError, ValueError) as exc:
            raise invalid(path, str(exc)) from None


def invalid(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{path} is not a ddlkit benchmark result: {what}. {RUN_FIX}")


def bench_file(path: str | Path) -> Path:
    """``path`` itself or the bench.json in it; :class:`ConfigError` when there is none."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "bench.json"
    if not path.is_file():
        raise ConfigError(f"there is no benchmark result at {path}. {RUN_FIX}")
    return path


def read(path: str | Path) -> tuple[BenchFile, Path]:
    """The typed bench.json at `path` (a run directory or the file) and the file's path."""
    file = bench_file(path)
    try:
        doc = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise invalid(file, f"not valid JSON ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}. {RUN_FIX}") from None
    return BenchFile.from_json(doc, file), file


def write_atomic(doc: BenchFile, path: str | Path) -> Path:
    """Write `doc` to `path` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc.to_json(), indent=2))
    os.replace(tmp, path)
    return path


__all__ = [
    "SCHEMA_VERSION",
    "BenchFile",
    "CaseRecord",
    "Communication",
    "Machine",
    "OverheadRecord",
    "RunMeasure",
    "SchemaError",
    "Spread",
    "read",
    "write_atomic",
]
