//! The snapshot files' unit tests: round trips, refusals, what is kept.

use super::restore::choose;
use super::*;
use crate::ps::shard::Rule;

fn shard(task: usize) -> Shard {
    shard_at(task, 41)
}

fn shard_at(task: usize, step: u64) -> Shard {
    let optimizer = crate::optimizer::Optimizer::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    };
    let specs = vec![
        VarSpec {
            name: "a/weights".into(),
            shape: vec![3, 2],
        },
        VarSpec {
            name: "a/biases".into(),
            shape: vec![2],
        },
    ];
    let mut s = Shard::new(task, specs, Rule::Async, 0.99, optimizer);
    let values = vec![
        ArrayD::from_shape_vec(vec![3, 2], vec![1., 2., 3., 4., 5., 6.]).unwrap(),
        ArrayD::from_shape_vec(vec![2], vec![7., 8.]).unwrap(),
    ];
    s.initialize(values, None, None, step, false);
    s
}

fn encoded(s: &Shard, identity: &str) -> Vec<u8> {
    let mut image = Image::default();
    assert!(image.copy_from(s));
    let slot_specs = s.optimizer().slot_specs(s.specs());
    image.encode(s.specs(), &slot_specs, &[], identity).unwrap()
}

#[test]
fn round_trip_restores_values_shadows_slots_and_step() {
    let s = shard(0);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), s.step(), &encoded(&s, "me"), None, &[]).unwrap();
    let r = load(&path, &shard(0), "me", &[]).unwrap();
    assert_eq!(r.step, 41);
    assert_eq!(r.values, s.values().unwrap());
    assert_eq!(r.shadows, s.shadows().unwrap());
    assert_eq!(&r.slots, s.slots().unwrap());
}

#[test]
fn foreign_or_damaged_snapshots_are_refused_with_the_reason() {
    let s = shard(0);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 41, &encoded(&s, "me"), None, &[]).unwrap();
    let e = load(&path, &s, "other", &[]).err().unwrap().to_string();
    assert!(e.contains("another run or shard"), "{e}");
    let mut bytes = fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x55;
    fs::write(&path, &bytes).unwrap();
    let e = load(&path, &s, "me", &[]).err().unwrap().to_string();
    assert!(e.contains("checksum"), "{e}");
    fs::write(&path, b"not a snapshot").unwrap();
    assert!(load(&path, &s, "me", &[]).is_err());
}

#[test]
fn a_snapshot_of_another_shard_is_refused_on_its_header_alone() {
    // After a re-shard every snapshot on a ps's disk is of the old
    // placement, each up to a whole shard: refused before the body is
    // read, so one whose body is cut short says so by its identity.
    let s = shard(0);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 41, &encoded(&s, "old placement"), None, &[]).unwrap();
    let bytes = fs::read(&path).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    fs::write(&path, &bytes[..header + 1]).unwrap();
    let e = of_this_shard(&path, "new placement")
        .unwrap_err()
        .to_string();
    assert!(e.contains("another run or shard"), "{e}");
    let e = load(&path, &s, "new placement", &[])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another run or shard"), "{e}");
    // Its own identity passes the header; the body is then read and fails.
    of_this_shard(&path, "old placement").unwrap();
    let e = load(&path, &s, "old placement", &[])
        .err()
        .unwrap()
        .to_string();
    assert!(!e.contains("another run or shard"), "{e}");
    // What is no snapshot at all is left to the whole read to name.
    fs::write(&path, b"not a snapshot").unwrap();
    of_this_shard(&path, "new placement").unwrap();
}

