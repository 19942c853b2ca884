//! The file format: encoding a [`Checkpoint`] to two safetensors files, and
//! decoding and verifying them.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use safetensors::{Dtype, SafeTensors};

use super::container::{self, CrcError, ParseError};
use super::{
    CRC_PREFIX, Checkpoint, CheckpointError, DELTA_FORMAT, EMA_BYTES, EMA_SUFFIX, FORMAT,
    GLOBAL_STEP, Increment, MODEL_BYTES, Slots, parse_step,
};
use crate::model::VarSpec;
use crate::optimizer::{self, Optimizer};

/// Metadata key of the optimizer and its hyperparameters (JSON).
const OPTIMIZER_KEY: &str = "optimizer";
/// Metadata key of the JSON list of slot tensors in the model file.
const SLOTS_KEY: &str = "slots";
/// Metadata key of the run id ([`Checkpoint::run`]), a decimal u64.
const RUN_KEY: &str = "run";
/// Metadata key of each ps task's own step ([`Checkpoint::shard_steps`]), a
/// JSON list of decimal u64s.
const SHARD_STEPS_KEY: &str = "shard_steps";
/// Metadata key of the JSON list of embedding tables in the model file
/// ([`Checkpoint::tables`]), in order; absent: none.
pub(super) const TABLES_KEY: &str = "tables";
/// Metadata key: each table's own update rule, a JSON object by table name
/// (`{"wide/weights":{"name":"ftrl",…}}`); absent: every table follows the
/// run's optimizer.
pub(super) const TABLE_OPTIMIZERS_KEY: &str = "table_optimizers";
/// Metadata key of a chain's id ([`Increment::chain`]), 16 lowercase hex
/// digits, on both files of its base and of each of its deltas; absent: a
/// checkpoint on its own.
pub(super) const CHAIN_KEY: &str = "chain";
/// Metadata key of a delta's base ([`Increment::base`]): the base's global
/// step, decimal, on both files of the delta (whose `format` is
/// [`DELTA_FORMAT`]).
pub(super) const BASE_KEY: &str = "base";
/// Every metadata key this module writes (besides the `crc32:<tensor>`
/// ones): what the caller's extra metadata may not replace, and what is
/// left of a file's metadata without them is that extra
/// ([`whole_bytes`]).
const OWN_KEYS: [&str; 12] = [
    "format",
    "global_step",
    "kind",
    "variables",
    OPTIMIZER_KEY,
    SLOTS_KEY,
    RUN_KEY,
    SHARD_STEPS_KEY,
    TABLES_KEY,
    TABLE_OPTIMIZERS_KEY,
    CHAIN_KEY,
    BASE_KEY,
];

mod encode;
mod saveable;
#[cfg(test)]
pub(super) use encode::encode;
pub(super) use encode::to_bytes;
use saveable::check_saveable;

/// The specs of named arrays.
fn var_specs(vars: &[(String, ArrayD<f32>)]) -> Vec<VarSpec> {
    vars.iter()
        .map(|(n, a)| VarSpec {
            name: n.clone(),
            shape: a.shape().to_vec(),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Decoding and verification

/// A parsed file: its tensors and metadata, checked for format, kind and CRCs.
struct Parsed<'a> {
    /// The file's tensors, borrowing its bytes.
    tensors: SafeTensors<'a>,
    /// Its `__metadata__` (empty if it has none).
    meta: HashMap<String, String>,
    /// The metadata's `global_step`, parsed.
    global_step: u64,
    /// The metadata's `chain` and `base` (a delta's), parsed; `None`: a
    /// checkpoint on its own.
    chain: Option<(u64, Option<u64>)>,
}

/// Parses one file of a pair and checks what every dtf file carries: the
/// format, the `kind` (`variables` or `ema`), the step, and a CRC per tensor.
fn parse_file<'a>(bytes: &'a [u8], path: &Path, kind: &str) -> Result<Parsed<'a>, CheckpointError> {
    let (tensors, meta) = parse_safetensors(bytes, path)?;
    let global_step = check_identity(&meta, path, kind)?;
    let chain = check_chain(&meta, path)?;
    check_crcs(&tensors, &meta, path)?;
    Ok(Parsed {
        tensors,
        meta,
        global_step,
        chain,
    })
}

