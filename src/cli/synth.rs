//! `dtf synth`: synthetic click-through data with a known best AUC
//! (`data::synthetic`), as RecBole atomic files.

use super::Result;
use crate::data::synthetic::{self, Spec, SynthError};
use std::path::Path;
use std::process::ExitCode;

/// `dtf synth`'s options (the generator's `Spec`, and where to write).
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Rows to generate.
    pub rows: usize,
    /// Categorical fields.
    pub fields: usize,
    /// Values per field: one for all, or one per field.
    pub cardinality: Vec<u64>,
    /// Zipf exponents: one for all, or one per field.
    pub exponent: Vec<f64>,
    /// The planted weights' standard deviation.
    pub weight_std: f64,
    /// The planted model's bias.
    pub bias: f64,
    /// Seeds the weights and the rows.
    pub seed: u64,
    /// Dense (count) columns besides the categorical fields.
    pub dense: usize,
}

/// Writes the data set to `out` and prints its summary (the planted AUC):
/// one JSON object with `json`, else a sentence. A spec that cannot be
/// generated is a bad command line (exit 2).
pub fn synth(out: &Path, o: &SynthOptions, json: bool) -> Result<ExitCode> {
    let spec = match Spec::new(
        o.rows,
        o.fields,
        &o.cardinality,
        &o.exponent,
        o.weight_std,
        o.bias,
        o.seed,
    ) {
        Ok(s) => Spec {
            dense: o.dense,
            ..s
        },
        Err(e) => return Ok(super::usage(&e)),
    };
    let summary = match synthetic::write(out, &spec) {
        Ok(s) => s,
        Err(SynthError::Spec(e)) => return Ok(super::usage(&e)),
        Err(e) => return Err(e.into()),
    };
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{}: {} rows of {} fields and {} dense columns, {:.1} % positive; the planted model's AUC is {:.4} \
             (log loss {:.4}): the best a model can reach. Train with \
             `dtf local --data {}`.",
            out.join(format!("{}.inter", synthetic::NAME)).display(),
            spec.rows,
            spec.fields.len(),
            spec.dense,
            100.0 * summary.positive_rate,
            summary.planted_auc,
            summary.planted_logloss,
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
