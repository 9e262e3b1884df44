//! Shared test helpers: deterministic random adapters and activations, and the accuracy / leak
//! checks.
#![allow(dead_code)]

use cipherlora_helora::he_traits::Complex64;
use cipherlora_helora::{
    GroupAdapter, GroupClient, GroupPlan, GroupShape, HeClient, HeServer, Mode, PreparedGroup,
    ProjectionAdapter,
};

/// SplitMix64: a tiny deterministic generator for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// A random adapter of `shape` (A ~ U(±1/√d_in), B ~ U(±1/√r), alpha = 2r).
pub fn random_adapter(shape: &GroupShape, seed: u64) -> GroupAdapter {
    let mut rng = Rng::new(seed);
    let projections = shape
        .d_outs
        .iter()
        .zip(&shape.ranks)
        .enumerate()
        .map(|(i, (&d, &r))| ProjectionAdapter {
            name: format!("p{i}"),
            d_out: d,
            rank: r,
            a: rng.vec(r * shape.d_in, 1.0 / (shape.d_in as f32).sqrt()),
            b: rng.vec(d * r, 1.0 / (r as f32).sqrt()),
            scaling: 2.0,
        })
        .collect();
    GroupAdapter {
        d_in: shape.d_in,
        projections,
    }
}

/// Random activations, position-major T × d_in.
pub fn random_x(t: usize, d_in: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed ^ 0x5eed).vec(t * d_in, 1.0)
}

/// Result of one end-to-end evaluation.
pub struct Outcome {
    /// Every slot of every returned ciphertext, decrypted (both parts; normalised inputs).
    pub slots: Vec<Vec<Complex64>>,
    /// Max |Δ_he − Δ_ref| over the delta slots.
    pub max_err: f64,
    /// Max |Δ_ref|.
    pub max_ref: f64,
    /// Max |value| over the slot parts (real or imaginary) that must be zero.
    pub max_outside: f64,
}

impl Outcome {
    /// Bits of precision: −log2(max_err / max_ref).
    pub fn bits(&self) -> f64 {
        if self.max_err == 0.0 {
            f64::INFINITY
        } else {
            -(self.max_err / self.max_ref).log2()
        }
    }
}

/// Runs client → wire bytes → server → wire bytes → client for one group.
pub fn run<S: HeServer, C: HeClient>(
    server: &S,
    client: &C,
    plan: &GroupPlan,
    adapter: &GroupAdapter,
    x: &[f32],
) -> Outcome {
    let gc = match plan.mode {
        Mode::Ffa => {
            let a: Vec<Vec<f32>> = adapter.projections.iter().map(|p| p.a.clone()).collect();
            GroupClient::ffa(plan, &a).unwrap()
        }
        Mode::Standard => GroupClient::standard(plan).unwrap(),
    };
    let prepared = PreparedGroup::new(server, plan, adapter).unwrap();
    let (req, scales) = gc.encrypt(client, x).unwrap();
    // Each position was normalised by a power of two ≥ its max |input|.
    assert_eq!(scales.factors().len(), plan.t);
    let c_max = scales.factors().iter().fold(0.0f64, |m, &c| m.max(c));
    let resp = prepared.handle(server, &req, 0).unwrap();
    let slots = gc.decrypt_all(client, &resp).unwrap();
    let reference = adapter.reference_delta(x).unwrap();
    let (mut max_err, mut max_ref, mut max_outside) = (0.0f64, 0.0f64, 0.0f64);
    let mut seen: Vec<Vec<bool>> = reference.iter().map(|r| vec![false; r.len()]).collect();
    // Every part of every slot: a requested delta, or zero.
    for (vals, map) in slots.iter().zip(gc.output_map()) {
        for (v, parts) in vals.iter().zip(map) {
            for (value, m) in [v.re, v.im].into_iter().zip(parts) {
                match m {
                    Some(ix) => {
                        let d = plan.shape.d_outs[ix.proj];
                        let want = reference[ix.proj][ix.pos * d + ix.row];
                        let value = value * scales.factor(ix.pos).unwrap();
                        assert!(!seen[ix.proj][ix.pos * d + ix.row], "delta placed twice");
                        seen[ix.proj][ix.pos * d + ix.row] = true;
                        max_err = max_err.max((value - want).abs());
                        max_ref = max_ref.max(want.abs());
                    }
                    // In delta units of the most scaled position.
                    None => max_outside = max_outside.max(value.abs() * c_max),
                }
            }
        }
    }
    assert!(
        seen.iter().flatten().all(|&s| s),
        "some delta is missing from the output map"
    );
    // Unpacking agrees with the map (and with the reference).
    let unpacked = gc.unpack(&slots, &scales).unwrap();
    for (u, r) in unpacked.iter().zip(&reference) {
        assert_eq!(u.len(), r.len());
        for (&u, &r) in u.iter().zip(r) {
            let tol = 1e-3 * max_ref.max(1.0);
            assert!((f64::from(u) - r).abs() <= tol, "unpacked {u} vs {r}");
        }
    }
    Outcome {
        slots,
        max_err,
        max_ref,
        max_outside,
    }
}
