//! The small HE interface the packing is written against.
//!
//! Two halves, matching the two parties: [`HeServer`] evaluates on
//! ciphertexts with public material only (Galois keys, optionally a public key
//! for rerandomisation); [`HeClient`] holds the secret key, encrypts and
//! decrypts. Ciphertexts cross between them only as bytes.
//!
//! Implementations: [`crate::sim::SlotSimulator`] (exact f64 slot vectors,
//! counts every operation) and the CKKS engine adapter.

pub use cipherlora_ckks::Complex64;

use crate::error::Result;

/// One sum of products of [`HeServer::dot_plain_many`] and
/// [`HeServer::dot_plain_extended_many`]: its ciphertexts and its
/// plaintexts, term by term.
pub type ProductSum<'a, C, P> = (Vec<&'a C>, Vec<&'a P>);

/// Server-side homomorphic evaluation.
///
/// Slots are complex; every plaintext the server makes holds *real* weights
/// (`encode_weights` takes `f64`), so the evaluation acts on the real and
/// imaginary parts of the slots independently
/// ([`crate::PositionPacking::ComplexPairs`] relies on it).
///
/// Rotations are *left* rotations of the slot vector by `step` slots
/// (`out[i] = in[(i + step) mod slots]`). Plaintexts are produced for a given
/// ciphertext level and are always followed, after accumulation, by one
/// rescale (the backend chooses the plaintext scale so that the rescale
/// restores the input scale).
pub trait HeServer {
    /// A ciphertext.
    type Ct: Clone;
    /// An encoded plaintext (weights).
    type Pt;
    /// A ciphertext over the extended basis `Q·P` (a rotation kept before
    /// its ModDown: double hoisting, Bossuat et al., "Efficient
    /// Bootstrapping for Approximate HE with Non-Sparse Keys", EUROCRYPT
    /// 2021, §4.2).
    type ExtCt;
    /// Weights encoded over `Q·P`, for products with [`HeServer::ExtCt`].
    type ExtPt;

    /// Slots per ciphertext (N/2).
    fn slots(&self) -> usize;

    /// Highest level a fresh ciphertext can have.
    fn max_level(&self) -> usize;

    /// Level of a ciphertext.
    fn level(&self, ct: &Self::Ct) -> usize;

    /// Encodes weights (one value per slot; fewer values are zero-padded) for
    /// multiplication with ciphertexts at `level`.
    ///
    /// # Errors
    /// More values than slots, or level out of range.
    fn encode_weights(&self, values: &[f64], level: usize) -> Result<Self::Pt>;

    /// As [`HeServer::encode_weights`], over the extended basis `Q·P`.
    ///
    /// # Errors
    /// As [`HeServer::encode_weights`].
    fn encode_weights_extended(&self, values: &[f64], level: usize) -> Result<Self::ExtPt>;

    /// Rotations of one ciphertext kept over `Q·P` (one shared key-switch
    /// decomposition; no ModDown): one result per step, step 0 giving the
    /// input itself lifted to `Q·P` (no key switch).
    ///
    /// # Errors
    /// Missing Galois key.
    fn rotate_hoisted_extended(&self, ct: &Self::Ct, steps: &[i64]) -> Result<Vec<Self::ExtCt>>;

    /// `Σ_i cts[i] ⊙ pts[i]` over `Q·P` (one extended ct×pt per term). The
    /// result is brought back by [`HeServer::mod_down_rescale`].
    ///
    /// # Errors
    /// Empty or mismatched inputs, level mismatch.
    fn dot_plain_extended(&self, cts: &[&Self::ExtCt], pts: &[&Self::ExtPt])
    -> Result<Self::ExtCt>;

