//! The shard's unit tests: the rules, the optimizers in the shard, the checks on what comes in.

use super::*;

fn shard(rule: Rule) -> Shard {
    let specs = vec![VarSpec {
        name: "w".into(),
        shape: vec![2],
    }];
    let mut s = Shard::new(0, specs, rule, 0.99, Optimizer::Sgd);
    assert!(s.initialize(vec![ArrayD::zeros(IxDyn(&[2]))], None, None, 0, false));
    s
}

/// A one-variable shard (`w = [1, 1]`) applying `optimizer`.
fn shard_with(rule: Rule, optimizer: Optimizer) -> Shard {
    let specs = vec![VarSpec {
        name: "w".into(),
        shape: vec![2],
    }];
    let mut s = Shard::new(0, specs, rule, 0.99, optimizer);
    assert!(s.initialize(g(1., 1.), None, None, 0, false));
    s
}

fn w(s: &Shard) -> Vec<f32> {
    s.values().unwrap()[0].as_slice().unwrap().to_vec()
}

fn slot(s: &Shard, k: usize) -> Vec<f32> {
    s.slots().unwrap().per_var[0][k]
        .as_slice()
        .unwrap()
        .to_vec()
}

fn near(got: &[f32], want: &[f64]) {
    for (a, b) in got.iter().zip(want) {
        assert!(
            (f64::from(*a) - b).abs() <= 1e-6 * b.abs().max(1e-3),
            "{got:?} vs {want:?}"
        );
    }
}

const ADAM: Optimizer = Optimizer::Adam {
    beta1: 0.9,
    beta2: 0.999,
    epsilon: 1e-8,
};

/// One of each rule, with Nesterov and Adagrad's accumulator set.
const OPTIMIZERS: [Optimizer; 4] = [
    Optimizer::Sgd,
    Optimizer::Momentum {
        momentum: 0.9,
        use_nesterov: true,
    },
    ADAM,
    Optimizer::Adagrad {
        initial_accumulator_value: 0.1,
    },
];

/// β1 and β2 as f32, as the shard (and TensorFlow) hold them.
const B1: f64 = 0.9f32 as f64;
const B2: f64 = 0.999f32 as f64;

#[test]
fn adam_in_the_shard_corrects_bias_and_advances_the_powers() {
    let mut s = shard_with(Rule::Async, ADAM);
    assert_eq!(s.slots().unwrap().non_slots, vec![0.9, 0.999]);
    assert_eq!(s.push(g(0.5, -2.), 0.001, 0, 0, 1.0), Ok(Pushed::Applied));
    // Step 1: m̂ = g, v̂ = g², so w moves by lr·sign(g) (to ε).
    near(&w(&s), &[1.0 - 0.001, 1.0 + 0.001]);
    near(&slot(&s, 0), &[0.5 * (1.0 - B1), -2.0 * (1.0 - B1)]);
    near(&slot(&s, 1), &[0.25 * (1.0 - B2), 4.0 * (1.0 - B2)]);
    near(&s.slots().unwrap().non_slots, &[B1 * B1, B2 * B2]);
    // Step 2, by hand, g = 1: m = m1 + (1 − m1)(1 − β1),
    // v = v1 + (1 − v1)(1 − β2), α = lr·√(1 − β2²)/(1 − β1²).
    assert_eq!(s.push(g(1., 1.), 0.001, 1, 0, 1.0), Ok(Pushed::Applied));
    let (m1, v1) = (0.5 * (1.0 - B1), 0.25 * (1.0 - B2));
    let a1 = 0.001 * (1.0 - B2).sqrt() / (1.0 - B1);
    let w1 = 1.0 - m1 * a1 / (v1.sqrt() + 1e-8);
    let (m2, v2) = (m1 + (1.0 - m1) * (1.0 - B1), v1 + (1.0 - v1) * (1.0 - B2));
    let a2 = 0.001 * (1.0 - B2 * B2).sqrt() / (1.0 - B1 * B1);
    near(&w(&s)[..1], &[w1 - m2 * a2 / (v2.sqrt() + 1e-8)]);
    near(&slot(&s, 0)[..1], &[m2]);
    near(&slot(&s, 1)[..1], &[v2]);
}

