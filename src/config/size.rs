//! The model-size bound: a model or batch that cannot fit in this
//! machine's memory is refused at validation, naming the bytes it needs,
//! rather than aborting the ps in an allocation (exit 134) or overflowing a
//! shape (exit 101) and restarting in a loop under systemd.

use super::error::ConfigError;
use super::schema::Config;

impl Config {
    /// The model against `memory` bytes (this machine's): a model that cannot
    /// fit would pass validation and then abort the ps in an allocation
    /// (exit 134), or overflow a shape and panic (exit 101), in a restart loop
    /// under systemd. Refused here, it exits 78 naming the key.
    ///
    /// Errors: [`ConfigError::Key`] for `model.layers` (the variables do not
    /// fit) or `train.batch_size` (the variables fit, a batch's activations
    /// do not), with the bytes needed.
    pub(super) fn check_fits(&self, memory: u64) -> Result<(), ConfigError> {
        let layers = &self.model.layers;
        let batch = self.train.batch_size;
        let have = format!("this machine's {memory} bytes of memory (MemTotal)");
        let Some(need) = model_bytes(layers, batch) else {
            return Err(self.bad(
                "model.layers",
                format!(
                    "invalid value {layers:?} (train.batch_size = {batch}): needs more than \
                     2^64 bytes, more than {have}: expected a smaller model"
                ),
            ));
        };
        // Each optimizer slot is one more copy of the variables on the ps.
        let slots = self.train.optimizer().slot_names().len() as u64;
        let own = need
            .ps
            .saturating_add(need.variables.saturating_mul(4 * slots));
        // With the ring of snapshot copies (`ps/replica.rs`) a ps also holds
        // its own newest snapshot for the neighbour and the neighbour's
        // while it checks and writes it (one at a time): counted as one more
        // copy of everything, a bound rather than an exact count.
        let ring = self.cluster.ps.len() >= 2
            && self.ps.snapshot_secs > 0
            && self.train.mode == super::Mode::Async;
        let ps = if ring { own.saturating_mul(2) } else { own };
        if ps > memory {
            let mut with = if slots == 0 {
                String::new()
            } else {
                format!(" and {slots} slot(s) of train.optimizer")
            };
            if ring {
                with.push_str(", twice (a ps also holds its ring neighbour's snapshot)");
            }
            return Err(self.bad(
                "model.layers",
                format!(
                    "invalid value {layers:?}: {} f32 variables and their EMA shadows{with} \
                     need at least {ps} bytes, more than {have}: expected a smaller model",
                    need.variables
                ),
            ));
        }
        if need.worker > memory {
            return Err(self.bad(
                "train.batch_size",
                format!(
                    "invalid value {batch}: with model.layers = {layers:?} a worker needs at \
                     least {} bytes (variables, gradients, a batch's activations), more than \
                     {have}: expected a smaller batch",
                    need.worker
                ),
            ));
        }
        Ok(())
    }
}

/// Memory assumed when `/proc/meminfo` cannot be read: large enough for any
/// model that trains in reasonable time, small enough to refuse the absurd.
pub const FALLBACK_MEMORY_BYTES: u64 = 256 << 30;

/// This machine's memory in bytes: `MemTotal` of `/proc/meminfo`, or
/// [`FALLBACK_MEMORY_BYTES`] where that cannot be read.
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total(&text))
        .unwrap_or(FALLBACK_MEMORY_BYTES)
}

/// `MemTotal:   24731184 kB` → bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    // The kernel always says kB (meaning KiB); anything else is not understood.
    (words.next() == Some("kB")).then(|| kib.saturating_mul(1024))
}

/// What a model needs, at least, in bytes; `None` where the count
/// overflows `u64` (more than any machine has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ModelBytes {
    /// f32 variables (weights and biases).
    variables: u64,
    /// On a ps holding them all: values and EMA shadows.
    ps: u64,
    /// On a worker: values and gradients, plus every layer's activations
    /// and their gradients for one batch.
    worker: u64,
}

