//! Hidden states on the wire of `cipherlora.split.v1`: row-major T × d f32 little-endian
//! ([`ActivationEncoding::F32Le`]), checked before any arithmetic.

use crate::ProtoError;
use crate::split::v1::ActivationEncoding;

/// Bytes of one value.
const F32_BYTES: usize = 4;

/// Encodes `values` (row-major T × d) as f32 little-endian.
#[must_use]
pub fn encode_f32(values: &[f32]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(values.len() * F32_BYTES);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.into()
}

/// Decodes `positions` × `width` hidden-state values sent with `encoding`. Errors:
/// [`ProtoError::UnsupportedEncoding`] for an encoding other than f32 LE;
/// [`ProtoError::NoPositions`] for T = 0; [`ProtoError::ActivationLength`] unless `bytes` has
/// exactly T·d·4 bytes; [`ProtoError::NonFiniteActivation`] for a NaN or ±∞.
pub fn decode(
    encoding: i32,
    bytes: &[u8],
    positions: usize,
    width: usize,
) -> Result<Vec<f32>, ProtoError> {
    if ActivationEncoding::try_from(encoding) != Ok(ActivationEncoding::F32Le) {
        return Err(ProtoError::UnsupportedEncoding { code: encoding });
    }
    if positions == 0 {
        return Err(ProtoError::NoPositions);
    }
    let expected = positions.saturating_mul(width).saturating_mul(F32_BYTES);
    if bytes.len() != expected {
        return Err(ProtoError::ActivationLength {
            got: bytes.len(),
            expected,
            positions,
            width,
        });
    }
    let mut out = Vec::with_capacity(positions * width);
    for (index, c) in bytes.chunks_exact(F32_BYTES).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if !v.is_finite() {
            return Err(ProtoError::NonFiniteActivation { index });
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: i32 = ActivationEncoding::F32Le as i32;

    #[test]
    fn round_trips_and_refuses_bad_lengths_values_and_encodings() {
        let v = [1.5f32, -2.0, 0.0, 3.25, 1e-30, -7.0];
        let b = encode_f32(&v);
        assert_eq!(decode(F32, &b, 2, 3).unwrap(), v);
        assert_eq!(
            decode(F32, &b[..23], 2, 3),
            Err(ProtoError::ActivationLength {
                got: 23,
                expected: 24,
                positions: 2,
                width: 3
            })
        );
        assert!(matches!(
            decode(F32, &b, 3, 3),
            Err(ProtoError::ActivationLength { .. })
        ));
        assert_eq!(decode(F32, &[], 0, 3), Err(ProtoError::NoPositions));
        assert_eq!(
            decode(0, &b, 2, 3),
            Err(ProtoError::UnsupportedEncoding { code: 0 })
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut w = v;
            w[4] = bad;
            assert_eq!(
                decode(F32, &encode_f32(&w), 2, 3),
                Err(ProtoError::NonFiniteActivation { index: 4 })
            );
        }
        // Huge announced sizes do not overflow.
        assert!(decode(F32, &b, usize::MAX, usize::MAX).is_err());
    }
}
