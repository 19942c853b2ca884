//! A CSV's label column: class indices, a threshold's 0/1, or class names (the
//! training file's, sorted), and the messages of a label that is none of these.

use super::*;

/// A label cell: 0/1 against `threshold`, else a class index.
///
/// Errors: [`DataError::Format`] naming the file, line and column.
pub(crate) fn parse_label(
    path: &Path,
    line: u64,
    column: &str,
    text: &str,
    threshold: Option<f64>,
) -> Result<u8, DataError> {
    let text = text.trim();
    match threshold {
        Some(t) => match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(u8::from(v >= t)),
            _ => Err(label_error(
                path,
                line,
                column,
                text,
                "a number: data.threshold (--threshold) makes a numeric label 0 or 1; \
                 class names are classes of their own: leave data.threshold unset",
            )),
        },
        None => text
            .parse::<u8>()
            .map_err(|_| not_an_index(path, line, column, text)),
    }
}

/// A regression label cell (`model.task = "regression"`): a finite f32.
///
/// Errors: [`DataError::Format`] naming the file, line, column and cell.
pub(crate) fn parse_value(
    path: &Path,
    line: u64,
    column: &str,
    text: &str,
) -> Result<f32, DataError> {
    let text = text.trim();
    match text.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(label_error(
            path,
            line,
            column,
            text,
            "a finite number: model.task = \"regression\" reads the label as a real value",
        )),
    }
}

/// The error for a label `text` that is not a class index.
pub(super) fn not_an_index(path: &Path, line: u64, column: &str, text: &str) -> DataError {
    label_error(
        path,
        line,
        column,
        text,
        "a class index: expected an integer 0–255 (or class names), or set data.threshold \
         for a binary label, or model.task = \"regression\" for a real value",
    )
}

/// The error for the label `text`: it is not `expected`.
pub(super) fn label_error(
    path: &Path,
    line: u64,
    column: &str,
    text: &str,
    expected: &str,
) -> DataError {
    format_error(
        path,
        format!(
            "line {line}, column {}: label {} is not {expected}",
            quote(column),
            quote(text)
        ),
    )
}

/// A file's label column as it is read: class indices (or 0/1 against a
/// threshold) until a label shows class names, then names.
pub(super) struct LabelColumn<'a> {
    /// What a label that is not a class index is.
    mode: LabelNames<'a>,
    /// `data.threshold`: labels are numbers made 0 or 1.
    threshold: Option<f64>,
    /// Each row's class index, while every label is one.
    indices: Vec<u8>,
    /// Once a label is a name ([`LabelNames::Detect`]): each distinct label
    /// by its number in order of first appearance, and each row's number.
    names: Option<(std::collections::HashMap<String, u16>, Vec<u16>)>,
    /// The first label that is a number but not a class index (`-1`,
    /// `4.5`), with its line: an error unless another label is text.
    numeric: Option<(u64, String)>,
    /// Whether a label is text, not a number: the labels are then names.
    text: bool,
    /// Each row's value, with [`LabelNames::Values`] (regression).
    values: Vec<f32>,
}

impl<'a> LabelColumn<'a> {
    pub(super) fn new(mode: LabelNames<'a>, threshold: Option<f64>) -> Self {
        LabelColumn {
            mode,
            threshold,
            indices: Vec::new(),
            names: None,
            numeric: None,
            text: false,
            values: Vec::new(),
        }
    }

    /// The rows' values with [`LabelNames::Values`] (regression), taken; `None` otherwise.
    pub(super) fn take_values(&mut self) -> Option<Vec<f32>> {
        matches!(self.mode, LabelNames::Values).then(|| std::mem::take(&mut self.values))
    }

