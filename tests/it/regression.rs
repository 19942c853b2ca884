//! A real-valued label (`model.task = "regression"`): `dtf local` tells it from the CSV,
//! trains one output on the mean squared error and reports RMSE and MAE; `dtf predict`,
//! `dtf eval` and `dtf inspect` on its checkpoint.

use crate::first_run::{dtf_in, json};
use std::path::{Path, PathBuf};

/// A noisy linear function of 4 features (seeded), label column `price`, as
/// `houses_train.csv` (600 rows) and `houses_test.csv` (150) in `dir`. Returns the training
/// file and the test file's labels.
fn houses(dir: &Path) -> (PathBuf, Vec<f64>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let weights = [2.0, -1.5, 0.5, 3.0];
    let mut write = |name: &str, rows: usize| {
        let mut text = String::from("rooms,age,floor,area,price\n");
        let mut labels = Vec::new();
        for _ in 0..rows {
            let x: Vec<f64> = (0..4).map(|_| rng.random_range(-1.0..1.0)).collect();
            let noise = rng.random_range(-0.1..0.1);
            let y = 5.0 + x.iter().zip(weights).map(|(x, w)| x * w).sum::<f64>() + noise;
            let cells: Vec<String> = x.iter().map(|v| format!("{v:.4}")).collect();
            text.push_str(&format!("{},{y:.4}\n", cells.join(",")));
            labels.push(format!("{y:.4}").parse().unwrap());
        }
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        (path, labels)
    };
    let (_, test) = write("houses_test.csv", 150);
    let (train, _) = write("houses_train.csv", 600);
    (train, test)
}

