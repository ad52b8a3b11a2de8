"""Read IDX files (the format of MNIST and Fashion-MNIST), plain or gzipped.

An IDX file is: two zero bytes, a type code, the number of dimensions, one
big-endian uint32 per dimension, then the values in C order, big-endian.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from ddlkit.errors import DataError

#: IDX type code -> numpy dtype (big-endian where it matters).
DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(data: bytes, *, where: str = "<bytes>") -> np.ndarray:
    """The array held by the IDX bytes ``data``; ``where`` names them in errors."""

    def bad(what: str) -> DataError:
        return DataError(f"{where} is not a valid IDX file: {what}.")

    if len(data) < 4:
        raise bad(f"only {len(data)} bytes, shorter than the 4-byte header")
    if data[0] != 0 or data[1] != 0:
        raise bad(f"the magic number starts with {data[0]:#04x} {data[1]:#04x}, not two zero bytes")
    code, ndim = data[2], data[3]
    if code not in DTYPES:
        raise bad(f"unknown type code {code:#04x}")
    if ndim == 0:
        raise bad("zero dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise bad(f"{len(data)} bytes cannot hold the sizes of {ndim} dimensions")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise bad(f"shape {shape} of {dtype} needs {expected} bytes but the file has {len(data)}")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file; a name ending in ``.gz`` is decompressed first."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path} cannot be read: {type(exc).__name__}: {exc}.") from exc
    return parse_idx(raw, where=str(path))
