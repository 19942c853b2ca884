//! Your data in, your model out: the same Fashion-MNIST rows as IDX files, a
//! Keras-layout `.npz` and Kaggle-layout CSV files train to the same model;
//! bad files of each format are refused with their line or array; `dtf
//! predict` agrees with `dtf eval`; the ONNX export runs in onnxruntime.

use crate::util::*;
use dtf::data::npz::{Array, write_npz};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FASHION: &str = "/usr/share/datasets/fashion-mnist";
/// Rows of each split used: enough to learn, few enough to write as CSV quickly.
const TRAIN: usize = 6000;
const TEST: usize = 1000;

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first `n` images and labels of a Fashion-MNIST split.
fn fashion(split: dtf::data::Split, n: usize) -> (Vec<u8>, Vec<u8>) {
    assert!(
        Path::new(FASHION).exists(),
        "{FASHION} is missing: apt-get install dataset-fashion-mnist"
    );
    let ds = dtf::data::Dataset::load(Path::new(FASHION), split).unwrap();
    let (x, y) = ds.all();
    let pixels: Vec<u8> = x
        .rows()
        .into_iter()
        .take(n)
        .flat_map(|r| {
            r.iter()
                .map(|&v| (v * 255.0).round() as u8)
                .collect::<Vec<_>>()
        })
        .collect();
    (pixels, y[..n].to_vec())
}

/// The same rows in the three formats: an IDX directory, `data.npz` and
/// `fashion-mnist_{train,test}.csv`.
struct Formats {
    idx: PathBuf,
    npz: PathBuf,
    train_csv: PathBuf,
    test_csv: PathBuf,
}

fn write_formats(dir: &Path) -> Formats {
    use dtf::data::Split;
    let (xtr, ytr) = fashion(Split::Train, TRAIN);
    let (xte, yte) = fashion(Split::Test, TEST);
    let idx = dir.join("idx");
    std::fs::create_dir_all(&idx).unwrap();
    dtf::data::write_idx_images(&idx.join("train-images-idx3-ubyte"), &xtr, 28, 28).unwrap();
    dtf::data::write_idx_labels(&idx.join("train-labels-idx1-ubyte"), &ytr).unwrap();
    dtf::data::write_idx_images(&idx.join("t10k-images-idx3-ubyte"), &xte, 28, 28).unwrap();
    dtf::data::write_idx_labels(&idx.join("t10k-labels-idx1-ubyte"), &yte).unwrap();
    // Keras: x uint8 [N, 28, 28], y uint8 [N].
    let npz = dir.join("data.npz");
    write_npz(
        &npz,
        &[
            (
                "x_train",
                Array::U8(vec![TRAIN as u64, 28, 28], xtr.clone()),
            ),
            ("y_train", Array::U8(vec![TRAIN as u64], ytr.clone())),
            ("x_test", Array::U8(vec![TEST as u64, 28, 28], xte.clone())),
            ("y_test", Array::U8(vec![TEST as u64], yte.clone())),
        ],
    )
    .unwrap();
    // Kaggle: label,pixel1,…,pixel784.
    let csv = |path: &Path, x: &[u8], y: &[u8]| {
        let mut text = String::from("label");
        for p in 1..=784 {
            text.push_str(&format!(",pixel{p}"));
        }
        text.push('\n');
        for (row, label) in x.chunks(784).zip(y) {
            text.push_str(&label.to_string());
            for v in row {
                text.push(',');
                text.push_str(&v.to_string());
            }
            text.push('\n');
        }
        std::fs::write(path, text).unwrap();
    };
    let train_csv = dir.join("fashion-mnist_train.csv");
    let test_csv = dir.join("fashion-mnist_test.csv");
    csv(&train_csv, &xtr, &ytr);
    csv(&test_csv, &xte, &yte);
    Formats {
        idx,
        npz,
        train_csv,
        test_csv,
    }
}

/// A base config: one hidden layer whose widths come from the data.
fn base_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("base.toml");
    std::fs::write(
        &path,
        format!(
            "[train]\nbatch_size = 50\nlearning_rate = 0.1\nseed = 3\n\
             [model]\nhidden = [64]\n{extra}"
        ),
    )
    .unwrap();
    path
}

