//! Keys: ternary secret key, public key, and Galois keys for hybrid key switching with one special
//! prime (Bossuat et al., EUROCRYPT 2021, §3), switching to `σ_{g^{-1}}(s)` so hoisted digits need
//! no permutation (Halevi–Shoup, CRYPTO 2018, §5).

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::CryptoRng;

use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::sampling::{expand_uniform, gaussian, small_to_mod, ternary};

/// The ternary secret key `s` in NTT form for every prime. Never serialized or printed.
#[derive(Clone)]
pub struct SecretKey {
    pub(crate) ctx: Arc<Context>,
    /// Canonical NTT form over all primes (L + 2 limbs).
    pub(crate) s_ntt: Vec<u64>,
    /// N-scaled NTT form over all primes.
    pub(crate) s_scaled: Vec<u64>,
}

impl Drop for SecretKey {
    /// Best-effort wipe of the key material.
    fn drop(&mut self) {
        self.s_ntt.fill(0);
        self.s_scaled.fill(0);
        std::hint::black_box((&self.s_ntt, &self.s_scaled));
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

/// NTT form over the listed primes of a small signed polynomial.
pub(crate) fn small_ntt(
    ctx: &Context,
    coeffs: &[i8],
    primes: impl Iterator<Item = usize>,
) -> Vec<u64> {
    let n = ctx.degree();
    let primes: Vec<usize> = primes.collect();
    let mut out = vec![0u64; primes.len() * n];
    for (limb, &i) in out.chunks_exact_mut(n).zip(&primes) {
        let q = ctx.prime(i);
        for (x, &c) in limb.iter_mut().zip(coeffs) {
            *x = small_to_mod(c, q);
        }
        ctx.fwd(i, limb);
    }
    out
}

impl SecretKey {
    /// Samples a uniform ternary secret.
    pub fn generate<R: CryptoRng + ?Sized>(ctx: &Arc<Context>, rng: &mut R) -> Self {
        let n = ctx.degree();
        let s = ternary(rng, n);
        let s_ntt = small_ntt(ctx, &s, 0..=ctx.sp());
        let mut s_scaled = s_ntt.clone();
        for (i, limb) in s_scaled.chunks_exact_mut(n).enumerate() {
            ctx.scale_by_n(i, limb);
        }
        Self {
            ctx: ctx.clone(),
            s_ntt,
            s_scaled,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Limb `i` (prime index) of the N-scaled secret.
    pub(crate) fn scaled_limb(&self, i: usize) -> &[u64] {
        let n = self.ctx.degree();
        &self.s_scaled[i * n..(i + 1) * n]
    }
}

/// `−a·t + e` limb by limb (all in NTT form; `t` N-scaled) into `out`.
fn rlwe_b(
    ctx: &Context,
    a: &[u64],
    t_scaled: &[u64],
    e: &[u64],
    primes: &[usize],
    out: &mut [u64],
) {
    let n = ctx.degree();
    out.copy_from_slice(a);
    for (k, &i) in primes.iter().enumerate() {
        let r = k * n..(k + 1) * n;
        ctx.mul_scaled(i, &mut out[r.clone()], &t_scaled[i * n..(i + 1) * n]);
        let m = ctx.moduli[i];
        for (o, &ev) in out[r.clone()].iter_mut().zip(&e[r.clone()]) {
            *o = m.sub(ev, *o);
        }
    }
}

/// The public key `(b, a) = (−a·s + e, a)` modulo `Q_L` (NTT form), with `a` expanded from a seed.
#[derive(Clone)]
pub struct PublicKey {
    pub(crate) ctx: Arc<Context>,
    pub(crate) seed: [u8; 32],
    /// N-scaled `b` over the chain primes.
    pub(crate) b_scaled: Vec<u64>,
    /// N-scaled `a` over the chain primes.
    pub(crate) a_scaled: Vec<u64>,
}

impl PublicKey {
    /// Generates a public key for `sk`.
    pub fn generate<R: CryptoRng + ?Sized>(sk: &SecretKey, rng: &mut R) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        Self::from_seed_and_errors(sk, seed, rng)
    }

    fn from_seed_and_errors<R: CryptoRng + ?Sized>(
        sk: &SecretKey,
        seed: [u8; 32],
        rng: &mut R,
    ) -> Self {
        let ctx = &sk.ctx;
        let n = ctx.degree();
        let primes: Vec<usize> = (0..=ctx.max_level()).collect();
        let mut a = vec![0u64; primes.len() * n];
        expand_uniform(ctx, &seed, 0, primes.iter().copied(), &mut a);
        let e = small_ntt(ctx, &gaussian(rng, n), primes.iter().copied());
        let mut b = vec![0u64; a.len()];
        rlwe_b(ctx, &a, &sk.s_scaled, &e, &primes, &mut b);
        scale_pair_by_n(ctx, &mut a, &mut b);
        Self {
            ctx: ctx.clone(),
            seed,
            b_scaled: b,
            a_scaled: a,
        }
    }

    /// Rebuilds from the serialized parts (canonical `b`, seed).
    pub(crate) fn from_parts(ctx: &Arc<Context>, seed: [u8; 32], mut b: Vec<u64>) -> Self {
        let mut a = vec![0u64; b.len()];
        expand_uniform(ctx, &seed, 0, 0..=ctx.max_level(), &mut a);
        scale_pair_by_n(ctx, &mut a, &mut b);
        Self {
            ctx: ctx.clone(),
            seed,
            b_scaled: b,
            a_scaled: a,
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("degree", &self.ctx.degree())
            .finish_non_exhaustive()
    }
}

/// One Galois key (all digits) for one Galois element, at the maximum level.
#[derive(Clone, Debug, PartialEq)]
pub struct GaloisKey {
    pub(crate) galois_element: u64,
    pub(crate) seed: [u8; 32],
    /// Per digit i ∈ 0..=L: N-scaled `b_i` over `q_0..q_L, P` (L + 2 limbs).
    pub(crate) b_scaled: Vec<Vec<u64>>,
    /// Per digit: N-scaled `a_i` over the same primes.
    pub(crate) a_scaled: Vec<Vec<u64>>,
    /// `σ_g(x)[j] = x[perm[j]]` in NTT form.
    pub(crate) perm: Vec<u32>,
}

impl GaloisKey {
    /// The Galois element g (odd, < 2N).
    pub fn galois_element(&self) -> u64 {
        self.galois_element
    }

    fn generate<R: CryptoRng + ?Sized>(sk: &SecretKey, g: u64, rng: &mut R) -> Self {
        let ctx = &sk.ctx;
        let n = ctx.degree();
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let primes: Vec<usize> = ctx.qp_primes(ctx.max_level()).collect();
        // t = σ_{g^{-1}}(s), N-scaled.
        let inv_perm = ctx.galois_perm(ctx.galois_inverse(g));
        let mut t_scaled = vec![0u64; sk.s_scaled.len()];
        for (dst, src) in t_scaled
            .chunks_exact_mut(n)
            .zip(sk.s_scaled.chunks_exact(n))
        {
            for (d, &p) in dst.iter_mut().zip(&inv_perm) {
                *d = src[p as usize];
            }
        }
        let digits = ctx.max_level() + 1;
        let mut b_scaled = Vec::with_capacity(digits);
        let mut a_scaled = Vec::with_capacity(digits);
        for i in 0..digits {
            let mut a = vec![0u64; primes.len() * n];
            expand_uniform(ctx, &seed, i as u64, primes.iter().copied(), &mut a);
            let e = small_ntt(ctx, &gaussian(rng, n), primes.iter().copied());
            let mut b = vec![0u64; a.len()];
            rlwe_b(ctx, &a, &t_scaled, &e, &primes, &mut b);
            // Gadget term P·s in limb i only.
            let m = ctx.moduli[i];
            let p = ctx.p_mod[i];
            for (o, &s) in b[i * n..(i + 1) * n]
                .iter_mut()
                .zip(&sk.s_ntt[i * n..(i + 1) * n])
            {
                *o = m.add(*o, m.mul_shoup(s, p));
            }
            for (k, (la, lb)) in a.chunks_exact_mut(n).zip(b.chunks_exact_mut(n)).enumerate() {
                ctx.scale_by_n(primes[k], la);
                ctx.scale_by_n(primes[k], lb);
            }
            b_scaled.push(b);
            a_scaled.push(a);
        }
        Self {
            galois_element: g,
            seed,
            b_scaled,
            a_scaled,
            perm: ctx.galois_perm(g),
        }
    }

    /// Rebuilds from the serialized parts (canonical `b_i`, seed).
    pub(crate) fn from_parts(ctx: &Context, g: u64, seed: [u8; 32], mut b: Vec<Vec<u64>>) -> Self {
        let n = ctx.degree();
        let primes: Vec<usize> = ctx.qp_primes(ctx.max_level()).collect();
        let mut a_scaled = Vec::with_capacity(b.len());
        for (i, bi) in b.iter_mut().enumerate() {
            let mut a = vec![0u64; primes.len() * n];
            expand_uniform(ctx, &seed, i as u64, primes.iter().copied(), &mut a);
            for (k, (la, lb)) in a
                .chunks_exact_mut(n)
                .zip(bi.chunks_exact_mut(n))
                .enumerate()
            {
                ctx.scale_by_n(primes[k], la);
                ctx.scale_by_n(primes[k], lb);
            }
            a_scaled.push(a);
        }
        Self {
            galois_element: g,
            seed,
            b_scaled: b,
            a_scaled,
            perm: ctx.galois_perm(g),
        }
    }
}

/// A set of Galois keys indexed by Galois element.
#[derive(Clone)]
pub struct GaloisKeys {
    pub(crate) ctx: Arc<Context>,
    pub(crate) keys: BTreeMap<u64, GaloisKey>,
}

impl GaloisKeys {
    /// Keys for left rotations by `steps` slots (negative: right); 0 skipped, duplicates once.
    pub fn generate<R: CryptoRng + ?Sized>(sk: &SecretKey, steps: &[i64], rng: &mut R) -> Self {
        let mut keys = BTreeMap::new();
        for &s in steps {
            let g = sk.ctx.galois_element(s);
            if g == 1 || keys.contains_key(&g) {
                continue;
            }
            keys.insert(g, GaloisKey::generate(sk, g, rng));
        }
        Self {
            ctx: sk.ctx.clone(),
            keys,
        }
    }

    /// No keys: for an evaluator that only encodes plaintexts (an adapter server encoding its
    /// diagonals before any client has sent keys). Every rotation with it fails.
    #[must_use]
    pub fn none(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: ctx.clone(),
            keys: BTreeMap::new(),
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The key for Galois element `g`, if present.
    pub fn get(&self, g: u64) -> Option<&GaloisKey> {
        self.keys.get(&g)
    }

    /// The key for a rotation by `step` slots. Errors: [`CkksError::MissingGaloisKey`].
    pub fn for_step(&self, ctx: &Context, step: i64) -> Result<&GaloisKey> {
        let g = ctx.galois_element(step);
        self.keys.get(&g).ok_or(CkksError::MissingGaloisKey {
            step,
            galois_element: g,
        })
    }

    /// The Galois elements present, ascending.
    pub fn galois_elements(&self) -> Vec<u64> {
        self.keys.keys().copied().collect()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl std::fmt::Debug for GaloisKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GaloisKeys")
            .field("degree", &self.ctx.degree())
            .field("galois_elements", &self.galois_elements())
            .finish()
    }
}

/// Multiplies both parts of a key by N (the stored form).
fn scale_pair_by_n(ctx: &Context, a: &mut [u64], b: &mut [u64]) {
    let n = ctx.degree();
    for (i, (la, lb)) in a.chunks_exact_mut(n).zip(b.chunks_exact_mut(n)).enumerate() {
        ctx.scale_by_n(i, la);
        ctx.scale_by_n(i, lb);
    }
}
