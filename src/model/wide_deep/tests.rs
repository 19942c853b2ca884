use super::*;
use ndarray::{Array2, Ix2, array};

/// Two examples, two fields (the second multi-valued), one dense feature.
struct Case {
    model: WideDeep,
    params: Vec<ArrayD<f32>>,
    x: Array2<f32>,
    labels: Vec<u8>,
    offsets: Vec<u32>,
    rows: Vec<u32>,
    embeddings: Array2<f32>,
    wide: Array1<f32>,
}

fn case() -> Case {
    let model = WideDeep::new(2, 1, 3, &[4]).unwrap();
    let params = model.init(7);
    // Example 0: field 0 → row 0, field 1 → rows 1, 2. Example 1: field 0 →
    // row 1 (an id shared with example 0's other field), field 1 → none.
    let offsets = vec![0, 1, 3, 4, 4];
    let rows = vec![0, 1, 2, 1];
    let embeddings = array![[0.3, -0.2, 0.5], [0.1, 0.4, -0.6], [-0.7, 0.2, 0.05]];
    let wide = array![0.2, -0.1, 0.3];
    Case {
        model,
        params,
        x: array![[0.5], [-1.5]],
        labels: vec![1, 0],
        offsets,
        rows,
        embeddings,
        wide,
    }
}

impl Case {
    fn loss(&self, params: &[ArrayD<f32>], embeddings: &Array2<f32>, wide: &Array1<f32>) -> f32 {
        let mut grads: Vec<ArrayD<f32>> = params.iter().map(|p| ArrayD::zeros(p.shape())).collect();
        self.model.loss_and_grads_into(
            params,
            self.x.view(),
            &self.labels,
            self.lookup(),
            Rows {
                embeddings: embeddings.view(),
                wide: wide.view(),
            },
            &mut Workspace::default(),
            &mut grads,
            &mut RowGrads::default(),
        )
    }

    fn lookup(&self) -> Lookup<'_> {
        Lookup {
            offsets: &self.offsets,
            rows: &self.rows,
        }
    }
}

#[test]
fn the_loss_is_sigmoid_cross_entropy_of_deep_plus_wide() {
    let c = case();
    // By hand: the deep input of each example, then the network, then the loss.
    let e = &c.embeddings;
    let in0: Vec<f32> = (0..3)
        .map(|k| e[[0, k]])
        .chain((0..3).map(|k| (e[[1, k]] + e[[2, k]]) / 2.0))
        .chain([0.5])
        .collect();
    let in1: Vec<f32> = (0..3)
        .map(|k| e[[1, k]])
        .chain([0.0; 3])
        .chain([-1.5])
        .collect();
    let w1 = c.params[0].view().into_dimensionality::<Ix2>().unwrap();
    let b1 = &c.params[1];
    let w2 = c.params[2].view().into_dimensionality::<Ix2>().unwrap();
    let b2 = &c.params[3];
    let deep = |input: &[f32]| {
        let mut out = b2[[0]];
        for j in 0..4 {
            let z: f32 = b1[[j]] + (0..7).map(|i| input[i] * w1[[i, j]]).sum::<f32>();
            out += z.max(0.0) * w2[[j, 0]];
        }
        out
    };
    let z0 = deep(&in0) + 0.2 + (-0.1 + 0.3) / 2.0;
    let z1 = deep(&in1) - 0.1;
    let expected = (-(sigmoid(z0).ln()) - (1.0 - sigmoid(z1)).ln()) / 2.0;
    let got = c.loss(&c.params, &c.embeddings, &c.wide);
    assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
    let logits = c.model.logits(
        &c.params,
        c.x.view(),
        c.lookup(),
        Rows {
            embeddings: c.embeddings.view(),
            wide: c.wide.view(),
        },
        &mut Workspace::default(),
    );
    assert!((logits[0] - z0).abs() < 1e-5 && (logits[1] - z1).abs() < 1e-5);
}