#[test]
fn momentum_and_adagrad_in_the_shard() {
    let mut s = shard_with(
        Rule::Async,
        Optimizer::Momentum {
            momentum: 0.9,
            use_nesterov: false,
        },
    );
    s.push(g(0.5, 0.), 0.1, 0, 0, 1.0).unwrap();
    s.push(g(-1., 0.), 0.1, 1, 0, 1.0).unwrap();
    // accum: 0.5, then −0.55; w: 0.95, then 1.005.
    near(&slot(&s, 0), &[-0.55, 0.0]);
    near(&w(&s), &[1.005, 1.0]);
    let mut s = shard_with(
        Rule::Async,
        Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        },
    );
    assert_eq!(slot(&s, 0), [0.1, 0.1]);
    s.push(g(0.5, 0.), 0.1, 0, 0, 1.0).unwrap();
    near(&slot(&s, 0), &[0.35, 0.1]);
    near(&w(&s), &[1.0 - 0.05 / 0.35f64.sqrt(), 1.0]);
}

#[test]
fn sync_adam_applies_the_average_once_per_step() {
    let mut s = shard_with(
        Rule::Sync {
            replicas: 2,
            total: 2,
        },
        ADAM,
    );
    assert_eq!(s.push(g(0.2, 1.), 0.001, 0, 0, 1.0), Ok(Pushed::Pending));
    assert_eq!(slot(&s, 0), [0.0, 0.0], "nothing applied before the step");
    assert_eq!(s.push(g(0.8, 1.), 0.001, 0, 1, 1.0), Ok(Pushed::Applied));
    // The average gradient is [0.5, 1]: m = (1 − β1)·g, powers advanced once.
    near(&slot(&s, 0), &[0.5 * (1.0 - B1), 1.0 - B1]);
    near(&s.slots().unwrap().non_slots, &[B1 * B1, B2 * B2]);
    near(&w(&s), &[1.0 - 0.001, 1.0 - 0.001]);
    assert_eq!(s.step(), 1);
}

#[test]
fn slots_round_trip_through_arrange_and_initialize() {
    let mut s = shard_with(Rule::Async, ADAM);
    s.push(g(0.5, -2.), 0.001, 0, 0, 1.0).unwrap();
    let before = s.slots().unwrap().clone();
    let bytes = |a: &ArrayD<f32>| bytemuck::cast_slice::<f32, u8>(a.as_slice().unwrap()).to_vec();
    let (m, v) = (bytes(&before.per_var[0][0]), bytes(&before.per_var[0][1]));
    let (p1, p2) = (
        before.non_slots[0].to_le_bytes(),
        before.non_slots[1].to_le_bytes(),
    );
    let two: &[usize] = &[2];
    let scalar: &[usize] = &[];
    let named = vec![
        ("w/Adam_1", two, &v[..]),
        ("w/Adam", two, &m[..]),
        ("beta2_power", scalar, &p2[..]),
        ("beta1_power", scalar, &p1[..]),
    ];
    let slots = s.arrange_slots(named.clone()).unwrap();
    assert_eq!(slots, before);
    let mut fresh = shard_with(Rule::Async, ADAM);
    assert!(fresh.initialize(g(1., 1.), None, Some(slots), 1, true));
    assert_eq!(fresh.slots().unwrap(), &before);
    // Every slot is required, and a power must be usable.
    assert!(matches!(
        s.arrange_slots(named[..3].to_vec()),
        Err(ShardError::Missing { .. })
    ));
    let one = 1f32.to_le_bytes();
    let mut bad = named.clone();
    bad[3] = ("beta1_power", scalar, &one[..]);
    assert!(matches!(s.arrange_slots(bad), Err(ShardError::NonSlot(_))));
}

#[test]
fn an_overflowing_slot_is_refused_and_changes_nothing() {
    let mut s = shard_with(
        Rule::Async,
        Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        },
    );
    let before = s.slots().unwrap().clone();
    // g² overflows the accumulator although w itself would stay finite.
    assert!(matches!(
        s.push(g(3e30, 0.), 0.1, 0, 0, 1.0),
        Err(ShardError::Overflow { .. })
    ));
    assert_eq!(s.slots().unwrap(), &before);
    assert_eq!(w(&s), [1.0, 1.0]);
}

fn g(a: f32, b: f32) -> Vec<ArrayD<f32>> {
    vec![ArrayD::from_shape_vec(IxDyn(&[2]), vec![a, b]).unwrap()]
}

