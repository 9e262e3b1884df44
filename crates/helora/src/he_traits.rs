//! The small HE interface the packing is written against: [`HeServer`] (public material only) and
//! [`HeClient`] (the secret key); ciphertexts cross as bytes.

pub use cipherlora_ckks::Complex64;

use crate::error::Result;

/// One sum of products: its ciphertexts and plaintexts, term by term.
pub type ProductSum<'a, C, P> = (Vec<&'a C>, Vec<&'a P>);

/// Server-side evaluation: real plaintext weights (slot parts stay independent), left rotations
/// (`out[i] = in[(i + step) mod slots]`), one scale-restoring rescale after products.
pub trait HeServer {
    /// A ciphertext.
    type Ct: Clone;
    /// An encoded plaintext (weights).
    type Pt;
    /// A ciphertext over `Q·P` (double hoisting, Bossuat et al., EUROCRYPT 2021, §4.2).
    type ExtCt;
    /// Weights encoded over `Q·P`, for products with [`HeServer::ExtCt`].
    type ExtPt;

    /// Slots per ciphertext (N/2).
    fn slots(&self) -> usize;

    /// Highest level a fresh ciphertext can have.
    fn max_level(&self) -> usize;

    /// Level of a ciphertext.
    fn level(&self, ct: &Self::Ct) -> usize;

    /// Encodes weights (zero padded) for products at `level`. Errors: too many values, bad level.
    fn encode_weights(&self, values: &[f64], level: usize) -> Result<Self::Pt>;

    /// As [`HeServer::encode_weights`], over `Q·P`.
    fn encode_weights_extended(&self, values: &[f64], level: usize) -> Result<Self::ExtPt>;

    /// Rotations kept over `Q·P` from one decomposition (step 0 lifts the input). Errors: missing
    /// key.
    fn rotate_hoisted_extended(&self, ct: &Self::Ct, steps: &[i64]) -> Result<Vec<Self::ExtCt>>;

    /// `Σ_i cts[i] ⊙ pts[i]` over `Q·P`. Errors: empty or mismatched inputs, level mismatch.
    fn dot_plain_extended(&self, cts: &[&Self::ExtCt], pts: &[&Self::ExtPt])
    -> Result<Self::ExtCt>;

    /// Several [`HeServer::dot_plain_extended`] sums (BSGS giant steps). Errors as for one.
    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, Self::ExtCt, Self::ExtPt>],
    ) -> Result<Vec<Self::ExtCt>> {
        sums.iter()
            .map(|(c, p)| self.dot_plain_extended(c, p))
            .collect()
    }

    /// Fused ModDown and rescale: level − 1. Errors: at level 0.
    fn mod_down_rescale(&self, ct: &Self::ExtCt) -> Result<Self::Ct>;

    /// `Σ_i cts[i] ⊙ pts[i]`, not rescaled. Errors: empty or mismatched inputs, level mismatch.
    fn dot_plain(&self, cts: &[&Self::Ct], pts: &[&Self::Pt]) -> Result<Self::Ct>;

    /// Several [`HeServer::dot_plain`] sums, one per entry. Errors as for one sum.
    fn dot_plain_many(&self, sums: &[ProductSum<'_, Self::Ct, Self::Pt>]) -> Result<Vec<Self::Ct>> {
        sums.iter().map(|(c, p)| self.dot_plain(c, p)).collect()
    }

    /// `acc += other`. Errors: level or scale mismatch.
    fn add_assign(&self, acc: &mut Self::Ct, other: &Self::Ct) -> Result<()>;

    /// One rotation (key switch) by `step` slots. Errors: missing Galois key.
    fn rotate(&self, ct: &Self::Ct, step: i64) -> Result<Self::Ct>;

    /// Several rotations sharing one decomposition (Halevi–Shoup 2018 §5). Errors: missing key.
    fn rotate_hoisted(&self, ct: &Self::Ct, steps: &[i64]) -> Result<Vec<Self::Ct>>;

    /// Rescale by the last prime (level − 1). Errors: at level 0.
    fn rescale(&self, ct: &Self::Ct) -> Result<Self::Ct>;

    /// Circuit privacy: adds a public-key encryption of zero with flooding noise. Errors: no key.
    fn rerandomize(&self, ct: &Self::Ct) -> Result<Self::Ct>;

    /// Parses an uploaded (possibly seeded) ciphertext. Errors: malformed bytes.
    fn input_from_bytes(&self, bytes: &[u8]) -> Result<Self::Ct>;

    /// Serialises a result ciphertext for the download.
    fn output_to_bytes(&self, ct: &Self::Ct) -> Vec<u8>;

    /// Serialises a result whose slot parts are ≤ `bound`, possibly compressed to `bits` (0:
    /// default). Errors: backend errors.
    fn output_to_bytes_bounded(&self, ct: &Self::Ct, bound: f64, bits: u32) -> Result<Vec<u8>> {
        let _ = (bound, bits);
        Ok(self.output_to_bytes(ct))
    }
}

/// Client-side encryption and decryption (holds the secret key).
pub trait HeClient {
    /// Slots per ciphertext (N/2).
    fn slots(&self) -> usize;

    /// Encodes and encrypts `re + i·im` at `level` into upload bytes. Errors: too many values,
    /// level.
    fn encrypt_to_bytes(&self, re: &[f64], im: &[f64], level: usize) -> Result<Vec<u8>>;

    /// As [`Self::encrypt_to_bytes`], losing up to `max_error` per slot part for fewer bytes.
    fn encrypt_to_bytes_within(
        &self,
        re: &[f64],
        im: &[f64],
        level: usize,
        max_error: f64,
    ) -> Result<Vec<u8>> {
        let _ = max_error;
        self.encrypt_to_bytes(re, im, level)
    }

    /// Parses, decrypts and decodes a result ciphertext: all slots. Errors: malformed bytes.
    fn decrypt_from_bytes(&self, bytes: &[u8]) -> Result<Vec<Complex64>>;
}
