"""The wire protocol between a worker's reporter and the notebook's collector (pure).

A worker opens a TCP connection and sends one hello line, a JSON object
``{"hello": "ddlkit-metrics", "v": 1, "worker": ..., "token": ...}``. The
collector answers ``{"ok": true}`` or ``{"ok": false, "error": ...}`` (and
then closes). After ``ok`` the worker sends records, one JSON line each
(:meth:`ddlkit.metrics.records.Record.to_json`). Nothing is ever pickled.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from ddlkit.contract import (  # re-exported: the worker contract's variables
    COLLECTOR_VAR as COLLECTOR_VAR,
)
from ddlkit.contract import RUN_DIR_VAR as RUN_DIR_VAR
from ddlkit.contract import TOKEN_VAR as TOKEN_VAR
from ddlkit.contract import WORKER_VAR as WORKER_VAR
from ddlkit.contract import is_name
from ddlkit.errors import ConfigError, RecordError
from ddlkit.metrics.records import VERSION

HELLO = "ddlkit-metrics"
MAX_HELLO = 4096


def hello_line(worker: str, token: str) -> bytes:
    return (
        json.dumps({"hello": HELLO, "v": VERSION, "worker": worker, "token": token}).encode()
        + b"\n"
    )


def parse_hello(line: bytes) -> tuple[str, str]:
    """``(worker, token)`` of a hello line; RecordError if it is not one."""
    try:
        data: Any = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"the first line is not JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("hello") != HELLO:
        raise RecordError(f"the first line is not a {HELLO} hello")
    if data.get("v") != VERSION:
        raise RecordError(f"hello version {data.get('v')!r} is not {VERSION}")
    worker, token = data.get("worker"), data.get("token")
    if not is_name(worker):
        raise RecordError(f"hello has an invalid worker name {worker!r}")
    if not isinstance(token, str):
        raise RecordError("hello has no token")
    return worker, token


def reply_line(error: str | None = None) -> bytes:
    body = {"ok": True} if error is None else {"ok": False, "error": error}
    return json.dumps(body).encode() + b"\n"


def parse_reply(line: bytes) -> str | None:
    """None when the collector accepted the hello, else its reason for refusing."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return f"unexpected answer {line[:80]!r}"
    if isinstance(data, dict) and data.get("ok") is True:
        return None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return f"unexpected answer {line[:80]!r}"


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``; ConfigError names the fix."""
    host, sep, port_text = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"collector address {address!r} is not host:port. Fix: set {COLLECTOR_VAR} to "
            f"the value of Collector.address, e.g. 127.0.0.1:40123."
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 or ::1 addresses (pure)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
