use super::*;
use crate::model::table::{TableInit, wide_deep};
use crate::ps::shard::Rule;

const ADAGRAD: TableOptimizer = TableOptimizer::Adagrad {
    initial_accumulator_value: 0.1,
};

/// A table of zeros, `dim` wide, no EMA warm-up surprises (decay 0.99).
fn table(dim: usize, optimizer: TableOptimizer, rule: Rule) -> Table {
    let spec = TableSpec {
        name: "t".into(),
        dim,
        init: TableInit::Zeros,
        slots: &[],
    };
    Table::new(spec, optimizer, rule, Some(0.99))
}

fn pulled(t: &mut Table, ids: &[u64]) -> Vec<f32> {
    let mut out = Vec::new();
    t.pull(ids, false, &mut out).unwrap();
    out
}

fn close(a: f32, b: f64) {
    assert!((f64::from(a) - b).abs() <= 1e-6, "{a} vs {b}");
}

#[test]
fn sparse_sgd_updates_only_the_pushed_rows() {
    let mut t = table(2, TableOptimizer::Sgd, Rule::Async);
    assert_eq!(pulled(&mut t, &[5, 6]), vec![0.0; 4]);
    let o = t.push(&[5], &[1.0, -2.0], 0.1, 0, 0, false).unwrap();
    assert_eq!(o, Outcome::Applied);
    // w = 0 − 0.1·g.
    assert_eq!(pulled(&mut t, &[5, 6]), vec![-0.1, 0.2, 0.0, 0.0]);
    // The shadow of the updated row moved by 1 − decay (step 0: decay
    // min(0.99, 1/10) = 0.1): 0 − 0.9·(0 − w).
    let mut sh = Vec::new();
    t.pull(&[5, 6], true, &mut sh).unwrap();
    close(sh[0], -0.09);
    close(sh[1], 0.18);
    assert_eq!(&sh[2..], &[0.0, 0.0]);
    assert_eq!(t.counters().pushes_applied, 1);
}

#[test]
fn sparse_adagrad_matches_tensorflows_sparse_apply() {
    let mut t = table(1, ADAGRAD, Rule::Async);
    // accum 0.1 + 0.25 = 0.35; w = −0.1·0.5/√0.35.
    t.push(&[9], &[0.5], 0.1, 0, 0, false).unwrap();
    let w1 = -0.05 / 0.35f64.sqrt();
    close(pulled(&mut t, &[9])[0], w1);
    // accum 1.35; w −= 0.1·1/√1.35.
    t.push(&[9], &[1.0], 0.1, 1, 0, false).unwrap();
    close(pulled(&mut t, &[9])[0], w1 - 0.1 / 1.35f64.sqrt());
    let rows = t.rows();
    close(rows.slots[0][0], 1.35);
    // A row never pushed keeps its initial accumulator.
    pulled(&mut t, &[10]);
    assert_eq!(t.rows().slots[0], vec![1.35, 0.1]);
}

#[test]
fn repeated_ids_in_one_push_are_summed() {
    let mut a = table(2, ADAGRAD, Rule::Async);
    let mut b = table(2, ADAGRAD, Rule::Async);
    a.push(
        &[3, 4, 3],
        &[1.0, 1.0, 5.0, 5.0, 2.0, 2.0],
        0.1,
        0,
        0,
        false,
    )
    .unwrap();
    b.push(&[3, 4], &[3.0, 3.0, 5.0, 5.0], 0.1, 0, 0, false)
        .unwrap();
    assert_eq!(a.rows(), b.rows());
}

#[test]
fn a_sync_step_takes_each_rows_mean_over_the_workers_that_pushed_it() {
    let sync = Rule::Sync {
        replicas: 2,
        total: 3,
    };
    let mut t = table(1, TableOptimizer::Sgd, sync);
    // Worker 0: rows 1 and 2 (row 1 twice: its own duplicates summed, 1 + 1).
    let o = t
        .push(&[1, 2, 1], &[1.0, 2.0, 1.0], 1.0, 0, 0, false)
        .unwrap();
    assert_eq!(o, Outcome::Pending);
    assert_eq!(pulled(&mut t, &[1, 2]), vec![0.0, 0.0]);
    assert!(matches!(
        t.push(&[1], &[1.0], 1.0, 0, 0, false),
        Err(TableError::DuplicatePush { worker: 0, .. })
    ));
    // Worker 2: row 1 only. Row 1: (2 + 4) / 2 workers; row 2: 2 / 1.
    let o = t.push(&[1], &[4.0], 1.0, 0, 2, false).unwrap();
    assert_eq!(o, Outcome::Applied);
    assert_eq!(pulled(&mut t, &[1, 2]), vec![-3.0, -2.0]);
    assert_eq!(t.counters().updates_applied, 1);
    // The step is done: a late push for it is stale and changes nothing.
    assert_eq!(
        t.push(&[1], &[100.0], 1.0, 0, 1, false).unwrap(),
        Outcome::Stale
    );
    assert_eq!(pulled(&mut t, &[1]), vec![-3.0]);
    assert_eq!(t.counters().stale, 1);
    assert!(matches!(
        t.push(&[1], &[1.0], 1.0, 1, 3, false),
        Err(TableError::UnknownWorker {
            worker: 3,
            total: 3
        })
    ));
}