#[test]
fn async_applies_each_push() {
    let mut s = shard(Rule::Async);
    assert_eq!(s.push(g(1., 2.), 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-0.5, -1.0]);
    assert_eq!(s.step(), 1);
    // EMA at step 0: decay min(0.99, 1/10) = 0.1, shadow = 0.1·0 + 0.9·w.
    let sh = s.shadows().unwrap()[0].as_slice().unwrap().to_vec();
    assert!((sh[0] - (-0.45)).abs() < 1e-6, "{sh:?}");
}

#[test]
fn sync_averages_drops_stale_and_refuses_duplicates() {
    let mut s = shard(Rule::Sync {
        replicas: 2,
        total: 3,
    });
    assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
    assert_eq!(
        s.push(g(9., 9.), 1.0, 0, 0, 1.0),
        Err(ShardError::DuplicatePush { worker: 0, step: 0 })
    );
    assert_eq!(s.step(), 0);
    assert_eq!(s.push(g(3., 5.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
    assert_eq!(s.step(), 1);
    // The backup replica's gradient for step 0 arrives late.
    assert_eq!(s.push(g(100., 100.), 1.0, 0, 2, 1.0), Ok(Pushed::Stale));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
    assert_eq!(
        s.push(g(1., 1.), 1.0, 5, 2, 1.0),
        Err(ShardError::FutureStep {
            ps: 0,
            step: 5,
            current: 1
        })
    );
    assert_eq!(
        s.push(g(1., 1.), 1.0, 1, 3, 1.0),
        Err(ShardError::UnknownWorker {
            worker: 3,
            total: 3
        })
    );
    let c = s.counters();
    assert_eq!(
        (c.updates_applied, c.gradients_aggregated, c.stale_gradients),
        (1, 2, 1)
    );
}

#[test]
fn arrange_checks_names_shapes_and_values() {
    let s = shard(Rule::Async);
    type Item = (&'static str, Vec<usize>, Vec<u8>);
    let t = |n: &'static str, v: &[f32]| -> Item {
        (
            n,
            vec![v.len()],
            bytemuck::cast_slice::<f32, u8>(v).to_vec(),
        )
    };
    let arrange = |items: &[Item]| {
        s.arrange_bytes(
            items
                .iter()
                .map(|(n, shape, d)| (*n, shape.as_slice(), d.as_slice())),
        )
        .map(|_| ())
    };
    assert!(matches!(
        arrange(&[t("x", &[1., 2.])]),
        Err(ShardError::UnknownVariable { .. })
    ));
    assert!(matches!(
        arrange(&[t("w", &[1.])]),
        Err(ShardError::Shape { .. })
    ));
    assert!(matches!(
        arrange(&[t("w", &[1., f32::NAN])]),
        Err(ShardError::NonFinite { index: 1, .. })
    ));
    assert!(matches!(arrange(&[]), Err(ShardError::Missing { .. })));
    assert!(matches!(
        arrange(&[t("w", &[1., 2.]), t("w", &[1., 2.])]),
        Err(ShardError::Duplicate { .. })
    ));
    assert!(arrange(&[t("w", &[1., 2.])]).is_ok());
}

#[test]
fn arrange_bytes_checks_like_arrange_and_push_bytes_applies() {
    let mut s = shard(Rule::Async);
    let bytes = |v: &[f32]| bytemuck::cast_slice::<f32, u8>(v).to_vec();
    let (ok, nan, inf) = (
        bytes(&[1., 2.]),
        bytes(&[1., f32::NAN]),
        bytes(&[f32::NEG_INFINITY, 0.]),
    );
    let two: &[usize] = &[2];
    assert!(matches!(
        s.arrange_bytes([("x", two, &ok[..])]),
        Err(ShardError::UnknownVariable { .. })
    ));
    assert!(matches!(
        s.arrange_bytes([("w", &[1usize][..], &ok[..4])]),
        Err(ShardError::Shape { .. })
    ));
    assert!(matches!(
        s.arrange_bytes([("w", two, &nan[..])]),
        Err(ShardError::NonFinite { index: 1, .. })
    ));
    assert!(matches!(
        s.arrange_bytes([("w", two, &inf[..])]),
        Err(ShardError::NonFinite { index: 0, .. })
    ));
    assert!(matches!(
        s.arrange_bytes([]),
        Err(ShardError::Missing { .. })
    ));
    assert!(matches!(
        s.arrange_bytes([("w", two, &ok[..]), ("w", two, &ok[..])]),
        Err(ShardError::Duplicate { .. })
    ));
    // Unaligned bytes, as they may sit in a request.
    let mut buf = vec![0u8];
    buf.extend_from_slice(&ok);
    let grads = s.arrange_bytes([("w", two, &buf[1..])]).unwrap();
    assert_eq!(s.push_bytes(&grads, 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-0.5, -1.0]);
}

#[test]
fn an_update_that_would_overflow_is_refused_and_changes_nothing() {
    let mut s = shard(Rule::Async);
    assert_eq!(s.push(g(1., 2.), 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
    let before = (s.values().unwrap().to_vec(), s.shadows().unwrap().to_vec());
    // Finite lr and gradient, but lr · g is -inf for the second element.
    let err = s.push(g(0., 3.), 3e38, 1, 0, 1.0).unwrap_err();
    assert_eq!(
        err,
        ShardError::Overflow {
            lr: 3e38,
            name: "w".into()
        }
    );
    assert!(err.to_string().contains("3e38"), "{err}");
    assert_eq!(s.values().unwrap(), &before.0[..]);
    assert_eq!(s.shadows().unwrap(), &before.1[..]);
    assert_eq!(s.step(), 1);
    for lr in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            s.push(g(1., 1.), lr, 1, 0, 1.0),
            Err(ShardError::LearningRate(_))
        ));
    }
    assert_eq!(s.values().unwrap(), &before.0[..]);
    // The shard still takes a sane update.
    assert_eq!(s.push(g(1., 1.), 0.5, 1, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-1.0, -1.5]);
}

#[test]
fn sync_overflow_drops_the_step_aggregate() {
    let mut s = shard(Rule::Sync {
        replicas: 2,
        total: 2,
    });
    assert_eq!(s.push(g(3e38, 0.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
    // The sum of two finite gradients overflows.
    assert!(matches!(
        s.push(g(3e38, 0.), 1.0, 0, 1, 1.0),
        Err(ShardError::Overflow { .. })
    ));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[0.0, 0.0]);
    assert_eq!(s.step(), 0);
    // Both replicas may push the step again.
    assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
    assert_eq!(s.push(g(3., 5.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
}

#[test]
fn no_push_takes_the_step_past_last_step() {
    let mut s = shard(Rule::Async);
    s.set_last_step(2);
    assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.push(g(1., 1.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
    let at_two = s.values().unwrap().to_vec();
    // Two workers that read step 1 both push; the second is not applied.
    assert_eq!(s.push(g(1., 1.), 1.0, 1, 0, 1.0), Ok(Pushed::AtLastStep));
    assert_eq!((s.step(), s.values().unwrap()), (2, &at_two[..]));
    assert_eq!(s.counters().pushes_applied, 2);
    // A reload that raises last_step lets training go on.
    s.set_last_step(3);
    assert_eq!(s.push(g(1., 1.), 1.0, 2, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.step(), 3);

    let mut s = shard(Rule::Sync {
        replicas: 1,
        total: 2,
    });
    s.set_last_step(1);
    assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Applied));
    assert_eq!(s.push(g(1., 1.), 1.0, 1, 1, 1.0), Ok(Pushed::AtLastStep));
    assert_eq!((s.step(), s.counters().updates_applied), (1, 1));
}

#[test]
fn initialize_does_not_clobber_unless_forced() {
    let mut s = shard(Rule::Async);
    assert!(!s.initialize(g(5., 5.), None, None, 9, false));
    assert_eq!(s.step(), 0);
    assert!(s.initialize(g(5., 5.), None, None, 9, true));
    assert_eq!(s.step(), 9);
}

#[test]
fn a_non_finite_gradient_is_refused_by_every_rule_and_changes_nothing() {
    let sync = Rule::Sync {
        replicas: 2,
        total: 2,
    };
    for rule in [Rule::Async, sync] {
        for optimizer in OPTIMIZERS {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut s = shard_with(rule, optimizer);
                let before = (
                    w(&s),
                    s.shadows().unwrap().to_vec(),
                    s.slots().unwrap().clone(),
                );
                // The push path does not check finiteness up front
                // (arrange_gradients): the update or the sum does.
                let data = bytemuck::cast_slice::<f32, u8>(&[0.5, bad]).to_vec();
                let grads = s
                    .arrange_gradients([("w", &[2usize][..], &data[..])])
                    .unwrap();
                assert_eq!(
                    s.push_bytes(&grads, 0.1, 0, 0, 7.0),
                    Err(ShardError::NonFinite {
                        name: "w".into(),
                        index: 1
                    }),
                    "{rule:?} {optimizer:?} {bad}"
                );
                let after = (
                    w(&s),
                    s.shadows().unwrap().to_vec(),
                    s.slots().unwrap().clone(),
                );
                assert_eq!(after, before, "{rule:?} {optimizer:?} {bad}");
                assert_eq!(s.step(), 0);
                assert!(s.last_loss().is_nan(), "the refused push's loss was kept");
            }
        }
    }
}

/// Every rule's pass compiled for AVX-512 (what [`Shard::push_bytes`] runs
/// on a CPU that has it) gives the same bits as the baseline build, on
/// random values with a length that leaves a vector tail, and both flag a
/// non-finite result wherever it falls.
#[test]
fn the_vectorized_pass_equals_the_baseline_bit_for_bit() {
    use super::update::{Consts, pass};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let n = 1000 + 13;
    // Momentum without Nesterov too: its own branch of the rule.
    let plain = Optimizer::Momentum {
        momentum: 0.9,
        use_nesterov: false,
    };
    let optimizers = OPTIMIZERS.into_iter().chain([plain]);
    for optimizer in optimizers {
        let mut rand_vec =
            |lo: f32, hi: f32| -> Vec<f32> { (0..n).map(|_| rng.random_range(lo..hi)).collect() };
        let (w, sh, grad) = (
            rand_vec(-1.0, 1.0),
            rand_vec(-1.0, 1.0),
            rand_vec(-1.0, 1.0),
        );
        // Slots as the rules keep them: Adam's v and Adagrad's sums ≥ 0.
        let slots: Vec<ArrayD<f32>> = (0..optimizer.slot_names().len())
            .map(|k| {
                let v = if k == 1 || optimizer.name() == "adagrad" {
                    rand_vec(0.0, 1.0)
                } else {
                    rand_vec(-1.0, 1.0)
                };
                ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap()
            })
            .collect();
        let consts = |lr: f32| Consts {
            optimizer,
            lr,
            scale: 0.5,
            k: lr * 0.5,
            alpha: optimizer::adam_alpha(lr, 0.9 * 0.9, 0.999 * 0.999),
            rate: 0.1,
        };
        let run = |c: &Consts, g: &[f32], vectorized: bool| {
            let g: &[u8] = bytemuck::cast_slice(g);
            let mut next: Vec<Vec<f32>> = slots.iter().map(|s| vec![0.0; s.len()]).collect();
            let mut outs: Vec<&mut [f32]> = next.iter_mut().map(|v| v.as_mut_slice()).collect();
            let ins: Vec<&[f32]> = slots.iter().map(|s| s.as_slice().unwrap()).collect();
            let (mut nw, mut ns) = (vec![0.0f32; n], vec![0.0f32; n]);
            let bad = if vectorized {
                crate::kernel::simd(
                    #[inline(always)]
                    || pass(c, &w, &sh, g, &ins, &mut outs, &mut nw, &mut ns),
                )
            } else {
                pass(c, &w, &sh, g, &ins, &mut outs, &mut nw, &mut ns)
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let slot_bits: Vec<Vec<u32>> = next.iter().map(|s| bits(s)).collect();
            (bad, bits(&nw), bits(&ns), slot_bits)
        };
        let c = consts(0.01);
        let base = run(&c, &grad, false);
        assert!(
            !base.0,
            "{}: finite inputs, finite result",
            optimizer.name()
        );
        assert_eq!(base, run(&c, &grad, true), "{}", optimizer.name());
        // A gradient that overflows the update, in the body and in the tail.
        for at in [3, n - 2] {
            let mut huge = grad.clone();
            huge[at] = f32::MAX;
            let c = consts(1e30);
            let (bad, ..) = run(&c, &huge, false);
            assert!(bad, "{} at {at}", optimizer.name());
            assert_eq!(run(&c, &huge, true), run(&c, &huge, false));
        }
    }
}

/// Four parts of [`PARALLEL_MIN`] elements or more (each cut in two jobs,
/// one short) and a small one, as a split `layer1/weights` and a bias sit
/// on one ps.
fn parted(optimizer: Optimizer, rule: Rule, parallel: bool) -> Shard {
    let shapes = [
        vec![130, 128],
        vec![130, 128],
        vec![129, 128],
        vec![129, 128],
        vec![10],
    ];
    let specs: Vec<VarSpec> = shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| VarSpec {
            name: format!("w/part_{i}"),
            shape: shape.clone(),
        })
        .collect();
    let mut s = Shard::new(0, specs.clone(), rule, 0.99, optimizer);
    s.set_parallel(parallel);
    assert!(s.initialize(random(&specs, 1), None, None, 0, false));
    s
}

/// Values in [-1, 1) for each of `specs`, the same for the same `seed`.
fn random(specs: &[VarSpec], seed: u64) -> Vec<ArrayD<f32>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    specs
        .iter()
        .map(|s| ArrayD::from_shape_fn(IxDyn(&s.shape), |_| rng.random_range(-1.0..1.0)))
        .collect()
}

#[test]
fn parts_applied_in_parallel_give_the_serial_bits() {
    let rules = [
        Rule::Async,
        Rule::Sync {
            replicas: 2,
            total: 2,
        },
    ];
    for rule in rules {
        for optimizer in OPTIMIZERS {
            let mut par = parted(optimizer, rule, true);
            let mut ser = parted(optimizer, rule, false);
            assert!(par.chunk == PARALLEL_MIN && ser.chunk == usize::MAX);
            for step in 0..6u64 {
                let grads = random(par.specs(), 100 + step);
                let (at, worker) = match rule {
                    Rule::Async => (step, 0),
                    Rule::Sync { .. } => (step / 2, (step % 2) as u32),
                };
                let a = par.push(grads.clone(), 0.05, at, worker, 1.0);
                let b = ser.push(grads, 0.05, at, worker, 1.0);
                assert_eq!(a, b, "{rule:?} {optimizer:?} step {step}");
            }
            let what = format!("{rule:?} {optimizer:?}");
            assert_eq!(par.step(), ser.step(), "{what}");
            assert_eq!(par.values().unwrap(), ser.values().unwrap(), "{what}");
            assert_eq!(par.shadows().unwrap(), ser.shadows().unwrap(), "{what}");
            assert_eq!(par.slots().unwrap(), ser.slots().unwrap(), "{what}");
        }
    }
}

#[test]
fn a_parallel_update_that_overflows_in_one_part_changes_no_part() {
    let mut s = parted(Optimizer::Sgd, Rule::Async, true);
    let before = (
        s.values().unwrap().to_vec(),
        s.shadows().unwrap().to_vec(),
        s.step(),
    );
    // Finite everywhere; only part 2's last element overflows (lr · g = -inf).
    let mut grads: Vec<ArrayD<f32>> = s
        .specs()
        .iter()
        .map(|v| ArrayD::zeros(IxDyn(&v.shape)))
        .collect();
    *grads[2].iter_mut().last().unwrap() = 3.0;
    let err = s.push(grads, 3e38, 0, 0, 1.0).unwrap_err();
    assert_eq!(
        err,
        ShardError::Overflow {
            lr: 3e38,
            name: "w/part_2".into()
        }
    );
    assert_eq!(s.values().unwrap(), &before.0[..]);
    assert_eq!(s.shadows().unwrap(), &before.1[..]);
    assert_eq!(s.step(), before.2);
}

#[test]
fn a_ps_applies_in_parallel_only_with_cores_and_values_to_spare() {
    let specs = |n: usize| {
        vec![VarSpec {
            name: "w".into(),
            shape: vec![n],
        }]
    };
    // The reference model's 397,510 values: serial on 2 cores, spread on 16.
    assert_eq!(chunk(&specs(397_510), 2), usize::MAX);
    assert_eq!(chunk(&specs(397_510), 3), usize::MAX);
    assert_eq!(chunk(&specs(397_510), 4), 99_378);
    assert_eq!(chunk(&specs(397_510), 16), 24_845);
    // Never jobs below PARALLEL_MIN values, and none for too few values.
    assert_eq!(chunk(&specs(100_000), 16), PARALLEL_MIN);
    assert_eq!(chunk(&specs(2 * PARALLEL_MIN - 1), 16), usize::MAX);
    assert_eq!(chunk(&specs(0), 16), usize::MAX);
}
