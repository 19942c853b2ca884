//! A generator of synthetic click-through data (`dtf synth`): N categorical
//! fields with Zipf-distributed values, labels drawn from a planted logistic
//! model, written as RecBole atomic files that `data.format = "recbole"`
//! reads. Because the model that made the labels is known, so is the best
//! AUC any model can reach on them (the planted model's own, [`Summary`]):
//! a test or a benchmark can tell learning from noise, and how far from the
//! ceiling a run stopped.
//!
//! The planted model: `logit = bias + Σ_f w(id_f)`, one weight per id
//! (`data::id(field, value)`), `w(id) ~ N(0, weight_std²)` computed from the
//! id and the seed by hashing ([`planted_weight`]), so a field of 10⁹ values
//! costs no memory and a reader of the files can recompute every logit from
//! the ids alone. A row's label is 1 with probability `sigmoid(logit)`.
//!
//! Values: field `f`'s value of Zipf rank `k` (1 the most frequent) is the
//! token `k`; ranks follow Zipf(cardinality, exponent) (rand_distr's).
//! Rows are drawn from a `StdRng` seeded with `seed`: the same seed gives the
//! same files with the same dtf build.

use super::{DataError, id};
use crate::files;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use std::path::Path;

/// The data set's name: the files are `synthetic.inter` and
/// `synthetic.json` (this summary).
pub const NAME: &str = "synthetic";
/// The label column (0 or 1): `data.label`'s default.
pub const LABEL: &str = "label";

/// One categorical field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Field {
    /// Its column name.
    pub name: String,
    /// How many distinct values it can take.
    pub cardinality: u64,
    /// The Zipf exponent of its values' frequencies (0: uniform; 1.1 is
    /// typical of ids on the web).
    pub exponent: f64,
}

/// What to generate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spec {
    /// Rows (interactions).
    pub rows: usize,
    /// The fields.
    pub fields: Vec<Field>,
    /// The standard deviation of the planted weights.
    pub weight_std: f64,
    /// The planted model's bias (0: about half the labels are 1).
    pub bias: f64,
    /// Seeds the weights and the rows.
    pub seed: u64,
    /// Dense columns (`d0`, `d1`, …: 0 by [`Spec::new`]), counts as
    /// Criteo's integer features are ([`dense_value`]).
    pub dense: usize,
}

/// The most dense columns `dtf synth` writes.
pub const MAX_DENSE: usize = 1000;

/// What was generated: the spec and what the planted model scores.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The spec it was made from.
    pub spec: Spec,
    /// The share of labels that are 1.
    pub positive_rate: f64,
    /// The planted model's AUC on every row: what no model can beat but by
    /// chance (the Bayes-optimal ranking is the planted probability's).
    pub planted_auc: f64,
    /// The planted model's mean log loss on every row.
    pub planted_logloss: f64,
}

/// Errors of [`write`]: a bad spec or a file that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The spec cannot be generated.
    #[error("{0}")]
    Spec(String),
    /// Writing the files failed.
    #[error(transparent)]
    Data(#[from] DataError),
}

impl Spec {
    /// `fields` fields named `f0`, `f1`, … with these cardinalities and
    /// exponents (one value: every field's; else one per field).
    ///
    /// Errors: [`SynthError::Spec`] naming a list whose length is neither 1
    /// nor `fields`, no fields or rows, a cardinality of 0, an exponent below
    /// 0 or not finite, a negative or non-finite weight std or bias.
    pub fn new(
        rows: usize,
        fields: usize,
        cardinality: &[u64],
        exponent: &[f64],
        weight_std: f64,
        bias: f64,
        seed: u64,
    ) -> Result<Spec, SynthError> {
        let bad = |s: String| Err(SynthError::Spec(s));
        if rows == 0 || fields == 0 {
            return bad(format!(
                "{rows} rows of {fields} fields: expected at least 1 of each"
            ));
        }
        let pick = |list: &[f64], what: &str, i: usize| -> Result<f64, SynthError> {
            match list.len() {
                1 => Ok(list[0]),
                n if n == fields => Ok(list[i]),
                n => Err(SynthError::Spec(format!(
                    "{n} values of --{what} for {fields} fields: expected 1 (for all) or {fields}"
                ))),
            }
        };
        let cards: Vec<f64> = cardinality.iter().map(|&c| c as f64).collect();
        let mut out = Vec::with_capacity(fields);
        for i in 0..fields {
            let c = pick(&cards, "cardinality", i)? as u64;
            let e = pick(exponent, "exponent", i)?;
            if c == 0 {
                return bad(format!(
                    "field f{i}: cardinality 0: expected at least 1 value"
                ));
            }
            if !(e.is_finite() && e >= 0.0) {
                return bad(format!(
                    "field f{i}: exponent {e}: expected a finite number ≥ 0"
                ));
            }
            out.push(Field {
                name: format!("f{i}"),
                cardinality: c,
                exponent: e,
            });
        }
        if !(weight_std.is_finite() && weight_std >= 0.0 && bias.is_finite()) {
            return bad(format!(
                "weight std {weight_std}, bias {bias}: expected finite numbers, the std ≥ 0"
            ));
        }
        Ok(Spec {
            rows,
            fields: out,
            weight_std,
            bias,
            seed,
            dense: 0,
        })
    }
}

