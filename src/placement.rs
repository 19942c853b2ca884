//! Which ps task holds which variable. Computed, not negotiated: every process
//! derives the same answer from the config, as `replica_device_setter` does.

use crate::config::{Config, ModelKind, Placement};
use crate::model::VarSpec;
use crate::model::table::{self, Rows, TableSpec, mix64};

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

/// One table's rows held by every ps (in any order, each ps's sorted or
/// not) as one whole table sorted by id: what a checkpoint holds, whatever
/// the ps count. Every part carries the same slots (a part without shadows
/// gives its values as shadows).
pub fn merge_rows(parts: &[Rows]) -> Rows {
    let dim = parts
        .iter()
        .find(|p| !p.ids.is_empty())
        .map_or(0, |p| p.values.len() / p.ids.len());
    let slots = parts.iter().map(|p| p.slots.len()).max().unwrap_or(0);
    let mut order: Vec<(u64, usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(p, rows)| rows.ids.iter().enumerate().map(move |(i, &id)| (id, p, i)))
        .collect();
    order.sort_unstable_by_key(|&(id, ..)| id);
    let mut out = Rows {
        ids: Vec::with_capacity(order.len()),
        values: Vec::with_capacity(order.len() * dim),
        shadows: Vec::with_capacity(order.len() * dim),
        slots: vec![Vec::with_capacity(order.len() * dim); slots],
    };
    for (id, p, i) in order {
        let (part, r) = (&parts[p], i * dim..(i + 1) * dim);
        out.ids.push(id);
        out.values.extend_from_slice(&part.values[r.clone()]);
        let shadows = if part.shadows.is_empty() {
            &part.values
        } else {
            &part.shadows
        };
        out.shadows.extend_from_slice(&shadows[r.clone()]);
        for (k, s) in out.slots.iter_mut().enumerate() {
            s.extend_from_slice(&part.slots[k][r.clone()]);
        }
    }
    out
}

/// A whole table's rows (sorted by id) split by [`table_owner`] onto
/// `num_ps` ps tasks, each part sorted by id: a checkpoint restored onto
/// any ps count.
pub fn split_rows(rows: &Rows, num_ps: usize) -> Vec<Rows> {
    let dim = rows.values.len().checked_div(rows.ids.len()).unwrap_or(0);
    let mut parts = vec![
        Rows {
            slots: vec![Vec::new(); rows.slots.len()],
            ..Rows::default()
        };
        num_ps
    ];
    for (i, &id) in rows.ids.iter().enumerate() {
        let (part, r) = (&mut parts[table_owner(id, num_ps)], i * dim..(i + 1) * dim);
        part.ids.push(id);
        part.values.extend_from_slice(&rows.values[r.clone()]);
        if !rows.shadows.is_empty() {
            part.shadows.extend_from_slice(&rows.shadows[r.clone()]);
        }
        for (k, s) in part.slots.iter_mut().enumerate() {
            s.extend_from_slice(&rows.slots[k][r.clone()]);
        }
    }
    parts
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
    fn a_table_saved_from_3_ps_restores_onto_1_or_4_with_identical_values() {
        // A whole table of 500 rows, 2 wide, with shadows and one slot.
        let ids: Vec<u64> = (0..500u64).map(|i| i * 7919 + 3).collect();
        let f = |k: f32| -> Vec<f32> { (0..1000).map(|i| i as f32 * 0.5 + k).collect() };
        let whole = Rows {
            ids,
            values: f(0.0),
            shadows: f(0.25),
            slots: vec![f(1.0)],
        };
        let on3 = split_rows(&whole, 3);
        for (ps, part) in on3.iter().enumerate() {
            assert!(!part.ids.is_empty());
            assert!(part.ids.iter().all(|&id| table_owner(id, 3) == ps));
            assert!(part.ids.is_sorted());
        }
        // Saved from 3 ps (their parts in any order), restored onto 1 or 4.
        let saved = merge_rows(&[on3[2].clone(), on3[0].clone(), on3[1].clone()]);
        assert_eq!(saved, whole);
        for n in [1, 4] {
            let parts = split_rows(&saved, n);
            assert_eq!(parts.iter().map(|p| p.ids.len()).sum::<usize>(), 500);
            assert_eq!(merge_rows(&parts), whole, "via {n} ps");
        }
        assert_eq!(merge_rows(&[]), Rows::default());
    }

    #[test]
    fn greedy_balances_bytes() {
        assert_eq!(assign(&specs(), 2, Placement::Greedy), vec![0, 1, 1, 1]);
    }
}
