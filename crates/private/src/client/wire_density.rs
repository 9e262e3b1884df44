//! Bits on the wire per activation value, next to what the same
//! ciphertexts would cost fully packed.
//!
//! A request carries each position's LoRA input (standard LoRA: the d_in
//! values of x; FFA: the Σr values of A·x) and its response each position's
//! deltas (Σd_out values). A ciphertext of ring degree N holds at most N real
//! values (N/2 complex slots, two parts each), so `bytes · 8 / (ciphertexts ·
//! N)` is the floor of these parameters: the bits per value if every slot
//! part carried one. Derivation and the floors of other encodings:
//! docs/design/wire.md.

use serde::{Deserialize, Serialize};

use crate::client::HeTimings;

/// Bits per activation value carried, up and down, with the floor of the
/// ciphertexts that carried them; `None` where nothing was carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WireDensity {
    /// Request bits per input value carried (bits).
    pub bits_up: Option<f64>,
    /// Response bits per delta value received (bits).
    pub bits_down: Option<f64>,
    /// Request bits per value had every slot part carried one (bits).
    pub floor_up: Option<f64>,
    /// Response bits per value had every slot part carried one (bits).
    pub floor_down: Option<f64>,
}

fn per(bytes: u64, values: u64) -> Option<f64> {
    (values > 0).then(|| bytes as f64 * 8.0 / values as f64)
}

impl WireDensity {
    /// The density of the traffic `he` counted.
    #[must_use]
    pub fn of(he: &HeTimings) -> Self {
        WireDensity {
            bits_up: per(he.bytes_up, he.values_up),
            bits_down: per(he.bytes_down, he.values_down),
            floor_up: per(he.bytes_up, he.capacity_up),
            floor_down: per(he.bytes_down, he.capacity_down),
        }
    }
}

impl std::fmt::Display for WireDensity {
    /// `up 231 bits/value (floor 106), down 190 (floor 79)`; `-` where
    /// nothing was carried.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
        write!(
            f,
            "up {} bits/value (floor {}), down {} (floor {})",
            b(self.bits_up),
            b(self.floor_up),
            b(self.bits_down),
            b(self.floor_down)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_per_value_divide_the_bytes_by_the_values_and_the_floor_by_the_capacity() {
        let he = HeTimings {
            bytes_up: 1000,
            bytes_down: 500,
            values_up: 100,
            values_down: 0,
            capacity_up: 400,
            capacity_down: 1000,
            ..HeTimings::default()
        };
        let d = WireDensity::of(&he);
        assert_eq!(d.bits_up, Some(80.0));
        assert_eq!(d.floor_up, Some(20.0));
        assert_eq!(d.bits_down, None);
        assert_eq!(d.floor_down, Some(4.0));
        assert_eq!(
            d.to_string(),
            "up 80 bits/value (floor 20), down - (floor 4)"
        );
    }
}
