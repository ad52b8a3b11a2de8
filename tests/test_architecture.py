"""The package's shape: modules stay small enough to read in one sitting unless their
docstring says they hold one concern (import cycles: tests/test_imports.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddlkit"
LIMIT = 400  # lines
ONE_CONCERN = "One concern"  # how a longer module's docstring says what it holds
# Over LIMIT with more than one concern, and what would split them (kept honest: an entry
# for a module that is no longer over LIMIT fails the test, so the list only shrinks).
TO_SPLIT: dict[str, str] = {}


def modules() -> list[tuple[str, Path]]:
    """Every module of the package: (dotted name, path). ``__main__`` modules are entry
    points that run when imported (``python -m ddlkit.bench`` runs a benchmark): their
    imports are the package's own, checked as its modules."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def test_long_modules_hold_one_concern_and_say_so():
    too_long = {}
    for name, path in modules():
        text = path.read_text()
        lines = text.count("\n")
        if lines <= LIMIT:
            assert name not in TO_SPLIT, f"{name} is {lines} lines now: drop it from TO_SPLIT"
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if ONE_CONCERN not in doc and name not in TO_SPLIT:
            too_long[name] = lines
    assert not too_long, (
        f"modules over {LIMIT} lines whose docstring does not say '{ONE_CONCERN} ...': "
        f"{too_long}. Fix: split them, or, if each holds one concern, say which in its "
        f"docstring."
    )
    assert set(TO_SPLIT) <= {name for name, _ in modules()}, "TO_SPLIT names a missing module"


def test_test_files_have_unique_names():
    """tests/ folders are not packages, so pytest imports each test file by its base name:
    two files of one name break collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test files share a name: {clashes}. Fix: rename one (test_<area>_x.py)"