/// The safetensors structure of `bytes`: its tensors and its metadata.
fn parse_safetensors<'a>(
    bytes: &'a [u8],
    path: &Path,
) -> Result<(SafeTensors<'a>, HashMap<String, String>), CheckpointError> {
    container::parse(bytes).map_err(|e| parse_error(e, path))
}

/// A [`container`] parse error as the checkpoint error naming `path`.
fn parse_error(e: ParseError, path: &Path) -> CheckpointError {
    match e {
        ParseError::HeaderTooLarge(bytes) => CheckpointError::HeaderTooLarge {
            path: path.to_path_buf(),
            bytes,
        },
        ParseError::Safetensors(source) => CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// Refuses a header longer than [`MAX_HEADER_BYTES`] before anything parses
/// it. (A file too short to have a length is left to the parser's error.)
pub(super) fn check_header_len(bytes: &[u8], path: &Path) -> Result<(), CheckpointError> {
    container::check_header_len(bytes).map_err(|e| parse_error(e, path))
}

/// Checks the metadata's `format` and `kind`; returns its `global_step`.
fn check_identity(
    meta: &HashMap<String, String>,
    path: &Path,
    kind: &str,
) -> Result<u64, CheckpointError> {
    let get = |key: &str| meta.get(key).map(String::as_str);
    match get("format") {
        Some(FORMAT | DELTA_FORMAT) => {}
        other => {
            return Err(CheckpointError::invalid(
                path,
                format!(
                    "metadata format is {other:?}, expected \"{FORMAT}\" (or \"{DELTA_FORMAT}\", \
                     an incremental checkpoint's delta; not a dtf checkpoint?)"
                ),
            ));
        }
    }
    if get("kind") != Some(kind) {
        return Err(CheckpointError::invalid(
            path,
            format!("metadata kind is {:?}, expected \"{kind}\"", get("kind")),
        ));
    }
    get("global_step").and_then(parse_step).ok_or_else(|| {
        CheckpointError::invalid(
            path,
            format!(
                "metadata global_step is {:?}, expected a non-negative integer",
                get("global_step")
            ),
        )
    })
}

/// The metadata's `chain` and, in a delta (`format` [`DELTA_FORMAT`]), its
/// `base`: (chain id, the base's step). A delta needs both; a whole file
/// has no `base`.
///
/// Errors: [`CheckpointError::Invalid`] naming `path`.
pub(super) fn check_chain(
    meta: &HashMap<String, String>,
    path: &Path,
) -> Result<Option<(u64, Option<u64>)>, CheckpointError> {
    let delta = meta.get("format").map(String::as_str) == Some(DELTA_FORMAT);
    let chain = match meta.get(CHAIN_KEY) {
        None if delta => {
            return Err(CheckpointError::invalid(
                path,
                format!("a delta (format \"{DELTA_FORMAT}\") without metadata \"{CHAIN_KEY}\""),
            ));
        }
        None => None,
        Some(text) => Some(parse_chain(text).ok_or_else(|| {
            CheckpointError::invalid(
                path,
                format!("metadata {CHAIN_KEY} is {text:?}, expected 16 lowercase hex digits"),
            )
        })?),
    };
    let base = match (meta.get(BASE_KEY), delta) {
        (None, false) => None,
        (Some(text), true) => Some(parse_step(text).ok_or_else(|| {
            CheckpointError::invalid(
                path,
                format!("metadata {BASE_KEY} is {text:?}, expected the base's global step"),
            )
        })?),
        (None, true) => {
            return Err(CheckpointError::invalid(
                path,
                format!("a delta (format \"{DELTA_FORMAT}\") without metadata \"{BASE_KEY}\""),
            ));
        }
        (Some(_), false) => {
            return Err(CheckpointError::invalid(
                path,
                format!(
                    "metadata {BASE_KEY} in a file whose format is not \"{DELTA_FORMAT}\": \
                     a delta that says it is whole?"
                ),
            ));
        }
    };
    Ok(chain.map(|c| (c, base)))
}

/// Whether a file whose chain and base are `found` ([`check_chain`]) is
/// the base of a delta of chain `chain`: that chain's, and whole.
///
/// Errors: what it is instead, to follow "its base model.ckpt-N.safetensors".
pub(super) fn check_base_of(found: Option<(u64, Option<u64>)>, chain: u64) -> Result<(), String> {
    match found {
        None => Err(
            "is no chain's base (no chain metadata): another checkpoint saved at its step?".into(),
        ),
        Some((_, Some(b))) => Err(format!(
            "is itself a delta (on base {b}): a chain has one whole checkpoint"
        )),
        Some((c, None)) if c != chain => Err(format!(
            "is of chain {}, the delta of chain {}: another chain's base saved at its step?",
            chain_text(c),
            chain_text(chain)
        )),
        Some(_) => Ok(()),
    }
}

/// A chain id as the metadata holds it: exactly 16 lowercase hex digits.
fn parse_chain(text: &str) -> Option<u64> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    (text.len() == 16 && text.bytes().all(hex))
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// A chain id as the metadata holds it ([`parse_chain`]'s inverse).
pub(super) fn chain_text(chain: u64) -> String {
    format!("{chain:016x}")
}

/// Checks every tensor's bytes against its `crc32:<name>` in the metadata.
fn check_crcs(
    tensors: &SafeTensors<'_>,
    meta: &HashMap<String, String>,
    path: &Path,
) -> Result<(), CheckpointError> {
    for (name, view) in tensors.iter() {
        match container::check_crc(meta, name, view.data()) {
            Ok(()) => {}
            Err(CrcError::Missing) => {
                return Err(CheckpointError::invalid(
                    path,
                    format!(
                        "tensor {name:?} has no \"{CRC_PREFIX}{name}\" checksum in the metadata"
                    ),
                ));
            }
            Err(CrcError::Mismatch { got, want }) => {
                return Err(CheckpointError::invalid(
                    path,
                    format!(
                        "tensor {name:?} fails its checksum (crc32 {got}, metadata says {want}): the data is corrupted"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// An F32 tensor's values, checked for dtype, shape and finiteness.
fn read_f32(
    parsed: &Parsed<'_>,
    path: &Path,
    tensor: &str,
    shape: Option<&[usize]>,
) -> Result<ArrayD<f32>, CheckpointError> {
    let view = parsed
        .tensors
        .tensor(tensor)
        .map_err(|_| CheckpointError::invalid(path, format!("tensor {tensor:?} is missing")))?;
    if view.dtype() != Dtype::F32 {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} has dtype {:?}, expected F32",
                view.dtype()
            ),
        ));
    }
    if let Some(shape) = shape
        && view.shape() != shape
    {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} has shape {:?}, the model expects {shape:?} (a checkpoint of a different model?)",
                view.shape()
            ),
        ));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} holds a non-finite value ({}) at flat index {i}",
                values[i]
            ),
        ));
    }
    ArrayD::from_shape_vec(IxDyn(view.shape()), values)
        .map_err(|e| CheckpointError::invalid(path, format!("tensor {tensor:?}: {e}")))
}

