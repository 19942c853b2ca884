//! Wide & deep end to end, as a user runs it: MovieLens-100k (RecBole's
//! atomic files, as scripts/fetch-ml100k.sh caches them) through `dtf
//! local`, embedding tables on the ps, scored by AUC from the checkpoint.

use crate::util::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// MovieLens-100k's directory; `None` (said loudly) when it is absent
/// outside CI, a failure under CI (scripts/test.sh fetches it).
fn ml100k() -> Option<PathBuf> {
    let dir = std::env::var_os("DTF_ML100K").map_or_else(
        || PathBuf::from("/var/cache/dtf-test/ml-100k"),
        PathBuf::from,
    );
    if dir.join("ml-100k.inter").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{}: MovieLens-100k is missing under CI (scripts/test.sh fetches it)",
        dir.display()
    );
    eprintln!("SKIPPED: {} has no ml-100k.inter", dir.display());
    None
}

/// `dtf local` on MovieLens-100k with `extra` flags; the summary's JSON
/// and stderr.
fn local(
    data: &std::path::Path,
    ckpt: &std::path::Path,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let mut args = vec![
        "local",
        "--data",
        data.to_str().unwrap(),
        "--label",
        "rating",
        "--threshold",
        "4",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    run_local(&args)
}

/// `dtf` with `args` (a `dtf local … --json`), which must succeed; the
/// summary's JSON and stderr.
fn run_local(args: &[&str]) -> (serde_json::Value, String) {
    let out = dtf_output(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "dtf {args:?} failed:\n{stderr}");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr:\n{stderr}"));
    (report, stderr)
}

#[test]
fn wide_deep_learns_movielens_in_both_modes_and_over_both_transports() {
    let Some(data) = ml100k() else { return };
    let dir = tempfile::tempdir().unwrap();
    for (mode, transport) in [("async", "auto"), ("sync", "tcp")] {
        let ckpt = dir.path().join(mode);
        let (report, stderr) = local(
            &data,
            &ckpt,
            &[
                "--ps",
                "2",
                "--workers",
                "2",
                "--steps",
                "1500",
                "--mode",
                mode,
                "--transport",
                transport,
            ],
        );
        assert!(
            stderr.contains("model wide_deep") && stderr.contains("categorical fields"),
            "dtf local says it picked wide & deep:\n{stderr}"
        );
        assert_eq!(report["global_step"], 1500, "{report}");
        assert_eq!(
            report["layers"],
            serde_json::json!([9 * 16 + 1, 64, 32, 1]),
            "{report}"
        );
        let auc = report["test_auc"].as_f64().unwrap();
        let logloss = report["test_logloss"].as_f64().unwrap();
        // A model that learned nothing scores 0.5 and ln 2 = 0.693; at the
        // defaults (Adagrad 0.05) dtf reaches 0.76-0.78 at 1500 steps and
        // 0.78 at 3000 (docs/benchmarks.md).
        assert!(auc > 0.73, "{mode}/{transport}: test AUC {auc}: {report}");
        assert!(
            logloss < 0.62,
            "{mode}/{transport}: test log loss {logloss}: {report}"
        );
        assert!(
            report["examples_per_sec"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        // `dtf eval` scores the same checkpoint the same way.
        // (its test split where the checkpoint says it trained).
        let out = dtf_output(&["eval", ckpt.to_str().unwrap(), "--json"]);
        let ev: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("dtf eval: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(ev["auc"].as_f64().unwrap() as f32, auc as f32, "{ev}");
    }
}

#[test]
fn wide_deep_refuses_ratings_without_a_threshold_and_onnx_export_and_predicts_atomic_files() {
    let Some(data) = ml100k() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dtf_output(&[
        "local",
        "--data",
        data.to_str().unwrap(),
        "--label",
        "rating",
        "--steps",
        "10",
        "--checkpoint-dir",
        dir.path().join("c").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("data.threshold") && stderr.contains("--threshold"),
        "{stderr}"
    );
    let ckpt = dir.path().join("trained");
    local(&data, &ckpt, &["--steps", "20", "--workers", "1"]);
    let onnx = dir.path().join("m.onnx");
    let out = dtf_output(&[
        "export",
        "--onnx",
        onnx.to_str().unwrap(),
        ckpt.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("wide & deep"),
        "{stderr}"
    );
    assert!(!onnx.exists());
    // dtf predict reads the atomic files themselves: one line per interaction.
    let inter = data.join("ml-100k.inter");
    let out = dtf_output(&[
        "predict",
        ckpt.to_str().unwrap(),
        "--input",
        inter.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(lines, 1 + 100_000);
    // The same file alone, without its .user and .item: fields missing,
    // said with what would join them.
    let alone = dir.path().join("alone.inter");
    std::fs::copy(&inter, &alone).unwrap();
    let out = dtf_output(&[
        "predict",
        ckpt.to_str().unwrap(),
        "--input",
        alone.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("age") && stderr.contains("NAME.user"),
        "{stderr}"
    );
}

/// AUC of `scores` against 0/1 `labels`, ties counted half.
fn auc(scores: &[f64], labels: &[u8]) -> f64 {
    let (mut wins, mut pairs) = (0.0, 0.0);
    for (i, &si) in scores.iter().enumerate() {
        for (j, &sj) in scores.iter().enumerate() {
            if labels[i] == 1 && labels[j] == 0 {
                pairs += 1.0;
                wins += if si > sj {
                    1.0
                } else if si == sj {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    wins / pairs
}

/// The `p1` column of `dtf predict`'s CSV output, checking the rest.
fn p1_of(out: &std::process::Output) -> Vec<f64> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dtf predict failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("class,p0,p1"), "{stdout}");
    lines
        .map(|l| {
            let cells: Vec<f64> = l.split(',').map(|c| c.parse().unwrap()).collect();
            assert_eq!(cells.len(), 3, "{l}");
            assert!((cells[1] + cells[2] - 1.0).abs() < 1e-6, "{l}");
            assert_eq!(cells[0], if cells[2] >= 0.5 { 1.0 } else { 0.0 }, "{l}");
            cells[2]
        })
        .collect()
}

#[test]
fn wide_deep_predicts_per_example_what_eval_scores() {
    // A CSV with categorical columns (wide & deep, picked by dtf local):
    // the label is 1 for two of four colours, and for one shop in five.
    let dir = tempfile::tempdir().unwrap();
    let colours = ["red", "green", "blue", "black"];
    let row = |i: usize| {
        let colour = colours[(i * 7 + i / 3) % 4];
        let shop = format!("s{}", (i * 13) % 25);
        let x = ((i * 31) % 100) as f64 / 10.0;
        let label = u8::from(colour == "red" || colour == "green" || (i * 13) % 25 < 5);
        (colour, shop, x, label)
    };
    let write = |name: &str, rows: std::ops::Range<usize>, with_label: bool| {
        let mut text = String::from(if with_label {
            "colour,shop,x,label\n"
        } else {
            // Another column order: dtf matches columns by name.
            "x,shop,colour\n"
        });
        for i in rows {
            let (c, s, x, l) = row(i);
            text += &if with_label {
                format!("{c},{s},{x},{l}\n")
            } else {
                format!("{x},{s},{c}\n")
            };
        }
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let train = write("shop_train.csv", 0..2000, true);
    write("shop_test.csv", 2000..2400, true);
    let unlabelled = write("new.csv", 2000..2400, false);
    let labels: Vec<u8> = (2000..2400).map(|i| row(i).3).collect();
    let ckpt = dir.path().join("ckpt");
    let (_, stderr) = run_local(&[
        "local",
        "--data",
        train.to_str().unwrap(),
        "--ps",
        "1",
        "--workers",
        "1",
        "--steps",
        "300",
        "--learning-rate",
        "0.2",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ]);
    assert!(stderr.contains("model wide_deep"), "{stderr}");
    let out = dtf_output(&["eval", ckpt.to_str().unwrap(), "--json"]);
    let ev: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("dtf eval: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
    let (ema_auc, raw_auc) = (ev["ema_auc"].as_f64().unwrap(), ev["auc"].as_f64().unwrap());
    assert!(ema_auc > 0.8, "the model learned the colours: {ev}");
    // Without a label column, in another column order: the EMA weights by
    // default, the trained ones with --raw; their ranking is eval's AUC.
    let ckpt_arg = ckpt.to_str().unwrap();
    let input = unlabelled.to_str().unwrap();
    let ema = p1_of(&dtf_output(&["predict", ckpt_arg, "--input", input]));
    let raw = p1_of(&dtf_output(&[
        "predict", ckpt_arg, "--input", input, "--raw",
    ]));
    assert_eq!(ema.len(), 400);
    assert!((auc(&ema, &labels) - ema_auc).abs() < 1e-4, "{ev}");
    assert!((auc(&raw, &labels) - raw_auc).abs() < 1e-4, "{ev}");
    assert_ne!(ema, raw);
    // --json: one object per example.
    let out = dtf_output(&["predict", ckpt_arg, "--input", input, "--json"]);
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(
        first["probabilities"].as_array().unwrap().len(),
        2,
        "{first}"
    );
    // A file without a field the model embeds: an error naming it, no output.
    let missing = dir.path().join("no_shop.csv");
    std::fs::write(&missing, "colour,x\nred,1\n").unwrap();
    let out = dtf_output(&["predict", ckpt_arg, "--input", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("shop"), "{stderr}");
    assert!(out.stdout.is_empty());
    // Dense rows (.npy) are not a wide & deep model's input.
    let npy = dir.path().join("x.npy");
    std::fs::write(&npy, b"").unwrap();
    let out = dtf_output(&["predict", ckpt_arg, "--input", npy.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(".csv"), "{stderr}");
}

/// Admission and `max_rows` in a whole run: on Zipf data with far more
/// distinct ids than the bound, each ps holds at most `max_rows` rows of
/// each table all along (its `/metrics`), evicts and refuses rows, and the
/// run completes with its AUC; the checkpoint holds at most `ps × max_rows`
/// rows a table, `dtf eval` scores it (evicted ids read as initial), and a
/// run resumes from it.
#[test]
fn max_rows_bounds_each_ps_table_and_min_count_refuses_rare_ids_in_a_wide_deep_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = synth(dir.path(), 20000, 8, 5000);
    let ckpt = dir.path().join("ckpt");
    let (max_rows, ps) = (300u64, 2);
    let port = free_port_run(ps + 1);
    let stdout = std::fs::File::create(dir.path().join("out.json")).unwrap();
    let stderr = std::fs::File::create(dir.path().join("err.txt")).unwrap();
    let mut child = Command::new(bin("dtf"))
        .args(["local", "--data", data.to_str().unwrap()])
        .args(["--ps", "2", "--workers", "1", "--steps", "2000"])
        .args(["--checkpoint-dir", ckpt.to_str().unwrap(), "--json"])
        .args(["--set", &format!("model.tables.max_rows={max_rows}")])
        .args(["--set", "model.tables.min_count=2"])
        .args(["--set", &format!("metrics.listen=127.0.0.1:{port}")])
        .env_remove("TF_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    // While it trains: both ps tasks hold at most max_rows rows of each
    // table, and have evicted and refused some.
    let series = |name: &str, table: &str| format!("{name}{{table=\"{table}\"}}");
    let mut seen = [false; 2];
    until(Duration::from_secs(120), "evictions on both ps", || {
        for (i, done) in seen.iter_mut().enumerate() {
            let Some(text) = http_get(&format!("127.0.0.1:{}", port + i as u16), "/metrics") else {
                continue;
            };
            for table in ["deep/embeddings", "wide/weights"] {
                if let Some(rows) = metric_sample(&text, &series("dtf_table_rows", table)) {
                    assert!(rows <= max_rows as f64, "ps:{i} {table}: {rows} rows");
                }
            }
            let t = "deep/embeddings";
            let evicted = metric_sample(&text, &series("dtf_table_rows_evicted_total", t));
            let refused = metric_sample(&text, &series("dtf_table_ids_refused_total", t));
            *done |= evicted.is_some_and(|n| n > 0.0) && refused.is_some_and(|n| n > 0.0);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap_or_default();
            assert!(
                seen.iter().all(|&s| s),
                "run ended ({status}) before: {err}"
            );
        }
        seen.iter().all(|&s| s).then_some(())
    });
    // `dtf status --json` says the same, per ps and table, while it trains.
    let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap();
    let config = err
        .lines()
        .find_map(|l| {
            l.split_once("status --config ")
                .map(|(_, p)| p.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no status line in {err}"));
    let out = dtf_output(&["status", "--config", &config, "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let ps_tasks: Vec<&serde_json::Value> = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "ps")
        .collect();
    assert_eq!(ps_tasks.len(), ps, "{st}");
    for t in ps_tasks {
        for table in ["deep/embeddings", "wide/weights"] {
            let rows = t["table_rows"][table]
                .as_u64()
                .unwrap_or_else(|| panic!("{t}"));
            assert!(rows <= max_rows, "{t}");
        }
        assert!(
            t["rows_evicted"]["deep/embeddings"].as_u64().unwrap() > 0,
            "{t}"
        );
        assert!(
            t["ids_refused"]["deep/embeddings"].as_u64().unwrap() > 0,
            "{t}"
        );
    }
    let status = until(Duration::from_secs(300), "the run's end", || {
        child.try_wait().unwrap()
    });
    let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap();
    assert!(status.success(), "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).unwrap())
            .unwrap();
    let auc = report["test_auc"].as_f64().unwrap();
    assert!(auc > 0.6, "the run learned something: {report}");
    // The checkpoint: at most ps × max_rows rows of each table.
    let out = dtf_output(&["inspect", ckpt.to_str().unwrap(), "--json"]);
    let inspect: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for t in inspect["tables"].as_array().unwrap() {
        let rows = t["rows"].as_u64().unwrap();
        assert!(rows <= ps as u64 * max_rows && rows > 0, "{t}");
    }
    // A checkpoint of evicted tables scores as the run reported it.
    let out = dtf_output(&["eval", ckpt.to_str().unwrap(), "--json"]);
    let ev: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ev["auc"].as_f64().unwrap() as f32, auc as f32, "{ev}");
    // And a run resumes from it: the chief seeds both ps with the evicted
    // tables, and trains on.
    let set = format!("model.tables.max_rows={max_rows}");
    let (report, _) = one_worker(&data, &ckpt, 2100, &[&set]);
    assert_eq!(report["global_step"], 2100, "{report}");
    assert!(report["test_auc"].as_f64().unwrap() > 0.6, "{report}");
}

/// `dtf synth` data (a planted CTR model) of `rows` examples and `fields`
/// fields of `cardinality` ids each, in `dir/syn`.
fn synth(dir: &std::path::Path, rows: u32, fields: u32, cardinality: u32) -> PathBuf {
    let data = dir.join("syn");
    let (rows, fields, cardinality) = (
        rows.to_string(),
        fields.to_string(),
        cardinality.to_string(),
    );
    let out = dtf_output(&[
        "synth",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        &rows,
        "--fields",
        &fields,
        "--cardinality",
        &cardinality,
    ]);
    assert!(out.status.success(), "{out:?}");
    data
}

/// `dtf local` on `data`, 2 ps and one worker (so that two runs of it are
/// the same run), for `steps` steps into `ckpt`, with `--set` of each of
/// `sets`: its JSON report and its stderr.
fn one_worker(
    data: &std::path::Path,
    ckpt: &std::path::Path,
    steps: u64,
    sets: &[&str],
) -> (serde_json::Value, String) {
    let steps = steps.to_string();
    let mut args = vec![
        "local",
        "--data",
        data.to_str().unwrap(),
        "--ps",
        "2",
        "--workers",
        "1",
        "--steps",
        &steps,
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--json",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    run_local(&args)
}

/// The checkpoint's metadata as `dtf inspect --json` shows it.
fn metadata(ckpt: &std::path::Path) -> serde_json::Value {
    let out = dtf_output(&["inspect", ckpt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["model"]["metadata"].clone()
}

#[test]
fn ftrl_for_the_wide_part_and_adagrad_for_the_embeddings_train_save_and_resume() {
    let Some(data) = ml100k() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let cluster = ["--ps", "2", "--workers", "2"];
    let rules = [
        "--set",
        "model.tables.linear_optimizer=ftrl",
        "--set",
        "model.tables.optimizer=adagrad",
    ];
    let (report, stderr) = local(
        &data,
        &ckpt,
        &[&cluster[..], &rules, &["--steps", "1500"]].concat(),
    );
    assert!(
        stderr.contains("deep/embeddings adagrad, wide/weights ftrl"),
        "dtf local names each table's optimizer:\n{stderr}"
    );
    let auc = report["test_auc"].as_f64().unwrap();
    assert!(auc > 0.73, "test AUC {auc}: {report}");
    // The checkpoint names each table's rule and FTRL's two slots.
    let meta = metadata(&ckpt);
    assert_eq!(
        meta["table_optimizers"]["wide/weights"]["name"], "ftrl",
        "{meta}"
    );
    assert_eq!(
        meta["table_optimizers"]["wide/weights"]["learning_rate_power"],
        -0.5
    );
    assert_eq!(
        meta["table_optimizers"]["deep/embeddings"]["name"],
        "adagrad"
    );
    for slot in [
        "wide/weights/Ftrl",
        "wide/weights/Ftrl_1",
        "deep/embeddings/Adagrad",
    ] {
        assert!(meta[format!("crc32:{slot}")].is_string(), "{slot}: {meta}");
    }
    // Resumed with the same rules: on from 1500, still learning.
    let (report, _) = local(
        &data,
        &ckpt,
        &[&cluster[..], &rules, &["--steps", "2000"]].concat(),
    );
    assert_eq!(report["global_step"], 2000, "{report}");
    assert!(report["test_auc"].as_f64().unwrap() > 0.73, "{report}");
    // Resumed with the tables back on train.optimizer (Adagrad): the wide
    // rows kept, their slots Adagrad's now, and no table rule of their own.
    let (report, _) = local(&data, &ckpt, &[&cluster[..], &["--steps", "2500"]].concat());
    assert_eq!(report["global_step"], 2500, "{report}");
    assert!(report["test_auc"].as_f64().unwrap() > 0.73, "{report}");
    let meta = metadata(&ckpt);
    assert!(meta["table_optimizers"].is_null(), "{meta}");
    assert!(meta["crc32:wide/weights/Adagrad"].is_string(), "{meta}");
    assert!(meta["crc32:wide/weights/Ftrl"].is_null(), "{meta}");
}

/// Incremental checkpoints in a whole run (`checkpoint.full_every = 3`):
/// the periodic checkpoints are a chain's base, whole, then deltas holding
/// only the rows changed since it (and the ids evicted since, under
/// `max_rows`), and every one of them — resolved onto its base, as every
/// reader does — is bit for bit the checkpoint a run saving every one
/// whole writes at the same step (one worker: the same run twice). `dtf
/// eval` scores a delta; a run resumes from one.
#[test]
fn incremental_checkpoints_restore_to_the_state_whole_ones_hold() {
    let dir = tempfile::tempdir().unwrap();
    let data = synth(dir.path(), 4000, 4, 3000);
    let run = |full_every: u32, steps: u64| {
        let ckpt = dir.path().join(format!("ckpt-{full_every}"));
        one_worker(
            &data,
            &ckpt,
            steps,
            &[
                "checkpoint.save_steps=10",
                "checkpoint.max_to_keep=100",
                &format!("checkpoint.full_every={full_every}"),
                "model.tables.max_rows=150",
            ],
        );
        ckpt
    };
    let (chained, whole) = (run(3, 60), run(1, 60));
    let file =
        |dir: &std::path::Path, step: u64| dir.join(format!("model.ckpt-{step}.safetensors"));
    let ema =
        |dir: &std::path::Path, step: u64| dir.join(format!("model.ckpt-{step}.ema.safetensors"));
    let mut removed = 0;
    for step in [10, 20, 30, 40, 50, 60] {
        let meta = dtf::checkpoint::read_metadata(&file(&chained, step)).unwrap();
        // 10 and 40 start chains, 20, 30 and 50 are deltas; the final is whole.
        let delta = [20, 30, 50].contains(&step);
        assert_eq!(
            meta["format"] == "dtf-1-delta",
            delta,
            "step {step}: {meta:?}"
        );
        assert_eq!(
            meta.contains_key("chain"),
            step != 60,
            "step {step}: {meta:?}"
        );
        let a = dtf::checkpoint::load(&file(&chained, step), None).unwrap();
        let b = dtf::checkpoint::load(&file(&whole, step), None).unwrap();
        assert_eq!(a.global_step, step);
        assert_eq!(
            (&a.variables, &a.shadows, &a.slots),
            (&b.variables, &b.shadows, &b.slots)
        );
        assert_eq!(a.tables, b.tables, "step {step}: the tables");
        if delta {
            // As written: the rows changed since the base, the ids dropped.
            let raw = dtf::checkpoint::from_bytes(
                &std::fs::read(file(&chained, step)).unwrap(),
                &std::fs::read(ema(&chained, step)).unwrap(),
                None,
            )
            .unwrap();
            let inc = raw.increment.unwrap();
            assert_eq!(inc.base, Some(if step == 50 { 40 } else { 10 }));
            removed += inc.removed.iter().map(Vec::len).sum::<usize>();
        }
    }
    assert!(removed > 0, "no delta held an evicted id");
    // Scored from a delta as from its whole twin.
    let score = |f: std::path::PathBuf| {
        let out = dtf_output(&["eval", f.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["auc"].clone()
    };
    assert_eq!(score(file(&chained, 50)), score(file(&whole, 50)));
    // A run resumes from a delta: its newest checkpoint, the final one
    // moved away.
    for f in [file(&chained, 60), ema(&chained, 60)] {
        std::fs::remove_file(f).unwrap();
    }
    let (report, stderr) = one_worker(
        &data,
        &chained,
        70,
        &["checkpoint.full_every=3", "model.tables.max_rows=150"],
    );
    assert_eq!(report["global_step"], 70, "{report}");
    assert!(stderr.contains("model.ckpt-50"), "{stderr}");
}

/// `[model.tables] moving_average = false`: the tables keep no EMA shadow.
/// The same one-worker run with and without shadows trains the same values
/// and slots (the EMA never feeds back); the dense shadows are alike; the
/// checkpoint's table shadows are the values; and a run resumed with
/// shadows on starts them there.
#[test]
fn tables_without_shadows_train_alike_and_save_their_values_as_shadows() {
    let dir = tempfile::tempdir().unwrap();
    let data = synth(dir.path(), 3000, 4, 2000);
    let run = |name: &str, steps: u64, moving_average: bool| {
        let ckpt = dir.path().join(name);
        let set = format!("model.tables.moving_average={moving_average}");
        let (report, stderr) = one_worker(&data, &ckpt, steps, &[&set]);
        assert_eq!(report["global_step"], steps, "{report}\n{stderr}");
        ckpt
    };
    let (with, without) = (run("with", 40, true), run("without", 40, false));
    let load = |dir: &std::path::Path, step: u64| {
        dtf::checkpoint::load(&dir.join(format!("model.ckpt-{step}.safetensors")), None).unwrap()
    };
    let (a, b) = (load(&with, 40), load(&without, 40));
    assert_eq!(
        (&a.variables, &a.shadows, &a.slots),
        (&b.variables, &b.shadows, &b.slots)
    );
    assert_eq!(a.tables.len(), 2);
    for ((name, ra), (_, rb)) in a.tables.iter().zip(&b.tables) {
        assert_eq!(
            (&ra.ids, &ra.values, &ra.slots),
            (&rb.ids, &rb.values, &rb.slots),
            "{name}"
        );
        assert_eq!(
            rb.shadows, rb.values,
            "{name}: no shadows, the values saved as them"
        );
        assert_ne!(ra.shadows, ra.values, "{name}: a shadow lags its value");
    }
    // Resumed with shadows: on from the values.
    run("without", 50, true);
    let c = load(&without, 50);
    assert!(
        c.tables.iter().all(|(_, r)| r.shadows != r.values),
        "the shadows moved on"
    );
}
