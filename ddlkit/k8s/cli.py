"""``ddlkit k8s manifest ...`` and ``python -m ddlkit.k8s exec ...``: thin argparse fronts.

    ddlkit k8s manifest --strategy multi_worker -n 2 --image IMAGE launch/train_multi_worker.py \
        -- --epochs 3 > job.yaml       (IMAGE: default the kit's own, localhost/ddlkit:0.1.0)
    ddlkit k8s manifest --strategy parameter_server -n 2 --ps 1 --image IMAGE -o job.yaml \
        launch/train_parameter_server.py
    python -m ddlkit.k8s exec --job J --service J --pods 2 -- SCRIPT ARGS   (in each pod)

Exit 0, or 2 with one line on stderr for bad input (nothing written, nothing started).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ddlkit.environments.kubernetes import TF_PORT
from ddlkit.errors import ConfigError
from ddlkit.image import KIT_IMAGE, push_hint
from ddlkit.k8s.peers import DEFAULT_PEER_WAIT
from ddlkit.k8s.plan import KINDS, STRATEGIES

PEER_WAIT_HELP = "seconds each pod waits for peer pods still Pending (0: no wait)"
PEERS_PENDING = 3  # exec's exit code when peers stayed Pending past --peer-wait


def _script_args(args: Sequence[str]) -> list[str]:
    return list(args[1:]) if list(args[:1]) == ["--"] else list(args)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("manifest", help="write the Kubernetes objects of a training job (YAML)")
    m.add_argument("--strategy", choices=STRATEGIES, default="multi_worker")
    m.add_argument("-n", "--workers", type=int, default=2, help="training workers")
    m.add_argument("--ps", type=int, default=0, help="parameter servers (parameter_server)")
    m.add_argument(
        "--image",
        default=KIT_IMAGE,
        help=f"image with the kit and the script (default {KIT_IMAGE})",
    )
    m.add_argument(
        "--kind", choices=KINDS, default="job", help="job: core API; tfjob: Kubeflow; mpijob: MPI"
    )
    m.add_argument("--name", default="ddlkit", help="the Job's (and Service's) name")
    m.add_argument("--cpu", default="1", help="CPU per pod, e.g. 2 or 500m")
    m.add_argument("--memory", default="2Gi", help="memory per pod, e.g. 4Gi")
    m.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod")
    m.add_argument("--storage", default="1Gi", help="size of the checkpoint volume")
    m.add_argument("--storage-class", help="a StorageClass that offers ReadWriteMany volumes")
    m.add_argument("--retries", type=int, default=None, help="replacements of one pod")
    m.add_argument("--port", type=int, default=TF_PORT, help="TensorFlow's server port")
    m.add_argument("--collector", help="HOST:PORT of a metrics collector the pods reach")
    m.add_argument("--token-secret", help="the Secret whose key 'token' is its token")
    m.add_argument("--peer-wait", type=float, default=DEFAULT_PEER_WAIT, help=PEER_WAIT_HELP)
    m.add_argument("--image-pull-secret", help="the Secret that logs in to a private registry")
    m.add_argument(
        "--node-selector", action="append", default=[], metavar="KEY=VALUE",
        help="a node label every pod needs, e.g. nvidia.com/gpu.present=true (repeatable)",
    )  # fmt: skip
    m.add_argument("--shm", help="a memory-backed /dev/shm of this size, e.g. 1Gi")
    m.add_argument("-o", "--output", type=Path, help="a file (default: stdout)")
    m.add_argument("script", help="the training script's path inside the image")
    m.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: its arguments")

    e = sub.add_parser("exec", help="in a pod: set TF_CONFIG from JOB_COMPLETION_INDEX, run SCRIPT")
    e.add_argument("--job", required=True, help="the Job's name (pods are <job>-<index>)")
    e.add_argument("--service", help="the headless Service (default: the job's name)")
    e.add_argument("--pods", type=int, required=True, help="the Job's completions")
    e.add_argument("--ps", type=int, default=0, help="ParameterServerStrategy: K ps tasks")
    e.add_argument("--port", type=int, default=TF_PORT)
    e.add_argument("--run-dir", help="default: DDLKIT_RUN_DIR, else runs/k8s-<job>")
    e.add_argument("--peer-wait", type=float, default=DEFAULT_PEER_WAIT, help=PEER_WAIT_HELP)
    e.add_argument("script")
    e.add_argument("script_args", nargs=argparse.REMAINDER)


def _selector(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(
                f"--node-selector {pair!r} is not KEY=VALUE. Fix: e.g. "
                f"--node-selector nvidia.com/gpu.present=true."
            )
        out[key] = value
    return out


def _manifest(args: argparse.Namespace) -> int:
    from ddlkit.k8s.manifest import manifest

    built = manifest(
        args.script, strategy=args.strategy, workers=args.workers, image=args.image,
        ps=args.ps, args=_script_args(args.script_args), kind=args.kind, name=args.name,
        cpu=args.cpu, memory=args.memory, gpus=args.gpus, storage=args.storage,
        storage_class=args.storage_class, retries=args.retries, port=args.port,
        collector=args.collector, token_secret=args.token_secret, peer_wait=args.peer_wait,
        pull_secret=args.image_pull_secret, node_selector=_selector(args.node_selector),
        shm=args.shm,
    )  # fmt: skip
    if args.output is None:
        sys.stdout.write(built.to_yaml())
    else:
        print(built.write(args.output), file=sys.stderr)
    hint = push_hint(args.image)
    if hint is not None:
        print(f"note: {hint}", file=sys.stderr)
    return 0


def _exec(args: argparse.Namespace) -> int:
    from ddlkit.k8s.pod import peers_ready, run, worker_env
    from ddlkit.slurm import exec_argv

    service = args.service or args.job
    argv_list = exec_argv(args.script, _script_args(args.script_args))
    env = worker_env(
        dict(os.environ), args.job, service, args.pods, args.ps, args.port, args.run_dir,
    )  # fmt: skip
    if not peers_ready(env, args.peer_wait):
        return PEERS_PENDING
    return run(argv_list, env, args.ps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddlkit.k8s", description="Training jobs on Kubernetes."
    )
    add_parsers(parser.add_subparsers(dest="k8s_command", required=True))
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run a parsed ``manifest`` or ``exec`` (also ``ddlkit k8s ...``); 2 for bad input."""
    try:
        return _manifest(args) if args.k8s_command == "manifest" else _exec(args)
    except ConfigError as exc:
        print(f"ddlkit k8s: error: {exc}", file=sys.stderr)
        return 2
