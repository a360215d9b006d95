//! prost's gRPC codec with a smaller first buffer, used by the generated service (tools/protogen's
//! `codec_path`).
//!
//! tonic gives every open stream an encode buffer of its codec's `buffer_size` (8 KiB by default) for the
//! stream's whole life. A node front holds one SyncFlags stream per subscribed Pod, mostly idle, each sending a
//! configuration of a few KiB now and then: 8 KiB per stream is 8 MiB at 1,000 subscribers. The buffer grows to
//! fit a larger message, so a small first size costs only a reallocation when a configuration is bigger.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first size of a stream's encode and decode buffers; tonic's default yield threshold (32 KiB) is kept.
const BUFFER_SIZE: usize = 1024;
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`tonic_prost::ProstCodec`] with [`BUFFER_SIZE`] buffers.
#[derive(Debug, Clone, Copy)]
pub struct SyncCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SyncCodec<T, U> {
    fn default() -> Self {
        SyncCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

impl<T, U> Codec for SyncCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}