/// The metadata's list of embedding tables (absent: none), each named once.
fn listed_tables(m: &Parsed<'_>, model_path: &Path) -> Result<Vec<String>, CheckpointError> {
    let Some(text) = m.meta.get(TABLES_KEY) else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = serde_json::from_str(text).map_err(|_| {
        CheckpointError::invalid(
            model_path,
            format!("metadata \"{TABLES_KEY}\" is {text:?}, not a JSON list of table names"),
        )
    })?;
    let unique: HashSet<&str> = names.iter().map(String::as_str).collect();
    if unique.len() != names.len() || names.iter().any(String::is_empty) {
        return Err(CheckpointError::invalid(
            model_path,
            format!("metadata \"{TABLES_KEY}\" {names:?} names a table twice, or an empty name"),
        ));
    }
    Ok(names)
}

/// Parses and verifies a model file and its EMA file as one checkpoint; see
/// [`from_bytes`] for what is checked.
pub(super) fn parse(
    model: &[u8],
    model_path: &Path,
    ema: &[u8],
    ema_path: &Path,
    expected: Option<&[VarSpec]>,
) -> Result<Checkpoint, CheckpointError> {
    let m = parse_file(model, model_path, "variables")?;
    let e = parse_file(ema, ema_path, "ema")?;
    if m.global_step != e.global_step {
        return Err(CheckpointError::invalid(
            ema_path,
            format!(
                "EMA file is of global_step {}, its model file {} of {}: they must be a pair",
                e.global_step,
                model_path.display(),
                m.global_step
            ),
        ));
    }
    if m.chain != e.chain {
        return Err(CheckpointError::invalid(
            ema_path,
            format!(
                "EMA file is of chain and base {:?}, its model file {} of {:?}: they must be a pair",
                e.chain,
                model_path.display(),
                m.chain
            ),
        ));
    }
    check_step_tensor(&m, model_path)?;
    let (optimizer, slot_names) = listed_slots(&m, model_path)?;
    let table_names = listed_tables(&m, model_path)?;
    let delta = matches!(m.chain, Some((_, Some(_))));
    if delta && table_names.is_empty() {
        return Err(CheckpointError::invalid(
            model_path,
            "a delta without tables: only embedding tables are saved incrementally",
        ));
    }
    let table_optimizers = listed_table_optimizers(&m, &table_names, model_path)?;
    let table_slots = |name: &str| {
        super::table_rule(&table_optimizers, optimizer, name).map_or(&[][..], |o| o.slot_names())
    };
    // The tables' tensors are not variables: left out of their list as the
    // slots are.
    let not_variables: Vec<String> = slot_names
        .iter()
        .cloned()
        .chain(
            table_names
                .iter()
                .flat_map(|n| container::table_tensor_names(n, table_slots(n))),
        )
        .chain(
            table_names
                .iter()
                .filter(|_| delta)
                .map(|n| format!("{n}{}", container::REMOVED_SUFFIX)),
        )
        .collect();
    let listed = listed_variables(&m, &not_variables, model_path)?;
    let specs = read_plan(&listed, expected, model_path)?;

    let mut variables = Vec::with_capacity(specs.len());
    let mut shadows = Vec::with_capacity(specs.len());
    for (name, shape) in &specs {
        let value = read_f32(&m, model_path, name, *shape)?;
        let shadow = read_f32(
            &e,
            ema_path,
            &format!("{name}{EMA_SUFFIX}"),
            Some(value.shape()),
        )?;
        variables.push((name.clone(), value));
        shadows.push((name.clone(), shadow));
    }
    let slots = read_slots(&m, model_path, optimizer, &slot_names, &variables)?;
    let tables: Vec<_> = table_names
        .iter()
        .map(|name| {
            container::read_rows(&m.tensors, &e.tensors, name, table_slots(name), None)
                .map(|rows| (name.clone(), rows))
                .map_err(|p| {
                    let path = if p.in_shadows { ema_path } else { model_path };
                    CheckpointError::invalid(path, p.why)
                })
        })
        .collect::<Result<_, _>>()?;
    let increment = increment(&m, &tables, model_path)?;
    check_no_stray_shadows(&e, &specs, &table_names, ema_path)?;
    let run = match m.meta.get(RUN_KEY) {
        None => 0,
        Some(text) => text.parse().map_err(|_| {
            CheckpointError::invalid(
                model_path,
                format!("metadata {RUN_KEY} is {text:?}, expected a run id (an integer)"),
            )
        })?,
    };
    let shard_steps = match m.meta.get(SHARD_STEPS_KEY) {
        None => Vec::new(),
        Some(text) => serde_json::from_str(text).map_err(|_| {
            CheckpointError::invalid(
                model_path,
                format!(
                    "metadata {SHARD_STEPS_KEY} is {text:?}, expected a list of each ps task's step"
                ),
            )
        })?,
    };
    Ok(Checkpoint {
        global_step: m.global_step,
        variables,
        shadows,
        slots,
        run,
        shard_steps,
        tables,
        table_optimizers,
        increment,
    })
}

