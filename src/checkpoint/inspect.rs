//! What a checkpoint holds, for `dtf inspect`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use super::container::REMOVED_SUFFIX;
use super::format::check_header_len;
use super::format::{BASE_KEY, CHAIN_KEY, TABLES_KEY};
use super::layout::{Limit, read};
use super::restore::{ema_sibling, load, resolve};
use super::{CRC_PREFIX, CheckpointError, EMA_SUFFIX, parse_step};

// ---------------------------------------------------------------------------
// Inspection

/// One tensor as a file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Name in the file, e.g. `layer1/weights/ExponentialMovingAverage`.
    pub name: String,
    /// safetensors dtype, e.g. `F32`.
    pub dtype: String,
    /// Dimensions; `[]` for a scalar.
    pub shape: Vec<usize>,
}

/// What one safetensors file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectedFile {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its `__metadata__`, including the `crc32:<tensor>` checksums.
    pub metadata: BTreeMap<String, String>,
    /// Its tensors, sorted by name.
    pub tensors: Vec<TensorEntry>,
}

/// What a checkpoint holds, for `dtf inspect`; `Display` prints a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The model file.
    pub model: InspectedFile,
    /// The EMA file, or why it could not be read.
    pub ema: Result<InspectedFile, String>,
    /// `None` if the pair verifies as [`load`] checks it (without a model to
    /// compare to); else what is wrong.
    pub problem: Option<String>,
    /// The embedding tables the model file lists, in its order.
    pub tables: Vec<TableEntry>,
    /// The checkpoint's place in a chain of incremental checkpoints, as
    /// the model file's metadata says it; `None`: a checkpoint on its own.
    pub chain: Option<ChainEntry>,
}

/// A checkpoint's place in a chain of incremental checkpoints
/// ([`super::Increment`]), as its model file's metadata says it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChainEntry {
    /// The chain's id, as the metadata holds it (16 hex digits).
    pub chain: String,
    /// A delta's base, its step (its tables hold the rows changed since
    /// it); `None`: the chain's base, whole.
    pub base: Option<u64>,
}

/// The chain the model file's metadata names, if any.
fn chain(model: &InspectedFile) -> Option<ChainEntry> {
    let chain = model.metadata.get(CHAIN_KEY)?.clone();
    let base = model.metadata.get(BASE_KEY).and_then(|b| parse_step(b));
    Some(ChainEntry { chain, base })
}

/// One embedding table as the files declare it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TableEntry {
    /// Its name, e.g. `deep/embeddings`.
    pub name: String,
    /// Rows (ids) saved: in a delta, the rows changed since its base.
    pub rows: usize,
    /// In a delta, the ids removed since its base (`NAME/removed`); absent
    /// in a whole checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed: Option<usize>,
    /// Values per row.
    pub dim: usize,
    /// Bytes of its tensors in both files: ids, values, slots, shadows.
    pub bytes: u64,
}

/// The tables the model file's metadata lists, sized from the tensors both
/// files declare (a table's tensors are `NAME/…` in the model file and
/// `NAME/ExponentialMovingAverage` in the EMA file).
fn tables(model: &InspectedFile, ema: Option<&InspectedFile>) -> Vec<TableEntry> {
    let names: Vec<String> = model
        .metadata
        .get(TABLES_KEY)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let size = |t: &TensorEntry| {
        let width: u64 = if t.dtype == "I64" { 8 } else { 4 };
        t.shape
            .iter()
            .fold(width, |n, &d| n.saturating_mul(d as u64))
    };
    names
        .into_iter()
        .map(|name| {
            let prefix = format!("{name}/");
            let shadow = format!("{name}{EMA_SUFFIX}");
            let values = model
                .tensors
                .iter()
                .find(|t| t.name == format!("{name}/values"));
            let (rows, dim) = match values.map(|t| t.shape.as_slice()) {
                Some(&[rows, dim]) => (rows, dim),
                _ => (0, 0),
            };
            let removed_name = format!("{name}{REMOVED_SUFFIX}");
            let removed = model
                .tensors
                .iter()
                .find(|t| t.name == removed_name)
                .and_then(|t| t.shape.first().copied());
            let bytes = model
                .tensors
                .iter()
                .filter(|t| t.name.starts_with(&prefix))
                .chain(
                    ema.into_iter()
                        .flat_map(|e| &e.tensors)
                        .filter(|t| t.name == shadow),
                )
                .map(size)
                .sum();
            TableEntry {
                name,
                rows,
                removed,
                dim,
                bytes,
            }
        })
        .collect()
}

fn inspect_file(path: &Path) -> Result<InspectedFile, CheckpointError> {
    let bytes = read(path, Limit::ANY)?;
    check_header_len(&bytes, path)?;
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|source| CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let mut tensors: Vec<TensorEntry> = header
        .tensors()
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype: format!("{:?}", info.dtype),
            shape: info.shape.clone(),
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(InspectedFile {
        path: path.to_path_buf(),
        bytes: bytes.len() as u64,
        metadata: header
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        tensors,
    })
}

/// What the checkpoint at `path` (a model file, or a directory as [`resolve`]
/// takes it) holds: the tensors (name, dtype, shape) and metadata of both
/// files, and whether they verify.
///
/// Errors: those of [`resolve`]; [`CheckpointError::Io`] or
/// [`CheckpointError::Safetensors`] if the model file cannot be read or its
/// header parsed. A damaged EMA file or failed verification is reported in
/// the [`Inspection`], not as an error.
pub fn inspect(path: &Path) -> Result<Inspection, CheckpointError> {
    let path = resolve(path)?;
    let (ema_path, _) = ema_sibling(&path)?;
    let model = inspect_file(&path)?;
    let ema = inspect_file(&ema_path).map_err(|e| e.to_string());
    let problem = load(&path, None).err().map(|e| e.to_string());
    let tables = tables(&model, ema.as_ref().ok());
    let chain = chain(&model);
    Ok(Inspection {
        model,
        ema,
        problem,
        tables,
        chain,
    })
}

