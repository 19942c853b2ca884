//! Issue 25, files from outside and files dtf writes: an export never
//! overwrites its input nor leaves a broken model on a full disk; data
//! files that are FIFOs are refused at once; decompression stops at what a
//! header declares; messages name the dtype and quote a bounded part of a
//! bad cell.

use crate::util::*;
use dtf::config::Mode;
use dtf::data::npz::Array;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

/// `--onnx` naming the checkpoint being exported overwrote it with ONNX
/// bytes and exited 0.
#[test]
fn export_onto_its_own_checkpoint_is_refused_and_the_checkpoint_kept() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let model = write_checkpoint(&c.cfg, 5);
    let ema = model.with_file_name("model.ckpt-5.ema.safetensors");
    let before = (std::fs::read(&model).unwrap(), std::fs::read(&ema).unwrap());
    for out in [&model, &ema] {
        let ran = dtf_quick(&[
            OsStr::new("export"),
            model.as_os_str(),
            OsStr::new("--onnx"),
            out.as_os_str(),
        ]);
        assert!(!ran.status.success(), "{}", ran.stderr);
        assert!(
            ran.stderr.contains("refusing to overwrite"),
            "{}",
            ran.stderr
        );
    }
    let after = (std::fs::read(&model).unwrap(), std::fs::read(&ema).unwrap());
    assert!(before == after, "the checkpoint changed");
}

/// On a full disk (here: a file size limit) the previous `model.onnx` was
/// left truncated, a file onnxruntime cannot parse. Now it stays whole.
#[test]
fn export_that_cannot_write_leaves_the_previous_model_whole() {
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let model = write_checkpoint(&c.cfg, 5);
    let onnx = c.dir.path().join("model.onnx");
    let ran = dtf_quick(&[
        OsStr::new("export"),
        model.as_os_str(),
        OsStr::new("--onnx"),
        onnx.as_os_str(),
    ]);
    assert!(ran.status.success(), "{}", ran.stderr);
    let before = std::fs::read(&onnx).unwrap();
    assert!(before.len() > 1024);
    // `ulimit -f 1`: writes past 512 bytes fail with EFBIG (SIGXFSZ ignored).
    let out = output_within(
        Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 1; exec \"$0\" export \"$1\" --raw --onnx \"$2\"")
            .arg(bin("dtf"))
            .arg(&model)
            .arg(&onnx),
        DEADLINE,
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(std::fs::read(&onnx).unwrap(), before, "model.onnx changed");
    let left: Vec<_> = std::fs::read_dir(c.dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

/// A FIFO as `data.train` hung `dtf check-config` (and `dtf local`, deaf to
/// SIGTERM) in a blocking open before the regular-file check.
#[test]
fn a_fifo_as_a_data_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("train.csv");
    mkfifo(&fifo);
    std::fs::write(dir.path().join("test.csv"), "label,a\n1,2\n").unwrap();
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.cfg.data.format = dtf::config::DataFormat::Csv;
    c.cfg.data.train = Some(fifo.clone());
    c.cfg.data.test = Some(dir.path().join("test.csv"));
    c.write_config();
    let config = c.config_path.clone();
    let ran = dtf_quick(&[
        OsStr::new("check-config"),
        OsStr::new("--config"),
        config.as_os_str(),
    ]);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("a FIFO"), "{}", ran.stderr);
    let c = Cluster::new(1, 1, 100, Mode::Async);
    let model = write_checkpoint(&c.cfg, 5);
    let ran = dtf_quick(&[
        OsStr::new("predict"),
        model.as_os_str(),
        OsStr::new("--input"),
        fifo.as_os_str(),
    ]);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("a FIFO"), "{}", ran.stderr);
}

/// A deflated `.npz` array whose header declares 1200 bytes but which
/// inflates to far more was decompressed whole (2.1 GB for a 9 MB file)
/// before the shape check refused it. Now reading stops one byte past the
/// declared size, and the message says so.
#[test]
fn an_npz_array_larger_than_its_header_declares_is_refused_after_the_declared_bytes() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.npz");
    let mut npy = dtf::data::npz::npy_bytes(&Array::U8(vec![1200], vec![0; 1200]));
    npy.resize(npy.len() + (256 << 20), 0);
    let file = std::fs::File::create(&path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    zip.start_file("x.npy", options).unwrap();
    zip.write_all(&npy).unwrap();
    zip.finish().unwrap();
    let err = dtf::data::npz::load_array(&path, "x")
        .unwrap_err()
        .to_string();
    assert!(err.contains("more data than its shape [1200]"), "{err}");
}

