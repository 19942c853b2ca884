//! `dtf bench`: the in-process half of `docs/benchmarks.md` — the compute
//! limit (one thread, no network), its scaling with the hidden width, and
//! checkpoint save/restore times. The cluster half (throughput, startup,
//! memory) runs real processes and lives in `scripts/bench.sh`.
//!
//! Timings are medians of several rounds: the machine is shared, and the
//! median is robust to a round that another process disturbed.

use crate::checkpoint::{self, Checkpoint, Saver};
use crate::data::{Batches, Dataset, Split};
use crate::kernel::{self, Precision, Tier};
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
    /// The GEMMs' number format.
    pub precision: Precision,
    /// The tier its GEMMs ran on (`f32` for `float32`).
    pub kernel: String,
    /// Median steps per second.
    pub steps_per_sec: f64,
    /// Median milliseconds per step.
    pub ms_per_step: f64,
    /// Arithmetic rate by wall time, counting the flops the step computes
    /// ([`flops_per_step`]).
    pub gflops: f64,
    /// Every round's steps per second.
    pub rounds: Vec<f64>,
    /// Median steps per second of this thread's CPU time: insensitive to
    /// time spent descheduled, so comparable across a shared machine's
    /// load (caches are still shared).
    pub cpu_steps_per_sec: f64,
    /// Arithmetic rate by CPU time.
    pub cpu_gflops: f64,
}

/// One core's measured arithmetic peaks ([`crate::kernel::peak`]), GFLOP/s
/// by CPU time; `None` where the CPU lacks the instruction.
#[derive(Debug, Clone, Serialize)]
pub struct Peaks {
    /// f32 `vfmadd` on AVX-512 (2 flops a lane).
    pub f32_fma: Option<f64>,
    /// `vdpbf16ps` (4 flops a lane).
    pub bf16_dot: Option<f64>,
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
    /// The kernel tier `mixed_bfloat16` runs on in this process (`DTF_KERNEL` applied).
    pub kernel: String,
    /// Whether the measuring thread flushed denormals (FTZ and DAZ), as
    /// every computing thread of a cluster does by default.
    pub denormals_flushed: bool,
    /// One core's arithmetic peaks.
    pub peaks: Peaks,
    /// The reference model's compute limit, `float32`.
    pub compute: Compute,
    /// The same, `mixed_bfloat16` (rounds interleaved with `compute`'s).
    pub compute_bf16: Compute,
    /// Per-width measurements (hidden width scaling), both precisions.
    pub scaling: Vec<Compute>,
    /// The ps's CPU per update, per optimizer (the reference model, one shard).
    pub ps_updates: Vec<PsUpdate>,
    /// Checkpoint save and restore.
    pub checkpoints: Checkpoints,
}

