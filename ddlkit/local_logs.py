"""``fit`` under MultiWorkerMirroredStrategy without a metric all-reduce every step.

tf-keras' ``Model.fit`` logs each step's metrics from ``metric.result()``, and tf-keras
runs that in a ``merge_call`` that all-reduces the metric's variables across the workers
(they are sync-on-read). For the kit's loss and accuracy that is 4 all-reduces a step
(each metric's total and count) besides the gradients' one. Between workers on CPUs each
is a gRPC round trip that every worker waits for, small against a GPU step but not against
a small model's CPU step. :func:`local_step_logs` gives the same layers a
``compute_metrics`` that updates the same metrics and logs this worker's own running
values, as a Horovod rank does; notebook 08 (section 12) measures what that saves on the
learner's machine.

What stays synchronised: at each epoch end ``fit`` reads the metrics again outside the
step, in cross-replica context, so the epoch's logs (``History``, epoch callbacks) and
``evaluate``'s result are every worker's together; the gradients are all-reduced as
before. Only the per-step logs (batch callbacks, the live dashboard's step records) are
this worker's: with equal batches, the mean of the workers' last step logs of an epoch is
its epoch log.

Per-step logs that differ between workers matter to batch-level callbacks that act on them
(``TerminateOnNaN``, an early stop of one's own): two workers may decide differently, and one
that stops while the other waits in the next collective hangs the job. Epoch-level callbacks
see the synchronised epoch logs.

The idiom a learner writes is a ``tf.keras.Model`` subclass with this ``compute_metrics``
(notebook 08 writes it out); this module holds the kit's copy for its scripts.
"""

from __future__ import annotations

import functools

from ddlkit.backend import active_flavour, keras
from ddlkit.errors import ConfigError


def local_step_logs(model):
    """``model``'s layers (shared: the same weights) as a model whose ``fit`` logs this
    worker's running metrics per step, with no all-reduce for them. Build it inside
    ``strategy.scope()`` and compile it instead of ``model``."""
    if active_flavour() != "tf-keras":
        raise ConfigError(
            "local_step_logs needs tf-keras: it changes how tf-keras' fit logs metrics, and "
            "Keras 3's fit fails under MultiWorkerMirroredStrategy anyway. Fix: unset "
            "DDLKIT_KERAS (or set DDLKIT_KERAS=2) before importing ddlkit."
        )
    if not getattr(model, "inputs", None):
        raise ConfigError(
            f"local_step_logs needs a model with known inputs; {model.name!r} has none (a "
            f"subclassed model, or a Sequential without an input shape). Fix: build it with "
            f"keras.Input (every ddlkit.models builder does), or give your own subclass the "
            f"compute_metrics of ddlkit.local_logs."
        )
    return _model_class()(inputs=model.inputs, outputs=model.outputs, name=model.name)


@functools.cache
def _model_class():
    """The Model subclass, built on first use from the Keras in use."""

    class LocalStepLogs(keras().Model):
        """A functional model whose per-step logs are this worker's own metrics."""

        def compute_metrics(self, x, y, y_pred, sample_weight):
            self.compiled_metrics.update_state(y, y_pred, sample_weight)
            logs = {}
            for metric in self.metrics:
                # The class's result(), not metric.result(): tf-keras wraps the instance's
                # in a merge_call that all-reduces the metric's variables across workers.
                value = type(metric).result(metric)
                logs.update(value if isinstance(value, dict) else {metric.name: value})
            return logs

    return LocalStepLogs