    /// Several [`HeServer::dot_plain_extended`] sums, one result per
    /// `(cts, pts)` entry: the giant steps of a baby-step/giant-step
    /// transformation, which all read the same baby steps. The default
    /// computes them one after the other; the CKKS backend walks the limbs
    /// once for all of them, so that shared ciphertexts are read from
    /// memory once (`cipherlora_ckks::Evaluator::sums_of_products_extended`).
    ///
    /// # Errors
    /// As [`HeServer::dot_plain_extended`], for any entry.
    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, Self::ExtCt, Self::ExtPt>],
    ) -> Result<Vec<Self::ExtCt>> {
        sums.iter()
            .map(|(c, p)| self.dot_plain_extended(c, p))
            .collect()
    }

    /// ModDown (divide by P) and rescale (divide by the last prime), fused:
    /// the result is at level − 1, like [`HeServer::rescale`] of a
    /// [`HeServer::dot_plain`].
    ///
    /// # Errors
    /// At level 0.
    fn mod_down_rescale(&self, ct: &Self::ExtCt) -> Result<Self::Ct>;

    /// `Σ_i cts[i] ⊙ pts[i]` (one ct×pt per term; implementations may
    /// accumulate lazily). The result is not rescaled.
    ///
    /// # Errors
    /// Empty or mismatched inputs, level mismatch.
    fn dot_plain(&self, cts: &[&Self::Ct], pts: &[&Self::Pt]) -> Result<Self::Ct>;

    /// Several [`HeServer::dot_plain`] sums, one result per `(cts, pts)`
    /// entry (as [`HeServer::dot_plain_extended_many`]).
    ///
    /// # Errors
    /// As [`HeServer::dot_plain`], for any entry.
    fn dot_plain_many(&self, sums: &[ProductSum<'_, Self::Ct, Self::Pt>]) -> Result<Vec<Self::Ct>> {
        sums.iter().map(|(c, p)| self.dot_plain(c, p)).collect()
    }

    /// `acc += other`.
    ///
    /// # Errors
    /// Level or scale mismatch.
    fn add_assign(&self, acc: &mut Self::Ct, other: &Self::Ct) -> Result<()>;

    /// One rotation (key switch) by `step` slots.
    ///
    /// # Errors
    /// Missing Galois key.
    fn rotate(&self, ct: &Self::Ct, step: i64) -> Result<Self::Ct>;

    /// Several rotations of the same ciphertext sharing one key-switch
    /// decomposition (hoisting, Halevi–Shoup 2018 §5).
    ///
    /// # Errors
    /// Missing Galois key.
    fn rotate_hoisted(&self, ct: &Self::Ct, steps: &[i64]) -> Result<Vec<Self::Ct>>;

    /// Rescale by the last prime (level − 1).
    ///
    /// # Errors
    /// At level 0.
    fn rescale(&self, ct: &Self::Ct) -> Result<Self::Ct>;

    /// Circuit privacy: adds a fresh public-key encryption of zero with
    /// flooding noise.
    ///
    /// # Errors
    /// No public key available.
    fn rerandomize(&self, ct: &Self::Ct) -> Result<Self::Ct>;

    /// Parses an uploaded (possibly seeded) ciphertext.
    ///
    /// # Errors
    /// Malformed bytes.
    fn input_from_bytes(&self, bytes: &[u8]) -> Result<Self::Ct>;

    /// Serialises a result ciphertext for the download.
    fn output_to_bytes(&self, ct: &Self::Ct) -> Vec<u8>;

    /// Serialises a result ciphertext for the download, knowing that the
    /// real and imaginary part of every slot is at most `bound` in absolute
    /// value (up to the backend's own noise): a backend may then compress
    /// it lossily with an error controlled relative to `bound` (the CKKS
    /// backend: [`crate::ckks_backend::ResponseCompression`]), to
    /// `bits` of precision when the client asks for fewer than the
    /// backend's default (0: the default). The default implementation
    /// ignores both ([`HeServer::output_to_bytes`]).
    ///
    /// # Errors
    /// Backend errors while compressing.
    fn output_to_bytes_bounded(&self, ct: &Self::Ct, bound: f64, bits: u32) -> Result<Vec<u8>> {
        let _ = (bound, bits);
        Ok(self.output_to_bytes(ct))
    }
}

/// Client-side encryption and decryption (holds the secret key).
pub trait HeClient {
    /// Slots per ciphertext (N/2).
    fn slots(&self) -> usize;

    /// Encodes and encrypts the slot values `re + i·im` (each zero padded;
    /// `im` may be empty) at `level`; returns the upload bytes (seeded where
    /// the backend supports it).
    ///
    /// # Errors
    /// More values than slots, level out of range.
    fn encrypt_to_bytes(&self, re: &[f64], im: &[f64], level: usize) -> Result<Vec<u8>>;

    /// As [`Self::encrypt_to_bytes`], allowing the upload to lose up to
    /// `max_error` (absolute, per real or imaginary slot part, with high
    /// probability) for fewer bytes: the CKKS backend drops that many low
    /// bits of `c0` ([`cipherlora_ckks::rounded`]). `max_error = 0` is
    /// [`Self::encrypt_to_bytes`], which backends without a lossy upload
    /// also give for any error.
    ///
    /// # Errors
    /// As [`Self::encrypt_to_bytes`].
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

    /// Parses, decrypts and decodes a result ciphertext (compressed or
    /// not): all slots, both parts.
    ///
    /// # Errors
    /// Malformed bytes.
    fn decrypt_from_bytes(&self, bytes: &[u8]) -> Result<Vec<Complex64>>;
}
