//! Generates crius's own API (`proto/crius.proto`) and CRI `runtime.v1` from the vendored
//! `proto/cri-api/api.proto` (see its README), and NRI's message types from the vendored
//! `proto/nri/api.proto` (messages only: NRI's ttrpc services are crius's own code, `nri`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/crius.proto");
    println!("cargo:rerun-if-changed=proto/cri-api/api.proto");
    println!("cargo:rerun-if-changed=proto/nri/api.proto");
    tonic_prost_build::configure().compile_protos(&["proto/crius.proto"], &["proto"])?;

    // Debian 12's protoc predates the `debug_redact` field option (a debugging annotation with
    // no effect on the wire): it compiles a copy without it.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("cri-api");
    std::fs::create_dir_all(&out)?;
    let text = std::fs::read_to_string("proto/cri-api/api.proto")?;
    std::fs::write(
        out.join("api.proto"),
        text.replace(" [debug_redact = true]", ""),
    )?;
    tonic_prost_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_protos(&[out.join("api.proto")], &[out])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(&["proto/nri/api.proto"], &["proto/nri"])?;
    Ok(())
}
