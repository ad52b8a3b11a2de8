"""A synthetic, learnable stand-in with CIFAR-10's shapes, dtypes and classes.

Real CIFAR-10 is in no package registry this kit can reach. When Keras
cannot give it, :func:`ddlkit.data.load` uses these images instead, warns
with :class:`SyntheticDataWarning`, and marks ``info.synthetic``. They are
NOT CIFAR-10: results on them must never be reported as CIFAR-10 results.

Each class is a shape or texture (disk, square, ring, plus, diamond,
horizontal stripes, vertical stripes, triangle, X, checkerboard) in a
class-tinted colour, at a random position and size, on a random gradient
background with pixel noise. A small CNN learns it well above chance within
an epoch; colour alone does not separate the classes. Generation is
vectorised numpy and deterministic for a given seed.
"""

from __future__ import annotations

import numpy as np

SEED = 20_100_310
TRAIN_PER_CLASS = 5000
TEST_PER_CLASS = 1000
NUM_CLASSES = 10
SIZE = 32
_CHUNK = 2000
_NOISE = 30

#: Foreground tint per class (RGB); each image's colour is jittered around it.
_TINTS = np.array(
    [
        [70, 130, 220],
        [220, 60, 60],
        [230, 190, 60],
        [200, 120, 70],
        [150, 110, 60],
        [170, 170, 170],
        [80, 180, 80],
        [140, 80, 40],
        [60, 90, 160],
        [200, 200, 80],
    ],
    dtype=np.float32,
)


class SyntheticDataWarning(UserWarning):
    """Synthetic images are being used in place of a real data set."""


def _masks(label: int, dx: np.ndarray, dy: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Boolean (n, 32, 32) masks of class ``label``'s pattern centred at dx=dy=0."""
    ax, ay = np.abs(dx), np.abs(dy)
    inside_box = np.maximum(ax, ay) < r
    bar = r / 3
    if label == 0:  # disk
        return dx * dx + dy * dy < r * r
    if label == 1:  # square
        return inside_box
    if label == 2:  # ring
        return np.abs(np.sqrt(dx * dx + dy * dy) - r * 0.8) < bar
    if label == 3:  # plus
        return ((ax < bar) & (ay < r)) | ((ay < bar) & (ax < r))
    if label == 4:  # diamond
        return ax + ay < r
    if label == 5:  # horizontal stripes
        return inside_box & (np.floor((dy + r) / (r / 2.5)) % 2 == 0)
    if label == 6:  # vertical stripes
        return inside_box & (np.floor((dx + r) / (r / 2.5)) % 2 == 0)
    if label == 7:  # triangle, apex up
        return (dy < r) & (dy > -r) & (ax < (dy + r) / 2)
    if label == 8:  # X
        return inside_box & (np.abs(ax - ay) < bar)
    # 9: checkerboard
    cell = r / 2
    return inside_box & ((np.floor((dx + r) / cell) + np.floor((dy + r) / cell)) % 2 == 0)


def _render(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(labels)
    coords = np.arange(SIZE, dtype=np.float32)
    cx = rng.uniform(9, 23, n).astype(np.float32)[:, None, None]
    cy = rng.uniform(9, 23, n).astype(np.float32)[:, None, None]
    r = rng.uniform(6, 10, n).astype(np.float32)[:, None, None]
    dx = coords[None, None, :] - cx
    dy = coords[None, :, None] - cy
    mask = np.zeros((n, SIZE, SIZE), dtype=bool)
    for label in range(NUM_CLASSES):
        sel = labels == label
        if sel.any():
            mask[sel] = _masks(label, dx[sel], dy[sel], r[sel])

    fg = _TINTS[labels] + rng.normal(0, 45, (n, 3)).astype(np.float32)
    bg_a = rng.uniform(0, 255, (n, 3)).astype(np.float32)
    bg_b = rng.uniform(0, 255, (n, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    # Background: a linear ramp from colour a to colour b in a random direction.
    t = np.cos(angle) * ((coords[None, None, :] - 15.5) / 44.0) + 0.5
    t = t + np.sin(angle) * ((coords[None, :, None] - 15.5) / 44.0)
    out = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    for c in range(3):  # one channel at a time: contiguous (n, 32, 32) planes are fast
        plane = bg_a[:, c, None, None] + (bg_b - bg_a)[:, c, None, None] * t
        np.copyto(plane, np.broadcast_to(fg[:, c, None, None], plane.shape), where=mask)
        # Uniform pixel noise: integer draws are much cheaper than normals.
        plane += rng.integers(-_NOISE, _NOISE + 1, plane.shape, dtype=np.int16)
        np.clip(plane, 0, 255, out=plane)
        out[..., c] = plane
    return out


def _split(per_class: int, seed: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(NUM_CLASSES, dtype=np.uint8), per_class))
    x = np.empty((len(labels), SIZE, SIZE, 3), dtype=np.uint8)
    for start in range(0, len(labels), _CHUNK):
        x[start : start + _CHUNK] = _render(labels[start : start + _CHUNK], rng)
    return x, labels.reshape(-1, 1)


def generate(
    train_per_class: int = TRAIN_PER_CLASS,
    test_per_class: int = TEST_PER_CLASS,
    seed: int = SEED,
) -> dict[str, np.ndarray]:
    """The stand-in as ``{"x_train", "y_train", "x_test", "y_test"}`` uint8 arrays.

    The same arguments always give the same arrays. With the defaults the
    shapes are CIFAR-10's: x (50000, 32, 32, 3) and (10000, 32, 32, 3),
    y (50000, 1) and (10000, 1), 5000 and 1000 images per class.
    """
    train_seed, test_seed = np.random.SeedSequence(seed).spawn(2)
    x_train, y_train = _split(train_per_class, train_seed)
    x_test, y_test = _split(test_per_class, test_seed)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
