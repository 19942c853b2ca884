//! Embedding rows (`super::super::call::TableRows`, `TableState`) to and
//! from the wire's `TableRows`: ids as they are, values as little-endian
//! f32 bytes, each length checked here, once.

use crate::model::table::Rows;
use crate::transport::call::{PushRows, RowsPage, RowsPushed, TableRows, TableState};
use crate::transport::pb;

/// Rows that arrived malformed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RowsError {
    /// Values are f32: four bytes each.
    #[error("table {table:?}: {what} of {bytes} bytes is not a whole number of f32")]
    Bytes {
        table: String,
        what: &'static str,
        bytes: usize,
    },
    /// Every row has the same width.
    #[error("table {table:?}: {what} holds {values} values for {ids} ids, not a multiple")]
    Width {
        table: String,
        what: &'static str,
        values: usize,
        ids: usize,
    },
}

impl From<RowsError> for tonic::Status {
    fn from(e: RowsError) -> Self {
        super::status(tonic::Code::InvalidArgument, e)
    }
}

/// `bytes` as f32, checked: a whole number of them, `ids × dim` for some
/// `dim` (none at all is fine: a pull's request, or no shadows).
fn floats(
    table: &str,
    what: &'static str,
    bytes: &[u8],
    ids: usize,
) -> Result<Vec<f32>, RowsError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(RowsError::Bytes {
            table: table.to_owned(),
            what,
            bytes: bytes.len(),
        });
    }
    let values = bytes.len() / 4;
    if (ids == 0 && values != 0) || (ids != 0 && !values.is_multiple_of(ids)) {
        return Err(RowsError::Width {
            table: table.to_owned(),
            what,
            values,
            ids,
        });
    }
    Ok(bytemuck::pod_collect_to_vec(bytes))
}

/// f32 values as the wire's little-endian bytes.
fn bytes(values: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

impl TryFrom<&pb::TableRows> for TableRows {
    type Error = RowsError;

    fn try_from(t: &pb::TableRows) -> Result<Self, RowsError> {
        Ok(Self {
            values: floats(&t.table, "values", &t.values, t.ids.len())?,
            table: t.table.clone(),
            ids: t.ids.clone(),
        })
    }
}

impl From<&TableRows> for pb::TableRows {
    fn from(t: &TableRows) -> Self {
        Self {
            table: t.table.clone(),
            ids: t.ids.clone(),
            values: bytes(&t.values),
            ..Default::default()
        }
    }
}

impl TryFrom<&pb::TableRows> for TableState {
    type Error = RowsError;

    fn try_from(t: &pb::TableRows) -> Result<Self, RowsError> {
        let n = t.ids.len();
        Ok(Self {
            table: t.table.clone(),
            rows: Rows {
                ids: t.ids.clone(),
                values: floats(&t.table, "values", &t.values, n)?,
                shadows: floats(&t.table, "shadows", &t.shadows, n)?,
                slots: t
                    .slots
                    .iter()
                    .map(|s| floats(&t.table, "a slot", s, n))
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

impl From<&TableState> for pb::TableRows {
    fn from(t: &TableState) -> Self {
        Self {
            table: t.table.clone(),
            ids: t.rows.ids.clone(),
            values: bytes(&t.rows.values),
            shadows: bytes(&t.rows.shadows),
            slots: t.rows.slots.iter().map(|s| bytes(s)).collect(),
        }
    }
}

impl From<&RowsPage> for pb::ReadRowsResponse {
    fn from(p: &RowsPage) -> Self {
        Self {
            rows: Some(pb::TableRows::from(&p.state)),
            total: p.total,
            generation: p.generation,
            incarnation: p.incarnation,
            delta: p.delta,
            removed: p.removed.clone(),
        }
    }
}

impl TryFrom<&pb::ReadRowsResponse> for RowsPage {
    type Error = RowsError;

    fn try_from(r: &pb::ReadRowsResponse) -> Result<Self, RowsError> {
        Ok(Self {
            state: r
                .rows
                .as_ref()
                .map(TableState::try_from)
                .transpose()?
                .unwrap_or_default(),
            total: r.total,
            generation: r.generation,
            incarnation: r.incarnation,
            delta: r.delta,
            removed: r.removed.clone(),
        })
    }
}

impl From<&pb::PushRowsRequest> for PushRows {
    fn from(r: &pb::PushRowsRequest) -> Self {
        Self {
            worker: r.worker,
            step: r.step,
            learning_rate: r.learning_rate,
        }
    }
}

impl From<RowsPushed> for pb::PushRowsResponse {
    fn from(r: RowsPushed) -> Self {
        Self {
            stale: r.stale,
            incarnation: r.incarnation,
            complete: r.complete,
        }
    }
}

impl From<&pb::PushRowsResponse> for RowsPushed {
    fn from(r: &pb::PushRowsResponse) -> Self {
        Self {
            stale: r.stale,
            incarnation: r.incarnation,
            complete: r.complete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_cross_the_wire_unchanged_and_bad_lengths_are_named() {
        let rows = TableRows {
            table: "deep/embeddings".into(),
            ids: vec![7, u64::MAX],
            values: vec![0.5, -1.0, 2.0, 3.0],
        };
        let wire = pb::TableRows::from(&rows);
        assert_eq!(TableRows::try_from(&wire), Ok(rows));
        let odd = pb::TableRows {
            values: vec![0; 6],
            ..wire.clone()
        };
        assert_eq!(
            TableRows::try_from(&odd).unwrap_err().to_string(),
            "table \"deep/embeddings\": values of 6 bytes is not a whole number of f32"
        );
        let uneven = pb::TableRows {
            values: vec![0; 12],
            ..wire
        };
        assert_eq!(
            TableRows::try_from(&uneven).unwrap_err().to_string(),
            "table \"deep/embeddings\": values holds 3 values for 2 ids, not a multiple"
        );
    }

    #[test]
    fn a_tables_state_keeps_its_shadows_and_slots() {
        let state = TableState {
            table: "wide/weights".into(),
            rows: Rows {
                ids: vec![1, 2],
                values: vec![1.0, 2.0],
                shadows: vec![0.5, 1.5],
                slots: vec![vec![0.1, 0.2]],
            },
        };
        assert_eq!(
            TableState::try_from(&pb::TableRows::from(&state)),
            Ok(state)
        );
    }
}
