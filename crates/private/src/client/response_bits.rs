//! How much precision a request keeps for a given relative tolerance (the
//! coarse trips of the fixed-point schedule ask for less than the
//! default): the bits it asks of the server's response compression, and
//! the error its upload may lose.

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

/// The largest error the upload of a request with relative `tolerance`
/// may add to each normalised input value (|x| ≤ 1;
/// [`cipherlora_helora::GroupClient::request_within`]): `2^-(bits + 1)`
/// with `bits` = [`response_bits`], so at most a quarter of the
/// tolerance. An input error ε moves a delta by at most ε times the
/// group's output bound, the unit of the tolerance and of the response
/// compression's error (`bound·2^-bits`, at most half the tolerance): the
/// two together stay within three quarters of it.
///
/// A tolerance asking for full precision (0, a round's last trip) gets the
/// same rule at the server's default response precision
/// ([`ResponseCompression::DEFAULT_BITS`], 25 bits: `2^-26`, about 5 of
/// the 130 bits a standard-LoRA upload carries per coefficient): the
/// response is compressed to that precision anyway, and the upload's
/// error, at half the response's, adds at most half again to what the
/// response already loses (both far below the fixed point's residual,
/// ≥ 1e-3 relative after a round's trips; `crate::HeHook`).
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
        // Full precision: a quarter of the default response precision's
        // tolerance, never exact (the response is compressed to it).
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
