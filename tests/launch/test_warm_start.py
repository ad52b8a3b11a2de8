"""Warm start (ddlkit.launch.warm, .template): workers forked from one process that imported
TensorFlow.

The pure rules first (who starts warm), then real templates and workers: each child must be
the process ``python script.py`` would have been, end as it would, and leave nothing.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness.procutil import alive, marked_pids, wait_until

from ddlkit.errors import ConfigError
from ddlkit.launch import warm, warm_pool
from ddlkit.launch.process import start_workers
from ddlkit.launch.spec import WorkerSpec, worker_env

PY = sys.executable
TF_SCRIPT = "import tensorflow as tf\n"


def _script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(TF_SCRIPT + textwrap.dedent(body))
    return path


# -- who starts warm (pure) ----------------------------------------------------------------
def test_only_this_pythons_scripts_that_import_tensorflow_are_eligible(tmp_path):
    tf = _script(tmp_path, "", "tf.py")
    (tmp_path / "plain.py").write_text("import numpy\n")
    (tmp_path / "keras.py").write_text("from tf_keras import layers\n")
    assert warm.eligible((PY, str(tf)), tmp_path)
    assert warm.eligible((PY, "keras.py", "--epochs", "1"), tmp_path)
    assert not warm.eligible((PY, "plain.py"), tmp_path)  # nothing to share
    assert not warm.eligible((PY, "-u", "tf.py"), tmp_path)  # interpreter options
    assert not warm.eligible((PY, "-c", "import tensorflow"), tmp_path)
    assert not warm.eligible(("/usr/bin/python3", str(tf)), tmp_path)  # another Python
    assert not warm.eligible((PY, "missing.py"), tmp_path)
    assert not warm.eligible((PY,), tmp_path)


def test_the_shared_environment_allows_only_variables_read_after_import():
    a = {"PATH": "/bin", "TF_CONFIG": "a", "DDLKIT_WORKER": "worker-0"}
    b = {"PATH": "/bin", "TF_CONFIG": "b", "DDLKIT_WORKER": "worker-1"}
    assert warm.shared_env([a, b]) == {"PATH": "/bin"}
    assert warm.shared_env([a, {**b, "OMP_NUM_THREADS": "1"}]) is None  # read at import
    assert warm.shared_env([a, {**b, "PATH": "/usr/bin"}]) is None
    assert warm.shared_env([a, {**b, "CUDA_VISIBLE_DEVICES": "1"}]) == {"PATH": "/bin"}


def test_a_job_starts_warm_with_its_eligible_local_workers(tmp_path):
    _script(tmp_path, "", "tf.py")
    env = {"PATH": "/bin"}
    item = ((PY, "tf.py"), tmp_path, env, True)
    assert warm.warm_groups([item, item], {}) == [0, 1]
    assert warm.warm_groups([item, ((PY, "-c", "x"), tmp_path, env, True), item], {}) == [0, 2]
    assert warm.warm_groups([item], {}) == [0]  # one worker: the next job reuses its template
    assert warm.warm_groups([item, (*item[:3], False)], {}) == [0]  # not the remote one
    assert warm.warm_groups([(*item[:3], False)], {}) == []
    assert warm.warm_groups([item, item], {warm.WARM_VAR: "0"}) == []
    other = ((PY, "tf.py"), tmp_path, {"PATH": "/usr/bin"}, True)
    assert warm.warm_groups([item, other], {}) == []


def test_the_idle_wait_is_checked_before_anything_starts(tmp_path, monkeypatch):
    assert warm.idle_seconds({}) == warm.IDLE_SECONDS
    assert warm.idle_seconds({warm.IDLE_VAR: "0"}) == 0.0
    assert warm.idle_seconds({warm.IDLE_VAR: " 2.5 "}) == 2.5
    for bad in ("ten", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=f"{warm.IDLE_VAR}=.*Fix: set it"):
            warm.idle_seconds({warm.IDLE_VAR: bad})
    monkeypatch.setenv(warm.IDLE_VAR, "soon")
    script = _script(tmp_path, "print('never')\n")
    specs = _specs(tmp_path, script)
    with pytest.raises(ConfigError, match="DDLKIT_WARM_IDLE='soon'"):
        _start(specs)
    assert not specs[0].log_path.exists()


def test_the_template_reserves_room_for_the_longest_command_line():
    ws = [
        warm.Worker((PY, "a.py"), "/", {}, "/l", None),
        warm.Worker((PY, "b.py", "x" * 300), "/", {}, "/l", None),
    ]
    argv = warm.template_argv(PY, ws)
    assert argv[:3] == [PY, "-m", "ddlkit.launch.template"]
    assert sum(len(a) + 1 for a in argv) >= 2048  # room for later jobs' workers too
    longer = [*ws, warm.Worker((PY, "c.py", "y" * 5000), "/", {}, "/l", None)]
    assert sum(len(a) + 1 for a in warm.template_argv(PY, longer)) >= len(PY) + 5000 + 8


# -- real templates and workers ------------------------------------------------------------
def _specs(tmp_path: Path, script: Path, n: int = 2, args=(), cpus=True) -> list[WorkerSpec]:
    run = tmp_path / "run"
    specs = []
    for i in range(n):
        cwd = run / f"w{i}"
        cwd.mkdir(parents=True, exist_ok=True)
        specs.append(
            WorkerSpec(
                name=f"worker-{i}",
                argv=(PY, str(script), *[a.format(i=i) for a in args]),
                env={"TF_CONFIG": json.dumps({"index": i})},
                cwd=cwd,
                log_path=run / f"worker-{i}.log",
                cpus=(i % os.cpu_count(),) if cpus else None,
            )
        )
    return specs


def _start(specs, **extra_env):
    run_dir = specs[0].log_path.parent
    envs = {s.name: {**worker_env(s, run_dir), **extra_env} for s in specs}
    return start_workers(specs, envs)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait(procs, timeout=120.0):
    assert wait_until(lambda: all(p.poll() is not None for p in procs), timeout)
    return [p.returncode for p in procs]


@pytest.mark.slow
def test_each_child_is_the_process_python_script_would_be(tmp_path):
    script = _script(
        tmp_path,
        """
        import atexit, json, os, sys, threading, time
        from pathlib import Path
        import numpy as np

        def late():  # a non-daemon thread: the interpreter waits for it before exiting
            time.sleep(0.3)
            Path("thread.txt").write_text("joined")

        threading.Thread(target=late).start()
        atexit.register(lambda: Path("atexit.txt").write_text("ran"))
        print(json.dumps({
            "argv": sys.argv, "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0],
            "worker": os.environ["DDLKIT_WORKER"], "tf_config": os.environ["TF_CONFIG"],
            "cmdline": Path("/proc/self/cmdline").read_bytes().decode().rstrip("\\0"),
            "cpus": sorted(os.sched_getaffinity(0)), "seed": int(np.random.randint(1 << 30)),
            "pgid": os.getpgid(0), "pid": os.getpid(),
        }))
        sys.exit(int(sys.argv[1]))
        """,
    )
    specs = _specs(tmp_path, script, args=["{i}", "mark-warm-test"])
    procs = _start(specs)
    assert _wait(procs) == [0, 1]
    reports = [json.loads(s.log_path.read_text().splitlines()[-1]) for s in specs]
    template = reports[0]["ppid"]
    assert template != os.getpid() and reports[1]["ppid"] == template  # forked by one template
    for i, (r, s) in enumerate(zip(reports, specs, strict=True)):
        assert r["argv"] == [str(script), str(i), "mark-warm-test"]
        assert r["cmdline"].split("\0") == [PY, str(script), str(i), "mark-warm-test"]
        assert r["cwd"] == str(s.cwd) and r["path0"] == str(tmp_path)
        assert r["worker"] == s.name and json.loads(r["tf_config"]) == {"index": i}
        assert r["cpus"] == [i % os.cpu_count()]
        assert r["pgid"] == r["pid"]  # its own process group, as a cold start's
        assert (s.cwd / "thread.txt").read_text() == "joined"
        assert (s.cwd / "atexit.txt").read_text() == "ran"
    assert reports[0]["seed"] != reports[1]["seed"]  # not the template's copied NumPy seed
    assert alive(template)  # it outlives the job, for the next one


@pytest.mark.slow
def test_a_template_serves_the_next_job_counts_its_cpu_and_ends_when_idle(tmp_path, monkeypatch):
    script = _script(tmp_path, "import os, sys\nprint(os.getppid())\nsys.exit(int(sys.argv[1]))\n")
    mark = {"DDLKIT_TEST_MARK": f"reuse-{os.getpid()}-{time.time()}"}  # a template of its own
    monkeypatch.setenv(warm.IDLE_VAR, "4")
    first = _start(_specs(tmp_path / "a", script, args=["{i}"]), **mark)
    assert _wait(first) == [0, 1]
    template = int(first[0].spec.log_path.read_text().split()[-1])
    assert template != os.getpid() and alive(template)
    # The next job: another run directory and collector token (PER_JOB), one worker.
    second = _start(_specs(tmp_path / "b", script, n=1, args=["3"]), **mark)
    assert _wait(second) == [3]
    assert int(second[0].spec.log_path.read_text().split()[-1]) == template  # no new import
    assert not (second[0].spec.log_path.parent / "warm-start.log").exists()
    # What it reaped is counted before it is reaped itself: three workers and its own import.
    handle = first[0].popen.template
    assert handle is second[0].popen.template and handle.popen.pid == template
    counted = handle.unreaped_cpu()
    assert counted > 1.0  # importing TensorFlow alone takes more
    total = _children_cpu() + warm_pool.forked_cpu_seconds()
    # Idle for DDLKIT_WARM_IDLE seconds, it ends; reaped here, its CPU moves to getrusage.
    assert wait_until(lambda: not alive(template), 30)
    assert handle.wait_reaped(10) and handle.unreaped_cpu() == 0.0
    moved = _children_cpu() + warm_pool.forked_cpu_seconds() - total
    # The same seconds, now counted by getrusage, plus the template's exit: well under the
    # import it had counted (counting it twice would move all of `counted`), on any CPU.
    assert -0.05 < moved < counted / 4, (moved, counted)
    third = _start(_specs(tmp_path / "c", script, n=1, args=["0"]), **mark)
    assert _wait(third) == [0]
    assert int(third[0].spec.log_path.read_text().split()[-1]) != template  # a new one


@pytest.mark.slow
def test_exit_statuses_and_tracebacks_are_the_interpreters(tmp_path):
    script = _script(
        tmp_path,
        """
        import sys
        how = sys.argv[1]
        print("live line", flush=False)  # PYTHONUNBUFFERED (set by the launcher): no flush needed
        if how == "0":
            raise ValueError("boom from the script")
        sys.exit("a message to stderr")
        """,
    )
    procs = _start(_specs(tmp_path, script, args=["{i}"]))
    assert _wait(procs) == [1, 1]
    raised = procs[0].spec.log_path.read_text()
    assert "ValueError: boom from the script" in raised and "live line" in raised
    assert str(script) in raised and "template.py" not in raised and "runpy" not in raised
    assert procs[1].spec.log_path.read_text().splitlines()[-1] == "a message to stderr"


@pytest.mark.slow
def test_killing_a_child_reaches_its_group_and_the_job_sees_the_signal(tmp_path):
    script = _script(
        tmp_path,
        """
        import subprocess, sys, time
        sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
        subprocess.Popen([*sleeper, "mark-{}".format(sys.argv[1])])
        print("up", flush=True)
        time.sleep(120)
        """,
    )
    tag = f"warm{os.getpid()}"
    procs = _start(_specs(tmp_path, script, args=[f"{tag}-{{i}}"]))
    assert wait_until(lambda: all("up" in p.spec.log_path.read_text() for p in procs), 120)
    assert wait_until(lambda: len(marked_pids(f"mark-{tag}-0")) == 1, 10)
    procs[0].signal(signal.SIGKILL)
    assert wait_until(lambda: procs[0].poll() is not None, 30)
    assert procs[0].returncode == -signal.SIGKILL
    assert wait_until(lambda: not marked_pids(f"mark-{tag}-0"), 10)  # the grandchild too
    assert procs[1].poll() is None
    procs[1].signal(signal.SIGTERM)
    assert _wait(procs[1:], 30) == [-signal.SIGTERM]
    assert not marked_pids(f"mark-{tag}-1")


LAUNCHER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_warm_start import _specs, _start
procs = _start(_specs(Path(sys.argv[1]), Path(sys.argv[1]) / "job.py"))
print(json.dumps([p.pid for p in procs]), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_killed_launcher_leaves_no_template_and_no_worker(tmp_path):
    _script(tmp_path, "import time\ntime.sleep(120)\n")
    launcher = subprocess.Popen(
        [PY, "-c", LAUNCHER, str(tmp_path), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        pids = json.loads(launcher.stdout.readline())
        template = int(Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert template != launcher.pid and all(alive(p) for p in (*pids, template))
    finally:
        launcher.kill()
        launcher.wait()
    assert wait_until(lambda: not any(alive(p) for p in (*pids, template)), 15)


@pytest.mark.slow
def test_turned_off_the_workers_are_the_launchers_own_children(tmp_path, monkeypatch):
    script = _script(tmp_path, "import os\nprint(os.getppid())\n")
    monkeypatch.setenv(warm.WARM_VAR, "0")
    procs = _start(_specs(tmp_path, script))
    assert _wait(procs) == [0, 0]
    assert [int(p.spec.log_path.read_text().split()[-1]) for p in procs] == [os.getpid()] * 2
    assert not (procs[0].spec.log_path.parent / "warm-start.log").exists()


@pytest.mark.slow
def test_a_template_that_cannot_start_is_one_error_and_nothing_runs(tmp_path, monkeypatch):
    script = _script(tmp_path, "print('never')\n")
    specs = _specs(tmp_path, script)
    # The template's own module cannot be imported: its Python finds another ddlkit first.
    fake = tmp_path / "fake" / "ddlkit"
    (fake / "launch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch" / "__init__.py").write_text("")
    (fake / "launch" / "template.py").write_text("raise SystemExit('no template here')\n")
    run_dir = specs[0].log_path.parent
    envs = {s.name: {**worker_env(s, run_dir), "PYTHONPATH": str(fake.parent)} for s in specs}
    t0 = time.monotonic()
    with pytest.raises(Exception, match="forked 0 of 2 workers.*no template here"):
        start_workers(specs, envs)
    assert time.monotonic() - t0 < 60
    assert "never" not in specs[0].log_path.read_text()