impl fmt::Display for InspectedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ({} bytes)", self.path.display(), self.bytes)?;
        let meta: Vec<String> = self
            .metadata
            .iter()
            .filter(|(k, _)| !k.starts_with(CRC_PREFIX))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(f, "  metadata: {}", meta.join(" "))?;
        let width = self
            .tensors
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(
            f,
            "  {:<width$}  {:<5}  {:<12}  crc32",
            "name", "dtype", "shape"
        )?;
        for t in &self.tensors {
            let crc = self
                .metadata
                .get(&format!("{CRC_PREFIX}{}", t.name))
                .map_or("-", String::as_str);
            let shape = format!("{:?}", t.shape);
            writeln!(
                f,
                "  {:<width$}  {:<5}  {shape:<12}  {crc}",
                t.name, t.dtype
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.model)?;
        match &self.ema {
            Ok(ema) => write!(f, "{ema}")?,
            Err(e) => writeln!(f, "EMA file: {e}")?,
        }
        let delta = self.chain.as_ref().and_then(|c| c.base);
        match &self.chain {
            None => {}
            Some(ChainEntry { chain, base: None }) => {
                writeln!(f, "chain {chain}: its base, whole")?;
            }
            Some(ChainEntry {
                chain,
                base: Some(b),
            }) => writeln!(
                f,
                "chain {chain}: a delta on base {}, its tables the rows changed since it",
                super::model_file_name(*b)
            )?,
        }
        if !self.tables.is_empty() {
            let width = self.tables.iter().map(|t| t.name.len()).max().unwrap_or(0);
            let rows = if delta.is_some() { "changed" } else { "rows" };
            let removed = |r: String| {
                if delta.is_some() {
                    format!("  {r:>10}")
                } else {
                    String::new()
                }
            };
            writeln!(f, "tables:")?;
            writeln!(
                f,
                "  {:<width$}  {rows:>10}{}  {:>5}  {:>12}",
                "name",
                removed("removed".into()),
                "dim",
                "bytes"
            )?;
            for t in &self.tables {
                writeln!(
                    f,
                    "  {:<width$}  {:>10}{}  {:>5}  {:>12}",
                    t.name,
                    t.rows,
                    removed(t.removed.unwrap_or(0).to_string()),
                    t.dim,
                    t.bytes
                )?;
            }
        }
        match &self.problem {
            None => writeln!(f, "verification: ok"),
            Some(p) => writeln!(f, "verification: FAILED: {p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::GLOBAL_STEP;
    use super::super::fixtures::*;
    use super::*;
    use std::fs;

    #[test]
    fn inspect_lists_both_files() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(200, &SMALL)).unwrap();
        let ins = inspect(tmp.path()).unwrap();
        assert_eq!(ins.problem, None);
        assert_eq!(ins.model.metadata["global_step"], "200");
        assert_eq!(ins.model.metadata["kind"], "variables");
        let step = ins
            .model
            .tensors
            .iter()
            .find(|t| t.name == GLOBAL_STEP)
            .unwrap();
        assert_eq!(
            (step.dtype.as_str(), step.shape.as_slice()),
            ("I64", &[][..])
        );
        let ema = ins.ema.as_ref().unwrap();
        assert_eq!(ema.tensors.len(), 4);
        assert_eq!(ema.metadata["kind"], "ema");
        let text = ins.to_string();
        assert!(
            text.contains("layer1/weights/ExponentialMovingAverage  F32    [4, 3]"),
            "{text}"
        );
        assert!(text.contains("verification: ok"), "{text}");

        damage(tmp.path(), Damage::MissingEma);
        let ins = inspect(tmp.path()).unwrap();
        assert!(ins.ema.is_err());
        assert!(ins.to_string().contains("verification: FAILED"));
    }
    #[test]
    fn inspect_shows_a_delta_its_base_and_the_rows_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&chain_base(40)).unwrap();
        s.save(&delta_of(&chain_base(40), &chain_full(60))).unwrap();
        let ins = inspect(tmp.path()).unwrap();
        assert_eq!(ins.problem, None);
        let chain = ins.chain.as_ref().unwrap();
        assert_eq!(
            (chain.chain.as_str(), chain.base),
            ("5eed0000000000c4", Some(40))
        );
        let deep = &ins.tables[0];
        assert_eq!((deep.rows, deep.removed, deep.dim), (3, Some(1), 3));
        let json = serde_json::to_value(deep).unwrap();
        assert_eq!(json["removed"], 1);
        let text = ins.to_string();
        assert!(
            text.contains("chain 5eed0000000000c4: a delta on base model.ckpt-40.safetensors"),
            "{text}"
        );
        assert!(text.contains("changed     removed"), "{text}");

        let base = inspect(&tmp.path().join("model.ckpt-40.safetensors")).unwrap();
        assert_eq!(base.chain.as_ref().unwrap().base, None);
        assert_eq!(base.tables[0].removed, None);
        assert!(
            serde_json::to_value(&base.tables[0])
                .unwrap()
                .get("removed")
                .is_none()
        );
        assert!(base.to_string().contains("its base, whole"));

        // Without its base the delta does not verify, and says why.
        fs::remove_file(tmp.path().join("model.ckpt-40.safetensors")).unwrap();
        let ins = inspect(&tmp.path().join("model.ckpt-60.safetensors")).unwrap();
        let problem = ins.problem.unwrap();
        assert!(
            problem.contains("its base model.ckpt-40.safetensors is missing"),
            "{problem}"
        );
    }
}
