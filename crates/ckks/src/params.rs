//! CKKS parameter sets (Cheon–Han–Kim–Kim–Song, SAC 2018): degree, chain, special prime `P`, scale;
//! the builder refuses sets above the 128-bit HE-standard bound for ternary secrets (Albrecht et
//! al. 2018, Table 1: N=4096 → 109, 8192 → 218, 16384 → 438 bits).

use crate::error::{CkksError, Result};
use crate::modular::is_prime;

/// The HE-standard 128-bit bound on `log2(Q·P)` for a ternary secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecurityBound;

impl SecurityBound {
    /// Maximum `log2(Q·P)` for 128-bit security at `degree`; `None` if unsupported.
    pub fn max_log_qp(degree: usize) -> Option<u32> {
        match degree {
            4096 => Some(109),
            8192 => Some(218),
            16384 => Some(438),
            _ => None,
        }
    }
}

/// Named parameter sets.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// N=8192, chain 60,40 + special 60, scale 2^40: one multiplication.
    N8192Depth1,
    /// N=8192, chain 60,40,40 + special 60, scale 2^40: two multiplications (log QP = 200 ≤ 218).
    N8192Depth2,
    /// N=16384, chain 60,40 + special 60, scale 2^40.
    N16384Depth1,
    /// N=16384, chain 60,40,40 + special 60, scale 2^40.
    N16384Depth2,
    /// N=8192, chain 50,40,40 + special 50, scale 2^40 (IFMA NTT; |values| < 2^9 at level 0).
    N8192Depth2Fast,
    /// N=16384, chain 50,40,40 + special 50, scale 2^40 (IFMA path).
    N16384Depth2Fast,
}

/// Validated CKKS parameters: degree, primes (generated), scale.
#[derive(Debug, Clone, PartialEq)]
pub struct CkksParameters {
    degree: usize,
    moduli_bits: Vec<u32>,
    special_bits: Vec<u32>,
    moduli: Vec<u64>,
    special: Vec<u64>,
    scale_bits: u32,
}

/// Builder for [`CkksParameters`]; see [`CkksParameters::builder`].
#[derive(Debug, Clone, Default)]
pub struct CkksParametersBuilder {
    degree: usize,
    moduli_bits: Vec<u32>,
    special_bits: Vec<u32>,
    scale_bits: u32,
}

/// Smallest and largest supported prime sizes in bits.
pub const MIN_PRIME_BITS: u32 = 20;
/// Largest supported prime size (tfhe-ntt's fast reduction needs q < 2^62).
pub const MAX_PRIME_BITS: u32 = 61;

impl CkksParametersBuilder {
    /// Ring degree N (4096, 8192 or 16384).
    pub fn degree(mut self, n: usize) -> Self {
        self.degree = n;
        self
    }
    /// Bit sizes of the chain primes `q_0..q_L` (level L = len − 1).
    pub fn moduli_bits(mut self, bits: &[u32]) -> Self {
        self.moduli_bits = bits.to_vec();
        self
    }
    /// Bit sizes of the special primes (exactly one is supported).
    pub fn special_moduli_bits(mut self, bits: &[u32]) -> Self {
        self.special_bits = bits.to_vec();
        self
    }
    /// Default scale `2^bits` used by callers that do not pick their own.
    pub fn scale_bits(mut self, bits: u32) -> Self {
        self.scale_bits = bits;
        self
    }

