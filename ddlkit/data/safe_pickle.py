"""Unpickle numpy arrays from files the kit did not write, and nothing else.

``pickle.load`` runs whatever callables a pickle names, so a pickle from the
internet can run any code. :class:`NumpyUnpickler` resolves only the globals
in :data:`ALLOWED` (what plain numpy array pickles need) and refuses every
other name with an :class:`~ddlkit.errors.UnsafePickleError` that names it.
Object arrays are refused too: they could hold anything.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ddlkit.errors import DataError, UnsafePickleError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


def _plain_dtype(obj: Any) -> np.dtype:
    dt = np.dtype(obj)
    if dt.hasobject:
        raise UnsafePickleError(
            f"Refused a numpy dtype holding Python objects ({dt}): object arrays can carry "
            "arbitrary objects. Fix: only plain numeric arrays can be read from untrusted pickles."
        )
    return dt


def _dtype(*args: Any) -> np.dtype:
    return _plain_dtype(np.dtype(*args))


def _reconstruct(subtype: type, shape: Any, typecode: Any) -> np.ndarray:
    if subtype is not np.ndarray:
        raise UnsafePickleError(
            f"Refused to build an array of type {subtype!r}; only numpy.ndarray."
        )
    return _multiarray._reconstruct(subtype, shape, _plain_dtype(typecode))


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    return _numeric._frombuffer(buf, _plain_dtype(dtype), shape, order)


def _scalar(dtype: Any, *args: Any) -> Any:
    return _multiarray.scalar(_plain_dtype(dtype), *args)


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    # Protocol-2 pickles made by Python 3 store bytes as _codecs.encode(str, "latin1").
    if encoding.replace("-", "").replace("_", "").lower() != "latin1":
        raise UnsafePickleError(f"Refused _codecs.encode with encoding {encoding!r}; only latin1.")
    return text.encode("latin1")


#: (module, name) -> the callable it resolves to. Nothing else is admitted.
ALLOWED: dict[tuple[str, str], Callable[..., Any] | type] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _latin1_encode,
}


class NumpyUnpickler(pickle.Unpickler):
    """An Unpickler that admits only the numpy names in :data:`ALLOWED`."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted(f"{m}.{n}" for m, n in ALLOWED))
            raise UnsafePickleError(
                f"Refused to unpickle global '{module}.{name}': the restricted unpickler admits "
                f"only {allowed}. The pickle is not a plain numpy pickle and may be malicious. "
                "Fix: do not load it; get the data from a trusted source."
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"Refused persistent id {pid!r}: not allowed in a numpy pickle.")


def load(file: BinaryIO, *, encoding: str = "ASCII") -> Any:
    """Unpickle from an open binary file, admitting only numpy arrays.

    ``encoding="latin1"`` reads pickles written by Python 2 (as MNIST's are).
    """
    try:
        return NumpyUnpickler(file, encoding=encoding).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(
            f"Not a readable numpy pickle: {type(exc).__name__}: {exc}. "
            "Fix: the file is damaged or not what it claims to be; get it again from its source."
        ) from exc


def loads(data: bytes, *, encoding: str = "ASCII") -> Any:
    """Unpickle ``data``, admitting only numpy arrays (see :func:`load`)."""
    return load(io.BytesIO(data), encoding=encoding)
