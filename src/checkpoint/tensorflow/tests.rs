//! The TensorFlow bundle's unit tests: round trips, damaged files, what dtf refuses.

use super::*;

fn sample() -> Vec<Tensor> {
    vec![
        Tensor::f32("layer1/weights", &[4, 3], (0..12).map(|i| i as f32 * 0.5)),
        Tensor::f32(
            "layer1/biases",
            &[3],
            [1.0, -2.0, f32::MIN_POSITIVE].into_iter(),
        ),
        Tensor::f32(
            "layer1/weights/ExponentialMovingAverage",
            &[4, 3],
            (0..12).map(|i| -(i as f32)),
        ),
        Tensor {
            name: "global_step".into(),
            dtype: Dtype::I64,
            shape: Vec::new(),
            data: 6000i64.to_le_bytes().to_vec(),
        },
    ]
}

#[test]
fn round_trip_keeps_bits_names_shapes_dtypes() {
    let tmp = tempfile::tempdir().unwrap();
    let tensors = sample();
    let prefix = write(tmp.path(), 6000, &tensors).unwrap();
    assert_eq!(prefix, tmp.path().join("model.ckpt-6000"));
    let mut want = tensors.clone();
    want.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(read(&prefix).unwrap(), want);
    // The data file is the bytes in key order, nothing between them.
    let data = std::fs::read(data_path(&prefix)).unwrap();
    let concat: Vec<u8> = want.iter().flat_map(|t| t.data.clone()).collect();
    assert_eq!(data, concat);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("checkpoint")).unwrap(),
        "model_checkpoint_path: \"model.ckpt-6000\"\n\
         all_model_checkpoint_paths: \"model.ckpt-6000\"\n"
    );
    assert_eq!(latest(tmp.path()).unwrap(), Some(prefix));
}

#[test]
fn the_state_file_lists_every_complete_checkpoint_newest_last() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), 200, &sample()).unwrap();
    write(tmp.path(), 100, &sample()).unwrap();
    // An index without its data file is not a checkpoint.
    std::fs::write(tmp.path().join("model.ckpt-50.index"), b"x").unwrap();
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("checkpoint")).unwrap(),
        "model_checkpoint_path: \"model.ckpt-100\"\n\
         all_model_checkpoint_paths: \"model.ckpt-200\"\n\
         all_model_checkpoint_paths: \"model.ckpt-100\"\n"
    );
}

#[test]
fn header_and_entries_are_tensorflows() {
    let (index, data) = encode(&sample());
    let entries = table::parse(&index).unwrap();
    let keys: Vec<&[u8]> = entries.iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(
        keys,
        [
            &b""[..],
            b"global_step",
            b"layer1/biases",
            b"layer1/weights",
            b"layer1/weights/ExponentialMovingAverage"
        ]
    );
    let header = pb::BundleHeaderProto::decode(entries[0].1.as_slice()).unwrap();
    assert_eq!(
        (
            header.num_shards,
            header.endianness,
            header.version.unwrap().producer
        ),
        (1, 0, 1)
    );
    let step = pb::BundleEntryProto::decode(entries[1].1.as_slice()).unwrap();
    assert_eq!(step.dtype, 9);
    assert!(step.shape.unwrap().dim.is_empty());
    assert_eq!((step.offset, step.size), (0, 8));
    assert_eq!(table::unmask(step.crc32c), crc32c::crc32c(&data[..8]));
    let w = pb::BundleEntryProto::decode(entries[3].1.as_slice()).unwrap();
    assert_eq!(w.dtype, 1);
    let dims: Vec<i64> = w.shape.unwrap().dim.iter().map(|d| d.size).collect();
    assert_eq!(dims, [4, 3]);
    assert_eq!((w.offset, w.size), (8 + 12, 48));
}

/// `tests/fixtures/tf-checkpoint`: written by TensorFlow 2.21's
/// `tf.compat.v1.train.Saver` (`scripts/check_tf_checkpoint.py write
/// DIR 64,16,4 40`).
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tf-checkpoint")
}

/// The fixture's values: element k of layer l's tensor is
/// (k − 500)/64 + l/8, its shadow that − 0.5 (exact in f32).
fn reference(n: usize, layer: usize) -> Vec<f32> {
    (0..n)
        .map(|k| (k as f32 - 500.0) / 64.0 + layer as f32 / 8.0)
        .collect()
}

