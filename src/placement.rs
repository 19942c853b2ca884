//! Which ps task holds which part of which variable. Computed, not
//! negotiated: every process derives the same answer from the config, as
//! `replica_device_setter` does.
//!
//! A variable first splits along its first axis into *parts*
//! (`model.partitioner`, TensorFlow's partitioners); the parts are then
//! placed (`cluster.placement`) as variables of their own. The ps tasks hold
//! parts and know nothing of the variables they come from; the worker's
//! client of the cluster (`transport::cluster`) splits gradients and
//! assembles values, and the chief's checkpoints hold whole variables.

use crate::config::{Config, ModelConfig, ModelKind, Partitioner, Placement};
use crate::model::VarSpec;
use crate::model::table::{self, Rows, TableSpec, mix64};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, Axis};
use std::ops::Range;

/// One part of a model variable, as a ps task holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The part's name and shape on the ps: `layer1/weights/part_0`, or
    /// the variable's own name when it is whole.
    pub spec: VarSpec,
    /// The variable it is a part of (model order).
    pub var: usize,
    /// Its rows: the range of the variable's first axis it holds.
    pub rows: Range<usize>,
    /// Its f32 values within the variable's row-major data: a slice along
    /// the first axis is contiguous, so a part is one range.
    pub range: Range<usize>,
}

/// The number of parts a variable of `shape` splits into.
///
/// As TensorFlow computes it (tensorflow/python/ops/partitioned_variables.py):
/// `fixed_size_partitioner(num_shards)` gives `min(num_shards, shape[0])`;
/// `min_max_variable_partitioner(max_partitions, min_slice_size)`, which
/// TF2's `MinSizePartitioner(min_shard_bytes, max_shards)` calls, gives
/// `max(1, min(shape[0], max_partitions, ceil(bytes / min_slice_size)))` —
/// a ceiling, so a variable just over `min_shard_bytes` makes two parts.
/// `max_shards = 0` stands for the ps count (TF's Keras examples pass
/// `max_shards = num_ps`). A scalar is never split.
pub fn part_count(shape: &[usize], model: &ModelConfig, num_ps: usize) -> usize {
    let Some(&rows) = shape.first() else {
        return 1;
    };
    let n = match model.partitioner {
        Partitioner::None => 1,
        Partitioner::Fixed => model.partitions.min(rows),
        Partitioner::MinSize => {
            let bytes = 4 * shape.iter().product::<usize>();
            let max = if model.max_shards == 0 {
                num_ps
            } else {
                model.max_shards
            };
            bytes
                .div_ceil(model.min_shard_bytes.max(1))
                .min(max)
                .min(rows)
        }
    };
    n.max(1)
}

/// The parts of every variable, variable by variable, in order.
///
/// The rows are cut as TensorFlow's `_iter_slices`
/// (tensorflow/python/ops/variable_scope.py) cuts them: each part gets
/// `rows / n` rows and the first `rows % n` parts one more; part `i` is
/// named `<variable>/part_<i>`. A variable in one part keeps its name.
pub fn partition(vars: &[VarSpec], model: &ModelConfig, num_ps: usize) -> Vec<Part> {
    let mut parts = Vec::new();
    for (var, spec) in vars.iter().enumerate() {
        let n = part_count(&spec.shape, model, num_ps);
        let len: usize = spec.shape.iter().product();
        if n == 1 {
            let rows = spec.shape.first().copied().unwrap_or(1);
            parts.push(Part {
                spec: spec.clone(),
                var,
                rows: 0..rows,
                range: 0..len,
            });
            continue;
        }
        let rows = spec.shape[0];
        let row_len = len / rows;
        let (each, excess) = (rows / n, rows % n);
        let mut start = 0;
        for i in 0..n {
            let count = each + usize::from(i < excess);
            let mut shape = spec.shape.clone();
            shape[0] = count;
            parts.push(Part {
                spec: VarSpec {
                    name: format!("{}/part_{i}", spec.name),
                    shape,
                },
                var,
                rows: start..start + count,
                range: start * row_len..(start + count) * row_len,
            });
            start += count;
        }
    }
    parts
}

/// The ps task index of each variable (or part), in `vars` order.
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
        ModelKind::WideDeep => table::wide_deep(config.model.embedding_dim)
            .into_iter()
            .map(|mut t| {
                t.slots = config
                    .table_optimizer(&t.name)
                    .map_or(&[], |o| o.slot_names());
                t
            })
            .collect(),
    }
}

/// The variables (parts) held by ps task `ps` under `config`, in model order.
pub fn shard(config: &Config, vars: &[VarSpec], ps: usize) -> Vec<VarSpec> {
    Layout::new(config, vars.to_vec()).shard(ps)
}

