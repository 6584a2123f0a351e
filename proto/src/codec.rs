//! Prost encoding with small first buffers. tonic gives every call an 8 KiB encode buffer for its
//! whole life, and a push stream lives as long as its agent: with thousands of streams open that is
//! most of the server's memory, while a push or a heartbeat takes a few hundred bytes. Buffers
//! still grow for a large message.
//!
//! A message that does not decode (malformed protobuf, a string that is not UTF-8) is the
//! sender's fault, so it is INVALID_ARGUMENT, not the INTERNAL tonic's decoder answers.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// First size of a call's encode and decode buffers; they grow as a message needs. A heartbeat
/// takes a dozen bytes: with 10,000 idle streams each kilobyte here was 10 MB of the server's memory
/// (heaptrack: 1 KiB a stream, `Grpc::map_response`).
const BUFFER: usize = 256;
/// Encoded bytes after which a stream yields to let them be sent (tonic's default).
const YIELD_AFTER: usize = 32 * 1024;

#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LeanDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(BUFFER, YIELD_AFTER))
    }

    fn decoder(&mut self) -> Self::Decoder {
        LeanDecoder(PhantomData)
    }
}

/// Decodes `U`, answering a message that does not decode with INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct LeanDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for LeanDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!("the message is not a valid relay.v1 message ({e}): nothing was done"))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(BUFFER, YIELD_AFTER)
    }
}
