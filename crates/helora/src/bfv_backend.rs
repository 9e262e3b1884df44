//! The offline phase of masked ring values on batched BFV (`cipherlora_ckks::bfv`): the server
//! runs a group's CKKS plan unchanged on encryptions of the client's one-time masks and returns
//! `Enc(M̂·r − m)`, flooded; design and parameters: docs/design/wire.md, "Masked ring values".
//!
//! [`BfvServer`] implements [`HeServer`] by delegating every linear operation to a
//! [`CkksServer`] (ct×pt products, hoisted rotations and rescales are the same RNS operations;
//! a rescale is BFV's modulus switch) and encoding the weights, which must be integers (a
//! [`crate::ring::RingGroup`]'s adapter), in `Z_t`. It keeps [`OfflineLevels::headroom`] chain
//! primes below the plan's levels, so the response is still above its modulus floor when it is
//! flooded: batched decryption must be exact, since a coefficient error scrambles every slot.

use std::sync::{Arc, Mutex};

use cipherlora_ckks::bfv::{self, BatchEncoder, Decrypted};
use cipherlora_ckks::{
    Ciphertext, CkksParameters, Context, Evaluator, ExtendedCiphertext, ExtendedPlaintext,
    GaloisKeys, Plaintext, PublicKey, SecretKey, SeededCiphertext, os_rng,
};
use rand_chacha::ChaCha20Rng;

use crate::ckks_backend::CkksServer;
use crate::error::{HeloraError, Result};
use crate::group_server::PreparedGroup;
use crate::he_traits::{HeServer, ProductSum};
use crate::plan::Mode;

fn he(e: cipherlora_ckks::CkksError) -> HeloraError {
    HeloraError::Ckks(e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bits the flooding noise must exceed the response's noise by: the flooded response is within
/// statistical distance `2^-40` of one independent of the weights.
pub const FLOOD_MARGIN_BITS: u32 = 40;

/// Ring degree of the offline phase: exact batched decryption needs the flooding inside the
/// noise budget, which N = 8192 (218 bits) cannot hold for a 60-bit `t`.
pub const OFFLINE_DEGREE: usize = 16384;

/// The offline context: N = 16384, chain 5 × 60 + 60 (360 of the HE standard's 438 bits).
/// Errors: as [`CkksParameters`]'s builder.
pub fn offline_parameters() -> Result<CkksParameters> {
    CkksParameters::builder()
        .degree(OFFLINE_DEGREE)
        .moduli_bits(&[60; 5])
        .special_moduli_bits(&[60])
        // Unused by BFV; CKKS's builder wants one below q_0.
        .scale_bits(40)
        .build()
        .map_err(he)
}

/// Where a plan runs in the offline context and how its response is flooded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineLevels {
    /// Chain primes below the plan's levels (the plan's level 0 is this real level).
    pub headroom: usize,
    /// Real level the response is switched down to before it is masked and flooded.
    pub response_level: usize,
    /// Flooding width (bits), [`FLOOD_MARGIN_BITS`] above the response's noise there.
    pub flood_bits: u32,
}

impl OfflineLevels {
    /// The levels for `mode` in [`offline_parameters`] (noise budgets: docs/design/wire.md,
    /// "Masked ring values"). FFA's one product runs at `Q = 2^180` and its response stays at
    /// `2^120` with noise below `2^17`; standard LoRA's two run at `2^300` and `2^240`, and two
    /// modulus switches leave the response at `2^120` with noise below `2^9`.
    pub fn for_mode(mode: Mode) -> Self {
        match mode {
            Mode::Ffa => OfflineLevels {
                headroom: 1,
                response_level: 1,
                flood_bits: 17 + FLOOD_MARGIN_BITS,
            },
            Mode::Standard => OfflineLevels {
                headroom: 2,
                response_level: 1,
                flood_bits: 9 + FLOOD_MARGIN_BITS,
            },
        }
    }
}

/// The offline server: the client's Galois and public keys, `Z_t` weights.
pub struct BfvServer {
    linear: CkksServer,
    encoder: BatchEncoder,
    ev: Evaluator,
    pk: PublicKey,
    levels: OfflineLevels,
    rng: Mutex<ChaCha20Rng>,
}

impl std::fmt::Debug for BfvServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BfvServer")
            .field("t", &self.encoder.plaintext_modulus())
            .field("levels", &self.levels)
            .finish_non_exhaustive()
    }
}

