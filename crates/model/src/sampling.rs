//! Token sampling: greedy, temperature, top-k, top-p (Holtzman et al. 2020), repetition penalty
//! (CTRL, Keskar et al. 2019, §4.1), seeded ChaCha20; full probability vectors for speculative
//! sampling (Leviathan et al. 2023, Alg. 1).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::ModelError;

/// Sampling hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Keep only the k most likely tokens (None: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose mass reaches p (None: all).
    pub top_p: Option<f32>,
    /// Repetition penalty θ ≥ 1 over the history (1: off).
    pub repetition_penalty: f32,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether these parameters decode greedily (temperature 0).
    #[must_use]
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A seeded sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
}

impl Sampler {
    /// A sampler with `params`. Errors: [`ModelError::Sampling`] for a negative or non-finite
    /// temperature, top_k = 0, top_p outside (0, 1], or a non-positive penalty.
    pub fn new(params: SamplingParams) -> Result<Self, ModelError> {
        if !(params.temperature >= 0.0 && params.temperature.is_finite()) {
            return Err(ModelError::Sampling(format!(
                "temperature {} must be finite and ≥ 0",
                params.temperature
            )));
        }
        if params.top_k == Some(0) {
            return Err(ModelError::Sampling("top_k must be ≥ 1".into()));
        }
        if let Some(p) = params.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ModelError::Sampling(format!("top_p {p} must be in (0, 1]")));
        }
        if !(params.repetition_penalty > 0.0 && params.repetition_penalty.is_finite()) {
            return Err(ModelError::Sampling(format!(
                "repetition penalty {} must be positive",
                params.repetition_penalty
            )));
        }
        let rng = ChaCha20Rng::seed_from_u64(params.seed);
        Ok(Sampler { params, rng })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether sampling is greedy (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// The distribution drawn from, over the vocabulary (penalty, temperature, softmax, top-k,
    /// top-p); greedy: one-hot. `logits`: one row (vocab).
    pub fn probs(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut l = logits.to_vec();
        let theta = self.params.repetition_penalty;
        if theta != 1.0 {
            let mut seen = vec![false; l.len()];
            for &t in history {
                if let Some(s) = seen.get_mut(t as usize)
                    && !*s
                {
                    *s = true;
                    let x = &mut l[t as usize];
                    *x = if *x > 0.0 { *x / theta } else { *x * theta };
                }
            }
        }
        let mut p = vec![0f32; l.len()];
        if l.is_empty() {
            return p;
        }
        if self.is_greedy() {
            p[argmax(&l)] = 1.0;
            return p;
        }
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let t = self.params.temperature;
        let mut sum = 0f64;
        for (pi, &li) in p.iter_mut().zip(&l) {
            *pi = ((li - max) / t).exp();
            sum += *pi as f64;
        }
        for pi in p.iter_mut() {
            *pi = (*pi as f64 / sum) as f32;
        }
        if self.params.top_k.is_some() || self.params.top_p.is_some() {
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut keep = self.params.top_k.unwrap_or(p.len()).min(p.len());
            if let Some(top_p) = self.params.top_p {
                let mut cum = 0f32;
                for (i, &idx) in order.iter().enumerate().take(keep) {
                    cum += p[idx];
                    if cum >= top_p {
                        keep = i + 1;
                        break;
                    }
                }
            }
            let mut q = vec![0f32; p.len()];
            let mut s = 0f64;
            for &idx in &order[..keep.max(1)] {
                q[idx] = p[idx];
                s += p[idx] as f64;
            }
            for qi in q.iter_mut() {
                *qi = (*qi as f64 / s) as f32;
            }
            p = q;
        }
        p
    }

    /// Draws a token from a probability vector (e.g. speculative decoding's residual distribution).
    /// Falls back to the argmax if `probs` sums to ~0.
    pub fn sample_from(&mut self, probs: &[f32]) -> u32 {
        let total: f64 = probs.iter().map(|&x| x as f64).sum();
        if total.is_nan() || total <= 0.0 {
            return argmax(probs) as u32;
        }
        let u = self.rng.random::<f64>() * total;
        let mut cum = 0f64;
        let mut last = 0;
        for (i, &x) in probs.iter().enumerate() {
            if x > 0.0 {
                cum += x as f64;
                last = i;
                if u < cum {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    /// Picks the next token from one row of logits given the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.is_greedy() && self.params.repetition_penalty == 1.0 {
            return argmax(logits) as u32;
        }
        let p = self.probs(logits, history);
        if self.is_greedy() {
            return argmax(&p) as u32;
        }
        self.sample_from(&p)
    }

    /// A uniform draw in [0, 1) from the sampler's RNG (speculative acceptance tests).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }
}

/// Index of the largest value (lowest on ties, NaN never wins): the one greedy rule everywhere, so
/// outputs compare token for token.
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, rp: f32) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            repetition_penalty: rp,
            seed: 7,
        })
        .unwrap()
    }

    #[test]
    fn greedy_is_argmax_and_one_hot() {
        let s = sampler(0.0, None, None, 1.0);
        let l = [0.1, 2.0, 2.0, -1.0];
        assert_eq!(s.probs(&l, &[]), vec![0.0, 1.0, 0.0, 0.0]);
        let mut s = s;
        assert_eq!(s.sample(&l, &[]), 1);
    }

    #[test]
    fn temperature_probs_match_softmax() {
        let s = sampler(2.0, None, None, 1.0);
        let l = [1.0f32, 2.0, 3.0];
        let e: Vec<f64> = l.iter().map(|&x| (x as f64 / 2.0).exp()).collect();
        let z: f64 = e.iter().sum();
        for (p, e) in s.probs(&l, &[]).iter().zip(&e) {
            assert!((*p as f64 - e / z).abs() < 1e-6);
        }
    }

    #[test]
    fn top_k_and_top_p_truncate_and_renormalise() {
        let l = [0.0f32, 1.0, 2.0, 3.0];
        let p = sampler(1.0, Some(2), None, 1.0).probs(&l, &[]);
        assert_eq!((p[0], p[1]), (0.0, 0.0));
        assert!((p[2] + p[3] - 1.0).abs() < 1e-6 && p[3] > p[2]);
        // softmax(l) ≈ [0.032, 0.087, 0.237, 0.644]: top_p 0.5 keeps only id 3.
        let p = sampler(1.0, None, Some(0.5), 1.0).probs(&l, &[]);
        assert_eq!(p, vec![0.0, 0.0, 0.0, 1.0]);
        let p = sampler(1.0, None, Some(0.8), 1.0).probs(&l, &[]);
        assert!(p[2] > 0.0 && p[1] == 0.0);
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative() {
        let s = sampler(0.0, None, None, 2.0);
        // id 0 (3.0 → 1.5) loses to id 1 (2.0); id 2 (-1 → -2) is pushed down.
        assert_eq!(s.probs(&[3.0, 2.0, -1.0], &[0, 0, 2]), vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_probs() {
        let l = [0.0f32, 0.0, 1.0];
        let mut a = sampler(1.0, None, None, 1.0);
        let mut b = sampler(1.0, None, None, 1.0);
        let xs: Vec<u32> = (0..2000).map(|_| a.sample(&l, &[])).collect();
        let ys: Vec<u32> = (0..2000).map(|_| b.sample(&l, &[])).collect();
        assert_eq!(xs, ys);
        let frac = xs.iter().filter(|&&x| x == 2).count() as f64 / 2000.0;
        let want = 1f64.exp() / (2.0 + 1f64.exp());
        assert!((frac - want).abs() < 0.05, "{frac} vs {want}");
    }

    #[test]
    fn bad_params_are_rejected() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_k: Some(0),
                ..Default::default()
            },
            SamplingParams {
                top_p: Some(1.5),
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(matches!(Sampler::new(p), Err(ModelError::Sampling(_))));
        }
    }
}
