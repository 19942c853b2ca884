//! Embedding tables on real ps processes, driven through `transport::Cluster`'s
//! row API (`pull_rows`, `push_rows`) over TCP and shared memory: rows made
//! on first touch with their initializer, sparse Adagrad on only the pushed
//! rows, duplicates summed, and a sync step's rows averaged over the workers
//! that pushed them.

use crate::util::*;
use dtf::checkpoint::{Checkpoint, Saver, Slots};
use dtf::config::{Mode, ModelKind, OptimizerKind, Transport};
use dtf::model::table::{EMBEDDINGS, Rows, WIDE, wide_deep};
use dtf::placement::split_rows;
use dtf::transport::Via;
use ndarray::ArrayD;
use std::path::Path;
use std::time::Duration;

/// A wide & deep cluster of `ps` ps tasks (embeddings 4 wide, Adagrad,
/// learning rate 0.1), started and seeded at step 7; a client of worker 0.
async fn tables_cluster(
    ps: usize,
    mode: Mode,
    transport: Transport,
) -> (Cluster, dtf::transport::Cluster) {
    let c = start_tables_cluster(ps, mode, transport);
    let client = ps_client(&c, TOKEN);
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
    (c, client)
}

/// The ps tasks of a wide & deep cluster of `ps` ps tasks (embeddings 4
/// wide, Adagrad), started, not seeded.
fn start_tables_cluster(ps: usize, mode: Mode, transport: Transport) -> Cluster {
    let mut c = tables_config(ps, mode);
    c.use_transport(transport);
    for i in 0..ps {
        c.start("ps", i);
    }
    c
}

/// A wide & deep cluster of `ps` ps tasks and 2 workers (embeddings 4
/// wide, Adagrad), nothing started.
fn tables_config(ps: usize, mode: Mode) -> Cluster {
    let mut c = Cluster::new(ps, 2, 100, mode);
    c.cfg.model.kind = ModelKind::WideDeep;
    c.cfg.model.embedding_dim = 4;
    c.cfg.train.optimizer = OptimizerKind::Adagrad;
    c
}

/// What the chief seeds every shard with.
struct Seed {
    values: Vec<ArrayD<f32>>,
    shadows: Option<Vec<ArrayD<f32>>>,
    slots: Option<Vec<ArrayD<f32>>>,
    tables: Vec<(String, Rows)>,
    step: u64,
    run: u64,
}

impl Seed {
    /// Fresh values at `step`, no rows, run 1.
    fn fresh(values: Vec<ArrayD<f32>>, step: u64) -> Self {
        Self {
            values,
            shadows: None,
            slots: None,
            tables: Vec::new(),
            step,
            run: 1,
        }
    }

    /// What the chief restores from `c`.
    fn from(c: Checkpoint) -> Self {
        Self {
            values: c.variables.into_iter().map(|(_, a)| a).collect(),
            shadows: Some(c.shadows.into_iter().map(|(_, a)| a).collect()),
            slots: Some(c.slots.tensors.into_iter().map(|(_, a)| a).collect()),
            tables: c.tables,
            step: c.global_step,
            run: c.run,
        }
    }
}

