"""Check the user's model file in one process before any worker starts, and count its costs.

    python -m ddlkit.experiments.probe --file my_model.py --batch-size 64 --out probe.json

Imports the file, builds and compiles the model, takes one batch of ``dataset(batch_size)``,
runs one training step on it as ``fit`` does (and one evaluation batch of
``eval_dataset`` if the file has it), checks that the loss is reduced the way every strategy
needs, then counts the model's costs (:mod:`.costs`) and this process's peak memory. Writes
``{"ok": true, "costs": ..., "metrics": [...], "eval": bool}`` or ``{"ok": false, "error":
"<what, where, the fix>"}``; :func:`ddlkit.experiments.run.probe` reads it. A separate
process so the notebook's own TensorFlow is left alone and the memory measured is one
worker's.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)
from ddlkit.experiments import user_file
from ddlkit.experiments.user_file import UserFileError

# tf-keras scales a loss by 1 / replicas only when it is reduced SUM_OVER_BATCH_SIZE (or AUTO,
# which means it under fit): compile_utils.LossesContainer.__call__ and
# losses_utils.scale_loss_for_distribution. A SUM (or unreduced) loss gives each replica the
# sum over its batch, and the all-reduce then sums them: the gradient grows with the workers
# under TF's strategies but not under Horovod, which averages.
REDUCED_PER_REPLICA = ("auto", "sum_over_batch_size")


def check_loss(model, where: str) -> None:
    """One error if the compiled loss is not reduced per replica as the strategies need."""
    import tensorflow as tf

    for loss in tf.nest.flatten(model.loss):  # what compile() was given: names, functions, Losses
        reduction = getattr(loss, "reduction", None)
        if reduction is not None and str(reduction).lower() not in REDUCED_PER_REPLICA:
            raise UserFileError(
                f"{where}: the loss {getattr(loss, 'name', loss)!r} is reduced by "
                f"{reduction!r}. Keras divides a loss by the replicas only when it is reduced "
                f"'sum_over_batch_size', so under MirroredStrategy or MultiWorkerMirrored the "
                f"gradient would grow with the workers (Horovod averages instead, and the "
                f"strategies would train different models). Fix: leave the loss's reduction at "
                f"its default"
            )


def probe(args: argparse.Namespace) -> dict:
    import tensorflow as tf

    from ddlkit.experiments.costs import model_costs

    module = user_file.load(args.file)
    name = Path(args.file).name
    model = user_file.build(module, args.model_fn, loss=args.loss, optimizer=args.optimizer)
    check_loss(model, f"{name}: {args.model_fn}()")
    ds = user_file.train_data(module, args.data_fn, args.batch_size, None)
    try:
        batch = next(iter(ds))
    except StopIteration:
        raise UserFileError(
            f"{name}: {args.data_fn}({args.batch_size}) is empty. Fix: return a dataset with "
            f"at least one batch (the kit repeats it)"
        ) from None
    if int(tf.nest.flatten(batch[0])[0].shape[0]) != args.batch_size:
        raise UserFileError(
            f"{name}: {args.data_fn}({args.batch_size})'s first batch has "
            f"{int(tf.nest.flatten(batch[0])[0].shape[0])} examples, not {args.batch_size}. "
            f"Fix: .batch(batch_size, drop_remainder=True) on a data set of at least that many"
        )
    try:
        model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserFileError(
            f"{name}: one batch of {args.data_fn}() does not train the model of "
            f"{args.model_fn}(): {type(exc).__name__}: {first}. Fix: make the features "
            f"match the model's inputs and the labels its outputs and loss "
            f"(features {_shapes(batch[0])}, labels {_shapes(batch[1])})"
        ) from exc
    evaluated = False
    held_out = user_file.eval_data(module, args.eval_fn, args.batch_size)
    if held_out is not None:
        try:
            model.evaluate(held_out.take(1), verbose=0)
        except Exception as exc:
            raise UserFileError(
                f"{name}: one batch of {args.eval_fn or 'eval_dataset'}() does not evaluate: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}. Fix: give it the "
                f"same structure as {args.data_fn}()"
            ) from exc
        evaluated = True
    costs = model_costs(model, batch, name=Path(args.file).stem)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    out = costs.to_json() | {"peak_rss": peak}
    return {"ok": True, "costs": out, "metrics": list(model.metrics_names), "eval": evaluated}


def _shapes(x) -> str:
    import tensorflow as tf

    return str(tf.nest.map_structure(lambda t: tuple(t.shape), x))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True)
    parser.add_argument("--model-fn", default="build_model")
    parser.add_argument("--data-fn", default="dataset")
    parser.add_argument("--eval-fn", default=None)
    parser.add_argument("--loss", default=None)
    parser.add_argument("--optimizer", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        result = probe(args)
    except UserFileError as exc:
        result = {"ok": False, "error": str(exc)}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)
    return 0 if result["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
