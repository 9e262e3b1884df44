//! Masked ring values: the online phase of Delphi-style preprocessing (Mishra et al., "Delphi",
//! USENIX Security 2020, §4) for one LoRA projection, in the prime field `Z_p` that a batched
//! RLWE offline phase computes in (docs/design/wire.md, "Masked ring values").
//!
//! The server holds `Â` (lora_A) and `B̂` (s·lora_B) in fixed point, `M̂ = B̂·Â`. From an
//! offline phase the client holds, per position, a one-time mask `r` (its CSPRNG) and
//! `c = M̂·r − m`, where `m` is the server's one-time mask. Online:
//!
//! 1. the client encodes x as integers `x̂` with the projection's input bits
//!    ([`RingProjection::input_bits`], [`RingInput::encode`]) and sends `x̂ − r mod p`
//!    ([`RingInput::masked`]): uniform, whatever x is;
//! 2. the server returns the top [`RingParams::response_bits`] bits of `M̂·(x̂ − r) + m mod p`
//!    ([`RingProjection::respond`]);
//! 3. the client adds its kept top bits of c ([`kept_bits`]) and reduces to the centred residue
//!    ([`unmask`]): `M̂·x̂` to within `2^(shift + 1)`, where `shift` is the bits dropped.
//!
//! Everything here is exact integer arithmetic; the only errors are the fixed-point rounding of
//! x, `Â` and `B̂` and the dropped low bits. Masks must never be reused: two inputs under one r
//! reveal their difference.

use rand::Rng;

use crate::adapter::{GroupAdapter, ProjectionAdapter};
use crate::error::{HeloraError, Result};
use crate::group_client::GroupClient;
use crate::plan::{GroupPlan, Mode};

/// The ring's modulus: the prime `3·2^58 − 104·2^16 + 1`, `≡ 1 mod 2^16`, so the batched BFV
/// offline phase (`cipherlora_ckks::bfv`) can encode `Z_p` vectors at ring degree up to 32768. A
/// BFV plaintext modulus must not be a ciphertext prime: chains take their 60-bit primes from
/// `2^60` down, and this one lies far below them.
pub const RING_PRIME: u64 = 0x0bff_ffff_ff98_0001;

/// Bits of [`RING_PRIME`].
const RING_BITS: u32 = 60;

/// Most fractional bits of an input (an f32 carries 24).
const MAX_INPUT_BITS: u32 = 24;

/// Fixed-point widths of the online phase. The input bits follow from the weights: as many as
/// keep `|M̂·x̂|` below `2^(60 − 2)` ([`RingProjection::input_bits`]), because a response in `Z_p`
/// carries its value from the field's top bit down, so a product that fills the field comes back
/// most precisely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingParams {
    /// Bits of `Â` and `B̂` below each matrix's largest entry (sign included).
    pub weight_bits: u32,
    /// Bits per returned value.
    pub response_bits: u32,
}

impl Default for RingParams {
    /// 16-bit weights and 32-bit responses (docs/design/wire.md, the fidelity study: with fewer
    /// response bits the deltas of small outputs lose precision).
    fn default() -> Self {
        RingParams {
            weight_bits: 16,
            response_bits: 32,
        }
    }
}

impl RingParams {
    /// Errors: [`HeloraError::InvalidShape`] unless a response value fits 1 to 32 bits.
    fn check_response_bits(&self) -> Result<()> {
        if (1..=32).contains(&self.response_bits) {
            Ok(())
        } else {
            Err(HeloraError::InvalidShape {
                reason: "ring responses need 1 to 32 bits",
            })
        }
    }
}

/// One projection's weights in fixed point, as the server holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct RingProjection {
    /// `Â`, (r × d_in), row-major: `round(lora_A · 2^ea)`.
    a: Vec<i64>,
    /// `B̂`, (d_out × r), row-major: `round(s·lora_B · 2^eb)`.
    b: Vec<i64>,
    r: usize,
    d_in: usize,
    d_out: usize,
    /// Fractional bits of x̂ after the client's normalisation to `max |x| ≤ 1`.
    input_bits: u32,
    /// `ea + eb + input_bits`: a delta is `M̂·x̂ · 2^(e_x − scale_log2)`.
    scale_log2: i32,
    /// Every `|M̂·x̂|` with `max |x̂| ≤ 2^input_bits` is below `2^bound_log2`.
    bound_log2: u32,
    /// Low bits dropped from each response value.
    shift: u32,
}