#[test]
fn write_keeps_the_new_file_and_the_one_before_it_only() {
    let s = shard(0);
    let bytes = encoded(&s, "me");
    let dir = tempfile::tempdir().unwrap();
    // Another timeline's files, at higher steps: not kept.
    write(dir.path(), 900, &bytes, None, &[]).unwrap();
    write(dir.path(), 901, &bytes, None, &[]).unwrap();
    let first = write(dir.path(), 5, &bytes, None, &[]).unwrap();
    let second = write(dir.path(), 6, &bytes, Some(&first), &[]).unwrap();
    let steps: Vec<u64> = list(dir.path()).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![6, 5]);
    write(dir.path(), 7, &bytes, Some(&second), &[]).unwrap();
    let steps: Vec<u64> = list(dir.path()).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, vec![7, 6]);
    // No temp file left behind.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn a_file_named_for_another_step_is_refused_and_the_highest_held_step_wins() {
    let dir = tempfile::tempdir().unwrap();
    let older = write_beside(dir.path(), 41, &encoded(&shard_at(0, 41), "me")).unwrap();
    write_beside(dir.path(), 50, &encoded(&shard_at(0, 50), "me")).unwrap();
    // The older one put back under a newer name: first by name.
    let renamed = path(dir.path(), 51);
    fs::rename(&older, &renamed).unwrap();
    let files = list(dir.path());
    assert_eq!(files[0].1, renamed);
    let e = load(&renamed, &shard(0), "me", &[])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("holds step 41 but is named for step 51"), "{e}");
    let (chosen, r) = choose((&files, &[]), (&shard(0), &[]), "me", None, 0).unwrap();
    assert_eq!((chosen, r.step), (path(dir.path(), 50), 50));
    // Whatever the listing's order, the highest held step wins.
    write_beside(dir.path(), 7, &encoded(&shard_at(0, 7), "me")).unwrap();
    let mut files = list(dir.path());
    files.reverse();
    assert_eq!(
        choose((&files, &[]), (&shard(0), &[]), "me", None, 0)
            .unwrap()
            .1
            .step,
        50
    );
}

#[test]
fn names_parse_only_as_written() {
    assert_eq!(parse_name(&file_name(12)), Some(12));
    for bad in [
        "shard-.safetensors",
        "shard-1x.safetensors",
        ".shard-1.safetensors.tmp-3",
    ] {
        assert_eq!(parse_name(bad), None, "{bad}");
    }
}

#[test]
fn a_snapshot_keeps_the_tables_rows_and_refuses_rows_of_another_width() {
    use crate::model::table::{Rows, TableInit};
    let s = shard(0);
    let mut image = Image::default();
    assert!(image.copy_from(&s));
    let rows = Rows {
        ids: vec![3, 8, u64::MAX],
        values: vec![1., 2., 3., 4., 5., 6.],
        shadows: vec![0.5, 1.5, 2.5, 3.5, 4.5, 5.5],
        slots: vec![vec![0.1; 6], vec![0.2; 6]],
    };
    image.tables = vec![TableState {
        table: "deep/embeddings".into(),
        rows,
    }];
    let slot_specs = s.optimizer().slot_specs(s.specs());
    // The table's own slots (lazy Adam's), whatever the shard's optimizer.
    let spec = |dim| TableSpec {
        name: "deep/embeddings".into(),
        dim,
        init: TableInit::Zeros,
        slots: &["Adam", "Adam_1"],
    };
    let bytes = image
        .encode(s.specs(), &slot_specs, &[spec(2)], "me")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 41, &bytes, None, &[]).unwrap();
    let r = load(&path, &s, "me", &[spec(2)]).unwrap();
    assert_eq!(r.tables, image.tables);
    assert_eq!(r.values, s.values().unwrap());
    let e = load(&path, &s, "me", &[spec(3)]).err().unwrap().to_string();
    assert!(e.contains("expected [3, 3]"), "{e}");
    // A shard that holds no tables does not take a file with rows.
    let e = load(&path, &s, "me", &[]).err().unwrap().to_string();
    assert!(e.contains("deep/embeddings"), "{e}");
}

/// The one table, `t` (1 wide, Adagrad), of the chain tests below.
fn chain_table() -> TableSpec {
    TableSpec {
        name: "t".into(),
        dim: 1,
        init: crate::model::table::TableInit::Zeros,
        slots: &["Adagrad"],
    }
}

/// Rows `ids` of `t`, each value `v`, its shadow `v / 2`, its slot `v + 1`.
fn chain_rows(ids: &[u64], v: f32) -> crate::model::table::Rows {
    crate::model::table::Rows {
        ids: ids.to_vec(),
        values: vec![v; ids.len()],
        shadows: vec![v / 2.0; ids.len()],
        slots: vec![vec![v + 1.0; ids.len()]],
    }
}

