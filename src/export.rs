//! `dtf export`: a checkpoint as an ONNX model that any ONNX runtime serves
//! (`--onnx`), or as a TensorFlow V2 checkpoint (`--tf-checkpoint`,
//! [`write_tf_checkpoint`]; the format is `checkpoint::tensorflow`'s).
//!
//! The graph (opset 13) takes `input`, float32 `[batch, features]` in the
//! data's own units (pixels 0–255, or the CSV's numbers), applies the
//! checkpoint's preprocessing (`Div` by 255, or `Sub` the mean and `Div` by
//! the std), then per layer `MatMul`, `Add` and the activation (none after the last),
//! and ends in `Softmax` over the classes: output `probabilities`, float32
//! `[batch, classes]`. A regression model (`model.task = "regression"`) ends in the last
//! `Add` itself, through an `Identity` named for its output: `prediction`, float32
//! `[batch, 1]`, the predicted value (no Softmax, no ArgMax). The weights are the EMA shadows unless `raw`. The
//! protobuf types come from `proto/onnx/onnx.proto`, a subset of ONNX's own.

use crate::data::Preprocessing;
use crate::model::Activation;
use crate::predict::Trained;
use prost::Message;
use std::path::Path;

/// Generated from `proto/onnx/onnx.proto`; only this module needs it.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// The ONNX operator set the graph uses.
pub const OPSET: i64 = 13;
/// The IR version of that opset (ONNX's versioning table: opset 13 is IR 7).
pub const IR_VERSION: i64 = 7;
/// The graph's input.
pub const INPUT: &str = "input";
/// The graph's output.
pub const OUTPUT: &str = "probabilities";
/// A regression model's graph's output: the predicted value.
pub const PREDICTION: &str = "prediction";

/// Errors writing an ONNX model or a TensorFlow checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The checkpoint could not be read, or the TensorFlow one written.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The file could not be written.
    #[error("{path}: cannot write: {source}")]
    Io {
        /// The output file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The output would overwrite the checkpoint it is made from.
    #[error(
        "{output}: is the checkpoint being exported ({input}); refusing to overwrite it: \
         name another file, e.g. model.onnx"
    )]
    SameAsInput {
        /// The output file.
        output: std::path::PathBuf,
        /// The input file it is.
        input: std::path::PathBuf,
    },
}

/// The ONNX model of `model`, with the EMA weights (`ema`) or the trained ones.
pub fn onnx_model(model: &Trained, ema: bool) -> pb::ModelProto {
    let entry = |k: &str, v: String| pb::StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v),
    };
    pb::ModelProto {
        ir_version: Some(IR_VERSION),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        producer_name: Some("dtf".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        model_version: Some(model.global_step as i64),
        doc_string: Some(format!(
            "dtf MLP {:?} from {} (global step {}), {} weights",
            model.meta.layers,
            model.file.display(),
            model.global_step,
            if ema { "EMA" } else { "raw" }
        )),
        graph: Some(graph(model, ema)),
        metadata_props: vec![
            entry("global_step", model.global_step.to_string()),
            entry("weights", if ema { "ema" } else { "raw" }.into()),
            entry(
                "preprocessing",
                serde_json::to_string(&model.meta.preprocessing).unwrap_or_default(),
            ),
        ],
        ..Default::default()
    }
}

/// Hidden layer `layer`'s activation of `x`: one node (Relu, Tanh, Sigmoid), or GELU
/// from opset 13's operators, `x/2 · (1 + Erf(x/√2))` as `tf.nn.gelu` computes it.
fn activation(g: &mut Graph, act: Activation, layer: &str, x: &str) -> String {
    let op = match act {
        Activation::Relu => "Relu",
        Activation::Tanh => "Tanh",
        Activation::Sigmoid => "Sigmoid",
        Activation::Gelu => {
            let name = |part: &str| format!("{layer}/gelu/{part}");
            let c = g.constant(
                &name("one_over_sqrt2"),
                &[],
                vec![std::f32::consts::FRAC_1_SQRT_2],
            );
            let one = g.constant(&name("one"), &[], vec![1.0]);
            let half = g.constant(&name("one_half"), &[], vec![0.5]);
            let t = g.node("Mul", &name("scaled"), &[x, &c]);
            let e = g.node("Erf", &name("erf"), &[&t]);
            let s = g.node("Add", &name("one_plus_erf"), &[&e, &one]);
            let h = g.node("Mul", &name("times_x"), &[x, &s]);
            return g.node("Mul", &name("out"), &[&h, &half]);
        }
    };
    g.node(op, &format!("{layer}/{}", act.name()), &[x])
}