/// The exponent `e` that puts `bits` bits (sign included) below the largest of `w`'s magnitudes.
fn exponent<'a>(w: impl IntoIterator<Item = &'a f32>, bits: u32) -> i32 {
    let max = w
        .into_iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    bits as i32 - 1 - max.log2().ceil() as i32
}

/// `round(w·2^e)` per entry.
fn round_at(w: &[f32], e: i32) -> Vec<i64> {
    w.iter()
        .map(|&v| (f64::from(v) * 2f64.powi(e)).round() as i64)
        .collect()
}

/// Rounds `w` to `bits` bits below its largest magnitude: `(round(w·2^e), e)`.
fn quantize(w: &[f32], bits: u32) -> (Vec<i64>, i32) {
    let e = exponent(w, bits);
    (round_at(w, e), e)
}

/// The top bits of `y + m mod p` per element, `shift` low bits dropped.
fn top_bits(y: &[u64], m: &[u64], shift: u32) -> Vec<u32> {
    y.iter()
        .zip(m)
        .map(|(&y, &m)| (reduce(i128::from(y) + i128::from(m)) >> shift) as u32)
        .collect()
}

/// `Σ_k row[k]·v[k] mod p`.
fn dot_mod(row: &[i64], v: &[u64]) -> u64 {
    // |row[k]| < 2^24 and v < 2^60: each product below 2^84, a sum of up to 2^40 of them fits.
    reduce(
        row.iter()
            .zip(v)
            .map(|(&a, &x)| i128::from(a) * i128::from(x))
            .sum(),
    )
}

/// `v mod p` for any signed 128-bit value.
fn reduce(v: i128) -> u64 {
    v.rem_euclid(i128::from(RING_PRIME)) as u64
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(HeloraError::ShapeMismatch {
            what,
            expected,
            got,
        })
    }
}

impl RingProjection {
    /// Quantizes `lora_a` (r × d_in) and `scaled_b` (s·lora_B, d_out × r), both row-major.
    /// Errors: [`HeloraError::ShapeMismatch`], [`HeloraError::InvalidShape`];
    /// [`HeloraError::RingBound`] when not even one input bit keeps `M̂·x̂` below `p/4`.
    pub fn new(
        lora_a: &[f32],
        scaled_b: &[f32],
        (r, d_in, d_out): (usize, usize, usize),
        params: RingParams,
    ) -> Result<Self> {
        check_len("lora_A (r × d_in)", r * d_in, lora_a.len())?;
        check_len("s·lora_B (d_out × r)", d_out * r, scaled_b.len())?;
        if r == 0 || d_in == 0 || d_out == 0 {
            return Err(HeloraError::InvalidShape {
                reason: "a ring projection needs r, d_in and d_out ≥ 1",
            });
        }
        params.check_response_bits()?;
        let (a, ea) = quantize(lora_a, params.weight_bits);
        let (b, eb) = quantize(scaled_b, params.weight_bits);
        // L = max_i Σ_k |(B̂Â)_ik|; β = L·2^input_bits bounds |M̂·x̂| for max |x̂| ≤ 2^input_bits.
        let mut l1: u128 = 0;
        for i in 0..d_out {
            let row: u128 = (0..d_in)
                .map(|k| {
                    let m: i128 = (0..r)
                        .map(|j| i128::from(b[i * r + j]) * i128::from(a[j * d_in + k]))
                        .sum();
                    m.unsigned_abs()
                })
                .sum();
            l1 = l1.max(row);
        }
        let input_bits = input_bits_for(l1)?;
        let l1_bits = u128::BITS - l1.leading_zeros();
        Ok(RingProjection {
            a,
            b,
            r,
            d_in,
            d_out,
            input_bits,
            scale_log2: ea + eb + input_bits as i32,
            bound_log2: l1_bits + input_bits,
            shift: RING_BITS.saturating_sub(params.response_bits),
        })
    }

    /// Fractional bits of the input after its normalisation (public: the client encodes with
    /// them).
    pub fn input_bits(&self) -> u32 {
        self.input_bits
    }

    /// Input dimension.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Output dimension.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// `log₂` of the bound on `|M̂·x̂|` (public, like the CKKS output bounds).
    pub fn bound_log2(&self) -> u32 {
        self.bound_log2
    }

