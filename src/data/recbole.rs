//! RecBole's atomic files (`data.format = "recbole"`, `data.dir`): the format
//! of the RecBole library and of its example data sets (MovieLens-100k).
//!
//! `DIR/NAME.inter` holds one interaction per line, tab-separated, under a
//! typed header (`user_id:token`, `item_id:token`, `rating:float`, `timestamp:float`).
//! Where `DIR/NAME.user` and `DIR/NAME.item` exist, each interaction is joined
//! with its user's row on `user_id` and its item's on `item_id`.
//!
//! Column types: `token` is a categorical field (one id), `token_seq` a
//! multi-valued one (space-separated tokens, 0..n ids, embeddings averaged),
//! `float` a dense feature (standardized with the training split's mean and
//! std). RecBole's `float_seq` is refused by name.
//!
//! Which columns are features: every column but the label (`data.label`)
//! and the join keys' copies in `.user`/`.item`. The label column is never a
//! feature. The timestamp (`timestamp:float`) *is* a dense feature, as in
//! RecBole's own context-aware models (WideDeep, DeepFM) which embed every
//! loaded float field: rating habits drift over the years of a data set, and
//! a standardized timestamp costs one input.
//!
//! Missing values: an empty `token` cell, or a user or item that its file
//! lacks, is the token "" of each of its fields (an id of its own); an empty
//! `float` is 0 (before standardization), as DLRM fills Criteo's integers.
//!
//! Splits: `NAME.train.inter` and `NAME.test.inter` when both exist
//! (RecBole's benchmark files; a `NAME.valid.inter` is not read); otherwise
//! the seeded `data.test_fraction` split of `NAME.inter` (`split_rows`).
//!
//! Labels: with `data.threshold`, 1 when the label column's value is at
//! least the threshold, else 0 (MovieLens: rating ≥ 4); without it the
//! column must hold class indices 0–255.

use super::csv::{parse_label, quote};
use super::{Categorical, DataError, Dataset, Split, format_error, id, split_rows};
use crate::config::DataConfig;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The user file's join key, RecBole's name for it.
pub const USER_KEY: &str = "user_id";
/// The item file's join key.
pub const ITEM_KEY: &str = "item_id";

/// A column's type, from its header (`name:type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `token`: one categorical value.
    Token,
    /// `token_seq`: space-separated categorical values, 0..n.
    TokenSeq,
    /// `float`: a dense feature.
    Float,
}

/// Where a data set's atomic files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// `NAME.inter`, or `NAME.train.inter` and `NAME.test.inter`.
    pub inter: Inter,
    /// `NAME.user`, where it exists.
    pub user: Option<PathBuf>,
    /// `NAME.item`, where it exists.
    pub item: Option<PathBuf>,
}

/// The interaction file(s) of a data set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inter {
    /// One file, split by `data.test_fraction`.
    One(PathBuf),
    /// RecBole's benchmark files, split already.
    Split {
        /// `NAME.train.inter`.
        train: PathBuf,
        /// `NAME.test.inter`.
        test: PathBuf,
    },
}

/// Whether `dir` holds a `*.inter` file (`dtf local --data DIR`).
pub fn is_recbole_dir(dir: &Path) -> bool {
    inter_names(dir).is_ok_and(|n| !n.is_empty())
}

