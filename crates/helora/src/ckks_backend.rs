//! The HE interface on the `cipherlora-ckks` engine: [`CkksClient`] holds the secret key,
//! [`CkksServer`] public material only; weights are encoded at the next rescale's prime, so scales
//! stay exact; responses are compressed ([`ResponseCompression`]).

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
    /// Flooding noise standard deviation, absolute slot units (`0`: the encryption of zero only).
    pub flood_sigma: f64,
}

impl Default for Rerandomization {
    /// `2^-20` slot units: heuristic smudging (statistical circuit privacy does not fit N = 8192).
    fn default() -> Self {
        Rerandomization {
            flood_sigma: 2f64.powi(-20),
        }
    }
}

/// How [`CkksServer`] serialises returned ciphertexts ([`HeServer::output_to_bytes_bounded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseCompression {
    /// Full level-0 ciphertexts.
    Off,
    /// Compressed ciphertexts with error ≤ `bound·2^-bits` per slot part (failure 2^-40), `bound`
    /// the group's output bound; full ciphertexts when infeasible.
    Precision {
        /// Target precision P in bits relative to the bound.
        bits: u32,
    },
}

impl ResponseCompression {
    /// Default precision: 25 bits relative to the output bound (each bit: `2·N/8` bytes).
    pub const DEFAULT_BITS: u32 = 25;

    /// The fewest bits a client may ask per request (below, sizes hardly fall).
    pub const MIN_BITS: u32 = 8;
}

impl Default for ResponseCompression {
    /// [`ResponseCompression::Precision`] with [`ResponseCompression::DEFAULT_BITS`].
    fn default() -> Self {
        ResponseCompression::Precision {
            bits: Self::DEFAULT_BITS,
        }
    }
}

/// Absolute margin added to output bounds before compressing, covering the CKKS evaluation noise.
const NOISE_MARGIN: f64 = 1.0 / 65536.0;

/// The server: evaluator, encoder, the client's Galois keys and optional public key.
pub struct CkksServer {
    ctx: Arc<Context>,
    ev: Evaluator,
    encoder: Encoder,
    gks: GaloisKeys,
    pk: Option<(PublicKey, Rerandomization)>,
    compression: ResponseCompression,
    /// Chosen compression parameters by `(scale, bound, bits)`.
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
    /// A server for `ctx` with the client's Galois keys and optional public key. Errors:
    /// [`HeloraError::Ckks`] when the OS generator fails.
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

    /// The same server with another response compression.
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

    /// Compression parameters for a level-0 ciphertext at `scale` with slot parts within `bound`
    /// (plus margins); `None` when off or infeasible. Memoized.
    pub fn compression_params(&self, scale: f64, bound: f64) -> Option<CompressionParams> {
        self.compression_params_at(scale, bound, 0)
    }

    /// As [`CkksServer::compression_params`] at `asked` bits (0: configured; never above it or
    /// below [`ResponseCompression::MIN_BITS`]).
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
    /// Weights at `level` are encoded at scale `q_level`, the next rescale's prime.
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
            return Err(HeloraError::TermCount {
                op: "dot_plain_extended",
                ciphertexts: cts.len(),
                plaintexts: pts.len(),
            });
        }
        let mut acc = self
            .ev
            .mul_accumulator_extended(cts[0].level())
            .map_err(he)?;
        acc.add_products(cts, pts).map_err(he)?;
        acc.finish().ok_or(HeloraError::TermCount {
            op: "dot_plain_extended",
            ciphertexts: 0,
            plaintexts: 0,
        })
    }

    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, ExtendedCiphertext, ExtendedPlaintext>],
    ) -> Result<Vec<ExtendedCiphertext>> {
        let Some(level) = sums.iter().find_map(|(c, _)| c.first().map(|c| c.level())) else {
            return if sums.is_empty() {
                Ok(Vec::new())
            } else {
                Err(empty_sum("dot_plain_extended_many"))
            };
        };
        let slices: Vec<(&[&ExtendedCiphertext], &[&ExtendedPlaintext])> =
            sums.iter().map(|(c, p)| (&c[..], &p[..])).collect();
        self.ev
            .sums_of_products_extended(level, &slices)
            .map_err(he)?
            .into_iter()
            .map(|s| s.ok_or(empty_sum("dot_plain_extended_many")))
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
                Err(empty_sum("dot_plain_many"))
            };
        };
        let slices: Vec<(&[&Ciphertext], &[&Plaintext])> =
            sums.iter().map(|(c, p)| (&c[..], &p[..])).collect();
        self.ev
            .sums_of_products(level, &slices)
            .map_err(he)?
            .into_iter()
            .map(|s| s.ok_or(empty_sum("dot_plain_many")))
            .collect()
    }

    fn mod_down_rescale(&self, ct: &ExtendedCiphertext) -> Result<Ciphertext> {
        self.ev.mod_down_rescale(ct).map_err(he)
    }

    fn dot_plain(&self, cts: &[&Ciphertext], pts: &[&Plaintext]) -> Result<Ciphertext> {
        if cts.is_empty() || cts.len() != pts.len() {
            return Err(HeloraError::TermCount {
                op: "dot_plain",
                ciphertexts: cts.len(),
                plaintexts: pts.len(),
            });
        }
        let mut acc = self.ev.mul_accumulator(cts[0].level()).map_err(he)?;
        acc.add_products(cts, pts).map_err(he)?;
        acc.finish().ok_or(empty_sum("dot_plain"))
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
        let (pk, cfg) = self.pk.as_ref().ok_or(HeloraError::NoPublicKey)?;
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
    /// A client with a fresh secret key (OS CSPRNG). Errors: [`HeloraError::Ckks`].
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

/// A sum of products with no terms.
fn empty_sum(op: &'static str) -> HeloraError {
    HeloraError::TermCount {
        op,
        ciphertexts: 0,
        plaintexts: 0,
    }
}