/// `dtf local` on `data` with one worker (so the run is deterministic);
/// returns (test accuracy, EMA test accuracy, checkpoint dir).
fn train(dir: &Path, name: &str, config: &Path, data: &[&str]) -> (f64, f64, PathBuf) {
    let ckpt = dir.join(name);
    let mut args = vec![
        "local",
        "--config",
        config.to_str().unwrap(),
        "--ps",
        "1",
        "--workers",
        "1",
        "--steps",
        "400",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(data);
    let out = dtf_output(&args);
    let stdout = ok(&out, &format!("dtf local on {name}"));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    (
        v["test_accuracy"].as_f64().unwrap(),
        v["ema_test_accuracy"].as_f64().unwrap(),
        ckpt,
    )
}

#[test]
fn npz_and_csv_train_like_idx_and_the_model_leaves_as_predict_and_onnx() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let f = write_formats(dir);
    let config = base_config(dir, "");

    let (idx, idx_ema, _) = train(dir, "idx", &config, &["--data", f.idx.to_str().unwrap()]);
    let (npz, npz_ema, ckpt) = train(dir, "npz", &config, &["--data", f.npz.to_str().unwrap()]);
    // The test CSV is found beside the training one.
    let (csv, csv_ema, _) = train(
        dir,
        "csv",
        &config,
        &["--data", f.train_csv.to_str().unwrap()],
    );
    assert!(idx > 0.7, "the IDX run should learn: {idx}");
    // The same bytes, seed and single worker: the same model, up to noise.
    for (name, a, e) in [("npz", npz, npz_ema), ("csv", csv, csv_ema)] {
        assert!(
            (a - idx).abs() <= 0.02 && (e - idx_ema).abs() <= 0.02,
            "{name}: accuracy {a} / EMA {e}, IDX {idx} / {idx_ema}"
        );
    }

    // dtf eval needs only the checkpoint and the test data, in any format.
    let eval = |data: &Path| -> serde_json::Value {
        let out = dtf_output(&[
            "eval",
            ckpt.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--json",
        ]);
        serde_json::from_str(&ok(&out, "dtf eval")).unwrap()
    };
    let ev = eval(&f.npz);
    for other in [&f.test_csv, &f.idx] {
        assert_eq!(eval(other)["ema_accuracy"], ev["ema_accuracy"], "{other:?}");
    }
    let ema_accuracy = ev["ema_accuracy"].as_f64().unwrap();
    assert!((ema_accuracy - npz_ema).abs() < 1e-6, "{ev}");

    // dtf predict on the test rows: its classes score what dtf eval says.
    let labels: Vec<usize> = std::fs::read_to_string(&f.test_csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    let predict_csv = dir.join("predict.csv");
    let out = dtf_output(&[
        "predict",
        ckpt.to_str().unwrap(),
        "--input",
        f.test_csv.to_str().unwrap(),
    ]);
    let text = ok(&out, "dtf predict");
    std::fs::write(&predict_csv, &text).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), "class,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9");
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), TEST);
    let correct = rows
        .iter()
        .zip(&labels)
        .filter(|(r, l)| r[0] as usize == **l)
        .count();
    let accuracy = correct as f64 / TEST as f64;
    assert!(
        (accuracy - ema_accuracy).abs() <= 1.0 / TEST as f64,
        "predict {accuracy}, eval {ema_accuracy}"
    );
    for r in &rows {
        let sum: f64 = r[1..].iter().sum();
        assert!((sum - 1.0).abs() < 1e-4, "probabilities sum to {sum}");
    }
    // The same rows from the .npz (x_test), as JSON, with the raw weights.
    let out = dtf_output(&[
        "predict",
        ckpt.to_str().unwrap(),
        "--input",
        f.npz.to_str().unwrap(),
        "--json",
        "--raw",
    ]);
    let raw: Vec<serde_json::Value> = ok(&out, "dtf predict --json --raw")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(raw.len(), TEST);
    let correct = raw
        .iter()
        .zip(&labels)
        .filter(|(r, l)| r["class"].as_u64() == Some(**l as u64))
        .count();
    let raw_accuracy = ev["accuracy"].as_f64().unwrap();
    assert!(
        (correct as f64 / TEST as f64 - raw_accuracy).abs() <= 1.0 / TEST as f64,
        "predict --raw {correct}/{TEST}, eval {raw_accuracy}"
    );

    // The ONNX export, checked and run by ONNX's own tools.
    let onnx = dir.join("model.onnx");
    ok(
        &dtf_output(&[
            "export",
            ckpt.to_str().unwrap(),
            "--onnx",
            onnx.to_str().unwrap(),
        ]),
        "dtf export",
    );
    let report = onnx_check(&onnx, &f.npz, &predict_csv);
    assert_eq!(report["opset"], 13, "{report}");
    assert_eq!(report["input"], serde_json::json!(["input", "batch", 784]));
    assert_eq!(
        report["output"],
        serde_json::json!(["probabilities", "batch", 10])
    );
    assert!(
        report["max_abs_diff"].as_f64().unwrap() < 1e-5,
        "onnxruntime and dtf predict differ: {report}"
    );
    let onnx_accuracy = report["accuracy"].as_f64().unwrap();
    assert!(
        (onnx_accuracy - ema_accuracy).abs() <= 1.0 / TEST as f64,
        "onnxruntime {onnx_accuracy}, dtf eval {ema_accuracy}: {report}"
    );
}

