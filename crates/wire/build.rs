//! Generates the gRPC code for `proto/inplace/v1/*.proto` with tonic/prost, and proto3
//! JSON mapping (serde) impls with pbjson. protoc comes from `protoc-bin-vendored` unless
//! `PROTOC` is set, so a fresh machine needs no system protoc.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    let wkt_include = protoc_bin_vendored::include_path()?;
    let descriptor = out.join("inplace_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .btree_map(".")
        // prost's codec with request limits checked on the raw bytes (src/limits.rs)
        .codec_path("crate::limits::LimitedCodec")
        .compile_with_config(
            config,
            &[PathBuf::from("../../proto/inplace/v1/inplace.proto")],
            &[PathBuf::from("../../proto"), wkt_include],
        )?;
    let set = std::fs::read(&descriptor)?;
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        .btree_map([".inplace.v1"])
        .build(&[".inplace.v1"])?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