    /// Adds the label `text` of line `line`.
    ///
    /// Errors: [`DataError::Format`] naming the file, line, column and label:
    /// a name not among [`LabelNames::Exactly`]'s, any label not a class
    /// index with [`LabelNames::Refused`] or not a number with a threshold,
    /// more than [`crate::data::MAX_CLASSES`] distinct names.
    pub(super) fn push(
        &mut self,
        path: &Path,
        line: u64,
        column: &str,
        text: &str,
    ) -> Result<(), DataError> {
        let text = text.trim();
        if let Some((seen, rows)) = &mut self.names {
            if text.parse::<u8>().is_err() {
                if text.parse::<f64>().is_ok() {
                    if self.numeric.is_none() {
                        self.numeric = Some((line, text.to_owned()));
                    }
                } else {
                    self.text = true;
                }
            }
            let next = seen.len();
            let n = *seen.entry(text.to_owned()).or_insert(next as u16);
            if seen.len() > crate::data::MAX_CLASSES {
                return Err(match (&self.numeric, self.text) {
                    (Some((line, text)), false) => not_an_index(path, *line, column, text),
                    _ => too_many(path, column, line),
                });
            }
            rows.push(n);
            return Ok(());
        }
        if self.threshold.is_some() {
            self.indices
                .push(parse_label(path, line, column, text, self.threshold)?);
            return Ok(());
        }
        match self.mode {
            LabelNames::Skipped => self.indices.push(0),
            LabelNames::Values => {
                self.values.push(parse_value(path, line, column, text)?);
                self.indices.push(0);
            }
            LabelNames::Exactly(names) => match names.binary_search_by(|n| n.as_str().cmp(text)) {
                Ok(i) => self.indices.push(i as u8),
                Err(_) => {
                    return Err(format_error(
                        path,
                        format!(
                            "line {line}, column {}: label {} is not one of the {} class names of \
                             the training data ({}): a model scores only the classes it was \
                             trained on",
                            quote(column),
                            quote(text),
                            names.len(),
                            shown(names)
                        ),
                    ));
                }
            },
            LabelNames::Refused => {
                self.indices
                    .push(parse_label(path, line, column, text, None)?);
            }
            LabelNames::Detect => match text.parse::<u8>() {
                Ok(i) => self.indices.push(i),
                Err(_) => {
                    // The first name: the class indices so far were names too.
                    let mut seen = std::collections::HashMap::new();
                    let mut rows = Vec::with_capacity(self.indices.len() + 1);
                    for i in std::mem::take(&mut self.indices) {
                        let next = seen.len() as u16;
                        rows.push(*seen.entry(i.to_string()).or_insert(next));
                    }
                    self.names = Some((seen, rows));
                    return self.push(path, line, column, text);
                }
            },
        }
        Ok(())
    }

    /// Each row's class index, and the classes' names in class order when
    /// the labels were names: the distinct names sorted, so that every task
    /// reading the same training file numbers them alike.
    ///
    /// Errors: [`DataError::Format`] naming the first label that is a
    /// number but not a class index (`-1`, `4.5`) when no label is text:
    /// those are numbers (a rating, a ±1 label) to threshold, not names.
    pub(super) fn finish(
        self,
        path: &Path,
        column: &str,
    ) -> Result<(Vec<u8>, Option<Vec<String>>), DataError> {
        let Some((seen, rows)) = self.names else {
            let names = match self.mode {
                LabelNames::Exactly(n) if self.threshold.is_none() => Some(n.to_vec()),
                _ => None,
            };
            return Ok((self.indices, names));
        };
        if !self.text
            && let Some((line, text)) = &self.numeric
        {
            return Err(not_an_index(path, *line, column, text));
        }
        let mut names: Vec<(String, u16)> = seen.into_iter().collect();
        names.sort();
        let mut index = vec![0u8; names.len()];
        for (i, (_, n)) in names.iter().enumerate() {
            // At most MAX_CLASSES names (push refused more): i fits a byte.
            index[usize::from(*n)] = i as u8;
        }
        Ok((
            rows.into_iter().map(|n| index[usize::from(n)]).collect(),
            Some(names.into_iter().map(|(name, _)| name).collect()),
        ))
    }
}

/// The error for a label column of more than [`crate::data::MAX_CLASSES`] names.
pub(super) fn too_many(path: &Path, column: &str, line: u64) -> DataError {
    format_error(
        path,
        format!(
            "line {line}, column {}: more than {} distinct class names: labels are held in one \
             byte, so at most {} classes (is {} the label column?)",
            quote(column),
            crate::data::MAX_CLASSES,
            crate::data::MAX_CLASSES,
            quote(column)
        ),
    )
}

/// Up to 5 names, quoted, for a message.
pub(super) fn shown(names: &[String]) -> String {
    let mut out: Vec<String> = names.iter().take(5).map(|n| quote(n)).collect();
    if names.len() > 5 {
        out.push(format!("and {} more", names.len() - 5));
    }
    out.join(", ")
}
