"""Import the official CIFAR-10 archive a learner already has, offline.

``python -m ddlkit.data import cifar10 PATH`` (or ``ddlkit data import
cifar10 PATH``) takes ``cifar-10-python.tar.gz`` as published on
https://www.cs.toronto.edu/~kriz/cifar.html and:

1. checks it before writing anything: its size, then its sha256 against the
   one tf-keras' ``cifar10.load_data`` checks (``file_hash`` in
   ``tf_keras/src/datasets/cifar10.py``), so the file accepted here is
   exactly the file Keras accepts; the MD5 published on the CIFAR page is
   computed in the same pass and shown when they differ;
2. reads its six batches (a restricted unpickler: numpy arrays, lists, bytes)
   and checks CIFAR-10's shapes;
3. puts the archive where tf-keras looks,
   ``<keras home>/datasets/cifar-10-batches-py.tar.gz``, with the folder
   ``cifar-10-batches-py/`` extracted beside it, so
   ``tf.keras.datasets.cifar10.load_data()`` loads it without network;
4. stores the arrays in the kit's verified cache (``cifar10.npz``), which
   :func:`ddlkit.data.load` reads under either Keras.

Every file is written to a temporary name and moved into place with
``os.replace``: a refused or interrupted import leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddlkit.data import cache, safe_pickle, sources
from ddlkit.data.catalog import SPECS
from ddlkit.errors import DataError

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
MEMBERS = (*TRAIN_BATCHES, "test_batch", "batches.meta")
PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"


@dataclass(frozen=True)
class Checksum:
    """What a file must be: its sha256 (decisive), optionally its size and MD5."""

    sha256: str
    size: int | None = None
    md5: str | None = None

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise DataError(f"Checksum sha256 {self.sha256!r} is not 64 lower-case hex digits.")


#: The official cifar-10-python.tar.gz: sha256 as tf-keras checks it, MD5 as published.
OFFICIAL = Checksum(
    sha256=SPECS["cifar10"].keras_sha256 or "",
    size=170_498_071,
    md5="c58f30108f718f92721af3b95e74349a",
)


@dataclass(frozen=True)
class Imported:
    """Where an import put CIFAR-10."""

    archive: Path
    folder: Path
    cache: Path
    sha256: str

    def __str__(self) -> str:
        return (
            f"cifar10: imported (sha256 {self.sha256}): Keras' archive {self.archive}, "
            f"extracted {self.folder}, kit cache {self.cache}"
        )


def _refuse(path: Path, cause: str, fix: str | None = None) -> DataError:
    fix = fix or (
        f"download cifar-10-python.tar.gz again from {PAGE} (the 'CIFAR-10 python version', "
        f"{OFFICIAL.size:,} bytes, MD5 {OFFICIAL.md5}) and run "
        "`python -m ddlkit.data import cifar10 PATH` on that file"
    )
    return DataError(f"Refused {path}: {cause}. Nothing was written. Fix: {fix}.")


def check(path: Path, expected: Checksum = OFFICIAL) -> str:
    """Check ``path`` against ``expected`` without writing anything; return its sha256.

    The sha256 decides; the size only words the error (a short file is named truncated).
    """
    if not path.exists():
        raise _refuse(
            path,
            "no such file",
            "give the path of cifar-10-python.tar.gz as downloaded from " + PAGE,
        )
    if not path.is_file():
        raise _refuse(path, "it is not a file", "give the path of the .tar.gz file itself")
    size = path.stat().st_size
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
            md5.update(block)
    if sha.hexdigest() == expected.sha256:
        return sha.hexdigest()
    if expected.size is not None and size < expected.size:
        what = f"truncated (or another file): {size:,} bytes, the archive has {expected.size:,}"
    else:
        what = f"not the CIFAR-10 archive tf-keras accepts ({size:,} bytes)"
    md5_note = f"; MD5 {md5.hexdigest()}, published {expected.md5}" if expected.md5 else ""
    raise _refuse(path, f"{what}: sha256 {sha.hexdigest()}, expected {expected.sha256}{md5_note}")


def _batch(member, path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    batch = safe_pickle.load(member, encoding="bytes")
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.uint8)
    except (KeyError, TypeError, ValueError) as exc:
        raise _refuse(path, f"{FOLDER}/{name} has no uint8 data and labels ({exc!r})") from exc
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise _refuse(
            path, f"{FOLDER}/{name} holds data {list(data.shape)} and {len(labels)} labels"
        )
    # Stored as rows of 3072 bytes, channel-major; Keras gives (N, 32, 32, 3).
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.reshape(-1, 1)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The four arrays of a CIFAR-10 archive, as ``keras.datasets.cifar10`` gives them."""
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seen = set()
    try:
        with tarfile.open(path, "r|gz") as tar:  # one pass over the stream
            for member in tar:
                name = member.name.removeprefix(f"{FOLDER}/")
                seen.add(name)
                if name in MEMBERS[:-1] and member.isfile():
                    batches[name] = _batch(tar.extractfile(member), path, name)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _refuse(
            path, f"it cannot be read as a .tar.gz ({type(exc).__name__}: {exc})"
        ) from exc
    missing = [m for m in MEMBERS[:-1] if m not in batches]
    missing += [] if MEMBERS[-1] in seen else [MEMBERS[-1]]
    missing = [f"{FOLDER}/{m}" for m in missing]
    if missing:
        raise _refuse(path, f"the archive lacks {', '.join(missing)}")
    arrays = {
        "x_train": np.concatenate([batches[n][0] for n in TRAIN_BATCHES]),
        "y_train": np.concatenate([batches[n][1] for n in TRAIN_BATCHES]),
        "x_test": np.ascontiguousarray(batches["test_batch"][0]),
        "y_test": batches["test_batch"][1],
    }
    want = SPECS["cifar10"].array_shapes()
    wrong = {k: list(a.shape) for k, a in arrays.items() if a.shape != want[k]}
    if wrong:
        raise _refuse(path, f"arrays {wrong}, CIFAR-10 has {dict(want)}")
    return arrays