    /// Low bits dropped from each response value (public).
    pub fn shift(&self) -> u32 {
        self.shift
    }

    /// `M̂·v mod p` for `v` in `Z_p^{d_in}`: what the offline phase computes on `Enc(r)`.
    /// Errors: [`HeloraError::ShapeMismatch`].
    pub fn product(&self, v: &[u64]) -> Result<Vec<u64>> {
        check_len("ring input (d_in)", self.d_in, v.len())?;
        let u: Vec<u64> = self
            .a
            .chunks_exact(self.d_in)
            .map(|row| dot_mod(row, v))
            .collect();
        Ok(self
            .b
            .chunks_exact(self.r)
            .map(|row| dot_mod(row, &u))
            .collect())
    }

    /// The server's online answer: the top bits of `M̂·masked + server_mask mod p`, per output.
    /// Errors: [`HeloraError::ShapeMismatch`].
    pub fn respond(&self, masked: &[u64], server_mask: &[u64]) -> Result<Vec<u32>> {
        check_len("server mask (d_out)", self.d_out, server_mask.len())?;
        Ok(top_bits(&self.product(masked)?, server_mask, self.shift))
    }

    /// What the client needs to encode its inputs and decode the products.
    pub fn public(&self) -> RingPublic {
        RingPublic {
            input_bits: self.input_bits,
            scale_log2: self.scale_log2,
            shift: self.shift,
        }
    }

    /// The delta values of unmasked `z = M̂·x̂` for an input encoded with `exponent`.
    pub fn decode(&self, z: &[i64], exponent: i32) -> Vec<f32> {
        self.public().decode(z, exponent)
    }
}

/// A layer group's adapter in the fixed point that the offline (BFV) and online phases share:
/// the stacked lora_A and every `s·lora_B` rounded to `weight_bits` below the group's largest
/// entry of each, one exponent per stage because a plan's diagonals mix the group's projections.
/// It is held as an integer-valued adapter with scaling 1, which
/// [`crate::bfv_backend::BfvServer`] encodes exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct RingGroup {
    adapter: GroupAdapter,
    a_exp: i32,
    b_exp: i32,
    shift: u32,
    /// Input bits per mode: `[standard, FFA]`.
    input_bits: [u32; 2],
}

/// What the client of a [`RingGroup`] needs to encode its inputs and decode the unmasked
/// products: public, like the CKKS path's output bounds (powers of two of the weights' scale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPublic {
    /// Fractional bits of each input after its power-of-two normalisation ([`RingInput::encode`]).
    pub input_bits: u32,
    /// A delta is `M̂·x̂ · 2^(exponent − scale_log2)`: the weights' exponents plus the input bits.
    pub scale_log2: i32,
    /// Low bits dropped from each response value.
    pub shift: u32,
}

impl RingPublic {
    /// Bits per response value on the wire: the ring's 60 less the dropped bits.
    pub fn response_bits(&self) -> u32 {
        RING_BITS.saturating_sub(self.shift)
    }

    /// The delta values of unmasked products `z = M̂·x̂` of an input encoded with `exponent`.
    pub fn decode(&self, z: &[i64], exponent: i32) -> Vec<f32> {
        let unit = 2f64.powi(exponent - self.scale_log2);
        z.iter().map(|&v| (v as f64 * unit) as f32).collect()
    }
}

/// The input bits that keep `|M̂·x̂| < 2^(60 − 2)` for `max |x̂| ≤ 2^bits`, given `l1`, the largest
/// row sum `Σ_k |M̂_ik|`. Errors: [`HeloraError::RingBound`] when not even one bit fits.
fn input_bits_for(l1: u128) -> Result<u32> {
    // Centred residues reach p/2: the product and the dropped bits must stay below it.
    let l1_bits = u128::BITS - l1.leading_zeros();
    let bits = (RING_BITS - 2).saturating_sub(l1_bits).min(MAX_INPUT_BITS);
    if bits == 0 {
        return Err(HeloraError::RingBound {
            bound_log2: l1_bits,
            ring_bits: RING_BITS,
        });
    }
    Ok(bits)
}

