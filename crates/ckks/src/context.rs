//! The shared evaluation context: NTT plans, RNS constants and Galois slot permutations.

use std::collections::HashMap;
use std::sync::Arc;

use tfhe_ntt::prime64::Plan;

use crate::error::{CkksError, Result};
use crate::lazy_dot::{LazyDot, Term};
use crate::modular::{Modulus, ShoupConst};
use crate::params::CkksParameters;
use crate::pool::BufferPool;

/// NTT plans and RNS constants for one parameter set; prime `L + 1` is the special prime `P`.
pub struct Context {
    params: CkksParameters,
    n: usize,
    log_n: u32,
    pub(crate) moduli: Vec<Modulus>,
    plans: Vec<Plan>,
    /// `N mod p` for every prime (plaintexts and keys are stored N-scaled).
    pub(crate) n_mod: Vec<ShoupConst>,
    /// `P mod q_i`.
    pub(crate) p_mod: Vec<ShoupConst>,
    /// SIMD constants `P·N mod q_i`, per chain prime.
    pub(crate) p_mod_vec: Vec<Vec<u64>>,
    /// `N` per prime (all primes), to N-scale a limb in one SIMD pass.
    pub(crate) n_sq_vec: Vec<Vec<u64>>,
    /// `P^{-1}` per chain prime `i`.
    pub(crate) p_inv_vec: Vec<Vec<u64>>,
    /// `q_l^{-1}` mod `q_i` at `[l][i]`, `i < l`.
    pub(crate) rescale_inv_vec: Vec<Vec<Vec<u64>>>,
    /// `(P·q_l)^{-1}` mod `q_i` at `[l][i]`, `i < l` (fused ModDown + rescale).
    pub(crate) pq_inv_vec: Vec<Vec<Vec<u64>>>,
    /// `ntt_exp[j]`: odd `e` such that NTT output `j` is the evaluation at `ψ^e`.
    ntt_exp: Vec<u32>,
    /// Inverse of `ntt_exp` over odd exponents `< 2N`.
    exp_idx: Vec<u32>,
    /// The many-term dot-product kernel per prime, where it runs (`None`: tfhe-ntt path).
    lazy: Vec<Option<LazyDot>>,
    /// Per prime, the AVX2 + FMA NTT on CPUs without IFMA (same outputs as `plans`).
    #[cfg(target_arch = "x86_64")]
    fma_ntt: Vec<Option<crate::fma::ntt::Ntt>>,
    /// One limb of zeros (the absent half of a one-sided [`Term`]).
    pub(crate) zero_limb: Vec<u64>,
    /// Reusable buffers for public polynomials.
    pub(crate) pool: BufferPool,
    digest: u64,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("degree", &self.n)
            .field("moduli", &self.params.moduli())
            .field("special", &self.params.special_moduli())
            .finish()
    }
}

impl Context {
    /// Builds NTT plans and RNS constants. Errors: [`CkksError::InvalidParameters`].
    pub fn new(params: CkksParameters) -> Result<Arc<Self>> {
        let n = params.degree();
        let all: Vec<u64> = params
            .moduli()
            .iter()
            .chain(params.special_moduli())
            .copied()
            .collect();
        let moduli: Vec<Modulus> = all.iter().map(|&q| Modulus::new(q)).collect();
        let plans = all
            .iter()
            .map(|&q| Plan::try_new(n, q))
            .collect::<Option<Vec<_>>>()
            .ok_or(CkksError::InvalidParameters {
                reason: "no negacyclic NTT plan for a prime",
            })?;
        let n_mod = moduli.iter().map(|m| m.shoup(n as u64)).collect();
        let l_max = params.max_level();
        let p = all[l_max + 1];
        let p_mod: Vec<ShoupConst> = (0..=l_max).map(|i| moduli[i].shoup(p)).collect();
        let splat = |i: usize, c: u64| {
            let m = &moduli[i];
            vec![m.mul(m.reduce(c), m.reduce(n as u64)); n]
        };
        let p_inv_raw: Vec<u64> = (0..=l_max)
            .map(|i| moduli[i].inv(moduli[i].reduce(p)))
            .collect();
        let p_mod_vec = (0..=l_max).map(|i| splat(i, p)).collect();
        let n_sq_vec = (0..all.len()).map(|i| splat(i, n as u64)).collect();
        let p_inv_vec = (0..=l_max).map(|i| splat(i, p_inv_raw[i])).collect();
        let rescale_inv_vec = (0..=l_max)
            .map(|l| {
                (0..l)
                    .map(|i| splat(i, moduli[i].inv(moduli[i].reduce(all[l]))))
                    .collect()
            })
            .collect();
        let pq_inv_vec = (0..=l_max)
            .map(|l| {
                (0..l)
                    .map(|i| {
                        let m = &moduli[i];
                        splat(i, m.mul(p_inv_raw[i], m.inv(m.reduce(all[l]))))
                    })
                    .collect()
            })
            .collect();

        // Transforming the monomial X gives each NTT output position's evaluation point.
        let m0 = moduli[0];
        let mut x = vec![0u64; n];
        x[1] = 1;
        plans[0].fwd(&mut x);
        let psi = x[0];
        let two_n = 2 * n;
        let mut power_to_exp: HashMap<u64, u32> = HashMap::with_capacity(n);
        let psi2 = m0.mul(psi, psi);
        let mut cur = psi;
        for k in 0..n {
            power_to_exp.insert(cur, (2 * k + 1) as u32);
            cur = m0.mul(cur, psi2);
        }
        let ntt_exp: Vec<u32> = x
            .iter()
            .map(|w| power_to_exp.get(w).copied())
            .collect::<Option<Vec<_>>>()
            .ok_or(CkksError::InvalidParameters {
                reason: "NTT outputs are not the odd powers of a 2N-th root",
            })?;
        let mut exp_idx = vec![u32::MAX; two_n];
        for (j, &e) in ntt_exp.iter().enumerate() {
            exp_idx[e as usize] = j as u32;
        }
        #[cfg(target_arch = "x86_64")]
        let fma_ntt = fma_ntts(&plans, &all, n);
        Ok(Arc::new(Self {
            digest: params.digest(),
            params,
            n,
            log_n: n.trailing_zeros(),
            moduli,
            plans,
            n_mod,
            p_mod,
            p_mod_vec,
            n_sq_vec,
            p_inv_vec,
            rescale_inv_vec,
            pq_inv_vec,
            ntt_exp,
            exp_idx,
            lazy: all.iter().map(|&q| LazyDot::new(q, n)).collect(),
            #[cfg(target_arch = "x86_64")]
            fma_ntt,
            zero_limb: vec![0; n],
            pool: BufferPool::default(),
        }))
    }