/// The planted weight of `id` under `seed`: N(0, std²) by Box–Muller from
/// two 53-bit uniforms hashed from the id (xxh3, pinned by `data::id`'s
/// tests), so it needs no table.
pub fn planted_weight(id: u64, seed: u64, std: f64) -> f64 {
    let uniform = |k: u64| {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), seed ^ k);
        // (0, 1]: never ln(0).
        ((h >> 11) + 1) as f64 / (1u64 << 53) as f64
    };
    let (u1, u2) = (
        uniform(0x9e37_79b9_7f4a_7c15),
        uniform(0xc2b2_ae3d_27d4_eb4f),
    );
    std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Dense column `j`'s value for the uniform `u` in (0, 1]: a count,
/// exponential with mean 10^(j mod 4) (1, 10, 100, 1000: heavy-tailed, as
/// Criteo's integer columns are), and its planted feature: ln(1 + count)
/// scaled to about 1 (the planted weight multiplies it).
pub fn dense_value(j: usize, u: f64) -> (u64, f64) {
    let mean = 10f64.powi((j % 4) as i32);
    let count = (-u.ln() * mean).floor() as u64;
    (count, (count as f64).ln_1p() / (2.0 + mean).ln())
}

/// The planted weight of dense column `j` under `seed`.
pub fn dense_weight(j: usize, seed: u64, std: f64) -> f64 {
    planted_weight(id("dense", &j.to_string()), seed, std)
}

/// The planted model's logit of an example with these ids (one per field).
pub fn planted_logit(ids: impl IntoIterator<Item = u64>, spec: &Spec) -> f64 {
    spec.bias
        + ids
            .into_iter()
            .map(|i| planted_weight(i, spec.seed, spec.weight_std))
            .sum::<f64>()
}