/// The bytes of a snapshot at `step` holding `rows` of `t`: whole (`seq`
/// 0) or the `seq`th delta of `chain`, `removed` its dropped ids.
fn chain_snapshot(
    step: u64,
    chain: u64,
    seq: u32,
    rows: crate::model::table::Rows,
    removed: Vec<u64>,
) -> Vec<u8> {
    let s = shard_at(0, step);
    let mut image = Image::default();
    assert!(image.copy_from(&s));
    image.tables = vec![TableState {
        table: "t".into(),
        rows,
    }];
    (image.chain, image.seq, image.removed) = (chain, seq, vec![removed]);
    let slot_specs = s.optimizer().slot_specs(s.specs());
    image
        .encode(s.specs(), &slot_specs, &[chain_table()], "me")
        .unwrap()
}

/// What a ps restores from the snapshots and deltas in `d`.
fn chain_restored(d: &Path) -> (PathBuf, Restored) {
    choose(
        (&list(d), &list_deltas(d)),
        (&shard(0), &[chain_table()]),
        "me",
        None,
        0,
    )
    .unwrap()
}

/// A whole snapshot of rows and the deltas after it, as the loop writes
/// them: restored as the whole with every delta applied, in order; a
/// damaged delta ends the chain there (the state the one before left);
/// a new whole snapshot deletes the deltas of every chain but its own and
/// the one before's.
#[test]
fn a_whole_snapshot_and_its_deltas_restore_as_the_newest_state() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let restored = || {
        let (path, r) = chain_restored(d);
        (path, r.step, r.seq, r.tables[0].rows.clone())
    };
    let whole = write(
        d,
        10,
        &chain_snapshot(10, 7, 0, chain_rows(&[1, 2, 3, 4], 1.0), vec![]),
        None,
        &[7],
    )
    .unwrap();
    // 1: row 2 changed, row 5 made; 2: row 3 dropped, row 1 changed.
    write_delta(
        d,
        7,
        1,
        &chain_snapshot(11, 7, 1, chain_rows(&[2, 5], 2.0), vec![]),
    )
    .unwrap();
    let second = write_delta(
        d,
        7,
        2,
        &chain_snapshot(12, 7, 2, chain_rows(&[1], 3.0), vec![3]),
    )
    .unwrap();
    let want = chain_rows(&[1], 3.0)
        .patched(&[], chain_rows(&[2, 5], 2.0))
        .patched(&[], chain_rows(&[4], 1.0));
    assert_eq!(restored(), (whole.clone(), 12, 2, want));
    // A delta of another chain, or past a gap, is not applied.
    write_delta(
        d,
        8,
        3,
        &chain_snapshot(13, 8, 3, chain_rows(&[9], 9.0), vec![]),
    )
    .unwrap();
    write_delta(
        d,
        7,
        4,
        &chain_snapshot(14, 7, 4, chain_rows(&[9], 9.0), vec![]),
    )
    .unwrap();
    assert_eq!(restored().1, 12);
    // A delta renamed into another place is refused by its name.
    let e = load(&d.join(delta_name(7, 4)), &shard(0), "me", &[chain_table()]);
    assert!(e.is_ok());
    fs::rename(d.join(delta_name(7, 4)), d.join(delta_name(7, 3))).unwrap();
    let e = load(&d.join(delta_name(7, 3)), &shard(0), "me", &[chain_table()])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("named for delta 3"), "{e}");
    assert_eq!(restored().1, 12);
    // Damaged: the chain ends before it.
    let mut bytes = fs::read(&second).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0xff;
    fs::write(&second, bytes).unwrap();
    let (_, step, seq, got) = restored();
    assert_eq!((step, seq), (11, 1));
    assert_eq!(
        got,
        chain_rows(&[1, 3, 4], 1.0).patched(&[], chain_rows(&[2, 5], 2.0))
    );
    // A new whole snapshot keeps its chain and the one before's, no other.
    write(
        d,
        20,
        &chain_snapshot(20, 9, 0, chain_rows(&[1], 5.0), vec![]),
        Some(&whole),
        &[9, 7],
    )
    .unwrap();
    let chains: Vec<u64> = list_deltas(d).iter().map(|x| x.0).collect();
    assert!(
        chains.iter().all(|&c| c == 7) && chains.len() == 3,
        "{chains:?}"
    );
    write(
        d,
        30,
        &chain_snapshot(30, 10, 0, chain_rows(&[1], 6.0), vec![]),
        None,
        &[10],
    )
    .unwrap();
    assert!(list_deltas(d).is_empty());
    assert_eq!(list(d).len(), 1);
}

