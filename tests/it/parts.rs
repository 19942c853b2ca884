//! Partitioned variables (`model.partitioner`): a checkpoint holds whole
//! variables, so one written by 3 ps with `fixed` 4 parts restores onto 1 ps
//! with `none` and onto 2 ps with `min_size`, values, shadows and slots
//! identical; `dtf status --json` reports each ps's parameters.

use crate::util::*;
use dtf::checkpoint::Checkpoint;
use dtf::config::{Mode, OptimizerKind, Partitioner};
use dtf::transport::pb;
use dtf::transport::proto as rpc;
use std::time::Duration;

const RUN: Duration = Duration::from_secs(180);

/// A cluster of `ps` + `workers` over the tiny data set with Adam (slots to
/// carry), hidden width 18 (a first axis 4 parts do not divide evenly).
fn cluster(ps: usize, workers: usize, last_step: u64, mode: Mode) -> Cluster {
    let mut c = Cluster::new(ps, workers, last_step, mode);
    c.cfg.model.layers = vec![SIDE * SIDE, 18, CLASSES];
    c.cfg.train.optimizer = OptimizerKind::Adam;
    c.cfg.train.learning_rate = 0.01;
    c.write_config();
    c
}

/// The newest checkpoint of `c` that verifies against its model.
fn newest(c: &Cluster) -> Checkpoint {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
        .unwrap()
        .map(|(_, ck)| ck)
        .expect("a checkpoint")
}

/// Starts `c`'s ps tasks and its chief alone in a sync cluster of two
/// workers: the chief restores the newest checkpoint onto the ps tasks, and
/// no step applies (one gradient of the two each step takes), so the ps
/// tasks hold what was restored. Returns their state as a snapshot.
async fn restored(c: &mut Cluster) -> dtf::transport::Snapshot {
    for i in 0..c.cfg.cluster.ps.len() {
        c.start("ps", i);
    }
    c.start("worker", 0);
    let c = &*c;
    for i in 0..c.cfg.cluster.ps.len() {
        eventually(RUN, "every ps seeded from the checkpoint", || async {
            c.state(i).await.filter(|s| s.initialized)
        })
        .await;
    }
    ps_client(c, TOKEN).snapshot().await.unwrap()
}

