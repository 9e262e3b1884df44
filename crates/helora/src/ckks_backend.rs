//! The HE interface on the `cipherlora-ckks` engine.
//!
//! [`CkksClient`] holds the secret key (generated from the OS CSPRNG), makes
//! the Galois keys for exactly the steps a plan uses and the public key for
//! rerandomisation; [`CkksServer`] holds only public material. Weights are
//! encoded with scale = the prime the following rescale divides by, so every
//! rescale restores the input scale exactly and giant-step sums never need
//! scale adjustments.
//!
//! Responses are compressed by default ([`ResponseCompression`]): every
//! returned level-0 ciphertext is switched to a power-of-two modulus with
//! the parameters [`CompressionParams::choose`] picks for the output bound
//! the server computed at load time ([`crate::PreparedGroup::output_bounds`])
//! and the configured precision; the client recognises the object kind and
//! decrypts either form.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cipherlora_ckks::serialize::peek_kind;
use cipherlora_ckks::{
    Ciphertext, CompressedCiphertext, CompressionParams, Context, Decryptor, Encoder, Encryptor,
    Evaluator, ExtendedCiphertext, ExtendedPlaintext, GaloisKeys, ObjectKind, Plaintext, PublicKey,
    SecretKey, SeededCiphertext, os_rng, rounded,
};
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::error::{HeloraError, Result};
use crate::he_traits::{Complex64, HeClient, HeServer, ProductSum};

fn he(e: cipherlora_ckks::CkksError) -> HeloraError {
    HeloraError::Ckks(e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Circuit-privacy settings of [`CkksServer::rerandomize`](HeServer::rerandomize).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rerandomization {
    /// Standard deviation of the flooding noise added in the slots, in
    /// absolute slot units (it lowers the precision of every delta by this
    /// much; `0` adds only the fresh public-key encryption of zero).
    pub flood_sigma: f64,
}

impl Default for Rerandomization {
    /// `2^-20` in slot units: ≈ 2^20 in coefficient units at scale 2^40,
    /// N = 8192, i.e. ~2^14 above the noise of a fresh encryption. This
    /// smudges the evaluation noise heuristically; statistical circuit
    /// privacy (flooding 2^λ above the noise) does not fit these parameters.
    fn default() -> Self {
        Rerandomization {
            flood_sigma: 2f64.powi(-20),
        }
    }
}

/// How [`CkksServer`] serialises returned ciphertexts
/// ([`HeServer::output_to_bytes_bounded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseCompression {
    /// Full level-0 ciphertexts (`c0`, `c1` at `⌈log2 q_0⌉` bits per
    /// coefficient: 102 400 bytes each for `N8192Depth2Fast`).
    Off,
    /// Compressed ciphertexts ([`cipherlora_ckks::compress`]) whose added
    /// error is at most `bound·2^-bits` per slot part with high probability
    /// (failure 2^-40 per ciphertext), `bound` being the group's output
    /// bound for inputs normalised to max |input| ≤ 1 per position
    /// ([`crate::PreparedGroup::output_bounds`]). Falls back to the full
    /// ciphertext when the bound is too large for `q_0` or the precision
    /// cannot be met.
    Precision {
        /// Target precision P in bits relative to the bound.
        bits: u32,
    },
}

impl ResponseCompression {
    /// The default target precision: 25 bits relative to the output bound.
    /// The bound is a worst case (`Σ_j |W_row,j|` for inputs at ±1), about
    /// 2^2 (FFA) to 2^4 (standard, d_in = 2048) above the largest delta of
    /// typical inputs, and the compression error adds to the evaluation
    /// noise: 25 keeps ≥ 21.5 bits of max-abs precision relative to the
    /// largest delta on both benchmark shapes, both modes, T ∈ {1, 5, 9,
    /// 17} (`precision_table_all_shapes_all_t`; 24 gives 20.9 for standard
    /// LoRA on Qwen2.5-3B). Each bit costs `2·N/8` bytes per ciphertext.
    pub const DEFAULT_BITS: u32 = 25;

    /// The fewest bits a client may ask for per request
    /// (`GroupRequest::response_bits`): below this the compressed size
    /// hardly falls further (the two polynomials keep the noise's bits).
    pub const MIN_BITS: u32 = 8;
}

impl Default for ResponseCompression {
    /// [`ResponseCompression::Precision`] with
    /// [`ResponseCompression::DEFAULT_BITS`].
    fn default() -> Self {
        ResponseCompression::Precision {
            bits: Self::DEFAULT_BITS,
        }
    }
}

/// Absolute margin added to every output bound before compressing: covers
/// the CKKS evaluation noise of a returned slot (≈ 2^-23 measured) with room
/// to spare.
const NOISE_MARGIN: f64 = 1.0 / 65536.0;

/// The server: evaluator, encoder, the Galois keys it was given, and
/// optionally the client's public key (for rerandomisation).
pub struct CkksServer {
    ctx: Arc<Context>,
    ev: Evaluator,
    encoder: Encoder,
    gks: GaloisKeys,
    pk: Option<(PublicKey, Rerandomization)>,
    compression: ResponseCompression,
    /// Chosen parameters by `(scale, bound)` bits and precision: one choice per output
    /// bound and scale, reused by every request.
    chosen: Mutex<HashMap<(u64, u64, u32), Option<CompressionParams>>>,
    rng: Mutex<ChaCha20Rng>,
}

impl std::fmt::Debug for CkksServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CkksServer")
            .field("galois_keys", &self.gks.len())
            .field("rerandomize", &self.pk.is_some())
            .field("compression", &self.compression)
            .finish_non_exhaustive()
    }
}