    /// Validates and generates the primes. Errors: [`CkksError::UnsupportedDegree`],
    /// `InvalidModulusBits`, `InvalidParameters`, `InsecureParameters`, `NoPrimeFound`.
    pub fn build(self) -> Result<CkksParameters> {
        let max_log_qp =
            SecurityBound::max_log_qp(self.degree).ok_or(CkksError::UnsupportedDegree {
                degree: self.degree,
            })?;
        if self.moduli_bits.is_empty() {
            return Err(CkksError::InvalidParameters {
                reason: "the modulus chain is empty",
            });
        }
        if self.special_bits.len() != 1 {
            return Err(CkksError::InvalidParameters {
                reason: "exactly one special prime is supported",
            });
        }
        for &b in self.moduli_bits.iter().chain(&self.special_bits) {
            if !(MIN_PRIME_BITS..=MAX_PRIME_BITS).contains(&b) {
                return Err(CkksError::InvalidModulusBits {
                    bits: b,
                    min: MIN_PRIME_BITS,
                    max: MAX_PRIME_BITS,
                });
            }
        }
        let log_qp: u32 = self.moduli_bits.iter().chain(&self.special_bits).sum();
        if log_qp > max_log_qp {
            return Err(CkksError::InsecureParameters {
                degree: self.degree,
                log_qp,
                max_log_qp,
            });
        }
        let max_q = *self.moduli_bits.iter().max().unwrap_or(&0);
        if self.special_bits[0] < max_q {
            return Err(CkksError::InvalidParameters {
                reason: "the special prime must be at least as large as every chain prime",
            });
        }
        if self.scale_bits == 0 || self.scale_bits >= self.moduli_bits[0] {
            return Err(CkksError::InvalidParameters {
                reason: "scale_bits must be positive and below the size of q_0",
            });
        }
        let all_bits: Vec<u32> = self
            .moduli_bits
            .iter()
            .chain(&self.special_bits)
            .copied()
            .collect();
        let primes = generate_primes(&all_bits, self.degree)?;
        let (moduli, special) = primes.split_at(self.moduli_bits.len());
        Ok(CkksParameters {
            degree: self.degree,
            moduli_bits: self.moduli_bits,
            special_bits: self.special_bits,
            moduli: moduli.to_vec(),
            special: special.to_vec(),
            scale_bits: self.scale_bits,
        })
    }
}

/// Distinct primes `q ≡ 1 (mod 2N)` of the requested sizes, each the largest free below `2^bits`.
fn generate_primes(bits: &[u32], degree: usize) -> Result<Vec<u64>> {
    let two_n = 2 * degree as u64;
    let mut out: Vec<u64> = Vec::with_capacity(bits.len());
    for &b in bits {
        let top = 1u64 << b;
        let low = 1u64 << (b - 1);
        // Largest candidate ≡ 1 mod 2N below 2^b.
        let mut cand = (top - 1) / two_n * two_n + 1;
        if cand >= top {
            cand -= two_n;
        }
        loop {
            if cand < low {
                return Err(CkksError::NoPrimeFound { bits: b, degree });
            }
            if !out.contains(&cand) && is_prime(cand) {
                out.push(cand);
                break;
            }
            cand -= two_n;
        }
    }
    Ok(out)
}

impl CkksParameters {
    /// Starts a builder.
    pub fn builder() -> CkksParametersBuilder {
        CkksParametersBuilder::default()
    }

    /// A named 128-bit parameter set. Errors: the builder's (never for listed presets).
    pub fn preset(preset: Preset) -> Result<Self> {
        let (n, chain, special): (usize, &[u32], u32) = match preset {
            Preset::N8192Depth1 => (8192, &[60, 40], 60),
            Preset::N8192Depth2 => (8192, &[60, 40, 40], 60),
            Preset::N16384Depth1 => (16384, &[60, 40], 60),
            Preset::N16384Depth2 => (16384, &[60, 40, 40], 60),
            Preset::N8192Depth2Fast => (8192, &[50, 40, 40], 50),
            Preset::N16384Depth2Fast => (16384, &[50, 40, 40], 50),
        };
        Self::builder()
            .degree(n)
            .moduli_bits(chain)
            .special_moduli_bits(&[special])
            .scale_bits(40)
            .build()
    }