/// The model file's place in a chain: none, a base, or a delta unresolved
/// (its `NAME/removed` read beside each table's rows).
fn increment(
    m: &Parsed<'_>,
    tables: &[(String, crate::model::table::Rows)],
    model_path: &Path,
) -> Result<Option<Increment>, CheckpointError> {
    let Some((chain, base)) = m.chain else {
        return Ok(None);
    };
    let removed = match base {
        None => Vec::new(),
        Some(_) => tables
            .iter()
            .map(|(name, rows)| container::read_removed(&m.tensors, name, &rows.ids))
            .collect::<Result<_, _>>()
            .map_err(|why| CheckpointError::invalid(model_path, why))?,
    };
    Ok(Some(Increment {
        chain,
        base,
        removed,
    }))
}

/// The metadata's `table_optimizers`: each named table's own rule, every
/// name one of `tables`; absent: none.
fn listed_table_optimizers(
    m: &Parsed<'_>,
    tables: &[String],
    model_path: &Path,
) -> Result<Vec<(String, crate::optimizer::TableOptimizer)>, CheckpointError> {
    let Some(text) = m.meta.get(TABLE_OPTIMIZERS_KEY) else {
        return Ok(Vec::new());
    };
    let rules: std::collections::BTreeMap<String, crate::optimizer::TableOptimizer> =
        serde_json::from_str(text).map_err(|e| {
            CheckpointError::invalid(
                model_path,
                format!(
                    "metadata \"{TABLE_OPTIMIZERS_KEY}\" is {text:?}, not each table's optimizer \
                     ({e}); expected e.g. {{\"wide/weights\":{{\"name\":\"ftrl\",…}}}}"
                ),
            )
        })?;
    if let Some(stray) = rules.keys().find(|n| !tables.contains(n)) {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "metadata \"{TABLE_OPTIMIZERS_KEY}\" names table {stray:?}, which the checkpoint does not hold (it holds {tables:?})"
            ),
        ));
    }
    Ok(rules.into_iter().collect())
}

