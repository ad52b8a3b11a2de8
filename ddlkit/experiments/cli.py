"""``ddlkit experiment``: the user's model under every strategy here, and predicted elsewhere.

ddlkit experiment my_model.py
ddlkit experiment my_model.py --strategies multi_worker horovod --workers 1 2 --steps 50
ddlkit experiment my_model.py --model make_net --data make_data --predict DGX-A100 --json out.json
ddlkit experiment my_model.py --cluster A100:8:NVLink3:4x200:rdma    # a cluster you describe
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlkit.experiments.spec import STRATEGIES


def add_experiment_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("experiment", help="your model: every strategy here, predicted there")
    p.add_argument("file", help="a .py file with build_model() and dataset(batch_size, ctx)")
    p.add_argument("--model", default="build_model", help="its model function")
    p.add_argument("--data", default="dataset", help="its dataset(batch_size, input_context)")
    p.add_argument("--eval", default=None, help="its held-out set (default: eval_dataset if any)")
    p.add_argument("--loss", default=None, help="a Keras loss, for an uncompiled model")
    p.add_argument("--optimizer", default=None, help="a Keras optimizer, for an uncompiled model")
    p.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    p.add_argument("--workers", nargs="+", type=int, default=None, help="default 1 2 ... cores")
    p.add_argument("--steps", type=int, default=50, help="training steps of every case")
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--repeats", type=int, default=1, help="runs of each case (median)")
    p.add_argument("--eval-every", type=int, default=0, help="steps between held-out evals")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to time")
    p.add_argument(
        "--predict",
        nargs="*",
        default=[],
        metavar="PRESET",
        help="node presets to predict 1 to 1,024 workers of (dk.scale.nodes())",
    )
    p.add_argument(
        "--cluster",
        nargs="*",
        default=[],
        metavar="GPU:PER_NODE:INTRA:NICSxGBPS[:tcp]",
        help="a cluster you describe, e.g. A100:8:NVLink3:4x200 (RDMA unless :tcp)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here too")
    p.add_argument("--runs-dir", default=None, help="default: DDLKIT_RUNS or ./runs")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before stopping")
    return p


def main_experiment(args: argparse.Namespace) -> int:
    """Probe, run, print; 0 when every case that was not skipped measured, else 1."""
    from ddlkit.experiments import experiment
    from ddlkit.experiments.results import ASSUMPTIONS, prediction_table
    from ddlkit.scale import node

    for name in args.predict:  # a bad preset or cluster fails before anything runs
        node(name)
    places = [*args.predict, *(described(text) for text in args.cluster)]
    exp = experiment(
        args.file, strategies=args.strategies, workers=args.workers, steps=args.steps,
        batch=args.batch_size, repeats=args.repeats, model=args.model, data=args.data,
        eval=args.eval, loss=args.loss, optimizer=args.optimizer, eval_every=args.eval_every,
        target=args.target, live=False, runs_dir=args.runs_dir, timeout=args.timeout,
    )  # fmt: skip
    print(f"\n{exp.costs_table()}\n\n{exp.results}\n")
    here, left_out = exp.here()
    rows = here + [r for place in places for r in exp.predict(place)]
    if rows:
        print(prediction_table(rows))
    for why in left_out:
        print(f"not predicted here: {why}")
    for place in places:
        print(f"\n{exp.sensitivity(place, 1024)}")
    print("\nassumptions:\n" + "\n".join(f"- {a}" for a in ASSUMPTIONS))
    written = exp.write(hardware=tuple(places))
    print(f"results: {written}")
    if args.json:
        print(f"json: {exp.write(args.json, hardware=tuple(places))}")
    return 1 if any(c.error for c in exp.results.cases) else 0


def described(text: str):
    """``GPU:PER_NODE:INTRA:NICSxGBPS[:tcp]`` as ``dk.scale.cluster`` builds it."""
    from ddlkit.errors import ConfigError
    from ddlkit.scale import cluster

    parts = text.split(":")
    fix = "Fix: e.g. --cluster A100:8:NVLink3:4x200 (4 ports of 200 Gbit/s, RDMA) or ...:tcp"
    try:
        gpu, per_node, intra, nics = parts[:4]
        count, gbps = nics.lower().split("x")
        transport = parts[4] if len(parts) == 5 else "rdma"
        if len(parts) > 5:
            raise ValueError
        return cluster(gpu, gpus_per_node=int(per_node), intra=intra, nics_per_node=int(count),
                       nic_gbps=float(gbps), transport=transport)  # fmt: skip
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"--cluster {text!r} is not GPU:PER_NODE:INTRA:NICSxGBPS[:tcp]. {fix}"
        ) from None
