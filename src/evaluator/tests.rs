//! The evaluator's unit tests: the ledger, the best set, scores.

use super::ledger::MAX_LEDGER_LINE;
use super::*;
use std::io::Write;

fn scores(ema_accuracy: f32, loss: f32) -> Scores {
    Scores {
        accuracy: 0.5,
        ema_accuracy,
        loss,
        ..Scores::none()
    }
}

/// A wide & deep checkpoint's scores: accuracy at ½ the same for all.
fn binary_scores(auc: f32, ema_auc: f32) -> Scores {
    Scores {
        accuracy: 0.8,
        ema_accuracy: 0.8,
        loss: 0.45,
        auc,
        ema_auc,
        ..Scores::none()
    }
}

#[test]
fn the_best_set_keeps_the_best_by_its_metric_and_survives_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("best");
    let mut best = Best::open(&dir, Metric::EmaAccuracy, 2).unwrap();
    let kept: Vec<bool> = [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.4), (50, 0.6)]
        .iter()
        .map(|&(step, ema)| best.offer(step, scores(ema, 1.0), b"m", b"e").unwrap())
        .collect();
    // 50 ties with 30: the older one stays.
    assert_eq!(kept, [true, true, true, false, false]);
    let steps = |b: &Best| {
        b.entries()
            .iter()
            .map(|e| e.global_step)
            .collect::<Vec<_>>()
    };
    assert_eq!(steps(&best), [20, 30]);
    let mut files: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "index.json",
            "model.ckpt-20.ema.safetensors",
            "model.ckpt-20.safetensors",
            "model.ckpt-30.ema.safetensors",
            "model.ckpt-30.safetensors"
        ]
    );
    let again = Best::open(&dir, Metric::EmaAccuracy, 2).unwrap();
    assert_eq!(steps(&again), [20, 30]);
    // Fewer kept after a config change: the worst goes at once.
    let fewer = Best::open(&dir, Metric::EmaAccuracy, 1).unwrap();
    assert_eq!(steps(&fewer), [20]);
    assert!(!dir.join("model.ckpt-30.safetensors").exists());
}

#[test]
fn loss_ranks_lower_first_and_nan_last() {
    let tmp = tempfile::tempdir().unwrap();
    let mut best = Best::open(&tmp.path().join("best"), Metric::Loss, 3).unwrap();
    for (step, loss) in [(1, 0.9), (2, f32::NAN), (3, 0.3), (4, 0.5)] {
        best.offer(step, scores(0.5, loss), b"m", b"e").unwrap();
    }
    let steps: Vec<u64> = best.entries().iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [3, 4, 1]);
}

/// The steps read back from a ledger that holds step 10, then `junk`
/// written as is, then step 30 appended.
fn steps_around(junk: &[u8]) -> Vec<u64> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    let r = |step| Record {
        global_step: step,
        scores: scores(0.5, 1.0),
    };
    append_ledger(&path, &r(10)).unwrap();
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(junk).unwrap();
    append_ledger(&path, &r(30)).unwrap();
    read_ledger(&path).unwrap().keys().copied().collect()
}

#[test]
fn the_ledger_skips_a_torn_line_and_the_next_append_is_whole() {
    assert_eq!(steps_around(b"{\"global_step\": 2"), [10, 30]);
}

/// Issue 25: a checkpoint that scores a NaN loss got into `best/`; its
/// index then did not parse, and a restart deleted every pair.
#[test]
fn a_non_finite_score_never_ranks_and_a_restart_keeps_the_best() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("best");
    let mut best = Best::open(&dir, Metric::EmaAccuracy, 2).unwrap();
    assert!(best.offer(10, scores(0.5, 1.0), b"m", b"e").unwrap());
    assert!(!best.offer(20, scores(0.9, f32::NAN), b"m", b"e").unwrap());
    assert!(
        !best
            .offer(30, scores(f32::INFINITY, 1.0), b"m", b"e")
            .unwrap()
    );
    let again = Best::open(&dir, Metric::EmaAccuracy, 2).unwrap();
    let steps: Vec<u64> = again.entries().iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [10]);
    assert!(dir.join("model.ckpt-10.safetensors").is_file());
    assert!(!dir.join("model.ckpt-20.safetensors").exists());
}

