//! Plaintexts: an RNS polynomial in NTT (evaluation) form at a level and scale.

/// A CKKS plaintext in NTT form over the chain primes `q_0..q_level`.
///
/// Storage: `level + 1` limbs of N words, limb `i` holding values in
/// `[0, q_i)`. Plaintexts made by the [`crate::Encoder`] are stored
/// *N-scaled* (each evaluation multiplied by N mod q_i) so that a ct×pt
/// product is one SIMD `mul_assign_normalize` pass of tfhe-ntt (which
/// multiplies by `N^{-1}`): pre-encoded plaintexts cost nothing extra at use
/// time. Decrypted plaintexts are stored canonically; the flag records which.
#[derive(Clone, PartialEq)]
pub struct Plaintext {
    pub(crate) data: Vec<u64>,
    pub(crate) level: usize,
    pub(crate) scale: f64,
    pub(crate) n_scaled: bool,
    /// Digest of the context it was made in.
    pub(crate) digest: u64,
}

impl std::fmt::Debug for Plaintext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Plaintexts are client secrets: never print their content.
        f.debug_struct("Plaintext")
            .field("level", &self.level)
            .field("scale", &self.scale)
            .finish_non_exhaustive()
    }
}

impl Plaintext {
    /// Level (number of chain primes − 1).
    pub fn level(&self) -> usize {
        self.level
    }
    /// Scale Δ: the plaintext holds `round(Δ·values)`.
    pub fn scale(&self) -> f64 {
        self.scale
    }
}

/// A plaintext over the extended basis `Q_level·P` (N-scaled NTT form), for
/// ct×pt products with [`crate::ExtendedCiphertext`]s (double hoisting,
/// Bossuat et al., Eurocrypt 2021, §4.2). Made by
/// [`crate::Encoder::encode_extended`]; the chain limbs are those of an
/// ordinary plaintext, so it also multiplies ordinary ciphertexts
/// ([`ExtendedPlaintext::plaintext`]).
#[derive(Clone, PartialEq)]
pub struct ExtendedPlaintext {
    pub(crate) pt: Plaintext,
    /// The limb modulo the special prime P (N words, N-scaled).
    pub(crate) special: Vec<u64>,
}

impl std::fmt::Debug for ExtendedPlaintext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtendedPlaintext")
            .field("level", &self.pt.level)
            .field("scale", &self.pt.scale)
            .finish_non_exhaustive()
    }
}

impl ExtendedPlaintext {
    /// The N-scaled limb of prime `j` (`sp`: the special prime's index).
    pub(crate) fn limb(&self, j: usize, n: usize, sp: usize) -> &[u64] {
        if j == sp {
            &self.special
        } else {
            &self.pt.data[j * n..(j + 1) * n]
        }
    }

    /// Level of the chain part.
    pub fn level(&self) -> usize {
        self.pt.level
    }
    /// Scale Δ.
    pub fn scale(&self) -> f64 {
        self.pt.scale
    }
    /// The chain part, an ordinary plaintext.
    pub fn plaintext(&self) -> &Plaintext {
        &self.pt
    }
}
