//! Drawing a token by an exponential race (the Gumbel-max trick as exponential clocks; Huijben et
//! al. 2022, §2): token t rings at E_t / w_t, E_t ~ Exp(1), winning with probability w_t / Σw.
//! Unlike an inverse CDF, the winner is stable under small relative weight errors, which
//! [`crate::draw_bounds`] needs.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One row's clocks' Exp(1) variables, token by token, from a 64-bit seed (ChaCha8): the same seed
/// gives the same race.
#[derive(Debug, Clone)]
pub struct Race {
    clocks: Vec<f64>,
}

impl Race {
    /// The race of `n` tokens seeded by `seed`.
    #[must_use]
    pub fn new(seed: u64, n: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // U ∈ (0, 1]: 1 − U' with U' ∈ [0, 1), so −ln U is finite.
        let clocks = (0..n).map(|_| -(1.0 - rng.random::<f64>()).ln()).collect();
        Self { clocks }
    }

    /// The token whose clock rings first among positive weights (lowest index on ties); `None` if
    /// none is positive. Reads `w` for `0..n`.
    pub fn winner(&self, w: impl Fn(usize) -> f64) -> Option<u32> {
        let mut best: Option<(usize, f64)> = None;
        for (t, &e) in self.clocks.iter().enumerate() {
            let wt = w(t);
            if wt > 0.0 {
                let ring = e / wt;
                if best.is_none_or(|(_, b)| ring < b) {
                    best = Some((t, ring));
                }
            }
        }
        best.map(|(t, _)| t as u32)
    }

    /// Whether token `t` wins for every w with lo ≤ w ≤ hi: E_t / lo_t before every other E_s /
    /// hi_s.
    pub fn wins_within(
        &self,
        t: usize,
        lo: impl Fn(usize) -> f64,
        hi: impl Fn(usize) -> f64,
    ) -> bool {
        let Some(&e) = self.clocks.get(t) else {
            return false;
        };
        let low = lo(t);
        if low <= 0.0 {
            return false;
        }
        let latest = e / low;
        self.clocks.iter().enumerate().all(|(s, &es)| {
            let h = hi(s);
            s == t || h <= 0.0 || es / h > latest
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_race_is_distributed_as_its_weights() {
        let w = [0.5, 0.0, 2.0, 1.5];
        let mut counts = [0usize; 4];
        let n = 40_000;
        for seed in 0..n {
            let t = Race::new(seed, w.len()).winner(|t| w[t]).unwrap();
            counts[t as usize] += 1;
        }
        let total: f64 = w.iter().sum();
        // χ² over the three tokens of positive weight (2 degrees of freedom; 13.8 is the 0.999
        // quantile).
        let chi2: f64 = [0, 2, 3]
            .iter()
            .map(|&t| {
                let want = n as f64 * w[t] / total;
                (counts[t] as f64 - want).powi(2) / want
            })
            .sum();
        assert_eq!(counts[1], 0);
        assert!(chi2 < 13.8, "χ² = {chi2}, counts {counts:?}");
    }

    #[test]
    fn a_winner_far_ahead_wins_within_a_bound_and_a_near_tie_does_not() {
        let race = Race::new(7, 3);
        let w = [1.0, 1.0, 1.0];
        let t = race.winner(|t| w[t]).unwrap() as usize;
        let rings: Vec<f64> = race.clocks.clone();
        let mut others: Vec<f64> = (0..3).filter(|&s| s != t).map(|s| rings[s]).collect();
        others.sort_by(f64::total_cmp);
        let gap = others[0] / rings[t];
        assert!(gap > 1.0);
        // A bound tighter than the gap keeps the winner; one wider loses it.
        let f = gap.sqrt().sqrt();
        assert!(race.wins_within(t, |s| w[s] / f, |s| w[s] * f));
        let g = gap.sqrt() * 1.01;
        assert!(!race.wins_within(t, |s| w[s] / g, |s| w[s] * g));
        assert!(race.winner(|_| 0.0).is_none());
    }
}