/// A NaN score is a record in the ledger (JSON writes it as null), not a
/// line skipped and scored again after every restart.
#[test]
fn a_nan_score_is_remembered_by_the_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    let record = Record {
        global_step: 7,
        scores: scores(0.5, f32::NAN),
    };
    append_ledger(&path, &record).unwrap();
    let read = read_ledger(&path).unwrap();
    assert!(read[&7].loss.is_nan());
}

/// Issue 25: one `\xff` byte in the ledger made the evaluator exit 1 at
/// start, again and again; a line longer than any record is skipped too.
#[test]
fn a_ledger_line_that_is_not_utf8_or_too_long_is_skipped() {
    let mut junk = b"{\"global_step\": 11, \"x\": \"\xff\"}\n".to_vec();
    junk.extend(vec![b'x'; 3 * MAX_LEDGER_LINE]);
    junk.push(b'\n');
    assert_eq!(steps_around(&junk), [10, 30]);
}

/// Issue 25: a FIFO as the ledger made the evaluator deaf to SIGTERM: the
/// open blocked. Now both reading and appending refuse it at once.
#[test]
fn a_fifo_as_the_ledger_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let read = read_ledger(&p).map(|_| ()).map_err(|e| e.to_string());
        let append = append_ledger(
            &p,
            &Record {
                global_step: 1,
                scores: scores(0.5, 1.0),
            },
        )
        .map_err(|e| e.to_string());
        let _ = tx.send((read, append));
    });
    let (read, append) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the ledger's open returned");
    assert!(read.unwrap_err().contains("FIFO"));
    assert!(append.unwrap_err().contains("FIFO"));
}

/// Issue 25: every append read the whole ledger (a 2 GiB ledger took
/// 2.16 GB to score one checkpoint). Now only its last byte is read: a
/// sparse terabyte ledger takes one line more.
#[test]
fn appending_to_a_huge_ledger_reads_only_its_last_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    let f = fs::File::create(&path).unwrap();
    f.set_len(1 << 40).unwrap();
    append_ledger(
        &path,
        &Record {
            global_step: 3,
            scores: scores(0.5, 1.0),
        },
    )
    .unwrap();
    let len = fs::metadata(&path).unwrap().len();
    let mut tail = vec![0u8; 100];
    use std::os::unix::fs::FileExt;
    let file = fs::File::open(&path).unwrap();
    file.read_exact_at(&mut tail, len - 100).unwrap();
    let text = String::from_utf8_lossy(&tail);
    // The sparse zeros are a torn line: the record starts a line of its own.
    assert!(text.contains("\n{\"global_step\":3"), "{text}");
}

/// A ledger written before AUCs were scored still reads (every MLP line
/// it holds, with a NaN loss too), its AUCs NaN; a wide & deep line reads
/// its AUCs back; an MLP line is written as before, without them.
#[test]
fn the_ledger_reads_lines_of_before_aucs_and_lines_with_them() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    fs::write(
        &path,
        concat!(
            "{\"global_step\":10,\"accuracy\":0.5,\"ema_accuracy\":0.6,\"loss\":1.25}\n",
            "{\"global_step\":20,\"accuracy\":0.5,\"ema_accuracy\":0.6,\"loss\":null}\n",
        ),
    )
    .unwrap();
    let wide_deep = Record {
        global_step: 30,
        scores: binary_scores(0.75, 0.78),
    };
    append_ledger(&path, &wide_deep).unwrap();
    let mlp = Record {
        global_step: 40,
        scores: scores(0.7, 0.9),
    };
    append_ledger(&path, &mlp).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[3],
        "{\"global_step\":40,\"accuracy\":0.5,\"ema_accuracy\":0.7,\"loss\":0.9}"
    );
    assert!(lines[2].contains("\"auc\":0.75,\"ema_auc\":0.78"), "{text}");

    let read = read_ledger(&path).unwrap();
    assert_eq!(read.keys().copied().collect::<Vec<_>>(), [10, 20, 30, 40]);
    let old = read[&10];
    assert_eq!((old.ema_accuracy, old.loss), (0.6, 1.25));
    assert!(old.auc.is_nan() && old.ema_auc.is_nan());
    assert!(old.finite(), "an MLP's scores without AUCs can rank");
    assert!(!read[&20].finite());
    assert_eq!((read[&30].auc, read[&30].ema_auc), (0.75, 0.78));
    assert!(read[&30].finite());
    assert!(read[&40].finite() && read[&40].auc.is_nan());
}

