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