/// The largest row sum `Σ_k |(B·A)_ik|` over the group's projections (standard LoRA), or of
/// `Σ_j |B_ij|` (FFA, whose input is `A·x`).
fn row_l1(ps: &[ProjectionAdapter], d_in: usize, mode: Mode) -> u128 {
    let mut l1 = 0u128;
    for p in ps {
        let b: Vec<i128> = p.b.iter().map(|&v| v as i128).collect();
        let a: Vec<i128> = p.a.iter().map(|&v| v as i128).collect();
        for brow in b.chunks_exact(p.rank) {
            let row: u128 = match mode {
                Mode::Ffa => brow.iter().map(|v| v.unsigned_abs()).sum(),
                Mode::Standard => (0..d_in)
                    .map(|k| {
                        let m: i128 = brow
                            .iter()
                            .zip(a.chunks_exact(d_in))
                            .map(|(bv, ar)| bv * ar[k])
                            .sum();
                        m.unsigned_abs()
                    })
                    .sum(),
            };
            l1 = l1.max(row);
        }
    }
    l1
}

/// Most weight bits an integer-valued f32 holds exactly.
const MAX_WEIGHT_BITS: u32 = 24;

impl RingGroup {
    /// Quantizes `adapter` to `params.weight_bits`. Errors: [`HeloraError::InvalidShape`] for
    /// weight bits outside `2..=24`, response bits outside `1..=32` or an invalid adapter;
    /// [`HeloraError::RingBound`] when not
    /// even one input bit keeps the products below `p/4`.
    pub fn new(adapter: &GroupAdapter, params: RingParams) -> Result<Self> {
        adapter.validate()?;
        params.check_response_bits()?;
        let weight_bits = params.weight_bits;
        if !(2..=MAX_WEIGHT_BITS).contains(&weight_bits) {
            return Err(HeloraError::InvalidShape {
                reason: "ring weights need 2 to 24 bits",
            });
        }
        let ps = &adapter.projections;
        let a_exp = exponent(ps.iter().flat_map(|p| &p.a), weight_bits);
        let scaled: Vec<Vec<f32>> = ps
            .iter()
            .map(|p| p.b.iter().map(|&b| p.scaling * b).collect())
            .collect();
        let b_exp = exponent(scaled.iter().flatten(), weight_bits);
        let to_f32 = |v: Vec<i64>| v.into_iter().map(|x| x as f32).collect();
        let projections: Vec<ProjectionAdapter> = ps
            .iter()
            .zip(&scaled)
            .map(|(p, sb)| ProjectionAdapter {
                a: to_f32(round_at(&p.a, a_exp)),
                b: to_f32(round_at(sb, b_exp)),
                scaling: 1.0,
                ..p.clone()
            })
            .collect();
        let input_bits = [Mode::Standard, Mode::Ffa]
            .map(|mode| input_bits_for(row_l1(&projections, adapter.d_in, mode)));
        let [standard, ffa] = input_bits;
        Ok(RingGroup {
            adapter: GroupAdapter {
                projections,
                ..adapter.clone()
            },
            a_exp,
            b_exp,
            shift: RING_BITS.saturating_sub(params.response_bits),
            input_bits: [standard?, ffa?],
        })
    }

    /// The client's public parameters for `mode`.
    pub fn public(&self, mode: Mode) -> RingPublic {
        let (input_bits, weights) = match mode {
            Mode::Standard => (self.input_bits[0], self.a_exp + self.b_exp),
            Mode::Ffa => (self.input_bits[1], self.b_exp),
        };
        RingPublic {
            input_bits,
            scale_log2: weights + input_bits as i32,
            shift: self.shift,
        }
    }

    /// Low bits dropped from each response value (public).
    pub fn shift(&self) -> u32 {
        self.shift
    }

    /// The server's online answer for projection `proj`: the top bits of `M̂_p·masked +
    /// server_mask mod p` (`masked`: one position's masked input row, as [`Self::product`] takes
    /// it). Errors: [`HeloraError::ShapeMismatch`].
    pub fn respond(
        &self,
        proj: usize,
        masked: &[u64],
        server_mask: &[u64],
        mode: Mode,
    ) -> Result<Vec<u32>> {
        let y = self.product(proj, masked, mode)?;
        check_len("server mask (d_out)", y.len(), server_mask.len())?;
        Ok(top_bits(&y, server_mask, self.shift))
    }

