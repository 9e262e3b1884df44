//! The client's form of one layer group's request (the proto's `GroupRequest` less what the client
//! fills in per stream: session id, round and plan id).

use bytes::Bytes;

/// One layer group's request within a round.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupCall {
    /// Layer index.
    pub layer: u32,
    /// Group index within the layer.
    pub group: u32,
    /// Ciphertexts of the group's LoRA inputs.
    pub ciphertexts: Vec<Bytes>,
    /// Precision asked for in the returned ciphertexts, bits relative to their output bound (0: the
    /// server's default; the proto's `GroupRequest.response_bits`).
    pub response_bits: u32,
}
