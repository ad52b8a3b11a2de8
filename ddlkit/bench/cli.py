"""``ddlkit bench``: compare the strategies on this machine (see ddlkit.bench.run).

ddlkit bench --quick
ddlkit bench --strategies single multi_worker --repeats 1 --steps 40
ddlkit bench --quick --resnet      # also the small ResNet: single, independent, MWMS, Horovod
python -m ddlkit.bench --quick
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ddlkit.bench.config import (
    BENCH_STRATEGIES,
    DATASETS,
    FULL,
    QUICK,
    QUICK_TARGET,
    RESNET_STEPS,
    TARGET,
    plan_cases,
)
from ddlkit.errors import ConfigError


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` command to the ``ddlkit`` sub-parsers; returns its parser."""
    p = subparsers.add_parser("bench", help="compare strategies: throughput, scaling")
    fill_parser(p)
    return p


def fill_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats (minutes)")
    p.add_argument(
        "--strategies", nargs="+", choices=BENCH_STRATEGIES, default=list(BENCH_STRATEGIES)
    )
    p.add_argument("--repeats", type=int, default=None, help="runs of each case (median)")
    p.add_argument("--steps", type=int, default=None, help="training steps of each run")
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--dataset", choices=DATASETS, default="mnist", help="its CNN and data")
    p.add_argument(
        "--resnet",
        action="store_true",
        help="also the small ResNet on CIFAR-10 (single-x1, independent-x2, multi_worker-x2, "
        "horovod-x2 of --strategies; compared only with each other)",
    )
    p.add_argument(
        "--resnet-steps",
        type=int,
        default=None,
        help=f"training steps of each ResNet run (default quick {RESNET_STEPS['quick']}, "
        f"full {RESNET_STEPS['full']})",
    )
    p.add_argument("--runs-dir", default=None, help="default: DDLKIT_RUNS or ./runs")
    p.add_argument(
        "--overhead-pairs",
        type=int,
        default=None,
        help="kit vs by-hand run pairs for the overhead ratio (default 1, full 3; 0: skip)",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before stopping")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help=f"held-out accuracy to time (default {TARGET}; --quick: {QUICK_TARGET}, reached "
        f"in its steps)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help=f"steps between held-out evaluations (default quick {QUICK['eval_every']}, "
        f"full {FULL['eval_every']}; 0: none)",
    )


def main_bench(args: argparse.Namespace) -> int:
    """Plan, run and report; 0 when every case that was not skipped measured, else 1."""
    from ddlkit.bench.run import run_bench
    from ddlkit.launch import devices, plan

    horovod = plan.find_horovodrun(sys.executable) is not None
    cases = plan_cases(
        args.quick,
        len(devices.local_cores()),
        horovod,
        strategies=tuple(args.strategies),
        steps=args.steps,
        repeats=args.repeats,
        batch=args.batch_size,
        model=args.dataset,
        eval_every=args.eval_every,
        resnet=args.resnet,
        resnet_steps=args.resnet_steps,
    )
    target = args.target if args.target is not None else QUICK_TARGET if args.quick else TARGET
    if not 0 < target <= 1:
        raise ConfigError(f"--target {target}: an accuracy in (0, 1]. Fix: e.g. 0.95.")
    pairs = args.overhead_pairs
    if pairs is None:
        pairs = 1 if args.quick else 3
    if pairs < 0:
        raise ConfigError(f"--overhead-pairs {pairs}: must be 0 (skip) or more")
    result = run_bench(
        cases,
        runs_dir=args.runs_dir,
        quick=args.quick,
        overhead_pairs=pairs,
        timeout=args.timeout,
        target=target,
        command=shlex.join(sys.argv),
    )
    res = result.results()  # the table notebook 07 shows, as text
    print(f"{res}\n\n{res.about()}")
    print(f"results: {result.path}\nplot: {result.plot_path}")
    failed = [c.case.name for c in result.cases if c.error] or result.overhead_error
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    from ddlkit.errors import DdlkitError

    parser = argparse.ArgumentParser(prog="python -m ddlkit.bench", description=__doc__)
    fill_parser(parser)
    args = parser.parse_args(argv)
    try:
        return main_bench(args)
    except DdlkitError as exc:
        print(f"ddlkit bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
