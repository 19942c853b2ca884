//! Compiles `proto/dtf/v1/*.proto` with protox (pure Rust): no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/dtf/v1/ps.proto"];
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".dtf.v1.Tensor.data")
        .compile_fds(fds)?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
