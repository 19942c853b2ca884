//! Live reload: which keys may change while a task runs, what applies each,
//! and the check that a new file changes nothing else.
//!
//! [`LIVE_KEYS`] is the one list: [`Config::reload`] accepts exactly these
//! keys, and `dtf.toml(5)` must mark exactly these `Reloads live.` (a test
//! in `tests/it/docs.rs` holds it to that).

use super::error::ConfigError;
use super::schema::{Config, leaves};

/// What, in a running task, puts a changed live key into effect. Each
/// reads the new value from the config `watch` channel the daemon's
/// reload publishes to; nothing else needs telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applier {
    /// `daemon::reload` swaps the tracing filter.
    LogFilter,
    /// The worker's training loop (`worker::run`) re-reads it every step.
    TrainingLoop,
    /// The chief's checkpoint timer (`worker::CheckpointTimer`) re-reads it
    /// at least every second and at each save; the chief's step loop
    /// re-reads `save_steps` every step.
    CheckpointTimer,
    /// `metrics::spawn` re-binds `/metrics` when the address changes.
    MetricsServer,
    /// The membership: each ps (`ps::serve`'s watcher) changes its member
    /// list and epoch at once; each worker's step loop checks between steps
    /// whether it is still listed, and leaves if not.
    Membership,
    /// The placement: each ps stops taking pushes; the chief writes a
    /// checkpoint from the old ps tasks and tells them; then every task
    /// starts again under the new list (`daemon::reexec`) and the chief
    /// seeds the new placement from that checkpoint.
    Reshard,
}

/// A key that may change while the cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveKey {
    /// The dotted key, e.g. `train.last_step`.
    pub key: &'static str,
    /// What applies a new value.
    pub applied_by: Applier,
}

/// Every key [`Config::reload`] applies to a running task; every other key
/// needs a restart of the cluster.
pub const LIVE_KEYS: &[LiveKey] = &[
    live("log.level", Applier::LogFilter),
    live("checkpoint.save_secs", Applier::CheckpointTimer),
    live("checkpoint.save_steps", Applier::CheckpointTimer),
    live("checkpoint.max_to_keep", Applier::CheckpointTimer),
    live("checkpoint.full_every", Applier::CheckpointTimer),
    live("train.last_step", Applier::TrainingLoop),
    live("train.learning_rate", Applier::TrainingLoop),
    live("train.learning_rate_decay", Applier::TrainingLoop),
    live("train.lr_schedule", Applier::TrainingLoop),
    live("train.learning_rate_decay_steps", Applier::TrainingLoop),
    live("train.staircase", Applier::TrainingLoop),
    live("train.lr_boundaries", Applier::TrainingLoop),
    live("train.lr_values", Applier::TrainingLoop),
    live("train.cosine_alpha", Applier::TrainingLoop),
    live("train.warmup_steps", Applier::TrainingLoop),
    live("train.log_step_count_steps", Applier::TrainingLoop),
    live("train.save_summaries_steps", Applier::TrainingLoop),
    live("metrics.listen", Applier::MetricsServer),
    live("cluster.worker", Applier::Membership),
    live("cluster.ps", Applier::Reshard),
];

/// A [`LiveKey`] (a `const fn`, so the table stays one line per key).
const fn live(key: &'static str, applied_by: Applier) -> LiveKey {
    LiveKey { key, applied_by }
}

/// Whether `key` (dotted) may change while the cluster runs.
pub fn is_live(key: &str) -> bool {
    LIVE_KEYS.iter().any(|live| live.key == key)
}

impl Config {
    /// Validates `new` as a reload of `self`: an error names every key that
    /// cannot change live (cluster, model, mode, ...); otherwise returns `new`.
    ///
    /// `new` must already be validated ([`Config::load`] does). The keys that
    /// may differ are [`LIVE_KEYS`].
    /// Errors: [`ConfigError::NotReloadable`] naming every such key.
    pub fn reload(&self, mut new: Config) -> Result<Config, ConfigError> {
        // With `model.hidden`, the running widths were resolved from the data
        // at start ([`Config::resolve_layers`]); the same hidden widths mean
        // the same model, without reading the data set again.
        if new.model.hidden.is_some() && new.model.hidden == self.model.hidden {
            new.model.layers = self.model.layers.clone();
        }
        let keys: Vec<String> = self
            .changed_keys(&new)
            .into_iter()
            .filter(|key| !is_live(key))
            .collect();
        if !keys.is_empty() {
            return Err(ConfigError::NotReloadable { keys });
        }
        self.check_worker_change(&new)?;
        self.check_ps_change(&new)?;
        Ok(new)
    }

