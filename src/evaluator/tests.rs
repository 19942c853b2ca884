//! The evaluator's unit tests: the ledger, the best set, scores.

use super::*;

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

#[test]
fn the_ledger_skips_a_torn_line_and_the_next_append_is_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(LEDGER);
    let r = |step| Record {
        global_step: step,
        scores: scores(0.5, 1.0),
    };
    append_ledger(&path, &r(10)).unwrap();
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"{\"global_step\": 2").unwrap();
    append_ledger(&path, &r(30)).unwrap();
    let read = read_ledger(&path).unwrap();
    assert_eq!(read.keys().copied().collect::<Vec<_>>(), [10, 30]);
}
