"""The notebook side of live metrics: a TCP server that receives workers' records.

::

    collector = Collector(run_dir)              # 127.0.0.1, a free port, a random token
    env = collector.env()                       # DDLKIT_COLLECTOR, DDLKIT_TOKEN for workers
    ...                                         # launch workers with env
    collector.records("worker-0"), collector.stats()
    collector.close()

One daemon thread accepts connections and one thread per connection reads
newline-delimited JSON records (protocol in :mod:`ddlkit.metrics.protocol`).
The first line must be a hello carrying the token (compared in constant
time); lines longer than ``max_line`` bytes or that are not valid records are
counted and skipped; nothing a worker sends can stop the server. Records are
kept in memory, in arrival order, with the time each one arrived.
"""

from __future__ import annotations

import dataclasses
import hmac
import html
import os
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ddlkit.errors import ConfigError, RecordError
from ddlkit.metrics import protocol
from ddlkit.metrics.records import Record

MAX_LINE = 65536
HELLO_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class WorkerStats:
    """Per-worker counters: records kept, last ``seq``, seqs missing, duplicates skipped."""

    records: int
    last_seq: int
    gaps: int
    duplicates: int
    connected: bool


@dataclasses.dataclass(frozen=True)
class CollectorStats:
    """What the collector has received so far."""

    address: str
    received: int
    malformed: int
    refused: int
    connections: int
    workers: Mapping[str, WorkerStats]

    @property
    def gaps(self) -> int:
        """Records missing in all workers' ``seq`` sequences."""
        return sum(w.gaps for w in self.workers.values())

    def _repr_html_(self) -> str:
        head = (
            f"<p>collector {html.escape(self.address)}: {self.received} records, "
            f"{self.malformed} malformed lines skipped, {self.refused} connections refused, "
            f"{self.connections} accepted</p>"
        )
        rows = "".join(
            f"<tr><td>{html.escape(name)}</td><td>{w.records}</td><td>{w.last_seq}</td>"
            f"<td>{w.gaps}</td><td>{w.duplicates}</td>"
            f"<td>{'yes' if w.connected else 'no'}</td></tr>"
            for name, w in sorted(self.workers.items())
        )
        return (
            head + "<table><tr><th>worker</th><th>records</th><th>last seq</th><th>gaps</th>"
            "<th>duplicates</th><th>connected</th></tr>" + rows + "</table>"
        )


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = True

    def __init__(self, address: tuple[str, int], collector: Collector, family: int) -> None:
        self.address_family = family
        self.collector = collector
        super().__init__(address, _Handler)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.collector._serve(self.request, self.rfile, self.wfile)


