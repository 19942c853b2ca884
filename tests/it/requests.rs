//! Bad requests against a live ps get a precise status and change nothing.

use crate::util::*;
use dtf::config::Mode;
use dtf::transport::pb;
use dtf::transport::proto as rpc;
use ndarray::ArrayD;
use tonic::Code;

fn grads(values: &[(String, ArrayD<f32>)]) -> Vec<pb::Tensor> {
    values
        .iter()
        .map(|(n, a)| rpc::encode(n, &ArrayD::from_elem(a.shape(), 0.5f32)))
        .collect()
}

fn push(gradients: Vec<pb::Tensor>) -> pb::PushRequest {
    pb::PushRequest {
        gradients,
        learning_rate: 0.1,
        step: 7,
        worker: 0,
        pull: true,
        incarnation: 0,
        loss: 1.0,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_pushes_are_rejected_and_change_nothing() {
    let (_c, mut ps, values) = live_ps(Mode::Async).await;
    let before = snapshot(&mut ps).await;
    assert_eq!(before.0, 7);

    let mut unknown = grads(&values);
    unknown[0].name = "layer9/weights".into();
    let mut shape = grads(&values);
    shape[1].shape = vec![shape[1].shape[0] / 2, 2];
    let mut dtype = grads(&values);
    dtype[2].dtype = pb::DataType::I64 as i32;
    let mut short = grads(&values);
    short[3].data = short[3].data.slice(..4);
    let mut nan = grads(&values);
    let mut a = ArrayD::from_elem(values[1].1.shape(), 0.5f32);
    a[[3]] = f32::NAN;
    nan[1] = rpc::encode(&values[1].0, &a);
    let mut missing = grads(&values);
    missing.pop();
    let mut twice = grads(&values);
    twice.push(twice[0].clone());
    let cases: Vec<(&str, pb::PushRequest, Code, &str)> = vec![
        (
            "unknown variable",
            push(unknown),
            Code::NotFound,
            "layer9/weights",
        ),
        (
            "wrong shape",
            push(shape),
            Code::InvalidArgument,
            "layer1/biases",
        ),
        (
            "wrong dtype",
            push(dtype),
            Code::InvalidArgument,
            "DATA_TYPE_F32",
        ),
        ("wrong length", push(short), Code::InvalidArgument, "bytes"),
        (
            "non-finite gradient",
            push(nan),
            Code::InvalidArgument,
            "non-finite",
        ),
        (
            "missing variable",
            push(missing),
            Code::InvalidArgument,
            "layer2/biases",
        ),
        (
            "variable twice",
            push(twice),
            Code::InvalidArgument,
            "twice",
        ),
        (
            "negative learning rate",
            pb::PushRequest {
                learning_rate: -1.0,
                ..push(grads(&values))
            },
            Code::InvalidArgument,
            "learning rate",
        ),
        (
            "stale incarnation",
            pb::PushRequest {
                incarnation: 12345,
                ..push(grads(&values))
            },
            Code::FailedPrecondition,
            "restarted",
        ),
    ];
    for (what, req, code, needle) in cases {
        let err = ps.push(req).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{what}: {:?} should mention {needle:?}",
            err.message()
        );
        assert!(
            snapshot(&mut ps).await == before,
            "{what} changed the shard"
        );
    }
    // A bad Initialize of a live shard changes nothing either, even forced.
    let mut bad = values
        .iter()
        .map(|(n, a)| rpc::encode(n, a))
        .collect::<Vec<_>>();
    bad[0].shape = vec![1, 1];
    let err = ps
        .initialize(pb::InitializeRequest {
            variables: bad,
            force: true,
            slots: vec![],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(snapshot(&mut ps).await == before);

    // And a good push is applied: the step advances.
    let ok = ps.push(push(grads(&values))).await.unwrap().into_inner();
    assert_eq!(ok.global_step, 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_rejects_duplicate_and_future_pushes_and_drops_stale_ones() {
    let (_c, mut ps, values) = live_ps(Mode::Sync).await;
    let first = ps
        .push(pb::PushRequest {
            pull: false,
            ..push(grads(&values))
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.global_step, 7, "one of two replicas: no update yet");
    let before = snapshot(&mut ps).await;
    let dup = ps
        .push(pb::PushRequest {
            pull: false,
            ..push(grads(&values))
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists, "{dup:?}");
    let future = ps
        .push(pb::PushRequest {
            step: 9,
            worker: 1,
            ..push(grads(&values))
        })
        .await
        .unwrap_err();
    assert_eq!(future.code(), Code::FailedPrecondition, "{future:?}");
    let stranger = ps
        .push(pb::PushRequest {
            worker: 5,
            ..push(grads(&values))
        })
        .await
        .unwrap_err();
    // Not in cluster.worker: refused by the membership, naming the key.
    assert_eq!(stranger.code(), Code::FailedPrecondition, "{stranger:?}");
    assert!(
        stranger
            .message()
            .contains("worker 5 is not in cluster.worker"),
        "{stranger:?}"
    );
    assert!(snapshot(&mut ps).await == before);
    // The second replica completes the step.
    let done = ps
        .push(pb::PushRequest {
            worker: 1,
            ..push(grads(&values))
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.global_step, 8);
    // A gradient computed at step 7 is now stale: dropped and counted.
    let stale = ps
        .push(pb::PushRequest {
            worker: 0,
            ..push(grads(&values))
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stale.stale);
    assert_eq!(stale.global_step, 8);
    let s = ps.state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (s.updates_applied, s.gradients_aggregated, s.stale_gradients),
        (1, 2, 1)
    );
}

/// A ps applies no push past `train.last_step` (100 here): two async
/// workers that both read step 99 cannot take the run to 101. And it
/// records who pushed: `State` lists each worker with its latest step.
#[tokio::test(flavor = "multi_thread")]
async fn no_push_is_applied_past_last_step_and_state_lists_the_pushers() {
    let (_c, mut ps, values) = live_ps(Mode::Async).await;
    for step in 7..99 {
        let res = ps.push(push(grads(&values))).await.unwrap().into_inner();
        assert_eq!(res.global_step, step + 1);
    }
    // Both workers read step 99; the first push makes it 100, the second is not applied.
    let at = |worker| pb::PushRequest {
        step: 99,
        worker,
        ..push(grads(&values))
    };
    assert_eq!(ps.push(at(1)).await.unwrap().into_inner().global_step, 100);
    let before = snapshot(&mut ps).await;
    let res = ps.push(at(0)).await.unwrap().into_inner();
    assert_eq!(res.global_step, 100, "a push past last_step was applied");
    assert_eq!(snapshot(&mut ps).await, before, "the values changed");

    let state = ps.state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(state.global_step, 100);
    let seen: Vec<(u32, u64)> = state.workers.iter().map(|w| (w.task, w.step)).collect();
    assert_eq!(seen, [(0, 99), (1, 99)]);
    assert!(
        state.workers.iter().all(|w| w.seconds_ago < 60.0),
        "{:?}",
        state.workers
    );
}
