"""Experiments on the user's own model: which strategy, how many workers, what it will cost.

    exp = dk.experiment("my_model.py", strategies=["multi_worker", "horovod"], workers=[1, 2],
                        steps=50)
    exp                       # the model's costs and every case measured here
    exp.plot()
    exp.predict("DGX-A100")   # 1 to 1,024 workers of a cluster you do not have
    dk.experiments.costs("my_model.py", batch=32)   # the costs alone, nothing run

    ddlkit experiment my_model.py --strategies multi_worker horovod --workers 1 2 --json out.json

Modules: :mod:`.spec` (the file, its costs, the cases: pure), :mod:`.user_file` (the file
imported and called, the same in the probe and every worker), :mod:`.costs` (what a step
costs, counted by TensorFlow), :mod:`.probe` (the one-process check before anything starts),
:mod:`.run` (the one place that starts processes), :mod:`.results` (the experiment read
back, its JSON and predictions), :mod:`.cli` (``ddlkit experiment``). The worker is
``launch/train_user.py``.
"""

from __future__ import annotations

from pathlib import Path

from ddlkit.experiments.spec import STRATEGIES, ModelCosts, UserCase, UserModel, plan

__all__ = ["STRATEGIES", "ModelCosts", "UserCase", "UserModel", "costs", "experiment", "plan"]


def experiment(
    path: str | Path,
    *,
    strategies=STRATEGIES,
    workers=None,
    steps: int = 50,
    batch: int = 64,
    repeats: int = 1,
    model: str = "build_model",
    data: str = "dataset",
    eval: str | None = None,
    loss: str | None = None,
    optimizer: str | None = None,
    eval_every: int = 0,
    target: float = 0.9,
    where=None,
    live: bool | None = None,
    runs_dir=None,
    timeout: float = 900,
    progress=print,
):
    """Train the model of ``path`` under every strategy asked, measured as the benchmark
    measures, and return the :class:`~ddlkit.experiments.results.Experiment`.

    ``workers``: the worker counts (default 1, 2, ... while each has its own core);
    ``steps`` and ``batch`` (per replica) are the same in every case; ``eval_every`` > 0
    evaluates the file's ``eval_dataset`` every so many steps (time to ``target``
    accuracy); ``where``: another place than this machine (``dk.where.Hosts``, ...);
    ``live``: show each case's live dashboard (default: in a notebook)."""
    from ddlkit.experiments.run import run_experiment

    user = UserModel.of(path, model=model, data=data, eval=eval, loss=loss, optimizer=optimizer)
    if live is None:
        live = _in_notebook()
    on_start = _show_dashboard if live else None
    return run_experiment(user, strategies, workers, steps=steps, batch=batch, repeats=repeats,
                          eval_every=eval_every, target=target, where=where, on_start=on_start,
                          runs_dir=runs_dir, timeout=timeout, progress=progress)  # fmt: skip


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _show_dashboard(run) -> None:
    from IPython.display import display

    display(run.dashboard())


def costs(path: str | Path, *, batch: int = 64, model: str = "build_model", data: str = "dataset",
          loss: str | None = None, optimizer: str | None = None) -> ModelCosts:  # fmt: skip
    """What one step of the model of ``path`` costs at ``batch`` per worker, without running an
    experiment: the same one-process check (:mod:`.probe`), so a bad file is the same error."""
    from ddlkit.experiments.run import check_file

    user = UserModel.of(path, model=model, data=data, loss=loss, optimizer=optimizer)
    return check_file(user, batch)[0]