impl CkksServer {
    /// A server for `ctx` with the client's Galois keys and, for circuit
    /// privacy, its public key.
    ///
    /// # Errors
    /// [`HeloraError::Ckks`] when the OS random generator fails.
    pub fn new(
        ctx: &Arc<Context>,
        gks: GaloisKeys,
        pk: Option<(PublicKey, Rerandomization)>,
    ) -> Result<Self> {
        Ok(CkksServer {
            ctx: ctx.clone(),
            ev: Evaluator::new(ctx),
            encoder: Encoder::new(ctx),
            gks,
            pk,
            compression: ResponseCompression::default(),
            chosen: Mutex::new(HashMap::new()),
            rng: Mutex::new(os_rng().map_err(he)?),
        })
    }

    /// The same server with another response compression (default:
    /// [`ResponseCompression::default`], 25 bits relative to the bound).
    pub fn with_compression(mut self, compression: ResponseCompression) -> Self {
        self.compression = compression;
        lock(&self.chosen).clear();
        self
    }

    /// The response compression in use.
    pub fn compression(&self) -> ResponseCompression {
        self.compression
    }

    /// The CKKS context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The compression parameters for a level-0 ciphertext at `scale`
    /// whose slot parts are bounded by `bound` (plus the CKKS noise margin
    /// and, when rerandomising, 16 flooding standard deviations); `None`
    /// when compression is off or cannot help (bound too large for `q_0`,
    /// precision out of reach). Chosen once per `(scale, bound)` and kept.
    pub fn compression_params(&self, scale: f64, bound: f64) -> Option<CompressionParams> {
        self.compression_params_at(scale, bound, 0)
    }

