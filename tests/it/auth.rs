//! Every RPC of a live ps needs the cluster token; a rejected call changes nothing.

use crate::util::*;
use dtf::config::Mode;
use dtf::model::Mlp;
use dtf::pb;
use tonic::Code;

fn init_request(c: &Cluster, step: u64) -> pb::InitializeRequest {
    let mlp = Mlp::new(&c.cfg.model.layers).unwrap();
    let values = mlp.init(c.cfg.train.seed);
    let variables = mlp
        .variables()
        .iter()
        .zip(&values)
        .map(|(v, a)| dtf::rpc::encode(&v.name, a))
        .collect();
    pb::InitializeRequest {
        variables,
        shadows: Vec::new(),
        global_step: step,
        force: false,
        slots: vec![],
    }
}

fn push_request(c: &Cluster) -> pb::PushRequest {
    let mlp = Mlp::new(&c.cfg.model.layers).unwrap();
    let gradients = mlp
        .variables()
        .iter()
        .map(|v| {
            dtf::rpc::encode(
                &v.name,
                &ndarray::ArrayD::from_elem(v.shape.as_slice(), 0.5f32),
            )
        })
        .collect();
    pb::PushRequest {
        gradients,
        learning_rate: 0.1,
        step: 0,
        worker: 0,
        pull: false,
        incarnation: 0,
        loss: 1.0,
    }
}

/// What a client can observe of the ps: its state and its values, as text
/// (`last_loss` starts as NaN, which `==` would never match).
async fn observe(ps: &mut PsClient) -> String {
    format!("{:?}", observe_raw(ps).await)
}

async fn observe_raw(ps: &mut PsClient) -> (pb::StateResponse, Option<pb::PullResponse>) {
    let state = ps.state(pb::StateRequest {}).await.unwrap().into_inner();
    let values = if state.initialized {
        Some(
            ps.pull(pb::PullRequest {
                names: vec![],
                with_shadows: true,
                min_step: 0,
                with_slots: false,
            })
            .await
            .unwrap()
            .into_inner(),
        )
    } else {
        None
    };
    (state, values)
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_cluster_token_is_accepted_and_rejections_change_nothing() {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.start("ps", 0);
    let mut good = c.client(0, Some(TOKEN)).await;
    let wrong_tokens = [
        None,
        Some("wrong"),
        Some(&TOKEN[..TOKEN.len() - 1]),
        Some(&*format!("{TOKEN}x")),
    ];

    for t in wrong_tokens {
        let mut bad = c.client(0, t).await;
        let e = bad.state(pb::StateRequest {}).await.unwrap_err();
        assert_eq!(
            e.code(),
            Code::Unauthenticated,
            "State with token {t:?}: {e:?}"
        );
    }
    good.state(pb::StateRequest {})
        .await
        .expect("the right token is accepted");

    // A rejected Initialize leaves the ps uninitialized.
    let before = observe(&mut good).await;
    assert!(before.contains("initialized: false"), "{before}");
    for t in wrong_tokens {
        let e = c
            .client(0, t)
            .await
            .initialize(init_request(&c, 7))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::Unauthenticated,
            "Initialize with token {t:?}"
        );
    }
    assert_eq!(
        observe(&mut good).await,
        before,
        "a rejected Initialize changed the ps"
    );

    let applied = good
        .initialize(init_request(&c, 7))
        .await
        .unwrap()
        .into_inner();
    assert!(applied.applied);

    // A rejected Push or Complete changes neither the values nor the step.
    let before_raw = observe_raw(&mut good).await;
    assert_eq!(before_raw.0.global_step, 7);
    let before = format!("{before_raw:?}");
    for t in wrong_tokens {
        let mut bad = c.client(0, t).await;
        let e = bad.push(push_request(&c)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "Push with token {t:?}");
        let e = bad
            .complete(pb::CompleteRequest { global_step: 7 })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "Complete with token {t:?}");
        let e = bad
            .pull(pb::PullRequest {
                names: vec![],
                with_shadows: false,
                min_step: 0,
                with_slots: false,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "Pull with token {t:?}");
    }
    assert_eq!(
        observe(&mut good).await,
        before,
        "a rejected Push or Complete changed the ps"
    );

    // The same Push with the token is applied: the rejections were the token's doing.
    let mut p = push_request(&c);
    p.step = 7;
    good.push(p).await.expect("push with the token");
    let after = observe_raw(&mut good).await;
    assert_eq!(after.0.global_step, 8);
    assert_ne!(after.1, before_raw.1);
}
