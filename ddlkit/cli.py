"""The ``ddlkit`` command: a thin front end over the functions notebooks call.

    ddlkit launch --strategy multi_worker -n 2 launch/train_multi_worker.py -- --epochs 1
    ddlkit launch --engine spark --master spark://127.0.0.1:7077 --strategy horovod -n 2 \
        launch/train_horovod.py
    ddlkit launch --ray 127.0.0.2:6379 --strategy multi_worker -n 2 launch/train_multi_worker.py
    ddlkit launch -n 2 -H node1:1,node2:1 --ssh-identity ~/.ssh/id_ed25519 \
        --collector-host auto launch/train_multi_worker.py
    ddlkit runs
    ddlkit plot RUN [-o figure.png]
    ddlkit env
    ddlkit data {prepare,status,import}
    ddlkit bench [--quick] [--strategies ...] [--repeats N] [--steps N]
    ddlkit experiment my_model.py [--strategies ...] [--workers 1 2] [--json out.json]
    ddlkit k8s manifest --strategy multi_worker -n 2 --image IMAGE SCRIPT -- ARGS
    ddlkit image build [--tag TAG]

Exit codes: 0 success, 1 a worker or the run failed, 2 bad input (nothing
started), 130 interrupted. Errors go to stderr as one line.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from pathlib import Path

from ddlkit import settings
from ddlkit.bench.cli import add_bench_parser, main_bench
from ddlkit.errors import DdlkitError, JobTimeoutError, WorkerFailedError
from ddlkit.experiments.cli import add_experiment_parser, main_experiment
from ddlkit.image.__main__ import add_parsers as add_image_parsers
from ddlkit.image.__main__ import run_parsed as cmd_image
from ddlkit.k8s.cli import add_parsers as add_k8s_parsers
from ddlkit.k8s.cli import run_parsed as cmd_k8s

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _parser() -> argparse.ArgumentParser:
    from ddlkit.launch.plan import STRATEGIES

    parser = argparse.ArgumentParser(prog="ddlkit", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("launch", help="start a job of workers running SCRIPT")
    p.add_argument("--strategy", choices=STRATEGIES, default="multi_worker")
    p.add_argument("-n", "--workers", type=int, default=2, help="workers (Horovod: ranks)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="host list in horovodrun syntax, e.g. localhost:2")
    hosts.add_argument("--hostfile", type=Path, help="file of 'host slots=N' lines")
    p.add_argument("--ps", type=int, default=1, help="parameter servers (parameter_server)")
    p.add_argument(
        "--engine", choices=("local", "spark"), default="local", help="spark: tasks on --master"
    )
    p.add_argument("--master", help="Spark master URL: spark://HOST:PORT, local[N], yarn")
    p.add_argument("--ray", metavar="HOST:PORT", help="run the workers as actors on this Ray head")
    p.add_argument("--placement", default="PACK", help="Ray placement group strategy (with --ray)")
    p.add_argument("--label", default="", help="a word to put in the run id")
    p.add_argument("--no-live", action="store_true", help="no metrics collector")
    p.add_argument("--collector-port", type=int, default=0, help="default: a free port")
    p.add_argument("--no-pin", action="store_true", help="do not pin workers to cores")
    p.add_argument(
        "--cores", type=_cores, default=None, help="the cores the run may use, e.g. 0,1 or 2-3"
    )
    p.add_argument(
        "--env", action="append", type=_env_item, default=[], metavar="NAME=VALUE",
        help="an extra variable for every worker (repeatable)",
    )  # fmt: skip
    p.add_argument("--runs-dir", type=Path, default=None, help="default: DDLKIT_RUNS or ./runs")
    p.add_argument(
        "--horovod-transport", choices=("auto", "gloo", "mpi"), default="auto",
        help="horovod: MPI or Gloo (auto: MPI here when Horovod was built with it)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=None, help="seconds before the job is stopped")
    remote = p.add_argument_group("other hosts (over SSH, in BatchMode)")
    remote.add_argument("--ssh-identity", help="private key file (default: ssh's own)")
    remote.add_argument("--ssh-known-hosts", help="known_hosts file (default: ~/.ssh's)")
    remote.add_argument("--ssh-user", help="user on the hosts (default: yours)")
    remote.add_argument("--ssh-port", type=int, default=None, help="default: 22, or --ssh-config's")
    remote.add_argument(
        "--ssh-config", help="ssh config naming the hosts (user-mode demo hosts: demo.ssh_config)"
    )
    remote.add_argument(
        "--collector-host",
        help="address the hosts reach for live metrics, or 'auto' (needed with other hosts)",
    )
    remote.add_argument(
        "--base-port", type=int, default=None, help="TF servers' first port on each host"
    )
    remote.add_argument(
        "--distinct-ports", action="store_true",
        help="TF server ports distinct across hosts (hosts sharing one network stack)",
    )  # fmt: skip
    remote.add_argument("--network-interface", help="horovodrun --network-interface")
    remote.add_argument("--python", help="the kit's Python on the hosts (default: this one)")
    p.add_argument("script", help="a Python training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: the script's arguments")

    p = sub.add_parser("runs", help="list past runs")
    p.add_argument("--runs-dir", type=Path, default=None)

    p = sub.add_parser("plot", help="draw a run's metrics")
    p.add_argument("run", help="a run id (under the runs directory) or a run directory")
    p.add_argument("-o", "--output", type=Path, default=None, help="default: RUN/metrics.png")
    p.add_argument("--runs-dir", type=Path, default=None)

    sub.add_parser("env", help="check TensorFlow, Keras, devices, Horovod and data sets")

    p = sub.add_parser("data", help="prepare, inspect or import the offline data sets")
    p.add_argument(
        "data_args",
        nargs=argparse.REMAINDER,
        help="prepare [--force] [NAME...] | status [NAME...] | import cifar10 PATH",
    )
    add_bench_parser(sub)
    add_experiment_parser(sub)
    k8s = sub.add_parser("k8s", help="Kubernetes: write a training job's manifest (YAML)")
    add_k8s_parsers(k8s.add_subparsers(dest="k8s_command", required=True))
    image = sub.add_parser("image", help="build the kit's container image (buildah)")
    add_image_parsers(image.add_subparsers(dest="image_command", required=True))
    return parser


def _cores(text: str) -> tuple[int, ...]:
    """``"0,1"`` or ``"2-3"`` or ``"0,2-3"`` to core numbers (argparse type)."""
    cores: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cores.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a core list. Fix: e.g. --cores 0,1 or --cores 2-3."
        ) from None
    return tuple(cores)


def _env_item(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=VALUE. Fix: e.g. --env HOROVOD_TIMELINE=/tmp/t.json."
        )
    return name, value


def _runs_dir(arg: Path | None) -> Path:
    return arg if arg is not None else settings.runs_dir()


def cmd_launch(args: argparse.Namespace) -> int:
    from ddlkit.hosts import SshOptions
    from ddlkit.launch import run as run_mod

    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    ssh = None
    given = (args.ssh_identity, args.ssh_known_hosts, args.ssh_user, args.ssh_config)
    if any(given) or args.ssh_port is not None:
        config = args.ssh_config and str(Path(args.ssh_config).expanduser())
        ssh = SshOptions(
            identity=args.ssh_identity and str(Path(args.ssh_identity).expanduser()),
            known_hosts=args.ssh_known_hosts and str(Path(args.ssh_known_hosts).expanduser()),
            user=args.ssh_user,
            # with a config, its Port lines choose each host's port unless --ssh-port is given
            port=args.ssh_port if args.ssh_port is not None else (None if config else 22),
            config_file=config,
        )
    run = None  # Ctrl-C may come while start() returns: stop what it started then too
    try:
        run = run_mod.start(
            args.script,
            strategy=args.strategy,
            workers=args.workers,
            args=script_args,
            where=_where(args, ssh),
            ps=args.ps,
            label=args.label,
            live=not args.no_live,
            runs_dir=args.runs_dir,
            collector_port=args.collector_port,
            env=dict(args.env),
            horovod_transport=args.horovod_transport,
        )
        if run.preflight is not None:
            print(run.preflight)
        print(f"run {run.run_id}: {args.strategy} x{args.workers}, logs in {run.run_dir}/logs")
        with _ctrl_c_as_flag() as interrupted:
            result = _wait_with_progress(run, args.timeout, interrupted)
    except KeyboardInterrupt:
        if run is not None:
            run.stop()  # wait() stops the workers itself, but Ctrl-C may land elsewhere
        print("interrupted: every worker was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    for name, res in run.results().items():
        print(f"{name}: {res}")
    if run.records():
        from ddlkit.metrics import plot_run

        out = run.run_dir / "metrics.png"
        plot_run(run.run_dir).savefig(out, dpi=100)
        print(f"metrics plot: {out}")
    print(f"finished in {result.duration:.1f} s")
    return 0


def _where(args: argparse.Namespace, ssh: object):
    """The `ddlkit.where.Where` the launch flags say (the same keywords launch.start took)."""
    if args.ray is not None:
        from ddlkit.errors import ConfigError
        from ddlkit.where import Ray

        clash = [f for f in ("hosts", "hostfile", "master", "cores") if getattr(args, f)]
        if clash or args.engine != "local":
            clash += ["engine"] if args.engine != "local" else []
            raise ConfigError(
                f"--ray with --{', --'.join(clash)}: Ray places the workers. "
                f"Fix: drop them, or drop --ray."
            )
        return Ray(args.ray, placement=args.placement)
    given = {
        "hosts": args.hosts,
        "hostfile": args.hostfile,
        "ssh": ssh,
        "collector_host": args.collector_host,
        "network_interface": args.network_interface,
        "base_port": args.base_port,
        "distinct_ports": args.distinct_ports or None,
        "python": args.python,
        "cores": args.cores,
        "pin_cores": False if args.no_pin else None,
        "engine": args.engine,
        "master": args.master,
    }
    from ddlkit.where import from_keywords

    return from_keywords({k: v for k, v in given.items() if v is not None})


@contextlib.contextmanager
def _ctrl_c_as_flag():
    """While waiting, Ctrl-C (SIGINT) sets an Event that the wait loop checks, instead of
    raising KeyboardInterrupt wherever the main thread happens to be: raised inside the
    job's locks it could leave one held, and the CLI hung (seen twice in CI)."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted  # signals reach the main thread only
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait_with_progress(run, timeout: float | None, interrupted: threading.Event | None = None):
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        if interrupted is not None and interrupted.is_set():
            raise KeyboardInterrupt  # here, at a known point: the caller stops the run
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            run.stop()
            raise DdlkitError(
                f"run {run.run_id} did not finish within {timeout:.0f} s and was stopped. "
                f"Fix: raise --timeout, or read the logs in {run.run_dir}/logs."
            )
        try:
            return run.wait(timeout=min(0.5, left) if left is not None else 0.5)
        except JobTimeoutError:
            pass
        line = "  ".join(
            f"{n}:{s.state}" + (f"@{s.current_step}" if s.current_step is not None else "")
            for n, s in run.status().items()
        )
        if line != last and sys.stderr.isatty():
            print(line, file=sys.stderr)
            last = line


