//! The ps load benchmark's compute-free worker (`DTF_BENCH_REPLAY=1`,
//! `scripts/bench.sh`): it computes one real gradient, on its first batch,
//! and pushes that same gradient at every later step. What remains of a
//! step is the worker's side of the push, so the cluster runs as fast as
//! its ps tasks take pushes: their capacity, measured on any machine (on 2
//! cores a computing worker, not the ps, is the bound). Training with it
//! is meaningless; nothing but the benchmark sets it.

use ndarray::{ArrayD, ArrayViewMutD};

/// The environment variable that turns a worker into a replaying one.
pub const ENV: &str = "DTF_BENCH_REPLAY";

/// The gradient a replaying worker pushes (`None` before its first step).
#[derive(Debug, Default)]
pub struct Replay {
    saved: Option<(Vec<ArrayD<f32>>, f32)>,
}

impl Replay {
    /// A replaying worker's, when [`ENV`] is `1`.
    pub fn from_env() -> Option<Self> {
        (std::env::var(ENV).as_deref() == Ok("1")).then(Self::default)
    }

    /// Writes the saved gradient into `grads` and returns its loss, or
    /// `None` before the first step ([`Replay::save`] it then).
    pub fn write(&self, grads: &mut [ArrayViewMutD<f32>]) -> Option<f32> {
        let (saved, loss) = self.saved.as_ref()?;
        for (g, s) in grads.iter_mut().zip(saved) {
            g.assign(s);
        }
        Some(*loss)
    }

    /// Keeps the first step's gradient and loss.
    pub fn save(&mut self, grads: &[ArrayViewMutD<f32>], loss: f32) {
        self.saved = Some((grads.iter().map(|g| g.to_owned()).collect(), loss));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;

    #[test]
    fn computes_once_then_writes_the_saved_gradient() {
        let mut replay = Replay::default();
        let mut calls = 0;
        for i in 0..3 {
            let mut g = ArrayD::<f32>::from_elem(IxDyn(&[2, 2]), -1.0);
            let mut views = [g.view_mut()];
            let loss = replay.write(&mut views).unwrap_or_else(|| {
                calls += 1;
                views[0].fill(i as f32 + 0.5);
                replay.save(&views, 7.0);
                7.0
            });
            assert_eq!(loss, 7.0);
            assert!(g.iter().all(|&v| v == 0.5), "step {i}: {g:?}");
        }
        assert_eq!(calls, 1);
    }
}
