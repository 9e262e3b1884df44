//! Constructors of the layer-group messages, the one request and response type on both sides: the
//! client's HE hook builds a [`GroupRequest`] and its transport stamps the session fields; the
//! server's backend reads it after [`crate::validate_group_request`].

use bytes::Bytes;

use crate::v1::GroupRequest;

impl GroupRequest {
    /// A request for `(layer, group)` carrying `ciphertexts` (plan order), the response at
    /// `response_bits` of precision (0: the server's default). Session id, round and plan id are
    /// left empty for the transport to fill.
    #[must_use]
    pub fn for_group(layer: u32, group: u32, ciphertexts: Vec<Bytes>, response_bits: u32) -> Self {
        Self {
            layer,
            group,
            ciphertexts,
            response_bits,
            ..Self::default()
        }
    }
}
