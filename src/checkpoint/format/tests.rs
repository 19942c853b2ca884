//! The file format's unit tests: round trips, and each kind of damage refused.

use super::super::fixtures::*;
use super::*;
use crate::checkpoint::{DELTA_FORMAT, MAX_HEADER_BYTES};
use crate::model::table::Rows;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn valid_pair() -> (Vec<u8>, Vec<u8>) {
    to_bytes(&sample(77, &SMALL), &BTreeMap::new()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(model in proptest::collection::vec(any::<u8>(), 0..512),
                                   ema in proptest::collection::vec(any::<u8>(), 0..512)) {
        let (good_model, good_ema) = valid_pair();
        prop_assert!(from_bytes(&model, &ema, None).is_err());
        prop_assert!(from_bytes(&model, &good_ema, Some(&small_specs())).is_err());
        prop_assert!(from_bytes(&good_model, &ema, Some(&small_specs())).is_err());
    }

    #[test]
    fn mutated_checkpoints_are_rejected_or_unchanged(
        in_ema in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (mut model, mut ema) = valid_pair();
        let target = if in_ema { &mut ema } else { &mut model };
        for (at, byte) in &flips {
            let i = at.index(target.len());
            target[i] = *byte;
        }
        if let Some(cut) = cut {
            let len = cut.index(target.len());
            target.truncate(len);
        }
        for expected in [None, Some(small_specs())] {
            // Some header bytes are slack (padding spaces may become other
            // whitespace): if it loads, the content must be the original.
            if let Ok(c) = from_bytes(&model, &ema, expected.as_deref()) {
                prop_assert_eq!(c, sample(77, &SMALL));
            }
        }
    }

    #[test]
    fn header_json_with_arbitrary_values_never_panics(
        dtype in prop::sample::select(vec!["F32", "I64", "F16", "BOOL", "U8", "F4"]),
        shape in proptest::collection::vec(0usize..6, 0..4),
        step in prop::sample::select(vec!["77", "-1", "", "007", "99999999999999999999"]),
    ) {
        // A well-formed safetensors file whose content is wrong in various ways.
        let n: usize = shape.iter().product();
        let header = format!(
            r#"{{"__metadata__":{{"format":"dtf-1","kind":"variables","global_step":"{step}","variables":"[\"layer1/weights\"]"}},"layer1/weights":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[0,{n}]}}}}"#
        );
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend(std::iter::repeat_n(0u8, n));
        let (_, ema) = valid_pair();
        prop_assert!(from_bytes(&bytes, &ema, None).is_err());
    }
}

/// A well-formed safetensors file (no tensors) whose header is padded
/// with JSON metadata to `len` bytes.
fn with_header_of(len: usize) -> Vec<u8> {
    let head = r#"{"__metadata__":{"pad":""#;
    let tail = r#""}}"#;
    let pad = len - head.len() - tail.len();
    let mut header = String::with_capacity(len);
    header.push_str(head);
    header.extend(std::iter::repeat_n('x', pad));
    header.push_str(tail);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes
}

#[test]
fn slots_round_trip_under_tensorflow_names() {
    let c = sample_with_adam(5, &SMALL);
    let (model, ema) = to_bytes(&c, &BTreeMap::new()).unwrap();
    assert_eq!(from_bytes(&model, &ema, Some(&small_specs())).unwrap(), c);
    // Without a model (dtf eval, inspect) they load, listed apart from the variables.
    let back = from_bytes(&model, &ema, None).unwrap();
    assert_eq!(back.variables.len(), 4);
    assert_eq!(back.slots, c.slots);
    let (tensors, meta) = parse_safetensors(&model, Path::new("m")).unwrap();
    for name in [
        "layer1/weights/Adam",
        "layer2/biases/Adam_1",
        "beta1_power",
        "beta2_power",
    ] {
        assert!(tensors.tensor(name).is_ok(), "{name} missing");
    }
    assert!(meta["optimizer"].contains("\"name\":\"adam\""), "{meta:?}");
    assert!(meta["optimizer"].contains("\"beta2\":0.999"), "{meta:?}");
}

#[test]
fn slots_that_do_not_match_their_optimizer_are_refused() {
    let mut c = sample_with_adam(5, &SMALL);
    c.slots.tensors.pop();
    assert!(to_bytes(&c, &BTreeMap::new()).is_err_and(|e| e.contains("not those of adam")));
    let mut c = sample_with_adam(5, &SMALL);
    // After the 4 variables' 8 slots: beta1_power.
    c.slots.tensors[8].1.fill(1.0);
    assert!(to_bytes(&c, &BTreeMap::new()).is_err_and(|e| e.contains("beta1_power")));
    // Written anyway, a file whose slots disagree with its optimizer is refused on load.
    let mut c = sample_with_adam(5, &SMALL);
    c.slots.optimizer = crate::optimizer::Optimizer::Momentum {
        momentum: 0.9,
        use_nesterov: false,
    };
    let (model, ema) = encode(&c).unwrap();
    let err = from_bytes(&model, &ema, None).unwrap_err().to_string();
    assert!(err.contains("the slots of momentum"), "{err}");
}

#[test]
fn a_huge_header_is_refused_before_parsing() {
    let (_, ema) = valid_pair();
    let huge = with_header_of(MAX_HEADER_BYTES as usize + 1);
    match from_bytes(&huge, &ema, None) {
        Err(CheckpointError::HeaderTooLarge { bytes, .. }) => {
            assert_eq!(bytes, MAX_HEADER_BYTES + 1)
        }
        other => panic!("{other:?}"),
    }
    // At the bound it parses (and fails later, for what it lacks).
    let at_bound = with_header_of(MAX_HEADER_BYTES as usize);
    assert!(matches!(
        from_bytes(&at_bound, &ema, None),
        Err(CheckpointError::Invalid { .. })
    ));
}

#[test]
fn a_header_too_large_to_load_is_refused_at_save_time() {
    // Long names, so a few thousand variables pass the bound.
    let n = 3000;
    let name = |i: usize| format!("{}/{i}", "v".repeat(300));
    let one = || ArrayD::from_shape_vec(IxDyn(&[1]), vec![0.5f32]).unwrap();
    let ckpt = Checkpoint {
        global_step: 1,
        variables: (0..n).map(|i| (name(i), one())).collect(),
        shadows: (0..n).map(|i| (name(i), one())).collect(),
        slots: Slots::default(),
        run: 0,
        shard_steps: Vec::new(),
        table_optimizers: Vec::new(),
        increment: None,
        tables: Vec::new(),
    };
    let err = to_bytes(&ckpt, &BTreeMap::new()).unwrap_err();
    assert!(err.contains("header would be"), "{err}");
}

#[test]
fn each_shards_own_step_round_trips_and_older_files_give_the_global_step() {
    let mut c = sample(90, &SMALL);
    c.shard_steps = vec![90, 61];
    let (model, ema) = to_bytes(&c, &BTreeMap::new()).unwrap();
    let back = from_bytes(&model, &ema, Some(&small_specs())).unwrap();
    assert_eq!(back.shard_steps, vec![90, 61]);
    assert_eq!(back.shard_step(1, 2), 61);
    // Another ps count: only the global step is known for it.
    assert_eq!(back.shard_step(1, 3), 90);
    // A checkpoint from before shard steps were kept.
    let (model, ema) = to_bytes(&sample(90, &SMALL), &BTreeMap::new()).unwrap();
    let back = from_bytes(&model, &ema, Some(&small_specs())).unwrap();
    assert!(back.shard_steps.is_empty());
    assert_eq!(back.shard_step(1, 2), 90);
}

/// [`sample_with_adagrad`] with two tables: `deep/embeddings` (3
/// rows of 3, the highest id among them: all 64 bits kept) and an empty
/// `wide/weights`.
fn sample_with_tables(step: u64) -> Checkpoint {
    let mut c = sample_with_adagrad(step);
    let values: Vec<f32> = (0..9).map(|i| i as f32 * 0.5 - 2.0).collect();
    c.tables = vec![
        (
            "deep/embeddings".into(),
            Rows {
                ids: vec![1, 5, u64::MAX],
                shadows: values.iter().map(|v| v * 0.9).collect(),
                slots: vec![values.iter().map(|v| 0.1 + v * v).collect()],
                values,
            },
        ),
        (
            "wide/weights".into(),
            Rows {
                slots: vec![Vec::new()],
                ..Rows::default()
            },
        ),
    ];
    c
}

#[test]
fn a_table_s_own_optimizer_names_its_slots_on_disk_and_reads_back() {
    use crate::optimizer::TableOptimizer;
    let mut c = sample_with_tables(12);
    let ftrl = TableOptimizer::Ftrl {
        learning_rate_power: -0.5,
        initial_accumulator_value: 0.1,
        l1: 0.0,
        l2: 0.0,
    };
    c.table_optimizers = vec![("wide/weights".into(), ftrl)];
    c.tables[1].1 = Rows {
        ids: vec![2, 9],
        values: vec![0.5, -0.5],
        shadows: vec![0.4, -0.4],
        slots: vec![vec![0.3, 0.2], vec![-1.0, 1.0]],
    };
    let (model, ema) = to_bytes(&c, &BTreeMap::new()).unwrap();
    let back = from_bytes(&model, &ema, Some(&small_specs())).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.table_optimizer("wide/weights"), Some(ftrl));
    // The other table still follows the run's optimizer (Adagrad).
    assert_eq!(
        back.table_optimizer("deep/embeddings").unwrap().name(),
        "adagrad"
    );
    let (tensors, meta) = parse_safetensors(&model, Path::new("m")).unwrap();
    for name in ["wide/weights/Ftrl", "wide/weights/Ftrl_1"] {
        assert_eq!(tensors.tensor(name).unwrap().shape(), &[2, 1], "{name}");
    }
    assert!(meta["table_optimizers"].starts_with(r#"{"wide/weights":{"name":"ftrl""#));
    // A checkpoint without the key (before table optimizers) has none.
    assert!(sample_with_tables(3).table_optimizers.is_empty());
}

#[test]
fn tables_round_trip_whole_with_their_shadows_and_slots() {
    let c = sample_with_tables(12);
    let (model, ema) = to_bytes(&c, &BTreeMap::new()).unwrap();
    assert_eq!(from_bytes(&model, &ema, Some(&small_specs())).unwrap(), c);
    assert_eq!(from_bytes(&model, &ema, None).unwrap().tables, c.tables);
    // On disk as the brief of the format says: ids I64, rows × dim F32.
    let (tensors, meta) = parse_safetensors(&model, Path::new("m")).unwrap();
    assert_eq!(meta[TABLES_KEY], r#"["deep/embeddings","wide/weights"]"#);
    let ids = tensors.tensor("deep/embeddings/ids").unwrap();
    assert_eq!((ids.dtype(), ids.shape()), (Dtype::I64, &[3][..]));
    for name in ["deep/embeddings/values", "deep/embeddings/Adagrad"] {
        assert_eq!(tensors.tensor(name).unwrap().shape(), &[3, 3], "{name}");
    }
    let (shadows, _) = parse_safetensors(&ema, Path::new("e")).unwrap();
    let shadow = shadows
        .tensor("deep/embeddings/ExponentialMovingAverage")
        .unwrap();
    assert_eq!(shadow.shape(), &[3, 3]);
    // A table without shadows saves its values as their shadows.
    let mut c = sample_with_tables(12);
    c.tables[0].1.shadows.clear();
    let (model, ema) = to_bytes(&c, &BTreeMap::new()).unwrap();
    let back = from_bytes(&model, &ema, None).unwrap();
    assert_eq!(back.tables[0].1.shadows, c.tables[0].1.values);
}

/// `bytes` (a file of a pair) with tensor `name` replaced, every CRC
/// recomputed: damage only the checks of the content can find.
fn with_tensor(bytes: &[u8], name: &str, dtype: Dtype, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let (tensors, meta) = container::parse(bytes).unwrap();
    let meta = meta
        .into_iter()
        .filter(|(k, _)| !k.starts_with(CRC_PREFIX))
        .collect();
    let owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, v)| match n == name {
            true => (n.to_owned(), dtype, shape.to_vec(), data.to_vec()),
            false => (
                n.to_owned(),
                v.dtype(),
                v.shape().to_vec(),
                v.data().to_vec(),
            ),
        })
        .collect();
    container::encode_named(&owned, meta).unwrap()
}

#[test]
fn a_damaged_table_is_an_error_naming_it_never_a_panic() {
    let (model, ema) = to_bytes(&sample_with_tables(12), &BTreeMap::new()).unwrap();
    let ids = |ids: &[u64]| bytemuck::cast_slice::<u64, u8>(ids).to_vec();
    let f32s = |v: &[f32]| bytemuck::cast_slice::<f32, u8>(v).to_vec();
    let nine = [0.5f32; 9];
    let mut nan = nine;
    nan[4] = f32::NAN;
    let cases: Vec<(&str, Vec<u8>, Vec<u8>, &str)> = vec![
        (
            "an id twice",
            with_tensor(
                &model,
                "deep/embeddings/ids",
                Dtype::I64,
                &[3],
                &ids(&[1, 5, 5]),
            ),
            ema.clone(),
            "not strictly ascending at row 2 (5 then 5)",
        ),
        (
            "unsorted ids",
            with_tensor(
                &model,
                "deep/embeddings/ids",
                Dtype::I64,
                &[3],
                &ids(&[7, 5, 9]),
            ),
            ema.clone(),
            "not strictly ascending at row 1 (7 then 5)",
        ),
        (
            "fewer ids than rows",
            with_tensor(
                &model,
                "deep/embeddings/ids",
                Dtype::I64,
                &[2],
                &ids(&[1, 5]),
            ),
            ema.clone(),
            "has shape [3, 3], expected [2, dim]",
        ),
        (
            "ids of another dtype",
            with_tensor(
                &model,
                "deep/embeddings/ids",
                Dtype::F32,
                &[3],
                &f32s(&[1., 2., 3.]),
            ),
            ema.clone(),
            "expected an I64 vector",
        ),
        (
            "a slot of another shape",
            with_tensor(
                &model,
                "deep/embeddings/Adagrad",
                Dtype::F32,
                &[9, 1],
                &f32s(&nine),
            ),
            ema.clone(),
            "has shape [9, 1], its table's values [3, 3]",
        ),
        (
            "a non-finite value",
            with_tensor(
                &model,
                "deep/embeddings/values",
                Dtype::F32,
                &[3, 3],
                &f32s(&nan),
            ),
            ema.clone(),
            "non-finite value (NaN) at flat index 4",
        ),
        (
            "a non-finite shadow",
            model.clone(),
            with_tensor(
                &ema,
                "deep/embeddings/ExponentialMovingAverage",
                Dtype::F32,
                &[3, 3],
                &f32s(&nan),
            ),
            "non-finite value",
        ),
    ];
    for (what, model, ema, want) in cases {
        for expected in [None, Some(small_specs())] {
            let err = from_bytes(&model, &ema, expected.as_deref()).unwrap_err();
            assert!(
                matches!(err, CheckpointError::Invalid { .. }) && err.to_string().contains(want),
                "{what}: {err}"
            );
        }
    }
    // What would not load back is refused at save time.
    let mut c = sample_with_tables(12);
    c.tables[0].1.ids = vec![5, 1, 9];
    let err = to_bytes(&c, &BTreeMap::new()).unwrap_err();
    assert!(err.contains("not strictly ascending"), "{err}");
    let mut c = sample_with_tables(12);
    c.tables[0].1.slots.clear();
    let err = to_bytes(&c, &BTreeMap::new()).unwrap_err();
    assert!(err.contains("0 slot arrays"), "{err}");
    let mut c = sample_with_tables(12);
    c.tables[1].0 = "deep/embeddings".into();
    let err = to_bytes(&c, &BTreeMap::new()).unwrap_err();
    assert!(err.contains("appears twice"), "{err}");
}

#[test]
fn a_delta_is_written_as_dtf_1_delta_and_parses_unresolved() {
    let base = chain_base(40);
    let delta = delta_of(&base, &chain_full(60));
    let (model, ema) = to_bytes(&delta, &BTreeMap::new()).unwrap();
    for bytes in [&model, &ema] {
        let (_, meta) = parse_safetensors(bytes, Path::new("m")).unwrap();
        assert_eq!(meta["format"], DELTA_FORMAT);
        assert_eq!(meta[CHAIN_KEY], "5eed0000000000c4");
        assert_eq!(meta[BASE_KEY], "40");
    }
    let (tensors, _) = parse_safetensors(&model, Path::new("m")).unwrap();
    let removed = tensors.tensor("deep/embeddings/removed").unwrap();
    assert_eq!((removed.dtype(), removed.shape()), (Dtype::I64, &[1][..]));
    assert_eq!(removed.data(), 2u64.to_le_bytes());
    // Bytes alone cannot be resolved: the delta as it is, its removed ids
    // per table, the changed rows only.
    let back = from_bytes(&model, &ema, Some(&small_specs())).unwrap();
    assert_eq!(back, delta);
    let increment = back.increment.as_ref().unwrap();
    assert_eq!(increment.unresolved_base(), Some(40));
    assert_eq!(increment.removed, [vec![2], vec![4]]);
    assert_eq!(back.tables[0].1.ids, [3, 5, 7]);
    // A base is a whole checkpoint with its chain.
    let (model, ema) = to_bytes(&base, &BTreeMap::new()).unwrap();
    let (_, meta) = parse_safetensors(&model, Path::new("m")).unwrap();
    assert_eq!(meta["format"], FORMAT);
    assert!(!meta.contains_key(BASE_KEY));
    let back = from_bytes(&model, &ema, None).unwrap();
    assert_eq!(back, base);
    assert_eq!(back.increment.unwrap().unresolved_base(), None);
}

#[test]
fn a_delta_that_would_not_resolve_is_refused_at_save_time() {
    let base = chain_base(40);
    let delta = || delta_of(&base, &chain_full(60));
    let with = |f: &dyn Fn(&mut Checkpoint)| {
        let mut c = delta();
        f(&mut c);
        to_bytes(&c, &BTreeMap::new()).unwrap_err()
    };
    let cases: Vec<(String, &str)> = vec![
        (with(&|c| c.tables.clear()), "a delta without tables"),
        (
            with(&|c| {
                c.increment
                    .as_mut()
                    .unwrap()
                    .removed
                    .pop()
                    .map(drop)
                    .unwrap()
            }),
            "1 lists of removed ids for 2 tables",
        ),
        (
            // Resolved (whole tables, no removed ids): saved as a delta it
            // would bring back the rows dropped since the base.
            with(&|c| c.increment.as_mut().unwrap().removed.clear()),
            "0 lists of removed ids for 2 tables",
        ),
        (
            with(&|c| c.increment.as_mut().unwrap().removed[0] = vec![4, 2]),
            "removed ids are not strictly ascending",
        ),
        (
            with(&|c| c.increment.as_mut().unwrap().removed[0] = vec![2, 7]),
            "id 7 is both among its rows and removed",
        ),
        (
            with(&|c| c.increment.as_mut().unwrap().base = Some(60)),
            "a base is older than its deltas",
        ),
        (
            with(&|c| c.increment.as_mut().unwrap().base = None),
            "a chain's base with removed ids",
        ),
    ];
    for (err, want) in cases {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn a_pair_of_two_chains_or_a_base_key_in_a_whole_file_is_refused() {
    let delta = delta_of(&chain_base(40), &chain_full(60));
    let (model, _) = to_bytes(&delta, &BTreeMap::new()).unwrap();
    let mut other = delta.clone();
    other.increment.as_mut().unwrap().chain = 7;
    let (_, ema) = to_bytes(&other, &BTreeMap::new()).unwrap();
    let err = from_bytes(&model, &ema, None).unwrap_err().to_string();
    assert!(err.contains("they must be a pair"), "{err}");
    // An older reader of `format` alone refuses a delta; this one names both.
    let (_, ema) = to_bytes(&delta, &BTreeMap::new()).unwrap();
    let (tensors, mut meta) = container::parse(&model).unwrap();
    meta.insert("format".into(), "dtf-2".into());
    let owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, v)| {
            (
                n.to_owned(),
                v.dtype(),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    let bumped = container::encode_named(&owned, meta.clone()).unwrap();
    let err = from_bytes(&bumped, &ema, None).unwrap_err().to_string();
    assert!(err.contains("\"dtf-1\" (or \"dtf-1-delta\""), "{err}");
    meta.insert("format".into(), FORMAT.into());
    let whole = container::encode_named(&owned, meta).unwrap();
    let err = from_bytes(&whole, &ema, None).unwrap_err().to_string();
    assert!(err.contains("a delta that says it is whole"), "{err}");
}
