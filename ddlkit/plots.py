"""Static plots a learner looks at once: sample images, comparisons."""

from __future__ import annotations

import numpy as np


def sample_grid(x: np.ndarray, y: np.ndarray, class_names, *, per_class: int = 6, seed: int = 0):
    """Pick up to `per_class` examples of each class (pure): returns (images, labels) arrays."""
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    labels = np.asarray(y).reshape(-1)
    rng = np.random.default_rng(seed)
    picks = []
    for cls in range(len(class_names)):
        idx = np.flatnonzero(labels == cls)
        if idx.size:
            picks.append(rng.choice(idx, size=min(per_class, idx.size), replace=False))
    order = np.concatenate(picks) if picks else np.array([], dtype=int)
    return np.asarray(x)[order], labels[order]


def show_samples(name: str, *, per_class: int = 6, seed: int = 0, split: str = "train"):
    """Draw a grid of sample images of data set `name`: one row per class.

    Returns the matplotlib Figure (Jupyter shows it). The title names the
    data's real source, so a synthetic stand-in is never mistaken for the
    real data set.
    """
    import matplotlib.pyplot as plt

    from ddlkit import data

    loaded = data.load(name)
    (x_train, y_train), (x_test, y_test) = loaded
    x, y = (x_train, y_train) if split == "train" else (x_test, y_test)
    info = loaded.info
    images, labels = sample_grid(x, y, info.class_names, per_class=per_class, seed=seed)
    n_classes = len(info.class_names)
    fig, axes = plt.subplots(
        n_classes, per_class, figsize=(per_class * 0.9, n_classes * 0.95), squeeze=False
    )
    for ax in axes.flat:
        ax.axis("off")
    counts = {c: 0 for c in range(n_classes)}
    for img, label in zip(images, labels, strict=True):
        col = counts[int(label)]
        counts[int(label)] += 1
        ax = axes[int(label)][col]
        ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
        if col == 0:
            ax.text(
                -4,
                img.shape[0] / 2,
                info.class_names[int(label)],
                ha="right",
                va="center",
                fontsize=8,
            )
    fig.suptitle(f"{info.display_name}: {per_class} {split} images per class", fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # shown by Jupyter's display of the returned figure, once
    return fig
