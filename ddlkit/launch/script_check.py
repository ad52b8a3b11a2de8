"""Read a worker script before anything starts: does it parse, and does it fit the strategy?

Pure: the script's text is parsed with :mod:`ast`, never run or imported.

- A script that does not parse is refused with its line and Python's message.
- The distribution API the script calls is read from its syntax tree:
  ``tf.distribute.MirroredStrategy(...)``, ``MultiWorkerMirroredStrategy(...)``,
  ``ParameterServerStrategy(...)``, or ``init()`` on a name imported from
  ``horovod`` (``hvd.init()``; also ``ddlkit.horovod``'s ``dkh.init()``).
  A script that calls one or more of them but none made for the requested
  strategy is refused, naming what it calls and where. A script that calls
  none of them (a single-device script, a TF_CONFIG reporter) passes:
  only a clear mismatch is an error.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError

#: Call names (last attribute, or bare name) -> the strategy they belong to.
TF_STRATEGIES = {
    "MirroredStrategy": "mirrored",
    "MultiWorkerMirroredStrategy": "multi_worker",
    "CollectiveAllReduceStrategy": "multi_worker",
    "ParameterServerStrategy": "parameter_server",
    "ParameterServerStrategyV2": "parameter_server",
}
HOROVOD_MODULES = ("horovod", "ddlkit.horovod")

#: What to write for each strategy, for the error's fix.
WRITTEN_WITH = {
    "mirrored": "tf.distribute.MirroredStrategy()",
    "multi_worker": "tf.distribute.MultiWorkerMirroredStrategy()",
    "parameter_server": "tf.distribute.ParameterServerStrategy(cluster_resolver)",
    "horovod": "hvd.init() (import horovod.tensorflow.keras as hvd)",
}


@dataclass(frozen=True)
class ApiCall:
    """One call of a distribution API found in a script."""

    strategy: str  # the strategy it is made for
    call: str  # as written, e.g. "tf.distribute.MirroredStrategy()" or "hvd.init()"
    line: int


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "..."


def _is_horovod(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in HOROVOD_MODULES)


def api_calls(tree: ast.AST) -> list[ApiCall]:
    """Every distribution API call in ``tree``, in line order."""
    horovod_names: set[str] = set()  # (dotted) names bound to a horovod module
    horovod_inits: set[str] = set()  # `from horovod.x import init [as y]`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_horovod(alias.name):
                    horovod_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_horovod(full) and alias.name != "init":
                    horovod_names.add(alias.asname or alias.name)
                elif _is_horovod(node.module) and alias.name == "init":
                    horovod_inits.add(alias.asname or "init")
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in TF_STRATEGIES:
            found.append(ApiCall(TF_STRATEGIES[name], f"{_dotted(func)}()", node.lineno))
        elif name == "init" and isinstance(func, ast.Attribute):
            receiver = _dotted(func.value)
            if any(receiver == n or receiver.startswith(n + ".") for n in horovod_names):
                found.append(ApiCall("horovod", f"{_dotted(func)}()", node.lineno))
        elif isinstance(func, ast.Name) and func.id in horovod_inits:
            found.append(ApiCall("horovod", f"{func.id}()", node.lineno))
    return sorted(found, key=lambda c: c.line)


def check_source(source: str, strategy: str, *, path: str = "<script>") -> list[ApiCall]:
    """Refuse ``source`` with a :class:`ConfigError` if it does not parse or fits another
    strategy than ``strategy``; return the distribution calls found."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        text = (exc.text or "").strip()
        shown = f": `{text}`" if text else ""
        raise ConfigError(
            f"script {path} does not parse: {exc.msg} at {where}{shown}. Nothing was started. "
            f"Fix: correct line {exc.lineno} of {path} (`python -m py_compile {path}` checks it), "
            f"then start it again."
        ) from None
    calls = api_calls(tree)
    if calls and not any(c.strategy == strategy for c in calls):
        used = ", ".join(f"{c.call} (line {c.line})" for c in calls)
        fits = sorted({c.strategy for c in calls})
        raise ConfigError(
            f"script {path} calls {used}, made for strategy={' or '.join(map(repr, fits))}, "
            f"but was launched with strategy={strategy!r}. Nothing was started. "
            f"Fix: launch it with strategy={fits[0]!r} (ddlkit launch --strategy {fits[0]}), "
            f"or launch a script that calls {WRITTEN_WITH.get(strategy, strategy)}."
        )
    return calls


def check(script: str | Path, strategy: str) -> list[ApiCall]:
    """:func:`check_source` on the file ``script`` (read as UTF-8)."""
    path = Path(script)
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"script {path} is not UTF-8 text ({exc.reason} at byte {exc.start}). "
            f"Nothing was started. Fix: pass a Python source file saved as UTF-8."
        ) from None
    return check_source(source, strategy, path=str(path))
