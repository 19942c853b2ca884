#!/usr/bin/env python3
"""Check a model from `dtf export --onnx` with ONNX's own tools.

Usage: python3 tests/onnx_check.py MODEL.onnx DATA.npz PREDICT.csv

MODEL.onnx is checked with the `onnx` checker (full check, with shape
inference), then run with onnxruntime on DATA.npz's `x_test` (raw features,
the data's own units: the preprocessing is inside the graph) against its
`y_test`. PREDICT.csv is `dtf predict`'s output on the same rows (`class,p0,…`).
Prints one JSON line:
{"accuracy": a, "examples": n, "max_abs_diff": d, "classes_agree": k,
 "opset": o, "input": [...], "output": [...]}
"""

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort


def dims(value_info):
    """A graph input's or output's dimensions: names or sizes."""
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def main():
    model_path, data_path, predict_path = sys.argv[1:4]
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    graph = model.graph
    (inp,), (out,) = graph.input, graph.output
    if inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        sys.exit(f"input {inp.name} is not float32")

    data = np.load(data_path)
    x = data["x_test"].reshape(len(data["x_test"]), -1).astype(np.float32)
    y = data["y_test"].astype(np.int64).reshape(-1)

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(["probabilities"], {"input": x})

    ours = np.loadtxt(predict_path, delimiter=",", skiprows=1, dtype=np.float64)
    dtf_classes = ours[:, 0].astype(np.int64)
    dtf_probabilities = ours[:, 1:]
    if dtf_probabilities.shape != probabilities.shape:
        sys.exit(f"dtf predict gave {dtf_probabilities.shape}, onnxruntime {probabilities.shape}")

    classes = probabilities.argmax(axis=1)
    print(json.dumps({
        "accuracy": float((classes == y).mean()),
        "examples": int(len(y)),
        "max_abs_diff": float(np.abs(probabilities - dtf_probabilities).max()),
        "classes_agree": int((classes == dtf_classes).sum()),
        "row_sums_max_error": float(np.abs(probabilities.sum(axis=1) - 1).max()),
        "opset": int(opset),
        "input": [inp.name] + dims(inp),
        "output": [out.name] + dims(out),
    }))


if __name__ == "__main__":
    main()
