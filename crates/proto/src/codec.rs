//! The gRPC codec of the generated stubs: prost, with undecodable messages answered
//! `INVALID_ARGUMENT` (`malformed_request`) instead of `INTERNAL`.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use crate::{ERROR_REASON_KEY, ErrorReason};

/// Prost codec for `T` out, `U` in (used by the generated client and server).
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder { _pd: PhantomData }
    }
}

/// Decodes `U`; see the module docs for its errors.
#[derive(Debug, Clone)]
pub struct ProtoDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|_| undecodable())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The status of an undecodable message.
#[must_use]
pub fn undecodable() -> Status {
    let mut s = Status::invalid_argument("undecodable protobuf message");
    if let Ok(v) = ErrorReason::MalformedRequest.as_str().parse() {
        s.metadata_mut().insert(ERROR_REASON_KEY, v);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undecodable_is_invalid_argument_with_a_reason() {
        let s = undecodable();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            s.metadata()
                .get(ERROR_REASON_KEY)
                .unwrap()
                .to_str()
                .unwrap(),
            "malformed_request"
        );
    }
}
