"""A class-per-folder tree of PNG files, written offline from a data set the kit has.

``tf.keras.utils.image_dataset_from_directory`` reads images from a layout like::

    root/ankle_boot/train_00000.png
    root/bag/train_00035.png
    ...

:func:`write` writes that tree from :func:`ddlkit.data.load` (by default five classes of
Fashion-MNIST, small in fast mode): each file is one image of the data set's training (or
test) split, named after its index there, in the folder of its class. No TensorFlow: the
PNG files are encoded here with ``zlib``.

- **Atomic**: the tree is written into a hidden temporary sibling of ``root`` with its
  manifest (``.image_folder.json``) last, then renamed into place: ``root`` either does
  not exist or is complete.
- **Idempotent**: a second call with the same request finds the tree (its manifest and
  every file it lists) and writes nothing. A different request for the same ``root``
  raises :class:`~ddlkit.errors.DataError` unless ``replace=True``; a folder the kit did
  not write is never replaced.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import struct
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddlkit import settings
from ddlkit.errors import DataError

MANIFEST = ".image_folder.json"
FORMAT = 1
#: Five well separated Fashion-MNIST classes.
DEFAULT_CLASSES = {"fashion_mnist": ("T-shirt/top", "Trouser", "Sandal", "Bag", "Ankle boot")}
PER_CLASS = 200  # images per class by default
PER_CLASS_FAST = 40  # in fast mode (DDLKIT_FAST=1, CI)


def default_per_class() -> int:
    """Images per class when none is asked: ``PER_CLASS``, ``PER_CLASS_FAST`` in fast mode."""
    return PER_CLASS_FAST if settings.fast_mode() else PER_CLASS


def folder_name(class_name: str) -> str:
    """A class's folder: lower case, runs of other characters as one ``_`` ("T-shirt/top"
    -> "t_shirt_top")."""
    name = re.sub(r"[^a-z0-9]+", "_", class_name.lower()).strip("_")
    if not name:
        raise DataError(f"Class name {class_name!r} gives an empty folder name.")
    return name


def png_bytes(image: np.ndarray) -> bytes:
    """One uint8 image, (H, W) grey or (H, W, 3) RGB, as a PNG file (8 bits, no filter)."""
    img = np.asarray(image)
    if img.dtype != np.uint8:
        raise DataError(f"PNG images must be uint8, got {img.dtype}.")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 2:
        colour = 0  # greyscale
    elif img.ndim == 3 and img.shape[2] == 3:
        colour = 2  # truecolour
    else:
        raise DataError(f"PNG images must be (H, W), (H, W, 1) or (H, W, 3), got {img.shape}.")
    height, width = img.shape[:2]
    rows = img.reshape(height, -1)
    raw = np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()  # filter 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class ImageFolder:
    """A tree :func:`write` wrote (or found complete): what is where."""

    root: Path
    dataset: str
    split: str
    class_names: tuple[str, ...]  # the data set's names of the classes written
    folders: tuple[str, ...]  # their folders, in the same order
    per_class: int
    files: tuple[str, ...]  # every file, relative to root, sorted
    synthetic: bool
    created: bool  # False: the call found the tree complete and wrote nothing

    def __post_init__(self) -> None:
        if len(self.class_names) != len(self.folders) or len(set(self.folders)) != len(
            self.folders
        ):
            raise DataError(f"One distinct folder per class needed, got {self.folders}.")
        if len(self.files) != self.per_class * len(self.folders):
            raise DataError(
                f"{len(self.files)} files for {len(self.folders)} classes of {self.per_class}."
            )

    def paths(self) -> list[Path]:
        return [self.root / f for f in self.files]

    def counts(self) -> dict[str, int]:
        """Files per class folder (sorted by folder, as Keras numbers the labels)."""
        return {f: sum(p.startswith(f + "/") for p in self.files) for f in sorted(self.folders)}

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("root", str(self.root)),
            (
                "data set",
                f"{self.dataset} ({self.split})" + (" SYNTHETIC" if self.synthetic else ""),
            ),
            (
                "classes",
                ", ".join(
                    f"{f} ({n})" for f, n in zip(self.folders, self.class_names, strict=True)
                ),
            ),
            ("files", f"{len(self.files)} PNG ({self.per_class} per class)"),
            ("written now", "yes" if self.created else "no: found complete"),
        ]

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table><caption>image folder</caption>{body}</table>"


def _request(dataset, split, class_names, per_class) -> dict:
    return {
        "format": FORMAT,
        "dataset": dataset,
        "split": split,
        "class_names": list(class_names),
        "per_class": per_class,
    }


def _found(root: Path, request: dict) -> ImageFolder | None:
    """The complete tree at ``root`` for ``request``; None if ``root`` does not exist."""
    if not root.exists():
        return None
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise DataError(
            f"{root} exists but was not written by ddlkit.data.image_folder (no {MANIFEST}). "
            f"Fix: choose another root, or move that folder away."
        )
    try:
        doc = json.loads(manifest.read_text())
        have = {k: doc[k] for k in request}
        files = tuple(doc["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{manifest} cannot be read ({exc}). Fix: write(..., replace=True) rebuilds it."
        ) from exc
    if have != request:
        return _mismatch(root, have, request)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise DataError(
            f"{root} is incomplete: {len(missing)} of its {len(files)} files are missing "
            f"(first: {missing[0]}). Fix: write(..., replace=True) rebuilds it."
        )
    return ImageFolder(
        root=root,
        dataset=doc["dataset"],
        split=doc["split"],
        class_names=tuple(doc["class_names"]),
        folders=tuple(doc["folders"]),
        per_class=int(doc["per_class"]),
        files=files,
        synthetic=bool(doc["synthetic"]),
        created=False,
    )


def _mismatch(root: Path, have: dict, request: dict):
    diff = {k: (have[k], request[k]) for k in request if have[k] != request[k]}
    said = ", ".join(f"{k}: {a!r}, asked {b!r}" for k, (a, b) in diff.items())
    raise DataError(
        f"{root} holds another tree ({said}). "
        f"Fix: choose another root, or pass replace=True to rebuild it."
    )


def _select(labels: np.ndarray, wanted: Sequence[int], per_class: int, name: str) -> np.ndarray:
    """The first ``per_class`` indices of each wanted label, class by class."""
    chosen = []
    for label in wanted:
        idx = np.flatnonzero(labels == label)[:per_class]
        if len(idx) < per_class:
            raise DataError(
                f"{name} has {len(idx)} images of class {label}, fewer than per_class={per_class}."
            )
        chosen.append(idx)
    return np.concatenate(chosen)


def write(
    root: str | os.PathLike,
    dataset: str = "fashion_mnist",
    *,
    classes: Sequence[str | int] | None = None,
    per_class: int | None = None,
    split: str = "train",
    replace: bool = False,
) -> ImageFolder:
    """Write (or find) ``root/<class folder>/<split>_<index>.png`` for ``classes``.

    ``classes``: names or label numbers of ``dataset`` (default: the five of
    ``DEFAULT_CLASSES`` for Fashion-MNIST, else the first five). ``per_class``: the first
    that many images of each class in ``split`` ("train" or "test"); default
    ``PER_CLASS``, ``PER_CLASS_FAST`` in fast mode.
    """
    from ddlkit.data.catalog import spec
    from ddlkit.data.sources import load

    sp = spec(dataset)
    if split not in ("train", "test"):
        raise DataError(f"split={split!r}: use 'train' or 'test'.")
    if per_class is None:
        per_class = default_per_class()
    if int(per_class) < 1:
        raise DataError(f"per_class={per_class}: at least one image per class.")
    per_class = int(per_class)
    if classes is None:
        classes = DEFAULT_CLASSES.get(dataset, sp.class_names[:5])
    labels = []
    for c in classes:
        if isinstance(c, str) and c in sp.class_names:
            labels.append(sp.class_names.index(c))
        elif isinstance(c, int | np.integer) and 0 <= int(c) < sp.num_classes:
            labels.append(int(c))
        else:
            raise DataError(f"{c!r} is not a class of {dataset}: {', '.join(sp.class_names)}.")
    if len(set(labels)) != len(labels) or not labels:
        raise DataError(f"classes={list(classes)}: name each class once, at least one.")
    names = tuple(sp.class_names[i] for i in labels)
    folders = tuple(folder_name(n) for n in names)
    if len(set(folders)) != len(folders):
        raise DataError(f"Classes {names} give the same folder twice: {folders}.")
    root = Path(root).expanduser().absolute()
    request = _request(dataset, split, names, per_class)
    if not replace:
        found = _found(root, request)
        if found is not None:
            return found
    elif root.exists() and not (root / MANIFEST).is_file():
        _found(root, request)  # raises: not the kit's folder, never replaced

    loaded = load(dataset)
    x, y = loaded.train if split == "train" else loaded.test
    y = np.asarray(y).reshape(-1)
    chosen = _select(y, labels, per_class, f"{sp.display_name} ({split})")
    folder_of = dict(zip(labels, folders, strict=True))
    files = sorted(f"{folder_of[int(y[i])]}/{split}_{int(i):05d}.png" for i in chosen)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        for f in folders:
            (tmp / f).mkdir()
        for i in chosen:
            (tmp / folder_of[int(y[i])] / f"{split}_{int(i):05d}.png").write_bytes(png_bytes(x[i]))
        doc = {**request, "folders": list(folders), "files": files}
        doc["synthetic"] = bool(loaded.info.synthetic)
        (tmp / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        _install(tmp, root, replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when installed
    done = _found(root, request)
    assert done is not None
    return dataclasses.replace(done, created=True)


def _install(tmp: Path, root: Path, replace: bool) -> None:
    """Rename the finished ``tmp`` to ``root``; with ``replace``, the old tree goes after."""
    old = None
    if replace and root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
        os.replace(root, old / "tree")
    try:
        os.rename(tmp, root)
    except OSError:
        # Another process installed a tree first (rename onto a non-empty folder fails):
        # the caller's _found() then checks that it is the tree asked for.
        if not root.exists():
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
