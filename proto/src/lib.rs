//! Generated gRPC types and stubs for the HiveKernel control plane.
//!
//! # Layout
//! - [`v1`]: messages, the `Kernel` service client and server (package `hivekernel.v1`).
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for server reflection.

#![allow(unreachable_pub, missing_debug_implementations, clippy::all)]

/// Package `hivekernel.v1`.
pub mod v1 {
    tonic::include_proto!("hivekernel.v1");
}

/// Encoded `FileDescriptorSet` of every HiveKernel proto file.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/hivekernel_descriptor.bin"));
