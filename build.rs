//! Compiles `proto/dtf/v1/*.proto` (gRPC) and `proto/tensorboard/event.proto`,
//! `proto/onnx/onnx.proto` and `proto/tensorflow/tensor_bundle.proto`
//! (messages only) with protox (pure Rust): no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/dtf/v1/ps.proto"];
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".dtf.v1.Tensor.data")
        .bytes(".dtf.v1.ReplicateRequest.snapshot")
        .bytes(".dtf.v1.FetchReplicaResponse.snapshot")
        // prost's codec, but a request that does not parse is
        // INVALID_ARGUMENT rather than INTERNAL (see `transport::proto::Codec`).
        .codec_path("crate::transport::proto::Codec")
        .compile_fds(fds)?;
    let events = ["proto/tensorboard/event.proto"];
    let fds = protox::compile(events, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(fds)?;
    // ONNX: the subset `dtf export --onnx` writes (messages only).
    let onnx = ["proto/onnx/onnx.proto"];
    let fds = protox::compile(onnx, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(fds)?;
    // TensorFlow's checkpoint index entries: `dtf export --tf-checkpoint`,
    // `dtf local --init-from` (messages only).
    let bundle = ["proto/tensorflow/tensor_bundle.proto"];
    let fds = protox::compile(bundle, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(fds)?;
    for p in protos.iter().chain(&events).chain(&onnx).chain(&bundle) {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
