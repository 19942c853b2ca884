use super::*;
use crate::model::TableSpec;
use crate::model::table::{Rows, TableInit};
use crate::optimizer::TableOptimizer;
use crate::ps::shard::Rule;

/// A `dim`-wide SGD table whose rows start at a value that depends on the
/// id (truncated normal), under `policy`.
fn table(dim: usize, policy: Policy) -> Table {
    let spec = TableSpec {
        name: "t".into(),
        dim,
        init: TableInit::TruncatedNormal { stddev: 0.1 },
        slots: &[],
    };
    Table::new(spec, TableOptimizer::Sgd, Rule::Async, Some(0.99)).with_policy(policy)
}

fn initial(t: &Table, id: u64) -> Vec<f32> {
    let mut v = vec![0.0; t.dim()];
    t.spec().init_row(id, &mut v);
    v
}

fn pulled(t: &mut Table, ids: &[u64]) -> Vec<f32> {
    let mut out = Vec::new();
    t.pull(ids, false, &mut out).unwrap();
    out
}

/// One gradient of 1.0 for each of `ids` at `step`.
fn push(t: &mut Table, ids: &[u64], step: u64) {
    let g = vec![1.0; ids.len() * t.dim()];
    t.push(ids, &g, 0.5, step, 0, false).unwrap();
}

fn admission(min_count: u32) -> Policy {
    Policy {
        min_count,
        ..Policy::default()
    }
}

#[test]
fn an_id_pushed_fewer_than_min_count_times_has_no_row_and_reads_its_initial_value() {
    let mut t = table(2, admission(3));
    let init = initial(&t, 7);
    for step in 0..2 {
        push(&mut t, &[7], step);
        assert_eq!(t.len(), 0, "no row after {} pushes", step + 1);
        assert_eq!(pulled(&mut t, &[7]), init, "its gradient dropped");
        let mut shadow = Vec::new();
        t.pull(&[7], true, &mut shadow).unwrap();
        assert_eq!(shadow, init, "its shadow is its initial value too");
    }
    assert_eq!(t.counters().refused, 2);
    // Pulls count nothing and create nothing.
    pulled(&mut t, &[7, 7, 7, 8]);
    assert_eq!(t.len(), 0);
    // The third push creates the row and trains it: w = init − 0.5 · 1.
    push(&mut t, &[7], 2);
    assert_eq!(t.len(), 1);
    let want: Vec<f32> = init.iter().map(|w| w - 0.5).collect();
    assert_eq!(pulled(&mut t, &[7]), want);
    // From then on every push trains it.
    push(&mut t, &[7], 3);
    let want: Vec<f32> = init.iter().map(|w| w - 0.5 - 0.5).collect();
    assert_eq!(pulled(&mut t, &[7]), want);
    assert_eq!(t.counters().refused, 2);
}

#[test]
fn admission_counts_an_id_once_per_push_and_sync_steps_keep_only_admitted_rows() {
    let sync = Rule::Sync {
        replicas: 2,
        total: 2,
    };
    let spec = TableSpec {
        name: "t".into(),
        dim: 1,
        init: TableInit::Zeros,
        slots: &[],
    };
    let mut t = Table::new(spec, TableOptimizer::Sgd, sync, Some(0.99)).with_policy(admission(2));
    // Worker 0 names id 1 three times in one push: one sighting, refused.
    t.push(&[1, 1, 1], &[1.0; 3], 1.0, 0, 0, false).unwrap();
    // Its duplicate push for the step is refused whole, its sighting too.
    assert!(matches!(
        t.push(&[1], &[1.0], 1.0, 0, 0, false),
        Err(crate::ps::table::TableError::DuplicatePush { .. })
    ));
    assert_eq!(t.sketch.as_ref().unwrap().count(1), 1);
    // Worker 1's push is the second sighting: admitted, its gradient alone
    // is the step's mean for row 1.
    t.push(&[1], &[4.0], 1.0, 0, 1, false).unwrap();
    assert_eq!(pulled(&mut t, &[1]), vec![-4.0]);
    assert_eq!(t.counters().refused, 1);
}

#[test]
fn min_count_1_is_todays_table_without_a_sketch() {
    let mut t = table(2, Policy::default());
    assert_eq!(t.sketch_bytes(), 0);
    pulled(&mut t, &[3]);
    assert_eq!(t.len(), 1, "a pull creates the row, as before");
    push(&mut t, &[4], 0);
    assert_eq!(t.len(), 2);
    assert_eq!(t.counters().refused, 0);
    assert_eq!(t.evict(), 0, "no eviction without its keys");
    let with = table(2, admission(2));
    assert_eq!(with.sketch_bytes(), 4 << 20, "4 × 2^20 one-byte counters");
}

#[test]
fn the_admission_sketch_stays_4_mib_under_a_million_new_ids() {
    let mut t = table(1, admission(2));
    let before = t.memory_bytes();
    let ids: Vec<u64> = (0..1_000_000u64).map(mix64).collect();
    for chunk in ids.chunks(100_000) {
        t.push(chunk, &vec![1.0; chunk.len()], 0.1, 0, 0, false)
            .unwrap();
    }
    assert_eq!(t.sketch_bytes(), 4 << 20, "nothing grew with the ids");
    // Every id was seen once; a count-min sketch only overcounts, so some
    // read as seen twice: at 10^6 ids in 2^20 columns, under 5 % (3.9 %
    // measured), the ids that were admitted one push early.
    assert!(t.len() < ids.len() / 20, "{} admitted early", t.len());
    assert!(t.memory_bytes() < before + t.len() * 64);
    // On its second push every id is admitted.
    let n = 10_000;
    t.push(&ids[..n], &vec![1.0; n], 0.1, 1, 0, false).unwrap();
    assert!(ids[..n].iter().all(|&id| t.find(id).is_some()));
}