/// Every gradient — dense variables and pulled rows — against central
/// differences of the loss.
#[test]
fn gradients_match_finite_differences() {
    let c = case();
    let mut grads: Vec<ArrayD<f32>> = c.params.iter().map(|p| ArrayD::zeros(p.shape())).collect();
    let mut row_grads = RowGrads::default();
    c.model.loss_and_grads_into(
        &c.params,
        c.x.view(),
        &c.labels,
        c.lookup(),
        Rows {
            embeddings: c.embeddings.view(),
            wide: c.wide.view(),
        },
        &mut Workspace::default(),
        &mut grads,
        &mut row_grads,
    );
    let h = 1e-2f32;
    let close = |analytic: f32, numeric: f32, what: &str| {
        assert!(
            (analytic - numeric).abs() <= 2e-3 + 2e-2 * numeric.abs(),
            "{what}: analytic {analytic}, numeric {numeric}"
        );
    };
    for v in 0..c.params.len() {
        for i in 0..c.params[v].len() {
            let mut plus = c.params.clone();
            let mut minus = c.params.clone();
            plus[v].as_slice_mut().unwrap()[i] += h;
            minus[v].as_slice_mut().unwrap()[i] -= h;
            let numeric = (c.loss(&plus, &c.embeddings, &c.wide)
                - c.loss(&minus, &c.embeddings, &c.wide))
                / (2.0 * h);
            close(
                grads[v].as_slice().unwrap()[i],
                numeric,
                &format!("param {v}[{i}]"),
            );
        }
    }
    for r in 0..3 {
        for k in 0..3 {
            let mut plus = c.embeddings.clone();
            let mut minus = c.embeddings.clone();
            plus[[r, k]] += h;
            minus[[r, k]] -= h;
            let numeric = (c.loss(&c.params, &plus, &c.wide) - c.loss(&c.params, &minus, &c.wide))
                / (2.0 * h);
            close(
                row_grads.embeddings[[r, k]],
                numeric,
                &format!("embedding {r},{k}"),
            );
        }
        let mut plus = c.wide.clone();
        let mut minus = c.wide.clone();
        plus[r] += h;
        minus[r] -= h;
        let numeric = (c.loss(&c.params, &c.embeddings, &plus)
            - c.loss(&c.params, &c.embeddings, &minus))
            / (2.0 * h);
        close(row_grads.wide[r], numeric, &format!("wide {r}"));
    }
    // Row 1 is used by both examples: its wide gradient is the sum of both shares.
    assert!(row_grads.wide[1].abs() > 0.0);
}

#[test]
fn dedup_keeps_first_appearance_and_maps_every_occurrence() {
    let mut d = Dedup::default();
    d.run(&[9, 4, 9, 7, 4, 4]);
    assert_eq!(d.unique, vec![9, 4, 7]);
    assert_eq!(d.rows, vec![0, 1, 0, 2, 1, 1]);
    d.run(&[4]);
    assert_eq!(
        (d.unique.as_slice(), d.rows.as_slice()),
        (&[4u64][..], &[0u32][..])
    );
}

#[test]
fn a_confident_logit_does_not_overflow() {
    assert_eq!(sigmoid(-100.0), sigmoid(-100.0));
    assert!(sigmoid(100.0) <= 1.0 && sigmoid(-100.0) >= 0.0);
    assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
}

#[test]
fn bad_shapes_are_refused() {
    assert_eq!(WideDeep::new(0, 3, 16, &[64]), Err(WideDeepError::NoFields));
    assert_eq!(WideDeep::new(2, 3, 0, &[64]), Err(WideDeepError::NoDim));
    assert_eq!(
        WideDeep::new(2, 3, 16, &[64, 0]),
        Err(WideDeepError::ZeroWidth(vec![64, 0]))
    );
    let m = WideDeep::new(2, 3, 16, &[64, 32]).unwrap();
    assert_eq!(m.layers(), &[35, 64, 32, 1]);
    assert_eq!(m.variables().len(), 6);
    assert_eq!(m.tables(), [(EMBEDDINGS, 16), (WIDE, 1)]);
}

#[test]
fn dense_layers_start_glorot_uniform_biases_zero() {
    let m = WideDeep::new(9, 1, 16, &[64, 32]).unwrap();
    let values = m.init(7);
    assert_eq!(values, m.init(7), "deterministic in the seed");
    assert_ne!(values, m.init(8));
    for (spec, v) in m.variables().iter().zip(&values) {
        assert_eq!(v.shape(), spec.shape.as_slice());
        match spec.shape[..] {
            [fan_in, fan_out] => {
                let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
                assert!(v.iter().all(|x| x.abs() <= limit), "{}", spec.name);
                // Uniform on ±limit: variance limit² / 3.
                let var = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
                let want = limit * limit / 3.0;
                let tolerance = if v.len() > 1000 { 0.1 } else { 0.5 };
                assert!(
                    (var / want - 1.0).abs() < tolerance,
                    "{}: {var} vs {want}",
                    spec.name
                );
            }
            _ => assert!(v.iter().all(|&x| x == 0.0), "{}", spec.name),
        }
    }
}