    /// [`CkksServer::compression_params`] at `asked` bits of precision
    /// when that is fewer than the configured ones (a client may lower the
    /// precision of its own responses, never raise it; 0 or more: the
    /// configured precision), but never fewer than
    /// [`ResponseCompression::MIN_BITS`].
    pub fn compression_params_at(
        &self,
        scale: f64,
        bound: f64,
        asked: u32,
    ) -> Option<CompressionParams> {
        let ResponseCompression::Precision { bits } = self.compression else {
            return None;
        };
        let bits = match asked {
            0 => bits,
            a => a.clamp(
                ResponseCompression::MIN_BITS,
                bits.max(ResponseCompression::MIN_BITS),
            ),
        };
        let key = (scale.to_bits(), bound.to_bits(), bits);
        if let Some(&p) = lock(&self.chosen).get(&key) {
            return p;
        }
        let flood = self.pk.as_ref().map_or(0.0, |(_, r)| 16.0 * r.flood_sigma);
        let m = bound.abs() + NOISE_MARGIN + flood;
        let q0 = self.ctx.params().moduli()[0];
        let p = CompressionParams::choose(self.ctx.degree(), q0, scale, m, bits).ok();
        lock(&self.chosen).insert(key, p);
        p
    }
}

/// Box–Muller standard normal from a CSPRNG.
fn normal(rng: &mut ChaCha20Rng) -> f64 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

impl CkksServer {
    /// Weights at `level` are encoded at scale `q_level`, the prime the
    /// following rescale divides by.
    fn weight_scale(&self, level: usize) -> Result<f64> {
        self.ctx
            .params()
            .moduli()
            .get(level)
            .map(|&q| q as f64)
            .ok_or(HeloraError::NotEnoughLevels {
                needed: level,
                available: self.ctx.max_level(),
            })
    }
}

impl HeServer for CkksServer {
    type Ct = Ciphertext;
    type Pt = Plaintext;
    type ExtCt = ExtendedCiphertext;
    type ExtPt = ExtendedPlaintext;

    fn slots(&self) -> usize {
        self.ctx.slots()
    }

    fn max_level(&self) -> usize {
        self.ctx.max_level()
    }

    fn level(&self, ct: &Ciphertext) -> usize {
        ct.level()
    }

    fn encode_weights(&self, values: &[f64], level: usize) -> Result<Plaintext> {
        let prime = self.weight_scale(level)?;
        self.encoder.encode(values, level, prime).map_err(he)
    }

    fn encode_weights_extended(&self, values: &[f64], level: usize) -> Result<ExtendedPlaintext> {
        let prime = self.weight_scale(level)?;
        self.encoder
            .encode_extended(values, level, prime)
            .map_err(he)
    }

    fn rotate_hoisted_extended(
        &self,
        ct: &Ciphertext,
        steps: &[i64],
    ) -> Result<Vec<ExtendedCiphertext>> {
        let h = steps.iter().any(|&s| s != 0).then(|| self.ev.hoist(ct));
        steps
            .iter()
            .map(|&s| match (&h, s) {
                (Some(h), s) if s != 0 => {
                    self.ev.rotate_hoisted_extended(h, s, &self.gks).map_err(he)
                }
                _ => Ok(self.ev.extend(ct)),
            })
            .collect()
    }

