"""The Ray driver of one run: ``python -m ddlkit.ray driver ... -- SCRIPT ARGS``.

The launcher starts it as the run's one process (``ray-driver``), so the Run API (status,
wait, stop, kill, tail) is the same as for local jobs. It connects to the cluster
(``ray.init(address)``), reserves one placement group of N one-CPU bundles (all at once or
not at all: `ddlkit.environments.ray`), starts one actor on each bundle, asks each for its
node's address and a free port, gives each worker its TF_CONFIG (MultiWorkerMirroredStrategy)
and runs the unchanged script in each actor as a subprocess (``ddlkit.spark.tasks.run_worker``,
the same as a Spark task: its log in the run directory, killed with its actor). The first
failure (a script that exits non-zero, an actor or node that dies) ends the job: every actor is
killed and the placement group removed, then the driver exits 1 naming the worker and where it
ran. The same happens in ``finally`` on success and on SIGTERM, and Ray itself removes a job's
actors and placement groups when its driver dies (they fate-share with their creator).
With ``--strategy horovod`` the actors and their Gloo rendezvous are Horovod's own
``horovod.ray.RayExecutor`` (:func:`run_horovod`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

from ddlkit import backend, contract, strategies
from ddlkit.launch.remote import FORWARDED
from ddlkit.spark.tasks import TaskFailed, TaskPlan, horovod_task, report_lines, run_worker

EXIT_FAILED = 1
PLACE_TIMEOUT = 60  # seconds for Ray to reserve every bundle (the launcher checked the CPUs)
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class RayWorker:
    """One actor per bundle: where it runs, then the script as one worker (no retries)."""

    def where(self) -> dict:
        import ray

        from ddlkit.cluster.ports import free_ports

        host = ray.util.get_node_ip_address()
        return {
            "host": host,
            "port": free_ports(1, host)[0],  # free now; TensorFlow's server binds it soon after
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def run(self, plan: TaskPlan, name: str, env: dict, where: str) -> dict:
        return run_worker(plan, name, env, where)

    def ping(self) -> bool:
        return True


def worker_names(strategy: str, workers: int) -> list[str]:
    if strategies.get(strategy).needs_horovodrun:
        return [contract.rank_name(i) for i in range(workers)]
    return [contract.task_name("worker", i) for i in range(workers)]


def mwms_envs(places: list[dict], run_dir: str) -> list[dict[str, str]]:
    """Each worker's TF_CONFIG and contract variables, from where its actor runs (pure)."""
    from ddlkit.environments.ray import Ray

    addresses = [f"{p['host']}:{p['port']}" for p in places]
    return [Ray(i, addresses).task_env(run_dir) for i in range(len(places))]


def describe_failure(name: str, place: dict, error: BaseException) -> str:
    """What failed, in one paragraph: the worker's own report, or the actor's death."""
    import ray.exceptions

    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause if isinstance(error.cause, TaskFailed) else None
        if cause is not None:
            return f"Ray job failed: {cause}"
        return f"Ray job failed: {name} raised {error}"
    if isinstance(error, ray.exceptions.RayActorError):
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"Ray job failed: {name} (Ray actor pid {place.get('pid')} on node {place['host']}) "
            f"died: its process or its node was killed or lost ({first})"
        )
    return f"Ray job failed: {name}: {type(error).__name__}: {error}"