/// The model's variables, their parts and where each part lives.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The model's variables, whole, in model order.
    vars: Vec<VarSpec>,
    /// Every part, variable by variable: what the ps tasks hold.
    parts: Vec<Part>,
    /// The ps task of each part.
    owner: Vec<usize>,
}

impl Layout {
    /// The layout `config` gives `vars` (partitioner, ps count, placement).
    pub fn new(config: &Config, vars: Vec<VarSpec>) -> Self {
        let num_ps = config.cluster.ps.len().max(1);
        let parts = partition(&vars, &config.model, num_ps);
        let specs: Vec<VarSpec> = parts.iter().map(|p| p.spec.clone()).collect();
        let owner = assign(&specs, num_ps, config.cluster.placement);
        Self { vars, parts, owner }
    }

    /// The model's variables, whole.
    pub fn vars(&self) -> &[VarSpec] {
        &self.vars
    }

    /// Every part, variable by variable.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The ps task of each part.
    pub fn owner(&self) -> &[usize] {
        &self.owner
    }

    /// Every part's name and shape, in part order.
    pub fn part_specs(&self) -> Vec<VarSpec> {
        self.parts.iter().map(|p| p.spec.clone()).collect()
    }

    /// Whether every variable is in one part (then parts are variables).
    pub fn whole(&self) -> bool {
        self.parts.len() == self.vars.len()
    }

    /// The parts held by ps task `ps`, in part order.
    pub fn shard(&self, ps: usize) -> Vec<VarSpec> {
        self.parts
            .iter()
            .zip(&self.owner)
            .filter(|(_, o)| **o == ps)
            .map(|(p, _)| p.spec.clone())
            .collect()
    }

    /// The f32 values each ps task holds (its parts' sizes; slots excluded).
    pub fn parameters(&self, num_ps: usize) -> Vec<u64> {
        let mut out = vec![0u64; num_ps];
        for (p, &o) in self.parts.iter().zip(&self.owner) {
            if let Some(n) = out.get_mut(o) {
                *n += p.range.len() as u64;
            }
        }
        out
    }

    /// Views of every part of `whole` (model order, the variables' shapes),
    /// in part order: no copy.
    ///
    /// Panics if `whole` is not the model's arrays (a bug: dtf builds them).
    pub fn views<'a>(&self, whole: &'a [ArrayD<f32>]) -> Vec<ArrayViewD<'a, f32>> {
        let mut out = Vec::with_capacity(self.parts.len());
        let mut parts = self.parts.iter().peekable();
        for (var, array) in whole.iter().enumerate() {
            if array.ndim() == 0 {
                if parts.next_if(|p| p.var == var).is_some() {
                    out.push(array.view());
                }
                continue;
            }
            let mut rest = array.view();
            while let Some(p) = parts.next_if(|p| p.var == var) {
                let (head, tail) = rest.split_at(Axis(0), p.rows.len());
                out.push(head);
                rest = tail;
            }
        }
        out
    }

    /// Mutable views of every part of `whole`, in part order: no copy.
    ///
    /// Panics as [`Layout::views`].
    pub fn views_mut<'a>(&self, whole: &'a mut [ArrayD<f32>]) -> Vec<ArrayViewMutD<'a, f32>> {
        let mut out = Vec::with_capacity(self.parts.len());
        let mut parts = self.parts.iter().peekable();
        for (var, array) in whole.iter_mut().enumerate() {
            if array.ndim() == 0 {
                if parts.next_if(|p| p.var == var).is_some() {
                    out.push(array.view_mut());
                }
                continue;
            }
            let mut rest = array.view_mut();
            while let Some(p) = parts.next_if(|p| p.var == var) {
                let (head, tail) = rest.split_at(Axis(0), p.rows.len());
                out.push(head);
                rest = tail;
            }
        }
        out
    }

    /// Copies of every part of `whole`, in part order (seeding a ps).
    pub fn split(&self, whole: &[ArrayD<f32>]) -> Vec<ArrayD<f32>> {
        self.views(whole)
            .into_iter()
            .map(|v| v.to_owned())
            .collect()
    }
}

