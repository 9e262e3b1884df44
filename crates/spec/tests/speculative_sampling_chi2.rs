//! Speculative sampling must follow the target distribution exactly.
//!
//! Target and drafter are two different Markov chains over a small
//! vocabulary. Two tokens are generated from a fixed context by repeated
//! speculative rounds (K = 3); over 20,000 seeded draws the empirical joint
//! distribution of the two tokens must pass a χ² goodness-of-fit test
//! against the target chain, and two deliberately wrong acceptance rules
//! (resampling from p instead of norm(max(0, p − q)); accepting every draft)
//! must fail it. Seeds are fixed, so the test is deterministic.

use cipherlora_spec::acceptance::{DraftProbs, RoundOutcome, accept_sampled, sample};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{ChiSquared, ContinuousCDF};

const V: usize = 8;
const K: usize = 3;
const DRAWS: usize = 20_000;
const CONTEXT: u32 = 2;

fn chain(seed: u64, sharpness: f64) -> Vec<Vec<f32>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..V)
        .map(|_| {
            let w: Vec<f64> = (0..V)
                .map(|_| rng.random::<f64>().powf(sharpness))
                .collect();
            let s: f64 = w.iter().sum();
            w.iter().map(|x| (x / s) as f32).collect()
        })
        .collect()
}

type Rule = fn(&[u32], &[Vec<f32>], &[Vec<f32>], &mut ChaCha20Rng) -> RoundOutcome;

fn correct(d: &[u32], q: &[Vec<f32>], p: &[Vec<f32>], rng: &mut ChaCha20Rng) -> RoundOutcome {
    accept_sampled(d, DraftProbs::Sampled(q), p, rng).unwrap()
}

/// Wrong: on rejection, resamples from p instead of the residual.
fn resample_from_p(
    d: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> RoundOutcome {
    let mut tokens = Vec::new();
    for (i, &t) in d.iter().enumerate() {
        let ratio = f64::from(p[i][t as usize]) / f64::from(q[i][t as usize]);
        if rng.random::<f64>() < ratio {
            tokens.push(t);
        } else {
            tokens.push(sample(&p[i], rng));
            return RoundOutcome {
                accepted: i,
                tokens,
            };
        }
    }
    tokens.push(sample(&p[d.len()], rng));
    RoundOutcome {
        accepted: d.len(),
        tokens,
    }
}

/// Wrong: accepts every draft.
fn accept_all(d: &[u32], _q: &[Vec<f32>], p: &[Vec<f32>], rng: &mut ChaCha20Rng) -> RoundOutcome {
    let mut tokens = d.to_vec();
    tokens.push(sample(&p[d.len()], rng));
    RoundOutcome {
        accepted: d.len(),
        tokens,
    }
}

/// Generates two tokens after `CONTEXT` with speculative rounds.
fn two_tokens(
    target: &[Vec<f32>],
    draft: &[Vec<f32>],
    rule: Rule,
    rng: &mut ChaCha20Rng,
) -> (u32, u32) {
    let mut out = vec![CONTEXT];
    while out.len() < 3 {
        let last = *out.last().unwrap();
        let mut drafts = Vec::with_capacity(K);
        let mut q = Vec::with_capacity(K);
        let mut prev = last;
        for _ in 0..K {
            let row = draft[prev as usize].clone();
            prev = sample(&row, rng);
            drafts.push(prev);
            q.push(row);
        }
        let p: Vec<Vec<f32>> = std::iter::once(last)
            .chain(drafts.iter().copied())
            .map(|t| target[t as usize].clone())
            .collect();
        out.extend(rule(&drafts, &q, &p, rng).tokens);
    }
    (out[1], out[2])
}

/// χ² p-value of the observed joint counts against the target chain.
fn p_value(rule: Rule, seed: u64) -> f64 {
    let target = chain(11, 2.0);
    let draft = chain(12, 2.0);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut counts = vec![0usize; V * V];
    for _ in 0..DRAWS {
        let (a, b) = two_tokens(&target, &draft, rule, &mut rng);
        counts[a as usize * V + b as usize] += 1;
    }
    // Cells with expected count < 5 are pooled into one rest bucket.
    let (mut chi2, mut cells, mut rest_obs, mut rest_exp) = (0.0, 0usize, 0.0, 0.0);
    for a in 0..V {
        for b in 0..V {
            let e = DRAWS as f64 * f64::from(target[CONTEXT as usize][a]) * f64::from(target[a][b]);
            let o = counts[a * V + b] as f64;
            if e < 5.0 {
                rest_obs += o;
                rest_exp += e;
            } else {
                chi2 += (o - e).powi(2) / e;
                cells += 1;
            }
        }
    }
    if rest_exp > 0.0 {
        chi2 += (rest_obs - rest_exp).powi(2) / rest_exp;
        cells += 1;
    }
    let dist = ChiSquared::new((cells - 1) as f64).unwrap();
    1.0 - dist.cdf(chi2)
}

#[test]
fn speculative_sampling_follows_the_target_distribution() {
    let p = p_value(correct, 1);
    assert!(p > 1e-3, "correct rule rejected by χ²: p = {p}");
}

#[test]
fn chi2_detects_resampling_from_p_instead_of_the_residual() {
    let p = p_value(resample_from_p, 1);
    assert!(p < 1e-6, "wrong rule passed χ²: p = {p}");
}

#[test]
fn chi2_detects_accepting_every_draft() {
    let p = p_value(accept_all, 1);
    assert!(p < 1e-6, "wrong rule passed χ²: p = {p}");
}

#[test]
fn point_mass_drafts_also_follow_the_target() {
    // A deterministic drafter (n-gram lookup) proposes token 0 at every
    // position; the first generated token must still be distributed as p.
    let target = chain(21, 2.0);
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let mut counts = [0usize; V];
    for _ in 0..DRAWS {
        let drafts = [0u32; K];
        let p: Vec<Vec<f32>> = std::iter::once(CONTEXT)
            .chain(drafts)
            .map(|t| target[t as usize].clone())
            .collect();
        let out = accept_sampled(&drafts, DraftProbs::PointMass, &p, &mut rng).unwrap();
        counts[out.tokens[0] as usize] += 1;
    }
    let row = &target[CONTEXT as usize];
    let chi2: f64 = (0..V)
        .map(|t| {
            let e = DRAWS as f64 * f64::from(row[t]);
            (counts[t] as f64 - e).powi(2) / e
        })
        .sum();
    let p = 1.0 - ChiSquared::new((V - 1) as f64).unwrap().cdf(chi2);
    assert!(p > 1e-3, "point-mass acceptance biased: p = {p}");
}
