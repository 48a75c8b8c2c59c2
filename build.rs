fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/crius.proto");
    tonic_prost_build::configure().compile_protos(&["proto/crius.proto"], &["proto"])?;
    Ok(())
}