/// The `*.inter` file names in `dir`.
fn inter_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".inter") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The atomic files of the data set in `dir`.
///
/// Errors: [`DataError::Io`] when `dir` cannot be listed;
/// [`DataError::Format`] when it holds no `*.inter` file, or the files of
/// several data sets.
pub fn find(dir: &Path) -> Result<Files, DataError> {
    let names = inter_names(dir).map_err(|source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let stem = |n: &str| n.strip_suffix(".inter").unwrap_or(n).to_owned();
    let mut whole = Vec::new();
    let mut split: HashMap<String, [bool; 2]> = HashMap::new();
    for n in &names {
        let s = stem(n);
        if let Some(base) = s.strip_suffix(".train") {
            split.entry(base.to_owned()).or_default()[0] = true;
        } else if let Some(base) = s.strip_suffix(".test") {
            split.entry(base.to_owned()).or_default()[1] = true;
        } else if !s.ends_with(".valid") {
            whole.push(s);
        }
    }
    let mut pairs: Vec<String> = split
        .into_iter()
        .filter(|(_, [tr, te])| *tr && *te)
        .map(|(b, _)| b)
        .collect();
    pairs.sort();
    let (name, inter) = match (whole.as_slice(), pairs.as_slice()) {
        (_, [base]) => (
            base.clone(),
            Inter::Split {
                train: dir.join(format!("{base}.train.inter")),
                test: dir.join(format!("{base}.test.inter")),
            },
        ),
        ([one], []) => (one.clone(), Inter::One(dir.join(format!("{one}.inter")))),
        ([], []) => {
            return Err(format_error(
                dir,
                "holds no RecBole interaction file: expected NAME.inter, or \
                 NAME.train.inter and NAME.test.inter",
            ));
        }
        _ => {
            return Err(format_error(
                dir,
                format!(
                    "holds the interaction files of several data sets ({}): expected one \
                     NAME.inter, or one pair NAME.train.inter and NAME.test.inter",
                    names.join(", ")
                ),
            ));
        }
    };
    let beside = |ext: &str| Some(dir.join(format!("{name}.{ext}"))).filter(|p| p.exists());
    Ok(Files {
        inter,
        user: beside("user"),
        item: beside("item"),
    })
}

/// Loads `split` of the data set in `cfg.data.dir` (default preprocessing).
///
/// Errors: as [`load_both`].
pub fn load(cfg: &DataConfig, split: Split) -> Result<Dataset, DataError> {
    let files = find(&cfg.dir)?;
    let joins = Joins::read(&files)?;
    match &files.inter {
        Inter::Split { train, test } => {
            let path = if split == Split::Train { train } else { test };
            read_inter(path, &joins, cfg)
        }
        Inter::One(path) => {
            let all = read_inter(path, &joins, cfg)?;
            let (train, test) = split_rows(all.len(), cfg.test_fraction);
            Ok(all.select(if split == Split::Train { &train } else { &test }))
        }
    }
}

/// Every example of one interaction file (`dtf predict`; the label column
/// may be absent, its labels then 0): `path` is a
/// `NAME.inter` (or `NAME.train.inter`, `NAME.test.inter`) file, joined
/// with `NAME.user` and `NAME.item` beside it, or a directory: its one
/// `NAME.inter`, or its `NAME.test.inter` when the data set is split.
///
/// Errors: as [`load_both`].
pub fn read_all(path: &Path, cfg: &DataConfig) -> Result<Dataset, DataError> {
    let (inter, files) = if path.is_dir() {
        let files = find(path)?;
        let inter = match &files.inter {
            Inter::One(whole) => whole.clone(),
            Inter::Split { test, .. } => test.clone(),
        };
        (inter, files)
    } else {
        let dir = path.parent().unwrap_or(Path::new("."));
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        let stem = file.strip_suffix(".inter").unwrap_or(&file);
        let name = [".train", ".test", ".valid"]
            .iter()
            .find_map(|s| stem.strip_suffix(s))
            .unwrap_or(stem);
        let beside = |ext: &str| Some(dir.join(format!("{name}.{ext}"))).filter(|p| p.exists());
        let files = Files {
            inter: Inter::One(path.to_path_buf()),
            user: beside("user"),
            item: beside("item"),
        };
        (path.to_path_buf(), files)
    };
    read_inter_with(&inter, &Joins::read(&files)?, cfg, false)
}

/// Both splits of the data set in `cfg.dir`, each file read once.
///
/// Errors: [`DataError::Format`] naming the file, line and column of a row
/// with the wrong number of fields, an unknown header type, a label that is
/// not a number (or not a class index without `data.threshold`), a float
/// that is not a number, a missing label or join column; an empty file;
/// [`DataError::Io`], [`DataError::TooLarge`] as every reader.
pub fn load_both(cfg: &DataConfig) -> Result<(Dataset, Dataset), DataError> {
    let files = find(&cfg.dir)?;
    let joins = Joins::read(&files)?;
    match &files.inter {
        Inter::Split { train, test } => Ok((
            read_inter(train, &joins, cfg)?,
            read_inter(test, &joins, cfg)?,
        )),
        Inter::One(path) => {
            let all = read_inter(path, &joins, cfg)?;
            let (train, test) = split_rows(all.len(), cfg.test_fraction);
            Ok((all.select(&train), all.select(&test)))
        }
    }
}

/// One atomic file: its header and its rows' cells.
struct Atomic {
    /// The file, for errors.
    path: PathBuf,
    /// Column names and types, in file order.
    columns: Vec<(String, Kind)>,
    /// Each row's cells and its line number.
    rows: Vec<(usize, Vec<String>)>,
}

impl Atomic {
    /// Reads and checks the file at `path`.
    ///
    /// Errors: as [`load_both`].
    fn read(path: &Path) -> Result<Atomic, DataError> {
        let bytes = super::read_file(path)?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
            format_error(path, format!("line {line}: not UTF-8 text"))
        })?;
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        let header = lines.next().map(|(_, l)| l).unwrap_or_default();
        if header.trim().is_empty() {
            return Err(format_error(
                path,
                "line 1: no header: expected tab-separated columns name:type \
                 (token, token_seq or float)",
            ));
        }
        let columns = header
            .split('\t')
            .enumerate()
            .map(|(j, col)| parse_column(path, j, col))
            .collect::<Result<Vec<_>, _>>()?;
        let mut rows = Vec::new();
        for (line, l) in lines {
            if l.trim().is_empty() {
                continue;
            }
            let cells: Vec<String> = l.split('\t').map(str::to_owned).collect();
            if cells.len() != columns.len() {
                return Err(format_error(
                    path,
                    format!(
                        "line {line}: {} fields, the header has {}: every row needs one \
                         tab-separated field per column",
                        cells.len(),
                        columns.len()
                    ),
                ));
            }
            rows.push((line, cells));
        }
        Ok(Atomic {
            path: path.to_path_buf(),
            columns,
            rows,
        })
    }

    /// Where the column `name` is.
    fn position(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|(n, _)| n == name)
    }

    /// The column names, quoted, for errors.
    fn names(&self) -> String {
        let names: Vec<String> = self.columns.iter().map(|(n, _)| quote(n)).collect();
        names.join(", ")
    }
}

