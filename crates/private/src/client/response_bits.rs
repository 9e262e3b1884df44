//! How many bits of precision a request asks of the server's response
//! compression for a given relative tolerance (the coarse trips of the
//! fixed-point schedule ask for fewer than the default).

use cipherlora_helora::ResponseCompression;

/// The response precision for a relative `tolerance` (see
/// [`crate::HeHook::deltas_many_within`]); 0 (the server's default) for none.
pub(crate) fn response_bits(tolerance: f64) -> u32 {
    if !(tolerance > 0.0 && tolerance < 1.0) {
        return 0;
    }
    let bits = (-tolerance.log2()).ceil() as u32 + 1;
    bits.clamp(
        ResponseCompression::MIN_BITS,
        ResponseCompression::DEFAULT_BITS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_bits_cover_the_tolerance_with_a_bit_to_spare() {
        assert_eq!(response_bits(0.0), 0);
        assert_eq!(response_bits(f64::NAN), 0);
        assert_eq!(response_bits(1.0), 0);
        assert_eq!(response_bits(1.0 / 2048.0), 12);
        assert_eq!(response_bits(1.0 / 32768.0), 16);
        assert_eq!(response_bits(0.3), ResponseCompression::MIN_BITS);
        assert_eq!(response_bits(1e-12), ResponseCompression::DEFAULT_BITS);
    }
}