#[test]
fn delta_names_parse_only_as_written() {
    assert_eq!(parse_delta_name(&delta_name(0xabc, 12)), Some((0xabc, 12)));
    for bad in [
        "shard-delta-abc-1.safetensors",
        "shard-delta-00000000000000zz-1.safetensors",
        "shard-delta-0000000000000abc-.safetensors",
        "shard-delta-0000000000000abc-1x.safetensors",
        "shard-delta-0000000000000abc-0.safetensors",
        "shard-delta-0000000000000abc-01.safetensors",
        "shard-12.safetensors",
    ] {
        assert_eq!(parse_delta_name(bad), None, "{bad}");
    }
    assert_eq!(parse_name(&delta_name(1, 1)), None);
}

/// Not a test: the cost of a whole snapshot of one table of
/// `DTF_BENCH_ROWS` rows (default 10⁶; 16 wide, Adagrad) against a delta
/// after 1 % of its rows changed — bytes, the copy under the table's lock,
/// the encode and write — and of restoring the two, through the code the
/// ps runs. `scripts/bench_snapshots.sh`.
#[test]
#[ignore = "a benchmark: scripts/bench_snapshots.sh"]
fn bench_whole_and_delta_snapshots() {
    use crate::model::table::{TableInit, mix64};
    use crate::optimizer::TableOptimizer;
    use crate::ps::table::Table;
    use std::time::Instant;
    let n: u64 = std::env::var("DTF_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = std::env::var_os("DTF_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(dir).unwrap();
    let d = dir.path();
    let optimizer = TableOptimizer::Adagrad {
        initial_accumulator_value: 0.1,
    };
    let spec = TableSpec {
        name: "deep/embeddings".into(),
        dim: 16,
        init: TableInit::TruncatedNormal { stddev: 0.01 },
        slots: optimizer.slot_names(),
    };
    // DTF_BENCH_SHADOWS=0: `[model.tables] moving_average = false`.
    let ema = (std::env::var("DTF_BENCH_SHADOWS").as_deref() != Ok("0")).then_some(0.99);
    let mut t = Table::new(spec.clone(), optimizer, Rule::Async, ema).with_changes(true);
    let ids: Vec<u64> = (0..n).map(mix64).collect();
    for chunk in ids.chunks(1 << 20) {
        t.push(chunk, &vec![0.01; chunk.len() * 16], 0.05, 1, 0, false)
            .unwrap();
    }
    // Values + slots + id: what a row must hold.
    let per_row = t.memory_bytes() as f64 / n as f64;
    let shard = shard_at(0, 1);
    let slot_specs = shard.optimizer().slot_specs(shard.specs());
    let tables = std::slice::from_ref(&spec);
    let encode = |rows, seq: u32, removed: Vec<u64>| {
        let mut image = Image::default();
        assert!(image.copy_from(&shard));
        image.tables = vec![TableState {
            table: spec.name.clone(),
            rows,
        }];
        (image.chain, image.seq, image.removed) = (5, seq, vec![removed]);
        image
            .encode(shard.specs(), &slot_specs, tables, "me")
            .unwrap()
    };
    // Whole: the cut, then the copy (in pages on the ps: the same bytes).
    let started = Instant::now();
    assert!(t.cut(false).is_none());
    let rows = t.rows();
    let whole_copy = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let bytes = encode(rows, 0, Vec::new());
    let whole_path = write(d, 1, &bytes, None, &[5]).unwrap();
    let (whole_bytes, whole_write) = (bytes.len(), started.elapsed().as_secs_f64());
    drop(bytes);
    // 1 % of the rows changed.
    let changed: Vec<u64> = ids.iter().step_by(100).copied().collect();
    t.push(&changed, &vec![0.02; changed.len() * 16], 0.05, 2, 0, false)
        .unwrap();
    let started = Instant::now();
    let delta = t.cut(false).expect("1 % changed: a delta");
    let delta_copy = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let bytes = encode(delta.rows, 1, delta.removed);
    write_delta(d, 5, 1, &bytes).unwrap();
    let (delta_bytes, delta_write) = (bytes.len(), started.elapsed().as_secs_f64());
    drop(bytes);
    let want = t.rows();
    drop(t);
    // Restore: the whole file, then the delta on it.
    let started = Instant::now();
    let (path, r) = choose(
        (&list(d), &list_deltas(d)),
        (&shard_at(0, 1), tables),
        "me",
        None,
        0,
    )
    .unwrap();
    let restore = started.elapsed().as_secs_f64();
    assert_eq!((path, r.seq), (whole_path, 1));
    assert!(
        r.tables[0].rows == want,
        "the restore differs from the table"
    );
    println!(
        "{}",
        serde_json::json!({
            "rows": n,
            "bytes_per_row_in_memory": per_row,
            "bytes_per_row_needed": 8 + 2 * 16 * 4,
            "whole_bytes": whole_bytes,
            "whole_copy_secs": whole_copy,
            "whole_encode_write_secs": whole_write,
            "delta_rows": changed.len(),
            "delta_bytes": delta_bytes,
            "delta_over_whole": delta_bytes as f64 / whole_bytes as f64,
            "delta_copy_secs": delta_copy,
            "delta_encode_write_secs": delta_write,
            "restore_whole_and_delta_secs": restore,
        })
    );
}

/// A restore that stops early (a delta unreadable at that start) deletes
/// the chain's later deltas (`restore::forget_past`): the next whole
/// snapshot keeps that chain (`written_chain`), and were they readable
/// again they would carry the abandoned timeline past the new whole's
/// step.
#[test]
fn deltas_past_where_a_restore_stopped_are_deleted_and_never_outrank_the_newer_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let restored = || chain_restored(d).1;
    let snapshot = |step, chain, seq, rows| chain_snapshot(step, chain, seq, rows, Vec::new());
    let whole_a = write(
        d,
        10,
        &snapshot(10, 7, 0, chain_rows(&[1, 2], 1.0)),
        None,
        &[7],
    )
    .unwrap();
    write_delta(d, 7, 1, &snapshot(11, 7, 1, chain_rows(&[1], 2.0))).unwrap();
    let second = write_delta(d, 7, 2, &snapshot(12, 7, 2, chain_rows(&[1], 3.0))).unwrap();
    write_delta(d, 7, 3, &snapshot(13, 7, 3, chain_rows(&[1], 4.0))).unwrap();
    // At this start delta 2 cannot be read (an I/O error; here: damaged):
    // the shard resumes from delta 1, step 11.
    let mut bad = fs::read(&second).unwrap();
    let n = bad.len();
    bad[n - 2] ^= 0xff;
    fs::write(&second, &bad).unwrap();
    let r = restored();
    assert_eq!((r.step, r.seq), (11, 1));
    super::restore::forget_past(d, 7, r.seq, 0);
    let left: Vec<u32> = list_deltas(d).iter().map(|x| x.1).collect();
    assert_eq!(left, [1]);
    assert!(!second.exists());
    // Its next snapshot: whole, chain 9, step 12 (stats.written = the
    // restored whole, written_chain = 7).
    write(
        d,
        12,
        &snapshot(12, 9, 0, chain_rows(&[1, 2], 9.0)),
        Some(&whole_a),
        &[9, 7],
    )
    .unwrap();
    // Killed now: the newest state of this timeline is chain 9 at step 12.
    let r = restored();
    assert_eq!(
        (r.chain, r.step),
        (Some(9), 12),
        "restored the abandoned chain 7 up to delta {}",
        r.seq
    );
}

/// A second name for a delta (`-01`, a backup copy) is not one of the
/// chain's, and ends nothing.
#[test]
fn a_delta_under_a_second_name_does_not_end_the_chain() {
    let snapshot = |step, seq, rows| chain_snapshot(step, 7, seq, rows, Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, 10, &snapshot(10, 0, chain_rows(&[1], 1.0)), None, &[7]).unwrap();
    let first = write_delta(d, 7, 1, &snapshot(11, 1, chain_rows(&[1], 2.0))).unwrap();
    write_delta(d, 7, 2, &snapshot(12, 2, chain_rows(&[1], 3.0))).unwrap();
    fs::copy(
        &first,
        d.join(format!("shard-delta-{:016x}-01.safetensors", 7)),
    )
    .unwrap();
    let r = chain_restored(d).1;
    assert_eq!((r.step, r.seq), (12, 2));
}
