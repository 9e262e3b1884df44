//! The id that binds every group request to its session's plan.

use prost::Message;

use crate::v1::SessionOffer;

/// The id of a serialised plan: FNV-1a (64 bits) over its bytes. Not a MAC: it only tells honest
/// plans apart.
#[must_use]
pub fn plan_id(plan: &[u8]) -> u64 {
    plan.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The id of a session's offer: [`plan_id`] of its protobuf encoding (deterministic: fields in
/// number order, no unknown fields kept).
#[must_use]
pub fn offer_id(offer: &SessionOffer) -> u64 {
    plan_id(&offer.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_id_is_fnv1a_64() {
        // Known vectors of FNV-1a 64.
        assert_eq!(plan_id(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(plan_id(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(plan_id(b"foobar"), 0x8594_4171_f739_67e8);
        assert_ne!(plan_id(b"plan-1"), plan_id(b"plan-2"));
    }
}