/// One table's rows held by every ps (in any order, each ps's sorted or
/// not) as one whole table sorted by id: what a checkpoint holds, whatever
/// the ps count. Every part carries the same slots (a part without shadows
/// gives its values as shadows).
///
/// The parts are consumed one kind of array at a time (values, then
/// shadows, then each slot), each freed once gathered: a table of
/// millions of rows takes its own size plus one array's, not twice its
/// size, while it is merged (the chief's checkpoint of a large table).
pub fn merge_rows(mut parts: Vec<Rows>) -> Rows {
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
    for p in &mut parts {
        p.ids = Vec::new();
    }
    // Gathers one array of every part in id order, freeing each part's.
    let gather = |parts: &mut [Rows], array: &dyn Fn(&mut Rows) -> &mut Vec<f32>| {
        let mut out = Vec::with_capacity(order.len() * dim);
        for &(_, p, i) in &order {
            let from = &array(&mut parts[p]);
            out.extend_from_slice(&from[i * dim..(i + 1) * dim]);
        }
        for p in parts.iter_mut() {
            *array(p) = Vec::new();
        }
        out
    };
    let ids = order.iter().map(|&(id, ..)| id).collect();
    // A part without shadows gives its values: copied before they go.
    for p in &mut parts {
        if p.shadows.is_empty() {
            p.shadows = p.values.clone();
        }
    }
    let values = gather(&mut parts, &|r| &mut r.values);
    let shadows = gather(&mut parts, &|r| &mut r.shadows);
    let slots = (0..slots)
        .map(|k| gather(&mut parts, &|r| &mut r.slots[k]))
        .collect();
    Rows {
        ids,
        values,
        shadows,
        slots,
    }
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

    fn model(partitioner: Partitioner, partitions: usize, max_shards: usize) -> ModelConfig {
        ModelConfig {
            partitioner,
            partitions,
            max_shards,
            ..ModelConfig::default()
        }
    }

    fn shapes(parts: &[Part], var: usize) -> Vec<(String, Vec<usize>)> {
        parts
            .iter()
            .filter(|p| p.var == var)
            .map(|p| (p.spec.name.clone(), p.spec.shape.clone()))
            .collect()
    }

    fn config(ps: usize, model: ModelConfig) -> Config {
        let mut c = Config::default();
        c.cluster.ps = (0..ps).map(|i| format!("127.0.0.1:{}", 2000 + i)).collect();
        c.model = model;
        c
    }

    #[test]
    fn round_robin_in_creation_order() {
        assert_eq!(assign(&specs(), 2, Placement::RoundRobin), vec![0, 1, 0, 1]);
        assert_eq!(assign(&specs(), 3, Placement::RoundRobin), vec![0, 1, 2, 0]);
        let c = config(2, model(Partitioner::None, 0, 0));
        assert_eq!(shard(&c, &specs(), 1)[0].name, "layer1/biases");
    }

    #[test]
    fn merged_parts_without_shadows_give_their_values() {
        let with = Rows {
            ids: vec![5, 1],
            values: vec![5.0, 5.5, 1.0, 1.5],
            shadows: vec![-5.0, -5.5, -1.0, -1.5],
            slots: vec![vec![50.0, 55.0, 10.0, 15.0]],
        };
        let without = Rows {
            ids: vec![3],
            values: vec![3.0, 3.5],
            shadows: Vec::new(),
            slots: vec![vec![30.0, 35.0]],
        };
        let whole = merge_rows(vec![with, without]);
        assert_eq!(whole.ids, [1, 3, 5]);
        assert_eq!(whole.values, [1.0, 1.5, 3.0, 3.5, 5.0, 5.5]);
        assert_eq!(whole.shadows, [-1.0, -1.5, 3.0, 3.5, -5.0, -5.5]);
        assert_eq!(whole.slots, [vec![10.0, 15.0, 30.0, 35.0, 50.0, 55.0]]);
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
        let saved = merge_rows(vec![on3[2].clone(), on3[0].clone(), on3[1].clone()]);
        assert_eq!(saved, whole);
        for n in [1, 4] {
            let parts = split_rows(&saved, n);
            assert_eq!(parts.iter().map(|p| p.ids.len()).sum::<usize>(), 500);
            assert_eq!(merge_rows(parts), whole, "via {n} ps");
        }
        assert_eq!(merge_rows(Vec::new()), Rows::default());
    }

    #[test]
    fn greedy_balances_bytes() {
        assert_eq!(assign(&specs(), 2, Placement::Greedy), vec![0, 1, 1, 1]);
    }

    #[test]
    fn none_keeps_every_variable_whole() {
        let parts = partition(&specs(), &model(Partitioner::None, 0, 0), 3);
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().zip(specs()).all(|(p, s)| p.spec == s));
    }

    #[test]
    fn fixed_cuts_uneven_rows_as_tensorflow_does() {
        // 784 = 3 * 261 + 1: the first part takes the extra row.
        let parts = partition(&specs(), &model(Partitioner::Fixed, 3, 0), 1);
        assert_eq!(
            shapes(&parts, 0),
            [
                ("layer1/weights/part_0".to_string(), vec![262, 500]),
                ("layer1/weights/part_1".to_string(), vec![261, 500]),
                ("layer1/weights/part_2".to_string(), vec![261, 500]),
            ]
        );
        assert_eq!(parts[0].range, 0..262 * 500);
        assert_eq!(parts[1].rows, 262..523);
        assert_eq!(parts[2].range, 523 * 500..784 * 500);
        // 10 rows in 4: 3, 3, 2, 2; a bias of 500 in 3: 167, 167, 166.
        let parts = partition(&specs(), &model(Partitioner::Fixed, 4, 0), 1);
        let rows: Vec<usize> = parts
            .iter()
            .filter(|p| p.var == 3)
            .map(|p| p.spec.shape[0])
            .collect();
        assert_eq!(rows, [3, 3, 2, 2]);
        let parts = partition(&specs(), &model(Partitioner::Fixed, 3, 0), 1);
        let rows: Vec<usize> = parts
            .iter()
            .filter(|p| p.var == 1)
            .map(|p| p.spec.shape[0])
            .collect();
        assert_eq!(rows, [167, 167, 166]);
    }

    #[test]
    fn fixed_never_cuts_more_parts_than_rows() {
        let parts = partition(&specs(), &model(Partitioner::Fixed, 16, 0), 1);
        assert_eq!(parts.iter().filter(|p| p.var == 3).count(), 10);
        assert!(parts.iter().all(|p| p.spec.shape[0] >= 1));
    }

    #[test]
    fn min_size_splits_big_variables_up_to_the_ps_count() {
        let m = ModelConfig::default();
        // One ps: nothing splits (every variable keeps its name).
        assert_eq!(partition(&specs(), &m, 1).len(), 4);
        // Two ps: 1,568,000 bytes is over 256 KiB; the rest stay whole.
        let parts = partition(&specs(), &m, 2);
        assert_eq!(
            shapes(&parts, 0),
            [
                ("layer1/weights/part_0".to_string(), vec![392, 500]),
                ("layer1/weights/part_1".to_string(), vec![392, 500]),
            ]
        );
        assert_eq!(parts.len(), 5);
        assert_eq!(parts[2].spec.name, "layer1/biases");
        // ceil(1,568,000 / 262,144) = 6 parts at most, whatever the ps count.
        assert_eq!(part_count(&[784, 500], &m, 16), 6);
        // An explicit max_shards wins over the ps count.
        assert_eq!(
            part_count(&[784, 500], &model(Partitioner::MinSize, 0, 3), 2),
            3
        );
        // Just over the minimum: a ceiling, two parts (as TensorFlow).
        let m = ModelConfig {
            min_shard_bytes: 1000,
            ..model(Partitioner::MinSize, 0, 8)
        };
        assert_eq!(part_count(&[251], &m, 1), 2);
        assert_eq!(part_count(&[250], &m, 1), 1);
        // Never more parts than rows, never fewer than one.
        assert_eq!(part_count(&[3, 100_000], &m, 1), 3);
        assert_eq!(part_count(&[], &m, 1), 1);
    }

    #[test]
    fn parts_are_placed_round_robin_as_variables() {
        let c = config(2, ModelConfig::default());
        let layout = Layout::new(&c, specs());
        assert_eq!(layout.owner(), [0, 1, 0, 1, 0]);
        let names = |ps| -> Vec<String> { layout.shard(ps).into_iter().map(|s| s.name).collect() };
        assert_eq!(
            names(0),
            ["layer1/weights/part_0", "layer1/biases", "layer2/biases"]
        );
        assert_eq!(names(1), ["layer1/weights/part_1", "layer2/weights"]);
        assert_eq!(
            layout.parameters(2),
            [392 * 500 + 500 + 10, 392 * 500 + 500 * 10]
        );
        assert_eq!(shard(&c, &specs(), 1), layout.shard(1));
    }

    #[test]
    fn views_cover_each_variable_in_order() {
        let c = config(3, model(Partitioner::Fixed, 3, 0));
        let layout = Layout::new(&c, specs());
        let mut whole: Vec<ArrayD<f32>> = specs()
            .iter()
            .map(|s| {
                let n: usize = s.shape.iter().product();
                ArrayD::from_shape_vec(s.shape.as_slice(), (0..n).map(|x| x as f32).collect())
                    .unwrap()
            })
            .collect();
        let split = layout.split(&whole);
        for (p, a) in layout.parts().iter().zip(&split) {
            assert_eq!(a.shape(), p.spec.shape.as_slice());
            assert_eq!(a.as_slice().unwrap()[0], p.range.start as f32);
        }
        let mut views = layout.views_mut(&mut whole);
        views[1].fill(-1.0);
        drop(views);
        assert!(
            whole[0].as_slice().unwrap()[262 * 500..523 * 500]
                .iter()
                .all(|&x| x == -1.0)
        );
        assert_eq!(whole[0].as_slice().unwrap()[523 * 500], (523 * 500) as f32);
    }
}