def run(args: argparse.Namespace) -> int:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    run_dir = os.environ[contract.RUN_DIR_VAR]
    forward = {*contract.ENV_VARS, *backend.keras_env(), *FORWARDED, *args.forward}
    plan = TaskPlan(
        python=args.python,
        script=args.script,
        args=tuple(args.script_args),
        run_dir=run_dir,
        env={k: v for k, v in os.environ.items() if k in forward and k != contract.WORKER_VAR},
        threads=1,
    )
    names = worker_names(args.strategy, args.workers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` on Run.stop()
    ray.init(address=args.address, log_to_driver=False, namespace=f"ddlkit-{args.app_name}")
    if strategies.get(args.strategy).needs_horovodrun:
        return run_horovod(args, plan, names)
    started = time.monotonic()
    pg = None
    actors: list = []
    try:
        pg = placement_group(
            [{"CPU": 1}] * args.workers, strategy=args.placement, name=f"ddlkit-{args.app_name}"
        )
        try:
            ray.get(pg.ready(), timeout=args.place_timeout)
        except ray.exceptions.GetTimeoutError:
            print(
                f"Ray job failed: the placement group of {args.workers} x 1 CPU "
                f"({args.placement}) was not placed within {args.place_timeout} s; the cluster "
                f"has {ray.available_resources().get('CPU', 0):g} CPUs free. Fix: free CPUs, "
                f"add nodes, or ask for fewer workers.",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_FAILED
        actor_cls = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=2)(RayWorker)
        actors = [
            actor_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i
                ),
                name=f"{args.app_name}-{name}",
            ).remote()
            for i, name in enumerate(names)
        ]
        places = ray.get([a.where.remote() for a in actors], timeout=120)
        print(
            f"driver: {args.strategy} x{args.workers} on Ray {args.address} "
            f"(placement group {args.placement}, placed in {time.monotonic() - started:.1f} s; "
            f"nodes {', '.join(p['host'] for p in places)})",
            flush=True,
        )
        envs = mwms_envs(places, run_dir)
        refs = {}
        for i, (actor, name) in enumerate(zip(actors, names, strict=True)):
            group = pg.id.hex()[:8]
            where = f"Ray actor {i} of placement group {group}, on node {places[i]['host']}"
            refs[actor.run.remote(plan, name, envs[i], where)] = i
        reports: list[dict] = []
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            i = refs[done[0]]
            try:
                reports.append(ray.get(done[0]))
            except (ray.exceptions.RayError, TaskFailed) as exc:
                print(first_failure(actors, names, places, i, exc), file=sys.stderr, flush=True)
                return EXIT_FAILED
        print("\n".join(report_lines(sorted(reports, key=lambda r: r["worker"]))), flush=True)
        return 0
    finally:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001  (already dead)
                pass
        if pg is not None:
            remove_placement_group(pg)
        ray.shutdown()


def run_horovod(args: argparse.Namespace, plan: TaskPlan, names: list[str]) -> int:
    """Horovod's own Ray launcher, ``horovod.ray.RayExecutor``: it reserves a placement group
    (PACK: ``PGStrategy``; one rank per node with STRICT_SPREAD: ``ColocatedStrategy``), starts
    one actor per rank, runs Gloo's rendezvous in this driver and sets each actor's
    ``HOROVOD_*`` variables; each actor then runs the script (``ddlkit.spark.tasks.horovod_task``,
    as a ``horovod.spark.run`` task does) and ``hvd.init()`` joins the ranks."""
    import ray
    from horovod.ray import RayExecutor

    loopback = args.address.startswith("127.")
    settings = RayExecutor.create_settings(
        timeout_s=args.place_timeout,
        placement_group_timeout_s=args.place_timeout,
        nics={"lo"} if loopback else None,  # every node on this machine's loopback
    )
    if args.placement == "STRICT_SPREAD":
        executor = RayExecutor(settings, num_hosts=args.workers, num_workers_per_host=1,
                               cpus_per_worker=1, use_gpu=False)  # fmt: skip
    else:
        executor = RayExecutor(settings, num_workers=args.workers, cpus_per_worker=1,
                               use_gpu=False)  # fmt: skip
    started = time.monotonic()
    try:
        executor.start()
        print(
            f"driver: horovod x{args.workers} on Ray {args.address} (horovod.ray.RayExecutor, "
            f"placed in {time.monotonic() - started:.1f} s)",
            flush=True,
        )
        refs = executor.run_remote(horovod_task, args=[plan])
        index = {ref: i for i, ref in enumerate(refs)}
        reports, pending = [], list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                reports.append(ray.get(done[0]))
            except (ray.exceptions.RayError, TaskFailed) as exc:
                i = index[done[0]]
                print(describe_failure(names[i], {"host": "?"}, exc), file=sys.stderr, flush=True)
                return EXIT_FAILED
        print("\n".join(report_lines(sorted(reports, key=lambda r: r["worker"]))), flush=True)
        return 0
    finally:
        executor.shutdown()  # removes its placement group, which kills the actors in it
        ray.shutdown()


def first_failure(actors, names, places, i, exc) -> str:
    """The failure to report: a dead actor (its node or process lost) before a worker whose
    all-reduce failed because that peer went away; else the first error."""
    import ray

    for j, actor in enumerate(actors):
        if j == i:
            continue
        try:
            ray.get(actor.ping.remote(), timeout=3)
        except ray.exceptions.RayActorError as dead:
            return describe_failure(names[j], places[j], dead)
        except ray.exceptions.GetTimeoutError:
            return (
                f"Ray job failed: {names[j]} (Ray actor pid {places[j].get('pid')} on node "
                f"{places[j]['host']}) does not answer: its node is lost or hung; "
                f"{names[i]} failed after it:\n{describe_failure(names[i], places[i], exc)}"
            )
    return describe_failure(names[i], places[i], exc)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddlkit.ray driver")
    p.add_argument("--address", required=True)
    p.add_argument("--strategy", choices=("multi_worker", "horovod"), required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--placement", choices=STRATEGIES, default="PACK")
    p.add_argument("--place-timeout", type=int, default=PLACE_TIMEOUT)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--app-name", default="run")
    p.add_argument("--forward", action="append", default=[], help="a variable for the workers")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.script_args[:1] == ["--"]:
        args.script_args = args.script_args[1:]
    return run(args)


def check_main(argv: Sequence[str]) -> int:
    """``python -m ddlkit.ray check ADDRESS``: the cluster as this Ray sees it, as JSON on
    stdout (``{"ok": ...}``), or what stopped ``ray.init`` (``{"error": ..., "kind": ...}``).
    Starts nothing on the cluster: a driver connects, reads and disconnects."""
    address = argv[0]
    try:
        import ray

        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001  (reported to the launcher as data)
        text = str(exc)
        kind = "version" if "Version mismatch" in text else "connect"
        print(json.dumps({"error": text[-1500:], "kind": kind}))
        return 0
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        print(
            json.dumps(
                {
                    "ok": True,
                    "ray": ray.__version__,
                    "cpus": ray.cluster_resources().get("CPU", 0),
                    "free_cpus": ray.available_resources().get("CPU", 0),
                    "nodes": [
                        {"ip": n["NodeManagerAddress"], "cpus": n["Resources"].get("CPU", 0)}
                        for n in nodes
                    ],
                }
            )
        )
    finally:
        ray.shutdown()
    return 0
