//! The model's unit tests: shapes, initialization, the loss and its
//! gradient against finite differences, and evaluation.

use super::*;
use ndarray::Array2;
use rand::Rng;

fn random_params(mlp: &Mlp, rng: &mut StdRng, scale: f32) -> Vec<ArrayD<f32>> {
    mlp.variables()
        .into_iter()
        .map(|spec| ArrayD::from_shape_simple_fn(spec.shape, || rng.random_range(-scale..scale)))
        .collect()
}

#[test]
fn bad_layers_are_rejected() {
    assert!(Mlp::new(&[784]).is_err());
    assert!(Mlp::new(&[]).is_err());
    assert!(Mlp::new(&[784, 0, 10]).is_err());
    let msg = Mlp::new(&[5]).unwrap_err().to_string();
    assert!(msg.contains("[5]"), "{msg}");
}

#[test]
fn variables_are_named_in_creation_order() {
    let mlp = Mlp::new(&[784, 500, 10]).unwrap();
    let vars = mlp.variables();
    let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "layer1/weights",
            "layer1/biases",
            "layer2/weights",
            "layer2/biases"
        ]
    );
    assert_eq!(vars[0].shape, [784, 500]);
    assert_eq!(vars[1].shape, [500]);
    assert_eq!(vars[2].shape, [500, 10]);
    assert_eq!(vars[3].shape, [10]);
}

#[test]
fn init_is_truncated_normal_and_deterministic() {
    let mlp = Mlp::new(&[784, 500, 10]).unwrap();
    let p = mlp.init(7);
    assert_eq!(p, mlp.init(7));
    assert_ne!(p, mlp.init(8));
    for (v, spec) in p.iter().zip(mlp.variables()) {
        assert_eq!(v.shape(), &spec.shape[..]);
    }
    let w = &p[0];
    assert!(w.iter().all(|v| v.abs() <= 2.0 * INIT_STDDEV));
    let n = w.len() as f64;
    let mean = w.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = w
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    assert!(mean.abs() < 1e-3, "mean {mean}");
    // A normal truncated at ±2σ has standard deviation ≈ 0.8796σ.
    assert!((var.sqrt() - 0.08796).abs() < 1e-3, "std {}", var.sqrt());
    assert!(p[1].iter().all(|&v| v == 0.0));
    assert!(p[3].iter().all(|&v| v == 0.0));
    assert!(p[2].iter().any(|&v| v != 0.0));
}

#[test]
fn zero_params_give_log_classes_loss() {
    let mlp = Mlp::new(&[3, 4, 5]).unwrap();
    let params: Vec<ArrayD<f32>> = mlp
        .variables()
        .into_iter()
        .map(|s| ArrayD::zeros(s.shape))
        .collect();
    let x = Array2::from_elem((2, 3), 0.5f32);
    let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &[1, 4], 0.5);
    assert!((loss - 5f32.ln()).abs() < 1e-6, "loss {loss}");
    // Output biases: mean of softmax − onehot = 0.2 − (fraction labelled c).
    let db: Vec<f32> = grads[3].iter().copied().collect();
    let want = [0.2, 0.2 - 0.5, 0.2, 0.2, 0.2 - 0.5];
    for (g, w) in db.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{db:?}");
    }
}

#[test]
fn loss_is_stable_for_huge_logits() {
    let mlp = Mlp::new(&[1, 2]).unwrap();
    let params = vec![
        ArrayD::from_shape_vec(vec![1, 2], vec![1000.0f32, -1000.0]).unwrap(),
        ArrayD::zeros(vec![2]),
    ];
    let x = Array2::from_elem((1, 1), 1.0f32);
    let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &[1], 0.0);
    assert!((loss - 2000.0).abs() < 1e-2, "loss {loss}");
    assert!(grads.iter().all(|g| g.iter().all(|v| v.is_finite())));
    let (loss, _) = mlp.loss_and_grads(&params, x.view(), &[0], 0.0);
    assert_eq!(loss, 0.0);
}

/// Which hidden units are active (pre-activation > 0), for every row.
fn relu_pattern(mlp: &Mlp, params: &[ArrayD<f32>], x: ArrayView2<f32>) -> Vec<bool> {
    let layers = mlp.layer_views(params);
    let mut a = x.to_owned();
    let mut pattern = Vec::new();
    for (w, b) in &layers[..layers.len() - 1] {
        let z = a.dot(w) + b;
        pattern.extend(z.iter().map(|&v| v > 0.0));
        a = z.mapv(|v| crate::model::Activation::Relu.apply(v));
    }
    pattern
}

