//! What may be saved: a state that would not load back (a diverged run's
//! NaNs, a reserved name, slots that are not the optimizer's) is refused at
//! save time instead of becoming the newest checkpoint.

use std::collections::{HashMap, HashSet};

use ndarray::ArrayD;

use super::super::container;
use super::{Checkpoint, EMA_SUFFIX, GLOBAL_STEP, var_specs};
use crate::optimizer;

/// Checks that `ckpt` would load back, so that a bad state (a diverged run's
/// NaNs) is refused at save time instead of becoming the newest checkpoint.
pub(super) fn check_saveable(ckpt: &Checkpoint) -> Result<(), String> {
    if i64::try_from(ckpt.global_step).is_err() {
        return Err(format!(
            "global_step {} does not fit the on-disk int64",
            ckpt.global_step
        ));
    }
    let mut names = HashSet::new();
    for (name, value) in &ckpt.variables {
        if name == GLOBAL_STEP || name.ends_with(EMA_SUFFIX) || name.is_empty() {
            return Err(format!(
                "refusing to save a variable named {name:?}: the name is reserved"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("refusing to save: variable {name:?} appears twice"));
        }
        if let Some(i) = value.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "refusing to save: variable {name:?} holds a non-finite value at flat index {i}"
            ));
        }
    }
    let shadows: HashMap<&str, &ArrayD<f32>> =
        ckpt.shadows.iter().map(|(n, a)| (n.as_str(), a)).collect();
    if shadows.len() != ckpt.shadows.len() {
        return Err("refusing to save: a shadow appears twice".into());
    }
    for (name, value) in &ckpt.variables {
        let Some(shadow) = shadows.get(name.as_str()) else {
            return Err(format!(
                "refusing to save: variable {name:?} has no EMA shadow"
            ));
        };
        if shadow.shape() != value.shape() {
            return Err(format!(
                "refusing to save: shadow of {name:?} has shape {:?}, the variable {:?}",
                shadow.shape(),
                value.shape()
            ));
        }
        if let Some(i) = shadow.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "refusing to save: shadow of {name:?} holds a non-finite value at flat index {i}"
            ));
        }
    }
    if let Some((name, _)) = ckpt
        .shadows
        .iter()
        .find(|(n, _)| !names.contains(n.as_str()))
    {
        return Err(format!(
            "refusing to save: shadow {name:?} belongs to no variable"
        ));
    }
    check_slots_saveable(ckpt)?;
    check_tables_saveable(ckpt)?;
    check_increment_saveable(ckpt)
}

/// A chain's base is whole (no removed ids); a delta holds tables (the MLP
/// never writes one: its state is all dense), one list of removed ids per
/// table — a delta [`load`](crate::checkpoint::load) resolved has none, its
/// tables whole: saved as a delta on the same base it would keep the ids
/// dropped since — each list sorted and apart from its table's rows, and
/// its base is older than itself (the base's files are other files).
fn check_increment_saveable(ckpt: &Checkpoint) -> Result<(), String> {
    let Some(increment) = &ckpt.increment else {
        return Ok(());
    };
    let Some(base) = increment.base else {
        if increment.removed.is_empty() {
            return Ok(());
        }
        return Err(
            "refusing to save: a chain's base with removed ids (only a delta has them)".into(),
        );
    };
    if ckpt.tables.is_empty() {
        return Err(
            "refusing to save a delta without tables: only embedding tables are saved \
             incrementally (save it whole)"
                .into(),
        );
    }
    if increment.removed.len() != ckpt.tables.len() {
        return Err(format!(
            "refusing to save a delta with {} lists of removed ids for {} tables (one per \
             table; a delta resolved onto its base has none and is saved whole)",
            increment.removed.len(),
            ckpt.tables.len()
        ));
    }
    if base >= ckpt.global_step {
        return Err(format!(
            "refusing to save a delta at step {} on base {base}: a base is older than its deltas",
            ckpt.global_step
        ));
    }
    for ((name, rows), removed) in ckpt.tables.iter().zip(&increment.removed) {
        container::check_removed(name, removed, &rows.ids)
            .map_err(|e| format!("refusing to save: {e}"))?;
    }
    Ok(())
}

