//! The `relay.v1` gRPC contract shared by the server, the bridge and the tests.

pub mod v1 {
    tonic::include_proto!("relay.v1");

    /// Encoded descriptors of `relay.v1`, served through gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("relay_v1_descriptor");
}
