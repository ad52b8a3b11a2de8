"""Live workers for a notebook: ``dk.workers(n, strategy=..., where=...)``.

The workers are a job of the launcher (`ddlkit.interactive.start`: the strategy's plan
through `ddlkit.launch.run.prepare`, TF_CONFIG, Keras, threads, cores, the collector,
preflight on other hosts, or srun's tasks in a Slurm allocation; started by
`ddlkit.launch.job.Job`: one fork place, children that die with this kernel). Each worker
process is an ipyparallel engine (`ddlkit.interactive.plan`), so ``%%px`` runs a cell on
every worker; the same job's controller connects them to this notebook's client.

::

    workers = dk.workers(2, strategy="multi_worker")
    workers.run_cell("import tensorflow as tf")   # what %%px does
    workers.kill("worker-1"); workers.restart(); workers.close()

A parameter-server job has no engines: its ps and worker tasks are TensorFlow servers and
this notebook is the coordinator (``workers.tf_config`` is the chief's TF_CONFIG).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ipyparallel import error as ipp_error

from ddlkit import contract, strategies
from ddlkit import where as places
from ddlkit.errors import ConfigError
from ddlkit.interactive import cells, plan, start
from ddlkit.interactive.engine import log_level
from ddlkit.interactive.output import WorkerDiedError, death_message
from ddlkit.interactive.script import Transcript
from ddlkit.launch.run import configure

READY_TIMEOUT = 120.0  # seconds for every engine to connect
ALONE = 30.0  # seconds a cell run on some workers only is waited for
KILL_SEEN = 10.0  # seconds for a killed worker's death to reach the job and the controller
END_WAIT = 3.0  # seconds close() waits for the engines it killed to end before stopping the rest


class Workers:
    """Live worker processes and this notebook's connection to them (see the module doc)."""

    def __init__(self, n: int, strategy: str, where: places.Where | None, **options: Any):
        plan.check_strategy(strategy)
        self._args = (n, strategy, where, dict(options))  # restart() starts the same again
        self.strategy = strategy
        self.alone = options.pop("alone", ALONE)
        live = options.pop("live", True)
        where = where or places.ThisMachine()
        self.config = configure(plan.ENGINE, strategy, n, (), where, **options)
        self.where = start.check(self.config, where)
        self.log_level = log_level({**os.environ, **self.config.env})  # as the engines'
        self.transcript = Transcript(strategy)
        self.pending: cells.Pending | None = None
        self._client: Any = None
        self._killed: dict[str, str] = {}
        self._pids: dict[str, int] = {}
        self._saved_tf_config: str | None = None
        self.closed = False
        self.started_at = time.monotonic()
        self.names, self.run = start.start(
            self.config, self.where, live=live, label=f"live-{strategy}-{n}"
        )
        try:
            if strategies.get(strategy).chief:  # this kernel is the coordinator
                self._serve_coordinator()
            else:
                self._client = start.wait_for_engines(self.run, self.names, READY_TIMEOUT)
                pids = self._client[:].apply_sync(os.getpid)
                self._pids = dict(zip(self.names, pids, strict=True))
        except BaseException:
            self.close()
            raise
        self.ready_seconds = time.monotonic() - self.started_at

    def _serve_coordinator(self) -> None:
        """This notebook is the chief: its TF_CONFIG, kept to be restored on close."""
        assert self.run.cluster is not None
        env = plan.coordinator_env(self.run.cluster)
        self._saved_tf_config = os.environ.get(contract.TF_CONFIG_VAR, "")
        os.environ.update(env)
        self.tf_config = env[contract.TF_CONFIG_VAR]

    # -- reading ------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    @property
    def client(self) -> Any:
        """The ipyparallel Client (``workers.client[:]`` is a DirectView of every worker)."""
        return self._client

    def status_table(self):
        return self.run.status_table()

    def dashboard(self, **kwargs: Any):
        """The live dashboard of what the workers' KerasReporter sends (as for a run)."""
        return self.run.dashboard(**kwargs)

    def records(self, worker: str | None = None):
        return self.run.records(worker)

    def tail(self, worker: str, n: int = 20) -> str:
        """The last ``n`` lines of ``worker``'s log, or of the process that started it (a
        Horovod rank's horovodrun, a Slurm task's srun), saying whose."""
        if worker not in self.names and worker not in self.run.job.spec.names:
            known = ", ".join((*self.names, *self.run.job.spec.names))
            raise ConfigError(f"no process {worker!r} here. Fix: use one of {known}.")
        return start.tail_of(self.run, worker, n)

    def _ids(self, targets: Sequence[int | str] | int | str | None) -> tuple[int, ...]:
        if targets is None or targets == "all":
            return tuple(range(len(self.names)))
        if isinstance(targets, int | str):
            targets = [targets]
        ids = []
        for t in targets:
            if isinstance(t, str) and t in self.names:
                ids.append(self.names.index(t))
            elif isinstance(t, int) and 0 <= t < len(self.names):
                ids.append(t)
            else:
                raise ConfigError(
                    f"targets: {t!r} is not a live worker. Fix: use a name "
                    f"({', '.join(self.names)}) or a number 0-{len(self.names) - 1}."
                )
        return tuple(dict.fromkeys(ids))

    # -- running cells ------------------------------------------------------------------------
    def run_cell(self, code: str, targets: Sequence[int | str] | int | str | None = None) -> list:
        """Run ``code`` on the workers ``targets`` (default: all), output labelled as it comes;
        every worker's result of the last expression, by engine. What ``%%px`` does."""
        if self.closed:
            raise ConfigError(
                "these workers were closed. Fix: workers.restart() for fresh ones with the same "
                "settings, or dk.workers(...) again."
            )
        if self._client is None:
            raise ConfigError(
                "a parameter-server job's workers are TensorFlow servers, not Python: this "
                "notebook is the coordinator. Fix: run the coordinator's code in ordinary cells."
            )
        self._check_alive()
        self._show_pending()
        ids = self._ids(targets)
        pending = cells.submit(self._client, code, ids, self.names, self.log_level)
        alone = self.alone if len(ids) < len(self.names) else None
        try:
            results = cells.wait(
                pending, self.names, self._check_alive, self._interrupt, alone, self.alone
            )
        except cells.CollectiveWaitError:
            self.pending = pending
            raise
        except ipp_error.CompositeError:  # an engine died during the cell
            self._check_alive()
            raise
        if len(ids) == len(self.names):
            self.transcript.add(code)
        return results

    def push(self, values: dict[str, Any]) -> None:
        """Send ``values`` to every worker as variables (ipyparallel's ``DirectView.push``);
        the script of :meth:`script` gets them as assignments, so only literals are taken."""
        import ast

        lines = []
        for name, value in values.items():
            try:
                ok = name.isidentifier() and ast.literal_eval(repr(value)) == value
            except (ValueError, SyntaxError):
                ok = False
            if not ok:
                raise ConfigError(
                    f"push: {name}={value!r} is not a name and a Python literal, so the script "
                    f"could not say it. Fix: push numbers, strings, lists or dicts of them."
                )
            lines.append(f"{name} = {value!r}")
        self._check_alive()
        self._client[:].push(dict(values), block=True)
        self.transcript.add("\n".join(lines))

    def _show_pending(self) -> None:
        if self.pending is not None and self.pending.result.ready():
            print("(the cell left running earlier has finished:)")
            self.pending.labeller.finish()
            self.pending = None

    def _interrupt(self, targets: Sequence[int]) -> None:
        print(f"interrupting {', '.join(self.names[t] for t in targets)} ...", flush=True)
        self._client.send_signal("SIGINT", targets=list(targets), block=False)

    def interrupt(self) -> None:
        """Send SIGINT to every worker (a KeyboardInterrupt in the cell they run)."""
        self._interrupt(range(len(self.names)))

    def _dead(self) -> bool:
        """Whether a worker is gone: killed here, seen by the job (a process it started
        ended) or by the controller (an engine left)."""
        job, client = self.run.job, self._client
        return (
            bool(self._killed)
            or job.done
            or client is not None
            and len(client.ids) < len(self.names)
        )

    def _check_alive(self) -> None:
        """Raise WorkerDiedError when a worker has died: its name, exit code, log tail."""
        if self._dead():
            deadline = time.monotonic() + KILL_SEEN  # the job's report of who died and how
            while not self.run.job.done and time.monotonic() < deadline:
                time.sleep(0.05)
            alive = [self.names[i] for i in self._client.ids] if self._client else []
            failure = self.run.job.failure
            tail = functools.partial(start.tail_of, self.run)
            raise WorkerDiedError(death_message(self.names, alive, self._killed, failure, tail))

    # -- acting -------------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        """Kill worker ``name`` with SIGKILL, as a crash would (the fault lessons' way); the
        next cell reports it (after up to `KILL_SEEN` s for the job to see how it ended)."""
        if name not in self.names:
            raise ConfigError(f"no live worker {name!r}. Fix: use one of {', '.join(self.names)}.")
        if self.closed or self._client is None and name not in self.run.job.spec.names:
            raise ConfigError(
                f"{name} is not a running process here. Fix: workers.restart() for fresh ones."
            )
        if name in self.run.job.spec.names:
            self.run.kill(name)
        else:  # a rank of horovodrun or a task of srun, maybe on another host: by its nanny
            self._client.send_signal("SIGKILL", targets=[self.names.index(name)], block=False)
        self._killed[name] = "SIGKILL sent by workers.kill"

    def _end_engines(self) -> None:
        """SIGKILL every engine through its nanny, wherever it runs, then wait (at most
        `END_WAIT` s) for the job's processes that stand for them to end. SIGTERM is not
        enough: on TF 2.21 a MultiWorkerMirroredStrategy worker ignores it (TensorFlow's
        coordination service takes it as a preemption notice), and on another host the
        watchdog's SIGKILL would come only after ``close()`` returned."""
        job = self.run.job
        if job.done:
            return
        job.ending()
        self._client.send_signal("SIGKILL", targets=list(self._client.ids), block=False)
        engines = [n for n in job.spec.names if n != contract.CONTROLLER]
        deadline = time.monotonic() + END_WAIT
        while time.monotonic() < deadline and any(
            job.status()[n].exit_code is None for n in engines
        ):
            time.sleep(0.05)

    def restart(self) -> Workers:
        """Fresh worker processes with the same settings (the old ones are ended first)."""
        self.close()
        n, strategy, where, options = self._args
        fresh = Workers(n, strategy, where, **dict(options))
        self.__dict__.update(fresh.__dict__)
        return self

    def close(self) -> None:
        """End every worker process and the controller; restore this kernel's TF_CONFIG."""
        self.closed = True
        if self._client is not None:
            self._end_engines()
            self._client.close()
            self._client = None
        if getattr(self, "run", None) is not None:
            self.run.stop()
        if self._saved_tf_config is not None:
            if self._saved_tf_config:
                os.environ[contract.TF_CONFIG_VAR] = self._saved_tf_config
            else:
                os.environ.pop(contract.TF_CONFIG_VAR, None)
            self._saved_tf_config = None

    def script(self, path: str | os.PathLike) -> Path:
        """Write the cells run on every worker so far as one script (see `Transcript`)."""
        return self.transcript.write(path, len(self.names))

    def activate(self, suffix: str = "") -> Workers:
        """Make ``%px``, ``%%px`` and ``%autopx`` run on these workers (done on start)."""
        from ddlkit.interactive.magics import register

        register(self, suffix)
        return self

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_html_(self) -> str:
        return self.run._repr_html_()

    def __repr__(self) -> str:
        return f"<Workers {', '.join(self.names)}: {self.strategy}, {self.run.job.state}>"


def workers(
    n: int = 2,
    *,
    strategy: str = "multi_worker",
    where: places.Where | None = None,
    **options: Any,
) -> Workers:
    """``n`` live workers of ``strategy`` ``where`` asked (default: this machine, each pinned
    to its own cores); ``%px``/``%%px`` run on them. ``options``: ``ps`` (parameter
    servers), ``env`` (extra environment), ``horovod_transport``, ``live`` (the metrics
    collector), ``alone`` (seconds to wait for a cell run on some workers only)."""
    live = Workers(n, strategy, where, **options)
    try:
        from IPython import get_ipython

        if get_ipython() is not None and live.client is not None:
            live.activate()
    except ImportError:
        pass
    return live
