//! The plaintext LoRA with deltas asked for within a tolerance made `noise` times worse than the
//! tolerance (uniform error, seeded): the error a coarse trip may carry, for the fixed-point tests
//! and the `exactness` example.

use cipherlora_model::{
    DeltaHook, GroupDeltas, GroupInput, LoraAdapter, ModelError, PlainLora, ProjGroup, Tensor,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

pub struct Coarse<'a> {
    exact: PlainLora<'a>,
    noise: f64,
    rng: ChaCha20Rng,
}

impl<'a> Coarse<'a> {
    /// Coarse answers off by up to `noise` × the tolerance asked, relative to each group's largest
    /// delta; exact answers exact.
    pub fn new(adapter: &'a LoraAdapter, noise: f64, seed: u64) -> Self {
        Self {
            exact: PlainLora::new(adapter),
            noise,
            rng: ChaCha20Rng::seed_from_u64(seed),
        }
    }
}

impl DeltaHook for Coarse<'_> {
    fn deltas(&mut self, l: usize, g: ProjGroup, x: &Tensor) -> Result<GroupDeltas, ModelError> {
        self.exact.deltas(l, g, x)
    }

    fn wants(&self, l: usize, g: ProjGroup) -> bool {
        self.exact.wants(l, g)
    }

    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        let exact = self.exact.deltas_many(inputs)?;
        let mut out = Vec::with_capacity(exact.len());
        for group in exact {
            let max = group
                .iter()
                .map(|(_, d)| {
                    d.abs()
                        .and_then(|a| a.max_all())
                        .and_then(|m| m.to_scalar::<f32>())
                })
                .try_fold(0.0f32, |m, v| v.map(|v| m.max(v)))?;
            let amp = (self.noise * tolerance) as f32 * max;
            let mut noisy = GroupDeltas::none();
            for (proj, d) in group.iter() {
                let e: Vec<f32> = (0..d.elem_count())
                    .map(|_| amp * self.rng.random_range(-1.0f32..=1.0))
                    .collect();
                let e = Tensor::from_vec(e, d.dims(), d.device())?;
                noisy.push(proj, (d + e)?);
            }
            out.push(noisy);
        }
        Ok(out)
    }
}
