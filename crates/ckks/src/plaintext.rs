//! Plaintexts: an RNS polynomial in NTT (evaluation) form at a level and scale.

/// A CKKS plaintext in NTT form over `q_0..q_level` (`level + 1` limbs of N words). Encoder output
/// is stored N-scaled, so a ct×pt product is one `mul_assign_normalize`; decrypted plaintexts are
/// canonical; the flag records which.
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

/// A plaintext over `Q_level·P` (N-scaled NTT form) for products with
/// [`crate::ExtendedCiphertext`]s; its chain limbs also multiply ordinary ciphertexts
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
