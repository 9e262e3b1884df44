//! Adaptive K: with each draft accepted independently with probability α, a round of K drafts
//! yields (1 − α^{K+1}) / (1 − α) tokens (Leviathan et al. 2023, Eq. 1) at cost `round + K · draft`
//! (+ `per_position`); K maximises tokens per unit cost, α estimated by exponentially decayed
//! counts.

/// Costs of one round, in any consistent unit (e.g. ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundCost {
    /// Fixed cost of a verify round (forward pass, HE, round trips).
    pub round: f64,
    /// Cost of drafting one token.
    pub draft: f64,
    /// Marginal verify cost of one more position (0 with constant-K padding).
    pub per_position: f64,
}

impl RoundCost {
    fn of(&self, k: usize) -> f64 {
        self.round + k as f64 * (self.draft + self.per_position)
    }
}

/// Expected tokens produced by a round drafting `k` tokens when each is accepted independently with
/// probability `alpha` (bonus token included).
#[must_use]
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let a = alpha.clamp(0.0, 1.0);
    // Summed term by term: the closed form (1 − a^(k+1)) / (1 − a) cancels for a near 1.
    (0..=k)
        .fold((0.0, 1.0), |(sum, power): (f64, f64), _| {
            (sum + power, power * a)
        })
        .0
}

/// Chooses K within `[k_min, k_max]` from observed acceptance.
#[derive(Debug, Clone)]
pub struct AdaptiveK {
    k_min: usize,
    k_max: usize,
    decay: f64,
    successes: f64,
    trials: f64,
    cost: RoundCost,
}

impl AdaptiveK {
    /// A controller from prior rate `prior_alpha` worth `prior_weight` drafts; `decay` ∈ (0, 1]
    /// forgets old rounds; `k_min ≥ 1`, `k_max ≥ k_min`.
    #[must_use]
    pub fn new(
        k_min: usize,
        k_max: usize,
        prior_alpha: f64,
        prior_weight: f64,
        decay: f64,
        cost: RoundCost,
    ) -> Self {
        let k_min = k_min.max(1);
        let prior_alpha = prior_alpha.clamp(0.0, 1.0);
        Self {
            k_min,
            k_max: k_max.max(k_min),
            decay: decay.clamp(f64::MIN_POSITIVE, 1.0),
            successes: prior_alpha * prior_weight,
            trials: prior_weight,
            cost,
        }
    }

    /// The current estimate of the per-token acceptance rate α.
    #[must_use]
    pub fn alpha(&self) -> f64 {
        if self.trials > 0.0 {
            self.successes / self.trials
        } else {
            0.5
        }
    }

    /// Records a round that drafted `drafted` tokens and accepted `accepted`.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        let accepted = accepted.min(drafted);
        let failures = usize::from(accepted < drafted);
        self.successes = self.decay * self.successes + accepted as f64;
        self.trials = self.decay * self.trials + (accepted + failures) as f64;
    }

    /// Updates the cost model (e.g. from measured round times).
    pub fn set_cost(&mut self, cost: RoundCost) {
        self.cost = cost;
    }

    /// The K with the most expected tokens per unit cost.
    #[must_use]
    pub fn next_k(&self) -> usize {
        let alpha = self.alpha();
        let score = |k: usize| expected_tokens(alpha, k) / self.cost.of(k).max(f64::MIN_POSITIVE);
        (self.k_min..=self.k_max)
            .max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
            .unwrap_or(self.k_min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PADDED: RoundCost = RoundCost {
        round: 100.0,
        draft: 2.0,
        per_position: 0.0,
    };

    #[test]
    fn expected_tokens_matches_direct_sum() {
        for &a in &[0.0, 0.3, 0.72, 0.95] {
            for k in 0..10 {
                let direct: f64 = (0..=k).map(|i| f64::powi(a, i as i32)).sum();
                assert!((expected_tokens(a, k) - direct).abs() < 1e-12);
            }
        }
        assert_eq!(expected_tokens(1.0, 4), 5.0);
    }

    #[test]
    fn good_drafters_get_long_drafts_bad_ones_short() {
        let mut good = AdaptiveK::new(1, 8, 0.5, 4.0, 0.9, PADDED);
        let mut bad = good.clone();
        for _ in 0..50 {
            good.observe(8, 8);
            bad.observe(8, 0);
        }
        assert!(good.alpha() > 0.95);
        assert!(bad.alpha() < 0.05);
        assert_eq!(good.next_k(), 8);
        assert_eq!(bad.next_k(), 1);
    }

    #[test]
    fn expensive_drafting_shortens_k() {
        let mut cheap = AdaptiveK::new(1, 8, 0.72, 100.0, 1.0, PADDED);
        let dear = AdaptiveK::new(
            1,
            8,
            0.72,
            100.0,
            1.0,
            RoundCost {
                draft: 60.0,
                ..PADDED
            },
        );
        assert!(cheap.next_k() > dear.next_k());
        cheap.set_cost(dear.cost);
        assert_eq!(cheap.next_k(), dear.next_k());
    }
}
