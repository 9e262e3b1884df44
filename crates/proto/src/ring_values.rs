//! Masked ring values on the wire (`MaskedGroupRequest.values`, `MaskedGroupResponse.values`):
//! unsigned integers of a fixed width packed little-endian, the first value in the lowest bits,
//! the last byte zero-padded. Masked inputs travel at 60 bits (the ring's prime), responses at
//! the bits the server's offer publishes, at most 32 (docs/design/wire.md, "Masked ring values").

use bytes::Bytes;

use crate::ProtoError;

/// Bits per masked input value.
pub const INPUT_BITS: u32 = 60;

/// Bytes of `count` values of `bits` bits.
#[must_use]
pub fn packed_len(count: usize, bits: u32) -> usize {
    (count * bits as usize).div_ceil(8)
}

/// Packs `values`, each below `2^bits` (`bits` in 1..=64; higher bits are dropped).
#[must_use]
pub fn pack(values: &[u64], bits: u32) -> Bytes {
    let mut out = Vec::with_capacity(packed_len(values.len(), bits));
    let mask = low_mask(bits);
    let (mut acc, mut held) = (0u128, 0u32);
    for &v in values {
        acc |= u128::from(v & mask) << held;
        held += bits;
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(acc as u8);
    }
    out.into()
}

/// Unpacks `count` values of `bits` bits from `bytes` (field `what`). Errors:
/// [`ProtoError::PackedLength`] unless `bytes` has exactly [`packed_len`] bytes.
pub fn unpack(
    what: &'static str,
    bytes: &[u8],
    count: usize,
    bits: u32,
) -> Result<Vec<u64>, ProtoError> {
    let expected = packed_len(count, bits);
    if bytes.len() != expected {
        return Err(ProtoError::PackedLength {
            what,
            got: bytes.len(),
            expected,
            count,
            bits,
        });
    }
    let mask = low_mask(bits);
    let mut out = Vec::with_capacity(count);
    let (mut acc, mut held) = (0u128, 0u32);
    let mut next = bytes.iter();
    for _ in 0..count {
        while held < bits {
            acc |= u128::from(*next.next().unwrap_or(&0)) << held;
            held += 8;
        }
        out.push(acc as u64 & mask);
        acc >>= bits;
        held -= bits;
    }
    Ok(out)
}

fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_vector() {
        // 0x3 and 0x5 at 4 bits: one byte 0x53; a third value starts a padded byte.
        assert_eq!(&pack(&[3, 5, 1], 4)[..], &[0x53, 0x01]);
        assert_eq!(unpack("v", &[0x53, 0x01], 3, 4).unwrap(), vec![3, 5, 1]);
    }

    #[test]
    fn a_wrong_length_is_refused() {
        let packed = pack(&[1, 2, 3], INPUT_BITS);
        assert_eq!(packed.len(), 23);
        assert!(matches!(
            unpack("values", &packed[..22], 3, INPUT_BITS),
            Err(ProtoError::PackedLength {
                expected: 23,
                got: 22,
                ..
            })
        ));
        assert!(unpack("values", &packed, 4, INPUT_BITS).is_err());
    }

    proptest! {
        #[test]
        fn unpack_inverts_pack(bits in 1u32..=64, raw in proptest::collection::vec(any::<u64>(), 0..40)) {
            let values: Vec<u64> = raw.iter().map(|v| v & low_mask(bits)).collect();
            let packed = pack(&values, bits);
            prop_assert_eq!(packed.len(), packed_len(values.len(), bits));
            prop_assert_eq!(unpack("v", &packed, values.len(), bits).unwrap(), values);
        }
    }
}
