//! Generates the gRPC example's code from proto/charges.proto (feature `tonic` only), with the
//! `protoc` of the protoc-bin-vendored crate: no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/charges.proto");
    #[cfg(feature = "tonic")]
    {
        // SAFETY: the build script is single-threaded; nothing reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
        tonic_prost_build::configure().compile_protos(&["proto/charges.proto"], &["proto"])?;
    }
    Ok(())
}
