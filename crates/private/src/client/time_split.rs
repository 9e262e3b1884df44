//! Where a private generation's time went (`generate`, `demo`, `bench e2e`).

use crate::client::{HeTimings, WireDensity};
use cipherlora_speculative::decode::SpecStats;
use serde::{Deserialize, Serialize};

/// Wall-clock ms of one generation by activity; `forward` is the passes'
/// wall time minus the HE hook's, so the parts sum to passes plus drafting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeSplit {
    /// Drafting (base model or prompt lookup), ms.
    pub draft: f64,
    /// Plaintext forward passes (verify + prefill, HE excluded), ms.
    pub forward: f64,
    /// Client: packing, FFA's A·x, encoding and encryption, ms.
    pub encrypt: f64,
    /// Server compute, as the server reports it, ms.
    pub server: f64,
    /// Round trip minus server compute (serialisation, transport, link), ms.
    pub network: f64,
    /// Client: decryption, decoding, row mapping, ms.
    pub decrypt: f64,
    /// Wall time of the prefill passes, ms (in the parts above only when the
    /// inputs include prefill, as `generate`'s do).
    pub prefill: f64,
}

impl TimeSplit {
    /// The split of a generation with `stats` whose hook measured `he`.
    #[must_use]
    pub fn new(stats: &SpecStats, he: &HeTimings) -> Self {
        let passes = (stats.verify_secs + stats.prefill_secs) * 1e3;
        let he_ms = he.encrypt_ms + he.server_ms + he.network_ms + he.decrypt_ms;
        TimeSplit {
            draft: stats.draft_secs * 1e3,
            forward: (passes - he_ms).max(0.0),
            encrypt: he.encrypt_ms,
            server: he.server_ms,
            network: he.network_ms,
            decrypt: he.decrypt_ms,
            prefill: stats.prefill_secs * 1e3,
        }
    }

    /// Sum of the parts (`prefill` excluded: it is not a separate part), ms.
    #[must_use]
    pub fn total(&self) -> f64 {
        self.draft + self.forward + self.encrypt + self.server + self.network + self.decrypt
    }

    /// `self + other`, part by part (summing runs).
    #[must_use]
    pub fn plus(&self, other: &TimeSplit) -> TimeSplit {
        TimeSplit {
            draft: self.draft + other.draft,
            forward: self.forward + other.forward,
            encrypt: self.encrypt + other.encrypt,
            server: self.server + other.server,
            network: self.network + other.network,
            decrypt: self.decrypt + other.decrypt,
            prefill: self.prefill + other.prefill,
        }
    }
}

impl std::fmt::Display for TimeSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "draft {:.0} ms, forward {:.0} ms, encrypt {:.0} ms, server {:.0} ms, network {:.0} ms, decrypt {:.0} ms (prefill {:.0} ms)",
            self.draft,
            self.forward,
            self.encrypt,
            self.server,
            self.network,
            self.decrypt,
            self.prefill
        )
    }
}

/// The summary `generate` and `demo` print after a private generation:
/// `he` the whole generation's HE traffic, `decode` its part after the
/// prompt's passes ([`crate::ByWidth::timings_since_prefill`]).
#[must_use]
pub fn summary(
    tokens: usize,
    wall_secs: f64,
    stats: &SpecStats,
    he: &HeTimings,
    decode: &HeTimings,
) -> String {
    let split = TimeSplit::new(stats, he);
    let prefill = he.without(decode);
    format!(
        "tokens {tokens}, {:.2} tok/s, {} verify rounds, mean accepted length {:.2}, {} prefill passes, {} drafts made ahead and used\n\
         time: {split}\n\
         bytes: up {:.1} MB, down {:.1} MB ({:.0} kB per token), {} group requests in {} round trips\n\
         wire: prefill {}; decode {}",
        tokens as f64 / wall_secs.max(1e-9),
        stats.rounds,
        stats.mean_accepted_length(tokens),
        stats.prefill_passes,
        stats.ahead_hits,
        he.bytes_up as f64 / 1e6,
        he.bytes_down as f64 / 1e6,
        (he.bytes_up + he.bytes_down) as f64 / 1e3 / tokens.max(1) as f64,
        he.rounds,
        he.round_trips,
        WireDensity::of(&prefill),
        WireDensity::of(decode),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_is_the_passes_minus_the_he_parts_and_the_parts_sum_to_the_wall_time() {
        let stats = SpecStats {
            rounds: 3,
            prefill_passes: 1,
            drafted: 9,
            accepted: 6,
            draft_secs: 0.1,
            verify_secs: 0.5,
            prefill_secs: 0.2,
            ahead_hits: 0,
            ahead_secs: 0.0,
            ..SpecStats::default()
        };
        let he = HeTimings {
            rounds: 8,
            encrypt_ms: 50.0,
            server_ms: 300.0,
            network_ms: 100.0,
            decrypt_ms: 50.0,
            bytes_up: 1,
            bytes_down: 2,
            ..HeTimings::default()
        };
        let s = TimeSplit::new(&stats, &he);
        assert!((s.forward - 200.0).abs() < 1e-9);
        assert!((s.total() - 800.0).abs() < 1e-9);
        let d = s.plus(&s);
        assert!((d.total() - 1600.0).abs() < 1e-9);
        assert!((d.prefill - 400.0).abs() < 1e-9);
    }
}
