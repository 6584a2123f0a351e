#[cfg(feature = "grpc")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::{env, path::PathBuf};

    // A vendored protoc keeps the build free of system packages.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { env::set_var("PROTOC", protoc) };

    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .codec_path("crate::codec::LeanCodec")
        .file_descriptor_set_path(out.join("relay_v1_descriptor.bin"))
        .compile_protos(&["relay/v1/relay.proto"], &["."])?;
    println!("cargo:rerun-if-changed=relay");
    Ok(())
}

/// Without the gRPC contract there is nothing to generate.
#[cfg(not(feature = "grpc"))]
fn main() {}