    /// A live change of `cluster.ps` (a re-shard) keeps every ps that stays
    /// at its index: ps N is `cluster.ps[N]`, the instance `dtf-ps@N`, and a
    /// ps that finds its address at another index exits, with no unit of
    /// that index to take its place. Entries are added and removed at the
    /// end, or replaced where they are (another host for that index).
    ///
    /// Errors: [`ConfigError::Key`] for `cluster.ps`, naming the entry.
    fn check_ps_change(&self, new: &Config) -> Result<(), ConfigError> {
        let (old, now) = (&self.cluster.ps, &new.cluster.ps);
        for (i, addr) in old.iter().enumerate() {
            // Respelled counts as the same: `127.0.0.1:A, 127.0.0.1:B` →
            // `localhost:B, localhost:A` swaps two ps tasks.
            if let Some(j) = now
                .iter()
                .position(|a| super::validate::same_endpoint(a, addr))
                && j != i
            {
                return Err(new.bad(
                    "cluster.ps",
                    format!(
                        "{addr:?} moved from entry {i} to entry {j}: a running ps keeps its \
                         index (dtf-ps@{i}), so entries are added and removed at the end of the \
                         list, or replaced in place"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A live change of `cluster.worker` keeps every remaining worker's task
    /// index, and the chief: worker N is `cluster.worker[N]`, so entries are
    /// added and removed at the end of the list, and the entries kept stay
    /// as they were. (`new` is validated: not empty, no duplicate address,
    /// enough workers for `train.replicas_to_aggregate`.)
    ///
    /// Errors: [`ConfigError::Key`] for `cluster.worker`, saying which entry
    /// changed and what to do instead.
    fn check_worker_change(&self, new: &Config) -> Result<(), ConfigError> {
        let (old, now) = (&self.cluster.worker, &new.cluster.worker);
        let Some(i) = old.iter().zip(now).position(|(a, b)| a != b) else {
            return Ok(());
        };
        let problem = if i == 0 {
            format!(
                "worker 0, the chief, cannot be removed or replaced while the cluster runs \
                 (cluster.worker[0] must stay {:?}; to move the chief, stop the cluster, edit, \
                 and start it again: it resumes from the newest checkpoint)",
                old[0]
            )
        } else {
            format!(
                "entry {i} changed from {:?} to {:?}: a running worker keeps its index, so \
                 workers are added and removed at the end of the list only (to remove worker \
                 {i}, remove it and every entry after it, then add those back)",
                old[i], now[i]
            )
        };
        Err(new.bad("cluster.worker", problem))
    }

    /// Each key whose value differs between `self` and `other`, as
    /// `train.learning_rate: 0.01 → 0.05` (sorted by key; a key set on one
    /// side only shows `unset` on the other).
    pub fn changes(&self, other: &Config) -> Vec<String> {
        let (a, b) = (leaves(self), leaves(other));
        let show =
            |v: Option<&serde_json::Value>| v.map_or_else(|| "unset".into(), |v| v.to_string());
        self.changed_keys(other)
            .into_iter()
            .map(|key| format!("{key}: {} → {}", show(a.get(&key)), show(b.get(&key))))
            .collect()
    }

    /// The dotted keys (`section.key`) whose values differ between `self`
    /// and `other`, sorted.
    pub fn changed_keys(&self, other: &Config) -> Vec<String> {
        let (a, b) = (leaves(self), leaves(other));
        let mut keys: Vec<String> = a
            .iter()
            .filter(|(key, value)| b.get(*key) != Some(value))
            .map(|(key, _)| key.clone())
            .chain(b.keys().filter(|key| !a.contains_key(*key)).cloned())
            .collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;

    #[test]
    fn a_reload_shows_each_change_as_old_to_new() {
        let old = Config::from_toml_str("[train]\nlearning_rate = 0.01\n", "f").unwrap();
        let new = Config::from_toml_str(
            "[train]\nlearning_rate = 0.05\n[checkpoint]\nsave_secs = 30\n",
            "f",
        )
        .unwrap();
        assert_eq!(
            old.changes(&new),
            [
                "checkpoint.save_secs: unset → 30",
                "train.learning_rate: 0.01 → 0.05"
            ]
        );
        assert!(old.changes(&old.clone()).is_empty());
    }

    #[test]
    fn widths_resolved_from_the_data_survive_a_reload() {
        let text = "[model]\nhidden = [8]\n";
        let mut old = Config::from_toml_str(text, "f").unwrap();
        old.resolve_layers(4, 3, "d").unwrap();
        let new = Config::from_toml_str(&format!("{text}[train]\nlast_step = 5\n"), "f").unwrap();
        let reloaded = old.reload(new).unwrap();
        assert_eq!(reloaded.model.layers, [4, 8, 3]);
        let other = Config::from_toml_str("[model]\nhidden = [9]\n", "f").unwrap();
        let err = old.reload(other).unwrap_err().to_string();
        assert!(err.contains("model.hidden"), "{err}");
    }

    #[test]
    fn reload_accepts_live_keys_only() {
        let old = Config::default();
        let mut new = old.clone();
        new.train.last_step = 30000;
        new.log.level = "debug".into();
        new.checkpoint.save_secs = Some(10);
        assert_eq!(
            old.changed_keys(&new),
            ["checkpoint.save_secs", "log.level", "train.last_step"]
        );
        assert_eq!(old.reload(new.clone()).unwrap(), new);

        let rejected = |change: fn(&mut Config), key: &str| {
            let mut new = old.clone();
            change(&mut new);
            let err = old.reload(new).unwrap_err().to_string();
            assert_eq!(
                err,
                format!("{key} cannot change while running (restart the cluster to change it)")
            );
        };
        // The ps list re-shards: entries added or removed at the end, or
        // replaced in place; none moves.
        let mut more_ps = old.clone();
        more_ps.cluster.ps.push("h:9".into());
        assert_eq!(old.reload(more_ps.clone()).unwrap(), more_ps);
        assert_eq!(more_ps.reload(old.clone()).unwrap(), old);
        let mut replaced = more_ps.clone();
        replaced.cluster.ps[0] = "h:10".into();
        assert_eq!(more_ps.reload(replaced.clone()).unwrap(), replaced);
        let mut moved = more_ps.clone();
        moved.cluster.ps.remove(0);
        let err = more_ps.reload(moved).unwrap_err().to_string();
        assert!(
            err.contains("cluster.ps") && err.contains("moved from entry 1 to entry 0"),
            "{err}"
        );
        // Respelled, a swap is still a move (issue 44): `localhost:X` is
        // `127.0.0.1:X`, as the duplicate check has it.
        let mut local = old.clone();
        local.cluster.ps = vec!["127.0.0.1:9001".into(), "127.0.0.1:9002".into()];
        let mut swapped = local.clone();
        swapped.cluster.ps = vec!["localhost:9002".into(), "LOCALHOST:9001".into()];
        let err = local.reload(swapped).unwrap_err().to_string();
        assert!(err.contains("moved from entry 0 to entry 1"), "{err}");
        let mut respelled = local.clone();
        respelled.cluster.ps = vec!["localhost:9001".into(), "[::ffff:127.0.0.1]:9002".into()];
        assert_eq!(local.reload(respelled.clone()).unwrap(), respelled);
        // Workers come and go at the end of the list.
        let mut grown = old.clone();
        grown.cluster.worker.push("h:7".into());
        assert_eq!(old.reload(grown.clone()).unwrap(), grown);
        assert_eq!(grown.reload(old.clone()).unwrap(), old);
        let mut chief = grown.clone();
        chief.cluster.worker[0] = "h:8".into();
        let err = grown.reload(chief).unwrap_err().to_string();
        assert!(
            err.contains("cluster.worker")
                && err.contains("worker 0, the chief, cannot be removed"),
            "{err}"
        );
        let mut middle = grown.clone();
        middle.cluster.worker.push("h:9".into());
        middle.cluster.worker.remove(1);
        let err = grown.reload(middle).unwrap_err().to_string();
        assert!(err.contains("entry 1 changed"), "{err}");
        rejected(|c| c.model.layers = vec![784, 10], "model.layers");
        rejected(|c| c.train.mode = Mode::Sync, "train.mode");
        rejected(
            |c| c.train.replicas_to_aggregate = Some(1),
            "train.replicas_to_aggregate",
        );

        let mut new = old.clone();
        new.train.batch_size = 7;
        new.train.seed = 1;
        let err = old.reload(new).unwrap_err().to_string();
        assert!(
            err.starts_with("train.batch_size, train.seed cannot change"),
            "{err}"
        );
    }

    #[test]
    fn reloadable_keys_are_real_keys() {
        // Unset by default, so not a leaf of the default config.
        let mut config = Config::default();
        config.checkpoint.save_secs = Some(60);
        let keys = leaves(&config);
        for live in LIVE_KEYS {
            assert!(
                keys.contains_key(live.key),
                "{} is not a config key",
                live.key
            );
        }
    }
}
