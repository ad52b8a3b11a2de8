"""What the kit knows about each data set: pure data, no I/O.

Shapes and dtypes are exactly those of ``keras.datasets``, so code written
for Keras' loaders works unchanged with :func:`ddlkit.data.load`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ddlkit.errors import DataError

NAMES = ("mnist", "fashion_mnist", "cifar10")

#: Where ``load(source="auto")`` looks, in order.
SOURCES = ("keras", "kit-cache", "synthetic")

_DIGITS = tuple(str(i) for i in range(10))
_FASHION = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_CIFAR10 = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_FASHION_FILES = (
    "train-labels-idx1-ubyte.gz",
    "train-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
)
_TF_DATA_HOST = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"


@dataclass(frozen=True)
class DatasetSpec:
    """One data set as ``keras.datasets`` gives it.

    ``keras_files`` maps a Keras flavour (``"tf-keras"`` or ``"keras3"``) to
    the files, relative to Keras' home directory, whose presence means
    ``load_data()`` will not try to download, and ``keras_sha256`` is the
    hash Keras checks the first of them against (Keras downloads the file
    again when it does not match).
    """

    name: str
    display_name: str
    class_names: tuple[str, ...]
    image_shape: tuple[int, ...]
    label_shape: tuple[int, ...]
    train_size: int
    test_size: int
    keras_module: str
    keras_origin: str
    keras_files: dict[str, tuple[str, ...]]
    keras_sha256: str | None = None
    has_standin: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def array_shapes(self) -> dict[str, tuple[int, ...]]:
        """The four arrays' shapes, keyed like Keras' ``mnist.npz``."""
        return {
            "x_train": (self.train_size, *self.image_shape),
            "y_train": (self.train_size, *self.label_shape),
            "x_test": (self.test_size, *self.image_shape),
            "y_test": (self.test_size, *self.label_shape),
        }


SPECS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        name="mnist",
        display_name="MNIST",
        class_names=_DIGITS,
        image_shape=(28, 28),
        label_shape=(),
        train_size=60000,
        test_size=10000,
        keras_module="mnist",
        keras_origin=_TF_DATA_HOST + "mnist.npz",
        keras_files={
            "tf-keras": ("datasets/mnist.npz",),
            "keras3": ("datasets/mnist.npz",),
        },
        keras_sha256="731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1",
    ),
    "fashion_mnist": DatasetSpec(
        name="fashion_mnist",
        display_name="Fashion-MNIST",
        class_names=_FASHION,
        image_shape=(28, 28),
        label_shape=(),
        train_size=60000,
        test_size=10000,
        keras_module="fashion_mnist",
        keras_origin=_TF_DATA_HOST + _FASHION_FILES[0],
        keras_files={
            "tf-keras": tuple(f"datasets/fashion-mnist/{f}" for f in _FASHION_FILES),
            "keras3": tuple(f"datasets/fashion-mnist/{f}" for f in _FASHION_FILES),
        },
    ),
    "cifar10": DatasetSpec(
        name="cifar10",
        display_name="CIFAR-10",
        class_names=_CIFAR10,
        image_shape=(32, 32, 3),
        label_shape=(1,),
        train_size=50000,
        test_size=10000,
        keras_module="cifar10",
        keras_origin="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        keras_files={
            # tf-keras downloads the archive again when it is missing, even
            # if the extracted folder is there; Keras 3 names it differently.
            "tf-keras": ("datasets/cifar-10-batches-py.tar.gz",),
            "keras3": ("datasets/cifar-10-batches-py-target_archive",),  # keras 3.15
        },
        keras_sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        has_standin=True,
    ),
}

#: The Debian files Fashion-MNIST is built from (same names as upstream).
FASHION_MNIST_FILES = _FASHION_FILES


def spec(name: str) -> DatasetSpec:
    """The spec of ``name``; a :class:`DataError` listing the valid names otherwise."""
    if isinstance(name, str) and name in SPECS:
        return SPECS[name]
    hint = ""
    if isinstance(name, str):
        close = difflib.get_close_matches(name.lower().replace("-", "_"), NAMES, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    raise DataError(
        f"Unknown data set {name!r}{hint}. Fix: use one of the valid names: {', '.join(NAMES)}."
    )


def class_names(name: str) -> tuple[str, ...]:
    """The class names of ``name``, indexed by label."""
    return spec(name).class_names