/// Generates the rows of `spec` and writes `dir/synthetic.inter` (header
/// `label:float`, then `f0:token` …) and `dir/synthetic.json` (the
/// [`Summary`]), each atomically; creates `dir` if needed.
///
/// Errors: [`SynthError::Spec`] for a bad spec; [`SynthError::Data`] naming
/// the file that could not be written.
pub fn write(dir: &Path, spec: &Spec) -> Result<Summary, SynthError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let zipfs = spec
        .fields
        .iter()
        .map(|f| Zipf::new(f.cardinality as f64, f.exponent))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SynthError::Spec(e.to_string()))?;
    if spec.dense > MAX_DENSE {
        return Err(SynthError::Spec(format!(
            "{} dense columns: expected at most {MAX_DENSE}",
            spec.dense
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut text = String::from(LABEL);
    text.push_str(":float");
    for f in &spec.fields {
        text.push('\t');
        text.push_str(&f.name);
        text.push_str(":token");
    }
    for j in 0..spec.dense {
        text.push_str(&format!("\td{j}:float"));
    }
    text.push('\n');
    let dense_weights: Vec<f64> = (0..spec.dense)
        .map(|j| dense_weight(j, spec.seed, spec.weight_std))
        .collect();
    let mut counts = vec![0u64; spec.dense];
    let mut logits = Vec::with_capacity(spec.rows);
    let mut labels = Vec::with_capacity(spec.rows);
    let mut ranks = vec![0u64; spec.fields.len()];
    let mut value = String::new();
    for _ in 0..spec.rows {
        let mut logit = spec.bias;
        for ((f, z), rank) in spec.fields.iter().zip(&zipfs).zip(ranks.iter_mut()) {
            *rank = z.sample(&mut rng) as u64;
            value.clear();
            value.push_str(&rank.to_string());
            logit += planted_weight(id(&f.name, &value), spec.seed, spec.weight_std);
        }
        for (j, (count, w)) in counts.iter_mut().zip(&dense_weights).enumerate() {
            let u = 1.0 - rng.random::<f64>();
            let (c, feature) = dense_value(j, u);
            *count = c;
            logit += w * feature;
        }
        let p = 1.0 / (1.0 + (-logit).exp());
        let label = u8::from(rng.random::<f64>() < p);
        text.push(if label == 1 { '1' } else { '0' });
        for rank in &ranks {
            text.push('\t');
            text.push_str(&rank.to_string());
        }
        for count in &counts {
            text.push('\t');
            text.push_str(&count.to_string());
        }
        text.push('\n');
        logits.push(logit as f32);
        labels.push(label);
    }
    let probabilities: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
    let positives = labels.iter().filter(|&&l| l == 1).count();
    let summary = Summary {
        spec: spec.clone(),
        positive_rate: positives as f64 / spec.rows as f64,
        planted_auc: crate::binary_metrics::auc(&logits, &labels).unwrap_or(0.5),
        planted_logloss: crate::binary_metrics::log_loss(&probabilities, &labels)
            .unwrap_or(f64::NAN),
    };
    let inter = dir.join(format!("{NAME}.inter"));
    files::write_atomic(&inter, text.as_bytes(), 0o644).map_err(io(&inter))?;
    let json = dir.join(format!("{NAME}.json"));
    let body = serde_json::to_vec_pretty(&summary).expect("a summary serializes");
    files::write_atomic(&json, &body, 0o644).map_err(io(&json))?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DataConfig, DataFormat};
    use crate::data::{Batch, load_both};

    fn spec(rows: usize, seed: u64) -> Spec {
        Spec::new(rows, 4, &[50, 1000, 10, 100_000], &[1.1], 0.8, -0.5, seed).unwrap()
    }

    #[test]
    fn the_planted_model_reaches_the_planted_auc_on_the_files() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(4000, 3);
        let summary = write(d.path(), &s).unwrap();
        assert!(summary.planted_auc > 0.7, "a learnable signal: {summary:?}");
        let cfg = DataConfig {
            format: DataFormat::Recbole,
            dir: d.path().to_path_buf(),
            ..DataConfig::default()
        };
        let (train, test) = load_both(&cfg).unwrap();
        assert_eq!(train.len() + test.len(), 4000);
        // Recompute the planted logits from the ids the reader made: they
        // score the test split as well as the summary says (a sample of
        // 800: within 0.04), and far above chance.
        let mut b = Batch::default();
        test.fill_batch(&(0..test.len()).collect::<Vec<_>>(), &mut b);
        let c = &b.categorical;
        assert_eq!(c.fields, ["f0", "f1", "f2", "f3"]);
        let logits: Vec<f32> = (0..c.len())
            .map(|e| planted_logit((0..c.width()).map(|f| c.get(e, f)[0]), &s) as f32)
            .collect();
        let auc = crate::binary_metrics::auc(&logits, &b.y).unwrap();
        assert!(
            (auc - summary.planted_auc).abs() < 0.04,
            "{auc} vs {summary:?}"
        );
        // A model of noise does not: the same logits against shuffled labels.
        let mut shuffled = b.y.clone();
        shuffled.rotate_left(1);
        let noise = crate::binary_metrics::auc(&logits, &shuffled).unwrap();
        assert!((noise - 0.5).abs() < 0.06, "{noise}");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join("synthetic.json")).unwrap())
                .unwrap();
        assert_eq!(json["planted_auc"], summary.planted_auc);
    }

    /// Dense columns: counts of means 1, 10, 100, 1000 in turn, read by the
    /// RecBole reader as dense features beside the fields, and part of the
    /// planted model (its AUC, recomputed from the file, is the summary's).
    #[test]
    fn dense_columns_are_heavy_tailed_counts_in_the_planted_model() {
        let d = tempfile::tempdir().unwrap();
        let s = Spec {
            dense: 5,
            ..Spec::new(6000, 2, &[20], &[1.0], 0.8, 0.0, 4).unwrap()
        };
        let summary = write(d.path(), &s).unwrap();
        let text = std::fs::read_to_string(d.path().join("synthetic.inter")).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        assert_eq!(
            header,
            "label:float\tf0:token\tf1:token\td0:float\td1:float\td2:float\td3:float\td4:float"
        );
        let (mut logits, mut labels, mut sums) = (Vec::new(), Vec::new(), [0f64; 5]);
        for line in lines {
            let cols: Vec<&str> = line.split('\t').collect();
            let ids = (0..2).map(|f| id(&format!("f{f}"), cols[1 + f]));
            let mut logit = planted_logit(ids, &s);
            for j in 0..5 {
                let count: u64 = cols[3 + j].parse().unwrap();
                sums[j] += count as f64;
                let feature = (count as f64).ln_1p() / (2.0 + 10f64.powi((j % 4) as i32)).ln();
                logit += dense_weight(j, s.seed, s.weight_std) * feature;
            }
            logits.push(logit as f32);
            labels.push(u8::from(cols[0] == "1"));
        }
        let auc = crate::binary_metrics::auc(&logits, &labels).unwrap();
        assert!(
            (auc - summary.planted_auc).abs() < 1e-6,
            "{auc} vs {summary:?}"
        );
        for (j, want) in [1.0, 10.0, 100.0, 1000.0, 1.0].iter().enumerate() {
            let mean = sums[j] / 6000.0;
            assert!(
                (mean / want - 1.0).abs() < 0.15 || *want == 1.0 && mean < 1.0,
                "d{j}: mean {mean}"
            );
        }
        let cfg = DataConfig {
            format: DataFormat::Recbole,
            dir: d.path().to_path_buf(),
            ..DataConfig::default()
        };
        let (train, _) = load_both(&cfg).unwrap();
        assert_eq!(
            train.features(),
            5,
            "the dense columns are the dense features"
        );
        let too_many = Spec {
            dense: MAX_DENSE + 1,
            ..s
        };
        assert!(write(d.path(), &too_many).is_err());
    }

    #[test]
    fn the_same_seed_writes_the_same_files_and_zipf_favours_low_ranks() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(a.path(), &spec(500, 9)).unwrap();
        write(b.path(), &spec(500, 9)).unwrap();
        let read = |d: &Path| std::fs::read_to_string(d.join("synthetic.inter")).unwrap();
        let text = read(a.path());
        assert_eq!(text, read(b.path()));
        let c = tempfile::tempdir().unwrap();
        write(c.path(), &spec(500, 10)).unwrap();
        assert_ne!(text, read(c.path()));
        // Field f1 (1000 values, exponent 1.1): rank 1 is the most common.
        let mut counts = std::collections::HashMap::new();
        for line in text.lines().skip(1) {
            *counts
                .entry(line.split('\t').nth(2).unwrap().to_owned())
                .or_insert(0) += 1;
        }
        let top = counts.iter().max_by_key(|&(_, n)| *n).unwrap().0;
        assert_eq!(top, "1", "{counts:?}");
    }

    #[test]
    fn planted_weights_are_normal_with_the_given_std() {
        let w: Vec<f64> = (0..20_000u64).map(|i| planted_weight(i, 5, 2.0)).collect();
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        let var = w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / w.len() as f64;
        assert!(
            mean.abs() < 0.05 && (var.sqrt() - 2.0).abs() < 0.05,
            "{mean} {var}"
        );
    }

    #[test]
    fn bad_specs_are_refused_by_name() {
        let e = Spec::new(10, 3, &[5, 6], &[1.0], 1.0, 0.0, 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("2 values of --cardinality for 3 fields"),
            "{e}"
        );
        let e = Spec::new(10, 2, &[0], &[1.0], 1.0, 0.0, 0).unwrap_err();
        assert!(e.to_string().contains("field f0: cardinality 0"), "{e}");
        let e = Spec::new(10, 2, &[5], &[-1.0], 1.0, 0.0, 0).unwrap_err();
        assert!(e.to_string().contains("exponent -1"), "{e}");
        assert!(Spec::new(0, 2, &[5], &[1.0], 1.0, 0.0, 0).is_err());
    }
}
