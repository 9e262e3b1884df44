//! The precision a request keeps for a relative tolerance (coarse trips
//! ask for less): response bits asked of the server, upload error allowed.

use cipherlora_helora::ResponseCompression;

/// The response bits for a relative `tolerance` (0: the server's default).
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

/// The largest error a request's upload may add per normalised input:
/// `2^-(bits + 1)`, a quarter of the tolerance, so with the response's
/// `bound·2^-bits` both stay within three quarters (0: default precision).
pub(crate) fn upload_error(tolerance: f64) -> f64 {
    let bits = match response_bits(tolerance) {
        0 => ResponseCompression::DEFAULT_BITS,
        bits => bits,
    };
    2f64.powi(-(bits as i32) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upload_keeps_a_quarter_of_the_tolerance() {
        // Full precision: a quarter of the default precision, never exact.
        let full = 2f64.powi(-(ResponseCompression::DEFAULT_BITS as i32) - 1);
        for tolerance in [0.0, 1.0, f64::NAN, 1e-12] {
            assert_eq!(upload_error(tolerance), full, "{tolerance}");
        }
        for tolerance in [0.3, 1.0 / 2048.0, 1.0 / 32768.0, 1e-6] {
            let e = upload_error(tolerance);
            assert!(e > 0.0 && e <= tolerance / 4.0, "{tolerance}: {e}");
            let response = 2f64.powi(-(response_bits(tolerance) as i32));
            assert!(e + response <= 0.75 * tolerance, "{tolerance}");
        }
        assert_eq!(upload_error(1.0 / 2048.0), 1.0 / 8192.0);
    }

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