def cmd_runs(args: argparse.Namespace) -> int:
    from ddlkit.launch import list_runs, runs_table

    runs = list_runs(_runs_dir(args.runs_dir))
    if not runs:
        print(f"no runs in {_runs_dir(args.runs_dir)}")
        return 0
    print(runs_table(runs))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ddlkit.metrics import plot_run

    run_dir = Path(args.run)
    if not run_dir.is_dir():
        run_dir = _runs_dir(args.runs_dir) / args.run
    if not run_dir.is_dir():
        raise DdlkitError(
            f"no run {args.run!r}: neither a directory nor a run id in {_runs_dir(args.runs_dir)}. "
            f"Fix: pick one from `ddlkit runs`."
        )
    out = args.output or run_dir / "metrics.png"
    plot_run(run_dir).savefig(out, dpi=100)
    print(out)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from ddlkit import env

    report = env.check()
    print(report)
    return 0 if report.ok else EXIT_FAILED


def cmd_data(args: argparse.Namespace) -> int:
    from ddlkit.data.__main__ import main as data_main

    return data_main(args.data_args)


COMMANDS = {
    "launch": cmd_launch,
    "runs": cmd_runs,
    "plot": cmd_plot,
    "env": cmd_env,
    "data": cmd_data,
    "bench": main_bench,
    "experiment": main_experiment,
    "k8s": cmd_k8s,
    "image": cmd_image,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except WorkerFailedError as exc:
        print(f"ddlkit: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (DdlkitError, ValueError) as exc:
        print(f"ddlkit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