    /// The client side of `plan` for this group (FFA with the group's lora_A rows, whose
    /// values the mask layout does not use). Errors: as [`GroupClient::ffa`] and
    /// [`GroupClient::standard`].
    pub fn group_client(&self, plan: &GroupPlan) -> Result<GroupClient> {
        match plan.mode {
            Mode::Ffa => {
                let a: Vec<Vec<f32>> = self
                    .adapter
                    .projections
                    .iter()
                    .map(|p| p.a.clone())
                    .collect();
                GroupClient::ffa(plan, &a)
            }
            Mode::Standard => GroupClient::standard(plan),
        }
    }

    /// The integer-valued adapter (`Â`, `B̂`, scaling 1).
    pub fn adapter(&self) -> &GroupAdapter {
        &self.adapter
    }

    /// `(ea, eb)`: `Â = round(lora_A·2^ea)`, `B̂ = round(s·lora_B·2^eb)`.
    pub fn exponents(&self) -> (i32, i32) {
        (self.a_exp, self.b_exp)
    }

    /// `M̂_p·v mod p` for projection `proj` and one position's input row `v`: `B̂_p·(Â_p·v)` for
    /// the d_in values of x (standard), or `B̂_p` on projection p's rows of the R values of
    /// `U = A·x` (FFA, whose lora_A the client applies). Errors: [`HeloraError::ShapeMismatch`]
    /// for another length or projection.
    pub fn product(&self, proj: usize, v: &[u64], mode: Mode) -> Result<Vec<u64>> {
        let ps = &self.adapter.projections;
        let p = ps.get(proj).ok_or(HeloraError::ShapeMismatch {
            what: "projection index",
            expected: ps.len(),
            got: proj,
        })?;
        let ints = |w: &[f32]| w.iter().map(|&x| x as i64).collect::<Vec<i64>>();
        let u = match mode {
            Mode::Ffa => {
                let total: usize = ps.iter().map(|p| p.rank).sum();
                check_len("ring input (R)", total, v.len())?;
                let start: usize = ps[..proj].iter().map(|p| p.rank).sum();
                v[start..start + p.rank].to_vec()
            }
            Mode::Standard => {
                check_len("ring input (d_in)", self.adapter.d_in, v.len())?;
                ints(&p.a)
                    .chunks_exact(self.adapter.d_in)
                    .map(|row| dot_mod(row, v))
                    .collect()
            }
        };
        Ok(ints(&p.b)
            .chunks_exact(p.rank)
            .map(|row| dot_mod(row, &u))
            .collect())
    }
}

/// A position's input in fixed point: `x̂ = round(x · 2^(input_bits − exponent)) mod p`, where
/// `2^exponent ≥ max |x|` is the client's power-of-two normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingInput {
    /// `x̂ mod p`.
    pub values: Vec<u64>,
    /// The normalisation exponent (0 for an all-zero input).
    pub exponent: i32,
}

impl RingInput {
    /// Encodes one position's input with `input_bits` fractional bits
    /// ([`RingProjection::input_bits`]).
    pub fn encode(x: &[f32], input_bits: u32) -> Self {
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let exponent = if max > 0.0 {
            max.log2().ceil() as i32
        } else {
            0
        };
        let unit = 2f64.powi(input_bits as i32 - exponent);
        let values = x
            .iter()
            .map(|&v| reduce(i128::from((f64::from(v) * unit).round() as i64)))
            .collect();
        RingInput { values, exponent }
    }

    /// `x̂ − r mod p`: what the client sends. Errors: [`HeloraError::ShapeMismatch`].
    pub fn masked(&self, mask: &[u64]) -> Result<Vec<u64>> {
        check_len("client mask (d_in)", self.values.len(), mask.len())?;
        Ok(self
            .values
            .iter()
            .zip(mask)
            .map(|(&x, &r)| reduce(i128::from(x) - i128::from(r)))
            .collect())
    }
}

/// `n` uniform elements of `Z_p` (rejection sampling on 60-bit draws): a one-time mask.
pub fn sample_mask<R: Rng + ?Sized>(rng: &mut R, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            loop {
                let v = rng.next_u64() >> (u64::BITS - RING_BITS);
                if v < RING_PRIME {
                    break v;
                }
            }
        })
        .collect()
}

