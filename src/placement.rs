//! Which ps task holds which variable. Computed, not negotiated: every process
//! derives the same answer from the config, as `replica_device_setter` does.

use crate::config::{Config, ModelKind, Placement};
use crate::model::VarSpec;
use crate::model::table::{self, TableSpec, mix64};

/// The ps task index of each variable, in `vars` order.
pub fn assign(vars: &[VarSpec], num_ps: usize, strategy: Placement) -> Vec<usize> {
    assert!(
        num_ps > 0,
        "a cluster has at least one ps task (validated in config)"
    );
    match strategy {
        Placement::RoundRobin => (0..vars.len()).map(|i| i % num_ps).collect(),
        Placement::Greedy => {
            // Largest first onto the least-loaded ps; ties by index so all agree.
            let mut order: Vec<usize> = (0..vars.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(vars[i].shape.iter().product::<usize>()));
            let mut load = vec![0usize; num_ps];
            let mut out = vec![0; vars.len()];
            for i in order {
                let ps = (0..num_ps).min_by_key(|&p| (load[p], p)).unwrap_or(0);
                load[ps] += vars[i].shape.iter().product::<usize>();
                out[i] = ps;
            }
            out
        }
    }
}

/// The ps task that owns row `id` of every table: a strong 64-bit mix of
/// the id ([`mix64`]) reduced to `0..num_ps`. Not `id % n`: ids are often
/// hashes already, but as often small counters or codes whose low bits
/// cluster; the mix spreads either evenly. The one definition every
/// process (ps, worker, chief, restore) uses, so rows move only when the
/// ps count changes.
pub fn table_owner(id: u64, num_ps: usize) -> usize {
    assert!(
        num_ps > 0,
        "a cluster has at least one ps task (validated in config)"
    );
    // Lemire's multiply-shift: unbiased enough for any ps count, no division.
    ((u128::from(mix64(id)) * num_ps as u128) >> 64) as usize
}

/// The embedding tables of the model `config` describes, in a fixed order:
/// none for the MLP; wide & deep's two ([`table::wide_deep`]) for
/// `model.kind = "wide_deep"`. Every ps holds every table, each the rows
/// [`table_owner`] gives it.
pub fn tables(config: &Config) -> Vec<TableSpec> {
    match config.model.kind {
        ModelKind::Mlp => Vec::new(),
        ModelKind::WideDeep => table::wide_deep(config.model.embedding_dim),
    }
}

/// The variables held by ps task `ps`, in model order.
pub fn shard(vars: &[VarSpec], num_ps: usize, strategy: Placement, ps: usize) -> Vec<VarSpec> {
    assign(vars, num_ps, strategy)
        .into_iter()
        .zip(vars)
        .filter(|(p, _)| *p == ps)
        .map(|(_, v)| v.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<VarSpec> {
        [
            ("layer1/weights", vec![784, 500]),
            ("layer1/biases", vec![500]),
            ("layer2/weights", vec![500, 10]),
            ("layer2/biases", vec![10]),
        ]
        .into_iter()
        .map(|(n, s)| VarSpec {
            name: n.into(),
            shape: s,
        })
        .collect()
    }

    #[test]
    fn round_robin_in_creation_order() {
        assert_eq!(assign(&specs(), 2, Placement::RoundRobin), vec![0, 1, 0, 1]);
        assert_eq!(assign(&specs(), 3, Placement::RoundRobin), vec![0, 1, 2, 0]);
        assert_eq!(
            shard(&specs(), 2, Placement::RoundRobin, 1)[0].name,
            "layer1/biases"
        );
    }

    #[test]
    fn table_rows_spread_over_1_2_3_ps_by_hash() {
        for num_ps in 1..=3 {
            let mut count = vec![0usize; num_ps];
            // Sequential ids: `id % n` would spread these too, but their
            // hash must not follow the id's low bits.
            for id in 0..30_000u64 {
                let ps = table_owner(id, num_ps);
                assert!(ps < num_ps);
                count[ps] += 1;
            }
            let even = 30_000 / num_ps;
            for c in &count {
                assert!(c.abs_diff(even) < even / 20, "{count:?} for {num_ps} ps");
            }
        }
        assert!((0..100).all(|id| table_owner(id, 1) == 0));
        // Ids that share their low bits still spread.
        let strided: Vec<usize> = (0..64u64).map(|i| table_owner(i << 32, 2)).collect();
        assert!(strided.contains(&0) && strided.contains(&1));
        // Not the id modulo the count.
        assert!((0..64u64).any(|id| table_owner(id, 3) != (id % 3) as usize));
    }

    #[test]
    fn greedy_balances_bytes() {
        assert_eq!(assign(&specs(), 2, Placement::Greedy), vec![0, 1, 1, 1]);
    }
}
