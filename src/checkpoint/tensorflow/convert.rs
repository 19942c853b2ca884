//! Between dtf's checkpoints and TensorFlow's: every tensor of a verified
//! dtf checkpoint under its own (TensorFlow's) name ([`from_dtf`]), and a
//! model's state taken from a TensorFlow checkpoint ([`to_checkpoint`]).

use std::path::Path;

use ndarray::{ArrayD, IxDyn};

use super::{Dtype, Tensor};
use crate::checkpoint::{Checkpoint, CheckpointError, EMA_SUFFIX, GLOBAL_STEP, Slots, Verbatim};
use crate::model::VarSpec;
use crate::optimizer::Optimizer;

/// Every tensor of both files of a dtf checkpoint (as [`crate::checkpoint::load_verbatim`]
/// read and verified them), with its name, dtype, shape and bytes unchanged:
/// the variables, `global_step`, the optimizer's slots, the embedding tables'
/// tensors and every `…/ExponentialMovingAverage` shadow.
///
/// Errors: [`CheckpointError::Safetensors`], [`CheckpointError::Invalid`]
/// for a dtype TensorFlow checkpoints from dtf do not have (neither F32 nor I64).
pub fn from_dtf(ckpt: &Verbatim, path: &Path) -> Result<Vec<Tensor>, CheckpointError> {
    let ema_path = crate::checkpoint::ema_path(path);
    let mut out = Vec::new();
    for (bytes, file) in [(&ckpt.model, path), (&ckpt.ema, ema_path.as_path())] {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|source| {
            CheckpointError::Safetensors {
                path: file.to_path_buf(),
                source,
            }
        })?;
        let mut tensors = st.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, view) in tensors {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => Dtype::F32,
                safetensors::Dtype::I64 => Dtype::I64,
                other => {
                    return Err(CheckpointError::invalid(
                        file,
                        format!("{name}: dtype {other:?}; a dtf checkpoint holds F32 and I64"),
                    ));
                }
            };
            out.push(Tensor {
                name,
                dtype,
                shape: view.shape().iter().map(|&d| d as u64).collect(),
                data: view.data().to_vec(),
            });
        }
    }
    Ok(out)
}

/// What [`to_checkpoint`] took from the TensorFlow checkpoint beyond the
/// variables, for the console line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The step it holds (0 without a `global_step`).
    pub global_step: u64,
    /// Variables whose EMA shadow it holds (the others start at the variable).
    pub shadows: usize,
    /// Of all the model's variables.
    pub variables: usize,
    /// Whether it held every slot of the configured optimizer (else they
    /// start fresh).
    pub slots: bool,
}