/// The metadata's optimizer and its list of slot tensors; neither present
/// (a checkpoint from before optimizers) is SGD without slots.
fn listed_slots(
    m: &Parsed<'_>,
    model_path: &Path,
) -> Result<(Optimizer, Vec<String>), CheckpointError> {
    let optimizer = match m.meta.get(OPTIMIZER_KEY) {
        None => Optimizer::Sgd,
        Some(text) => serde_json::from_str(text).map_err(|e| {
            CheckpointError::invalid(
                model_path,
                format!(
                    "metadata \"{OPTIMIZER_KEY}\" is {text:?}, not an optimizer ({e}); expected \
                     e.g. {{\"name\":\"adam\",\"beta1\":0.9,\"beta2\":0.999,\"epsilon\":1e-8}}"
                ),
            )
        })?,
    };
    let names = match m.meta.get(SLOTS_KEY) {
        None => Vec::new(),
        Some(text) => serde_json::from_str(text).map_err(|_| {
            CheckpointError::invalid(
                model_path,
                format!("metadata \"{SLOTS_KEY}\" is {text:?}, not a JSON list of names"),
            )
        })?,
    };
    Ok((optimizer, names))
}

/// The slots listed in the metadata, checked to be exactly those of the
/// optimizer for `variables`, each of its variable's shape, finite, and the
/// non-slot scalars usable.
fn read_slots(
    m: &Parsed<'_>,
    model_path: &Path,
    optimizer: Optimizer,
    listed: &[String],
    variables: &[(String, ArrayD<f32>)],
) -> Result<Slots, CheckpointError> {
    let specs = optimizer.slot_specs(&var_specs(variables));
    let mut want: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut got: Vec<&str> = listed.iter().map(String::as_str).collect();
    want.sort_unstable();
    got.sort_unstable();
    if want != got {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "metadata \"{SLOTS_KEY}\" lists {got:?}, but the slots of {} for these \
                 variables are {want:?}",
                optimizer.name()
            ),
        ));
    }
    let mut tensors = Vec::with_capacity(specs.len());
    for spec in &specs {
        let value = read_f32(m, model_path, &spec.name, Some(&spec.shape))?;
        if spec.var.is_none() {
            let v = value.iter().copied().next().unwrap_or(f32::NAN);
            optimizer::check_non_slot(&spec.name, v)
                .map_err(|e| CheckpointError::invalid(model_path, e.to_string()))?;
        }
        tensors.push((spec.name.clone(), value));
    }
    Ok(Slots { optimizer, tensors })
}

