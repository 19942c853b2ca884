//! `dtf bench`: the in-process half of `docs/benchmarks.md` — the compute
//! limit (one thread, no network), its scaling with the hidden width, and
//! checkpoint save/restore times. The cluster half (throughput, startup,
//! memory) runs real processes and lives in `scripts/bench.sh`.
//!
//! Timings are medians of several rounds: the machine is shared, and the
//! median is robust to a round that another process disturbed.

use crate::checkpoint::{self, Checkpoint, Saver};
use crate::data::{Batches, Dataset, Split};
use crate::model::{Mlp, Workspace};
use ndarray::{Array2, ArrayD};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory of the IDX files (the real train set feeds the compute benchmark).
    pub data: std::path::PathBuf,
    /// Hidden widths for the scaling table (the reference is 500).
    pub widths: Vec<usize>,
    /// Mini-batch size.
    pub batch: usize,
    /// Timed rounds per measurement; the median is reported.
    pub rounds: usize,
    /// Approximate seconds per round.
    pub round_secs: f64,
}

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("temporary directory: {0}")]
    Io(#[from] std::io::Error),
}

/// One compute measurement: a forward+backward step of one model on one thread.
#[derive(Debug, Clone, Serialize)]
pub struct Compute {
    /// Widths, input first.
    pub layers: Vec<usize>,
    /// Rows per step.
    pub batch: usize,
    /// Median steps per second.
    pub steps_per_sec: f64,
    /// Median milliseconds per step.
    pub ms_per_step: f64,
    /// Arithmetic rate, counting 6·batch·Σ(in·out) flops per step (2 forward, 4 backward).
    pub gflops: f64,
    /// Every round's steps per second.
    pub rounds: Vec<f64>,
    /// Median steps per second of this thread's CPU time: insensitive to
    /// time spent descheduled, so comparable across a shared machine's
    /// load (caches are still shared).
    pub cpu_steps_per_sec: f64,
}

/// Checkpoint costs for the reference model (variables + EMA shadows, two files, fsynced).
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoints {
    /// Median milliseconds to save (write, fsync, rename, index).
    pub save_ms: f64,
    /// Median milliseconds to find, verify and load the newest checkpoint.
    pub restore_ms: f64,
    /// Bytes on disk per checkpoint (both files).
    pub bytes: u64,
}

/// The whole in-process report (`dtf bench --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The CPU as /proc/cpuinfo names it.
    pub cpu: String,
    /// The reference model's compute limit.
    pub compute: Compute,
    /// Per-width measurements (hidden width scaling).
    pub scaling: Vec<Compute>,
    /// Checkpoint save and restore.
    pub checkpoints: Checkpoints,
}

