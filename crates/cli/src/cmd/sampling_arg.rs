//! The sampling options of `generate` and `generate-split`.

use cipherlora_model::SamplingParams;
use clap::Args;

/// Temperature, top-k, top-p, repetition penalty and seed: greedy by
/// default; a seed gives one output (ChaCha20 seeded with it).
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k filtering.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Top-p (nucleus) filtering.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The model's sampling parameters (validated when a sampler is made).
    #[must_use]
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }

    /// Greedy decoding (temperature 0), whose output can be compared token
    /// for token with a reference.
    #[must_use]
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        sampling: SamplingArgs,
    }

    #[test]
    fn the_options_become_sampling_parameters() {
        let w =
            Wrap::try_parse_from(["x", "--temperature", "0.7", "--top-p", "0.9", "--seed", "3"])
                .unwrap();
        let want = SamplingParams {
            temperature: 0.7,
            top_k: None,
            top_p: Some(0.9),
            repetition_penalty: 1.0,
            seed: 3,
        };
        assert_eq!(w.sampling.params(), want);
        assert!(!w.sampling.is_greedy());
        let greedy = Wrap::try_parse_from(["x"]).unwrap().sampling;
        assert_eq!(greedy.params(), SamplingParams::greedy());
        assert!(greedy.is_greedy());
    }

    #[test]
    fn every_command_line_is_well_formed() {
        // Flattened options must not collide with a command's own.
        crate::Cli::command().debug_assert();
    }
}