/// The state of a model with variables `specs` and optimizer `optimizer`
/// from the tensors of a TensorFlow checkpoint (`path`, for messages): every
/// variable, float32 with the model's shape; its
/// `<var>/ExponentialMovingAverage` if there (else the variable's value);
/// `global_step` (int64 or int32 scalar; 0 when absent); the optimizer's
/// slots under TensorFlow's names when all of them are there (else none:
/// the chief makes fresh ones). Other tensors are ignored.
///
/// Errors: [`CheckpointError::Invalid`] naming the first variable missing,
/// or of another dtype or shape (both shapes), or a bad `global_step`.
pub fn to_checkpoint(
    tensors: &[Tensor],
    specs: &[VarSpec],
    optimizer: Optimizer,
    path: &Path,
) -> Result<(Checkpoint, Taken), CheckpointError> {
    let find = |name: &str| tensors.iter().find(|t| t.name == name);
    let array =
        |name: &str, shape: &[usize], what: &str| -> Result<Option<ArrayD<f32>>, CheckpointError> {
            let Some(t) = find(name) else {
                return Ok(None);
            };
            let theirs: Vec<u64> = t.shape.clone();
            let ours: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            if theirs != ours {
                return Err(CheckpointError::invalid(
                    path,
                    format!(
                        "{name}: shape {theirs:?} in the checkpoint, but this model's {what} is \
                     {ours:?} (another --hidden or data set?)"
                    ),
                ));
            }
            let values = t.to_f32().ok_or_else(|| {
                CheckpointError::invalid(
                    path,
                    format!(
                        "{name}: {} in the checkpoint, expected float32",
                        t.dtype.tf_name()
                    ),
                )
            })?;
            // Refused here, before anything is created, not by the save that seeds the run.
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(CheckpointError::invalid(
                    path,
                    format!("{name}: value {i} is {}, not a finite number", values[i]),
                ));
            }
            Ok(ArrayD::from_shape_vec(IxDyn(shape), values).ok())
        };
    let mut variables = Vec::new();
    let mut shadows = Vec::new();
    let mut found_shadows = 0;
    for spec in specs {
        let value = array(&spec.name, &spec.shape, "variable")?.ok_or_else(|| {
            let mut names: Vec<&str> = tensors
                .iter()
                .map(|t| t.name.as_str())
                .filter(|n| !n.contains("/ExponentialMovingAverage") && *n != GLOBAL_STEP)
                .take(8)
                .collect();
            names.sort_unstable();
            CheckpointError::invalid(
                path,
                format!(
                    "{}: not in the checkpoint (it holds {}); this model needs {}",
                    spec.name,
                    names.join(", "),
                    specs
                        .iter()
                        .map(|s| format!("{} {:?}", s.name, s.shape))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        let shadow = array(
            &format!("{}{EMA_SUFFIX}", spec.name),
            &spec.shape,
            "variable",
        )?;
        found_shadows += usize::from(shadow.is_some());
        shadows.push((spec.name.clone(), shadow.unwrap_or_else(|| value.clone())));
        variables.push((spec.name.clone(), value));
    }
    let global_step = match find(GLOBAL_STEP) {
        None => 0,
        Some(t) => {
            let v = t.to_i64().filter(|v| v.len() == 1 && t.shape.is_empty());
            match v.as_deref() {
                Some(&[n]) if n >= 0 => n as u64,
                _ => {
                    return Err(CheckpointError::invalid(
                        path,
                        format!(
                            "{GLOBAL_STEP}: expected a non-negative int64 scalar, found {} {:?}",
                            t.dtype.tf_name(),
                            t.shape
                        ),
                    ));
                }
            }
        }
    };
    let mut slot_tensors = Vec::new();
    for s in optimizer.slot_specs(specs) {
        match array(&s.name, &s.shape, "slot")? {
            Some(a) => slot_tensors.push((s.name, a)),
            None => break,
        }
    }
    let complete =
        !slot_tensors.is_empty() && slot_tensors.len() == optimizer.slot_specs(specs).len();
    let slots = if complete {
        Slots {
            optimizer,
            tensors: slot_tensors,
        }
    } else {
        Slots::default()
    };
    let taken = Taken {
        global_step,
        shadows: found_shadows,
        variables: specs.len(),
        slots: complete,
    };
    Ok((
        Checkpoint {
            global_step,
            variables,
            shadows,
            slots,
            run: 0,
            shard_steps: Vec::new(),
            table_optimizers: Vec::new(),
            increment: None,
            tables: Vec::new(),
        },
        taken,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layer1/weights` [2, 3] and `layer1/biases` [3].
    fn specs() -> Vec<VarSpec> {
        crate::model::Mlp::new(&[2, 3]).unwrap().variables()
    }

    fn tf() -> Vec<Tensor> {
        vec![
            Tensor::f32("layer1/weights", &[2, 3], (0..6).map(|i| i as f32)),
            Tensor::f32("layer1/biases", &[3], [0.5, 0.25, 0.125].into_iter()),
            Tensor::f32(
                "layer1/biases/ExponentialMovingAverage",
                &[3],
                [1.0, 2.0, 3.0].into_iter(),
            ),
            Tensor {
                name: GLOBAL_STEP.into(),
                dtype: Dtype::I64,
                shape: vec![],
                data: 42i64.to_le_bytes().to_vec(),
            },
        ]
    }

    #[test]
    fn takes_variables_step_and_shadows_missing_shadows_start_at_the_variable() {
        let p = Path::new("x");
        let (c, taken) = to_checkpoint(&tf(), &specs(), Optimizer::Sgd, p).unwrap();
        assert_eq!(
            taken,
            Taken {
                global_step: 42,
                shadows: 1,
                variables: 2,
                slots: false
            }
        );
        assert_eq!(c.global_step, 42);
        assert_eq!(
            c.variables[0].1.as_slice().unwrap(),
            [0., 1., 2., 3., 4., 5.]
        );
        assert_eq!(c.shadows[0].1, c.variables[0].1);
        assert_eq!(c.shadows[1].1.as_slice().unwrap(), [1., 2., 3.]);
    }

    #[test]
    fn a_missing_or_misshapen_variable_is_named_with_both_shapes() {
        let p = Path::new("x");
        let mut wide = specs();
        wide[0].shape = vec![2, 4];
        let err = to_checkpoint(&tf(), &wide, Optimizer::Sgd, p)
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer1/weights: shape [2, 3]"), "{err}");
        assert!(err.contains("[2, 4]"), "{err}");
        let mut more = specs();
        more.push(VarSpec {
            name: "layer2/weights".into(),
            shape: vec![3, 1],
        });
        let err = to_checkpoint(&tf(), &more, Optimizer::Sgd, p)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("layer2/weights: not in the checkpoint"),
            "{err}"
        );
    }

    #[test]
    fn a_dtf_checkpoint_goes_to_tensorflow_and_back_unchanged() {
        use crate::checkpoint::fixtures::{ADAM, SMALL, sample_with_adam, saver, small_specs};
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = sample_with_adam(300, &SMALL);
        let path = saver(tmp.path(), 5).save(&ckpt).unwrap();
        let verbatim = crate::checkpoint::load_verbatim(&path, None).unwrap();
        let tensors = from_dtf(&verbatim, &path).unwrap();
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        for name in [
            "global_step",
            "layer1/weights",
            "layer1/weights/Adam",
            "layer1/weights/Adam_1",
            "beta1_power",
            "layer2/biases/ExponentialMovingAverage",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        let prefix = super::super::write(&tmp.path().join("tf"), 300, &tensors).unwrap();
        let back = super::super::read(&prefix).unwrap();
        assert_eq!(back.len(), tensors.len());
        let (c, taken) = to_checkpoint(&back, &small_specs(), ADAM, &prefix).unwrap();
        assert_eq!(
            taken,
            Taken {
                global_step: 300,
                shadows: 4,
                variables: 4,
                slots: true
            }
        );
        assert_eq!(c.variables, ckpt.variables);
        assert_eq!(c.shadows, ckpt.shadows);
        assert_eq!(c.slots, ckpt.slots);
    }

    #[test]
    fn slots_are_taken_only_when_all_are_there() {
        let p = Path::new("x");
        let adagrad = Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        };
        let mut t = tf();
        t.push(Tensor::f32(
            "layer1/weights/Adagrad",
            &[2, 3],
            std::iter::repeat_n(0.3, 6),
        ));
        let (c, taken) = to_checkpoint(&t, &specs(), adagrad, p).unwrap();
        assert!(!taken.slots);
        assert_eq!(c.slots, Slots::default());
        t.push(Tensor::f32(
            "layer1/biases/Adagrad",
            &[3],
            std::iter::repeat_n(0.4, 3),
        ));
        let (c, taken) = to_checkpoint(&t, &specs(), adagrad, p).unwrap();
        assert!(taken.slots);
        assert_eq!(c.slots.optimizer, adagrad);
        assert_eq!(c.slots.tensors.len(), 2);
    }
}