/// [`ModelBytes`] of `layers` at `batch` examples, or `None` on overflow.
fn model_bytes(layers: &[usize], batch: usize) -> Option<ModelBytes> {
    let mut variables: u64 = 0;
    for pair in layers.windows(2) {
        let (fan_in, fan_out) = (u64::try_from(pair[0]).ok()?, u64::try_from(pair[1]).ok()?);
        let weights = fan_in.checked_mul(fan_out)?;
        variables = variables.checked_add(weights)?.checked_add(fan_out)?;
    }
    let widths = layers
        .iter()
        .try_fold(0u64, |sum, &w| sum.checked_add(u64::try_from(w).ok()?))?;
    let activations = u64::try_from(batch).ok()?.checked_mul(widths)?;
    // Two f32 (4 bytes) per variable on either side; two per activation.
    let ps = variables.checked_mul(8)?;
    let worker = ps.checked_add(activations.checked_mul(8)?)?;
    Some(ModelBytes {
        variables,
        ps,
        worker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::*;
    use crate::config::validate::MAX_BATCH_SIZE;

    #[test]
    fn a_model_larger_than_memory_is_refused_naming_the_bytes() {
        // [784, 1e8, 10]: 79,500,000,010 variables, 636 GB on a ps.
        let err = error_for("[model]\nlayers = [784, 100000000, 10]", "model.layers");
        assert!(err.contains("636000000080 bytes"), "{err}");
        assert!(err.contains("MemTotal"), "{err}");
    }

    #[test]
    fn adam_slots_count_towards_the_ps_memory() {
        // [784, 1e7, 10]: 7,950,000,010 variables: 63.6 GB for values and
        // shadows, 127.2 GB with Adam's two slots; the machine has 100 GB.
        let mut c = Config::default();
        c.model.layers = vec![784, 10_000_000, 10];
        c.train.optimizer = crate::config::OptimizerKind::Adam;
        let err = c.check_fits(100_000_000_000).unwrap_err().to_string();
        assert!(
            err.contains("2 slot(s)") && err.contains("127200000160 bytes"),
            "{err}"
        );
        c.train.optimizer = crate::config::OptimizerKind::Sgd;
        assert!(c.check_fits(100_000_000_000).is_ok());
    }

    #[test]
    fn the_ring_neighbours_snapshot_counts_towards_the_ps_memory() {
        // [784, 1e7, 10]: 63.6 GB of values and shadows; 127.2 GB once a ps
        // also holds its neighbour's snapshot (2 ps, async, snapshots on).
        let mut c = Config::default();
        c.model.layers = vec![784, 10_000_000, 10];
        c.cluster.ps = vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()];
        c.ps.snapshot_secs = 1;
        let err = c.check_fits(100_000_000_000).unwrap_err().to_string();
        assert!(
            err.contains("127200000160 bytes") && err.contains("ring neighbour"),
            "{err}"
        );
        // No ring: snapshots off, or one ps.
        c.ps.snapshot_secs = 0;
        assert!(c.check_fits(100_000_000_000).is_ok());
        c.ps.snapshot_secs = 1;
        c.cluster.ps.truncate(1);
        assert!(c.check_fits(100_000_000_000).is_ok());
    }

    #[test]
    fn a_model_whose_size_overflows_is_refused_not_panicking() {
        let err = error_for(
            "[model]\nlayers = [4294967296, 4294967296, 10]",
            "model.layers",
        );
        assert!(err.contains("2^64 bytes"), "{err}");
        let max = i64::MAX;
        error_for(&format!("[model]\nlayers = [{max}, {max}]"), "model.layers");
    }

    #[test]
    fn a_batch_whose_activations_cannot_fit_is_refused() {
        let err = error_for("[train]\nbatch_size = 1000000000", "train.batch_size");
        assert!(err.contains("1 to 1000000"), "{err}");
        // Within the bound, but a batch of a wide model's activations is not.
        let config = Config::from_toml_str("[model]\nlayers = [784, 5000, 10]", "/f").unwrap();
        let mut big = config.clone();
        big.train.batch_size = MAX_BATCH_SIZE;
        let need = model_bytes(&big.model.layers, big.train.batch_size).unwrap();
        assert!(need.ps < need.worker);
        let err = big.check_fits(need.worker - 1).unwrap_err().to_string();
        assert!(
            err.contains("train.batch_size") && err.contains(&need.worker.to_string()),
            "{err}"
        );
        big.check_fits(need.worker).unwrap();
        let err = big.check_fits(need.ps - 1).unwrap_err().to_string();
        assert!(err.contains("model.layers"), "{err}");
    }

    #[test]
    fn model_bytes_counts_values_shadows_gradients_and_activations() {
        // [784, 500, 10]: 392,000 + 500 + 5,000 + 10 = 397,510 variables.
        let need = model_bytes(&[784, 500, 10], 100).unwrap();
        assert_eq!(need.variables, 397_510);
        assert_eq!(need.ps, 397_510 * 8);
        assert_eq!(need.worker, 397_510 * 8 + 100 * 1294 * 8);
        assert_eq!(model_bytes(&[1 << 32, 1 << 32], 1), None);
    }

    #[test]
    fn mem_total_is_read_from_meminfo() {
        let text = "MemFree:  10 kB\nMemTotal:       24731184 kB\n";
        assert_eq!(parse_mem_total(text), Some(24_731_184 * 1024));
        assert_eq!(parse_mem_total("MemTotal: 12 MB\n"), None);
        assert_eq!(parse_mem_total(""), None);
        assert!(memory_bytes() > 0);
    }
}
