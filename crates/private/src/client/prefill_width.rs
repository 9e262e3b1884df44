//! The prefill session's width: given, or chosen from the adapter's shapes ([`PrefillWidth::Auto`]).
//!
//! A prompt's passes carry whole activations (standard LoRA) or their lora_A projections (FFA) of
//! every position, so a long prompt is bound by its bytes per position. Those bytes depend on the
//! width through the packing: with the dense standard layout a ciphertext holds `slots / T′`
//! dimensions of each of its T′ slot positions, and `d_in` fills its ciphertexts only when that
//! chunk divides it (docs/design/packing.md, "Dense standard layout"). On the default model
//! (d = 576) width 32 leaves chunks of 256 dimensions 75 % full and width 128 chunks of 64 full;
//! at d = 2048 both are full. Wider sessions cost the server more plaintext diagonals (one chunk's
//! worth per column chunk and output ciphertext), so `auto` takes the narrowest width whose
//! ciphertexts per position come within [`AUTO_TOLERANCE`] of the fewest, and
//! [`crate::client::connect_with`] falls back to a narrower width when the server has no room
//! for it. FFA adapters keep the narrowest: their long prompts are bound by the download, which a
//! wider session shrinks less than it slows their short turns (docs/design/packing.md, "The
//! prefill width").

use std::fmt;
use std::str::FromStr;

use cipherlora_helora::{Mode, OpCosts};

use crate::PrivateError;
use crate::client::width_plan::PlanSpace;

/// Widths [`PrefillWidth::Auto`] chooses among, narrowest first: the slot positions of each
/// (T′ = 16, 32, 64 with two positions per complex slot) divide the 4,096 slots, as the dense
/// standard layout needs.
pub const AUTO_CANDIDATES: [usize; 3] = [32, 64, 128];

/// How much more wire per position than the fewest [`PrefillWidth::Auto`] accepts for a narrower
/// width (its diagonals cost the server less memory; below 5 % a long prompt gains little).
pub const AUTO_TOLERANCE: f64 = 0.05;

/// Positions per prefill request: the prefill session's width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillWidth {
    /// Chosen when the sessions open ([`choose_prefill_width`]), narrower where the server has no
    /// room for it.
    #[default]
    Auto,
    /// This width (≥ 1).
    Fixed(usize),
}

impl PrefillWidth {
    /// The widest session this can open (what a prompt must leave room for in the context).
    #[must_use]
    pub fn max_width(self) -> usize {
        match self {
            Self::Auto => AUTO_CANDIDATES[AUTO_CANDIDATES.len() - 1],
            Self::Fixed(w) => w,
        }
    }
}

impl fmt::Display for PrefillWidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(w) => write!(f, "{w}"),
        }
    }
}

/// A prefill width that is neither `auto` nor a positive number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefill width {0:?}: expected `auto` or a number of positions ≥ 1")]
pub struct ParsePrefillWidthError(pub String);

impl FromStr for PrefillWidth {
    type Err = ParsePrefillWidthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            n => match n.parse::<usize>() {
                Ok(w) if w >= 1 => Ok(Self::Fixed(w)),
                _ => Err(ParsePrefillWidthError(s.to_string())),
            },
        }
    }
}

/// Wire bytes per prompt position of a prefill session of width `t` over all of `space`'s groups,
/// priced with the planner's default ciphertext sizes (uploads by level, level-0 downloads).
///
/// # Errors
/// [`PrivateError::Helora`] when no plan fits `t`; [`PrivateError::Ckks`].
pub fn bytes_per_position(space: &PlanSpace, t: usize) -> Result<f64, PrivateError> {
    let costs = OpCosts::default();
    let mut bytes = 0.0;
    for plan in space.plans(t)? {
        let c = plan.counts()?;
        bytes += costs.bytes_up(&c) + costs.bytes_down(&c);
    }
    Ok(bytes / t as f64)
}

