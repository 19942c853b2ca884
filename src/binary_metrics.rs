//! Metrics of a binary classifier: the area under the ROC curve ([`auc`])
//! and the log loss ([`log_loss`]), in one place for `dtf local`, `dtf eval`
//! and the evaluator (`/work/shared/DESIGN.md`: "computed in one place").
//!
//! Not in `metrics`: that module is the Prometheus registry and the daemons'
//! `/metrics` endpoint; these are pure functions of scores and labels that
//! its gauges may later publish.
//!
//! Both are exact over the whole test split, in f64: no bucketed
//! approximation such as `tf.metrics.auc`'s 200 thresholds, whose error
//! depends on how the scores spread.

/// What makes a set of scores and labels unscorable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BinaryMetricsError {
    /// Scores and labels are not one each per example.
    #[error("{scores} scores for {labels} labels: expected one score per label")]
    Lengths {
        /// Scores given.
        scores: usize,
        /// Labels given.
        labels: usize,
    },
    /// A label other than 0 or 1.
    #[error("label {index} is {label}: a binary metric needs labels 0 and 1")]
    NotBinary {
        /// The example.
        index: usize,
        /// Its label.
        label: u8,
    },
    /// A score that is NaN (or, for the log loss, not a probability).
    #[error("score {index} is {score}: expected {expected}")]
    BadScore {
        /// The example.
        index: usize,
        /// Its score.
        score: f32,
        /// What it must be.
        expected: &'static str,
    },
    /// Every label is the same: the AUC is undefined (no pair to rank).
    #[error("all {examples} labels are {label}: the AUC needs both classes")]
    OneClass {
        /// The examples.
        examples: usize,
        /// Their one label.
        label: u8,
    },
}

/// The smallest probability the log loss takes (and 1 − it the largest):
/// Keras's `epsilon()` (1e-7), which `tf.keras.losses.binary_crossentropy`
/// clips with, so a confident wrong answer costs ln(1e7) ≈ 16.1, not ∞.
pub const LOG_LOSS_EPSILON: f64 = 1e-7;

/// Checks the lengths and labels.
fn check(scores: &[f32], labels: &[u8]) -> Result<(), BinaryMetricsError> {
    if scores.len() != labels.len() {
        return Err(BinaryMetricsError::Lengths {
            scores: scores.len(),
            labels: labels.len(),
        });
    }
    match labels.iter().position(|&l| l > 1) {
        Some(index) => Err(BinaryMetricsError::NotBinary {
            index,
            label: labels[index],
        }),
        None => Ok(()),
    }
}