/// A binary model's scores are finite only with both AUCs: one NaN AUC
/// (a side that diverged) keeps it out of the best set.
#[test]
fn a_binary_model_with_one_nan_auc_is_not_finite() {
    assert!(binary_scores(0.7, 0.71).finite());
    assert!(!binary_scores(f32::NAN, 0.71).finite());
    assert!(!binary_scores(0.7, f32::INFINITY).finite());
}

#[test]
fn auc_ranks_higher_first_and_a_checkpoint_without_one_is_never_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("best");
    let mut best = Best::open(&dir, Metric::EmaAuc, 2).unwrap();
    // EMA AUC ranks, not AUC: step 2's raw AUC is the highest.
    let offers = [
        (1, binary_scores(0.70, 0.72)),
        (2, binary_scores(0.90, 0.71)),
        (3, binary_scores(0.60, 0.80)),
        (4, binary_scores(0.65, 0.75)),
        // An MLP's scores (no AUC) cannot rank by AUC.
        (5, scores(0.99, 0.01)),
    ];
    let kept: Vec<bool> = offers
        .iter()
        .map(|&(step, s)| best.offer(step, s, b"m", b"e").unwrap())
        .collect();
    assert_eq!(kept, [true, true, true, true, false]);
    let steps = |b: &Best| {
        b.entries()
            .iter()
            .map(|e| e.global_step)
            .collect::<Vec<_>>()
    };
    assert_eq!(steps(&best), [3, 4]);
    // The index keeps the AUCs: reopened, the same ranking.
    let index = fs::read_to_string(dir.join("index.json")).unwrap();
    assert!(
        index.contains("\"metric\": \"ema_auc\"") || index.contains("\"metric\":\"ema_auc\""),
        "{index}"
    );
    let again = Best::open(&dir, Metric::EmaAuc, 2).unwrap();
    assert_eq!(steps(&again), [3, 4]);
    assert_eq!(again.entries()[0].scores.ema_auc, 0.80);
    // Ranked by raw AUC after a config change: 4 beats 3.
    let by_auc = Best::open(&dir, Metric::Auc, 2).unwrap();
    assert_eq!(steps(&by_auc), [4, 3]);
}

/// An index written before AUCs (an MLP run's) reopens as it was.
#[test]
fn an_index_of_before_aucs_reopens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("best");
    fs::create_dir(&dir).unwrap();
    for step in [10, 20] {
        fs::write(dir.join(format!("model.ckpt-{step}.safetensors")), b"m").unwrap();
        fs::write(dir.join(format!("model.ckpt-{step}.ema.safetensors")), b"e").unwrap();
    }
    fs::write(
        dir.join("index.json"),
        r#"{"metric": "ema_accuracy", "checkpoints": [
            {"file": "model.ckpt-20.safetensors", "global_step": 20, "accuracy": 0.5, "ema_accuracy": 0.7, "loss": 0.9},
            {"file": "model.ckpt-10.safetensors", "global_step": 10, "accuracy": 0.5, "ema_accuracy": 0.6, "loss": 1.0}
        ]}"#,
    )
    .unwrap();
    let best = Best::open(&dir, Metric::EmaAccuracy, 2).unwrap();
    let steps: Vec<u64> = best.entries().iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [20, 10]);
    assert!(best.entries()[0].scores.auc.is_nan());
    assert!(dir.join("model.ckpt-10.safetensors").is_file());
}
