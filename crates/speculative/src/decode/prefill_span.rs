//! How many positions one group-by-group prefill pass covers ([`PrefillSpan`]).
//!
//! A prompt's pass pays about one latency per adapted group and keeps every row's deltas
//! until it ends, so a longer span pays fewer latencies and overlaps more of a long prompt's
//! uploads, server work and downloads, at the price of memory per row. The default sizes the
//! span from a memory budget, so the default model takes a long prompt in one pass while a
//! wide model's pass stays within the same bytes (docs/design/schedules.md, "Wavefront
//! prefill").

use std::fmt;
use std::str::FromStr;

use cipherlora_model::{ModelConfig, ProjGroup};

use crate::ConfigError;

/// The default [`PrefillSpan::Memory`] budget: 1 GiB.
pub const PREFILL_MEMORY: usize = 1 << 30;

/// Positions per group-by-group prefill pass ([`SpecConfig::prefill_span`](super::SpecConfig)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillSpan {
    /// At most this many positions (at most the prefill width: one padded request per pass).
    Positions(usize),
    /// As many positions as fit this many bytes of the pass's per-row state
    /// ([`ModelConfig::pass_row_bytes`]), at least one.
    Memory(usize),
}

impl Default for PrefillSpan {
    fn default() -> Self {
        Self::Memory(PREFILL_MEMORY)
    }
}

impl PrefillSpan {
    /// The span in positions for `config`, the `adapted` (layer, group)s and a context of
    /// `context` positions.
    #[must_use]
    pub fn positions(
        self,
        config: &ModelConfig,
        adapted: &[(usize, ProjGroup)],
        context: usize,
    ) -> usize {
        match self {
            Self::Positions(n) => n.max(1),
            Self::Memory(bytes) => (bytes / config.pass_row_bytes(adapted, context).max(1)).max(1),
        }
    }
}

impl fmt::Display for PrefillSpan {
    /// `512` or `auto:1024` (MiB), as [`FromStr`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Positions(n) => write!(f, "{n}"),
            Self::Memory(bytes) => write!(f, "auto:{}", bytes >> 20),
        }
    }
}

impl FromStr for PrefillSpan {
    type Err = ConfigError;

    /// `auto` (the default budget), `auto:<MiB>`, or a number of positions (≥ 1).
    /// Errors: [`ConfigError::Unparsed`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::unparsed("prefill span", s, "auto, auto:<MiB> or positions ≥ 1");
        let s = s.trim();
        if s == "auto" {
            return Ok(Self::default());
        }
        if let Some(mib) = s.strip_prefix("auto:") {
            let mib: usize = mib.parse().map_err(|_| bad())?;
            return match mib.checked_shl(20).filter(|b| mib > 0 && b >> 20 == mib) {
                Some(bytes) => Ok(Self::Memory(bytes)),
                None => Err(bad()),
            };
        }
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Self::Positions(n)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipherlora_model::{Arch, RopeStyle};

    /// SmolLM2-135M's shape.
    fn small() -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            hidden_size: 576,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            intermediate_size: 1536,
            vocab_size: 49152,
            rms_norm_eps: 1e-5,
            rope_theta: 1e5,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            rope_style: RopeStyle::Half,
        }
    }

    /// Llama-3.1-8B's shape.
    fn large() -> ModelConfig {
        cipherlora_model::synthetic_shape("llama-3.1-8b").expect("a known shape")
    }

    fn qkvo(config: &ModelConfig) -> Vec<(usize, ProjGroup)> {
        (0..config.num_layers)
            .flat_map(|l| [(l, ProjGroup::Qkv), (l, ProjGroup::O)])
            .collect()
    }

    #[test]
    fn the_budget_scales_the_span_with_the_row() {
        let span = PrefillSpan::default();
        let (s, l) = (small(), large());
        // The default model's q,k,v,o deltas are 184,320 bytes a row: a 2,000-token prompt
        // fits one pass.
        let small_span = span.positions(&s, &qkvo(&s), 4096);
        assert!(small_span >= 2048, "{small_span}");
        // The 8B shape's are 1.3 MB a row: a few hundred positions.
        let large_span = span.positions(&l, &qkvo(&l), 4096);
        assert!((256..1024).contains(&large_span), "{large_span}");
        // Half the budget, half the span (up to rounding).
        let half = PrefillSpan::Memory(PREFILL_MEMORY / 2).positions(&l, &qkvo(&l), 4096);
        assert!(half.abs_diff(large_span / 2) <= 1);
        // More context, more attention scores per row: a shorter span.
        assert!(span.positions(&s, &qkvo(&s), 32_768) < small_span);
        // Without adapted groups only the activations count.
        assert!(span.positions(&s, &[], 4096) > small_span);
        // A fixed span is taken as given; a tiny budget still runs one row at a time.
        assert_eq!(
            PrefillSpan::Positions(512).positions(&l, &qkvo(&l), 4096),
            512
        );
        assert_eq!(PrefillSpan::Memory(1).positions(&l, &qkvo(&l), 4096), 1);
    }

    #[test]
    fn text_forms_round_trip_and_bad_ones_are_refused() {
        for span in [
            PrefillSpan::Positions(512),
            PrefillSpan::Memory(2048 << 20),
            PrefillSpan::default(),
        ] {
            assert_eq!(span.to_string().parse::<PrefillSpan>(), Ok(span));
        }
        assert_eq!("auto".parse(), Ok(PrefillSpan::default()));
        for bad in [
            "0",
            "auto:0",
            "auto:",
            "-3",
            "big",
            "auto:99999999999999999999",
        ] {
            assert!(
                matches!(
                    bad.parse::<PrefillSpan>(),
                    Err(ConfigError::Unparsed { .. })
                ),
                "{bad}"
            );
        }
    }
}