/// An object or unicode array was refused with a size message (`of |O
/// needs 0 bytes of data`); a bad CSV cell was quoted whole (a 20 MB cell,
/// a 20 MB line).
#[test]
fn messages_name_the_dtype_and_quote_a_bounded_part_of_a_cell() {
    let dir = tempfile::tempdir().unwrap();
    let npy = |descr: &str, body: &[u8]| {
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,), }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(body);
        out
    };
    for (descr, body, words) in [
        ("|O", &b"\x80\x02pickle"[..], "Python objects"),
        ("<U3", &[0u8; 24][..], "unicode strings"),
    ] {
        let path = dir.path().join("a.npy");
        std::fs::write(&path, npy(descr, body)).unwrap();
        let err = dtf::data::npz::load_npy(&path).unwrap_err().to_string();
        assert!(err.contains(words) && err.contains(descr), "{err}");
    }
    let csv = dir.path().join("rows.csv");
    let cell = "x".repeat(1 << 20);
    std::fs::write(&csv, format!("label,a\n1,{cell}\n")).unwrap();
    let err = dtf::data::csv::read(&csv, Some("label"), true)
        .unwrap_err()
        .to_string();
    assert!(err.len() < 1000, "{} bytes of error", err.len());
    assert!(err.contains("(1048576 bytes)"), "{err}");
}

/// A checkpoint of a 3-feature model whose metadata names its features
/// `a`, `b`, `c` (as the chief writes it when it trained on a CSV file).
fn named_checkpoint(dir: &Path) -> std::path::PathBuf {
    use dtf::checkpoint::{Checkpoint, ModelMeta, Saver};
    let layers = vec![3, 5, 2];
    let mlp = dtf::model::Mlp::new(&layers).unwrap();
    let names: Vec<String> = mlp.variables().iter().map(|v| v.name.clone()).collect();
    let values = mlp.init(3);
    let ckpt = Checkpoint {
        global_step: 9,
        variables: names.iter().cloned().zip(values.iter().cloned()).collect(),
        shadows: names.into_iter().zip(values).collect(),
        slots: Default::default(),
        run: 0,
        shard_steps: Vec::new(),
        table_optimizers: Vec::new(),
        increment: None,
        tables: Vec::new(),
    };
    let meta = ModelMeta {
        layers,
        activation: dtf::model::Activation::Relu,
        dropout: 0.0,
        classes: 2,
        task: dtf::config::ModelTask::Classification,
        preprocessing: dtf::data::Preprocessing::Scale { divisor: 1.0 },
        label: Some("label".into()),
        hyperparameters: None,
        features: Some(vec!["a".into(), "b".into(), "c".into()]),
        training_data: None,
        class_names: None,
        wide_deep: None,
    };
    Saver::new(dir, 5)
        .unwrap()
        .with_model(&meta)
        .save(&ckpt)
        .unwrap()
}

/// CSV features were matched by position: the same rows with their columns
/// reordered (the header said so) scored 0.994, then 0.154, without a word;
/// `predict` too. Now they are matched by name.
#[test]
fn csv_columns_are_matched_by_name_not_position() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        (0, [1.5, -2.0, 7.0]),
        (1, [0.25, 3.0, -1.0]),
        (1, [9.0, 0.0, 2.5]),
    ];
    let write = |name: &str, order: [usize; 3]| {
        let cols = ["a", "b", "c"];
        let mut text = format!(
            "{},label,{},{}\n",
            cols[order[0]], cols[order[1]], cols[order[2]]
        );
        for (label, v) in rows {
            text.push_str(&format!(
                "{},{label},{},{}\n",
                v[order[0]], v[order[1]], v[order[2]]
            ));
        }
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let in_order = write("train.csv", [0, 1, 2]);
    let shuffled = write("test.csv", [2, 0, 1]);
    // Training's test split: matched to the training file's columns.
    let cfg = dtf::config::DataConfig {
        format: dtf::config::DataFormat::Csv,
        train: Some(in_order.clone()),
        test: Some(shuffled.clone()),
        ..Default::default()
    };
    let (train, test) = dtf::data::load_both(&cfg).unwrap();
    assert_eq!(train.all().0, test.all().0);
    assert_eq!(train.names().unwrap(), ["a", "b", "c"]);
    // predict: by the names the checkpoint recorded.
    let model = named_checkpoint(&dir.path().join("ckpt"));
    let predict = |input: &Path| {
        let ran = dtf_quick(&[
            OsStr::new("predict"),
            model.as_os_str(),
            OsStr::new("--input"),
            input.as_os_str(),
            OsStr::new("--json"),
        ]);
        assert!(ran.status.success(), "{}", ran.stderr);
        ran.stdout
    };
    assert_eq!(predict(&in_order), predict(&shuffled));
    // And eval.
    let eval = |data: &Path| {
        let ran = dtf_quick(&[
            OsStr::new("eval"),
            model.as_os_str(),
            OsStr::new("--data"),
            data.as_os_str(),
            OsStr::new("--json"),
        ]);
        assert!(ran.status.success(), "{}", ran.stderr);
        let v: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
        (v["accuracy"].as_f64(), v["loss"].as_f64())
    };
    assert_eq!(eval(&in_order), eval(&shuffled));
    // A column the model was not trained on, or one it lacks, is named.
    let other = dir.path().join("other.csv");
    std::fs::write(&other, "a,label,b,d\n1,0,2,3\n").unwrap();
    let ran = dtf_quick(&[
        OsStr::new("predict"),
        model.as_os_str(),
        OsStr::new("--input"),
        other.as_os_str(),
    ]);
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains("missing \"c\"") && ran.stderr.contains("not trained on \"d\""),
        "{}",
        ran.stderr
    );
}