/// The slots must be exactly the optimizer's for the variables, in order,
/// finite, and the non-slot scalars usable.
fn check_slots_saveable(ckpt: &Checkpoint) -> Result<(), String> {
    let specs = var_specs(&ckpt.variables);
    let want = ckpt.slots.optimizer.slot_specs(&specs);
    let got: Vec<&str> = ckpt.slots.tensors.iter().map(|(n, _)| n.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|s| s.name.as_str()).collect();
    if got != want_names {
        return Err(format!(
            "refusing to save: slots {got:?} are not those of {} for these variables ({want_names:?})",
            ckpt.slots.optimizer.name()
        ));
    }
    for (spec, (name, value)) in want.iter().zip(&ckpt.slots.tensors) {
        if value.shape() != spec.shape.as_slice() {
            return Err(format!(
                "refusing to save: slot {name:?} has shape {:?}, expected {:?}",
                value.shape(),
                spec.shape
            ));
        }
        if let Some(i) = value.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "refusing to save: slot {name:?} holds a non-finite value at flat index {i}"
            ));
        }
        if spec.var.is_none() {
            optimizer::check_non_slot(name, value.iter().copied().next().unwrap_or(f32::NAN))
                .map_err(|e| format!("refusing to save: {e}"))?;
        }
    }
    Ok(())
}

/// Each table must load back: a name of its own (no variable's or slot's
/// tensor under it), ids strictly ascending, every array `ids × dim`
/// (shadows may be empty: the values), the optimizer's slots, finite.
fn check_tables_saveable(ckpt: &Checkpoint) -> Result<(), String> {
    let mut names = HashSet::new();
    if let Some((stray, _)) = ckpt
        .table_optimizers
        .iter()
        .find(|(n, _)| !ckpt.tables.iter().any(|(t, _)| t == n))
    {
        return Err(format!(
            "refusing to save: an optimizer for table {stray:?}, which the checkpoint does not hold"
        ));
    }
    for (name, rows) in &ckpt.tables {
        if name.is_empty() || name == GLOBAL_STEP || name.ends_with(EMA_SUFFIX) {
            return Err(format!(
                "refusing to save a table named {name:?}: the name is reserved"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("refusing to save: table {name:?} appears twice"));
        }
        let prefix = format!("{name}/");
        if let Some(other) = ckpt
            .variables
            .iter()
            .chain(&ckpt.slots.tensors)
            .map(|(n, _)| n)
            .find(|n| *n == name || n.starts_with(&prefix))
        {
            return Err(format!(
                "refusing to save: table {name:?} and tensor {other:?} would share names"
            ));
        }
        if let Some(i) = rows.ids.windows(2).position(|w| w[0] >= w[1]) {
            return Err(format!(
                "refusing to save: table {name:?} has ids not strictly ascending at row {}",
                i + 1
            ));
        }
        let n = rows.ids.len();
        let whole = if n == 0 {
            rows.values.is_empty()
        } else {
            rows.values.len().is_multiple_of(n)
        };
        if !whole {
            return Err(format!(
                "refusing to save: table {name:?} has {} values for {n} ids, not a whole number of rows",
                rows.values.len()
            ));
        }
        let rule = ckpt.table_optimizer(name);
        let slot_names = rule.map_or(&[][..], |o| o.slot_names());
        if rows.slots.len() != slot_names.len() {
            return Err(format!(
                "refusing to save: table {name:?} has {} slot arrays, {} has {slot_names:?}",
                rows.slots.len(),
                rule.map_or(ckpt.slots.optimizer.name(), |o| o.name())
            ));
        }
        let arrays = [("values", &rows.values)]
            .into_iter()
            .chain((!rows.shadows.is_empty()).then_some(("shadows", &rows.shadows)))
            .chain(slot_names.iter().copied().zip(&rows.slots));
        for (what, a) in arrays {
            if a.len() != rows.values.len() {
                return Err(format!(
                    "refusing to save: table {name:?}: {what} holds {} values, its values {}",
                    a.len(),
                    rows.values.len()
                ));
            }
            if let Some(i) = a.iter().position(|x| !x.is_finite()) {
                return Err(format!(
                    "refusing to save: table {name:?}: {what} holds a non-finite value at flat index {i}"
                ));
            }
        }
    }
    Ok(())
}