    /// Digest of N and the primes: operations refuse objects of another context.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// [`CkksError::ParameterMismatch`] unless `digest` is this context's.
    pub(crate) fn check(&self, digest: u64) -> Result<()> {
        if digest == self.digest {
            Ok(())
        } else {
            Err(CkksError::ParameterMismatch {
                what: "object from another parameter set",
            })
        }
    }

    /// The parameters.
    pub fn params(&self) -> &CkksParameters {
        &self.params
    }
    /// Ring degree N.
    pub fn degree(&self) -> usize {
        self.n
    }
    /// log2 N.
    pub fn log_degree(&self) -> u32 {
        self.log_n
    }
    /// Number of slots N/2.
    pub fn slots(&self) -> usize {
        self.n / 2
    }
    /// Maximum level L.
    pub fn max_level(&self) -> usize {
        self.params.max_level()
    }
    /// Index of the special prime P among the context's primes.
    pub(crate) fn sp(&self) -> usize {
        self.params.max_level() + 1
    }
    /// The prime with index `i` (chain primes, then P).
    pub(crate) fn prime(&self, i: usize) -> u64 {
        self.moduli[i].q
    }

    /// Prime indices of a polynomial over `Q_l · P`.
    pub(crate) fn qp_primes(&self, level: usize) -> impl Iterator<Item = usize> + Clone {
        (0..=level).chain(std::iter::once(self.sp()))
    }

    /// Forward negacyclic NTT modulo prime `i` (tfhe-ntt's bit-reversed order).
    #[inline]
    pub(crate) fn fwd(&self, i: usize, buf: &mut [u64]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(ntt) = &self.fma_ntt[i] {
            ntt.forward(buf);
            return;
        }
        self.plans[i].fwd(buf);
    }

    /// Inverse NTT (evaluations → coefficients) modulo prime `i`.
    #[inline]
    pub(crate) fn inv(&self, i: usize, buf: &mut [u64]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(ntt) = &self.fma_ntt[i] {
            ntt.inverse(buf);
            return;
        }
        self.plans[i].inv(buf);
        self.plans[i].normalize(buf);
    }

    /// `buf ← buf · N^{-1}` modulo prime `i` (SIMD).
    #[inline]
    pub(crate) fn normalize(&self, i: usize, buf: &mut [u64]) {
        self.plans[i].normalize(buf);
    }

    /// `lhs ← lhs · rhs · N^{-1}` modulo prime `i` (the plain product for N-scaled `rhs`).
    #[inline]
    pub(crate) fn mul_scaled(&self, i: usize, lhs: &mut [u64], rhs_scaled: &[u64]) {
        if let Some(k) = &self.lazy[i]
            && k.mul_assign(lhs, rhs_scaled)
        {
            return;
        }
        self.plans[i].mul_assign_normalize(lhs, rhs_scaled);
    }