/// `name:type` of header column `j`.
fn parse_column(path: &Path, j: usize, col: &str) -> Result<(String, Kind), DataError> {
    let col = col.trim();
    let Some((name, kind)) = col.rsplit_once(':') else {
        return Err(format_error(
            path,
            format!(
                "line 1, column {}: {} has no type: expected name:token, name:token_seq \
                 or name:float",
                j + 1,
                quote(col)
            ),
        ));
    };
    let kind = match kind {
        "token" => Kind::Token,
        "token_seq" => Kind::TokenSeq,
        "float" => Kind::Float,
        other => {
            return Err(format_error(
                path,
                format!(
                    "line 1, column {}: unknown type {} of {}: expected token, token_seq \
                     or float{}",
                    j + 1,
                    quote(other),
                    quote(col),
                    if other == "float_seq" {
                        " (float_seq is not supported)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    };
    if name.is_empty() {
        return Err(format_error(
            path,
            format!("line 1, column {}: {} has no name", j + 1, quote(col)),
        ));
    }
    Ok((name.to_owned(), kind))
}

/// A side file (`.user`, `.item`) ready to join: its rows by key.
struct Side {
    /// The file.
    table: Atomic,
    /// The key column's position.
    key_at: usize,
    /// The key column's name.
    key: &'static str,
    /// Key value → row.
    index: HashMap<String, usize>,
}

/// The side files of a data set.
struct Joins {
    /// `.user` and `.item`, where present.
    sides: Vec<Side>,
}

impl Joins {
    /// Reads the side files `files` names.
    ///
    /// Errors: as [`Atomic::read`]; [`DataError::Format`] when a side file
    /// lacks its key column or holds a key twice.
    fn read(files: &Files) -> Result<Joins, DataError> {
        let mut sides = Vec::new();
        for (path, key) in [(&files.user, USER_KEY), (&files.item, ITEM_KEY)] {
            let Some(path) = path else { continue };
            let table = Atomic::read(path)?;
            let key_at = table.position(key).ok_or_else(|| {
                format_error(
                    path,
                    format!(
                        "line 1: no column {} to join on among {}",
                        quote(key),
                        table.names()
                    ),
                )
            })?;
            let mut index = HashMap::with_capacity(table.rows.len());
            for (r, (line, cells)) in table.rows.iter().enumerate() {
                if index.insert(cells[key_at].clone(), r).is_some() {
                    return Err(format_error(
                        path,
                        format!(
                            "line {line}, column {}: {} {} is there twice: a key names one row",
                            quote(key),
                            key,
                            quote(&cells[key_at])
                        ),
                    ));
                }
            }
            sides.push(Side {
                table,
                key_at,
                key,
                index,
            });
        }
        Ok(Joins { sides })
    }
}

/// Reads one interaction file, joined with `joins`, into a data set.
///
/// Errors: as [`load_both`].
fn read_inter(path: &Path, joins: &Joins, cfg: &DataConfig) -> Result<Dataset, DataError> {
    read_inter_with(path, joins, cfg, true)
}

/// [`read_inter`]; without `require_label`, a file without the label
/// column reads with every label 0 (examples to predict).
fn read_inter_with(
    path: &Path,
    joins: &Joins,
    cfg: &DataConfig,
    require_label: bool,
) -> Result<Dataset, DataError> {
    let inter = Atomic::read(path)?;
    let label_at = inter.position(&cfg.label);
    if label_at.is_none() && require_label {
        return Err(format_error(
            path,
            format!(
                "line 1: no label column {} among {}: name it with --label (dtf local, eval, predict) or data.label (dtf.toml)",
                quote(&cfg.label),
                inter.names()
            ),
        ));
    }
    // (side, its column) of every feature: side None is the inter file.
    let mut dense: Vec<(Option<usize>, usize)> = Vec::new();
    let mut cats: Vec<(Option<usize>, usize)> = Vec::new();
    let mut keys_at = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut add = |side: Option<usize>, t: &Atomic, skip: usize| -> Result<(), DataError> {
        for (j, (name, kind)) in t.columns.iter().enumerate() {
            if j == skip {
                continue;
            }
            if let Some(first) = seen.insert(name.clone(), t.path.clone()) {
                return Err(format_error(
                    &t.path,
                    format!(
                        "line 1: column {} is also in {}: feature names must be unique",
                        quote(name),
                        first.display()
                    ),
                ));
            }
            match kind {
                Kind::Float => dense.push((side, j)),
                Kind::Token | Kind::TokenSeq => cats.push((side, j)),
            }
        }
        Ok(())
    };
    add(None, &inter, label_at.unwrap_or(usize::MAX))?;
    for (s, side) in joins.sides.iter().enumerate() {
        let at = inter.position(side.key).ok_or_else(|| {
            format_error(
                path,
                format!(
                    "line 1: no column {} to join {} on",
                    quote(side.key),
                    side.table.path.display()
                ),
            )
        })?;
        keys_at.push(at);
        add(Some(s), &side.table, side.key_at)?;
    }
    let table = |side: Option<usize>| side.map_or(&inter, |s| &joins.sides[s].table);
    let fields = cats
        .iter()
        .map(|&(s, j)| table(s).columns[j].0.clone())
        .collect();
    let names: Vec<String> = dense
        .iter()
        .map(|&(s, j)| table(s).columns[j].0.clone())
        .collect();
    let mut categorical = Categorical::new(fields);
    let mut values = Vec::with_capacity(inter.rows.len() * dense.len());
    let mut labels = Vec::with_capacity(inter.rows.len());
    let mut row_of = vec![None; joins.sides.len()];
    for (line, cells) in &inter.rows {
        labels.push(match label_at {
            Some(at) => parse_label(path, *line as u64, &cfg.label, &cells[at], cfg.threshold)?,
            None => 0,
        });
        for (s, side) in joins.sides.iter().enumerate() {
            row_of[s] = side.index.get(&cells[keys_at[s]]).copied();
        }
        // The cell of column j of side s, with its file and line; None for
        // a key its side file lacks.
        let cell = |s: Option<usize>, j: usize| -> Option<(&Path, usize, &str)> {
            match s {
                None => Some((path, *line, cells[j].as_str())),
                Some(s) => row_of[s].map(|r| {
                    let (l, c) = &joins.sides[s].table.rows[r];
                    (joins.sides[s].table.path.as_path(), *l, c[j].as_str())
                }),
            }
        };
        for &(s, j) in &dense {
            let v = match cell(s, j) {
                None => 0.0,
                Some((_, _, "")) => 0.0,
                Some((file, l, text)) => parse_float(file, l, &table(s).columns[j].0, text)?,
            };
            values.push(v);
        }
        for &(s, j) in &cats {
            let (name, kind) = &table(s).columns[j];
            let text = cell(s, j).map_or("", |(_, _, t)| t);
            match kind {
                Kind::TokenSeq => text
                    .split(' ')
                    .filter(|t| !t.is_empty())
                    .for_each(|t| categorical.push_id(id(name, t))),
                _ => categorical.push_id(id(name, text.trim())),
            }
            categorical
                .end_cell()
                .map_err(|what| format_error(path, what))?;
        }
    }
    Dataset::with_named_columns(values, labels, names, categorical, path)
}

/// A dense cell: a finite number.
fn parse_float(path: &Path, line: usize, column: &str, text: &str) -> Result<f32, DataError> {
    match text.trim().parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format_error(
            path,
            format!(
                "line {line}, column {}: {} is not a finite number",
                quote(column),
                quote(text)
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
