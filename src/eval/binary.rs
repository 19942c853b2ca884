//! A wide & deep checkpoint scored on a test split: AUC, log loss and
//! accuracy at ½, raw and EMA, from the checkpoint's tables alone (no ps).
//! An id the tables lack — never seen in training — reads as its row's
//! initializer, as a pull from the ps would create it.

use crate::binary_metrics::{self, BinaryMetricsError};
use crate::data::Dataset;
use crate::model::table::{IdMap, Rows, TableSpec, wide_deep as tables_of};
use crate::model::wide_deep::{self, Dedup, EMBEDDINGS, Lookup, WIDE, WideDeep, sigmoid};
use ndarray::{Array1, Array2, ArrayD, ArrayView2, s};

/// Test examples scored at a time: bounds the deep part's activations.
const CHUNK: usize = 4096;

/// One set of weights' scores on a binary test split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Binary {
    /// Area under the ROC curve.
    pub auc: f32,
    /// Mean log loss.
    pub log_loss: f32,
    /// The share of examples whose probability is on their label's side of ½.
    pub accuracy: f32,
}

/// A table of a checkpoint, looked up by id.
pub struct Table<'a> {
    spec: TableSpec,
    index: IdMap<usize>,
    rows: &'a Rows,
}

impl<'a> Table<'a> {
    /// `rows` (ids ascending, as checkpoints hold them) of the table `spec`.
    pub fn new(spec: TableSpec, rows: &'a Rows) -> Self {
        let index = rows
            .ids
            .iter()
            .enumerate()
            .map(|(i, &id)| (id, i))
            .collect();
        Table { spec, index, rows }
    }

    /// Row `id` (its EMA shadow with `ema`) into `out`, `dim` values.
    fn row(&self, id: u64, ema: bool, out: &mut [f32]) {
        let dim = self.spec.dim;
        match self.index.get(&id) {
            Some(&i) => {
                let from = if ema && !self.rows.shadows.is_empty() {
                    &self.rows.shadows
                } else {
                    &self.rows.values
                };
                out.copy_from_slice(&from[i * dim..(i + 1) * dim]);
            }
            None => self.spec.init_row(id, out),
        }
    }
}

/// The two tables of `model` from a checkpoint's `tables` (name, rows);
/// a table absent is empty (every row its initializer).
pub fn tables<'a>(model: &WideDeep, saved: &'a [(String, Rows)]) -> [Table<'a>; 2] {
    static EMPTY: std::sync::OnceLock<Rows> = std::sync::OnceLock::new();
    let empty = EMPTY.get_or_init(Rows::default);
    let mut specs = tables_of(model.dim()).into_iter();
    let mut next = |name: &str| {
        let spec = specs.next().expect("wide & deep has two tables");
        debug_assert_eq!(spec.name, name);
        let rows = saved
            .iter()
            .find(|(n, _)| n == name)
            .map_or(empty, |(_, r)| r);
        Table::new(spec, rows)
    };
    [next(EMBEDDINGS), next(WIDE)]
}

/// Scores `params` (the dense variables) and `tables` on `test` (already
/// preprocessed as the checkpoint says), with the EMA shadows of the rows
/// when `ema`.
///
/// Errors: [`BinaryMetricsError`] when the test split's labels are not 0/1
/// or all of one class, or a score is NaN (a diverged model).
pub fn score(
    model: &WideDeep,
    params: &[ArrayD<f32>],
    tables: &[Table; 2],
    ema: bool,
    test: &Dataset,
) -> Result<Binary, BinaryMetricsError> {
    let logits = logits(model, params, tables, ema, test);
    let y = test.labels();
    let probabilities: Vec<f32> = logits.iter().map(|&z| sigmoid(z)).collect();
    let right = probabilities
        .iter()
        .zip(y)
        .filter(|&(&p, &l)| (p >= 0.5) == (l == 1))
        .count();
    Ok(Binary {
        auc: binary_metrics::auc(&logits, y)? as f32,
        log_loss: binary_metrics::log_loss(&probabilities, y)? as f32,
        accuracy: right as f32 / y.len().max(1) as f32,
    })
}

/// The logit of every example of `data` (preprocessed as the checkpoint
/// says) under `params` and `tables`, with the rows' EMA shadows when `ema`:
/// what [`score`] ranks and `dtf predict` prints through the sigmoid.
///
/// Panics when `data` has no categorical fields (the caller checked them
/// against the model's).
pub fn logits(
    model: &WideDeep,
    params: &[ArrayD<f32>],
    tables: &[Table; 2],
    ema: bool,
    data: &Dataset,
) -> Vec<f32> {
    let (x, _) = data.all();
    let categorical = data
        .categorical()
        .expect("a wide & deep test split has categorical fields");
    let dim = model.dim();
    let len = data.len();
    let mut logits = Vec::with_capacity(len);
    let (mut dedup, mut ws) = (Dedup::default(), wide_deep::Workspace::default());
    let fields = categorical.width();
    for start in (0..len).step_by(CHUNK) {
        let end = (start + CHUNK).min(len);
        let first = categorical.offsets[start * fields] as usize;
        let last = categorical.offsets[end * fields] as usize;
        dedup.run(&categorical.ids[first..last]);
        let offsets: Vec<u32> = categorical.offsets[start * fields..=end * fields]
            .iter()
            .map(|&o| o - first as u32)
            .collect();
        let n = dedup.unique.len();
        let mut embeddings = Array2::zeros((n, dim));
        let mut wide = Array1::zeros(n);
        for (i, &id) in dedup.unique.iter().enumerate() {
            let row = embeddings
                .row_mut(i)
                .into_slice()
                .expect("rows are contiguous");
            tables[0].row(id, ema, row);
            tables[1].row(id, ema, std::slice::from_mut(&mut wide[i]));
        }
        let xs: ArrayView2<f32> = x.slice(s![start..end, ..]);
        logits.extend(model.logits(
            params,
            xs,
            Lookup {
                offsets: &offsets,
                rows: &dedup.rows,
            },
            wide_deep::Rows {
                embeddings: embeddings.view(),
                wide: wide.view(),
            },
            &mut ws,
        ));
    }
    logits
}