/// Analytic gradient of the full loss (cross-entropy + L2) against central
/// finite differences, on several entries of every variable, for several
/// random models. An entry whose ±eps perturbation flips a ReLU is skipped:
/// there the loss is not differentiable and a finite difference says
/// nothing about the gradient.
#[test]
fn gradients_match_finite_differences() {
    let mlp = Mlp::new(&[5, 4, 3]).unwrap();
    let labels = [0u8, 1, 2, 2, 1, 0];
    let reg = 0.1;
    let eps = 1e-2f32;
    for seed in 0..10 {
        let mut rng = StdRng::seed_from_u64(seed);
        let params = random_params(&mlp, &mut rng, 1.0);
        let x = Array2::from_shape_simple_fn((6, 5), || rng.random_range(-1.0f32..1.0));
        let (_, grads) = mlp.loss_and_grads(&params, x.view(), &labels, reg);
        let perturbed = |v: usize, i: usize, delta: f32| {
            let mut p = params.clone();
            p[v].as_slice_mut().unwrap()[i] += delta;
            p
        };
        for (v, grad) in grads.iter().enumerate() {
            assert_eq!(grad.shape(), params[v].shape());
            let mut checked = 0;
            for _ in 0..100 {
                let i = rng.random_range(0..params[v].len());
                let (up, down) = (perturbed(v, i, eps), perturbed(v, i, -eps));
                if relu_pattern(&mlp, &up, x.view()) != relu_pattern(&mlp, &down, x.view()) {
                    continue;
                }
                let loss =
                    |p: &[ArrayD<f32>]| f64::from(mlp.loss_and_grads(p, x.view(), &labels, reg).0);
                let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(eps));
                let analytic = f64::from(grad.as_slice().unwrap()[i]);
                let tol = 1e-2 * numeric.abs().max(analytic.abs()) + 1e-4;
                assert!(
                    (numeric - analytic).abs() <= tol,
                    "seed {seed}, {} entry {i}: analytic {analytic}, numeric {numeric}",
                    mlp.variables()[v].name
                );
                checked += 1;
                if checked == 4 {
                    break;
                }
            }
            assert_eq!(checked, 4, "seed {seed}: too many ReLU kinks to check");
        }
    }
}

#[test]
#[should_panic(expected = "layer2/weights: expected shape [4, 3]")]
fn mismatched_params_name_the_variable() {
    let mlp = Mlp::new(&[5, 4, 3]).unwrap();
    let mut params = mlp.init(0);
    params[2] = ArrayD::zeros(vec![3, 4]);
    mlp.loss_and_grads(&params, Array2::zeros((1, 5)).view(), &[0], 0.0);
}

#[test]
fn regularization_counts_weights_only() {
    let mlp = Mlp::new(&[2, 2]).unwrap();
    let params = vec![
        ArrayD::from_shape_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        ArrayD::from_shape_vec(vec![2], vec![10.0f32, 10.0]).unwrap(),
    ];
    let x = Array2::zeros((1, 2));
    let (l0, _) = mlp.loss_and_grads(&params, x.view(), &[0], 0.0);
    let (l1, g1) = mlp.loss_and_grads(&params, x.view(), &[0], 0.5);
    // 0.5 · (1 + 4 + 9 + 16) / 2 = 7.5; biases do not count.
    assert!((l1 - l0 - 7.5).abs() < 1e-5, "{l0} {l1}");
    // x = 0, so the weight gradient is the regularization term alone.
    assert_eq!(
        g1[0].iter().copied().collect::<Vec<_>>(),
        [0.5, 1.0, 1.5, 2.0]
    );
}

/// Two Gaussian blobs per class on a 4-d input: SGD must fit them.
#[test]
fn sgd_learns_a_separable_problem() {
    let mlp = Mlp::new(&[4, 8, 3]).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let n = 60;
    let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    let x = Array2::from_shape_fn((n, 4), |(i, j)| {
        let centre = if j == i % 3 { 1.0 } else { 0.0 };
        centre + rng.random_range(-0.2f32..0.2)
    });
    let mut params = mlp.init(3);
    let (first, _) = mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
    let mut last = first;
    for _ in 0..300 {
        let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
        for (p, g) in params.iter_mut().zip(&grads) {
            p.scaled_add(-0.5, g);
        }
        last = loss;
    }
    assert!(last < 0.1 * first, "loss {first} -> {last}");
    assert_eq!(mlp.accuracy(&params, x.view(), &labels), 1.0);
}