    fn dot_plain_extended(
        &self,
        cts: &[&ExtendedCiphertext],
        pts: &[&ExtendedPlaintext],
    ) -> Result<ExtendedCiphertext> {
        if cts.is_empty() || cts.len() != pts.len() {
            return Err(HeloraError::Backend(
                "dot_plain_extended: bad term count".into(),
            ));
        }
        let mut acc = self
            .ev
            .mul_accumulator_extended(cts[0].level())
            .map_err(he)?;
        acc.add_products(cts, pts).map_err(he)?;
        acc.finish()
            .ok_or_else(|| HeloraError::Backend("dot_plain_extended: empty".into()))
    }

    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, ExtendedCiphertext, ExtendedPlaintext>],
    ) -> Result<Vec<ExtendedCiphertext>> {
        let Some(level) = sums.iter().find_map(|(c, _)| c.first().map(|c| c.level())) else {
            return if sums.is_empty() {
                Ok(Vec::new())
            } else {
                Err(HeloraError::Backend(
                    "dot_plain_extended_many: empty sum".into(),
                ))
            };
        };
        let slices: Vec<(&[&ExtendedCiphertext], &[&ExtendedPlaintext])> =
            sums.iter().map(|(c, p)| (&c[..], &p[..])).collect();
        self.ev
            .sums_of_products_extended(level, &slices)
            .map_err(he)?
            .into_iter()
            .map(|s| {
                s.ok_or_else(|| HeloraError::Backend("dot_plain_extended_many: empty sum".into()))
            })
            .collect()
    }

    fn dot_plain_many(
        &self,
        sums: &[ProductSum<'_, Ciphertext, Plaintext>],
    ) -> Result<Vec<Ciphertext>> {
        let Some(level) = sums.iter().find_map(|(c, _)| c.first().map(|c| c.level())) else {
            return if sums.is_empty() {
                Ok(Vec::new())
            } else {
                Err(HeloraError::Backend("dot_plain_many: empty sum".into()))
            };
        };
        let slices: Vec<(&[&Ciphertext], &[&Plaintext])> =
            sums.iter().map(|(c, p)| (&c[..], &p[..])).collect();
        self.ev
            .sums_of_products(level, &slices)
            .map_err(he)?
            .into_iter()
            .map(|s| s.ok_or_else(|| HeloraError::Backend("dot_plain_many: empty sum".into())))
            .collect()
    }

    fn mod_down_rescale(&self, ct: &ExtendedCiphertext) -> Result<Ciphertext> {
        self.ev.mod_down_rescale(ct).map_err(he)
    }

    fn dot_plain(&self, cts: &[&Ciphertext], pts: &[&Plaintext]) -> Result<Ciphertext> {
        if cts.is_empty() || cts.len() != pts.len() {
            return Err(HeloraError::Backend("dot_plain: bad term count".into()));
        }
        let mut acc = self.ev.mul_accumulator(cts[0].level()).map_err(he)?;
        acc.add_products(cts, pts).map_err(he)?;
        acc.finish()
            .ok_or_else(|| HeloraError::Backend("dot_plain: empty".into()))
    }

    fn add_assign(&self, acc: &mut Ciphertext, other: &Ciphertext) -> Result<()> {
        self.ev.add_assign(acc, other).map_err(he)
    }

    fn rotate(&self, ct: &Ciphertext, step: i64) -> Result<Ciphertext> {
        self.ev.rotate(ct, step, &self.gks).map_err(he)
    }

    fn rotate_hoisted(&self, ct: &Ciphertext, steps: &[i64]) -> Result<Vec<Ciphertext>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let h = self.ev.hoist(ct);
        steps
            .iter()
            .map(|&s| self.ev.rotate_hoisted(&h, s, &self.gks).map_err(he))
            .collect()
    }

    fn rescale(&self, ct: &Ciphertext) -> Result<Ciphertext> {
        self.ev.rescale(ct).map_err(he)
    }

    fn rerandomize(&self, ct: &Ciphertext) -> Result<Ciphertext> {
        let (pk, cfg) = self
            .pk
            .as_ref()
            .ok_or_else(|| HeloraError::Backend("rerandomize: no public key".into()))?;
        let mut rng = lock(&self.rng);
        let noise: Vec<f64> = if cfg.flood_sigma > 0.0 {
            (0..self.ctx.slots())
                .map(|_| cfg.flood_sigma * normal(&mut rng))
                .collect()
        } else {
            Vec::new()
        };
        let pt = self
            .encoder
            .encode(&noise, ct.level(), ct.scale())
            .map_err(he)?;
        let zero = Encryptor::new(&self.ctx)
            .encrypt_pk(&pt, pk, &mut *rng)
            .map_err(he)?;
        drop(rng);
        let mut out = ct.clone();
        self.ev.add_assign(&mut out, &zero).map_err(he)?;
        Ok(out)
    }

    fn input_from_bytes(&self, bytes: &[u8]) -> Result<Ciphertext> {
        let seeded = SeededCiphertext::from_upload_bytes(&self.ctx, bytes).map_err(he)?;
        Ok(seeded.expand())
    }

    fn output_to_bytes(&self, ct: &Ciphertext) -> Vec<u8> {
        ct.to_bytes()
    }

    fn output_to_bytes_bounded(&self, ct: &Ciphertext, bound: f64, bits: u32) -> Result<Vec<u8>> {
        if ct.level() != 0 || !bound.is_finite() {
            return Ok(ct.to_bytes());
        }
        match self.compression_params_at(ct.scale(), bound, bits) {
            Some(p) => Ok(ct.compress(&p).map_err(he)?.to_bytes()),
            None => Ok(ct.to_bytes()),
        }
    }
}