impl BfvServer {
    /// A server over `ctx` with plaintext modulus `t` and `levels`. Errors: [`HeloraError::Ckks`]
    /// for a bad `t` or flooding width; [`HeloraError::NotEnoughLevels`] when the levels do not
    /// fit the chain; the OS generator failing.
    pub fn new(
        ctx: &Arc<Context>,
        t: u64,
        gks: GaloisKeys,
        pk: PublicKey,
        levels: OfflineLevels,
    ) -> Result<Self> {
        if levels.headroom >= ctx.max_level() || levels.response_level > levels.headroom {
            return Err(HeloraError::NotEnoughLevels {
                needed: levels.headroom + 1,
                available: ctx.max_level(),
            });
        }
        if levels.flood_bits > bfv::MAX_FLOOD_BITS {
            return Err(he(cipherlora_ckks::CkksError::InvalidParameters {
                reason: "flooding wider than 2^61",
            }));
        }
        Ok(BfvServer {
            linear: CkksServer::new(ctx, gks, None)?,
            encoder: BatchEncoder::new(ctx, t).map_err(he)?,
            ev: Evaluator::new(ctx),
            pk,
            levels,
            rng: Mutex::new(os_rng().map_err(he)?),
        })
    }

    /// The real level of a plan level.
    fn real(&self, level: usize) -> usize {
        level + self.levels.headroom
    }

    /// Integer weights in `Z_t`, zero padded, the same in both rows. Errors:
    /// [`HeloraError::InvalidShape`] for a non-integer weight, one of `2^53` or more, or more
    /// weights than slots.
    fn ring_weights(&self, values: &[f64]) -> Result<Vec<u64>> {
        let t = self.encoder.plaintext_modulus();
        let row: Vec<u64> = values
            .iter()
            .map(|&v| {
                if v.fract() != 0.0 || v.abs() >= 2f64.powi(53) {
                    return Err(HeloraError::InvalidShape {
                        reason: "BFV weights must be integers below 2^53 (a RingGroup's adapter)",
                    });
                }
                Ok((v as i64).rem_euclid(t as i64) as u64)
            })
            .collect::<Result<_>>()?;
        let half = self.slots();
        if row.len() > half {
            return Err(HeloraError::InvalidShape {
                reason: "more weights than slots",
            });
        }
        let mut both = row.clone();
        both.resize(half, 0);
        both.extend_from_slice(&row);
        Ok(both)
    }

    /// The offline response of one group request: `Enc(M̂·r − m)` per returned ciphertext, `m`
    /// the server's masks (`masks[c]`: N values of `Z_t`, row 0 then row 1), switched down to the
    /// response level and flooded there. Errors: as [`PreparedGroup::evaluate`];
    /// [`HeloraError::CiphertextCount`] when the masks do not match the responses.
    pub fn offline_response(
        &self,
        group: &PreparedGroup<BfvServer>,
        inputs: &[Ciphertext],
        masks: &[Vec<u64>],
    ) -> Result<Vec<Ciphertext>> {
        let mut out = group.evaluate(self, inputs)?;
        if masks.len() != out.len() {
            return Err(HeloraError::CiphertextCount {
                what: "server masks",
                expected: out.len(),
                got: masks.len(),
            });
        }
        let t = self.encoder.plaintext_modulus();
        let mut rng = lock(&self.rng);
        for (ct, m) in out.iter_mut().zip(masks) {
            while ct.level() > self.levels.response_level {
                self.ev.rescale_assign(ct).map_err(he)?;
            }
            ct.set_scale(1.0);
            let minus: Vec<u64> = m.iter().map(|&v| (t - v % t) % t).collect();
            let pt = self.encoder.message(&minus, ct.level()).map_err(he)?;
            self.ev.add_plain_assign(ct, &pt).map_err(he)?;
            bfv::flood(ct, &self.pk, self.levels.flood_bits, &mut *rng).map_err(he)?;
        }
        Ok(out)
    }
}

impl HeServer for BfvServer {
    type Ct = Ciphertext;
    type Pt = Plaintext;
    type ExtCt = ExtendedCiphertext;
    type ExtPt = ExtendedPlaintext;

    fn slots(&self) -> usize {
        self.linear.slots()
    }

    fn max_level(&self) -> usize {
        self.linear.max_level() - self.levels.headroom
    }

    fn level(&self, ct: &Ciphertext) -> usize {
        ct.level().saturating_sub(self.levels.headroom)
    }

    fn encode_weights(&self, values: &[f64], level: usize) -> Result<Plaintext> {
        let w = self.ring_weights(values)?;
        self.encoder.operand(&w, self.real(level)).map_err(he)
    }

    fn encode_weights_extended(&self, values: &[f64], level: usize) -> Result<ExtendedPlaintext> {
        let w = self.ring_weights(values)?;
        self.encoder
            .operand_extended(&w, self.real(level))
            .map_err(he)
    }

    fn rotate_hoisted_extended(
        &self,
        ct: &Ciphertext,
        steps: &[i64],
    ) -> Result<Vec<ExtendedCiphertext>> {
        self.linear.rotate_hoisted_extended(ct, steps)
    }

