"""The restricted unpickler: plain numpy pickles load, anything else is refused unexecuted."""

from __future__ import annotations

import builtins
import os
import pickle

import numpy as np
import pytest

from ddlkit.data import safe_pickle
from ddlkit.errors import DataError, UnsafePickleError


class _Payload:
    """Unpickling this calls ``func(*args)``: the classic pickle attack."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _writes_marker(path) -> str:
    return f"open({str(path)!r}, 'w').write('pwned')"


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_numpy_arrays_round_trip(protocol):
    rng = np.random.default_rng(0)
    data = {
        "f32": rng.random((3, 4), dtype=np.float32),
        "u8": rng.integers(0, 256, (2, 5), dtype=np.uint8),
        "i64": np.arange(7, dtype=np.int64),
        "big_endian": np.arange(4, dtype=">i4"),
        "fortran": np.asfortranarray(rng.random((3, 2))),
        "scalar": np.float32(1.5),
        "pair": (np.zeros(2), [np.ones((1, 1), dtype=np.int8)]),
    }
    blob = pickle.dumps(data, protocol=protocol)
    got, trusted = safe_pickle.loads(blob), pickle.loads(blob)
    assert set(got) == set(data)
    for key in ("f32", "u8", "i64", "big_endian", "fortran"):
        assert got[key].dtype == trusted[key].dtype  # numpy may normalise byte order
        np.testing.assert_array_equal(got[key], data[key])
    assert got["scalar"] == np.float32(1.5) and got["scalar"].dtype == np.float32
    np.testing.assert_array_equal(got["pair"][1][0], data["pair"][1][0])


def test_plain_pickle_would_run_the_payload(tmp_path):
    """Control: the payload below is live, so the refusals in the next test mean something."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_Payload(builtins.exec, _writes_marker(marker))))
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize(
    ("func", "refused"),
    [(builtins.exec, "builtins.exec"), (builtins.eval, "builtins.eval")],
)
def test_code_execution_is_refused(tmp_path, func, refused):
    marker = tmp_path / "marker"
    evil = pickle.dumps({"x": np.arange(3), "y": _Payload(func, _writes_marker(marker))})
    with pytest.raises(UnsafePickleError, match=f"Refused to unpickle global '{refused}'"):
        safe_pickle.loads(evil)
    assert not marker.exists()


def test_os_system_is_refused(tmp_path):
    marker = tmp_path / "marker"
    evil = pickle.dumps(_Payload(os.system, f"touch {marker}"), protocol=2)
    with pytest.raises(UnsafePickleError, match=r"global '(posix|os)\.system'") as err:
        safe_pickle.loads(evil)
    assert "numpy.ndarray" in str(err.value)  # it lists what is admitted
    assert not marker.exists()


def test_hand_written_protocol0_global_is_refused(tmp_path):
    marker = tmp_path / "marker"
    evil = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    with pytest.raises(UnsafePickleError, match="global 'os.system'"):
        safe_pickle.loads(evil)
    assert not marker.exists()


def test_object_arrays_are_refused():
    evil = pickle.dumps(np.array([1, "two", None], dtype=object))
    with pytest.raises(UnsafePickleError, match="Python objects"):
        safe_pickle.loads(evil)


def test_refusal_is_a_data_error_and_an_unpickling_error():
    evil = pickle.dumps(_Payload(print, "x"))
    with pytest.raises(pickle.UnpicklingError):
        safe_pickle.loads(evil)
    with pytest.raises(DataError):
        safe_pickle.loads(evil)


def test_garbage_is_a_data_error_not_a_crash():
    with pytest.raises(DataError, match="Not a readable numpy pickle"):
        safe_pickle.loads(b"\x80\x02this is not a pickle")
    with pytest.raises(DataError, match="Not a readable numpy pickle"):
        safe_pickle.loads(pickle.dumps(np.arange(10))[:-8])
