//! The evaluator's unit tests: the ledger, the best set, scores.

use super::ledger::MAX_LEDGER_LINE;
use super::*;
use std::io::Write;

fn scores(ema_accuracy: f32, loss: f32) -> Scores {
    Scores {
        accuracy: 0.5,
        ema_accuracy,
        loss,
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