def _copy_into_place(src: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _extract_into_place(archive: Path, target: Path) -> None:
    """Extract ``archive``'s ``FOLDER`` as ``target``, replacing any earlier one whole."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(f"{FOLDER}/")]
            tar.extractall(staging, members=members, filter="data")
        if target.exists():
            os.replace(target, old)
        os.replace(staging / FOLDER, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def keras_archive_path() -> Path:
    """``<tf-keras home>/datasets/cifar-10-batches-py.tar.gz``, the file tf-keras checks."""
    home = Path(os.path.expanduser("~")) / ".keras"
    try:  # tf-keras makes ~/.keras when it loads; without it, it would use /tmp/.keras
        home.mkdir(exist_ok=True)
    except OSError:
        pass
    return sources.keras_home("tf-keras") / SPECS["cifar10"].keras_files["tf-keras"][0]


def import_cifar10(path: str | os.PathLike, *, expected: Checksum = OFFICIAL) -> Imported:
    """Check the CIFAR-10 archive at ``path``, then put it where tf-keras and the kit find it.

    ``expected`` is what the file must hash to: the official archive unless a
    caller (a test with an archive of its own) names another checksum.
    Raises :class:`~ddlkit.errors.DataError`, naming the cause and the fix,
    before anything is written.
    """
    path = Path(path).expanduser()
    digest = check(path, expected)
    arrays = read_arrays(path)
    archive = keras_archive_path()
    archive.parent.mkdir(parents=True, exist_ok=True)
    _copy_into_place(path, archive)
    folder = archive.parent / FOLDER
    _extract_into_place(archive, folder)
    npz = cache.write("cifar10", arrays, origin=f"import:{path.name} sha256:{digest}")
    cache.read("cifar10", sources.layout(SPECS["cifar10"]), fix_name="cifar10")  # read back
    return Imported(archive=archive, folder=folder, cache=npz, sha256=digest)