/// Flops a step computes: 2·n·in·out per GEMM, three GEMMs per layer
/// (forward, dW, dX) except the first layer's dX, which nothing needs and
/// `loss_and_grads_into` does not compute: `2n·(2·Σ in·out + Σ_{l>1} in·out)`.
/// For [784, 500, 10] at batch 100, 159.8 MFLOP (not 6·n·Σ = 238.2).
pub fn flops_per_step(layers: &[usize], batch: usize) -> f64 {
    let macs: Vec<usize> = layers.windows(2).map(|w| w[0] * w[1]).collect();
    let all: usize = macs.iter().sum();
    let dx: usize = macs.iter().skip(1).sum();
    2.0 * batch as f64 * (2 * all + dx) as f64
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

/// Steps per second of `loss_and_grads_into` on real mini-batches, one
/// thread, in each of `precisions`: the precisions' rounds alternate
/// (A, B, A, B, …) so a change in the machine's load falls on all of them.
///
/// Errors: none beyond a bad `layers` ([`BenchError::Model`]).
pub fn compute(
    train: &Dataset,
    layers: &[usize],
    batch: usize,
    precisions: &[Precision],
    rounds: usize,
    round_secs: f64,
) -> Result<Vec<Compute>, BenchError> {
    let mlp = Mlp::new(layers)?;
    let params = mlp.init(0);
    let mut grads: Vec<ArrayD<f32>> = params.iter().map(|p| ArrayD::zeros(p.shape())).collect();
    let mut ws = Workspace::default();
    let mut batches = Batches::new(train.len(), batch, 1);
    let mut x = Array2::<f32>::zeros((batch, train.features()));
    let mut y = Vec::with_capacity(batch);
    let mut step = |mlp: &Mlp, x: &mut Array2<f32>, y: &mut Vec<u8>| {
        train.batch(batches.next_indices(), x, y);
        std::hint::black_box(mlp.loss_and_grads_into(
            &params,
            x.view(),
            &*y,
            1e-4,
            &mut ws,
            &mut grads,
        ));
    };
    let models: Vec<Mlp> = precisions
        .iter()
        .map(|&p| mlp.clone().with_precision(p))
        .collect();
    // Warm up and size a round to about `round_secs`, per precision.
    let steps: Vec<usize> = models
        .iter()
        .map(|m| {
            let t = Instant::now();
            let mut warm = 0;
            while warm < 3 || t.elapsed().as_secs_f64() < 0.2 {
                step(m, &mut x, &mut y);
                warm += 1;
            }
            let per = t.elapsed().as_secs_f64() / warm as f64;
            ((round_secs / per) as usize).max(3)
        })
        .collect();
    let mut rates = vec![(Vec::new(), Vec::new()); models.len()];
    for _ in 0..rounds.max(1) {
        for ((m, &steps), (wall, cpu)) in models.iter().zip(&steps).zip(&mut rates) {
            let (t, c) = (Instant::now(), thread_cpu_secs());
            for _ in 0..steps {
                step(m, &mut x, &mut y);
            }
            wall.push(steps as f64 / t.elapsed().as_secs_f64());
            cpu.push(steps as f64 / (thread_cpu_secs() - c).max(1e-9));
        }
    }
    let flops = flops_per_step(layers, batch);
    Ok(precisions
        .iter()
        .zip(rates)
        .map(|(&precision, (wall, cpu))| {
            let (sps, cpu_sps) = (median(&wall), median(&cpu));
            let tier = match precision {
                Precision::Float32 => Tier::F32,
                Precision::MixedBfloat16 => kernel::tier(),
            };
            Compute {
                layers: layers.to_vec(),
                batch,
                precision,
                kernel: tier.name().into(),
                steps_per_sec: sps,
                ms_per_step: 1e3 / sps,
                gflops: flops * sps / 1e9,
                rounds: wall,
                cpu_steps_per_sec: cpu_sps,
                cpu_gflops: flops * cpu_sps / 1e9,
            }
        })
        .collect())
}

/// One core's peaks: the median of `rounds` runs of each probe, by CPU time.
pub fn peaks(rounds: usize) -> Peaks {
    let rate = |probe: fn(usize) -> Option<(f64, f32)>| {
        probe(1000)?;
        let rates: Vec<f64> = (0..rounds.max(1))
            .filter_map(|_| {
                let c = thread_cpu_secs();
                let (flops, v) = probe(2_000_000)?;
                std::hint::black_box(v);
                Some(flops / (thread_cpu_secs() - c).max(1e-9) / 1e9)
            })
            .collect();
        Some(median(&rates))
    };
    Peaks {
        f32_fma: rate(kernel::peak::fma_f32),
        bf16_dot: rate(kernel::peak::dot_bf16),
    }
}

/// One optimizer's cost on the ps: an async update of the reference model.
#[derive(Debug, Clone, Serialize)]
pub struct PsUpdate {
    /// The optimizer (`train.optimizer`).
    pub optimizer: String,
    /// Median CPU microseconds per update: `Shard::push_bytes`, the rule's
    /// pass over every variable, its shadow and slots, and the swap.
    pub us: f64,
    /// `us` over SGD's.
    pub vs_sgd: f64,
}

/// CPU time per ps update for each optimizer, rounds interleaved.
///
/// Errors: [`BenchError::Model`] for a bad `layers`.
pub fn ps_updates(layers: &[usize], rounds: usize) -> Result<Vec<PsUpdate>, BenchError> {
    use crate::optimizer::Optimizer;
    use crate::ps::shard::{Rule, Shard};
    let mlp = Mlp::new(layers)?;
    let values = mlp.init(0);
    let grads: Vec<ArrayD<f32>> = values.iter().map(|v| v.mapv(|x| x * 1e-3)).collect();
    let bytes: Vec<&[u8]> = grads
        .iter()
        .map(|g| bytemuck::cast_slice(g.as_slice().expect("arrays built by dtf are contiguous")))
        .collect();
    let optimizers = [
        Optimizer::Sgd,
        Optimizer::Momentum {
            momentum: 0.9,
            use_nesterov: false,
        },
        Optimizer::Adam {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        },
        Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        },
    ];
    let mut shards: Vec<Shard> = optimizers
        .iter()
        .map(|&o| {
            let mut s = Shard::new(0, mlp.variables(), Rule::Async, 0.99, o);
            s.set_last_step(u64::MAX);
            s.initialize(values.clone(), None, None, 0, true);
            s
        })
        .collect();
    const UPDATES: usize = 50;
    let mut times = vec![Vec::new(); shards.len()];
    for _ in 0..rounds.max(1) + 1 {
        for (shard, t) in shards.iter_mut().zip(&mut times) {
            let c = thread_cpu_secs();
            for _ in 0..UPDATES {
                let step = shard.step();
                // A push of finite gradients at a small rate cannot fail.
                let _ = std::hint::black_box(shard.push_bytes(&bytes, 1e-3, step, 0, 1.0));
            }
            t.push((thread_cpu_secs() - c) / UPDATES as f64 * 1e6);
        }
    }
    // The first round warms caches and faults the scratch arrays in.
    let us: Vec<f64> = times.iter().map(|t| median(&t[1..])).collect();
    Ok(optimizers
        .iter()
        .zip(&us)
        .map(|(o, &us_o)| PsUpdate {
            optimizer: o.name().into(),
            us: us_o,
            vs_sgd: us_o / us[0],
        })
        .collect())
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
            run: 0,
            shard_steps: Vec::new(),
            table_optimizers: Vec::new(),
            increment: None,
            tables: Vec::new(),
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
    // This thread computes everything below, as a worker's and a ps's do:
    // under their default `train.flush_denormals`.
    kernel::flush_denormals(true);
    let train = Dataset::load(&opts.data, Split::Train)?;
    let reference = [train.features(), 500, 10];
    let both = [Precision::Float32, Precision::MixedBfloat16];
    let peaks = peaks(opts.rounds);
    let mut pair = compute(
        &train,
        &reference,
        opts.batch,
        &both,
        opts.rounds,
        opts.round_secs,
    )?;
    let compute_bf16 = pair.pop().expect("one measurement per precision");
    let compute_ref = pair.pop().expect("one measurement per precision");
    let mut scaling = Vec::new();
    for &w in &opts.widths {
        scaling.extend(compute(
            &train,
            &[train.features(), w, 10],
            opts.batch,
            &both,
            opts.rounds.min(5),
            opts.round_secs,
        )?);
    }
    let ps_updates = ps_updates(&reference, opts.rounds)?;
    let tmp = tempfile::tempdir()?;
    let checkpoints = checkpoints(&reference, opts.rounds, tmp.path())?;
    Ok(Report {
        cpu: cpu_model(),
        kernel: kernel::tier().name().into(),
        denormals_flushed: kernel::denormals_flushed(),
        peaks,
        compute: compute_ref,
        compute_bf16,
        ps_updates,
        scaling,
        checkpoints,
    })
}

