//! Wide & deep's sparse half of a worker's step: rows pulled by id, the
//! model's gradients, rows pushed.

use super::Worker;
use super::rate::StepBuffers;
use crate::model;
use crate::model::wide_deep::{self, EMBEDDINGS, WIDE};
use crate::transport::PsCallError;
use ndarray::{ArrayView1, ArrayView2};
use tracing::debug;

impl Worker {
    /// Wide & deep's sparse half of a step: the batch's ids deduplicated,
    /// their rows pulled from the ps tasks that own them, the loss and every
    /// gradient computed (the dense ones into `buf.grads`, from the values
    /// the last pull left in `buf.params`), and the rows' gradients pushed —
    /// before the dense push, so that a sync step has them when its dense
    /// update lets the next step start.
    ///
    /// Returns the loss (`None`: nothing was computed, because a ps cannot
    /// give its rows now — down, or not initialized yet — and the caller
    /// pulls; or an error) and the pull's or the push's error, which the
    /// caller handles as a dense push's.
    pub(super) async fn sparse_step(
        &self,
        wd: &model::WideDeep,
        buf: &mut StepBuffers,
        lr: f32,
        clip_norm: f32,
        tags: &[u64],
    ) -> (Option<f32>, Result<(), PsCallError>) {
        let sparse = &mut buf.sparse;
        sparse.dedup.run(&buf.batch.categorical.ids);
        let unique = sparse.dedup.unique.as_slice();
        let rows = match self
            .cluster
            .pull_rows(&[(EMBEDDINGS, unique), (WIDE, unique)], false)
            .await
        {
            Ok(rows) => rows,
            Err(e) if e.is_unavailable() || e.needs_pull() => {
                debug!(error = %e, "Rows not pulled; pulling again.");
                return (None, Ok(()));
            }
            Err(e) => return (None, Err(e)),
        };
        let bad = |what: &str| PsCallError {
            ps: 0,
            status: tonic::Status::internal(format!(
                "the pulled rows of {what} do not fit the batch"
            )),
        };
        let Ok(embeddings) = ArrayView2::from_shape((unique.len(), wd.dim()), &rows[0]) else {
            return (None, Err(bad(EMBEDDINGS)));
        };
        if rows[1].len() != unique.len() {
            return (None, Err(bad(WIDE)));
        }
        let lookup = wide_deep::Lookup {
            offsets: &buf.batch.categorical.offsets,
            rows: &sparse.dedup.rows,
        };
        let pulled = wide_deep::Rows {
            embeddings,
            wide: ArrayView1::from(rows[1].as_slice()),
        };
        let (x, y) = (buf.batch.x.view(), buf.batch.y.as_slice());
        let loss = tokio::task::block_in_place(|| {
            let loss = wd.loss_and_grads_into(
                &buf.params,
                x,
                y,
                lookup,
                pulled,
                &mut sparse.ws,
                &mut buf.grads,
                &mut sparse.row_grads,
            );
            // One global norm over the dense gradients and the rows'.
            if clip_norm > 0.0 {
                let rows = &mut sparse.row_grads;
                let mut all: Vec<&mut [f32]> =
                    buf.grads.iter_mut().map(model::values_mut).collect();
                let contiguous = "row gradients are contiguous";
                all.push(rows.embeddings.as_slice_mut().expect(contiguous));
                all.push(rows.wide.as_slice_mut().expect(contiguous));
                model::clip_by_global_norm(&mut all, clip_norm);
            }
            crate::metrics::global().computed_here();
            loss
        });
        let g = &sparse.row_grads;
        let (emb, wide) = (
            g.embeddings
                .as_slice()
                .expect("row gradients are contiguous"),
            g.wide.as_slice().expect("row gradients are contiguous"),
        );
        let pushed = self
            .cluster
            .push_rows(
                &[(EMBEDDINGS, unique, emb), (WIDE, unique, wide)],
                lr,
                tags[0],
                self.task as u32,
            )
            .await;
        match pushed {
            // Sync, a retry of the step: its rows are in already (they go
            // before the dense push, which is still to make).
            Err(e) if e.status.code() == tonic::Code::AlreadyExists => (Some(loss), Ok(())),
            pushed => (Some(loss), pushed.map(|_| ())),
        }
    }
}