#[test]
fn reads_a_checkpoint_tensorflow_wrote() {
    let dir = fixture();
    let prefix = latest(&dir).unwrap().unwrap();
    assert_eq!(prefix, dir.join("model.ckpt-40"));
    let tensors = read(&prefix).unwrap();
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "global_step",
            "layer1/biases",
            "layer1/biases/ExponentialMovingAverage",
            "layer1/weights",
            "layer1/weights/ExponentialMovingAverage",
            "layer2/biases",
            "layer2/biases/ExponentialMovingAverage",
            "layer2/weights",
            "layer2/weights/ExponentialMovingAverage"
        ]
    );
    assert_eq!(tensors[0].to_i64().unwrap(), [40]);
    assert!(tensors[0].shape.is_empty());
    for t in &tensors[1..] {
        assert_eq!(t.dtype, Dtype::F32, "{}", t.name);
        let layer = if t.name.starts_with("layer1") { 1 } else { 2 };
        let want_shape: &[u64] = match (layer, t.name.contains("weights")) {
            (1, true) => &[64, 16],
            (1, false) => &[16],
            (_, true) => &[16, 4],
            (_, false) => &[4],
        };
        assert_eq!(t.shape, want_shape, "{}", t.name);
        let n = want_shape.iter().product::<u64>() as usize;
        let shift = if t.name.ends_with("ExponentialMovingAverage") {
            0.5
        } else {
            0.0
        };
        let want: Vec<f32> = reference(n, layer).iter().map(|v| v - shift).collect();
        assert_eq!(t.to_f32().unwrap(), want, "{}", t.name);
    }
    // Written again by dtf: the data file is TensorFlow's, byte for
    // byte, and so is every entry of the index (header and protos).
    let (index, data) = encode(&tensors);
    assert_eq!(data, std::fs::read(data_path(&prefix)).unwrap());
    let theirs = table::parse(&std::fs::read(index_path(&prefix)).unwrap()).unwrap();
    assert_eq!(table::parse(&index).unwrap(), theirs);
}

#[test]
fn damaged_files_are_refused_naming_the_file_and_the_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = write(tmp.path(), 7, &sample()).unwrap();
    let (index, data) = (index_path(&prefix), data_path(&prefix));
    let good_index = std::fs::read(&index).unwrap();
    let good_data = std::fs::read(&data).unwrap();
    let check = |expect_file: &Path, expect: &str| {
        let err = read(&prefix).unwrap_err().to_string();
        assert!(err.contains(&expect_file.display().to_string()), "{err}");
        assert!(err.contains(expect), "{err}");
    };

    let mut flipped = good_data.clone();
    flipped[30] ^= 1;
    std::fs::write(&data, &flipped).unwrap();
    check(&data, "CRC-32C mismatch");
    std::fs::write(&data, &good_data[..good_data.len() - 4]).unwrap();
    check(&data, "run past");
    std::fs::write(&data, &good_data).unwrap();

    let mut flipped = good_index.clone();
    flipped[10] ^= 1;
    std::fs::write(&index, &flipped).unwrap();
    check(&index, "CRC-32C mismatch");
    std::fs::write(&index, &good_index[..good_index.len() - 1]).unwrap();
    check(&index, "magic");
    std::fs::write(&index, &good_index[..20]).unwrap();
    check(&index, "footer");
    std::fs::remove_file(&data).unwrap();
    std::fs::write(&index, &good_index).unwrap();
    check(&data, "cannot open");
}

#[test]
fn refuses_what_dtf_does_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("model.ckpt-1");
    let mut entry = pb::BundleEntryProto {
        dtype: 7, // DT_STRING
        shape: Some(pb::TensorShapeProto::default()),
        size: 0,
        ..Default::default()
    };
    let header = pb::BundleHeaderProto {
        num_shards: 1,
        ..Default::default()
    };
    let write_one = |entry: &pb::BundleEntryProto| {
        let table = table::build(&[
            (Vec::new(), header.encode_to_vec()),
            (b"x".to_vec(), entry.encode_to_vec()),
        ]);
        std::fs::write(index_path(&prefix), table).unwrap();
        // No longer than the entry covers: a longer data file is refused first.
        let covered = (entry.offset as u64).saturating_add(entry.size as u64);
        std::fs::write(data_path(&prefix), vec![0u8; covered.min(16) as usize]).unwrap();
        read(&prefix).unwrap_err().to_string()
    };
    assert!(write_one(&entry).contains("dtype 7"));
    entry.dtype = 1;
    entry.shape = Some(pb::TensorShapeProto {
        dim: vec![
            pb::tensor_shape_proto::Dim {
                size: 1 << 62,
                name: String::new(),
            };
            2
        ],
        unknown_rank: false,
    });
    assert!(write_one(&entry).contains("overflows"));
    entry.shape = None;
    entry.size = 4;
    entry.offset = i64::MAX;
    assert!(write_one(&entry).contains("run past"));
    entry.offset = 0;
    entry.slices = vec![pb::TensorSliceProto::default()];
    assert!(write_one(&entry).contains("partitioned"));
    // A data file longer than its index's entries cover (a sparse 4 GiB file beside a
    // small index) is refused, not read into memory.
    entry.slices.clear();
    entry.dtype = 1;
    entry.shape = Some(pb::TensorShapeProto {
        dim: vec![pb::tensor_shape_proto::Dim {
            size: 1,
            name: String::new(),
        }],
        unknown_rank: false,
    });
    let table = table::build(&[
        (Vec::new(), header.encode_to_vec()),
        (b"x".to_vec(), entry.encode_to_vec()),
    ]);
    std::fs::write(index_path(&prefix), table).unwrap();
    std::fs::write(data_path(&prefix), vec![0u8; 1 << 20]).unwrap();
    let e = read(&prefix).unwrap_err().to_string();
    assert!(e.contains("its index's entries cover"), "{e}");
}