/// The graph: preprocessing, then each layer's MatMul, Add and activation,
/// then Softmax (a regression model: the last layer's output as it is).
fn graph(model: &Trained, ema: bool) -> pb::GraphProto {
    let mut g = Graph::default();
    let features = model.mlp.inputs() as i64;
    let mut x = INPUT.to_owned();
    match &model.meta.preprocessing {
        // Dividing by 1 changes nothing: no node.
        Preprocessing::Scale { divisor } if *divisor == 1.0 => {}
        Preprocessing::Scale { divisor } => {
            let d = g.constant("scale/divisor", &[], vec![*divisor]);
            x = g.node("Div", "scale", &[&x, &d]);
        }
        Preprocessing::Standardize { mean, std } => {
            let m = g.constant("standardize/mean", &[features], mean.clone());
            let s = g.constant("standardize/std", &[features], std.clone());
            let centred = g.node("Sub", "standardize/sub", &[&x, &m]);
            x = g.node("Div", "standardize/div", &[&centred, &s]);
        }
    }
    let params = model.params(ema);
    let specs = model.mlp.variables();
    let layers = params.len() / 2;
    for l in 0..layers {
        let (w, b) = (&params[2 * l], &params[2 * l + 1]);
        let (wn, bn) = (&specs[2 * l].name, &specs[2 * l + 1].name);
        let dims: Vec<i64> = w.shape().iter().map(|&d| d as i64).collect();
        let w = g.constant(wn, &dims, w.iter().copied().collect());
        let b = g.constant(bn, &[dims[1]], b.iter().copied().collect());
        let layer = wn.trim_end_matches("/weights");
        let z = g.node("MatMul", &format!("{layer}/matmul"), &[&x, &w]);
        x = g.node("Add", &format!("{layer}/add"), &[&z, &b]);
        if l + 1 < layers {
            x = activation(&mut g, model.mlp.hidden().activation, layer, &x);
        }
    }
    // A regression model's output is the prediction itself; a classifier's, Softmax.
    let (output, width_name, node) = if model.meta.task == crate::config::ModelTask::Regression {
        let node = pb::NodeProto {
            input: vec![x],
            output: vec![PREDICTION.to_owned()],
            name: Some("prediction".into()),
            op_type: Some("Identity".into()),
            ..Default::default()
        };
        (PREDICTION, "outputs", node)
    } else {
        let node = pb::NodeProto {
            input: vec![x],
            output: vec![OUTPUT.to_owned()],
            name: Some("softmax".into()),
            op_type: Some("Softmax".into()),
            attribute: vec![pb::AttributeProto {
                name: Some("axis".into()),
                r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
                i: Some(1),
                ..Default::default()
            }],
            ..Default::default()
        };
        (OUTPUT, "classes", node)
    };
    g.nodes.push(node);
    pb::GraphProto {
        node: g.nodes,
        name: Some("dtf_mlp".into()),
        initializer: g.initializers,
        input: vec![value_info(INPUT, "features", features)],
        output: vec![value_info(output, width_name, model.mlp.classes() as i64)],
        ..Default::default()
    }
}