/// The width [`PrefillWidth::Auto`] opens for `space`: of [`AUTO_CANDIDATES`], the narrowest whose
/// [`bytes_per_position`] is within [`AUTO_TOLERANCE`] of the fewest; for FFA adapters the
/// narrowest candidate (measured: a 64-wide session cut the default model's cold 2,175-token
/// prompt by 8 % but made its 25-token chat turns 1.6× slower, docs/benchmarks/chat.md, "Prefill
/// width"). Candidates without a plan are skipped.
///
/// # Errors
/// [`PrivateError::Helora`] when no candidate has a plan.
pub fn choose_prefill_width(space: &PlanSpace) -> Result<usize, PrivateError> {
    let candidates: &[usize] = match space.mode {
        Mode::Ffa => &AUTO_CANDIDATES[..1],
        _ => &AUTO_CANDIDATES,
    };
    let mut priced = Vec::with_capacity(candidates.len());
    let mut last_error = None;
    for &t in candidates {
        match bytes_per_position(space, t) {
            Ok(b) => priced.push((t, b)),
            Err(e) => last_error = Some(e),
        }
    }
    let fewest = priced.iter().map(|&(_, b)| b).fold(f64::INFINITY, f64::min);
    priced
        .iter()
        .find(|&&(_, b)| b <= fewest * (1.0 + AUTO_TOLERANCE))
        .map(|&(t, _)| t)
        .ok_or_else(|| last_error.expect("a candidate without a price left an error"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Grouping;
    use cipherlora_ckks::Preset;
    use cipherlora_helora::GroupShape;

    /// q,k,v and o groups of a model with hidden size `d`, `kv` key/value dimensions, rank 16.
    fn space(mode: Mode, d: usize, kv: usize, layers: usize) -> PlanSpace {
        let qkv = GroupShape::new(d, vec![d, kv, kv], vec![16, 16, 16]).unwrap();
        let o = GroupShape::new(d, vec![d], vec![16]).unwrap();
        PlanSpace {
            preset: Preset::N8192Depth2Fast,
            mode,
            rerandomize: false,
            shapes: (0..layers).flat_map(|_| [qkv.clone(), o.clone()]).collect(),
            layers: (0..layers).flat_map(|l| [l, l]).collect(),
            grouping: Grouping::ByInput,
            server_cost_ratio: 1.0,
            width: Some(32),
            acceptance: None,
        }
    }

    #[test]
    fn the_default_model_s_standard_adapter_fills_its_slots_at_width_128() {
        let s = space(Mode::Standard, 576, 192, 2);
        let (narrow, wide) = (
            bytes_per_position(&s, 32).unwrap(),
            bytes_per_position(&s, 128).unwrap(),
        );
        // Uploads of 3 chunks of 256 for 576 dimensions against 9 of 64.
        assert!(wide < narrow * 0.85, "{wide} vs {narrow}");
        assert_eq!(choose_prefill_width(&s).unwrap(), 128);
    }

    #[test]
    fn a_hidden_size_that_fills_every_width_keeps_the_narrowest() {
        // Llama-3.2-1B: d = 2048, 512 key/value dimensions.
        let s = space(Mode::Standard, 2048, 512, 1);
        assert_eq!(choose_prefill_width(&s).unwrap(), 32);
    }

    #[test]
    fn ffa_adapters_keep_the_narrowest_width() {
        for (d, kv) in [(576, 192), (2048, 512)] {
            let s = space(Mode::Ffa, d, kv, 1);
            assert_eq!(
                choose_prefill_width(&s).unwrap(),
                AUTO_CANDIDATES[0],
                "d={d}"
            );
        }
    }

    #[test]
    fn the_choice_is_never_dearer_than_the_tolerance_allows() {
        for (mode, d, kv) in [
            (Mode::Standard, 576, 192),
            (Mode::Standard, 960, 320),
            (Mode::Standard, 1536, 256),
        ] {
            let s = space(mode, d, kv, 1);
            let chosen = choose_prefill_width(&s).unwrap();
            let bytes = |t| bytes_per_position(&s, t).unwrap();
            let fewest = AUTO_CANDIDATES
                .iter()
                .map(|&t| bytes(t))
                .fold(f64::INFINITY, f64::min);
            assert!(
                bytes(chosen) <= fewest * (1.0 + AUTO_TOLERANCE),
                "{mode:?} d={d}"
            );
            for &t in AUTO_CANDIDATES.iter().filter(|&&t| t < chosen) {
                assert!(
                    bytes(t) > fewest * (1.0 + AUTO_TOLERANCE),
                    "{mode:?} d={d}: {t}"
                );
            }
        }
    }

    #[test]
    fn widths_parse_as_auto_or_a_positive_number() {
        assert_eq!("auto".parse::<PrefillWidth>(), Ok(PrefillWidth::Auto));
        assert_eq!("64".parse::<PrefillWidth>(), Ok(PrefillWidth::Fixed(64)));
        assert!("0".parse::<PrefillWidth>().is_err());
        assert!("wide".parse::<PrefillWidth>().is_err());
        assert_eq!(PrefillWidth::Auto.to_string(), "auto");
        assert_eq!(PrefillWidth::Auto.max_width(), 128);
        assert_eq!(PrefillWidth::Fixed(16).max_width(), 16);
    }
}