/// Flops per step: 2·n·Σ(in·out) forward, 4·n·Σ(in·out) backward (dW and dX).
pub fn flops_per_step(layers: &[usize], batch: usize) -> f64 {
    let macs: usize = layers.windows(2).map(|w| w[0] * w[1]).sum();
    6.0 * batch as f64 * macs as f64
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// Steps per second of `loss_and_grads_into` on real mini-batches, one thread.
///
/// Errors: none beyond a bad `layers` ([`BenchError::Model`]).
pub fn compute(
    train: &Dataset,
    layers: &[usize],
    batch: usize,
    rounds: usize,
    round_secs: f64,
) -> Result<Compute, BenchError> {
    let mlp = Mlp::new(layers)?;
    let params = mlp.init(0);
    let mut grads: Vec<ArrayD<f32>> = params.iter().map(|p| ArrayD::zeros(p.shape())).collect();
    let mut ws = Workspace::default();
    let mut batches = Batches::new(train.len(), batch, 1);
    let mut x = Array2::<f32>::zeros((batch, train.features()));
    let mut y = Vec::with_capacity(batch);
    let mut step = |x: &mut Array2<f32>, y: &mut Vec<u8>| {
        train.batch(batches.next_indices(), x, y);
        std::hint::black_box(mlp.loss_and_grads_into(
            &params,
            x.view(),
            y,
            1e-4,
            &mut ws,
            &mut grads,
        ));
    };
    // Warm up and size a round to about `round_secs`.
    let t = Instant::now();
    let mut warm = 0;
    while warm < 3 || t.elapsed().as_secs_f64() < 0.2 {
        step(&mut x, &mut y);
        warm += 1;
    }
    let per = t.elapsed().as_secs_f64() / warm as f64;
    let steps = ((round_secs / per) as usize).max(3);
    let (rates, cpu_rates): (Vec<f64>, Vec<f64>) = (0..rounds.max(1))
        .map(|_| {
            let (t, c) = (Instant::now(), thread_cpu_secs());
            for _ in 0..steps {
                step(&mut x, &mut y);
            }
            (
                steps as f64 / t.elapsed().as_secs_f64(),
                steps as f64 / (thread_cpu_secs() - c).max(1e-9),
            )
        })
        .unzip();
    let sps = median(&rates);
    Ok(Compute {
        layers: layers.to_vec(),
        batch,
        steps_per_sec: sps,
        ms_per_step: 1e3 / sps,
        gflops: flops_per_step(layers, batch) * sps / 1e9,
        rounds: rates,
        cpu_steps_per_sec: median(&cpu_rates),
    })
}

/// Save and restore times of a checkpoint of `layers` in a temporary directory.
///
/// Errors: [`BenchError::Checkpoint`] when saving or restoring fails.
pub fn checkpoints(layers: &[usize], rounds: usize, tmp: &Path) -> Result<Checkpoints, BenchError> {
    let mlp = Mlp::new(layers)?;
    let specs = mlp.variables();
    let values = mlp.init(0);
    let named = |v: &[ArrayD<f32>]| {
        specs
            .iter()
            .map(|s| s.name.clone())
            .zip(v.iter().cloned())
            .collect::<Vec<_>>()
    };
    let saver = Saver::new(tmp, 5)?;
    let (mut save, mut restore) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for round in 0..rounds.max(1) {
        let ckpt = Checkpoint {
            global_step: round as u64 + 1,
            variables: named(&values),
            shadows: named(&values),
            slots: Default::default(),
        };
        let t = Instant::now();
        let path = saver.save(&ckpt)?;
        save.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(checkpoint::restore_latest(tmp, &specs)?);
        restore.push(t.elapsed().as_secs_f64() * 1e3);
        bytes = std::fs::metadata(&path)?.len() * 2;
    }
    Ok(Checkpoints {
        save_ms: median(&save),
        restore_ms: median(&restore),
        bytes,
    })
}

/// CPU seconds this thread has used.
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The CPU model from /proc/cpuinfo ("unknown" elsewhere).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Runs every in-process benchmark.
///
/// Errors: [`BenchError`] when the data cannot be read or a checkpoint fails.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let train = Dataset::load(&opts.data, Split::Train)?;
    let reference = [train.features(), 500, 10];
    let compute_ref = compute(&train, &reference, opts.batch, opts.rounds, opts.round_secs)?;
    let scaling = opts
        .widths
        .iter()
        .map(|&w| {
            compute(
                &train,
                &[train.features(), w, 10],
                opts.batch,
                opts.rounds.min(5),
                opts.round_secs,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tmp = tempfile::tempdir()?;
    let checkpoints = checkpoints(&reference, opts.rounds, tmp.path())?;
    Ok(Report {
        cpu: cpu_model(),
        compute: compute_ref,
        scaling,
        checkpoints,
    })
}

/// The report as a human-readable table.
pub fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = format!("cpu: {}\n", r.cpu);
    let c = &r.compute;
    let _ = writeln!(
        out,
        "compute limit {:?} batch {}: {:.1} steps/s ({:.1} per CPU-second), {:.3} ms/step, {:.1} GFLOP/s (6·n·Σ in·out per step)",
        c.layers, c.batch, c.steps_per_sec, c.cpu_steps_per_sec, c.ms_per_step, c.gflops
    );
    for s in &r.scaling {
        let _ = writeln!(
            out,
            "  width {:>5}: {:>8.2} ms/step {:>7.1} steps/s {:>6.1} GFLOP/s",
            s.layers[1], s.ms_per_step, s.steps_per_sec, s.gflops
        );
    }
    let k = &r.checkpoints;
    let _ = writeln!(
        out,
        "checkpoint: save {:.1} ms, restore {:.1} ms, {} bytes",
        k.save_ms, k.restore_ms, k.bytes
    );
    out
}