#[test]
fn steps_to_live_drops_exactly_the_rows_not_updated_for_longer() {
    let mut t = table(
        1,
        Policy {
            steps_to_live: 10,
            ..Policy::default()
        },
    );
    push(&mut t, &[1, 2, 3], 0);
    push(&mut t, &[2], 5);
    push(&mut t, &[3], 10);
    // Now step 10: row 1 last updated 10 steps ago — kept (more than 10 drop).
    assert_eq!(t.evict(), 0);
    push(&mut t, &[4], 11);
    let before = t.generation();
    assert_eq!(t.evict(), 1);
    assert_eq!(t.rows().ids, vec![2, 3, 4]);
    assert_ne!(t.generation(), before, "rows renumbered");
    push(&mut t, &[4], 16);
    assert_eq!(t.evict(), 1, "row 2 (step 5) is 11 steps old");
    assert_eq!(t.rows().ids, vec![3, 4]);
    assert_eq!(t.counters().evicted, 2);
    // An evicted id reads as its initial value again, and a push recreates it.
    assert_eq!(pulled(&mut t, &[1]), initial(&t, 1));
    push(&mut t, &[1], 16);
    assert_eq!(t.rows().ids, vec![1, 3, 4]);
    // The survivors kept their values.
    let want = initial(&t, 3)[0] - 0.5 * 2.0;
    assert_eq!(pulled(&mut t, &[3]), vec![want]);
}

#[test]
fn max_rows_keeps_the_most_recently_updated_and_never_holds_more() {
    let max = 64;
    let mut t = table(
        2,
        Policy {
            max_rows: max,
            ..Policy::default()
        },
    );
    // A stream of new ids, each push a few new ones and one hot id (0).
    let mut next = 1u64;
    for step in 0..500u64 {
        let mut ids = vec![0];
        for _ in 0..3 {
            ids.push(next);
            next += 1;
        }
        pulled(&mut t, &ids);
        assert!(t.len() <= max, "pulls create nothing under max_rows");
        push(&mut t, &ids, step);
        assert!(t.len() <= max, "{} rows at step {step}", t.len());
    }
    assert!(t.counters().evicted > 0);
    let rows = t.rows().ids;
    assert!(rows.contains(&0), "the hot row stays");
    // The newest ids (the last push's three) are there, the oldest are not.
    for id in next - 3..next {
        assert!(rows.contains(&id), "id {id} missing");
    }
    assert!(!rows.contains(&1));
    // The hot row trained all along: 500 updates of 0.5.
    let hot = pulled(&mut t, &[0]);
    let want = initial(&t, 0)[0] - 250.0;
    assert!((hot[0] - want).abs() < 1e-3, "{} vs {want}", hot[0]);
    // At a snapshot the bound is exact; a push of more new ids than fit
    // keeps max_rows and refuses the rest.
    let refused = t.counters().refused;
    let many: Vec<u64> = (10_000..10_000 + 2 * max as u64).collect();
    push(&mut t, &many, 600);
    assert_eq!(t.len(), max);
    assert_eq!(t.counters().refused, refused + max as u64);
}

#[test]
fn max_rows_at_a_snapshot_drops_the_least_recently_updated() {
    let mut t = table(1, Policy::default());
    for (step, id) in [(3, 30), (1, 10), (4, 40), (2, 20)] {
        push(&mut t, &[id], step);
    }
    // Without max_rows, then with it from a restore (stamps: the restore's step).
    let rows = t.rows();
    let mut u = table(
        1,
        Policy {
            max_rows: 3,
            ..Policy::default()
        },
    );
    for (step, id) in [(3, 30), (1, 10), (4, 40), (2, 20)] {
        push(&mut u, &[id], step);
    }
    assert_eq!(u.len(), 3, "the push of the fourth made room");
    assert_eq!(u.rows().ids, vec![20, 30, 40], "10 (step 1) went first");
    // A checkpoint of more rows than max_rows restores down to it.
    u.load(&rows, 9).unwrap();
    assert_eq!(u.len(), 3);
    assert_eq!(u.counters().evicted, 2);
    // A checkpoint with fewer rows restores as it is; the others read initial.
    let fewer = Rows {
        ids: vec![40],
        values: vec![1.5],
        shadows: vec![],
        slots: vec![],
    };
    u.load(&fewer, 9).unwrap();
    assert_eq!(pulled(&mut u, &[40, 10]), vec![1.5, initial(&u, 10)[0]]);
}

#[test]
fn while_memory_is_short_no_row_is_created_and_existing_rows_still_train() {
    let room = std::sync::Arc::new(Room::default());
    let mut t = table(2, Policy::default()).with_room(room.clone());
    push(&mut t, &[1], 0);
    let trained = pulled(&mut t, &[1]);
    // Past 90 % of the limit: new ids are refused, pulls create nothing.
    assert_eq!(room.observe(95, 100), Some(true));
    push(&mut t, &[1, 2, 3], 1);
    assert_eq!(t.len(), 1, "no row for 2 and 3");
    assert_eq!(t.counters().refused, 2);
    assert_ne!(pulled(&mut t, &[1]), trained, "row 1 trained on");
    assert_eq!(pulled(&mut t, &[2]), initial(&t, 2));
    assert_eq!(t.len(), 1, "a pull created nothing");
    // Back under 85 %: rows again, as before (a pull creates its rows).
    assert_eq!(room.observe(80, 100), Some(false));
    push(&mut t, &[2], 2);
    pulled(&mut t, &[4]);
    assert_eq!(t.len(), 3);
}