#[test]
fn test_loss_is_the_training_loss_without_l2() {
    let mlp = Mlp::new(&[4, 8, 3]).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let n = 2500; // more than two chunks
    let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    let x = Array2::from_shape_fn((n, 4), |_| rng.random_range(-1.0f32..1.0));
    let params = mlp.init(5);
    let (loss, _) = mlp.loss_and_grads(&params, x.view(), &labels, 0.0);
    let (acc, test_loss) = mlp.accuracy_and_loss(&params, x.view(), &labels);
    assert!(
        (loss - test_loss).abs() < 1e-4 * loss,
        "{loss} vs {test_loss}"
    );
    assert_eq!(acc, mlp.accuracy(&params, x.view(), &labels));
}

#[test]
fn accuracy_counts_argmax_matches_across_chunks() {
    // Identity logits: argmax is the column of the largest input.
    let mlp = Mlp::new(&[3, 3]).unwrap();
    let params = vec![
        ArrayD::from_shape_vec(vec![3, 3], {
            let mut v = vec![0.0f32; 9];
            v[0] = 1.0;
            v[4] = 1.0;
            v[8] = 1.0;
            v
        })
        .unwrap(),
        ArrayD::zeros(vec![3]),
    ];
    let n = 2500; // more than two chunks
    let x = Array2::from_shape_fn((n, 3), |(i, j)| if j == i % 3 { 1.0 } else { 0.0 });
    let mut labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    assert_eq!(mlp.accuracy(&params, x.view(), &labels), 1.0);
    for l in labels.iter_mut().take(500) {
        *l = (*l + 1) % 3;
    }
    assert!((mlp.accuracy(&params, x.view(), &labels) - 0.8).abs() < 1e-6);
}

/// `cargo test --lib model::tests::time_loss_and_grads -- --ignored --nocapture`
#[test]
#[ignore = "timing, not a check"]
fn time_loss_and_grads() {
    let mlp = Mlp::new(&[784, 500, 10]).unwrap();
    let params = mlp.init(0);
    let mut rng = StdRng::seed_from_u64(0);
    let x = Array2::from_shape_simple_fn((100, 784), || rng.random_range(0.0f32..1.0));
    let labels: Vec<u8> = (0..100).map(|i| (i % 10) as u8).collect();
    for _ in 0..5 {
        mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
    }
    // The best of several rounds: the machine may be shared, and the
    // minimum is the least disturbed estimate of the kernel's cost.
    let per = (0..10)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..20 {
                std::hint::black_box(mlp.loss_and_grads(&params, x.view(), &labels, 1e-4));
            }
            start.elapsed().as_secs_f64() / 20.0
        })
        .fold(f64::INFINITY, f64::min);
    let flops = 6.0 * 100.0 * (784.0 * 500.0 + 500.0 * 10.0);
    println!(
        "loss_and_grads [784,500,10] batch 100: {:.3} ms/call, {:.2} GFLOP/s",
        per * 1e3,
        flops / per / 1e9
    );
}