/// Seeds every ps of `client` with `seed`, as the chief does.
async fn seed(client: &dtf::transport::Cluster, seed: &Seed) {
    // A ps still fetching its neighbour's copy refuses (and the call fails):
    // forced, a retry re-seeds the ones that took it already.
    let mut left: Vec<usize> = (0..client.num_ps()).collect();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !left.is_empty() {
        if let Ok(took) = client
            .initialize(
                &left,
                &seed.values,
                seed.shadows.as_deref(),
                seed.slots.as_deref(),
                &seed.tables,
                seed.step,
                true,
                seed.run,
            )
            .await
        {
            left.retain(|p| !took.contains(p));
        }
        assert!(std::time::Instant::now() < end, "ps {left:?} not seeded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `rounds` pushes of gradients to rows `ids` of both tables, each round's
/// other than the last's; the whole tables after each round.
async fn train_rows(
    client: &dtf::transport::Cluster,
    ids: &[u64],
    rounds: std::ops::Range<usize>,
) -> Vec<Vec<(String, Rows)>> {
    let mut after = Vec::new();
    for round in rounds {
        let emb: Vec<f32> = (0..ids.len() * 4)
            .map(|i| ((i + round) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let wide: Vec<f32> = (0..ids.len())
            .map(|i| ((i * round) % 5) as f32 * 0.2 - 0.3)
            .collect();
        client
            .push_rows(&[(EMBEDDINGS, ids, &emb), (WIDE, ids, &wide)], 0.1, 7, 0)
            .await
            .unwrap();
        after.push(client.snapshot().await.unwrap().tables);
    }
    after
}

/// Ids spread over every ps.
fn some_ids(n: u64) -> Vec<u64> {
    (0..n).map(|i| i * 1_000_003 + 17).collect()
}

/// What a fresh row of `table` holds.
fn fresh(table: usize, ids: &[u64], dim: usize) -> Vec<f32> {
    let spec = &wide_deep(dim)[table];
    let mut out = vec![0.0; ids.len() * spec.dim];
    for (row, &id) in out.chunks_exact_mut(spec.dim).zip(ids) {
        spec.init_row(id, row);
    }
    out
}

/// Adagrad from a fresh row (accumulator 0.1), learning rate 0.1.
fn adagrad(w: f32, g: f32) -> f32 {
    let accum = 0.1 + g * g;
    w - g * 0.1 * (1.0 / accum.sqrt())
}

crate::on_each_transport!(
    async fn rows_are_pulled_and_pushed_by_id_across_three_ps(transport) {
        let (_c, client) = tables_cluster(3, Mode::Async, transport).await;
        let ids: Vec<u64> = (0..40u64).map(|i| i * 1_000_003).collect();
        let rows = client
            .pull_rows(&[(EMBEDDINGS, &ids), (WIDE, &ids)], false)
            .await
            .unwrap();
        // Created on first touch, as every process would create them.
        assert_eq!(rows[0], fresh(0, &ids, 4));
        assert_eq!(rows[1], vec![0.0; ids.len()]);
        let via = match transport {
            Transport::Auto => Via::Shm,
            Transport::Tcp => Via::Tcp,
        };
        assert_eq!(client.transports(), vec![via; 3]);

        // One push: every id once, id 0 twice more (its rows summed).
        let mut push_ids = ids.clone();
        push_ids.extend([ids[0], ids[0]]);
        let emb: Vec<f32> = (0..push_ids.len() * 4).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
        let wide: Vec<f32> = (0..push_ids.len()).map(|i| 0.1 * i as f32).collect();
        let pushed = client
            .push_rows(
                &[(EMBEDDINGS, &push_ids, &emb), (WIDE, &push_ids, &wide)],
                0.1,
                7,
                0,
            )
            .await
            .unwrap();
        assert!(!pushed.stale && !pushed.complete);
        let after = client
            .pull_rows(&[(EMBEDDINGS, &ids), (WIDE, &ids)], false)
            .await
            .unwrap();
        let n = ids.len();
        for (i, _) in ids.iter().enumerate() {
            for j in 0..4 {
                let mut g = emb[i * 4 + j];
                if i == 0 {
                    g += emb[n * 4 + j] + emb[(n + 1) * 4 + j];
                }
                let want = adagrad(rows[0][i * 4 + j], g);
                assert!((after[0][i * 4 + j] - want).abs() < 1e-6, "row {i}.{j}");
            }
            let g = if i == 0 { wide[0] + wide[n] + wide[n + 1] } else { wide[i] };
            assert!((after[1][i] - adagrad(0.0, g)).abs() < 1e-6, "wide row {i}");
        }
        // A row never pushed is untouched.
        let other = [7u64];
        let untouched = client.pull_rows(&[(EMBEDDINGS, &other)], false).await.unwrap();
        assert_eq!(untouched[0], fresh(0, &other, 4));
        // A table the model does not have is named.
        let err = client
            .pull_rows(&[("no/such", &other)], false)
            .await
            .unwrap_err();
        assert_eq!(err.status.code(), tonic::Code::NotFound, "{err}");
        assert!(err.to_string().contains("no/such"), "{err}");
    }
);

crate::on_each_transport!(
    async fn a_sync_step_averages_each_row_over_the_workers_that_pushed_it(transport) {
        let (c, w0) = tables_cluster(2, Mode::Sync, transport).await;
        let w1 = ps_client(&c, TOKEN);
        let (a, b) = (11u64, 12u64);
        let before = w0.pull_rows(&[(WIDE, &[a, b])], false).await.unwrap();
        assert_eq!(before[0], vec![0.0, 0.0]);
        // Worker 0: rows a and b; worker 1: row a. Step 7 for both.
        w0.push_rows(&[(WIDE, &[a, b], &[1.0, 2.0])], 0.1, 7, 0)
            .await
            .unwrap();
        // One replica of two: nothing applied yet.
        let mid = w0.pull_rows(&[(WIDE, &[a, b])], false).await.unwrap();
        assert_eq!(mid[0], vec![0.0, 0.0]);
        w1.push_rows(&[(WIDE, &[a], &[3.0])], 0.1, 7, 1)
            .await
            .unwrap();
        let after = w0.pull_rows(&[(WIDE, &[a, b])], false).await.unwrap();
        // Row a: (1 + 3) / 2 workers; row b: 2 / 1.
        assert!((after[0][0] - adagrad(0.0, 2.0)).abs() < 1e-6, "{after:?}");
        assert!((after[0][1] - adagrad(0.0, 2.0)).abs() < 1e-6, "{after:?}");
        // Step 7 is done: a late push for it is stale and changes nothing.
        let late = w1
            .push_rows(&[(WIDE, &[b], &[100.0])], 0.1, 7, 1)
            .await
            .unwrap();
        assert!(late.stale);
        let same = w0.pull_rows(&[(WIDE, &[a, b])], false).await.unwrap();
        assert_eq!(same, after);
    }
);

/// The checkpoint the chief writes of `snap` (as `worker/checkpoints.rs`
/// builds it), saved in `dir` and read back.
fn checkpoint_of(c: &Cluster, snap: dtf::transport::Snapshot, dir: &Path) -> Checkpoint {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    let optimizer = c.cfg.train.optimizer();
    let names = || specs.iter().map(|s| s.name.clone());
    let slot_names = optimizer.slot_specs(&specs).into_iter().map(|s| s.name);
    let ckpt = Checkpoint {
        global_step: snap.step,
        variables: names().zip(snap.values).collect(),
        shadows: names().zip(snap.shadows).collect(),
        slots: Slots {
            optimizer,
            tensors: slot_names.zip(snap.slots).collect(),
        },
        run: snap.run,
        shard_steps: snap.shard_steps,
        table_optimizers: Vec::new(),
        increment: None,
        tables: snap.tables,
    };
    Saver::new(dir, 5).unwrap().save(&ckpt).unwrap();
    let (_, back) = dtf::checkpoint::restore_latest(dir, &specs)
        .unwrap()
        .unwrap();
    assert_eq!(back, ckpt, "the checkpoint reads back as written");
    back
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_of_tables_on_three_ps_restores_onto_one_and_two_ps() {
    let (c3, client) = tables_cluster(3, Mode::Async, Transport::Tcp).await;
    let ids = some_ids(60);
    let trained = train_rows(&client, &ids, 0..3).await;
    // Rows pulled but never pushed are saved too (as made).
    client
        .pull_rows(&[(EMBEDDINGS, &[5, 6])], false)
        .await
        .unwrap();
    let snap = client.snapshot().await.unwrap();
    let tables = snap.tables.clone();
    assert_eq!(tables.len(), 2);
    assert_eq!(
        (tables[0].0.as_str(), tables[1].0.as_str()),
        (EMBEDDINGS, WIDE)
    );
    let (emb, wide) = (&tables[0].1, &tables[1].1);
    assert_eq!((emb.ids.len(), wide.ids.len()), (62, 60));
    assert!(emb.ids.windows(2).all(|w| w[0] < w[1]), "sorted by id");
    assert_eq!((emb.values.len(), emb.slots[0].len()), (62 * 4, 62 * 4));
    // Trained: the rows and Adagrad's accumulators moved.
    assert_eq!(trained[2][1].1, *wide);
    assert!(
        emb.slots[0].iter().any(|&a| a > 0.1),
        "{:?}",
        &emb.slots[0][..8]
    );
    // Every ps held some of them.
    let held = split_rows(emb, 3);
    assert!(held.iter().all(|p| !p.ids.is_empty()));
    let dir = c3.dir.path().join("ckpt-3ps");
    let ckpt = checkpoint_of(&c3, snap, &dir);
    drop((client, c3));

    for ps in [1, 2] {
        let c = start_tables_cluster(ps, Mode::Async, Transport::Tcp);
        let client = ps_client(&c, TOKEN);
        seed(&client, &Seed::from(ckpt.clone())).await;
        // Every row back, with its shadow and its slot, whatever ps holds it now.
        let back = client.snapshot().await.unwrap();
        assert_eq!(back.tables, ckpt.tables, "onto {ps} ps");
        assert_eq!(back.step, ckpt.global_step);
        // And served by id: the values the checkpoint holds.
        let rows = client
            .pull_rows(&[(EMBEDDINGS, &emb.ids), (WIDE, &wide.ids)], false)
            .await
            .unwrap();
        assert_eq!(
            (&rows[0], &rows[1]),
            (&emb.values, &wide.values),
            "onto {ps} ps"
        );
        let shadows = client
            .pull_rows(&[(EMBEDDINGS, &emb.ids)], true)
            .await
            .unwrap();
        assert_eq!(shadows[0], emb.shadows, "onto {ps} ps");
        // Seeded anew without tables, a shard keeps none of its rows.
        let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
        seed(&client, &Seed::fresh(mlp.init(1), 0)).await;
        let empty = client.snapshot().await.unwrap().tables;
        assert!(empty.iter().all(|(_, r)| r.ids.is_empty()), "{empty:?}");
    }
}

/// The rows ps `ps` of `num_ps` owns, of each table.
fn owned(tables: &[(String, Rows)], ps: usize, num_ps: usize) -> Vec<Rows> {
    tables
        .iter()
        .map(|(_, t)| split_rows(t, num_ps).swap_remove(ps))
        .collect()
}

/// ps `i`'s newest snapshot file holds `rows` (each table's, in order).
fn snapshot_holds(c: &Cluster, i: usize, rows: &[Rows]) -> bool {
    let dir = Path::new(&c.cfg.ps.snapshot_dir).join(format!("ps-{i}"));
    let Some((_, newest)) = shard_files(&dir).into_iter().next() else {
        return false;
    };
    let Ok(bytes) = std::fs::read(newest) else {
        return false;
    };
    let Ok(file) = safetensors::SafeTensors::deserialize(&bytes) else {
        return false;
    };
    [EMBEDDINGS, WIDE].iter().zip(rows).all(|(table, want)| {
        let got = |suffix: &str| {
            file.tensor(&format!("{table}/{suffix}"))
                .ok()
                .map(|v| bytemuck::pod_collect_to_vec::<u8, f32>(v.data()))
        };
        got("values").as_ref() == Some(&want.values)
            && got("Adagrad").as_ref() == Some(&want.slots[0])
    })
}

/// ps `i` of `c` killed with -9 and started again: its `State` once it has
/// restored its snapshot, and each table's rows it owns once the chief's
/// client has adopted that snapshot.
async fn killed_and_adopted(
    c: &mut Cluster,
    client: &dtf::transport::Cluster,
    i: usize,
) -> (dtf::transport::pb::StateResponse, Vec<Rows>) {
    c.kill(&format!("ps:{i}"));
    c.start("ps", i);
    // Restored, and done asking its ring neighbour for a newer copy (until
    // then it refuses the chief's calls, `UNAVAILABLE`).
    let what = format!("ps:{i} restored from its snapshot and serving");
    let state = crate::snapshot::wait_state(c, i, &what, |s| s.restored && !s.fetching).await;
    let took = client
        .adopt(&[(i, state.restored_step, state.restored_step)], 1)
        .await
        .unwrap();
    assert_eq!(took, vec![i]);
    let back = owned(&client.snapshot().await.unwrap().tables, i, client.num_ps());
    (state, back)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ps_killed_during_row_pushes_comes_back_with_its_rows_from_its_snapshot() {
    let (mut c, client) = tables_cluster(2, Mode::Async, Transport::Tcp).await;
    let ids = some_ids(40);
    let mut history = train_rows(&client, &ids, 0..3).await;
    // Rows alone moved (the step did not): ps 1 snapshots them all the same.
    let rows = owned(history.last().unwrap(), 1, 2);
    assert!(!rows[0].ids.is_empty());
    tokio::task::block_in_place(|| {
        until(
            Duration::from_secs(30),
            "ps:1's snapshot of its rows",
            || snapshot_holds(&c, 1, &rows).then_some(()),
        )
    });
    let at_least = history.len() - 1;
    // More pushes, and a kill -9 right after one: these may be lost, up to
    // ps.snapshot_secs of them, never the rows of a snapshot written before.
    history.extend(train_rows(&client, &ids, 3..6).await);
    let (state, back) = killed_and_adopted(&mut c, &client, 1).await;
    assert_eq!(state.run, 1);
    let from = history[at_least..]
        .iter()
        .position(|tables| owned(tables, 1, 2) == back);
    assert!(
        from.is_some(),
        "ps:1 came back with rows of no round since its snapshot: {:?}",
        &back[1].values[..4.min(back[1].values.len())]
    );
    // ps:0 never stopped: its rows are the newest.
    let now = client.snapshot().await.unwrap().tables;
    assert_eq!(owned(&now, 0, 2), owned(history.last().unwrap(), 0, 2));
}

/// Tables far larger than a page ([`dtf::transport::PAGE_BYTES`]) move a
/// page at a time: the chief's snapshot reads every row of them and its
/// seeding stages them, onto another ps count, on both transports.
#[tokio::test(flavor = "multi_thread")]
async fn tables_of_several_pages_are_read_and_seeded_whole() {
    for transport in [Transport::Tcp, Transport::Auto] {
        let (c1, client) = tables_cluster(1, Mode::Async, transport).await;
        // deep/embeddings 4 wide with Adagrad: 8 + 4 × 12 bytes a row.
        let per_page = dtf::transport::PAGE_BYTES / (8 + 4 * 12);
        let ids = some_ids(2 * per_page as u64 + 1000);
        client
            .pull_rows(&[(EMBEDDINGS, &ids)], false)
            .await
            .unwrap();
        let pushed = &ids[ids.len() - 3..];
        client
            .push_rows(&[(EMBEDDINGS, pushed, &[0.5; 12])], 0.1, 7, 0)
            .await
            .unwrap();
        let snap = client.snapshot().await.unwrap();
        let tables = snap.tables.clone();
        let emb = &tables[0].1;
        assert_eq!(
            emb.ids.len(),
            ids.len(),
            "{transport:?}: every row, three pages"
        );
        assert!(emb.ids.windows(2).all(|w| w[0] < w[1]), "sorted by id");
        let ckpt = checkpoint_of(&c1, snap, &c1.dir.path().join("ckpt"));
        drop((client, c1));

        let c2 = start_tables_cluster(2, Mode::Async, transport);
        let client = ps_client(&c2, TOKEN);
        seed(&client, &Seed::from(ckpt)).await;
        assert_eq!(
            client.snapshot().await.unwrap().tables,
            tables,
            "{transport:?}"
        );
        let rows = client
            .pull_rows(&[(EMBEDDINGS, pushed)], false)
            .await
            .unwrap();
        let at = emb.ids.binary_search(&pushed[0]).unwrap();
        assert_eq!(
            rows[0],
            emb.values[at * 4..(at + 3) * 4].to_vec(),
            "{transport:?}"
        );
    }
}

/// Staged rows that are not the chief's — token 0, rows of another width,
/// NaN, an unknown table, or an `Initialize` naming a token nothing was
/// staged under — get a clear status, and the ps keeps its rows.
#[tokio::test(flavor = "multi_thread")]
async fn bad_staged_rows_are_refused_and_change_nothing() {
    use dtf::transport::pb;
    use tonic::Code;
    let (c, client) = tables_cluster(1, Mode::Async, Transport::Tcp).await;
    let ids = some_ids(5);
    client
        .pull_rows(&[(EMBEDDINGS, &ids)], false)
        .await
        .unwrap();
    let before = client.snapshot().await.unwrap().tables;
    let mut raw = c.client(0, Some(TOKEN)).await;
    let rows = |table: &str, values: Vec<f32>| pb::TableRows {
        table: table.into(),
        ids: vec![1, 2],
        values: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    };
    let cases = [
        (
            0,
            rows(EMBEDDINGS, vec![0.5; 8]),
            Code::InvalidArgument,
            "token 0",
        ),
        (
            9,
            rows(EMBEDDINGS, vec![0.5; 6]),
            Code::InvalidArgument,
            "values",
        ),
        (
            9,
            rows(EMBEDDINGS, vec![f32::NAN; 8]),
            Code::InvalidArgument,
            "non-finite",
        ),
        (
            9,
            rows("deep/nothing", vec![0.5; 8]),
            Code::NotFound,
            "deep/nothing",
        ),
    ];
    for (token, rows, code, says) in cases {
        let e = raw
            .stage_rows(pb::StageRowsRequest {
                token,
                rows: Some(rows),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(says), "{e:?}");
    }
    // Staged under 9, initialized naming 10: refused, nothing replaced.
    raw.stage_rows(pb::StageRowsRequest {
        token: 9,
        rows: Some(rows(EMBEDDINGS, vec![0.5; 8])),
    })
    .await
    .unwrap();
    let e = raw
        .initialize(pb::InitializeRequest {
            force: true,
            staged: 10,
            global_step: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("staged"), "{e:?}");
    assert_eq!(client.snapshot().await.unwrap().tables, before);
}

/// Issue 42 item 5: a `cluster.ps` edit (2 → 3) re-hashes every table row
/// onto the new ps count live, as the dense variables re-shard: the chief
/// checkpoints the tables once the old ps tasks stop taking pushes, every
/// task starts again under the new list, and the chief seeds each ps with
/// the rows it now owns. No row is lost and none is held twice; each ps
/// holds only the ids that hash to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_ps_edit_rehashes_the_table_rows_onto_the_new_ps_count_losing_none() {
    let mut c = Cluster::new(2, 1, 1_000_000, Mode::Async);
    wide_deep_on_synth(&mut c, 20_000);
    c.cfg.checkpoint.max_to_keep = 1000;
    // No periodic checkpoint: the one after the re-shard's restore is
    // looked for below.
    c.cfg.checkpoint.save_secs = Some(3600);
    c.write_config();
    c.start_all();
    tokio::task::block_in_place(|| past(&c, 100));
    c.wait_log("worker:0", "Training.", 1, Duration::from_secs(60));

    c.cfg.cluster.ps.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    c.start("ps", 2);
    let saved =
        tokio::task::block_in_place(|| logged_step(&c, "worker:0", "Re-shard checkpoint done", 1));
    let restored = tokio::task::block_in_place(|| {
        logged_step(&c, "worker:0", "Restored the model from the newest", 1)
    });
    assert_eq!(
        restored, saved,
        "the new placement starts where the old one stopped"
    );
    // The pause holds no write that the re-shard checkpoint makes useless:
    // the old ps tasks take no last snapshot, and the chief does not save
    // the state it just restored from that checkpoint again.
    for i in 0..2 {
        let log = c.wait_log(
            &format!("ps:{i}"),
            "Starting again under",
            1,
            Duration::from_secs(30),
        );
        assert!(
            log.contains("No last snapshot: the chief's re-shard checkpoint holds"),
            "ps:{i}:\n{log}"
        );
    }
    let log = c.wait_log("worker:0", "Training.", 2, Duration::from_secs(60));
    let after: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.contains("Restored the model from the newest"))
        .take_while(|l| !l.contains("Training."))
        .filter(|l| l.contains("Checkpoint written."))
        .collect();
    assert!(after.is_empty(), "saved again after the restore: {after:?}");
    // Training stopped where it is: the rows now are the seeded ones plus
    // what the chief's steps since added, no more.
    c.signal("worker:0", libc::SIGSTOP);
    let path = c
        .cfg
        .checkpoint
        .dir
        .join(format!("model.ckpt-{saved}.safetensors"));
    let ckpt = dtf::checkpoint::load(&path, None).unwrap();
    let client = ps_client(&c, TOKEN);
    assert_eq!(client.num_ps(), 3);
    let (counts, now) = eventually(Duration::from_secs(30), "the rows to settle", || async {
        let mut counts = Vec::new();
        for i in 0..3 {
            let s = c.state(i).await?;
            let rows: Vec<u64> = s.tables.iter().map(|t| t.rows).collect();
            counts.push(rows);
        }
        let now = client.snapshot().await.ok()?.tables;
        let again: Vec<u64> = now.iter().map(|(_, r)| r.ids.len() as u64).collect();
        let held: Vec<u64> = (0..2).map(|t| counts.iter().map(|r| r[t]).sum()).collect();
        (held == again).then_some((counts, now))
    })
    .await;
    c.signal("worker:0", libc::SIGCONT);
    eprintln!(
        "re-shard at step {saved}: rows per ps {counts:?}, the checkpoint's {:?}",
        ckpt.tables
            .iter()
            .map(|(_, r)| r.ids.len())
            .collect::<Vec<_>>()
    );
    for ((name, saved_rows), (_, rows)) in ckpt.tables.iter().zip(&now) {
        assert!(
            !saved_rows.ids.is_empty(),
            "{name}: the checkpoint holds rows"
        );
        // Each id once, on its owner: the ps tasks' counts add up to the
        // merged table, and every ps holds some.
        assert!(rows.ids.windows(2).all(|w| w[0] < w[1]), "{name}");
        assert!(
            counts.iter().all(|c| c.iter().all(|&n| n > 0)),
            "{counts:?}"
        );
        // No row lost: every id of the re-shard checkpoint is served.
        let missing: Vec<u64> = saved_rows
            .ids
            .iter()
            .filter(|id| rows.ids.binary_search(id).is_err())
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{name}: {} rows lost: {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
    // Each ps holds exactly the rows that hash to it under 3 ps.
    for (t, (_, rows)) in now.iter().enumerate() {
        let split = split_rows(rows, 3);
        for (i, part) in split.iter().enumerate() {
            assert!(
                part.ids
                    .iter()
                    .all(|&id| dtf::placement::table_owner(id, 3) == i)
            );
            assert_eq!(
                part.ids.len() as u64,
                counts[i][t],
                "ps:{i} table {t}: {counts:?}"
            );
        }
    }
}

/// Issue 42 item 4: each table is updated by its own rule at its own rate
/// on the ps — here FTRL at 0.3 for the wide part
/// (`model.tables.linear_optimizer`, `linear_learning_rate`) and Adagrad
/// at the push's 0.1 for the embeddings — checked against the rules by hand.
#[tokio::test(flavor = "multi_thread")]
async fn each_table_takes_its_own_rule_and_learning_rate_on_the_ps() {
    let mut c = tables_config(2, Mode::Async);
    c.cfg.model.tables.linear_optimizer = Some(dtf::config::TableOptimizerKind::Ftrl);
    c.cfg.model.tables.linear_learning_rate = 0.3;
    c.use_transport(Transport::Tcp);
    for i in 0..2 {
        c.start("ps", i);
    }
    let client = ps_client(&c, TOKEN);
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
    let ids = some_ids(10);
    let before = client
        .pull_rows(&[(EMBEDDINGS, &ids)], false)
        .await
        .unwrap();
    let emb = vec![0.5; ids.len() * 4];
    let wide: Vec<f32> = (0..ids.len()).map(|i| 0.1 * i as f32 - 0.45).collect();
    client
        .push_rows(&[(EMBEDDINGS, &ids, &emb), (WIDE, &ids, &wide)], 0.1, 7, 0)
        .await
        .unwrap();
    let after = client
        .pull_rows(&[(EMBEDDINGS, &ids), (WIDE, &ids)], false)
        .await
        .unwrap();
    for (k, (&b, &a)) in before[0].iter().zip(&after[0]).enumerate() {
        assert!(
            (a - adagrad(b, 0.5)).abs() < 1e-6,
            "embedding value {k}: {a}"
        );
    }
    for (i, &g) in wide.iter().enumerate() {
        let (want, _, _) = dtf::optimizer::table::ftrl(0.0, g, 0.1, 0.0, 0.3, -0.5, 0.0, 0.0);
        assert!(
            (after[1][i] - want).abs() < 1e-6,
            "wide row {i}: {} vs {want}",
            after[1][i]
        );
        assert!(want != 0.0);
    }
}

/// Incremental snapshots (`ps.snapshot_full_every`): after a whole
/// snapshot, each round of pushes to a few rows is written as a delta of
/// those rows alone, far smaller than the whole; a ps killed with -9 then
/// comes back with the whole snapshot and every delta applied: each row
/// of its shard exactly as the newest round left it. `State` and
/// `/metrics` say which delta the latest snapshot is.
#[tokio::test(flavor = "multi_thread")]
async fn a_ps_killed_after_incremental_snapshots_comes_back_with_the_deltas_applied() {
    let mut c = tables_config(2, Mode::Async);
    c.cfg.ps.snapshot_full_every = 1000;
    c.cfg.ps.snapshot_delta_min_bytes = 0;
    c.use_transport(Transport::Tcp);
    c.start("ps", 0);
    let metrics = free_addrs(1).remove(0);
    c.start_env("ps", 1, &[("DTF_METRICS__LISTEN", &metrics)]);
    let client = ps_client(&c, TOKEN);
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
    let ids = some_ids(4000);
    let mut history = train_rows(&client, &ids, 0..1).await;
    let whole = crate::snapshot::wait_state(&c, 1, "ps:1's whole snapshot of its rows", |s| {
        s.snapshot_delta == 0 && s.tables.iter().all(|t| t.rows > 1000) && s.snapshot_bytes > 0
    })
    .await;
    // Each round's pushes touch 1 % of the rows, written as the next delta.
    for round in 1..=3u32 {
        let few: Vec<u64> = ids
            .iter()
            .skip(round as usize)
            .step_by(100)
            .copied()
            .collect();
        history.extend(train_rows(&client, &few, round as usize..round as usize + 1).await);
        let delta = crate::snapshot::wait_state(&c, 1, "ps:1's delta of the round", |s| {
            s.snapshot_delta == round
        })
        .await;
        assert!(
            delta.snapshot_bytes * 4 < whole.snapshot_bytes,
            "delta {round}: {} bytes, the whole snapshot {}",
            delta.snapshot_bytes,
            whole.snapshot_bytes
        );
    }
    let text = tokio::task::block_in_place(|| {
        until(Duration::from_secs(30), "/metrics", || {
            http_get(&metrics, "/metrics")
        })
    });
    assert_eq!(
        metric_sample(&text, "dtf_snapshot_delta"),
        Some(3.0),
        "{text}"
    );
    let want = owned(history.last().unwrap(), 1, 2);
    let (state, back) = killed_and_adopted(&mut c, &client, 1).await;
    assert_eq!(state.restored_deltas, 3);
    assert_eq!(back, want, "ps:1's rows after the restore");
}

/// Incremental checkpoints read from real ps tasks, on both transports: the
/// chief's base read of every table, then deltas — the rows created or
/// updated since it and the ids dropped (evictions under `max_rows`) —
/// each applied to the base alone, make the tables a whole read gives,
/// row for row with shadows and slots; plain reads between change nothing
/// for the chain. A ps killed and restored from its snapshot cannot tell
/// its changes: the delta is refused (the chief's checkpoint is then
/// whole), and a new chain's base starts deltas again.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_base_and_any_later_delta_read_from_the_ps_tasks_make_the_tables() {
    use dtf::transport::call::Cut;
    for transport in [Transport::Tcp, Transport::Auto] {
        let mut c = tables_config(2, Mode::Async);
        c.cfg.model.tables.max_rows = 30;
        c.use_transport(transport);
        c.start("ps", 0);
        c.start("ps", 1);
        let client = ps_client(&c, TOKEN);
        let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
        seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
        train_rows(&client, &some_ids(20), 0..2).await;
        let base = client.snapshot_cut(Cut::Base(9)).await.unwrap().unwrap();
        assert!(base.removed.is_empty());
        let mut dropped = 0;
        for round in 0..4u64 {
            // New ids every round: past max_rows, the oldest are evicted.
            let ids: Vec<u64> = (0..30).map(|i| round * 1000 + i * 7).collect();
            train_rows(&client, &ids, 0..1).await;
            client
                .pull_rows(&[(EMBEDDINGS, &[round + 90_000])], false)
                .await
                .unwrap();
            let delta = client.snapshot_cut(Cut::Delta(9)).await.unwrap().unwrap();
            let whole = client.snapshot().await.unwrap();
            assert_eq!(delta.step, whole.step);
            for (i, (name, rows)) in whole.tables.iter().enumerate() {
                let patched = base.tables[i]
                    .1
                    .clone()
                    .patched(&delta.removed[i], delta.tables[i].1.clone());
                assert_eq!(&patched, rows, "{transport:?} round {round}: table {name}");
                dropped += delta.removed[i].len();
            }
        }
        assert!(dropped > 0, "no row was evicted");
        // A kill -9: the restarted ps, seeded again, cannot tell what
        // changed since the base.
        c.kill("ps:1");
        c.start("ps", 1);
        seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
        assert!(client.snapshot_cut(Cut::Delta(9)).await.unwrap().is_none());
        let base = client.snapshot_cut(Cut::Base(10)).await.unwrap().unwrap();
        train_rows(&client, &some_ids(20), 5..6).await;
        let delta = client.snapshot_cut(Cut::Delta(10)).await.unwrap().unwrap();
        let whole = client.snapshot().await.unwrap();
        for (i, (_, rows)) in whole.tables.iter().enumerate() {
            let patched = base.tables[i]
                .1
                .clone()
                .patched(&delta.removed[i], delta.tables[i].1.clone());
            assert_eq!(&patched, rows);
        }
        // The older chain is gone for good.
        assert!(client.snapshot_cut(Cut::Delta(9)).await.unwrap().is_none());
    }
}

/// A ps that hears the re-shard word takes no last snapshot only when the
/// chief says its checkpoint holds the ps's state
/// (`CompleteRequest.checkpointed`): told so when the chief's read or its
/// write failed (or by an older chief), it takes one as any stopping ps does.
#[tokio::test(flavor = "multi_thread")]
async fn a_ps_skips_its_last_snapshot_only_when_the_re_shard_checkpoint_holds_it() {
    let mut c = tables_config(2, Mode::Async);
    c.use_transport(Transport::Tcp);
    c.write_config();
    for i in 0..2 {
        c.start("ps", i);
    }
    let client = ps_client(&c, TOKEN);
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    seed(&client, &Seed::fresh(mlp.init(1), 7)).await;
    c.cfg.cluster.ps.push(free_addrs(1).remove(0));
    c.write_config_by_rename();
    eventually(Duration::from_secs(30), "both ps to re-shard", || async {
        let mut all = true;
        for i in 0..2 {
            all &= c.state(i).await.is_some_and(|s| s.resharding);
        }
        all.then_some(())
    })
    .await;
    for (ps, checkpointed) in [(0, false), (1, true)] {
        let answers = client.complete_reshard(7, &[ps], checkpointed).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        let log = c.wait_log(
            &format!("ps:{ps}"),
            "Starting again under the new cluster.ps.",
            1,
            Duration::from_secs(30),
        );
        assert_eq!(
            log.contains("No last snapshot"),
            checkpointed,
            "ps:{ps}:\n{log}"
        );
    }
}
