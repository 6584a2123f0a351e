//! The contracts the server and the bridge share: the `relay.v1` gRPC API, the bridge's config
//! file, which `relay-server dev` and `agent-bridge login` both write, which of their releases
//! work together, and the timing of their streams.

#[cfg(feature = "grpc")]
pub mod bridge_config;
#[cfg(feature = "grpc")]
pub mod codec;
pub mod release;
pub mod timing;

#[cfg(feature = "grpc")]
pub mod v1 {
    tonic::include_proto!("relay.v1");

    /// Encoded descriptors of `relay.v1`, served through gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("relay_v1_descriptor");
}