/// The standard deviation of `v`.
fn std_dev(v: &[f64]) -> f64 {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn a_real_valued_label_trains_as_regression_and_predict_prints_values() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let (train, labels) = houses(dir.path());
    let test = dir.path().join("houses_test.csv");
    let ckpt = dir.path().join("ckpt");
    let std = std_dev(&labels);
    let args = [
        "local",
        "--data",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--label",
        "price",
        "--optimizer",
        "adam",
        "--learning-rate",
        "0.02",
        "--hidden",
        "16",
        "--batch-size",
        "32",
        "--steps",
        "400",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ];
    let out = dtf_in(&tmp, &args, &[]);
    assert!(out.status.success(), "dtf local failed:\n{}", out.stderr);
    assert!(
        out.stderr
            .contains("dtf local: label column \"price\" holds real numbers (such as ")
            && out.stderr.contains("regression"),
        "{}",
        out.stderr
    );
    let report = json(&out);
    assert_eq!(report["outcome"], "trained", "{report}");
    assert_eq!(report["layers"], serde_json::json!([4, 16, 1]), "{report}");
    for key in ["test_rmse", "ema_test_rmse", "test_mae", "ema_test_mae"] {
        assert!(report[key].as_f64().is_some(), "{key}: {report}");
    }
    for key in ["test_accuracy", "ema_test_accuracy"] {
        assert!(report.get(key).is_none(), "{key}: {report}");
    }
    let rmse = report["test_rmse"].as_f64().unwrap();
    assert!(
        rmse < 0.5 * std,
        "test RMSE {rmse} is not well below the label's std {std}: {report}"
    );
    assert!(report["test_mae"].as_f64().unwrap() <= rmse, "{report}");

    // dtf predict: one value per row, near the label.
    let predict = |extra: &[&str]| {
        let mut args = vec![
            "predict",
            ckpt.to_str().unwrap(),
            "--input",
            test.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = dtf_in(&tmp, &args, &[]);
        assert!(out.status.success(), "dtf predict failed:\n{}", out.stderr);
        out.stdout
    };
    let text = predict(&[]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "prediction", "{text}");
    assert_eq!(lines.len(), 151, "{text}");
    let predicted: Vec<f64> = lines[1..].iter().map(|l| l.parse().unwrap()).collect();
    let mse = predicted
        .iter()
        .zip(&labels)
        .map(|(p, y)| (p - y).powi(2))
        .sum::<f64>()
        / labels.len() as f64;
    assert!(mse.sqrt() < 0.5 * std, "predict's RMSE {}", mse.sqrt());
    let json_lines = predict(&["--json"]);
    for (line, p) in json_lines.lines().zip(&predicted) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            v["prediction"].as_f64().unwrap() as f32,
            *p as f32,
            "{line}"
        );
    }

    // dtf export --onnx: the raw output, no Softmax, that onnxruntime computes as predict.
    let onnx = dir.path().join("model.onnx");
    let out = dtf_in(
        &tmp,
        &[
            "export",
            ckpt.to_str().unwrap(),
            "--onnx",
            onnx.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "dtf export failed:\n{}", out.stderr);
    let check = onnx_check(&onnx, &test, &predicted);
    assert_eq!(
        check["output"],
        serde_json::json!(["prediction", "batch", 1]),
        "{check}"
    );
    assert_eq!(
        check["ops"].as_array().unwrap().last().unwrap(),
        "Identity",
        "{check}"
    );
    assert!(
        !check["ops"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "Softmax" || o == "ArgMax"),
        "{check}"
    );
    assert!(check["max_abs_diff"].as_f64().unwrap() < 1e-4, "{check}");

    // dtf eval: RMSE and MAE, no accuracy; the EMA's RMSE is the summary's.
    let out = dtf_in(
        &tmp,
        &[
            "eval",
            ckpt.to_str().unwrap(),
            "--data",
            test.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "dtf eval failed:\n{}", out.stderr);
    let ev = json(&out);
    assert_eq!(ev["examples"], 150, "{ev}");
    assert_eq!(ev["ema_rmse"], report["ema_test_rmse"], "{ev}");
    assert!(ev.get("accuracy").is_none(), "{ev}");

    // dtf inspect shows the task.
    let out = dtf_in(&tmp, &["inspect", ckpt.to_str().unwrap()], &[]);
    assert!(out.status.success(), "dtf inspect failed:\n{}", out.stderr);
    assert!(out.stdout.contains("task=regression"), "{}", out.stdout);

    // Told to classify, the same label is today's clear error.
    let out = dtf_in(
        &tmp,
        &[
            "local",
            "--data",
            train.to_str().unwrap(),
            "--label",
            "price",
            "--set",
            "model.task=classification",
            "--steps",
            "1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("houses_train.csv")
            && out.stderr.contains("column \"price\"")
            && out.stderr.contains("is not a class index"),
        "{}",
        out.stderr
    );
}

/// Checks the ONNX model at `model` with ONNX's checker and runs it with onnxruntime on the
/// features of the CSV `test` (its last column, the label, left out) against `predicted`
/// (`dtf predict`'s values): `{"output": [name, dims…], "ops": [...], "max_abs_diff": d}`.
fn onnx_check(model: &Path, test: &Path, predicted: &[f64]) -> serde_json::Value {
    let script = r#"
import json, sys
import numpy as np, onnx, onnxruntime as ort
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)
out = m.graph.output[0]
dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
x = np.loadtxt(sys.argv[2], delimiter=",", skiprows=1, dtype=np.float32)[:, :-1]
got = ort.InferenceSession(sys.argv[1]).run(None, {"input": x})[0].reshape(-1)
want = np.array(json.loads(sys.argv[3]), dtype=np.float64)
print(json.dumps({"output": [out.name] + dims, "ops": [n.op_type for n in m.graph.node],
                  "max_abs_diff": float(np.abs(got - want).max())}))
"#;
    let want = serde_json::to_string(predicted).unwrap();
    let out = crate::util::output_within(
        std::process::Command::new("python3").args([
            "-c",
            script,
            model.to_str().unwrap(),
            test.to_str().unwrap(),
            &want,
        ]),
        std::time::Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "the ONNX check failed (needs `python3 -m pip install onnx onnxruntime`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}
