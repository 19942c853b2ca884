//! Encoding a [`Checkpoint`] to its two safetensors files: the model's
//! variables, slots and tables with their metadata, and the EMA shadows.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use ndarray::ArrayD;
use safetensors::Dtype;

use super::super::container;
use super::super::{
    CRC_PREFIX, Checkpoint, DELTA_FORMAT, EMA_SUFFIX, FORMAT, GLOBAL_STEP, MAX_HEADER_BYTES,
};
use super::{
    BASE_KEY, CHAIN_KEY, OPTIMIZER_KEY, OWN_KEYS, RUN_KEY, SHARD_STEPS_KEY, SLOTS_KEY,
    TABLE_OPTIMIZERS_KEY, TABLES_KEY, chain_text, check_saveable,
};

fn f32_bytes(a: &ArrayD<f32>) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * 4);
    for x in a.iter() {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Serializes a checkpoint to (model file bytes, EMA file bytes).
/// `extra` is more metadata for the model file (the model's description,
/// `checkpoint/meta.rs`); it may not replace a key this module writes.
pub(in crate::checkpoint) fn to_bytes(
    ckpt: &Checkpoint,
    extra: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    check_saveable(ckpt)?;
    let (model, ema) = encode_with(ckpt, extra)?;
    // What would not load back must not be written: readers refuse headers
    // beyond the bound (thousands of tensors fit in it).
    for bytes in [&model, &ema] {
        if let Some(n) = container::header_len(bytes).filter(|&n| n > MAX_HEADER_BYTES) {
            return Err(format!(
                "refusing to save: the header would be {n} bytes, more than the \
                 {MAX_HEADER_BYTES} readers accept (too many variables)"
            ));
        }
    }
    Ok((model, ema))
}

/// [`to_bytes`] without the checks (tests use it to write damaged checkpoints).
#[cfg(test)]
pub(in crate::checkpoint) fn encode(ckpt: &Checkpoint) -> Result<(Vec<u8>, Vec<u8>), String> {
    encode_with(ckpt, &BTreeMap::new())
}

/// A tensor as it is written: name, dtype, shape, little-endian bytes (a
/// table's borrowed: a table of millions of rows is not copied to be saved).
type Tensor<'a> = container::Named<Cow<'a, [u8]>>;

/// [`encode`] with `extra` metadata in the model file.
fn encode_with(
    ckpt: &Checkpoint,
    extra: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let step = ckpt.global_step.to_string();
    let mut model: Vec<Tensor> = ckpt
        .variables
        .iter()
        .map(|(n, a)| {
            (
                n.clone(),
                Dtype::F32,
                a.shape().to_vec(),
                f32_bytes(a).into(),
            )
        })
        .collect();
    let step_i64 = i64::try_from(ckpt.global_step).map_err(|e| e.to_string())?;
    model.push((
        GLOBAL_STEP.to_string(),
        Dtype::I64,
        Vec::new(),
        step_i64.to_le_bytes().to_vec().into(),
    ));
    model.extend(ckpt.slots.tensors.iter().map(|(n, a)| {
        (
            n.clone(),
            Dtype::F32,
            a.shape().to_vec(),
            f32_bytes(a).into(),
        )
    }));
    let removed = ckpt
        .increment
        .as_ref()
        .filter(|i| i.base.is_some())
        .map_or(&[][..], |i| i.removed.as_slice());
    let mut table_shadows = Vec::with_capacity(ckpt.tables.len());
    for (i, (name, rows)) in ckpt.tables.iter().enumerate() {
        let slot_names = ckpt
            .table_optimizer(name)
            .map_or(&[][..], |o| o.slot_names());
        let (tensors, shadows) = container::table_tensors(name, rows, slot_names);
        model.extend(
            tensors
                .into_iter()
                .map(|(n, d, s, b)| (n, d, s, Cow::Borrowed(b))),
        );
        table_shadows.push(shadows);
        if let Some(ids) = removed.get(i) {
            let (n, d, s, b) = container::removed_tensor(name, ids);
            model.push((n, d, s, Cow::Borrowed(b)));
        }
    }
    let model_meta = model_metadata(ckpt, &step, extra)?;

    let by_name: HashMap<&str, &ArrayD<f32>> =
        ckpt.shadows.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let ema: Vec<Tensor> = ckpt
        .variables
        .iter()
        .filter_map(|(n, _)| by_name.get(n.as_str()).map(|a| (n, a)))
        .map(|(n, a)| {
            (
                format!("{n}{EMA_SUFFIX}"),
                Dtype::F32,
                a.shape().to_vec(),
                f32_bytes(a).into(),
            )
        })
        .chain(
            table_shadows
                .into_iter()
                .map(|(n, d, s, b)| (n, d, s, Cow::Borrowed(b))),
        )
        .collect();
    let mut ema_meta = HashMap::from([
        ("global_step".to_string(), step),
        ("kind".to_string(), "ema".to_string()),
    ]);
    ema_meta.extend(identity(ckpt));
    Ok((
        encode_file(&model, model_meta)?,
        encode_file(&ema, ema_meta)?,
    ))
}

/// The model file's metadata: format, step, the variables', optimizer's and
/// slots' lists, and `extra`, which may not replace any of these.
fn model_metadata(
    ckpt: &Checkpoint,
    step: &str,
    extra: &BTreeMap<String, String>,
) -> Result<HashMap<String, String>, String> {
    let var_names: Vec<&str> = ckpt.variables.iter().map(|(n, _)| n.as_str()).collect();
    let slot_names: Vec<&str> = ckpt.slots.tensors.iter().map(|(n, _)| n.as_str()).collect();
    let mut meta = HashMap::from([
        ("global_step".to_string(), step.to_string()),
        ("kind".to_string(), "variables".to_string()),
        (
            "variables".to_string(),
            serde_json::to_string(&var_names).map_err(|e| e.to_string())?,
        ),
        (
            OPTIMIZER_KEY.to_string(),
            serde_json::to_string(&ckpt.slots.optimizer).map_err(|e| e.to_string())?,
        ),
        (
            SLOTS_KEY.to_string(),
            serde_json::to_string(&slot_names).map_err(|e| e.to_string())?,
        ),
    ]);
    meta.extend(identity(ckpt));
    if ckpt.run != 0 {
        meta.insert(RUN_KEY.to_string(), ckpt.run.to_string());
    }
    if !ckpt.tables.is_empty() {
        let names: Vec<&str> = ckpt.tables.iter().map(|(n, _)| n.as_str()).collect();
        meta.insert(
            TABLES_KEY.to_string(),
            serde_json::to_string(&names).map_err(|e| e.to_string())?,
        );
    }
    if !ckpt.table_optimizers.is_empty() {
        let rules: BTreeMap<&str, _> = ckpt
            .table_optimizers
            .iter()
            .map(|(n, o)| (n.as_str(), o))
            .collect();
        meta.insert(
            TABLE_OPTIMIZERS_KEY.to_string(),
            serde_json::to_string(&rules).map_err(|e| e.to_string())?,
        );
    }
    if !ckpt.shard_steps.is_empty() {
        meta.insert(
            SHARD_STEPS_KEY.to_string(),
            serde_json::to_string(&ckpt.shard_steps).map_err(|e| e.to_string())?,
        );
    }
    for (key, value) in extra {
        if OWN_KEYS.contains(&key.as_str()) || key.starts_with(CRC_PREFIX) {
            return Err(format!("metadata key {key:?} is reserved"));
        }
        meta.insert(key.clone(), value.clone());
    }
    Ok(meta)
}

/// What both files of a pair say of the format and the chain: `format`
/// ([`FORMAT`], a delta's [`DELTA_FORMAT`]), a chain's `chain`, a delta's
/// `base`.
fn identity(ckpt: &Checkpoint) -> Vec<(String, String)> {
    let increment = ckpt.increment.as_ref();
    let base = increment.and_then(|i| i.base);
    let format = if base.is_some() { DELTA_FORMAT } else { FORMAT };
    let mut out = vec![("format".to_string(), format.to_string())];
    if let Some(i) = increment {
        out.push((CHAIN_KEY.to_string(), chain_text(i.chain)));
    }
    if let Some(b) = base {
        out.push((BASE_KEY.to_string(), b.to_string()));
    }
    out
}

/// One safetensors file of `tensors` with `meta` ([`container::encode`]: a
/// `crc32:<name>` per tensor added).
fn encode_file(tensors: &[Tensor], meta: HashMap<String, String>) -> Result<Vec<u8>, String> {
    container::encode_named(tensors, meta)
}
