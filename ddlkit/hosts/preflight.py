"""Preflight: can every host run a ddlkit job? One SSH round trip per host, in parallel.

For each host: reachable over SSH within a bounded time, the remote Python's version,
TensorFlow's and Horovod's versions (read from package metadata, nothing imported), which
of the asked-for ports are free, and whether the asked-for files (the training script) are
there at the same path. Then the hosts are compared: a host whose Python (major.minor),
TensorFlow or Horovod version differs from the first answering host's fails too (one job,
one set of versions). `check_hosts` returns a `Preflight` table (one `HostCheck` row per
host; shown as a table in a notebook); a failed row names the host, the problem and the
fix. `Preflight.raise_for_failures()` turns failures into one `HostError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import ENV_FIX, HostError, SshOptions, check_host, run_on

__all__ = ["HostCheck", "HostError", "Preflight", "check_hosts", "compare_versions", "probe_argv"]

VERSION_FIX = (
    "install the same versions on every host (one pinned requirements file, or the kit's venv "
    "made the same way there)"
)

PROBE = """\
import json, platform, socket, sys
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None

import os
args = sys.argv[1:]
cut = args.index("--")
free, busy = [], []
for port in map(int, args[:cut]):
    s = socket.socket()
    # as servers do: a port whose last connections linger in TIME_WAIT is free for them
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        free.append(port)
    except OSError:
        busy.append(port)
    finally:
        s.close()
print(json.dumps({
    "python": platform.python_version(),
    "tensorflow": version("tensorflow", "tensorflow-cpu", "tf-nightly"),
    "horovod": version("horovod"),
    "free_ports": free,
    "busy_ports": busy,
    "missing_files": [f for f in args[cut + 1:] if not os.path.isfile(f)],
}))
"""


@dataclass(frozen=True)
class HostCheck:
    """What one host answered; ``problem``/``fix`` are '' when it can run a job."""

    host: str
    reachable: bool
    python: str | None = None
    tensorflow: str | None = None
    horovod: str | None = None
    free_ports: tuple[int, ...] = ()
    busy_ports: tuple[int, ...] = ()
    missing_files: tuple[str, ...] = ()
    problem: str = ""
    fix: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problem


def probe_argv(python: str, ports: Sequence[int], files: Sequence[str] = ()) -> list[str]:
    """The remote command: the kit's Python runs `PROBE` with the ports and files to check."""
    return [python, "-c", PROBE, *(str(p) for p in ports), "--", *files]


def _row_from_answer(
    host: str, answer: dict, python: str, seconds: float, horovod: bool = False
) -> HostCheck:
    busy = tuple(answer["busy_ports"])
    missing = tuple(answer["missing_files"])
    problem = fix = ""
    if answer["tensorflow"] is None:
        problem = f"TensorFlow is not installed for {python} on {host}"
        fix = ENV_FIX
    elif horovod and answer["horovod"] is None:
        problem = f"Horovod is not installed for {python} on {host}"
        fix = "build it there too (scripts/build-horovod.sh), or " + ENV_FIX
    elif missing:
        problem = f"{', '.join(missing)} not found on {host}"
        fix = "put the script and its directory at the same path on every host (a shared "
        fix += "file system, or copy the checkout with rsync)"
    elif busy:
        problem = f"port(s) {', '.join(map(str, busy))} already in use on {host}"
        fix = f"stop what listens on them on {host}, or choose other ports"
    return HostCheck(
        host=host,
        reachable=True,
        python=answer["python"],
        tensorflow=answer["tensorflow"],
        horovod=answer["horovod"],
        free_ports=tuple(answer["free_ports"]),
        busy_ports=busy,
        missing_files=missing,
        problem=problem,
        fix=fix,
        seconds=seconds,
    )


def check_host_once(
    host: str,
    options: SshOptions,
    python: str,
    ports: Sequence[int],
    timeout: float,
    files: Sequence[str] = (),
    horovod: bool = False,
) -> HostCheck:
    """One host's row: run the probe over SSH, give up after ``timeout`` seconds."""
    start = time.monotonic()
    try:
        done = run_on(host, probe_argv(python, ports, files), options, timeout=timeout)
    except HostError as e:
        return HostCheck(
            host=host,
            reachable=e.reachable,
            problem=e.problem,
            fix=e.fix,
            seconds=time.monotonic() - start,
        )
    seconds = time.monotonic() - start
    try:
        return _row_from_answer(
            host, json.loads(done.stdout.strip().splitlines()[-1]), python, seconds, horovod
        )
    except (ValueError, KeyError, TypeError, IndexError):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return HostCheck(
            host=host,
            reachable=True,
            problem=f"the probe failed on {host} with {python} (exit {done.returncode}): {last}",
            fix=ENV_FIX,
            seconds=seconds,
        )


def compare_versions(rows: Sequence[HostCheck], horovod: bool = False) -> tuple[HostCheck, ...]:
    """``rows`` with a problem added to each host whose versions differ from the first's (pure).

    The reference is the first row that answered without a problem. Compared: Python's
    major.minor, TensorFlow's version, and Horovod's when ``horovod`` (the job needs it).
    Rows that already have a problem keep it.
    """
    rows = tuple(rows)
    ref = next((r for r in rows if r.ok and r.reachable and r.tensorflow), None)
    if ref is None:
        return rows

    def minor(version: str | None) -> str | None:
        return ".".join(version.split(".")[:2]) if version else version

    out = []
    for r in rows:
        if r is ref or not r.ok:
            out.append(r)
            continue
        differ = [
            f"{name} {mine} where {ref.host} has {theirs}"
            for name, mine, theirs, same in (
                ("Python", r.python, ref.python, minor(r.python) == minor(ref.python)),
                ("TensorFlow", r.tensorflow, ref.tensorflow, r.tensorflow == ref.tensorflow),
                ("Horovod", r.horovod, ref.horovod, not horovod or r.horovod == ref.horovod),
            )
            if not same
        ]
        if differ:
            problem = f"versions differ: {r.host} has {'; '.join(differ)}"
            r = dataclasses.replace(r, problem=problem, fix=VERSION_FIX)
        out.append(r)
    return tuple(out)


HEADERS = ("host", "ok", "python", "tensorflow", "horovod", "free ports", "problem", "fix")


@dataclass(frozen=True, repr=False)
class Preflight:
    """One `HostCheck` per host, in the order the hosts were given."""

    rows: tuple[HostCheck, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def failures(self) -> tuple[HostCheck, ...]:
        return tuple(r for r in self.rows if not r.ok)

    def __getitem__(self, host: str) -> HostCheck:
        for r in self.rows:
            if r.host == host:
                return r
        raise KeyError(host)

    def _cells(self) -> list[list[object]]:
        return [
            [
                r.host,
                "yes" if r.ok else "NO",
                r.python,
                r.tensorflow,
                r.horovod or ("missing" if r.reachable and r.python else None),
                " ".join(map(str, r.free_ports)) or None,
                r.problem or None,
                r.fix or None,
            ]
            for r in self.rows
        ]

    def __str__(self) -> str:
        return text_table(HEADERS, self._cells(), "preflight", rule=True)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html_table(HEADERS, self._cells(), "preflight")

    def raise_for_failures(self) -> None:
        """Raise one `HostError` naming every failed host, its problem and its fix."""
        bad = self.failures
        if bad:
            raise HostError(
                "; ".join(f"{r.problem} (fix: {r.fix})" for r in bad),
                hosts=[r.host for r in bad],
            )


def check_hosts(
    hosts: Sequence[str],
    options: SshOptions | None = None,
    *,
    python: str = sys.executable,
    ports: Sequence[int] = (),
    timeout: float | None = None,
    files: Sequence[str] = (),
    horovod: bool = False,
) -> Preflight:
    """Probe every host in parallel; each gets ``timeout`` s (default: connect time + 30 s).

    ``files`` must exist at those paths on every host (the training script); ``horovod``
    makes a host without Horovod a failure.
    """
    if not hosts:
        raise ConfigError("preflight: no hosts; give a list such as ['10.213.0.1', ...]")
    for h in hosts:
        check_host(h)
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"preflight: a host is listed twice in {list(hosts)}; list each once")
    for p in ports:
        if not 1 <= int(p) <= 65535:
            raise ConfigError(f"preflight: port {p}; use 1 to 65535")
    options = options or SshOptions()
    if options.identity is not None and not os.path.isfile(options.identity):
        raise ConfigError(
            f"preflight: no SSH key at {options.identity}; "
            f"fix: make one (ssh-keygen -t ed25519) or give the path of yours"
        )
    config = options.config_file
    if config not in (None, "/dev/null") and not os.path.isfile(config):
        raise ConfigError(
            f"preflight: no ssh config at {config}; fix: give the path of the file naming "
            f"the hosts (a user-mode demo cluster's: demo.ssh_config), or leave it out"
        )
    limit = options.connect_timeout + 30.0 if timeout is None else timeout
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        rows = pool.map(
            lambda h: check_host_once(h, options, python, ports, limit, files, horovod), hosts
        )
        return Preflight(compare_versions(tuple(rows), horovod))