#[test]
fn sync_steps_gather_out_of_order_and_an_older_one_is_dropped_by_a_newer() {
    let sync = Rule::Sync {
        replicas: 2,
        total: 2,
    };
    let mut t = table(1, TableOptimizer::Sgd, sync);
    // Step 1 arrives before step 0 completes.
    assert_eq!(t.push(&[1], &[1.0], 1.0, 0, 0, false), Ok(Outcome::Pending));
    assert_eq!(t.push(&[1], &[1.0], 1.0, 1, 0, false), Ok(Outcome::Pending));
    assert_eq!(t.push(&[1], &[3.0], 1.0, 1, 1, false), Ok(Outcome::Applied));
    // Step 1 applied (mean 2); step 0 will never complete: dropped.
    assert_eq!(pulled(&mut t, &[1]), vec![-2.0]);
    assert_eq!(t.push(&[1], &[1.0], 1.0, 0, 1, false), Ok(Outcome::Stale));
    // A worker left: one replica is enough for the step in progress.
    assert_eq!(t.push(&[1], &[1.0], 1.0, 2, 0, false), Ok(Outcome::Pending));
    assert_eq!(t.set_sync(1, 1), Ok(true));
    assert_eq!(pulled(&mut t, &[1]), vec![-3.0]);
}

#[test]
fn bad_pushes_are_refused_and_change_nothing() {
    let mut t = table(2, ADAGRAD, Rule::Async);
    pulled(&mut t, &[1]);
    let before = t.rows();
    assert!(matches!(
        t.push(&[1], &[1.0], 0.1, 0, 0, false),
        Err(TableError::Length {
            ids: 1,
            dim: 2,
            values: 1,
            ..
        })
    ));
    assert!(matches!(
        t.push(&[1], &[1.0, f32::NAN], 0.1, 0, 0, false),
        Err(TableError::NonFinite { id: 1, .. })
    ));
    assert_eq!(
        t.push(&[1], &[1.0, 1.0], 0.0, 0, 0, false),
        Err(TableError::LearningRate(0.0))
    );
    assert_eq!(t.rows(), before);
    // Finite inputs whose update is not: refused, nothing written.
    let mut sgd = table(2, TableOptimizer::Sgd, Rule::Async);
    pulled(&mut sgd, &[1]);
    let sgd_before = sgd.rows();
    assert!(matches!(
        sgd.push(&[1], &[1.0, 4.0], 3e38, 0, 0, false),
        Err(TableError::Overflow { .. })
    ));
    assert_eq!(sgd.rows(), sgd_before);
    // At train.last_step nothing is applied.
    assert_eq!(
        t.push(&[1], &[1.0, 1.0], 0.1, 0, 0, true),
        Ok(Outcome::AtLastStep)
    );
    assert_eq!(t.rows(), before);
}

#[test]
fn ftrl_rows_follow_the_rule_by_hand_and_keep_both_slots() {
    let ftrl = TableOptimizer::Ftrl {
        learning_rate_power: -0.5,
        initial_accumulator_value: 0.1,
        l1: 0.0,
        l2: 0.0,
    };
    let mut t = table(1, ftrl, Rule::Async);
    // Row 7 from 0 (the wide part's zeros), g = 0.2, lr = 0.1: n = 0.14,
    // z = 0.2 (w was 0), w = −z/(√n/lr).
    t.push(&[7], &[0.2], 0.1, 0, 0, false).unwrap();
    let w = -0.2 / (0.14f64.sqrt() / 0.1);
    close(pulled(&mut t, &[7])[0], w);
    let rows = t.rows();
    assert_eq!(rows.slots.len(), 2);
    close(rows.slots[0][0], 0.14);
    close(rows.slots[1][0], 0.2);
    // A new row's slots start at (0.1, 0): the accumulator's initial value.
    pulled(&mut t, &[8]);
    let rows = t.rows();
    assert_eq!((rows.slots[0][1], rows.slots[1][1]), (0.1, 0.0));
}

