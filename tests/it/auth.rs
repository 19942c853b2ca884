//! Every RPC of a live ps needs the cluster token; a rejected call changes nothing.

use crate::util::*;
use dtf::config::Mode;
use dtf::model::Mlp;
use dtf::transport::Cluster as PsCluster;
use std::time::Duration;
use tonic::Code;

/// What a client can observe of the ps: its state and its values, as text
/// (`last_loss` starts as NaN, which `==` would never match).
async fn observe(ps: &PsCluster) -> String {
    let state = ps.states().await.unwrap().remove(0);
    let values = if state.initialized {
        Some(ps.snapshot().await.unwrap())
    } else {
        None
    };
    format!("{:?}", (state, values))
}

crate::on_each_transport! {
async fn only_the_cluster_token_is_accepted_and_rejections_change_nothing(transport) {
    let mut c = Cluster::new(1, 1, 100, Mode::Async);
    c.use_transport(transport);
    c.start("ps", 0);
    let mut good = ps_client(&c, TOKEN);
    eventually(Duration::from_secs(10), "the ps to answer", || async {
        good.states().await.ok()
    })
    .await;
    // "": the header (or hello) without a token.
    let wrong_tokens = ["", "wrong", &TOKEN[..TOKEN.len() - 1], &*format!("{TOKEN}x")];
    let unauthenticated = |what: &str, t: &str, r: Result<(), dtf::transport::PsCallError>| {
        let e = r.expect_err(what);
        assert_eq!(e.status.code(), Code::Unauthenticated, "{what} with token {t:?}: {e}");
    };

    for t in wrong_tokens {
        unauthenticated("State", t, ps_client(&c, t).states().await.map(|_| ()));
    }

    let mlp = Mlp::new(&c.cfg.model.layers).unwrap();
    let values = mlp.init(c.cfg.train.seed);
    let grads: Vec<_> = values.iter().map(|v| ndarray::ArrayD::from_elem(v.shape(), 0.5f32)).collect();
    // A rejected Initialize leaves the ps uninitialized.
    let before = observe(&good).await;
    assert!(before.contains("initialized: false"), "{before}");
    for t in wrong_tokens {
        let r = ps_client(&c, t).initialize(&[0], &values, None, None, &[], 7, false, 1).await;
        unauthenticated("Initialize", t, r.map(|_| ()));
    }
    assert_eq!(observe(&good).await, before, "a rejected Initialize changed the ps");
    assert_eq!(good.initialize(&[0], &values, None, None, &[], 7, false, 1).await.unwrap(), vec![0]);

    // A rejected Push, Pull or Complete changes neither the values nor the step.
    let before = observe(&good).await;
    assert!(before.contains("global_step: 7"), "{before}");
    let mut params = values.clone();
    for t in wrong_tokens {
        let mut bad = ps_client(&c, t);
        let (_, r) = bad.step(&mut params, &mut grads.clone(), |_, _| 1.0, 0.1, &[7], 0).await;
        unauthenticated("Push", t, r.map(|_| ()));
        unauthenticated("Complete", t, bad.complete(7).await);
        unauthenticated("Pull", t, bad.pull(&mut params, None).await.map(|_| ()));
    }
    assert_eq!(observe(&good).await, before, "a rejected Push or Complete changed the ps");

    // The same Push with the token is applied: the rejections were the token's doing.
    good.pull(&mut params, None).await.unwrap();
    let (_, p) = good.step(&mut params, &mut grads.clone(), |_, _| 1.0, 0.1, &[7], 0).await;
    let p = p.unwrap();
    assert_eq!(p.global_step(), 8);
    assert_ne!(params, values);
    if transport == dtf::config::Transport::Auto {
        assert_eq!(good.transports(), vec![dtf::transport::Via::Shm]);
        // The wrong tokens were refused on the socket first, and logged so.
        let log = c.wait_log("ps:0", "wrong cluster token", 1, Duration::from_secs(10));
        assert!(log.contains("shared memory"), "{log}");
    }
}
}