    fn dot_plain_extended(
        &self,
        cts: &[&ExtendedCiphertext],
        pts: &[&ExtendedPlaintext],
    ) -> Result<ExtendedCiphertext> {
        self.linear.dot_plain_extended(cts, pts)
    }

    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, ExtendedCiphertext, ExtendedPlaintext>],
    ) -> Result<Vec<ExtendedCiphertext>> {
        self.linear.dot_plain_extended_many(sums)
    }

    /// ModDown and a modulus switch; BFV keeps scale 1 (the message does not scale).
    fn mod_down_rescale(&self, ct: &ExtendedCiphertext) -> Result<Ciphertext> {
        let mut out = self.linear.mod_down_rescale(ct)?;
        out.set_scale(1.0);
        Ok(out)
    }

    fn dot_plain(&self, cts: &[&Ciphertext], pts: &[&Plaintext]) -> Result<Ciphertext> {
        self.linear.dot_plain(cts, pts)
    }

    fn dot_plain_many(
        &self,
        sums: &[ProductSum<'_, Ciphertext, Plaintext>],
    ) -> Result<Vec<Ciphertext>> {
        self.linear.dot_plain_many(sums)
    }

    fn add_assign(&self, acc: &mut Ciphertext, other: &Ciphertext) -> Result<()> {
        self.linear.add_assign(acc, other)
    }

    fn rotate(&self, ct: &Ciphertext, step: i64) -> Result<Ciphertext> {
        self.linear.rotate(ct, step)
    }

    fn rotate_hoisted(&self, ct: &Ciphertext, steps: &[i64]) -> Result<Vec<Ciphertext>> {
        self.linear.rotate_hoisted(ct, steps)
    }

    /// A modulus switch; BFV keeps scale 1.
    fn rescale(&self, ct: &Ciphertext) -> Result<Ciphertext> {
        let mut out = self.linear.rescale(ct)?;
        out.set_scale(1.0);
        Ok(out)
    }

    /// Flooding with the server's width ([`bfv::flood`]).
    fn rerandomize(&self, ct: &Ciphertext) -> Result<Ciphertext> {
        let mut out = ct.clone();
        bfv::flood(
            &mut out,
            &self.pk,
            self.levels.flood_bits,
            &mut *lock(&self.rng),
        )
        .map_err(he)?;
        Ok(out)
    }

    fn input_from_bytes(&self, bytes: &[u8]) -> Result<Ciphertext> {
        self.linear.input_from_bytes(bytes)
    }

    fn output_to_bytes(&self, ct: &Ciphertext) -> Vec<u8> {
        ct.to_bytes()
    }
}

/// The offline client: the secret key and the `Z_t` encoder.
pub struct BfvClient {
    encoder: BatchEncoder,
    sk: SecretKey,
    levels: OfflineLevels,
    rng: Mutex<ChaCha20Rng>,
}

impl std::fmt::Debug for BfvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BfvClient")
            .field("t", &self.encoder.plaintext_modulus())
            .finish_non_exhaustive()
    }
}

impl BfvClient {
    /// A client with the secret key `sk`, plaintext modulus `t` and the server's `levels`.
    /// Errors: [`HeloraError::Ckks`] for a bad `t`; the OS generator failing.
    pub fn new(sk: &SecretKey, t: u64, levels: OfflineLevels) -> Result<Self> {
        Ok(BfvClient {
            encoder: BatchEncoder::new(sk.context(), t).map_err(he)?,
            sk: sk.clone(),
            levels,
            rng: Mutex::new(os_rng().map_err(he)?),
        })
    }

    /// Encrypts one upload's masks (`rows`: the plan's real-part and imaginary-part slot
    /// vectors, [`crate::GroupClient::mask_slots`]) at plan level `level`. Errors: values `≥ t`,
    /// too many, or a level out of range.
    pub fn encrypt(&self, rows: &[Vec<u64>; 2], level: usize) -> Result<SeededCiphertext> {
        let half = self.encoder.slots() / 2;
        let mut values = rows[0].clone();
        if values.len() > half || rows[1].len() > half {
            return Err(HeloraError::InvalidShape {
                reason: "more masks than slots",
            });
        }
        values.resize(half, 0);
        values.extend_from_slice(&rows[1]);
        self.encoder
            .encrypt_sk(
                &values,
                level + self.levels.headroom,
                &self.sk,
                &mut *lock(&self.rng),
            )
            .map_err(he)
    }

    /// The context of the client's secret key.
    pub fn context(&self) -> &Arc<Context> {
        self.sk.context()
    }

    /// Decrypts one offline response: N values of `Z_t` (row 0 then row 1) and the noise budget
    /// left. Errors: another context's ciphertext.
    pub fn decrypt(&self, ct: &Ciphertext) -> Result<Decrypted> {
        self.encoder.decrypt(ct, &self.sk).map_err(he)
    }
}