/// The smooth activations' (and dropout's) gradients against central finite differences,
/// through two hidden layers. Dropout draws the same masks for every evaluation: each
/// starts from a workspace seeded alike.
#[test]
fn gradients_of_every_activation_and_of_dropout_match_finite_differences() {
    use crate::model::{Activation, Hidden, Workspace};
    let labels = [0u8, 1, 2, 2, 1, 0];
    let eps = 1e-2f32;
    for (activation, dropout) in [
        (Activation::Tanh, 0.0),
        (Activation::Sigmoid, 0.0),
        (Activation::Gelu, 0.0),
        (Activation::Tanh, 0.3),
        (Activation::Gelu, 0.3),
    ] {
        let mlp = Mlp::new(&[5, 4, 4, 3]).unwrap().with_hidden(Hidden {
            activation,
            dropout,
        });
        let mut rng = StdRng::seed_from_u64(3);
        let params = random_params(&mlp, &mut rng, 1.0);
        let x = Array2::from_shape_simple_fn((6, 5), || rng.random_range(-1.0f32..1.0));
        let loss_and_grads = |p: &[ArrayD<f32>]| {
            let mut grads: Vec<ArrayD<f32>> = p.iter().map(|a| ArrayD::zeros(a.shape())).collect();
            let mut ws = Workspace::seeded(11);
            let loss = mlp.loss_and_grads_into(p, x.view(), &labels, 0.1, &mut ws, &mut grads);
            (f64::from(loss), grads)
        };
        let (_, grads) = loss_and_grads(&params);
        for (v, grad) in grads.iter().enumerate() {
            for _ in 0..6 {
                let i = rng.random_range(0..params[v].len());
                let at = |delta: f32| {
                    let mut p = params.clone();
                    p[v].as_slice_mut().unwrap()[i] += delta;
                    loss_and_grads(&p).0
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
                let analytic = f64::from(grad.as_slice().unwrap()[i]);
                let tol = 1e-2 * numeric.abs().max(analytic.abs()) + 1e-4;
                assert!(
                    (numeric - analytic).abs() <= tol,
                    "{activation:?} dropout {dropout}, {} entry {i}: analytic {analytic}, \
                     numeric {numeric}",
                    mlp.variables()[v].name
                );
            }
        }
    }
}

/// Regression (`Targets::Values`): the loss is `tf.losses.mean_squared_error` of the one
/// output plus the L2 term, and every gradient entry matches central finite differences,
/// through ReLU and a smooth activation.
#[test]
fn regression_loss_is_mean_squared_error_plus_l2_and_its_gradients_match_finite_differences() {
    use crate::model::{Activation, Hidden, Targets};
    let values = [1.5f32, -0.25, 3.0, 0.0, -2.0, 0.75];
    let reg = 0.1f32;
    let eps = 1e-2f32;
    for activation in [Activation::Relu, Activation::Tanh] {
        let mlp = Mlp::new(&[4, 5, 3, 1]).unwrap().with_hidden(Hidden {
            activation,
            dropout: 0.0,
        });
        let mut rng = StdRng::seed_from_u64(5);
        let params = random_params(&mlp, &mut rng, 1.0);
        let x = Array2::from_shape_simple_fn((6, 4), || rng.random_range(-1.0f32..1.0));
        let loss_of = |p: &[ArrayD<f32>]| mlp.loss_and_grads(p, x.view(), &values[..], reg);
        let (loss, grads) = loss_of(&params);
        // The loss by hand: the predictions (no softmax), their squared errors' mean, and
        // reg · Σ‖W‖²/2 over the weight matrices.
        let predictions = mlp.predictions(&params, x.view());
        let mse = predictions
            .iter()
            .zip(values)
            .map(|(&p, y)| f64::from(p - y).powi(2))
            .sum::<f64>()
            / 6.0;
        let l2: f64 = [0, 2, 4]
            .iter()
            .map(|&i| params[i].iter().map(|&w| f64::from(w).powi(2)).sum::<f64>())
            .sum();
        let want = mse + f64::from(reg) * l2 / 2.0;
        assert!(
            (f64::from(loss) - want).abs() < 1e-5 * want.max(1.0),
            "{activation:?}: loss {loss}, by hand {want}"
        );
        // The same loss through an explicit `Targets::Values`.
        let (again, _) = mlp.loss_and_grads(&params, x.view(), Targets::Values(&values), reg);
        assert_eq!(again, loss);
        for (v, grad) in grads.iter().enumerate() {
            for i in 0..params[v].len() {
                let at = |delta: f32| {
                    let mut p = params.clone();
                    p[v].as_slice_mut().unwrap()[i] += delta;
                    f64::from(loss_of(&p).0)
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
                let analytic = f64::from(grad.as_slice().unwrap()[i]);
                let tol = 1e-2 * numeric.abs().max(analytic.abs()) + 1e-3;
                assert!(
                    (numeric - analytic).abs() <= tol,
                    "{activation:?}, {} entry {i}: analytic {analytic}, numeric {numeric}",
                    mlp.variables()[v].name
                );
            }
        }
    }
}

/// With every variable 0 the prediction is 0: the loss is the labels' mean square and the
/// output bias's gradient −2 · their mean, exactly.
#[test]
fn regression_from_zero_params_has_the_labels_mean_square_as_loss() {
    let mlp = Mlp::new(&[3, 2, 1]).unwrap();
    let params: Vec<ArrayD<f32>> = mlp
        .variables()
        .into_iter()
        .map(|s| ArrayD::zeros(s.shape))
        .collect();
    let x = Array2::from_elem((4, 3), 0.5f32);
    let values = vec![1.0f32, 2.0, -3.0, 4.0];
    let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &values, 0.0);
    assert_eq!(loss, (1.0 + 4.0 + 9.0 + 16.0) / 4.0);
    assert_eq!(grads[3].as_slice().unwrap(), &[-2.0 * 4.0 / 4.0]);
    assert_eq!(mlp.predictions(&params, x.view()), vec![0.0; 4]);
}

#[test]
#[should_panic(expected = "a regression model has one output")]
fn values_cannot_label_a_model_of_several_outputs() {
    let mlp = Mlp::new(&[2, 3]).unwrap();
    let params = mlp.init(1);
    let x = Array2::from_elem((2, 2), 1.0f32);
    mlp.loss_and_grads(&params, x.view(), &[0.5f32, 1.0][..], 0.0);
}
