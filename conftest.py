"""Root pytest configuration: notebooks run under nbval in the kit's fast mode.

DDLKIT_FAST=1 shrinks every notebook's training to a few steps and
DDLKIT_PLOTS=static draws one final figure instead of a live widget (there is
no browser under nbval). Set them yourself to override.
"""

import os

# DDLKIT_CPU_REPORT=FILE: each test file's CPU seconds, its worker processes' included.
pytest_plugins = ["tests.harness.cpu_report"]

os.environ.setdefault("DDLKIT_FAST", "1")
os.environ.setdefault("DDLKIT_PLOTS", "static")


# -- running side by side (pytest-xdist: `make test` runs `-n 3 --dist loadfile`) -----------------
# Most of the suite waits: for worker processes to import TensorFlow, for sockets, for
# timeouts that are the behaviour under test. So test files run side by side, each file on
# one xdist worker (its module fixtures, and a notebook's kernel with its cells in order,
# stay together). Tests that share one expensive fixture belong in one file.


def pytest_sessionstart(session):
    from tests.harness import image_prebuild

    image_prebuild.start(session.config)


def pytest_sessionfinish(session):
    from tests.harness import image_prebuild

    image_prebuild.stop()


def _scope(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _weight(path: str, items) -> tuple[int, int]:
    """Longest first (xdist hands out files in collection order): notebooks, then files by
    how many slow tests they hold, then the rest."""
    notebook = path.endswith(".ipynb")
    slow = sum(1 for it in items if it.get_closest_marker("slow"))
    return (0 if notebook else 1, -slow)


def pytest_collection_modifyitems(config, items):
    by_scope: dict[str, list] = {}
    for item in items:
        by_scope.setdefault(_scope(item), []).append(item)
    order = sorted(by_scope, key=lambda s: _weight(s, by_scope[s]))
    items[:] = [it for scope in order for it in by_scope[scope]]