    /// All presets, for tests and benchmarks.
    pub fn all_presets() -> &'static [Preset] {
        &[
            Preset::N8192Depth1,
            Preset::N8192Depth2,
            Preset::N16384Depth1,
            Preset::N16384Depth2,
            Preset::N8192Depth2Fast,
            Preset::N16384Depth2Fast,
        ]
    }

    /// Ring degree N.
    pub fn degree(&self) -> usize {
        self.degree
    }
    /// Number of complex (here: real) slots, N/2.
    pub fn slots(&self) -> usize {
        self.degree / 2
    }
    /// Maximum level L (number of chain primes − 1).
    pub fn max_level(&self) -> usize {
        self.moduli.len() - 1
    }
    /// The chain primes `q_0..q_L`.
    pub fn moduli(&self) -> &[u64] {
        &self.moduli
    }
    /// The special prime(s) P used in key switching.
    pub fn special_moduli(&self) -> &[u64] {
        &self.special
    }
    /// Requested bit sizes of the chain primes.
    pub fn moduli_bits(&self) -> &[u32] {
        &self.moduli_bits
    }
    /// Requested bit sizes of the special primes.
    pub fn special_moduli_bits(&self) -> &[u32] {
        &self.special_bits
    }
    /// The default scale `2^scale_bits`.
    pub fn scale(&self) -> f64 {
        (self.scale_bits as f64).exp2()
    }
    /// `log2(Q·P)` counted as the sum of prime sizes (what the builder checks).
    pub fn log_qp_bits(&self) -> u32 {
        self.moduli_bits.iter().chain(&self.special_bits).sum()
    }
    /// FNV-1a digest of N and all primes, carried by serialized objects.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(self.degree as u64);
        for &q in self.moduli.iter().chain(&self.special) {
            eat(q);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_sets_are_refused_with_a_typed_error() {
        for (n, chain, sp, max) in [
            (4096usize, vec![40u32, 40], 30u32, 109u32),
            (8192, vec![60, 50, 50], 60, 218),
            (16384, vec![60, 60, 60, 60, 60, 60, 60], 60, 438),
        ] {
            let err = CkksParameters::builder()
                .degree(n)
                .moduli_bits(&chain)
                .special_moduli_bits(&[sp])
                .scale_bits(30)
                .build()
                .unwrap_err();
            let total: u32 = chain.iter().sum::<u32>() + sp;
            assert_eq!(
                err,
                CkksError::InsecureParameters {
                    degree: n,
                    log_qp: total,
                    max_log_qp: max
                }
            );
        }
    }

    #[test]
    fn boundary_sets_are_accepted() {
        // Exactly at the bound is allowed.
        let p = CkksParameters::builder()
            .degree(4096)
            .moduli_bits(&[36, 36])
            .special_moduli_bits(&[37])
            .scale_bits(30)
            .build()
            .unwrap();
        assert_eq!(p.log_qp_bits(), 109);
        let p = CkksParameters::builder()
            .degree(8192)
            .moduli_bits(&[58, 50, 50])
            .special_moduli_bits(&[60])
            .scale_bits(40)
            .build()
            .unwrap();
        assert_eq!(p.log_qp_bits(), 218);
    }

    #[test]
    fn structural_errors_are_typed() {
        let b = || {
            CkksParameters::builder()
                .degree(8192)
                .moduli_bits(&[60, 40])
                .special_moduli_bits(&[60])
                .scale_bits(40)
        };
        assert_eq!(
            b().degree(2048).build().unwrap_err(),
            CkksError::UnsupportedDegree { degree: 2048 }
        );
        assert!(matches!(
            b().moduli_bits(&[]).build(),
            Err(CkksError::InvalidParameters { .. })
        ));
        assert!(matches!(
            b().special_moduli_bits(&[]).build(),
            Err(CkksError::InvalidParameters { .. })
        ));
        assert!(matches!(
            b().special_moduli_bits(&[40]).build(),
            Err(CkksError::InvalidParameters { .. })
        ));
        assert!(matches!(
            b().moduli_bits(&[62, 40])
                .special_moduli_bits(&[62])
                .build(),
            Err(CkksError::InvalidModulusBits { bits: 62, .. })
        ));
        assert!(matches!(
            b().scale_bits(60).build(),
            Err(CkksError::InvalidParameters { .. })
        ));
    }

    #[test]
    fn presets_are_secure_and_primes_ntt_friendly() {
        for &p in CkksParameters::all_presets() {
            let params = CkksParameters::preset(p).unwrap();
            let n = params.degree() as u64;
            assert!(params.log_qp_bits() <= SecurityBound::max_log_qp(params.degree()).unwrap());
            let all: Vec<u64> = params
                .moduli()
                .iter()
                .chain(params.special_moduli())
                .copied()
                .collect();
            let bits: Vec<u32> = params
                .moduli_bits()
                .iter()
                .chain(params.special_moduli_bits())
                .copied()
                .collect();
            for (i, (&q, &b)) in all.iter().zip(&bits).enumerate() {
                assert!(is_prime(q));
                assert_eq!(q % (2 * n), 1);
                assert_eq!(64 - q.leading_zeros(), b);
                assert!(!all[..i].contains(&q), "primes must be distinct");
            }
        }
    }
}
