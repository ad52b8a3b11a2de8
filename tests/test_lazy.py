"""Packages with lazy attributes: cheap to import, loaded and cached on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddlkit._lazy import lazy_attributes

PROBE = """
import sys
import ddlkit.{pkg} as pkg
heavy = [m for m in ("tensorflow", "matplotlib", "horovod") if m in sys.modules]
assert not heavy, heavy
assert "{lazy_module}" not in sys.modules
value = getattr(pkg, "{attr}")
assert "{lazy_module}" in sys.modules and vars(pkg)["{attr}"] is value
assert "{attr}" in dir(pkg)
print("ok")
"""


@pytest.mark.parametrize(
    ("pkg", "attr", "lazy_module"),
    [
        ("metrics", "plot_run", "ddlkit.metrics.plotting"),
        ("horovod", "load_timeline", "ddlkit.horovod.timeline"),
    ],
)
def test_package_imports_without_heavy_modules_and_loads_on_first_use(pkg, attr, lazy_module):
    code = PROBE.format(pkg=pkg, attr=attr, lazy_module=lazy_module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_unknown_attribute_names_the_package():
    getattr_, dir_ = lazy_attributes("pkg.x", {"a": "json"}, {}, ["a", "b"])
    with pytest.raises(AttributeError, match="module 'pkg.x' has no attribute 'c'"):
        getattr_("c")
    assert dir_() == ["a", "b"]
