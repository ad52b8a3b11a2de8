"""Background sender: ships encoded record lines to the collector without ever
blocking or failing the training loop.

The training thread only appends to a bounded in-memory queue. One daemon
thread connects (hello + token), sends in batches (lingering 10 ms to gather
them), and on any failure closes the socket and retries with exponential
backoff (50 ms doubling to 1 s), so a
collector that starts late or restarts still gets later records. When the
queue is full the oldest queued line is dropped (it is still in the worker's
JSONL file) and counted. A collector that refuses the token is not retried:
the sender warns once and stays file-only.
"""

from __future__ import annotations

import collections
import math
import select
import socket
import threading
import time
import warnings

from ddlkit.metrics import protocol

CONNECT_TIMEOUT = 2.0
SEND_TIMEOUT = 5.0
BACKOFF_START = 0.05
BACKOFF_MAX = 1.0
BATCH = 512
LINGER = 0.01  # wait this long after the first queued line, to send lines in batches


class Sender:
    """Sends lines to ``address`` from a daemon thread; see the module docstring."""

    def __init__(self, address: str, worker: str, token: str, capacity: int = 10000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.address = address
        self.host, self.port = protocol.parse_address(address)
        self.worker = worker
        self._token = token
        self._capacity = capacity
        self._pending: collections.deque[bytes] = collections.deque()
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        self._inflight = 0
        self._deadline: float | None = None
        self._next_attempt = 0.0
        self._backoff = BACKOFF_START
        self._failed_since_success = False
        self.sent = 0
        self.dropped = 0
        self.connects = 0
        self.refused: str | None = None
        self.last_error: str | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"ddlkit-metrics-sender-{worker}", daemon=True
        )
        self._thread.start()

    # -- training-thread side -------------------------------------------------
    def put(self, line: bytes) -> None:
        """Queue one encoded line; never blocks on the network."""
        with self._cond:
            if self.refused is not None or self._deadline is not None:
                self.dropped += 1
                return
            if len(self._pending) >= self._capacity:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(line)
            self._cond.notify_all()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def queued(self) -> int:
        return len(self._pending) + self._inflight

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until every queued line is sent.

        Returns early (False) when the collector cannot be reached right now;
        the sender keeps retrying in the background.
        """
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._inflight:
                left = end - time.monotonic()
                if left <= 0 or self.refused is not None or self._failed_since_success:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float) -> None:
        """Send what is queued for at most ``timeout`` s, then stop the thread."""
        with self._cond:
            if self._deadline is None:
                self._deadline = time.monotonic() + max(0.0, timeout)
            self._cond.notify_all()
        self._thread.join(timeout + CONNECT_TIMEOUT + 1.0)

    # -- sender thread ----------------------------------------------------------
    def _wait_for_work(self) -> bool:
        """Block until there is something to send now; False when it is time to stop."""
        with self._cond:
            while True:
                now = time.monotonic()
                closing = self._deadline is not None
                if closing and (
                    not self._pending or self.refused is not None or now >= self._deadline
                ):
                    return False
                wait = math.inf
                if self._pending and self.refused is None:
                    wait = 0.0 if self._sock is not None else self._next_attempt - now
                    if wait <= 0:
                        return True
                if closing:
                    wait = min(wait, self._deadline - now)
                self._cond.wait(None if wait == math.inf else max(wait, 0.0))

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                if self._sock is None and not self._connect():
                    continue
                if self._deadline is None and len(self._pending) < BATCH:
                    time.sleep(LINGER)  # fewer, larger sends: less work beside training
                with self._cond:
                    count = min(len(self._pending), BATCH)
                    batch = [self._pending.popleft() for _ in range(count)]
                    self._inflight = count
                self._send(batch)
        finally:
            self._disconnect()
            with self._cond:
                self.dropped += len(self._pending)
                self._pending.clear()
                self._cond.notify_all()

    def _send(self, batch: list[bytes]) -> None:
        sock = self._sock
        try:
            assert sock is not None
            # A collector that went away makes the socket readable (EOF): notice
            # that before writing into a dead connection.
            readable, _, _ = select.select([sock], [], [], 0)
            if readable and not sock.recv(4096):
                raise ConnectionResetError("the collector closed the connection")
            sock.sendall(b"".join(batch))
        except OSError as exc:
            self._fail(f"send failed: {exc}")
            with self._cond:
                room = self._capacity - len(self._pending)
                keep = batch[-room:] if room > 0 else []
                self.dropped += len(batch) - len(keep)
                self._pending.extendleft(reversed(keep))
                self._inflight = 0
                self._cond.notify_all()
            return
        with self._cond:
            self.sent += len(batch)
            self._inflight = 0
            self._cond.notify_all()

    def _connect(self) -> bool:
        timeout = CONNECT_TIMEOUT
        if self._deadline is not None:
            timeout = max(0.05, min(timeout, self._deadline - time.monotonic()))
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            self._fail(f"cannot connect to {self.address}: {exc}")
            return False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(protocol.hello_line(self.worker, self._token))
            answer = _read_line(sock, protocol.MAX_HELLO)
        except OSError as exc:
            sock.close()
            self._fail(f"no answer from {self.address}: {exc}")
            return False
        refusal = protocol.parse_reply(answer)
        if refusal is not None:
            sock.close()
            with self._cond:
                self.refused = refusal
                self.dropped += len(self._pending)
                self._pending.clear()
                self._cond.notify_all()
            warnings.warn(
                f"ddlkit.metrics: the collector at {self.address} refused worker "
                f"{self.worker!r} ({refusal}); records go to the JSONL file only. Fix: start the "
                f"worker with the collector's env() (DDLKIT_COLLECTOR and DDLKIT_TOKEN).",
                RuntimeWarning,
                stacklevel=1,
            )
            return False
        sock.settimeout(SEND_TIMEOUT)
        with self._cond:
            self._sock = sock
            self.connects += 1
            self._backoff = BACKOFF_START
            self._failed_since_success = False
            self._cond.notify_all()
        return True

    def _fail(self, reason: str) -> None:
        self._disconnect()
        with self._cond:
            self.last_error = reason
            self._failed_since_success = True
            self._next_attempt = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            self._cond.notify_all()

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _read_line(sock: socket.socket, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = sock.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data