#[test]
fn lazy_adam_moves_only_the_pushed_rows_moments() {
    let lazy = TableOptimizer::LazyAdam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    };
    let mut t = table(2, lazy, Rule::Async);
    t.push(&[1, 2], &[0.5, -0.5, 1.0, 1.0], 0.01, 0, 0, false)
        .unwrap();
    let before = t.rows();
    // Steps later, row 1 alone: row 2's value and moments stay exactly.
    t.push(&[1], &[0.5, 0.5], 0.01, 5, 0, false).unwrap();
    let after = t.rows();
    for k in 0..2 {
        assert_eq!(after.slots[k][2..4], before.slots[k][2..4]);
    }
    assert_eq!(after.values[2..4], before.values[2..4]);
    // Row 1 by hand: m = 0.9·0.05 + 0.1·0.5, v = 0.999·0.00025 + 0.001·0.25,
    // w −= lr·√(1−β2⁶)/(1−β1⁶)·m/(√v + ε).
    let (m, v) = (0.9 * 0.05 + 0.1 * 0.5, 0.999 * 0.00025 + 0.001 * 0.25);
    close(after.slots[0][0], m);
    close(after.slots[1][0], v);
    let alpha = 0.01 * (1.0 - 0.999f64.powi(6)).sqrt() / (1.0 - 0.9f64.powi(6));
    let w = f64::from(before.values[0]) - alpha * m / (v.sqrt() + 1e-8);
    close(after.values[0], w);
}

#[test]
fn rows_save_sorted_and_load_back() {
    let mut t = table(2, ADAGRAD, Rule::Async);
    t.push(&[30, 10, 20], &[1.0; 6], 0.1, 0, 0, false).unwrap();
    let rows = t.rows();
    assert_eq!(rows.ids, vec![10, 20, 30]);
    let mut u = table(2, ADAGRAD, Rule::Async);
    pulled(&mut u, &[99]);
    u.load(&rows, 0).unwrap();
    assert_eq!(u.rows(), rows);
    // No shadows, no slots: shadows start at the values, slots fresh.
    let bare = Rows {
        ids: vec![1],
        values: vec![0.5, 0.25],
        shadows: vec![],
        slots: vec![],
    };
    u.load(&bare, 0).unwrap();
    let back = u.rows();
    assert_eq!(back.shadows, bare.values);
    assert_eq!(back.slots, vec![vec![0.1, 0.1]]);
    let short = Rows {
        values: vec![0.5],
        ..bare
    };
    assert!(matches!(
        u.load(&short, 0),
        Err(TableError::Corrupt {
            expected: 2,
            got: 1,
            ..
        })
    ));
    assert_eq!(u.rows(), back);
}

