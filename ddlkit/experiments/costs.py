"""What a model costs a data-parallel step, read from the model and TensorFlow's own counts.

    costs = model_costs(model, batch)      # a built, compiled tf-keras model and one batch
    costs.gradient_bytes                   # {"float32": 1_234_560}: one copy of the gradients
    costs.forward_flops, costs.train_flops # per example, TensorFlow's profiler

Everything here is measured on the model, none of it from a formula about layers:

- **Gradients**: one per trainable variable, of its shape and dtype (under a
  ``mixed_float16`` policy the variables, so their gradients, stay float32: Keras' mixed
  precision guide); their bytes by dtype, and every tensor's size, which decides how
  Horovod's fusion buffer packs them.
- **FLOPs**: TensorFlow's profiler (``tf.compat.v1.profiler.profile`` with
  ``ProfileOptionBuilder.float_operation()``) on two graphs of the model at this batch: the
  forward pass, and the training step's forward pass, loss and gradients. It counts the ops
  that register a ``flops`` statistic (``MatMul``, ``Conv2D`` and their gradients, element-wise
  arithmetic...); an op without one counts 0. ``Einsum`` registers none
  (``tensorflow/python/profiler/internal/flops_registry.py``), yet it is every product of
  ``MultiHeadAttention`` and ``EinsumDense``: :func:`einsum_flops` adds 2 FLOPs per
  multiply-add of each, from its equation and shapes. Other unregistered ops still count 0.
- **When each gradient is ready** in the backward pass (what an all-reduce can overlap):
  :func:`ddlkit.scale.gradients.of_keras`, from the model's Conv2D and Dense layers, where
  those layers hold at least :data:`COVERED` of the forward FLOPs TensorFlow counts; else
  ready at even intervals (``dk.scale.gradients.uniform``), and the costs say so.
- **Activations**: the bytes of every tensor the forward pass makes whose first dimension is
  the batch, per example: what backpropagation may keep until the backward pass uses it
  (ops that only rename or reshape a tensor are left out). An upper bound: TensorFlow frees
  what the gradients do not need.
"""

from __future__ import annotations

from ddlkit.experiments.spec import GradientTensor, ModelCosts

COVERED = 0.9  # share of the forward FLOPs the layer count must explain to time the gradients

# Ops whose output is another op's tensor under a new name or shape: no new memory.
ALIASES = frozenset(
    {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
     "Placeholder", "Const", "ReadVariableOp", "NoOp", "Shape", "Cast"}
)  # fmt: skip


def spec_of(batch, size: int):
    """``tf.TensorSpec``s of ``batch`` (any structure) with its first dimension ``size``."""
    import tensorflow as tf

    return tf.nest.map_structure(
        lambda t: tf.TensorSpec((size, *t.shape[1:]), t.dtype), batch
    )  # fmt: skip


def profiled_flops(graph) -> int:
    """TensorFlow's profiler's count of a graph's floating-point operations."""
    import tensorflow as tf

    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"  # the total only, no table printed
    return int(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)


def einsum_flops(graph) -> int:
    """2 x the multiply-adds of every two-operand ``Einsum`` of the graph: the product of the
    sizes of all its indices (those kept and those summed over)."""
    total = 0
    for op in graph.get_operations():
        if op.type != "Einsum" or len(op.inputs) != 2:
            continue
        equation = op.get_attr("equation").decode()
        operands = equation.split("->")[0].split(",")
        sizes: dict[str, int] = {}
        for letters, tensor in zip(operands, op.inputs, strict=True):
            shape = tensor.shape
            if "." in letters or not shape.is_fully_defined() or len(letters) != shape.rank:
                break  # ellipsis or unknown shape: left at 0, as the profiler leaves it
            for letter, dim in zip(letters, shape, strict=True):
                sizes[letter] = int(dim)
        else:
            product = 1
            for dim in sizes.values():
                product *= dim
            total += 2 * product
    return total


def graph_flops(graph) -> int:
    """The profiler's count plus the einsums it does not count."""
    return profiled_flops(graph) + einsum_flops(graph)


def activation_bytes(graph, size: int) -> int:
    """Bytes of the forward pass's tensors whose first dimension is the batch ``size``."""
    total = 0
    for op in graph.get_operations():
        if op.type in ALIASES:
            continue
        for out in op.outputs:
            shape = out.shape
            if shape.rank and shape.is_fully_defined() and shape[0] == size:
                total += shape.num_elements() * out.dtype.size
    return total


def gradient_tensors(model) -> tuple[GradientTensor, ...]:
    """One gradient per trainable variable: its name, shape and dtype."""
    return tuple(
        GradientTensor(v.name, tuple(int(d) for d in v.shape), v.dtype.name)
        for v in model.trainable_variables
    )


def model_costs(model, batch: tuple, *, name: str = "model") -> ModelCosts:
    """The costs of ``model`` (built and compiled) for one ``(features, labels)`` batch."""
    import tensorflow as tf

    features, labels = batch[0], batch[1]
    size = int(tf.nest.flatten(features)[0].shape[0])
    x_spec, y_spec = spec_of(features, size), spec_of(labels, size)

    def forward(x):
        return model(x, training=True)

    def train(x, y):
        with tf.GradientTape() as tape:
            predicted = model(x, training=True)
            loss = model.compute_loss(x, y, predicted)
        return tape.gradient(loss, model.trainable_variables)

    fwd_graph = tf.function(forward).get_concrete_function(x_spec).graph
    train_graph = tf.function(train).get_concrete_function(x_spec, y_spec).graph
    forward_total = graph_flops(fwd_graph)
    readiness, basis = gradient_readiness(model, forward_total / size)
    optimizer_bytes = sum(
        int(v.shape.num_elements()) * v.dtype.size for v in _optimizer_variables(model)
    )
    return ModelCosts(
        name=name,
        batch=size,
        params=int(sum(v.shape.num_elements() for v in model.trainable_variables)),
        gradients=gradient_tensors(model),
        forward_flops=forward_total / size,
        train_flops=graph_flops(train_graph) / size,
        activation_bytes=activation_bytes(fwd_graph, size) / size,
        weight_bytes=sum(int(v.shape.num_elements()) * v.dtype.size for v in model.weights),
        optimizer_bytes=optimizer_bytes,
        policy=_policy(model),
        readiness=readiness,
        readiness_basis=basis,
    )


def gradient_readiness(model, forward_flops: float) -> tuple[tuple, str]:
    """When each gradient is ready, and how that was found (see the module docstring)."""
    from ddlkit.bench.ratio import forward_flops as layer_flops
    from ddlkit.scale import gradients

    counted = layer_flops(model) if hasattr(model, "layers") else 0
    share = counted / forward_flops if forward_flops else 0.0
    if share >= COVERED:
        return gradients.of_keras(model), f"by layer ({share:.0%} of the FLOPs in Conv2D/Dense)"
    nbytes = sum(int(v.shape.num_elements()) * 4 for v in model.trainable_variables)
    found = gradients.uniform(nbytes, len(model.trainable_variables))
    return found, f"even intervals, assumed (Conv2D/Dense hold {share:.0%} of the FLOPs)"


def _optimizer_variables(model) -> list:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return []
    found = optimizer.variables
    return list(found() if callable(found) else found)


def _policy(model) -> str:
    policy = getattr(model, "dtype_policy", None) or getattr(model, "_dtype_policy", None)
    return getattr(policy, "name", str(policy)) if policy is not None else "float32"