/// Writes [`onnx_model`] to `path` atomically (temp file beside it, fsync,
/// rename): on a full disk the previous file at `path` stays whole. A
/// `path` that is the checkpoint's model or EMA file is refused.
///
/// Errors: [`ExportError::SameAsInput`], [`ExportError::Io`].
pub fn write_onnx(model: &Trained, ema: bool, path: &Path) -> Result<(), ExportError> {
    let inputs = [model.file.clone(), crate::checkpoint::ema_path(&model.file)];
    if let Some(input) = inputs.iter().find(|i| crate::files::same_file(path, i)) {
        return Err(ExportError::SameAsInput {
            output: path.to_path_buf(),
            input: input.clone(),
        });
    }
    let bytes = onnx_model(model, ema).encode_to_vec();
    crate::files::write_atomic(path, &bytes, 0o644).map_err(|source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// What [`write_tf_checkpoint`] wrote.
#[derive(Debug, Clone)]
pub struct TfWritten {
    /// The dtf checkpoint's model file it was made from.
    pub source: std::path::PathBuf,
    /// `DIR/model.ckpt-N`.
    pub prefix: std::path::PathBuf,
    /// N.
    pub global_step: u64,
    /// Tensors written.
    pub tensors: usize,
    /// Whether the optimizer's slots were among them.
    pub slots: bool,
}

/// Writes the dtf checkpoint `checkpoint` (a model file, or a directory: its
/// newest, as `dtf eval` picks it) into `dir` as the TensorFlow V2
/// checkpoint `dir/model.ckpt-N` (N its global_step) with every tensor of
/// both its files under its own name — which is TensorFlow's
/// (`layer1/weights`, `global_step`, `<var>/ExponentialMovingAverage`,
/// `<var>/Adam`, …) — bit for bit, and `dir/checkpoint` naming it. The
/// checkpoint is verified first (CRCs, shapes), so a damaged one is never
/// exported.
///
/// Errors: [`ExportError::Checkpoint`] (unreadable, damaged, or a write failed).
pub fn write_tf_checkpoint(checkpoint: &Path, dir: &Path) -> Result<TfWritten, ExportError> {
    use crate::checkpoint::{self, tensorflow};
    let source = checkpoint::resolve(checkpoint)?;
    let verbatim = checkpoint::load_verbatim(&source, None)?;
    let tensors = tensorflow::from_dtf(&verbatim, &source)?;
    let step = verbatim.checkpoint.global_step;
    let prefix = tensorflow::write(dir, step, &tensors)?;
    Ok(TfWritten {
        source,
        prefix,
        global_step: step,
        tensors: tensors.len(),
        slots: !verbatim.checkpoint.slots.tensors.is_empty(),
    })
}

/// A float32 `[batch, width]` tensor's description.
fn value_info(name: &str, width_name: &str, width: i64) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{Dimension, dimension::Value};
    let dim = |v: Value| Dimension {
        value: Some(v),
        denotation: None,
    };
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(pb::tensor_proto::DataType::Float as i32),
                shape: Some(pb::TensorShapeProto {
                    dim: vec![
                        dim(Value::DimParam("batch".into())),
                        dim(Value::DimValue(width)),
                    ],
                }),
            })),
            denotation: None,
        }),
        doc_string: Some(format!("[batch, {width_name}]")),
    }
}

/// Nodes and initializers being collected.
#[derive(Default)]
struct Graph {
    /// In execution order.
    nodes: Vec<pb::NodeProto>,
    /// Constant tensors (weights, preprocessing).
    initializers: Vec<pb::TensorProto>,
}

impl Graph {
    /// A float32 constant; returns its name.
    fn constant(&mut self, name: &str, dims: &[i64], values: Vec<f32>) -> String {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializers.push(pb::TensorProto {
            dims: dims.to_vec(),
            data_type: Some(pb::tensor_proto::DataType::Float as i32),
            name: Some(name.into()),
            raw_data: Some(raw),
            ..Default::default()
        });
        name.to_owned()
    }

    /// A node of `op` on `inputs`; returns its output's name (the node's).
    fn node(&mut self, op: &str, name: &str, inputs: &[&str]) -> String {
        self.nodes.push(pb::NodeProto {
            input: inputs.iter().map(|s| (*s).to_owned()).collect(),
            output: vec![name.to_owned()],
            name: Some(name.to_owned()),
            op_type: Some(op.to_owned()),
            ..Default::default()
        });
        name.to_owned()
    }
}