#[test]
fn a_row_costs_at_most_twice_its_value_and_slots() {
    // deep/embeddings under Adagrad: 16 values + 16 accumulators = 128
    // bytes; the shadow, the id, the index and the arena's slack must fit
    // in as much again.
    let spec = wide_deep(16).remove(0);
    let mut t = Table::new(spec, ADAGRAD, Rule::Async, Some(0.99));
    let ids: Vec<u64> = (0..100_000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    pulled(&mut t, &ids);
    assert_eq!(t.len(), 100_000);
    let per_row = t.memory_bytes() as f64 / t.len() as f64;
    eprintln!("deep/embeddings, dim 16, Adagrad: {per_row:.1} bytes per row");
    assert!(per_row <= 2.0 * 128.0, "{per_row} bytes per row");
}

#[test]
fn a_table_without_shadows_trains_alike_in_a_value_less_a_row() {
    // `[model.tables] moving_average = false`: the same values and slots
    // as with shadows; reads of shadows give the values; pages carry none;
    // a row is 16 floats smaller, within the 1.5 × (values + slots
    // + id) for deep/embeddings under Adagrad (136 bytes).
    let spec = wide_deep(16).remove(0);
    let mut with = Table::new(spec.clone(), ADAGRAD, Rule::Async, Some(0.99));
    let mut without = Table::new(spec, ADAGRAD, Rule::Async, None);
    let ids: Vec<u64> = (0..100_000u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    assert_eq!(pulled(&mut with, &ids), pulled(&mut without, &ids));
    for step in 0..5u64 {
        let some = &ids[(step as usize * 7_000)..(step as usize * 7_000 + 20_000)];
        let grads: Vec<f32> = (0..some.len() * 16)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect();
        for t in [&mut with, &mut without] {
            t.push(some, &grads, 0.1, step, 0, false).unwrap();
        }
    }
    let mut shadows = Vec::new();
    without.pull(&ids[..50], true, &mut shadows).unwrap();
    assert_eq!(
        shadows,
        pulled(&mut without, &ids[..50]),
        "no shadow: the value"
    );
    with.pull(&ids[..50], true, &mut shadows).unwrap();
    assert_ne!(
        shadows[..50 * 16],
        shadows[50 * 16..],
        "a shadow lags its value"
    );
    let (a, b) = (with.rows(), without.rows());
    assert_eq!((&a.ids, &a.values, &a.slots), (&b.ids, &b.values, &b.slots));
    assert_eq!(
        b.shadows, b.values,
        "merged, a table without shadows gives its values"
    );
    let page = without.page(0, 10);
    assert!(page.shadows.is_empty() && page.values.len() == 160);
    assert_eq!(without.row_bytes(), 8 + 4 * 32);
    // Loaded from a file that holds shadows (one written with them): dropped.
    without.load(&a, 5).unwrap();
    assert_eq!(without.rows(), b);
    let per_row = |t: &Table| t.memory_bytes() as f64 / t.len() as f64;
    let (pw, po) = (per_row(&with), per_row(&without));
    eprintln!("deep/embeddings, dim 16, Adagrad: {pw:.1} bytes per row, {po:.1} without shadows");
    assert!(pw - po >= 64.0, "{pw} vs {po} bytes per row");
    assert!(po <= 1.5 * 136.0, "{po} bytes per row");
}

#[test]
fn pages_in_creation_order_make_the_whole_table_and_a_load_changes_generation() {
    let mut t = table(2, ADAGRAD, Rule::Async);
    pulled(&mut t, &[30, 10, 20, 50, 40]);
    t.push(&[10, 40], &[1.0; 4], 0.1, 0, 0, false).unwrap();
    assert_eq!(t.row_bytes(), 8 + 4 * 3 * 2);
    // Two rows a page: 30 10 | 20 50 | 40, as created.
    let pages: Vec<Rows> = [0, 2, 4, 6].iter().map(|&s| t.page(s, 2)).collect();
    assert_eq!(pages[0].ids, vec![30, 10]);
    assert_eq!(pages[2].ids, vec![40]);
    assert!(pages[3].is_empty(), "past the end: no rows");
    assert_eq!(pages[0].slots.len(), 1, "the slot travels with its row");
    let mut whole = Rows::default();
    for p in pages {
        whole.append(p).unwrap();
    }
    assert_eq!(crate::placement::merge_rows(vec![whole]), t.rows());
    // A page far past the end, or of absurd length, is empty or clipped.
    assert!(t.page(usize::MAX, usize::MAX).is_empty());
    assert_eq!(t.page(3, usize::MAX).ids, vec![50, 40]);
    let g = t.generation();
    let rows = t.rows();
    t.load(&rows, 0).unwrap();
    assert_ne!(t.generation(), g, "a restore renumbers the rows");
    assert_eq!(
        t.page(0, 5).ids,
        vec![10, 20, 30, 40, 50],
        "loaded in id order"
    );
}

/// A table of zeros, `dim` wide, under Adagrad, evicting by
/// `steps_to_live` and `max_rows`, keeping which rows change.
fn tracked(dim: usize, steps_to_live: u64, max_rows: usize) -> Table {
    let spec = TableSpec {
        name: "t".into(),
        dim,
        init: TableInit::Zeros,
        slots: ADAGRAD.slot_names(),
    };
    let policy = Policy {
        min_count: 1,
        steps_to_live,
        max_rows,
    };
    Table::new(spec, ADAGRAD, Rule::Async, Some(0.99))
        .with_policy(policy)
        .with_changes(true)
}

/// A push at `step` of random gradients (3 wide) to a few hot ids and
/// many cold ones.
fn random_push(t: &mut Table, rng: &mut rand::rngs::StdRng, step: u64) {
    use rand::Rng;
    let ids: Vec<u64> = (0..rng.random_range(1..12))
        .map(|_| match rng.random_bool(0.7) {
            true => rng.random_range(0..20),
            false => rng.random_range(0..2000),
        })
        .collect();
    let grads: Vec<f32> = (0..ids.len() * 3)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    t.push(&ids, &grads, 0.1, step, 0, false).unwrap();
}

/// Rows and evictions at random, cut now and then: the first cut's full
/// copy with every later delta applied is the table, row for row, shadows
/// and slots included — through creation by pulls and pushes, updates,
/// `steps_to_live` and `max_rows` evictions, and rows evicted then made
/// again.
#[test]
fn a_full_copy_and_the_deltas_after_it_make_the_table() {
    use rand::{Rng, SeedableRng};
    let mut t = tracked(3, 40, 300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Nothing cut yet: the first cut is a full copy.
    assert!(t.cut(false).is_none());
    let mut held = t.rows();
    let (mut deltas, mut fulls) = (0, 0);
    for step in 1..400u64 {
        random_push(&mut t, &mut rng, step);
        if step % 7 == 0 {
            let _ = pulled(&mut t, &[rng.random_range(5000..6000)]);
        }
        if step % 10 == 0 {
            t.evict();
            match t.cut(step % 150 == 0) {
                Some(d) => {
                    assert!(d.rows.ids.windows(2).all(|w| w[0] < w[1]));
                    held = held.patched(&d.removed, d.rows);
                    deltas += 1;
                }
                None => {
                    held = t.rows();
                    fulls += 1;
                }
            }
            assert_eq!(held, t.rows(), "step {step}");
        }
    }
    assert!(t.counters().evicted > 0, "no row was evicted");
    assert!(
        deltas > 20 && fulls >= 2,
        "{deltas} deltas, {fulls} full copies"
    );
    // A load replaces the rows: the next cut is full.
    let rows = t.rows();
    t.load(&rows, 500).unwrap();
    assert!(t.cut(false).is_none());
    assert_eq!(t.changed(), 0);
}

#[test]
fn without_changes_kept_every_cut_is_full_and_costs_nothing() {
    let mut t = table(2, TableOptimizer::Sgd, Rule::Async);
    t.push(&[1, 2], &[1.0; 4], 0.1, 1, 0, false).unwrap();
    assert_eq!(t.changed(), 0);
    assert!(t.cut(false).is_none());
    t.push(&[1], &[1.0; 2], 0.1, 2, 0, false).unwrap();
    assert!(t.cut(false).is_none());
}

/// Evicted ids noted between two cuts never outgrow the table (past that
/// the next cut is whole), however long nothing cuts: 60,000 evictions
/// from a table of 10 rows.
#[test]
fn changes_never_cut_do_not_grow_without_bound() {
    let mut t = tracked(1, 0, 10);
    assert!(t.cut(false).is_none());
    let mut sizes = Vec::new();
    for round in 0..3u64 {
        for step in 0..20_000u64 {
            let id = round * 1_000_000 + step;
            t.push(&[id], &[1.0], 0.1, round * 20_000 + step, 0, false)
                .unwrap();
        }
        assert!(t.len() <= 10);
        sizes.push(t.memory_bytes());
    }
    assert!(t.cut(false).is_none(), "past the bound the cut is whole");
    assert!(
        sizes[2] <= sizes[0] + 4096,
        "a 10-row table's memory grows with every eviction: {sizes:?}"
    );
}

/// The checkpoint tracker counts from its chain's base and is never reset
/// by a delta: the base's full copy with any one later delta applied is the
/// table (rows created, updated, evicted, evicted and made again); the
/// snapshot tracker's cuts in between change nothing for it; a load, or
/// another chain's base, leaves the old chain no delta.
#[test]
fn a_checkpoint_base_and_any_one_delta_after_it_make_the_table() {
    use rand::SeedableRng;
    let mut t = tracked(3, 40, 300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    assert!(t.cut_delta(5).is_none(), "no base read yet");
    t.push(&[1, 2, 3], &[0.5; 9], 0.1, 1, 0, false).unwrap();
    t.cut_base(5);
    let base = t.rows();
    let none = t.cut_delta(5).unwrap();
    assert!(none.rows.is_empty() && none.removed.is_empty());
    let mut deltas = 0;
    for step in 2..400u64 {
        random_push(&mut t, &mut rng, step);
        if step % 10 == 0 {
            t.evict();
            // The snapshot loop cuts its own tracker meanwhile.
            let _ = t.cut(step % 30 == 0);
            let d = t.cut_delta(5).expect("the chain's base was read");
            assert!(d.rows.ids.windows(2).all(|w| w[0] < w[1]));
            assert!(
                d.removed
                    .iter()
                    .all(|id| d.rows.ids.binary_search(id).is_err())
            );
            assert_eq!(
                base.clone().patched(&d.removed, d.rows),
                t.rows(),
                "step {step}"
            );
            deltas += 1;
        }
    }
    assert!(t.counters().evicted > 0 && deltas > 30);
    assert!(t.cut_delta(6).is_none(), "another chain");
    t.cut_base(6);
    assert!(t.cut_delta(5).is_none(), "a newer chain's base was read");
    assert!(t.cut_delta(6).is_some());
    let rows = t.rows();
    t.load(&rows, 500).unwrap();
    assert!(t.cut_delta(6).is_none(), "the rows were replaced");
}