/// The report as a human-readable table.
pub fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "cpu: {}\nkernel (mixed_bfloat16): {}\ndenormals flushed: {}\n",
        r.cpu, r.kernel, r.denormals_flushed
    );
    let peak = |p: Option<f64>| p.map_or("n/a".to_owned(), |p| format!("{p:.1} GFLOP/s"));
    let _ = writeln!(
        out,
        "one core's peak (CPU time): f32 FMA {}, bf16 dot {}",
        peak(r.peaks.f32_fma),
        peak(r.peaks.bf16_dot)
    );
    let c = &r.compute;
    let _ = writeln!(
        out,
        "compute limit {:?} batch {}, {:.1} MFLOP a step as computed (no dX for layer 1):",
        c.layers,
        c.batch,
        flops_per_step(&c.layers, c.batch) / 1e6
    );
    for c in [&r.compute, &r.compute_bf16] {
        let of_peak = r.peaks.f32_fma.map_or(String::new(), |p| {
            format!(", {:.0} % of the f32 peak", 100.0 * c.cpu_gflops / p)
        });
        let _ = writeln!(
            out,
            "  {:<14} ({:<10}): {:.1} steps/s ({:.1} per CPU-second), {:.3} ms/step, {:.1} GFLOP/s ({:.1} by CPU time{of_peak})",
            c.precision.name(),
            c.kernel,
            c.steps_per_sec,
            c.cpu_steps_per_sec,
            c.ms_per_step,
            c.gflops,
            c.cpu_gflops
        );
    }
    let _ = writeln!(
        out,
        "  mixed_bfloat16 / float32: {:.2}× (steps per CPU-second)",
        r.compute_bf16.cpu_steps_per_sec / r.compute.cpu_steps_per_sec
    );
    for s in &r.scaling {
        let _ = writeln!(
            out,
            "  width {:>5} {:<14}: {:>8.2} ms/step {:>7.1} steps/s {:>6.1} GFLOP/s",
            s.layers[1],
            s.precision.name(),
            s.ms_per_step,
            s.steps_per_sec,
            s.gflops
        );
    }
    let simd = if kernel::simd_available() {
        "AVX-512"
    } else {
        "baseline x86-64"
    };
    let _ = writeln!(
        out,
        "ps update of {:?} ({simd}), CPU per update:",
        r.compute.layers
    );
    for u in &r.ps_updates {
        let _ = writeln!(
            out,
            "  {:<9} {:>8.1} µs  {:>5.2}× SGD",
            u.optimizer, u.us, u.vs_sgd
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