class Collector:
    """Receives metric records from workers; see the module docstring.

    ``host`` defaults to loopback. Any other address is reachable from other
    machines, so it needs an explicit ``token`` (and ``ConfigError`` says so).
    On loopback a random token is made when none is given; a token is always
    required from workers.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        max_line: int = MAX_LINE,
    ) -> None:
        if not protocol.is_loopback(host) and not token:
            raise ConfigError(
                f"the collector would listen on {host!r}, which other machines can reach, "
                f"without a token. Fix: pass token=secrets.token_hex(16) (and give workers the "
                f"same DDLKIT_TOKEN), or keep the default host='127.0.0.1'."
            )
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            raise ConfigError(
                f"the collector token must be a string of at least 8 characters, got "
                f"{token!r}. Fix: pass token=secrets.token_hex(16)."
            )
        if max_line < 1024:
            raise ConfigError(f"max_line must be >= 1024 bytes, got {max_line}.")
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.token = token or secrets.token_hex(16)
        self.max_line = max_line
        self._token_bytes = self.token.encode()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._arrivals: list[tuple[Record, float]] = []
        self._by_worker: dict[str, list[Record]] = {}
        self._last_seq: dict[str, int] = {}
        self._gaps: dict[str, int] = {}
        self._duplicates: dict[str, int] = {}
        self._connected: dict[str, int] = {}
        self._malformed = 0
        self._refused = 0
        self._connections = 0
        self._open: set[socket.socket] = set()
        self._closed = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = _Server((host, port), self, family)
        except OSError as exc:
            raise ConfigError(
                f"the collector cannot listen on {protocol.format_address(host, port)}: {exc}. "
                f"Fix: pass port=0 to pick a free port, or stop what uses port {port}."
            ) from exc
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"ddlkit-collector-{self.port}",
            daemon=True,
        )
        self._thread.start()

    # -- configuration for workers ------------------------------------------------
    @property
    def address(self) -> str:
        """``"host:port"`` workers connect to."""
        return protocol.format_address(self.host, self.port)

    def env(self, advertise_host: str | None = None) -> dict[str, str]:
        """Environment variables that point a worker's reporter at this collector.

        ``advertise_host``: the address workers on other machines should use
        when the collector listens on a wildcard address such as ``0.0.0.0``.
        """
        host = advertise_host or self.host
        env = {
            protocol.COLLECTOR_VAR: protocol.format_address(host, self.port),
            protocol.TOKEN_VAR: self.token,
        }
        if self.run_dir is not None:
            env[protocol.RUN_DIR_VAR] = str(self.run_dir)
        return env

    # -- reading ----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Number of records kept so far: poll it to notice new records cheaply."""
        return len(self._arrivals)

    def wait_for(self, version: int, timeout: float) -> int:
        """Block until more than ``version`` records are kept or ``timeout`` s pass."""
        end = time.monotonic() + timeout
        with self._changed:
            while len(self._arrivals) <= version:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return len(self._arrivals)

    def records(self, worker: str | None = None) -> list[Record]:
        """Kept records in arrival order (one worker's: in ``seq`` order)."""
        with self._lock:
            if worker is not None:
                return list(self._by_worker.get(worker, ()))
            return [record for record, _ in self._arrivals]

    def records_since(self, version: int) -> tuple[list[Record], int]:
        """Records kept after the first ``version`` ones, and the new version."""
        with self._lock:
            return [r for r, _ in self._arrivals[version:]], len(self._arrivals)

    def arrivals(self) -> list[tuple[Record, float]]:
        """``(record, time.time() when it arrived)`` pairs, in arrival order."""
        with self._lock:
            return list(self._arrivals)

    def workers(self) -> list[str]:
        with self._lock:
            return sorted(self._by_worker)

    def latest(self, worker: str) -> Record | None:
        with self._lock:
            kept = self._by_worker.get(worker)
            return kept[-1] if kept else None

    def stats(self) -> CollectorStats:
        with self._lock:
            workers = {
                name: WorkerStats(
                    records=len(kept),
                    last_seq=self._last_seq[name],
                    gaps=self._gaps[name],
                    duplicates=self._duplicates[name],
                    connected=self._connected.get(name, 0) > 0,
                )
                for name, kept in self._by_worker.items()
            }
            return CollectorStats(
                address=self.address,
                received=len(self._arrivals),
                malformed=self._malformed,
                refused=self._refused,
                connections=self._connections,
                workers=workers,
            )

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop accepting, drop open connections, free the port. Records stay readable."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        with self._lock:
            open_sockets = list(self._open)
        for sock in open_sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "listening"
        return f"Collector({self.address}, {state}, {self.version} records)"

    # -- one connection (runs in its own thread) ------------------------------------------
    def _serve(self, sock: socket.socket, rfile, wfile) -> None:
        with self._lock:
            if self._closed:
                return
            self._open.add(sock)
        worker = None
        try:
            sock.settimeout(HELLO_TIMEOUT)
            worker = self._accept_hello(rfile, wfile)
            if worker is None:
                return
            sock.settimeout(None)
            self._read_records(worker, rfile)
        except OSError:
            pass  # the worker went away or the collector is closing
        finally:
            with self._lock:
                self._open.discard(sock)
                if worker is not None:
                    self._connected[worker] -= 1

    def _accept_hello(self, rfile, wfile) -> str | None:
        line = rfile.readline(protocol.MAX_HELLO)
        try:
            worker, token = protocol.parse_hello(line)
        except RecordError as exc:
            self._refuse(wfile, f"bad hello: {exc}")
            return None
        if not hmac.compare_digest(token.encode(), self._token_bytes):
            self._refuse(wfile, "wrong token")
            return None
        with self._lock:
            self._connections += 1
            self._connected[worker] = self._connected.get(worker, 0) + 1
        wfile.write(protocol.reply_line())
        return worker

    def _refuse(self, wfile, reason: str) -> None:
        with self._lock:
            self._refused += 1
        try:
            wfile.write(protocol.reply_line(reason))
        except OSError:
            pass

    def _read_records(self, worker: str, rfile) -> None:
        limit = self.max_line
        while True:
            line = rfile.readline(limit + 1)
            if not line:
                return
            if not line.endswith(b"\n"):
                self._count_malformed()
                if len(line) <= limit:
                    return  # the connection ended in the middle of a line
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = rfile.readline(limit + 1)
                continue
            try:
                record = Record.from_json(line)
            except RecordError:
                self._count_malformed()
                continue
            if record.worker != worker:
                self._count_malformed()
                continue
            self._keep(record, time.time())

    def _count_malformed(self) -> None:
        with self._lock:
            self._malformed += 1

    def _keep(self, record: Record, arrived: float) -> None:
        name = record.worker
        with self._changed:
            last = self._last_seq.get(name, -1)
            if name not in self._by_worker:
                self._by_worker[name] = []
                self._gaps[name] = self._duplicates[name] = 0
            if record.seq <= last:
                self._duplicates[name] += 1  # resent after a reconnect
                return
            self._gaps[name] += record.seq - last - 1
            self._last_seq[name] = record.seq
            self._by_worker[name].append(record)
            self._arrivals.append((record, arrived))
            self._changed.notify_all()