/// The model file's `global_step` tensor: an I64 scalar equal to its metadata.
fn check_step_tensor(m: &Parsed<'_>, model_path: &Path) -> Result<(), CheckpointError> {
    let step_view = m
        .tensors
        .tensor(GLOBAL_STEP)
        .map_err(|_| CheckpointError::invalid(model_path, "tensor \"global_step\" is missing"))?;
    if step_view.dtype() != Dtype::I64 || !step_view.shape().is_empty() {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "tensor \"global_step\" is {:?} of shape {:?}, expected an I64 scalar (shape [])",
                step_view.dtype(),
                step_view.shape()
            ),
        ));
    }
    let step_bytes: [u8; 8] = step_view.data().try_into().map_err(|_| {
        CheckpointError::invalid(model_path, "tensor \"global_step\" is not 8 bytes")
    })?;
    let step_value = i64::from_le_bytes(step_bytes);
    if u64::try_from(step_value).ok() != Some(m.global_step) {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "tensor global_step is {step_value}, the metadata says {}: they must agree",
                m.global_step
            ),
        ));
    }
    Ok(())
}

/// The metadata's `variables` list, checked to name every tensor of the model
/// file but `global_step` and `slots` (the optimizer's and the tables'
/// tensors) exactly once.
fn listed_variables(
    m: &Parsed<'_>,
    slots: &[String],
    model_path: &Path,
) -> Result<Vec<String>, CheckpointError> {
    let listed: Vec<String> = m
        .meta
        .get("variables")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| {
            CheckpointError::invalid(
                model_path,
                "metadata \"variables\" is missing or not a JSON list of names",
            )
        })?;
    let in_file: HashSet<&str> = m
        .tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| *n != GLOBAL_STEP && !slots.iter().any(|s| s == n))
        .collect();
    let listed_set: HashSet<&str> = listed.iter().map(String::as_str).collect();
    if listed_set != in_file || listed_set.len() != listed.len() {
        let mut extra: Vec<&&str> = in_file.difference(&listed_set).collect();
        extra.sort();
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "metadata \"variables\" {listed:?} does not list the file's tensors exactly once (unlisted: {extra:?})"
            ),
        ));
    }
    Ok(listed)
}

/// A variable to read: its name, and its shape when the model is known.
type Planned<'s> = (String, Option<&'s [usize]>);

/// What to read, in which order, with which shapes: the model's variables
/// when it is known (refusing any the model lacks), else the file's list.
fn read_plan<'s>(
    listed: &[String],
    expected: Option<&'s [VarSpec]>,
    model_path: &Path,
) -> Result<Vec<Planned<'s>>, CheckpointError> {
    let Some(expected) = expected else {
        return Ok(listed.iter().map(|n| (n.clone(), None)).collect());
    };
    let want: HashSet<&str> = expected.iter().map(|v| v.name.as_str()).collect();
    let mut extra: Vec<&str> = listed
        .iter()
        .map(String::as_str)
        .filter(|n| !want.contains(n))
        .collect();
    if !extra.is_empty() {
        extra.sort_unstable();
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "holds variables {extra:?} the model does not have (a checkpoint of a different model?)"
            ),
        ));
    }
    Ok(expected
        .iter()
        .map(|v| (v.name.clone(), Some(v.shape.as_slice())))
        .collect())
}