/// The area under the ROC curve of `scores` (any monotone score: logits or
/// probabilities) against `labels` (0/1): the probability that a random
/// positive scores above a random negative, ties counting one half — the
/// Mann–Whitney U statistic over n⁺·n⁻, computed from average ranks in
/// O(n log n).
///
/// Errors: [`BinaryMetricsError`] for unequal lengths, a label not 0/1, a
/// NaN score, or labels all of one class.
pub fn auc(scores: &[f32], labels: &[u8]) -> Result<f64, BinaryMetricsError> {
    check(scores, labels)?;
    if let Some(index) = scores.iter().position(|s| s.is_nan()) {
        return Err(BinaryMetricsError::BadScore {
            index,
            score: scores[index],
            expected: "a number",
        });
    }
    let positives = labels.iter().filter(|&&l| l == 1).count();
    let negatives = labels.len() - positives;
    if positives == 0 || negatives == 0 {
        return Err(BinaryMetricsError::OneClass {
            examples: labels.len(),
            label: labels.first().copied().unwrap_or(0),
        });
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_unstable_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    // Sum of the positives' ranks (1-based), each tie group sharing its
    // average rank.
    let mut rank_sum = 0f64;
    let mut start = 0;
    while start < order.len() {
        let score = scores[order[start]];
        let mut end = start + 1;
        // -0.0 and 0.0 are one score: compare with ==, not total order.
        while end < order.len() && scores[order[end]] == score {
            end += 1;
        }
        let average = (start + 1 + end) as f64 / 2.0;
        let group_positives = order[start..end]
            .iter()
            .filter(|&&i| labels[i] == 1)
            .count();
        rank_sum += average * group_positives as f64;
        start = end;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Ok((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// The mean log loss (binary cross-entropy) of `probabilities` of the
/// positive class against `labels` (0/1), each clipped to
/// [[`LOG_LOSS_EPSILON`], 1 − [`LOG_LOSS_EPSILON`]]:
/// −mean(y·ln p + (1 − y)·ln(1 − p)).
///
/// Errors: [`BinaryMetricsError`] for unequal lengths, no examples, a label
/// not 0/1, a probability outside [0, 1] or NaN.
pub fn log_loss(probabilities: &[f32], labels: &[u8]) -> Result<f64, BinaryMetricsError> {
    check(probabilities, labels)?;
    if labels.is_empty() {
        return Err(BinaryMetricsError::OneClass {
            examples: 0,
            label: 0,
        });
    }
    let mut sum = 0f64;
    for (index, (&p, &y)) in probabilities.iter().zip(labels).enumerate() {
        if !(0.0..=1.0).contains(&p) {
            return Err(BinaryMetricsError::BadScore {
                index,
                score: p,
                expected: "a probability in [0, 1]",
            });
        }
        let p = f64::from(p).clamp(LOG_LOSS_EPSILON, 1.0 - LOG_LOSS_EPSILON);
        sum -= if y == 1 { p.ln() } else { (1.0 - p).ln() };
    }
    Ok(sum / labels.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The AUC by its definition: every (positive, negative) pair, 1 when
    /// the positive scores higher, 1/2 on a tie.
    fn auc_by_pairs(scores: &[f32], labels: &[u8]) -> f64 {
        let (mut wins, mut pairs) = (0f64, 0f64);
        for (i, &yi) in labels.iter().enumerate() {
            for (j, &yj) in labels.iter().enumerate() {
                if yi == 1 && yj == 0 {
                    pairs += 1.0;
                    if scores[i] > scores[j] {
                        wins += 1.0;
                    } else if scores[i] == scores[j] {
                        wins += 0.5;
                    }
                }
            }
        }
        wins / pairs
    }

    #[test]
    fn auc_matches_pair_counting_with_ties() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..200 {
            let n = rng.random_range(2..60);
            // Few distinct scores: many ties.
            let levels = rng.random_range(1..8);
            let scores: Vec<f32> = (0..n)
                .map(|_| rng.random_range(0..levels) as f32 / 4.0 - 0.5)
                .collect();
            let mut labels: Vec<u8> = (0..n).map(|_| rng.random_range(0..2)).collect();
            labels[0] = 0;
            labels[1] = 1;
            let got = auc(&scores, &labels).unwrap();
            let want = auc_by_pairs(&scores, &labels);
            assert!((got - want).abs() < 1e-12, "case {case}: {got} vs {want}");
        }
    }

    #[test]
    fn auc_known_values() {
        // scikit-learn's roc_auc_score documentation example.
        let s = [0.1, 0.4, 0.35, 0.8];
        assert_eq!(auc(&s, &[0, 0, 1, 1]).unwrap(), 0.75);
        assert_eq!(auc(&s, &[0, 1, 0, 1]).unwrap(), 1.0);
        assert_eq!(auc(&s, &[1, 0, 1, 0]).unwrap(), 0.0);
        // All tied: chance.
        assert_eq!(auc(&[0.3; 4], &[0, 1, 0, 1]).unwrap(), 0.5);
        assert_eq!(auc(&[-0.0, 0.0], &[0, 1]).unwrap(), 0.5, "-0 and 0 tie");
    }

    #[test]
    fn auc_refuses_what_it_cannot_score() {
        let e = auc(&[0.1, 0.2], &[1, 1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "all 2 labels are 1: the AUC needs both classes"
        );
        let e = auc(&[0.1], &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("1 scores for 2 labels"), "{e}");
        let e = auc(&[0.1, 0.2], &[0, 2]).unwrap_err();
        assert!(e.to_string().contains("label 1 is 2"), "{e}");
        let e = auc(&[f32::NAN, 0.2], &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("score 0 is NaN"), "{e}");
    }

    #[test]
    fn log_loss_matches_its_formula_and_clips() {
        let p = [0.9f32, 0.2, 0.6];
        let y = [1, 0, 0];
        let want = -((0.9f64).ln() + (0.8f64).ln() + (0.4f64).ln()) / 3.0;
        let got = log_loss(&p, &y).unwrap();
        assert!((got - want).abs() < 1e-7, "{got} vs {want}");
        // A certain wrong answer costs -ln(1e-7), not infinity.
        let got = log_loss(&[0.0, 1.0], &[1, 0]).unwrap();
        assert!((got - 1e7f64.ln()).abs() < 1e-6, "{got}");
        assert!(log_loss(&[1.0, 0.0], &[1, 0]).unwrap() < 1e-6);
        let e = log_loss(&[1.5], &[1]).unwrap_err();
        assert!(
            e.to_string()
                .contains("score 0 is 1.5: expected a probability"),
            "{e}"
        );
        assert!(log_loss(&[], &[]).is_err());
    }
}
