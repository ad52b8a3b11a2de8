"""Host lists: :class:`Host`, horovodrun's ``"h1:2,h2:2"`` and MPI host files.

Host lists use horovodrun's syntax, ``"h1:2,h2:2"`` (a host without ``:N`` has
one slot), and host files MPI's, one ``host slots=N`` per line. Pure data: no
sockets, no TensorFlow.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_DIGITS_RE = re.compile(r"[0-9]+")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _host_problem(name: object) -> str | None:
    """Why ``name`` is not a usable host name or IPv4 address, or None if it is."""
    if not isinstance(name, str):
        return f"the host name must be a string, not {type(name).__name__}"
    if not name:
        return "the host name is empty"
    if any(c.isspace() for c in name):
        return f"host name {name!r} contains whitespace"
    if ":" in name:
        return "IPv6 addresses are not supported in host lists"
    if len(name) > 253 or not _NAME_RE.fullmatch(name):
        return (
            f"{name!r} is not a host name or IPv4 address "
            "(letters, digits, '.', '-' and '_' only, not starting with '.' or '-')"
        )
    if re.fullmatch(r"[0-9.]+", name):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"{name!r} is not a valid IPv4 address"
    return None


@dataclass(frozen=True)
class Host:
    """A machine and how many processes (slots) it may run."""

    name: str
    slots: int = 1

    def __post_init__(self) -> None:
        problem = _host_problem(self.name)
        if problem:
            raise ConfigError(
                f"bad host {self.name!r}: {problem}. "
                "Fix: use a host name or IPv4 address, e.g. Host('localhost', 2)."
            )
        if not _is_int(self.slots) or self.slots < 1:
            raise ConfigError(
                f"bad slots {self.slots!r} for host {self.name!r}: slots must be a positive "
                f"integer. Fix: e.g. Host({self.name!r}, 2)."
            )

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def format_hosts(hosts: Iterable[Host]) -> str:
    """The horovodrun ``-H`` string for ``hosts``, e.g. ``"h1:2,h2:1"``."""
    return ",".join(str(h) for h in hosts)


def _check_unique(hosts: list[Host], where: str) -> None:
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.name in seen:
            total = seen[host.name].slots + host.slots
            raise ConfigError(
                f"host {host.name!r} is listed twice {where} (with {seen[host.name].slots} "
                f"and {host.slots} slots). Fix: list each host once with all its slots, "
                f"e.g. {host.name}:{total}."
            )
        seen[host.name] = host


def _parse_entry(entry: str, text: str) -> Host:
    def bad(reason: str, example: str) -> ConfigError:
        return ConfigError(
            f"bad host entry {entry!r} in {text!r}: {reason}. "
            f"Fix: write it as host:slots, e.g. {example}."
        )

    if not entry:
        raise ConfigError(
            f"empty host entry in {text!r} (two commas in a row, or a comma at an end). "
            "Fix: remove the extra comma, e.g. 'h1:2,h2:2'."
        )
    if entry.count(":") > 1:
        raise bad("IPv6 addresses are not supported in host lists", "10.0.0.2:2")
    name, sep, slots = (part.strip() for part in entry.partition(":"))
    problem = _host_problem(name)
    if problem:
        raise bad(problem, "h1:2")
    if not sep:
        return Host(name, 1)
    if not _DIGITS_RE.fullmatch(slots) or int(slots) < 1:
        raise bad("slots must be a positive integer", f"{name}:2")
    return Host(name, int(slots))


def parse_hosts(text: str) -> tuple[Host, ...]:
    """Parse horovodrun's host list: ``"h1:2,h2:2"``, ``"localhost"`` (1 slot), IPv4 too.

    Whitespace around entries and around ``:`` is ignored.
    """
    if not isinstance(text, str):
        raise ConfigError(
            f"the host list must be a string like 'h1:2,h2:2', not {type(text).__name__}. "
            "Fix: pass e.g. 'localhost:2', or a list of Host objects where one is accepted."
        )
    if not text.strip():
        raise ConfigError(
            f"the host list {text!r} is empty. Fix: list hosts as host:slots separated by "
            "commas, e.g. 'localhost:2' or 'h1:2,h2:2'."
        )
    hosts = [_parse_entry(entry.strip(), text) for entry in text.split(",")]
    _check_unique(hosts, f"in {text!r}")
    return tuple(hosts)


def _parse_hostfile_line(line: str, where: str) -> Host:
    name, *rest = line.split()
    problem = _host_problem(name)
    if problem:
        raise ConfigError(f"{where}: bad entry {line!r}: {problem}. Fix: e.g. 'h1 slots=2'.")
    if not rest:
        return Host(name, 1)
    key, _, value = rest[0].partition("=")
    if len(rest) > 1 or key != "slots":
        raise ConfigError(
            f"{where}: bad entry {line!r}: expected 'host' or 'host slots=N' "
            f"(ddlkit reads no other keys). Fix: write it as '{name} slots=2'."
        )
    if not _DIGITS_RE.fullmatch(value) or int(value) < 1:
        raise ConfigError(
            f"{where}: bad entry {line!r}: slots must be a positive integer. "
            f"Fix: write it as '{name} slots=2'."
        )
    return Host(name, int(value))


def parse_hostfile(path: str | os.PathLike[str]) -> tuple[Host, ...]:
    """Parse an MPI/horovod host file: one ``host slots=N`` (or just ``host``) per line.

    ``#`` starts a comment; blank lines are skipped.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"hostfile {str(path)!r} does not exist. Fix: check the path, or pass the hosts "
            "directly as 'h1:2,h2:2'."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read hostfile {str(path)!r}: {exc}. Fix: make it a readable UTF-8 text "
            "file with one 'host slots=N' per line."
        ) from None
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_parse_hostfile_line(line, f"hostfile {str(path)!r} line {lineno}"))
    if not hosts:
        raise ConfigError(
            f"hostfile {str(path)!r} lists no hosts (only blank lines and comments). "
            "Fix: add one line per host, e.g. 'h1 slots=2'."
        )
    _check_unique(hosts, f"in hostfile {str(path)!r}")
    return tuple(hosts)


def _with_more_slots(hosts: tuple[Host, ...], extra: int) -> str:
    """``hosts`` as a host list with ``extra`` more slots on the first: an example fix."""
    first = Host(hosts[0].name, hosts[0].slots + extra)
    return format_hosts((first, *hosts[1:]))


def _as_hosts(hosts: str | Host | Iterable[Host]) -> tuple[Host, ...]:
    if isinstance(hosts, str):
        return parse_hosts(hosts)
    if isinstance(hosts, Host):
        return (hosts,)
    result = list(hosts)
    for host in result:
        if not isinstance(host, Host):
            raise ConfigError(
                f"hosts must be Host objects or a string like 'h1:2,h2:2', got {host!r}. "
                "Fix: pass parse_hosts('h1:2,h2:2') or [Host('h1', 2), Host('h2', 2)]."
            )
    if not result:
        raise ConfigError("no hosts given. Fix: pass at least one, e.g. 'localhost:2'.")
    _check_unique(result, f"in {format_hosts(result)!r}")
    return tuple(result)
