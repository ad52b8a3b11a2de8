"""What the image is built from (ddlkit.image.build): the kit's files, not what a run wrote.

The image's label is a digest of the files the build copies; a build whose digest matches
runs nothing. The scripts the notebooks write (%%writefile) are outputs of a run, ignored by
git and by .containerignore: a notebook run must change neither the digest nor the image.
"""

from __future__ import annotations

from pathlib import Path

from ddlkit import settings
from ddlkit.image.build import CONTEXT, GENERATED, context_digest, in_context


def _tree(root: Path) -> None:
    for rel, text in {
        "Containerfile": "FROM x\n",
        "ddlkit/core.py": "x = 1\n",
        "notebooks/01.ipynb": "{}\n",
        "notebooks/workers/.gitignore": "*.py\n",
        "notebooks/solutions/workers/.gitignore": "*.py\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_scripts_a_notebook_writes_change_no_digest_and_the_kits_files_do(tmp_path):
    _tree(tmp_path)
    before = context_digest(tmp_path, "base")
    for folder in GENERATED:
        (tmp_path / folder / "written_by_a_cell.py").write_text("print('a run')\n")
    (tmp_path / "ddlkit" / "__pycache__").mkdir()
    (tmp_path / "ddlkit" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    assert context_digest(tmp_path, "base") == before
    (tmp_path / "notebooks" / "workers" / "README.md").write_text("kept\n")  # not a script
    assert context_digest(tmp_path, "base") != before
    (tmp_path / "notebooks" / "workers" / "README.md").unlink()
    (tmp_path / "ddlkit" / "core.py").write_text("x = 2\n")
    assert context_digest(tmp_path, "base") != before
    assert context_digest(tmp_path, "other base") != context_digest(tmp_path, "base")


def test_the_build_ignores_what_the_digest_leaves_out():
    assert not in_context(Path("notebooks/workers/mwms_worker.py"))
    assert in_context(Path("notebooks/workers/.gitignore"))
    assert in_context(Path("launch/train_multi_worker.py"))
    assert not in_context(Path("ddlkit/__pycache__/x.cpython-311.pyc"))
    ignored = (settings.REPO_ROOT / ".containerignore").read_text().split()
    for folder in GENERATED:
        assert folder.split("/")[0] in CONTEXT and f"{folder}/*.py" in ignored
        gitignore = (settings.REPO_ROOT / folder / ".gitignore").read_text().split()
        assert "*.py" in gitignore  # never committed either
