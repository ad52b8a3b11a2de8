"""The collector with real sockets, threads and worker processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ddlkit.errors import ConfigError
from ddlkit.metrics import Collector, Record, Reporter, load_run, protocol

WORKER_SCRIPT = """
import dataclasses, json, sys
from ddlkit.metrics import Reporter

n = int(sys.argv[1])
reporter = Reporter()  # everything from the environment, as a launched worker
reporter.event("train_begin", epochs=n // 10, steps=10)
for i in range(n):
    reporter.step(step=i + 1, epoch=i // 10, loss=1.0 / (i + 1), accuracy=i / n, batch_size=32)
    if i % 10 == 9:
        reporter.epoch(epoch=i // 10, step=i + 1, loss=1.0 / (i + 1), metrics={"val_loss": 0.5})
reporter.event("train_end", steps=n)
print(json.dumps(dataclasses.asdict(reporter.close(timeout=5.0))))
"""


def _wait(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _record(worker: str, seq: int) -> bytes:
    record = Record(
        kind="step", worker=worker, step=seq + 1, epoch=0, wall_time=time.time(), seq=seq, loss=0.1
    )
    return (record.to_json() + "\n").encode()


def _connect(collector: Collector, worker: str, token: str) -> tuple[socket.socket, dict]:
    sock = socket.create_connection((collector.host, collector.port), timeout=5)
    sock.sendall(protocol.hello_line(worker, token))
    reply = sock.makefile("rb").readline()
    return sock, json.loads(reply)


def test_two_worker_processes_arrive_whole_and_match_their_files(tmp_path):
    n = 200
    with Collector(tmp_path) as collector:
        procs = []
        for rank in range(2):
            env = {**os.environ, **collector.env(), "DDLKIT_WORKER": f"worker-{rank}"}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER_SCRIPT, str(n)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=60) for p in procs]
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err
            stats = json.loads(out.strip().splitlines()[-1])
            assert stats["sent"] == stats["written"] == n + n // 10 + 2
            assert stats["dropped"] == 0
        per_worker = n + n // 10 + 2
        assert _wait(lambda: collector.version >= 2 * per_worker)
        on_disk = load_run(tmp_path)
        stats = collector.stats()
        assert stats.received == 2 * per_worker
        assert stats.malformed == 0 and stats.refused == 0 and stats.gaps == 0
        assert collector.workers() == ["worker-0", "worker-1"]
        for worker in ("worker-0", "worker-1"):
            live = collector.records(worker)
            assert [r.seq for r in live] == list(range(per_worker))
            assert live == [r for r in on_disk if r.worker == worker]
            assert stats.workers[worker].last_seq == per_worker - 1
            assert collector.latest(worker).name == "train_end"
            steps = [r for r in live if r.kind == "step"]
            assert [r.loss for r in steps] == [1.0 / (i + 1) for i in range(n)]
            assert all(r.examples_per_sec > 0 for r in steps)


def test_wrong_or_missing_token_is_refused_and_nothing_is_kept(tmp_path):
    with Collector(tmp_path) as collector:
        sock, reply = _connect(collector, "worker-0", "not-the-token")
        assert reply == {"ok": False, "error": "wrong token"}
        try:
            sock.sendall(_record("worker-0", 0))
        except OSError:
            pass  # the collector already closed the connection
        sock.close()

        sock = socket.create_connection((collector.host, collector.port), timeout=5)
        sock.sendall(_record("worker-0", 0))  # a record instead of a hello
        assert b"bad hello" in sock.makefile("rb").readline()
        sock.close()

        with pytest.warns(RuntimeWarning, match="refused worker 'worker-2'.*wrong token"):
            reporter = Reporter("worker-2", tmp_path, collector=collector.address, token="x" * 32)
            reporter.step(step=1, loss=0.3)
            assert _wait(lambda: reporter.stats().refused is not None)
            final = reporter.close()
        assert final.refused == "wrong token" and final.sent == 0
        assert len(load_run(tmp_path)) == 1  # still in the worker's file

        assert _wait(lambda: collector.stats().refused == 3)
        time.sleep(0.2)
        assert collector.version == 0 and collector.records() == []
        # the right token still works afterwards
        sock, reply = _connect(collector, "worker-0", collector.token)
        assert reply == {"ok": True}
        sock.sendall(_record("worker-0", 0))
        assert collector.wait_for(0, 5) == 1
        sock.close()


def test_malformed_and_overlong_lines_are_counted_and_skipped(tmp_path):
    with Collector(tmp_path, max_line=2048) as collector:
        sock, reply = _connect(collector, "worker-0", collector.token)
        assert reply["ok"]
        sock.sendall(_record("worker-0", 0))
        sock.sendall(b"this is not json\n")
        sock.sendall(b'{"v": 1, "kind": "step"}\n')  # JSON but not a record
        sock.sendall(b"x" * 10_000 + b"\n")  # longer than max_line
        sock.sendall(_record("worker-9", 0))  # claims another worker's name
        sock.sendall(b"\xff\xfe\n")
        sock.sendall(_record("worker-0", 1))
        assert _wait(lambda: collector.version == 2)
        assert _wait(lambda: collector.stats().malformed == 5)
        sock.sendall(b'{"unterminated": ')  # connection ends mid-line
        sock.close()
        assert _wait(lambda: collector.stats().malformed == 6)
        assert [r.seq for r in collector.records("worker-0")] == [0, 1]
        assert collector.workers() == ["worker-0"]
        # the server is still serving new connections
        with Reporter(
            "worker-1", tmp_path, collector=collector.address, token=collector.token
        ) as reporter:
            reporter.step(step=1, loss=0.2)
        assert _wait(lambda: len(collector.records("worker-1")) == 1)


def test_gaps_and_duplicates_are_detected_from_seq(tmp_path):
    with Collector(tmp_path) as collector:
        sock, _ = _connect(collector, "worker-0", collector.token)
        for seq in (0, 1, 4, 4, 2, 5):
            sock.sendall(_record("worker-0", seq))
        assert _wait(
            lambda: (
                collector.stats().workers.get("worker-0") is not None
                and collector.stats().workers["worker-0"].duplicates == 2
            )
        )
        stats = collector.stats().workers["worker-0"]
        assert stats.gaps == 2 and stats.last_seq == 5 and stats.records == 4
        assert stats.connected
        sock.close()
        assert _wait(lambda: not collector.stats().workers["worker-0"].connected)
        assert "<table>" in collector.stats()._repr_html_()


def test_non_loopback_address_needs_an_explicit_token():
    with pytest.raises(ConfigError, match="without a token.*Fix: pass token="):
        Collector(host="0.0.0.0")
    with pytest.raises(ConfigError, match="at least 8 characters"):
        Collector(token="short")
    token = "a-long-enough-token"
    with Collector(host="0.0.0.0", token=token) as collector:
        assert collector.token == token
        env = collector.env(advertise_host="10.213.0.1")
        assert env == {"DDLKIT_COLLECTOR": f"10.213.0.1:{collector.port}", "DDLKIT_TOKEN": token}
        sock, reply = _connect(collector, "worker-0", token)
        assert reply == {"ok": True}
        sock.close()


def test_loopback_gets_a_random_token_and_env_for_workers(tmp_path):
    with Collector(tmp_path) as a, Collector() as b:
        assert len(a.token) >= 32 and a.token != b.token
        assert a.address == f"127.0.0.1:{a.port}" and a.port != 0
        assert a.env() == {
            "DDLKIT_COLLECTOR": a.address,
            "DDLKIT_TOKEN": a.token,
            "DDLKIT_RUN_DIR": str(tmp_path),
        }
        assert "DDLKIT_RUN_DIR" not in b.env()


def test_close_frees_the_port_and_keeps_the_records(tmp_path):
    collector = Collector(tmp_path)
    port = collector.port
    reporter = Reporter("worker-0", tmp_path, collector=collector.address, token=collector.token)
    reporter.step(step=1, loss=0.5)
    assert reporter.flush(5.0)
    assert _wait(lambda: collector.version == 1)
    start = time.monotonic()
    collector.close()
    assert time.monotonic() - start < 3.0
    assert collector.closed and collector.records()[0].loss == 0.5
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with Collector(tmp_path, port=port, token=collector.token) as again:  # same port again
        assert again.port == port
        reporter.step(step=2, loss=0.25)  # the reporter reconnects to the new collector
        assert again.wait_for(0, 10) == 1
        assert again.records()[0].seq == 1
    reporter.close()


def test_busy_port_names_the_fix():
    with Collector() as collector, pytest.raises(ConfigError, match="port=0"):
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            Collector(port=holder.getsockname()[1])
        finally:
            holder.close()
    assert collector.closed