/// Refuses an EMA file with tensors beyond the shadows of `specs` and of
/// the tables `tables` (every one of those has been read by then, so a
/// count mismatch means extras).
fn check_no_stray_shadows(
    e: &Parsed<'_>,
    specs: &[Planned<'_>],
    tables: &[String],
    ema_path: &Path,
) -> Result<(), CheckpointError> {
    if e.tensors.len() == specs.len() + tables.len() {
        return Ok(());
    }
    let want: HashSet<String> = specs
        .iter()
        .map(|(n, _)| n)
        .chain(tables)
        .map(|n| format!("{n}{EMA_SUFFIX}"))
        .collect();
    let mut extra: Vec<&str> = e
        .tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !want.contains(*n))
        .collect();
    extra.sort_unstable();
    Err(CheckpointError::invalid(
        ema_path,
        format!("holds tensors {extra:?} that shadow no variable of the model file"),
    ))
}

/// The two files of `ckpt` (a delta [`load`](super::load) resolved onto its
/// base) re-encoded whole: `format` [`FORMAT`], neither `chain` nor `base`,
/// every table whole, and the other metadata of `model`, the delta's model
/// file (the model's description, [`super::ModelMeta`]) kept, so that a
/// copy stands alone (`best/`, `dtf export`).
///
/// Errors: [`CheckpointError::Safetensors`] or [`CheckpointError::Invalid`]
/// naming `model_path`, if `model`'s header cannot be read or the state
/// would not save.
pub(super) fn whole_bytes(
    ckpt: &Checkpoint,
    model: &[u8],
    model_path: &Path,
) -> Result<(Vec<u8>, Vec<u8>), CheckpointError> {
    let (_, meta) = parse_safetensors(model, model_path)?;
    let extra = meta
        .into_iter()
        .filter(|(k, _)| !OWN_KEYS.contains(&k.as_str()) && !k.starts_with(CRC_PREFIX))
        .collect();
    let whole = Checkpoint {
        increment: None,
        ..ckpt.clone()
    };
    to_bytes(&whole, &extra).map_err(|p| CheckpointError::invalid(model_path, p))
}

/// Parses a checkpoint from the bytes of its model file and its EMA file —
/// what `restore::load` uses after reading the two files.
///
/// Verifies: both are safetensors with `format = "dtf-1"` (or
/// `"dtf-1-delta"`) and the right `kind`; every tensor's CRC-32; both files'
/// `global_step`, `chain` and `base` agree, the step with the
/// model file's `global_step` tensor; all variables F32 and finite, each with
/// a shadow of its shape. With `expected`, the variables are exactly those
/// names with those shapes, returned in that order; without, in the order the
/// file lists them.
///
/// A delta's files (format `dtf-1-delta`) parse too, verified as a whole
/// checkpoint's, but *unresolved*: its tables hold only the rows changed
/// since its base, and `increment` is `Some` with the base's step and each
/// table's removed ids ([`super::Increment::unresolved_base`]). Bytes alone
/// cannot be resolved — the base is another file —; a caller that wants the
/// state reads files with [`super::load`], or applies the delta itself.
///
/// Errors: [`CheckpointError::Safetensors`] or [`CheckpointError::Invalid`],
/// with `<model bytes>` or `<ema bytes>` for the path. Never panics.
pub fn from_bytes(
    model: &[u8],
    ema: &[u8],
    expected: Option<&[VarSpec]>,
) -> Result<Checkpoint, CheckpointError> {
    parse(
        model,
        Path::new(MODEL_BYTES),
        ema,
        Path::new(EMA_BYTES),
        expected,
    )
}

#[cfg(test)]
mod tests;
