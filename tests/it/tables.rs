//! Embedding tables on real ps processes, driven through `transport::Cluster`'s
//! row API (`pull_rows`, `push_rows`) over TCP and shared memory: rows made
//! on first touch with their initializer, sparse Adagrad on only the pushed
//! rows, duplicates summed, and a sync step's rows averaged over the workers
//! that pushed them.

use crate::util::*;
use dtf::config::{Mode, ModelKind, OptimizerKind, Transport};
use dtf::model::table::{EMBEDDINGS, WIDE, wide_deep};
use dtf::transport::Via;
use std::time::Duration;

/// A wide & deep cluster of `ps` ps tasks (embeddings 4 wide, Adagrad,
/// learning rate 0.1), started and seeded at step 7; a client of worker 0.
async fn tables_cluster(
    ps: usize,
    mode: Mode,
    transport: Transport,
) -> (Cluster, dtf::transport::Cluster) {
    let mut c = Cluster::new(ps, 2, 100, mode);
    c.cfg.model.kind = ModelKind::WideDeep;
    c.cfg.model.embedding_dim = 4;
    c.cfg.train.optimizer = OptimizerKind::Adagrad;
    c.use_transport(transport);
    for i in 0..ps {
        c.start("ps", i);
    }
    let client = ps_client(&c, TOKEN);
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    let values = mlp.init(1);
    // A ps still fetching its neighbour's copy refuses (and the call fails):
    // forced, a retry re-seeds the ones that took it already.
    let mut left: Vec<usize> = (0..ps).collect();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !left.is_empty() {
        if let Ok(took) = client
            .initialize(&left, &values, None, None, 7, true, 1)
            .await
        {
            left.retain(|p| !took.contains(p));
        }
        assert!(std::time::Instant::now() < end, "ps {left:?} not seeded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (c, client)
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