/// `v − m mod p` per element: the offline value `M̂·r − m` from `M̂·r` and the server's mask.
/// Errors: [`HeloraError::ShapeMismatch`].
pub fn minus(v: &[u64], m: &[u64]) -> Result<Vec<u64>> {
    check_len("server mask (d_out)", v.len(), m.len())?;
    Ok(v.iter()
        .zip(m)
        .map(|(&v, &m)| reduce(i128::from(v) - i128::from(m)))
        .collect())
}

/// What the client keeps of `c = M̂·r − m`: its top bits, as the server returns its own.
pub fn kept_bits(c: &[u64], shift: u32) -> Vec<u32> {
    c.iter().map(|&v| (v >> shift) as u32).collect()
}

/// `M̂·x̂` to within `2^(shift + 1)` from the server's response and the client's kept bits: the
/// centred residue of their sum. Errors: [`HeloraError::ShapeMismatch`].
pub fn unmask(response: &[u32], kept: &[u32], shift: u32) -> Result<Vec<i64>> {
    check_len("kept bits (d_out)", response.len(), kept.len())?;
    let p = i128::from(RING_PRIME);
    Ok(response
        .iter()
        .zip(kept)
        .map(|(&y, &c)| {
            let v = i128::from(reduce((i128::from(y) + i128::from(c)) << shift));
            (if v > p / 2 { v - p } else { v }) as i64
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipherlora_ckks::modular::is_prime;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn the_ring_modulus_is_a_60_bit_prime_for_batching_up_to_degree_16384() {
        assert!(is_prime(RING_PRIME));
        assert_eq!(64 - RING_PRIME.leading_zeros(), RING_BITS);
        assert_eq!(RING_PRIME % (1 << 16), 1);
        assert!(!is_prime(RING_PRIME + 2), "the test can tell a composite");
    }

    /// A random projection (weights of LoRA-like magnitude) and input.
    fn case(seed: u64, r: usize, d_in: usize, d_out: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut draw = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| ((rng.next_u32() as f32 / u32::MAX as f32) * 2.0 - 1.0) * scale)
                .collect()
        };
        (draw(r * d_in, 0.05), draw(d_out * r, 0.02), draw(d_in, 3.0))
    }

    /// The whole online exchange with the offline values computed in the clear.
    fn exchange(p: &RingProjection, x: &RingInput, seed: u64) -> Vec<i64> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let r = sample_mask(&mut rng, p.d_in());
        let m = sample_mask(&mut rng, p.d_out());
        let c = minus(&p.product(&r).unwrap(), &m).unwrap();
        let response = p.respond(&x.masked(&r).unwrap(), &m).unwrap();
        unmask(&response, &kept_bits(&c, p.shift()), p.shift()).unwrap()
    }

    /// `M̂·x̂` over the integers (no reduction).
    fn exact(p: &RingProjection, x: &RingInput) -> Vec<i128> {
        let half = RING_PRIME / 2;
        let xs: Vec<i128> = x
            .values
            .iter()
            .map(|&v| {
                if v > half {
                    i128::from(v) - i128::from(RING_PRIME)
                } else {
                    i128::from(v)
                }
            })
            .collect();
        let u: Vec<i128> =
            p.a.chunks_exact(p.d_in)
                .map(|row| row.iter().zip(&xs).map(|(&a, &x)| i128::from(a) * x).sum())
                .collect();
        p.b.chunks_exact(p.r)
            .map(|row| row.iter().zip(&u).map(|(&b, &u)| i128::from(b) * u).sum())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The masks cancel: the client recovers the exact integer product to within the
        /// dropped bits, for any shape, weights, input and masks, and the product stays below
        /// the published bound.
        #[test]
        fn masks_cancel_to_within_the_dropped_bits(
            seed in any::<u64>(), r in 1usize..9, d_in in 1usize..97, d_out in 1usize..65,
        ) {
            let (a, b, x) = case(seed, r, d_in, d_out);
            let p = RingProjection::new(&a, &b, (r, d_in, d_out), RingParams::default()).unwrap();
            let x = RingInput::encode(&x, p.input_bits());
            let got = exchange(&p, &x, seed ^ 0x5eed);
            for (g, w) in got.iter().zip(exact(&p, &x)) {
                let err = i128::from(*g) - w;
                prop_assert!((0..=1i128 << (p.shift() + 1)).contains(&-err), "error {err}");
                prop_assert!(w.unsigned_abs() < 1u128 << p.bound_log2());
            }
        }

        /// Decoded deltas match `s·B·A·x` in floating point to the fixed point's precision.
        #[test]
        fn decoded_deltas_match_the_plaintext_lora(
            seed in any::<u64>(), r in 1usize..9, d_in in 8usize..97, d_out in 1usize..65,
        ) {
            let (a, b, x) = case(seed, r, d_in, d_out);
            let p = RingProjection::new(&a, &b, (r, d_in, d_out), RingParams::default()).unwrap();
            let enc = RingInput::encode(&x, p.input_bits());
            let got = p.decode(&exchange(&p, &enc, seed.rotate_left(7)), enc.exponent);
            let u: Vec<f64> = a
                .chunks_exact(d_in)
                .map(|row| row.iter().zip(&x).map(|(&a, &x)| f64::from(a) * f64::from(x)).sum())
                .collect();
            // Every rounding error is below 2^-16 of max|B|·r·max|A|·d_in·max|x|, a bound on
            // every delta.
            let max = |w: &[f32]| w.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
            let scale = max(&b) * r as f64 * max(&a) * d_in as f64 * max(&x);
            for (i, g) in got.iter().enumerate() {
                let want: f64 = (0..r).map(|j| f64::from(b[i * r + j]) * u[j]).sum();
                let err = (f64::from(*g) - want).abs();
                prop_assert!(err <= 2f64.powi(-13) * scale, "row {i}: {err} vs {scale}");
            }
        }
    }

    /// A kept value from another mask leaves noise of the ring's size: the test above can fail.
    #[test]
    fn a_kept_value_of_another_mask_does_not_cancel() {
        let (a, b, x) = case(3, 4, 32, 16);
        let p = RingProjection::new(&a, &b, (4, 32, 16), RingParams::default()).unwrap();
        let x = RingInput::encode(&x, p.input_bits());
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let (r, m) = (sample_mask(&mut rng, 32), sample_mask(&mut rng, 16));
        let other = sample_mask(&mut rng, 32);
        let c = minus(&p.product(&other).unwrap(), &m).unwrap();
        let response = p.respond(&x.masked(&r).unwrap(), &m).unwrap();
        let got = unmask(&response, &kept_bits(&c, p.shift()), p.shift()).unwrap();
        let far = got
            .iter()
            .zip(exact(&p, &x))
            .filter(|(g, w)| (i128::from(**g) - w).unsigned_abs() > 1 << (p.shift() + 12))
            .count();
        assert!(far >= 15, "{far} of 16 far off");
    }

    /// The input bits fill the field: the product's bound sits just below `p/4`.
    #[test]
    fn the_input_bits_fill_the_field() {
        let (a, b, _) = case(5, 16, 576, 64);
        let p = RingProjection::new(&a, &b, (16, 576, 64), RingParams::default()).unwrap();
        assert_eq!(p.bound_log2(), RING_BITS - 2);
        assert!((1..=MAX_INPUT_BITS).contains(&p.input_bits()));
    }

    #[test]
    fn shapes_and_bounds_are_checked() {
        let params = RingParams::default();
        assert!(matches!(
            RingProjection::new(&[0.1; 5], &[0.1; 4], (2, 3, 2), params),
            Err(HeloraError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            RingProjection::new(&[], &[], (0, 3, 2), params),
            Err(HeloraError::InvalidShape { .. })
        ));
        let wide = RingParams {
            weight_bits: 31,
            response_bits: 32,
        };
        assert!(matches!(
            RingProjection::new(&[0.1; 6], &[0.1; 4], (2, 3, 2), wide),
            Err(HeloraError::RingBound { .. })
        ));
        for response_bits in [0, 33] {
            let bad = RingParams {
                response_bits,
                ..params
            };
            assert!(matches!(
                RingProjection::new(&[0.1; 6], &[0.1; 4], (2, 3, 2), bad),
                Err(HeloraError::InvalidShape { .. })
            ));
        }
        let p = RingProjection::new(&[0.1; 6], &[0.1; 4], (2, 3, 2), params).unwrap();
        assert_eq!(p.public().response_bits(), params.response_bits);
        assert!(matches!(
            p.respond(&[0; 2], &[0; 2]),
            Err(HeloraError::ShapeMismatch { .. })
        ));
        assert!(matches!(
            unmask(&[0; 2], &[0; 3], p.shift()),
            Err(HeloraError::ShapeMismatch { .. })
        ));
    }
}
