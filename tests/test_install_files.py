"""The install descriptions agree: environment.yml pins what pyproject.toml pins."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONDA_EXTRAS = ("lab", "dev")  # the gpu extra is installed on top, as environment.yml says


def _key(req: Requirement) -> tuple[str, str]:
    return canonicalize_name(req.name), str(req.specifier)


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in CONDA_EXTRAS:
        lines += project["optional-dependencies"][extra]
    return dict(_key(Requirement(line)) for line in lines)


def conda_pip_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml should have exactly one pip: section"
    lines = [line for line in pip_sections[0] if not line.startswith("-e")]
    return dict(_key(Requirement(line)) for line in lines)


def test_environment_yml_matches_pyproject():
    py, conda = pyproject_requirements(), conda_pip_requirements()
    assert set(conda) == set(py), (
        f"only in environment.yml: {sorted(set(conda) - set(py))}; "
        f"only in pyproject.toml: {sorted(set(py) - set(conda))}"
    )
    clashes = {name: (py[name], conda[name]) for name in py if py[name] != conda[name]}
    assert not clashes, f"pins differ (pyproject, environment.yml): {clashes}"


def test_environment_yml_python_matches_requires_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert pythons, "environment.yml must pin python"
    version = pythons[0].split("=", 1)[1]
    from packaging.specifiers import SpecifierSet

    assert version in SpecifierSet(project["requires-python"])


def test_environment_yml_installs_the_kit_itself():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip
