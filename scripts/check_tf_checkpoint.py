#!/usr/bin/env python3
"""TensorFlow itself checks dtf's TensorFlow checkpoints, both ways.

  check_tf_checkpoint.py read DTF_MODEL_FILE TF_DIR
      (a) tf.train.latest_checkpoint(TF_DIR) and tf.train.load_checkpoint read
      what `dtf export --tf-checkpoint TF_DIR DTF_MODEL_FILE` wrote; every
      tensor of the dtf checkpoint (its model file and its .ema. sibling, read
      with safetensors + numpy, not with dtf) must be there under the same
      name, dtype and shape, bit for bit, and nothing else; and
      tf.compat.v1.train.Saver() restores them into the reference program's
      graph (its variables, global step, EMA and optimizer made as it makes
      them), with the same values. Also checks that
      tf.train.latest_checkpoint on the dtf checkpoint directory does not
      return a .safetensors file.

  check_tf_checkpoint.py write OUT_DIR LAYERS STEP
      (b) tf.compat.v1.train.Saver, in graph mode, writes OUT_DIR/model.ckpt-STEP
      of the reference program's variables for LAYERS (e.g. 64,16,4):
      layer<k>/weights, layer<k>/biases, global_step (int64) and the
      ExponentialMovingAverage shadows. Values: the flat index k of each
      element gives the variable (k - 500) / 64 + layer / 8, and its shadow
      that minus 0.5 (exact in float32: what tests/it checks bit for bit).
      OUT_DIR/checkpoint names it with a relative path, so the directory can
      be moved (tests/fixtures/tf-checkpoint is one such directory).

Prints one JSON line with what was checked or written; exits non-zero on a
mismatch. Needs tensorflow (or tensorflow-cpu), numpy and safetensors: run it
with the venv scripts/check_tf_checkpoint.sh makes.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def dtf_tensors(model_file):
    from safetensors.numpy import load_file

    ema_file = model_file[: -len(".safetensors")] + ".ema.safetensors"
    out = dict(load_file(model_file))
    out.update(load_file(ema_file))
    return out


def read(model_file, tf_dir):
    prefix = tf.train.latest_checkpoint(tf_dir)
    if prefix is None:
        sys.exit(f"tf.train.latest_checkpoint({tf_dir!r}) found nothing")
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    want = dtf_tensors(model_file)
    problems = []
    if set(shapes) != set(want):
        problems.append(
            f"names differ: only in TF {sorted(set(shapes) - set(want))}, "
            f"only in dtf {sorted(set(want) - set(shapes))}"
        )
    for name, value in sorted(want.items()):
        if name not in shapes:
            continue
        got = reader.get_tensor(name)
        if list(shapes[name]) != list(value.shape):
            problems.append(f"{name}: shape {shapes[name]} vs {list(value.shape)}")
        if dtypes[name].as_numpy_dtype != value.dtype:
            problems.append(f"{name}: dtype {dtypes[name].name} vs {value.dtype}")
        if got.tobytes() != np.ascontiguousarray(value).tobytes():
            problems.append(f"{name}: values differ")
    # And tf.compat.v1.train.Saver() restores it into the reference
    # program's own graph: its variables made as it makes them
    # (variable_scope layer<k>, get_variable, the global step, the
    # ExponentialMovingAverage's shadows, the optimizer's slots).
    restored = restore_into_reference_graph(prefix, shapes)
    if set(restored) != set(want):
        problems.append(
            f"the reference graph's variables differ: only in the graph "
            f"{sorted(set(restored) - set(want))}, only in dtf {sorted(set(want) - set(restored))}"
        )
    for name, value in sorted(want.items()):
        if name in restored and restored[name].tobytes() != np.ascontiguousarray(value).tobytes():
            problems.append(f"{name}: Saver.restore gives other values")
    dtf_dir = os.path.dirname(os.path.abspath(model_file))
    dtf_latest = tf.train.latest_checkpoint(dtf_dir)
    if dtf_latest is not None and dtf_latest.endswith(".safetensors"):
        problems.append(
            f"tf.train.latest_checkpoint({dtf_dir!r}) returns {dtf_latest}, a safetensors file"
        )
    step = int(reader.get_tensor("global_step"))
    report = {
        "check": "read",
        "tensorflow": tf.__version__,
        "prefix": prefix,
        "tensors": len(shapes),
        "names": sorted(shapes),
        "saver_restored_into_reference_graph": len(restored),
        "global_step": step,
        "dtf_dir_latest_checkpoint": dtf_latest,
        "ok": not problems,
        "problems": problems,
    }
    print(json.dumps(report))
    return 0 if not problems else 1


def restore_into_reference_graph(prefix, shapes):
    tf1 = tf.compat.v1
    layers = sorted(
        (n for n in shapes if n.endswith("/weights")),
        key=lambda n: int(n.split("/")[0][len("layer"):]),
    )
    widths = [shapes[layers[0]][0]] + [shapes[n][1] for n in layers]
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf1.train.get_or_create_global_step()
        variables = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            with tf1.variable_scope(f"layer{i + 1}"):
                variables.append(tf1.get_variable("weights", [a, b]))
                variables.append(tf1.get_variable("biases", [b]))
        tf1.train.ExponentialMovingAverage(0.99, global_step).apply(variables)
        loss = tf.add_n([tf.reduce_sum(v) for v in variables])
        if "beta1_power" in shapes:
            tf1.train.AdamOptimizer(0.01).minimize(loss, global_step)
        elif any(n.endswith("/Momentum") for n in shapes):
            tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step)
        elif any(n.endswith("/Adagrad") for n in shapes):
            tf1.train.AdagradOptimizer(0.01).minimize(loss, global_step)
        saver = tf1.train.Saver()
        names = {v.op.name: v for v in tf1.global_variables()}
        with tf1.Session(graph=graph) as sess:
            saver.restore(sess, prefix)
            return sess.run(names)


def reference_value(shape, layer):
    k = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return ((k - 500.0) / 64.0 + layer / 8.0).astype(np.float32)


def write(out_dir, layers, step):
    tf1 = tf.compat.v1
    os.makedirs(out_dir, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf1.train.get_or_create_global_step()
        variables, finals = [], []
        for i, (a, b) in enumerate(zip(layers, layers[1:])):
            with tf1.variable_scope(f"layer{i + 1}"):
                for name, shape in (("weights", [a, b]), ("biases", [b])):
                    final = reference_value(shape, i + 1)
                    # Created at final - 1: the shadow starts there, and one
                    # EMA update with decay 0.5 after the assignment below
                    # leaves it at final - 0.5.
                    v = tf1.get_variable(name, initializer=tf.constant(final - 1.0))
                    variables.append(v)
                    finals.append(final)
        ema = tf1.train.ExponentialMovingAverage(decay=0.5)
        with tf.control_dependencies(
            [tf1.assign(v, f) for v, f in zip(variables, finals)]
        ):
            update = ema.apply(variables)
        saver = tf1.train.Saver(save_relative_paths=True)
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(update)
            sess.run(tf1.assign(global_step, step))
            prefix = saver.save(
                sess,
                os.path.join(out_dir, "model.ckpt"),
                global_step=step,
                write_meta_graph=False,
            )
    names = sorted(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
    print(
        json.dumps(
            {
                "check": "write",
                "tensorflow": tf.__version__,
                "prefix": prefix,
                "layers": layers,
                "global_step": step,
                "tensors": names,
                "ok": True,
            }
        )
    )
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "read":
        return read(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "write":
        layers = [int(w) for w in argv[3].split(",")]
        return write(argv[2], layers, int(argv[4]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