    /// `out0 ← N^{-1}·Σ_k x0_k ⊙ w0_k`, `out1 ← N^{-1}·Σ_k x1_k ⊙ w1_k` mod prime `i`.
    pub(crate) fn dot2(&self, i: usize, terms: &[Term<'_>], out0: &mut [u64], out1: &mut [u64]) {
        if let Some(k) = &self.lazy[i] {
            k.dot2(terms, out0, out1);
            return;
        }
        out0.fill(0);
        out1.fill(0);
        for t in terms {
            self.mul_acc(i, out0, t.x0, t.w0);
            self.mul_acc(i, out1, t.x1, t.w1);
        }
        self.normalize(i, out0);
        self.normalize(i, out1);
    }

    /// [`Self::dot2`] for several sums over one limb, tile by tile.
    pub(crate) fn dot2_many(&self, i: usize, sums: &mut [crate::lazy_dot::Sum<'_, '_>]) {
        let Some(k) = &self.lazy[i] else {
            for s in sums.iter_mut() {
                self.dot2(i, &s.terms, s.out0, s.out1);
            }
            return;
        };
        let n = sums.first().map_or(0, |s| s.out0.len());
        let mut tile_terms = Vec::new();
        for start in (0..n).step_by(crate::lazy_dot::TILE) {
            let end = (start + crate::lazy_dot::TILE).min(n);
            for s in sums.iter_mut() {
                tile_terms.clear();
                tile_terms.extend(s.terms.iter().map(|t| Term {
                    x0: &t.x0[start..end],
                    w0: &t.w0[start..end],
                    x1: &t.x1[start..end],
                    w1: &t.w1[start..end],
                }));
                k.dot2(
                    &tile_terms,
                    &mut s.out0[start..end],
                    &mut s.out1[start..end],
                );
            }
        }
    }

    /// `acc ← acc + lhs · rhs` modulo prime `i` (SIMD).
    #[inline]
    pub(crate) fn mul_acc(&self, i: usize, acc: &mut [u64], lhs: &[u64], rhs: &[u64]) {
        self.plans[i].mul_accumulate(acc, lhs, rhs);
    }

    /// `buf ← N · buf` modulo prime `i`, turning a canonical limb into the N-scaled storage form.
    pub(crate) fn scale_by_n(&self, i: usize, buf: &mut [u64]) {
        let m = self.moduli[i];
        let c = self.n_mod[i];
        for x in buf.iter_mut() {
            *x = m.mul_shoup(*x, c);
        }
    }

    /// The Galois element `5^step mod 2N` of a left rotation by `step` slots.
    pub fn galois_element(&self, step: i64) -> u64 {
        let slots = self.slots() as i64;
        let r = step.rem_euclid(slots) as u64;
        let two_n = 2 * self.n as u64;
        let mut g = 1u64;
        let mut b = 5u64;
        let mut e = r;
        while e > 0 {
            if e & 1 == 1 {
                g = g * b % two_n;
            }
            b = b * b % two_n;
            e >>= 1;
        }
        g
    }

    /// The inverse of Galois element `g` modulo 2N.
    pub(crate) fn galois_inverse(&self, g: u64) -> u64 {
        let two_n = 2 * self.n as u64;
        // The group (Z/2N)^* has exponent N/2, so g^{-1} = g^{N/2 - 1}.
        let mut r = 1u64;
        let mut b = g % two_n;
        let mut e = (self.n / 2 - 1) as u64;
        while e > 0 {
            if e & 1 == 1 {
                r = r * b % two_n;
            }
            b = b * b % two_n;
            e >>= 1;
        }
        r
    }

    /// The slot permutation of `X ↦ X^g` in evaluation form: `σ_g(a)[j] = a[perm[j]]`.
    pub(crate) fn galois_perm(&self, g: u64) -> Vec<u32> {
        let two_n = 2 * self.n as u64;
        self.ntt_exp
            .iter()
            .map(|&e| self.exp_idx[((e as u64 * g) % two_n) as usize])
            .collect()
    }
}

/// The AVX2 + FMA NTTs, where the CPU has AVX2 and FMA but not IFMA (tfhe-ntt's IFMA transforms
/// are faster); each with its plan's root, read off the plan's transform of `X`.
#[cfg(target_arch = "x86_64")]
fn fma_ntts(plans: &[Plan], primes: &[u64], n: usize) -> Vec<Option<crate::fma::ntt::Ntt>> {
    plans
        .iter()
        .zip(primes)
        .map(|(plan, &p)| {
            if crate::lazy_dot::ifma_available() || n < 2 {
                return None;
            }
            let mut x = vec![0u64; n];
            x[1] = 1;
            plan.fwd(&mut x);
            crate::fma::ntt::Ntt::new(p, n, x[0])
        })
        .collect()
}
