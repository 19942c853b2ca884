//! The subcommands that read a checkpoint: `dtf eval`, `predict`, `export`
//! and `inspect`.

use super::{Context, Result};
use crate::config;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `dtf eval`: the accuracy of a checkpoint, raw and EMA.
pub fn eval(
    path: &Path,
    data: Option<PathBuf>,
    label: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let meta = crate::predict::Trained::load(path)?.meta;
    // The checkpoint's own data by default: a model trained on a CSV is
    // scored on that CSV's test file, not on Fashion-MNIST.
    let (mut cfg, recorded) = match (&data, meta.training_data) {
        (Some(d), _) => (crate::data::test_config_for_path(d)?, false),
        (None, Some(trained_on)) => (trained_on, true),
        (None, None) => (
            crate::data::test_config_for_path(Path::new(config::DEFAULT_DATA_DIR))?,
            false,
        ),
    };
    if let Some(l) = label {
        cfg.label = l;
    } else if !recorded && let Some(l) = meta.label {
        cfg.label = l;
    }
    // Scored as the evaluator scores it: denormals flushed.
    crate::kernel::flush_denormals(true);
    let ev = match crate::eval::evaluate_on(path, &cfg) {
        Ok(ev) => ev,
        Err(e) if recorded => {
            return Err(Context::wrap(
                format!(
                    "the test data the checkpoint was trained with ({}; give other test data with --data)",
                    crate::data::describe(&cfg)
                ),
                e,
            ));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        println!("{}", serde_json::to_string(&ev)?);
    } else {
        println!("checkpoint    {}", ev.checkpoint.display());
        println!("global_step   {}", ev.global_step);
        match &ev.regression {
            Some(r) => {
                println!("rmse          {:.4}", r.rmse);
                println!("ema_rmse      {:.4}", r.ema_rmse);
                println!("mae           {:.4}", r.mae);
                println!("ema_mae       {:.4}", r.ema_mae);
            }
            None => {
                println!("accuracy      {:.4}", ev.accuracy);
                println!("ema_accuracy  {:.4}", ev.ema_accuracy);
            }
        }
        println!("loss          {:.4}", ev.loss);
        if let Some(b) = &ev.binary {
            println!("auc           {:.4}", b.auc);
            println!("ema_auc       {:.4}", b.ema_auc);
            println!("log_loss      {:.4}", b.log_loss);
            println!("ema_log_loss  {:.4}", b.ema_log_loss);
        }
        println!("examples      {}", ev.examples);
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf predict`: class and probabilities per row, on stdout (a regression model's
/// predicted value).
pub fn predict(
    checkpoint: &Path,
    input: &Path,
    label: Option<String>,
    raw: bool,
    json: bool,
) -> Result<ExitCode> {
    use std::io::Write;
    let model = crate::predict::Trained::load(checkpoint)?;
    let label = label
        .or_else(|| model.meta.label.clone())
        .or_else(|| model.meta.training_data.as_ref().map(|d| d.label.clone()))
        .unwrap_or_else(|| "label".into());
    let probabilities = if model.meta.wide_deep.is_some() {
        // P(0), P(1) from the logit of each example, as dtf eval scores it.
        let examples = crate::predict::read_examples(input, &model, &label)?;
        let net = model.wide_deep(&examples)?;
        let tables = crate::eval::binary::tables(&net, &model.tables);
        let logits =
            crate::eval::binary::logits(&net, model.params(!raw), &tables, !raw, &examples);
        let mut p = ndarray::Array2::zeros((logits.len(), 2));
        for (mut row, z) in p.rows_mut().into_iter().zip(logits) {
            let one = crate::model::wide_deep::sigmoid(z);
            row[0] = 1.0 - one;
            row[1] = one;
        }
        p
    } else {
        let delimiter = model
            .meta
            .training_data
            .as_ref()
            .and_then(|d| d.delimiter_byte());
        let x =
            crate::predict::read_input(input, &label, model.meta.features.as_deref(), delimiter)?;
        if model.meta.task == crate::config::ModelTask::Regression {
            return print_values(&model.values(x, !raw, input)?, json);
        }
        model.probabilities(x, !raw, input)?
    };
    let predictions =
        crate::predict::predictions(&probabilities, model.meta.class_names.as_deref());
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if json {
        for p in &predictions {
            serde_json::to_writer(&mut out, p)?;
            writeln!(out)?;
        }
        out.flush()?;
    } else {
        crate::predict::write_csv(&mut out, &predictions)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A regression model's predictions on stdout: a `prediction` column, or one
/// `{"prediction": v}` object per line with `json`.
///
/// Errors: stdout's.
fn print_values(values: &[f32], json: bool) -> Result<ExitCode> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if json {
        for &prediction in values {
            serde_json::to_writer(&mut out, &crate::predict::ValuePrediction { prediction })?;
            writeln!(out)?;
        }
        out.flush()?;
    } else {
        crate::predict::write_values_csv(&mut out, values)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf export`: the checkpoint as an ONNX model (`onnx`) and/or a
/// TensorFlow V2 checkpoint in a directory (`tf`).
pub fn export(
    checkpoint: &Path,
    onnx: Option<&Path>,
    tf: Option<&Path>,
    raw: bool,
) -> Result<ExitCode> {
    if let Some(onnx) = onnx {
        let model = crate::predict::Trained::load(checkpoint)?;
        model.refuse_wide_deep(
            "ONNX export covers the MLP: a wide & deep model's embedding tables are keyed by \
             64-bit ids that need a hash table the exported graph would not have; serve it from \
             its checkpoint (dtf eval scores it)",
        )?;
        crate::export::write_onnx(&model, !raw, onnx)?;
        eprintln!(
            "{}: ONNX model {:?} ({} weights) of {} (global step {})",
            onnx.display(),
            model.meta.layers,
            if raw { "raw" } else { "EMA" },
            model.file.display(),
            model.global_step
        );
    }
    if let Some(dir) = tf {
        let written = crate::export::write_tf_checkpoint(checkpoint, dir)?;
        eprintln!(
            "{}: TensorFlow checkpoint of {} (global step {}, {} tensors: variables, EMA \
             shadows{}); tf.train.latest_checkpoint({}) names it",
            written.prefix.display(),
            written.source.display(),
            written.global_step,
            written.tensors,
            if written.slots {
                ", optimizer slots"
            } else {
                ""
            },
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf inspect`: what a checkpoint holds.
pub fn inspect(path: &Path, json: bool) -> Result<ExitCode> {
    let file = crate::checkpoint::resolve(path)?;
    let inspection = crate::checkpoint::inspect(&file)?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&InspectJson::from(&inspection))?
        );
    } else {
        print!("{inspection}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf inspect --json`: what [`crate::checkpoint::Inspection`] holds, as one object.
#[derive(serde::Serialize)]
struct InspectJson<'a> {
    /// The model file.
    model: FileJson<'a>,
    /// The EMA file, when it could be read.
    ema: Option<FileJson<'a>>,
    /// Why the EMA file could not be read.
    ema_error: Option<&'a str>,
    /// The pair verifies (checksums, shapes, names).
    verified: bool,
    /// What is wrong, when it does not.
    problem: Option<&'a str>,
    /// The embedding tables: name, rows, dim, bytes.
    tables: &'a [crate::checkpoint::TableEntry],
}

/// One safetensors file in `dtf inspect --json`.
#[derive(serde::Serialize)]
struct FileJson<'a> {
    /// Its path.
    path: &'a std::path::Path,
    /// Its size in bytes.
    bytes: u64,
    /// Its metadata: the file's strings, except that those holding a JSON object or array
    /// (`hyperparameters`, `optimizer`, `layers`) are that object or array, for `jq` to reach
    /// into; numbers stay strings (`run` is a 64-bit id a double would round).
    metadata: std::collections::BTreeMap<&'a str, serde_json::Value>,
    /// Its tensors, sorted by name.
    tensors: Vec<TensorJson<'a>>,
}

/// One tensor in `dtf inspect --json`.
#[derive(serde::Serialize)]
struct TensorJson<'a> {
    /// Its name.
    name: &'a str,
    /// Its safetensors dtype (`F32`, `I64`).
    dtype: &'a str,
    /// Its dimensions; `[]` for a scalar.
    shape: &'a [usize],
}

impl<'a> From<&'a crate::checkpoint::InspectedFile> for FileJson<'a> {
    fn from(f: &'a crate::checkpoint::InspectedFile) -> Self {
        FileJson {
            path: &f.path,
            bytes: f.bytes,
            metadata: f
                .metadata
                .iter()
                .map(|(k, v)| (k.as_str(), metadata_value(v)))
                .collect(),
            tensors: f
                .tensors
                .iter()
                .map(|t| TensorJson {
                    name: &t.name,
                    dtype: &t.dtype,
                    shape: &t.shape,
                })
                .collect(),
        }
    }
}

/// A metadata string as JSON: the object or array it holds, else the string itself.
fn metadata_value(text: &str) -> serde_json::Value {
    match serde_json::from_str(text) {
        Ok(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => v,
        _ => serde_json::Value::String(text.to_owned()),
    }
}

impl<'a> From<&'a crate::checkpoint::Inspection> for InspectJson<'a> {
    fn from(i: &'a crate::checkpoint::Inspection) -> Self {
        InspectJson {
            model: FileJson::from(&i.model),
            ema: i.ema.as_ref().ok().map(FileJson::from),
            ema_error: i.ema.as_ref().err().map(String::as_str),
            verified: i.problem.is_none(),
            problem: i.problem.as_deref(),
            tables: &i.tables,
        }
    }
}