/// The snapshot holds exactly the checkpoint's variables, shadows and slots.
fn assert_same(ck: &Checkpoint, snap: &dtf::transport::Snapshot, what: &str) {
    assert_eq!(snap.step, ck.global_step, "{what}: step");
    for ((name, a), b) in ck.variables.iter().zip(&snap.values) {
        assert_eq!(a, b, "{what}: {name}");
    }
    for ((name, a), b) in ck.shadows.iter().zip(&snap.shadows) {
        assert_eq!(a, b, "{what}: the shadow of {name}");
    }
    assert_eq!(ck.slots.tensors.len(), snap.slots.len(), "{what}: slots");
    for ((name, a), b) in ck.slots.tensors.iter().zip(&snap.slots) {
        assert_eq!(a, b, "{what}: slot {name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_of_four_parts_on_three_ps_restores_onto_any_partitioning() {
    // Written: 3 ps, every variable in 4 parts.
    let mut first = cluster(3, 1, 40, Mode::Async);
    first.cfg.model.partitioner = Partitioner::Fixed;
    first.cfg.model.partitions = 4;
    first.write_config();
    first.start_all();
    tokio::task::block_in_place(|| first.wait_all_success(RUN));
    // The ps held parts, as TensorFlow names them; the chief logged them.
    let log = first.log("worker:0");
    for part in [
        "layer1/weights/part_3",
        "layer1/biases/part_2",
        "layer2/biases/part_3",
    ] {
        assert!(log.contains(part), "{part} not placed; log:\n{log}");
    }
    let ck = newest(&first);
    assert!(ck.global_step >= 40, "{}", ck.global_step);
    // Whole variables in the checkpoint, under their own names.
    let names: Vec<&str> = ck.variables.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "layer1/weights",
            "layer1/biases",
            "layer2/weights",
            "layer2/biases"
        ]
    );
    assert_eq!(ck.variables[0].1.shape(), [SIDE * SIDE, 18]);
    assert!(
        ck.slots
            .tensors
            .iter()
            .any(|(n, _)| n == "layer1/weights/Adam"),
        "{:?}",
        ck.slots.tensors.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );

    // Restored: 1 ps, whole variables.
    let mut one = cluster(1, 2, 1000, Mode::Sync);
    one.cfg.checkpoint.dir = first.cfg.checkpoint.dir.clone();
    one.cfg.model.partitioner = Partitioner::None;
    one.cfg.cluster.ps_exit_when_complete = false;
    one.write_config();
    let snap = restored(&mut one).await;
    assert_same(&ck, &snap, "1 ps, none");
    let state = one.state(0).await.unwrap();
    assert_eq!(state.variables, names);
    drop(one);

    // Restored: 2 ps, min_size (a small minimum, so the tiny model splits).
    let mut two = cluster(2, 2, 1000, Mode::Sync);
    two.cfg.checkpoint.dir = first.cfg.checkpoint.dir.clone();
    two.cfg.model.min_shard_bytes = 1024;
    two.write_config();
    let snap = restored(&mut two).await;
    assert_same(&ck, &snap, "2 ps, min_size");
    // 64 x 18 floats = 4608 bytes: ceil(4608 / 1024) = 5, at most the ps
    // count: 2 parts of 32 rows, one on each ps; the rest stay whole.
    let zero = two.state(0).await.unwrap();
    let one = two.state(1).await.unwrap();
    assert_eq!(
        zero.variables,
        ["layer1/weights/part_0", "layer1/biases", "layer2/biases"]
    );
    assert_eq!(one.variables, ["layer1/weights/part_1", "layer2/weights"]);
    let (p0, p1) = (32 * 18 + 18 + CLASSES, 32 * 18 + 18 * CLASSES);
    assert_eq!((zero.parameters, one.parameters), (p0 as u64, p1 as u64));

    // `dtf status --json` reports them.
    let out = tokio::task::block_in_place(|| two.dtf(&["status", "--json"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let status: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    let params: Vec<u64> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "ps")
        .map(|t| t["parameters"].as_u64().unwrap())
        .collect();
    assert_eq!(params, [p0 as u64, p1 as u64], "{text}");
}

/// Eight clients push at once, twenty times each, to one ps holding
/// `layer1/weights` in four parts, applied on four threads: every update is
/// in, none lost or applied twice. The
/// gradients are multiples of 1/64 and the values start at zero, so SGD's
/// sums are exact in f32 in any order: the result must equal the serial
/// reference bit for bit.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pushes_to_the_parts_of_one_ps_all_apply() {
    const CLIENTS: usize = 8;
    const PUSHES: usize = 20;
    const LR: f32 = 0.25;
    let mut c = Cluster::new(1, 1, 1_000_000, Mode::Async);
    // layer1/weights: 4 parts of [16, 2048], 32,768 values each.
    c.cfg.model.layers = vec![SIDE * SIDE, 2048, CLASSES];
    c.cfg.model.partitioner = Partitioner::Fixed;
    c.cfg.model.partitions = 4;
    c.write_config();
    // Four threads whatever the machine: a ps on fewer than four cores
    // applies serially, and this test is about the parallel apply.
    c.start_env("ps", 0, &[("RAYON_NUM_THREADS", "4")]);
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    let parts = dtf::placement::Layout::new(&c.cfg, specs).shard(0);
    assert_eq!(parts.len(), 16, "every variable in 4 parts: {parts:?}");
    assert_eq!(parts[0].name, "layer1/weights/part_0");
    assert_eq!(parts[0].shape, [16, 2048]);
    let zeros = |p: &dtf::model::VarSpec| ndarray::ArrayD::<f32>::zeros(p.shape.as_slice());
    let mut ps = c.client(0, Some(TOKEN)).await;
    let init = pb::InitializeRequest {
        variables: parts
            .iter()
            .map(|p| rpc::encode(&p.name, &zeros(p)))
            .collect(),
        ..Default::default()
    };
    assert!(ps.initialize(init).await.unwrap().into_inner().applied);
    // Client k's gradient: element e of every part is ((e % 7) + 1 + k) / 64.
    let grad = |p: &dtf::model::VarSpec, k: usize| {
        let mut a = zeros(p);
        for (e, v) in a.iter_mut().enumerate() {
            *v = ((e % 7) + 1 + k) as f32 / 64.0;
        }
        a
    };
    let clients = (0..CLIENTS).map(|k| {
        let (c, parts) = (&c, &parts);
        async move {
            let mut ps = c.client(0, Some(TOKEN)).await;
            let gradients: Vec<pb::Tensor> = parts
                .iter()
                .map(|p| rpc::encode(&p.name, &grad(p, k)))
                .collect();
            for step in 0..PUSHES {
                ps.push(pb::PushRequest {
                    gradients: gradients.clone(),
                    learning_rate: LR,
                    step: step as u64,
                    worker: 0,
                    loss: 1.0,
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        }
    });
    futures::future::join_all(clients).await;
    let pulled = ps
        .pull(pb::PullRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pulled.global_step, (CLIENTS * PUSHES) as u64);
    // The serial reference: every push applied one after the other.
    for (p, t) in parts.iter().zip(&pulled.variables) {
        let mut want = zeros(p);
        for k in 0..CLIENTS {
            let g = grad(p, k);
            for _ in 0..PUSHES {
                want.zip_mut_with(&g, |w, g| *w -= LR * g);
            }
        }
        assert!(
            *t == rpc::encode(&p.name, &want),
            "{}: an update lost or applied twice",
            p.name
        );
    }
    let state = c.state(0).await.unwrap();
    assert_eq!(state.pushes_applied, (CLIENTS * PUSHES) as u64);
}
