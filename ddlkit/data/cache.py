"""The kit's offline data cache: one ``.npz`` of uint8 arrays per data set.

Each ``<key>.npz`` under :func:`ddlkit.settings.data_dir` has a manifest
``<key>.manifest.json`` with the file's size, sha256 and array shapes. Both
are written atomically (temporary file, then ``os.replace``), the manifest
last. Reading verifies everything first: a file that fails is reported with
:class:`~ddlkit.errors.CorruptCacheError` and left where it is. Only
:func:`move_aside` (run by ``prepare --force``) moves a bad file, and it says
where to.

The format is the kit's own and lives outside Keras' folders: Keras checks
its downloads against fixed hashes and would reject and delete these files.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ddlkit import settings
from ddlkit.errors import CorruptCacheError, DataError

FORMAT = 1
MANIFEST_SUFFIX = ".manifest.json"
ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")

#: key -> (shape, dtype) of each array, as a data set's spec expects them.
Layout = dict[str, tuple[tuple[int, ...], str]]


def data_path(key: str) -> Path:
    return settings.data_dir() / f"{key}.npz"


def manifest_path(key: str) -> Path:
    return settings.data_dir() / f"{key}{MANIFEST_SUFFIX}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What a cache file must be; written beside it as JSON."""

    key: str
    file: str
    size: int
    sha256: str
    arrays: dict[str, tuple[tuple[int, ...], str]]
    origin: str
    created: str
    format: int = FORMAT

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(f"format {self.format}, this kit reads format {FORMAT}")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"sha256 {self.sha256!r} is not 64 hex digits")
        if self.size < 0:
            raise ValueError(f"negative size {self.size}")

    def to_json(self) -> str:
        arrays = {k: {"shape": list(s), "dtype": d} for k, (s, d) in self.arrays.items()}
        doc = {
            "format": self.format,
            "key": self.key,
            "file": self.file,
            "size": self.size,
            "sha256": self.sha256,
            "arrays": arrays,
            "origin": self.origin,
            "created": self.created,
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = json.loads(text)
        arrays = {
            k: (tuple(int(n) for n in v["shape"]), str(v["dtype"]))
            for k, v in doc["arrays"].items()
        }
        return cls(
            key=str(doc["key"]),
            file=str(doc["file"]),
            size=int(doc["size"]),
            sha256=str(doc["sha256"]),
            arrays=arrays,
            origin=str(doc["origin"]),
            created=str(doc["created"]),
            format=int(doc["format"]),
        )


def _corrupt(path: Path, what: str, fix_name: str) -> CorruptCacheError:
    """The error for a bad cache file; ``.path`` and ``.problem`` hold the parts."""
    err = CorruptCacheError(
        f"Kit data cache file {path} is corrupt: {what}. It was not used and is left in place. "
        f"Fix: run `python -m ddlkit.data prepare --force {fix_name}` "
        f"(it moves the bad file aside to {path.name}.corrupt and rebuilds the cache)."
    )
    err.path, err.problem = path, what
    return err


def _atomic_write(target: Path, write) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache is not secret
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write(key: str, arrays: dict[str, np.ndarray], *, origin: str) -> Path:
    """Store ``arrays`` as ``<key>.npz`` with its manifest, atomically; return the path."""
    missing = [k for k in ARRAY_KEYS if k not in arrays]
    if missing:
        raise DataError(f"Cannot cache {key!r}: arrays {missing} are missing.")
    path, mpath = data_path(key), manifest_path(key)
    _atomic_write(path, lambda f: np.savez(f, **{k: arrays[k] for k in ARRAY_KEYS}))
    manifest = Manifest(
        key=key,
        file=path.name,
        size=path.stat().st_size,
        sha256=sha256_of(path),
        arrays={k: (tuple(arrays[k].shape), str(arrays[k].dtype)) for k in ARRAY_KEYS},
        origin=origin,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    _atomic_write(mpath, lambda f: f.write(manifest.to_json().encode()))
    return path


def exists(key: str) -> bool:
    """Whether anything of ``key`` is in the cache (good or bad)."""
    return data_path(key).exists() or manifest_path(key).exists()


def verify(key: str, layout: Layout, *, fix_name: str) -> Manifest:
    """Check ``key``'s file against its manifest and ``layout`` without loading it.

    Raises :class:`FileNotFoundError` when neither file exists and
    :class:`CorruptCacheError` for anything else that is wrong.
    """
    path, mpath = data_path(key), manifest_path(key)
    if not path.exists() and not mpath.exists():
        raise FileNotFoundError(path)
    if not mpath.exists():
        raise _corrupt(
            path, f"its manifest {mpath.name} is missing (an interrupted write?)", fix_name
        )
    try:
        manifest = Manifest.from_json(mpath.read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _corrupt(
            mpath, f"the manifest cannot be read ({type(exc).__name__}: {exc})", fix_name
        ) from exc
    if manifest.key != key or manifest.file != path.name:
        raise _corrupt(mpath, f"it describes {manifest.file!r}, not {path.name!r}", fix_name)
    if manifest.arrays != layout:
        raise _corrupt(mpath, f"it lists arrays {manifest.arrays}, expected {layout}", fix_name)
    if not path.exists():
        raise _corrupt(path, f"the file is missing but {mpath.name} exists", fix_name)
    size = path.stat().st_size
    if size != manifest.size:
        kind = "truncated" if size < manifest.size else "too long"
        raise _corrupt(path, f"{kind}: {size} bytes, the manifest says {manifest.size}", fix_name)
    digest = sha256_of(path)
    if digest != manifest.sha256:
        raise _corrupt(
            path, f"sha256 {digest} does not match the manifest's {manifest.sha256}", fix_name
        )
    return manifest


def read(
    key: str, layout: Layout, *, fix_name: str, origin: str | None = None
) -> dict[str, np.ndarray] | None:
    """The verified arrays of ``key``; ``None`` when the cache has no such entry, or (with
    ``origin``) when its manifest says it was made from something else."""
    try:
        manifest = verify(key, layout, fix_name=fix_name)
    except FileNotFoundError:
        return None
    if origin is not None and manifest.origin != origin:
        return None
    path = data_path(key)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in ARRAY_KEYS}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise _corrupt(
            path, f"it cannot be read as .npz ({type(exc).__name__}: {exc})", fix_name
        ) from exc
    for k, (shape, dtype) in layout.items():
        if arrays[k].shape != shape or str(arrays[k].dtype) != dtype:
            got = f"{arrays[k].dtype}{list(arrays[k].shape)}"
            raise _corrupt(path, f"array {k} is {got}, expected {dtype}{list(shape)}", fix_name)
    return arrays


def move_aside(key: str) -> list[tuple[Path, Path]]:
    """Rename ``key``'s files to ``*.corrupt`` (never overwriting); return (old, new) pairs."""
    moved = []
    for path in (data_path(key), manifest_path(key)):
        if not path.exists():
            continue
        target = path.with_name(path.name + ".corrupt")
        n = 1
        while target.exists():
            target = path.with_name(f"{path.name}.{n}.corrupt")
            n += 1
        os.replace(path, target)
        moved.append((path, target))
    return moved
