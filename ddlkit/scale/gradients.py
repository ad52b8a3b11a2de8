"""When each gradient is ready during the backward pass: the order a model's bytes can leave.

    dk.scale.gradients.of_keras(keras_model)     # from a built Keras model (counted, not run)
    dk.scale.model("vgg16").gradients            # the public models' profiles, stored below

The backward pass runs the layers in reverse. A layer's weight gradient is ready once the
backward pass has done the layers after it and itself; a Conv2D or Dense layer's backward pass
costs two products the size of its forward one (gradients with respect to its input and to its
weights), every other layer nothing (:func:`ddlkit.bench.ratio.forward_flops` counts the
same layers). A profile is a tuple of ``(share, bytes, tensors)``, in the order the backward
pass produces them: ``share`` is the fraction of the backward pass done when those gradients
are ready, ``bytes`` their float32 size, ``tensors`` how many gradient tensors they are.

Consecutive layers ready within :data:`BIN` of the backward pass of each other, and holding at
most :data:`MERGE_BYTES` together, are stored as one entry, ready when its last layer is (half
a per cent of a VGG-16 backward pass on a P100 is under 2 ms, less than one of Horovod's 5 ms
cycles, which would fuse them anyway). The stored
profiles (:data:`PUBLIC`) were produced by ``python -m ddlkit.scale.gradients`` on
``tf.keras.applications`` built with ``weights=None`` (the models of
:data:`ddlkit.scale.models.PUBLIC`); the tests check their totals against the models' sizes.

What the profiles show: VGG-16's three dense layers hold 89% of its gradient bytes and are
ready within the first per cent of its backward pass, so nearly all its bytes can leave while
the convolutions' backward pass runs; ResNet's and Inception's bytes come out spread over the
whole pass, the last ones at its end.
"""

from __future__ import annotations

from ddlkit.errors import ConfigError

BIN = 0.005  # share of the backward pass within which consecutive layers are merged
MERGE_BYTES = 4 * 2**20  # ... while they hold at most this many bytes together
BYTES_PER_PARAM = 4  # float32 gradients

Profile = tuple[tuple[float, int, int], ...]


def check(profile, what: str = "gradients") -> Profile:
    """A profile as stored: shares rising in [0, 1], bytes and tensors >= 0 (ConfigError)."""
    out, last = [], 0.0
    for entry in profile:
        if len(entry) != 3:
            raise ConfigError(
                f"{what}: entry {entry!r} is not (share, bytes, tensors). "
                f"Fix: e.g. ((0.5, 4e6, 2), (1.0, 4e6, 2))"
            )
        share, nbytes, tensors = entry
        if not 0 <= share <= 1 or share < last:
            raise ConfigError(
                f"{what}: share {share!r} after {last!r}: shares are the fraction of the backward "
                f"pass done, rising from 0 to 1. Fix: list the gradients in the order the "
                f"backward pass produces them"
            )
        if nbytes < 0 or tensors < 0:
            raise ConfigError(f"{what}: {entry!r} has negative bytes or tensors. Fix: >= 0")
        out.append((float(share), int(nbytes), int(tensors)))
        last = share
    if not out:
        raise ConfigError(f"{what} is empty. Fix: at least one (share, bytes, tensors)")
    return tuple(out)


def uniform(nbytes: float, tensors: int) -> Profile:
    """The assumption where a model's layers are not known: ``tensors`` equal gradients, ready
    at even intervals of the backward pass, the last at its end."""
    k = max(1, int(tensors))
    return tuple(((i + 1) / k, int(round(nbytes / k)), 1) for i in range(k))


def _merge(rows) -> Profile:
    """(share, bytes, tensors) rows in backward order, merged within :data:`BIN`."""
    out: list[list] = []
    for share, nbytes, tensors in rows:
        if out and share - out[-1][3] <= BIN and out[-1][1] + nbytes <= MERGE_BYTES:
            out[-1][0] = share
            out[-1][1] += nbytes
            out[-1][2] += tensors
        else:
            out.append([share, nbytes, tensors, share])  # the last item: the group's start
    return tuple((round(s, 4), b, t) for s, b, t, _ in out if b or t)


def of_keras(model) -> Profile:
    """The profile of a built Keras model: layers in reverse, each ready after its backward
    pass (2 x forward FLOPs for Conv2D and Dense, as :func:`ddlkit.bench.ratio.forward_flops`
    counts them)."""
    from ddlkit.bench.ratio import forward_flops

    rows, done = [], 0
    layers = list(model.layers)
    costs = []
    for layer in layers:
        one = type("One", (), {"layers": [layer]})()
        costs.append(2 * forward_flops(one))
    total = sum(costs) or 1
    for layer, cost in zip(reversed(layers), reversed(costs), strict=True):
        done += cost
        weights = layer.trainable_weights
        nbytes = sum(int(_size(w)) for w in weights) * BYTES_PER_PARAM
        if weights:
            rows.append((done / total, nbytes, len(weights)))
    return _merge(rows)


def _size(variable) -> int:
    n = 1
    for d in variable.shape:
        n *= int(d)
    return n


def _public() -> dict[str, Profile]:
    from ddlkit.scale._gradient_data import DATA

    return {name: check(p, name) for name, p in DATA.items()}


PUBLIC: dict[str, Profile] = _public()


def _generate() -> str:  # pragma: no cover - run by hand, needs TensorFlow
    import tf_keras as keras

    apps = {
        "resnet50": keras.applications.ResNet50,
        "resnet101": keras.applications.ResNet101,
        "resnet152": keras.applications.ResNet152,
        "inception_v3": keras.applications.InceptionV3,
        "vgg16": keras.applications.VGG16,
    }
    lines = ['"""Generated by python -m ddlkit.scale.gradients: see ddlkit/scale/gradients.py."""']
    lines += ["", "# fmt: off", "DATA = {"]
    for name, build in apps.items():
        profile = of_keras(build(weights=None))
        lines.append(f"    {name!r}: (")
        row = "       "
        for entry in profile:
            item = f" ({entry[0]}, {entry[1]}, {entry[2]}),"
            if len(row) + len(item) > 99:
                lines.append(row)
                row = "       "
            row += item
        lines += [row, "    ),"]
    lines += ["}", "# fmt: on", ""]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(_generate(), end="")
