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

from ddlkit import strategies
from ddlkit.errors import ConfigError


def tf_strategies() -> dict[str, str]:
    """Call names (last attribute, or bare name) -> the strategy they belong to (each
    registered strategy's ``api_classes``)."""
    return {c: s.name for s in map(strategies.get, strategies.names()) for c in s.api_classes}


def init_modules() -> dict[str, str]:
    """Modules whose ``init()`` belongs to a strategy (each strategy's ``api_modules``)."""
    return {m: s.name for s in map(strategies.get, strategies.names()) for m in s.api_modules}


def written_with(strategy: str) -> str:
    """What to write for ``strategy``, for the error's fix."""
    if strategy in strategies.names():
        return strategies.get(strategy).written_with or strategy
    return strategy


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


def _owner(module: str, modules: dict[str, str]) -> str | None:
    """The strategy whose module ``module`` is (or is inside), if any."""
    return next((s for m, s in modules.items() if module == m or module.startswith(m + ".")), None)


def api_calls(tree: ast.AST) -> list[ApiCall]:
    """Every distribution API call in ``tree``, in line order."""
    classes, modules = tf_strategies(), init_modules()
    bound: dict[str, str] = {}  # (dotted) names bound to a strategy's module, e.g. hvd
    inits: dict[str, str] = {}  # `from horovod.x import init [as y]`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                owner = _owner(alias.name, modules)
                if owner:
                    bound[alias.asname or alias.name] = owner
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = _owner(f"{node.module}.{alias.name}", modules)
                module = _owner(node.module, modules)
                if full and alias.name != "init":
                    bound[alias.asname or alias.name] = full
                elif module and alias.name == "init":
                    inits[alias.asname or "init"] = module
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in classes:
            found.append(ApiCall(classes[name], f"{_dotted(func)}()", node.lineno))
        elif name == "init" and isinstance(func, ast.Attribute):
            receiver = _dotted(func.value)
            owner = next(
                (s for n, s in bound.items() if receiver == n or receiver.startswith(n + ".")),
                None,
            )
            if owner:
                found.append(ApiCall(owner, f"{_dotted(func)}()", node.lineno))
        elif isinstance(func, ast.Name) and func.id in inits:
            found.append(ApiCall(inits[func.id], f"{func.id}()", node.lineno))
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
            f"or launch a script that calls {written_with(strategy)}."
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