/// The client: secret key, encoder, encryptor, decryptor.
pub struct CkksClient {
    ctx: Arc<Context>,
    sk: SecretKey,
    encoder: Encoder,
    encryptor: Encryptor,
    decryptor: Decryptor,
    rng: Mutex<ChaCha20Rng>,
}

impl std::fmt::Debug for CkksClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CkksClient").finish_non_exhaustive()
    }
}

impl CkksClient {
    /// A client with a fresh secret key from the OS CSPRNG.
    ///
    /// # Errors
    /// [`HeloraError::Ckks`] when the OS random generator fails.
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        let mut rng = os_rng().map_err(he)?;
        let sk = SecretKey::generate(ctx, &mut rng);
        Ok(CkksClient {
            ctx: ctx.clone(),
            decryptor: Decryptor::new(&sk),
            sk,
            encoder: Encoder::new(ctx),
            encryptor: Encryptor::new(ctx),
            rng: Mutex::new(rng),
        })
    }

    /// Galois keys for exactly `steps` (e.g. [`crate::GroupPlan::galois_steps`]).
    pub fn galois_keys(&self, steps: &[i64]) -> GaloisKeys {
        GaloisKeys::generate(&self.sk, steps, &mut *lock(&self.rng))
    }

    /// The public key (only needed by a rerandomising server).
    pub fn public_key(&self) -> PublicKey {
        PublicKey::generate(&self.sk, &mut *lock(&self.rng))
    }

    /// The CKKS context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl HeClient for CkksClient {
    fn slots(&self) -> usize {
        self.ctx.slots()
    }

    fn encrypt_to_bytes(&self, re: &[f64], im: &[f64], level: usize) -> Result<Vec<u8>> {
        self.encrypt_to_bytes_within(re, im, level, 0.0)
    }

    fn encrypt_to_bytes_within(
        &self,
        re: &[f64],
        im: &[f64],
        level: usize,
        max_error: f64,
    ) -> Result<Vec<u8>> {
        let scale = self.ctx.params().scale();
        let ct = self
            .encryptor
            .encrypt_values_sk(
                &self.encoder,
                re,
                im,
                level,
                scale,
                &self.sk,
                &mut *lock(&self.rng),
            )
            .map_err(he)?;
        match rounded::max_dropped_bits(&self.ctx, scale, max_error) {
            0 => Ok(ct.to_bytes()),
            d => Ok(ct.round_low_bits(d).map_err(he)?.to_bytes()),
        }
    }

    fn decrypt_from_bytes(&self, bytes: &[u8]) -> Result<Vec<Complex64>> {
        let pt = if peek_kind(bytes) == Ok(ObjectKind::CompressedCiphertext) {
            let ct = CompressedCiphertext::from_bytes(&self.ctx, bytes).map_err(he)?;
            self.decryptor.decrypt_compressed(&ct).map_err(he)?
        } else {
            let ct = Ciphertext::from_bytes(&self.ctx, bytes).map_err(he)?;
            self.decryptor.decrypt(&ct).map_err(he)?
        };
        Ok(self.encoder.decode_complex(&pt))
    }
}