/// Runs tests/onnx_check.py; its JSON report.
fn onnx_check(model: &Path, npz: &Path, predict: &Path) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/onnx_check.py");
    let out = output_within(
        Command::new("python3").args([
            script,
            model.to_str().unwrap(),
            npz.to_str().unwrap(),
            predict.to_str().unwrap(),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "tests/onnx_check.py failed (needs `python3 -m pip install onnx onnxruntime`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

/// Float features standardized with the training mean and std: the
/// checkpoint carries them, and the ONNX graph applies them to raw inputs.
#[test]
fn standardized_float_data_exports_its_preprocessing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The tiny data set as float32 in odd units (pixels · 3 − 100).
    let data = tiny_data(dir, 2000, 400);
    let load = |split| dtf::data::Dataset::load(&data, split).unwrap();
    let (train_set, test_set) = (load(dtf::data::Split::Train), load(dtf::data::Split::Test));
    let floats = |d: &dtf::data::Dataset| {
        let (x, y) = d.all();
        let n = d.len() as u64;
        (
            Array::F32(
                vec![n, d.features() as u64],
                x.iter().map(|v| v * 255.0 * 3.0 - 100.0).collect(),
            ),
            Array::I64(vec![n], y.iter().map(|&l| i64::from(l)).collect()),
        )
    };
    let (xtr, ytr) = floats(&train_set);
    let (xte, yte) = floats(&test_set);
    let npz = dir.join("floats.npz");
    write_npz(
        &npz,
        &[
            ("x_train", xtr),
            ("y_train", ytr),
            ("x_test", xte),
            ("y_test", yte),
        ],
    )
    .unwrap();
    let config = base_config(
        dir,
        &format!(
            "[data]\nformat = \"npz\"\npath = \"{}\"\nstandardize = true\n",
            npz.display()
        ),
    );
    let (acc, _, ckpt) = train(dir, "floats", &config, &[]);
    assert!(acc > 0.9, "standardized floats should learn: {acc}");

    let out = dtf_output(&["inspect", ckpt.to_str().unwrap(), "--json"]);
    let inspected: serde_json::Value = serde_json::from_str(&ok(&out, "dtf inspect")).unwrap();
    let meta = &inspected["model"]["metadata"];
    // Objects and arrays, not JSON inside strings: `jq .model.metadata.optimizer.name` works.
    assert_eq!(meta["layers"], serde_json::json!([64, 64, 4]), "{meta}");
    assert_eq!(meta["activation"], "relu");
    assert_eq!(meta["classes"], "4");
    assert_eq!(meta["preprocessing"]["kind"], "standardize", "{meta}");
    assert_eq!(meta["hyperparameters"]["batch_size"], 50, "{meta}");
    assert!(meta["optimizer"]["name"].is_string(), "{meta}");

    let predict_csv = dir.join("predict.csv");
    let out = dtf_output(&[
        "predict",
        ckpt.to_str().unwrap(),
        "--input",
        npz.to_str().unwrap(),
    ]);
    std::fs::write(&predict_csv, ok(&out, "dtf predict")).unwrap();
    let onnx = dir.join("floats.onnx");
    ok(
        &dtf_output(&[
            "export",
            ckpt.to_str().unwrap(),
            "--onnx",
            onnx.to_str().unwrap(),
        ]),
        "dtf export",
    );
    let report = onnx_check(&onnx, &npz, &predict_csv);
    assert!(report["max_abs_diff"].as_f64().unwrap() < 1e-5, "{report}");
    assert!(report["accuracy"].as_f64().unwrap() > 0.9, "{report}");
}

/// A bad file of each format stops `dtf local` before any task starts, and
/// `dtf check-config` with exit 78, naming the file and the line or array.
#[test]
fn bad_files_of_each_format_are_refused_with_their_line_or_array() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let header = "label,a,b\n";
    let train = dir.join("bad_train.csv");
    let test = dir.join("bad_test.csv");
    std::fs::write(&test, format!("{header}1,2,3\n")).unwrap();
    let npz = dir.join("bad.npz");
    write_npz(
        &npz,
        &[
            ("x_train", Array::U8(vec![2, 2], vec![1, 2, 3, 4])),
            ("y_train", Array::U8(vec![2], vec![0, 1])),
            ("x_test", Array::U8(vec![1, 2], vec![1, 2])),
        ],
    )
    .unwrap();
    let cases: Vec<(&str, String, PathBuf)> = vec![
        ("csv", format!("{header}1,2,3\n0,nan,3\n"), train.clone()),
        ("csv", format!("{header}1,2,3\n0,2\n"), train.clone()),
        ("csv", format!("{header}1,2,3\n-1,2,3\n"), train.clone()),
        ("npz", String::new(), npz.clone()),
    ];
    let wants = [
        "line 3, column \"a\": \"nan\" is not a finite number",
        "line 3: 2 cells, the header has 3",
        "line 3, column \"label\": label \"-1\" is not a class index",
        "has no array \"y_test\"",
    ];
    let config = base_config(dir, "");
    for ((_, text, path), want) in cases.iter().zip(wants) {
        if !text.is_empty() {
            std::fs::write(path, text).unwrap();
        }
        let out = dtf_output(&[
            "local",
            "--config",
            config.to_str().unwrap(),
            "--data",
            path.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
            "--steps",
            "10",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}: dtf local succeeded");
        assert!(err.contains(want), "{want}: {err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
    // An IDX directory with a truncated file.
    let data = tiny_data(dir, 50, 20);
    let images = data.join("t10k-images-idx3-ubyte");
    let bytes = std::fs::read(&images).unwrap();
    std::fs::write(&images, &bytes[..bytes.len() - 7]).unwrap();
    let out = dtf_output(&[
        "local",
        "--config",
        config.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "10",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("truncated") && err.contains("t10k-images"),
        "{err}"
    );

    // check-config runs the daemons' checks, the token's and the data's: a
    // model that does not fit the data is named.
    let token = dir.join("token");
    std::fs::write(&token, "s3cret-token-for-check-config").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A batch the 50 rows can give.
    let common = format!(
        "[security]\ntoken_file = \"{}\"\n[train]\nbatch_size = 10\n",
        token.display()
    );
    let cfg = dir.join("mismatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "{common}[model]\nlayers = [784, 16, 10]\n[data]\ndir = \"{}\"\n",
            tiny_data(&dir.join("t"), 50, 20).display()
        ),
    )
    .unwrap();
    let out = dtf_output(&["check-config", "-c", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("model.layers[0]") && err.contains("64 features"),
        "{err}"
    );
    // model.hidden with the same data is valid.
    std::fs::write(
        &cfg,
        format!(
            "{common}[model]\nhidden = [16]\n[data]\ndir = \"{}\"\n",
            dir.join("t").join("data").display()
        ),
    )
    .unwrap();
    let out = dtf_output(&["check-config", "-c", cfg.to_str().unwrap()]);
    ok(&out, "dtf check-config with model.hidden");
}

/// `dtf local --data` naming nothing: the path and the reason, each once
/// (the error keeps its cause as its source, and dtf prints the chain).
#[test]
fn a_missing_data_path_is_named_with_its_reason_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.npz");
    let config = base_config(tmp.path(), "");
    let out = dtf_output(&[
        "local",
        "--config",
        config.to_str().unwrap(),
        "--data",
        missing.to_str().unwrap(),
        "--steps",
        "10",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    // Caught before anything is created: a bad command line (dtf(1)).
    assert_eq!(out.status.code(), Some(2), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains(&missing.display().to_string()), "{line}");
    assert_eq!(line.matches("No such file").count(), 1, "{line}");
    // And what --data takes, not only what went wrong.
    assert!(
        line.contains("dtf reads a directory of IDX files") && line.contains("--label"),
        "{line}"
    );
}

/// The model and schedule keys TensorFlow users reach for — GELU, dropout, a cosine
/// schedule after a warmup, gradients clipped to a global norm — train, are kept in the
/// checkpoint's metadata, and the model leaves with its activation: `dtf eval` and
/// `dtf predict` agree, and onnxruntime computes what `dtf predict` does.
#[test]
fn tf_model_and_schedule_keys_train_and_leave_with_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let f = write_formats(dir);
    let config = base_config(dir, "");
    let npz = f.npz.to_str().unwrap();
    let (acc, ema, ckpt) = train(
        dir,
        "gelu",
        &config,
        &[
            "--data",
            npz,
            "--activation",
            "gelu",
            "--dropout",
            "0.2",
            "--clip-norm",
            "5",
            "--set",
            "train.lr_schedule=cosine_decay",
            "--set",
            "train.warmup_steps=40",
        ],
    );
    assert!(acc > 0.6, "a GELU model with dropout should learn: {acc}");

    let out = dtf_output(&["inspect", ckpt.to_str().unwrap(), "--json"]);
    let inspected: serde_json::Value = serde_json::from_str(&ok(&out, "dtf inspect")).unwrap();
    let meta = &inspected["model"]["metadata"];
    assert_eq!(meta["activation"], "gelu", "{meta}");
    assert_eq!(meta["dropout"], "0.2", "{meta}");
    let h = &meta["hyperparameters"];
    assert_eq!(h["lr_schedule"], "cosine_decay", "{meta}");
    assert_eq!(
        (&h["warmup_steps"], &h["clip_norm"]),
        (&40.into(), &5.0.into())
    );

    // Evaluation drops nothing: eval's EMA accuracy is dtf local's, and predict's.
    let out = dtf_output(&["eval", ckpt.to_str().unwrap(), "--data", npz, "--json"]);
    let ev: serde_json::Value = serde_json::from_str(&ok(&out, "dtf eval")).unwrap();
    assert_eq!(ev["ema_accuracy"].as_f64().unwrap(), ema, "{ev}");
    let predict_csv = dir.join("predict.csv");
    let out = dtf_output(&["predict", ckpt.to_str().unwrap(), "--input", npz]);
    std::fs::write(&predict_csv, ok(&out, "dtf predict")).unwrap();
    let onnx = dir.join("gelu.onnx");
    let out = dtf_output(&[
        "export",
        ckpt.to_str().unwrap(),
        "--onnx",
        onnx.to_str().unwrap(),
    ]);
    ok(&out, "dtf export");
    let report = onnx_check(&onnx, &f.npz, &predict_csv);
    assert!(
        report["max_abs_diff"].as_f64().unwrap() < 1e-5,
        "onnxruntime and dtf predict differ on a GELU model: {report}"
    );
    assert!(
        (report["accuracy"].as_f64().unwrap() - ema).abs() <= 1.0 / TEST as f64,
        "{report}"
    );
}
