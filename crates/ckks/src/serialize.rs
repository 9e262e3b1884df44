//! Versioned, validated byte formats for ciphertexts, keys and compressed forms: a 16-byte header
//! (magic `CKLR`, [`FORMAT_VERSION`], kind, log2 N, level, parameter digest), then a bit-packed
//! body. Reading never panics. Layout: docs/design/code-notes.md, "ckks: serialize".

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ciphertext::{Ciphertext, SeededCiphertext};
use crate::compress::{CompressedCiphertext, CompressionParams};
use crate::context::Context;
use crate::error::{CkksError, Result};
use crate::keys::{GaloisKey, GaloisKeys, PublicKey};
use crate::rounded::{self, RoundedSeededCiphertext};

const MAGIC: &[u8; 4] = b"CKLR";
/// Current format version: 2 (seeds expanded with ChaCha8; version 1, ChaCha20, is refused).
pub const FORMAT_VERSION: u8 = 2;
const HEADER: usize = 16;

/// Object kinds in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Ciphertext = 1,
    Seeded = 2,
    PublicKey = 3,
    GaloisKeys = 4,
    Compressed = 5,
    RoundedSeeded = 6,
}

/// The kind of a serialized object, read from its header by [`peek_kind`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// [`Ciphertext`] (kind byte 1).
    Ciphertext,
    /// [`SeededCiphertext`] (2).
    SeededCiphertext,
    /// [`PublicKey`] (3).
    PublicKey,
    /// [`GaloisKeys`] (4).
    GaloisKeys,
    /// [`CompressedCiphertext`] (5).
    CompressedCiphertext,
    /// [`RoundedSeededCiphertext`] (6).
    RoundedSeededCiphertext,
}

/// The object kind `bytes` claim, from the header only. Errors: [`CkksError::Truncated`],
/// `BadMagic`, `UnsupportedVersion`, `Malformed`.
pub fn peek_kind(bytes: &[u8]) -> Result<ObjectKind> {
    Ok(match kind_byte(bytes)? {
        1 => ObjectKind::Ciphertext,
        2 => ObjectKind::SeededCiphertext,
        3 => ObjectKind::PublicKey,
        4 => ObjectKind::GaloisKeys,
        5 => ObjectKind::CompressedCiphertext,
        6 => ObjectKind::RoundedSeededCiphertext,
        _ => {
            return Err(CkksError::Malformed {
                what: "object kind",
            });
        }
    })
}

fn limb_bits(ctx: &Context, prime: usize) -> usize {
    (64 - ctx.prime(prime).leading_zeros()) as usize
}

fn poly_bytes(ctx: &Context, primes: impl Iterator<Item = usize>) -> usize {
    primes.map(|i| ctx.degree() * limb_bits(ctx, i) / 8).sum()
}

fn header(ctx: &Context, kind: Kind, level: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.push(kind as u8);
    out.push(ctx.log_degree() as u8);
    out.push(level as u8);
    out.extend_from_slice(&ctx.params().digest().to_le_bytes());
}

/// Bit-packs one polynomial (limbs over `primes`) at `bits(q)` bits per value.
fn pack(ctx: &Context, data: &[u64], primes: impl Iterator<Item = usize>, out: &mut Vec<u8>) {
    let n = ctx.degree();
    for (limb, i) in data.chunks_exact(n).zip(primes) {
        pack_limb(limb, limb_bits(ctx, i), out);
    }
}

/// Bit-packs one limb of values `< 2^bits` (`bits ≤ 62`, `limb.len()·bits` a multiple of 8).
fn pack_limb(limb: &[u64], bits: usize, out: &mut Vec<u8>) {
    out.reserve(limb.len() * bits / 8);
    let mut acc: u128 = 0;
    let mut fill = 0usize;
    for &x in limb {
        // fill < 64 and bits ≤ 62: the u128 never overflows.
        acc |= (x as u128) << fill;
        fill += bits;
        if fill >= 64 {
            out.extend_from_slice(&(acc as u64).to_le_bytes());
            acc >>= 64;
            fill -= 64;
        }
    }
    while fill >= 8 {
        out.push(acc as u8);
        acc >>= 8;
        fill -= 8;
    }
    debug_assert_eq!(fill, 0);
}

/// Unpacks `out.len()` values of `bits` bits from `raw`; `Err(k)` for the first `≥ q`.
fn unpack_limb(raw: &[u8], bits: usize, q: u64, out: &mut [u64]) -> std::result::Result<(), usize> {
    let mut padded = Vec::with_capacity(raw.len() + 16);
    padded.extend_from_slice(raw);
    padded.resize(raw.len() + 16, 0);
    let mask = (1u128 << bits) - 1;
    let mut bad = false;
    for (k, o) in out.iter_mut().enumerate() {
        let off = k * bits;
        let (byte, shift) = (off / 8, off % 8);
        let mut w = [0u8; 16];
        w.copy_from_slice(&padded[byte..byte + 16]);
        let v = ((u128::from_le_bytes(w) >> shift) & mask) as u64;
        bad |= v >= q;
        *o = v;
    }
    if bad {
        return Err(out.iter().position(|&v| v >= q).unwrap_or(0));
    }
    Ok(())
}

/// A bounds-checked reader over the input.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, k: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(k)
            .ok_or(CkksError::Malformed { what: "length" })?;
        let s = self.bytes.get(self.pos..end).ok_or(CkksError::Truncated {
            expected: end,
            got: self.bytes.len(),
        })?;
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn seed(&mut self) -> Result<[u8; 32]> {
        let mut s = [0u8; 32];
        s.copy_from_slice(self.take(32)?);
        Ok(s)
    }
    fn scale(&mut self) -> Result<f64> {
        let s = f64::from_bits(self.u64()?);
        if s.is_finite() && s > 0.0 {
            Ok(s)
        } else {
            Err(CkksError::InvalidScale { scale: s })
        }
    }
    /// Unpacks and validates one polynomial over `primes`.
    fn poly(
        &mut self,
        ctx: &Context,
        primes: impl Iterator<Item = usize> + Clone,
    ) -> Result<Vec<u64>> {
        let n = ctx.degree();
        let limbs = primes.clone().count();
        let mut out = vec![0u64; limbs * n];
        for (limb, i) in out.chunks_exact_mut(n).zip(primes) {
            let bits = limb_bits(ctx, i);
            let q = ctx.prime(i);
            let raw = self.take(n * bits / 8)?;
            unpack_limb(raw, bits, q, limb)
                .map_err(|index| CkksError::CoefficientOutOfRange { limb: i, index })?;
        }
        Ok(out)
    }
}

/// Checks the header's length, magic and version; returns its kind byte.
fn kind_byte(bytes: &[u8]) -> Result<u8> {
    if bytes.len() < HEADER {
        return Err(CkksError::Truncated {
            expected: HEADER,
            got: bytes.len(),
        });
    }
    if &bytes[..4] != MAGIC {
        return Err(CkksError::BadMagic);
    }
    if bytes[4] != FORMAT_VERSION {
        return Err(CkksError::UnsupportedVersion { version: bytes[4] });
    }
    Ok(bytes[5])
}

/// Parses and checks the header; returns the level and a reader on the body.
fn open<'a>(ctx: &Context, bytes: &'a [u8], kind: Kind) -> Result<(usize, Reader<'a>)> {
    let found = kind_byte(bytes)?;
    if found != kind as u8 {
        return Err(CkksError::WrongKind {
            expected: kind as u8,
            found,
        });
    }
    if bytes[6] as u32 != ctx.log_degree() {
        return Err(CkksError::ParameterMismatch {
            what: "ring degree",
        });
    }
    let level = bytes[7] as usize;
    if level > ctx.max_level() {
        return Err(CkksError::LevelOutOfRange {
            level,
            max: ctx.max_level(),
        });
    }
    let mut d = [0u8; 8];
    d.copy_from_slice(&bytes[8..16]);
    if u64::from_le_bytes(d) != ctx.params().digest() {
        return Err(CkksError::ParameterMismatch { what: "moduli" });
    }
    Ok((level, Reader { bytes, pos: HEADER }))
}

fn exact_len(bytes: &[u8], expected: usize) -> Result<()> {
    match bytes.len().cmp(&expected) {
        std::cmp::Ordering::Less => Err(CkksError::Truncated {
            expected,
            got: bytes.len(),
        }),
        std::cmp::Ordering::Greater => Err(CkksError::TrailingBytes {
            expected,
            got: bytes.len(),
        }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// Canonical copy of an N-scaled polynomial over `primes`.
fn unscaled(ctx: &Context, data: &[u64], primes: impl Iterator<Item = usize>) -> Vec<u64> {
    let n = ctx.degree();
    let mut v = data.to_vec();
    for (limb, i) in v.chunks_exact_mut(n).zip(primes) {
        ctx.normalize(i, limb);
    }
    v
}

impl Ciphertext {
    /// Serializes (header, scale, both polynomials bit-packed).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let mut out = Vec::with_capacity(HEADER + 8 + 2 * poly_bytes(ctx, 0..=self.level));
        header(ctx, Kind::Ciphertext, self.level, &mut out);
        out.extend_from_slice(&self.scale.to_bits().to_le_bytes());
        pack(ctx, &self.c0, 0..=self.level, &mut out);
        pack(ctx, &self.c1, 0..=self.level, &mut out);
        out
    }

    /// Parses and validates [`Self::to_bytes`] output. Errors: [`CkksError`]; never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::Ciphertext)?;
        exact_len(bytes, HEADER + 8 + 2 * poly_bytes(ctx, 0..=level))?;
        let scale = r.scale()?;
        let c0 = r.poly(ctx, 0..=level)?;
        let c1 = r.poly(ctx, 0..=level)?;
        Ok(Self {
            ctx: ctx.clone(),
            c0,
            c1,
            level,
            scale,
        })
    }
}

/// Header, scale and `(b, k, d, 0)` of a compressed ciphertext.
const COMPRESSED_FIXED: usize = HEADER + 8 + 4;

impl CompressedCiphertext {
    /// Serializes: `28 + N·(2b − d)/8` bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let p = self.params;
        let mut out = Vec::with_capacity(COMPRESSED_FIXED + p.poly_bytes(ctx.degree()));
        header(ctx, Kind::Compressed, 0, &mut out);
        out.extend_from_slice(&self.scale.to_bits().to_le_bytes());
        out.extend_from_slice(&[p.bits as u8, p.headroom as u8, p.dropped as u8, 0]);
        pack_limb(&self.c0, (p.bits - p.dropped) as usize, &mut out);
        pack_limb(&self.c1, p.bits as usize, &mut out);
        out
    }

    /// Parses and validates [`Self::to_bytes`] output. Errors: [`CkksError`] (`InvalidCompression`
    /// for bad `(b, k, d)`); never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::Compressed)?;
        if level != 0 {
            return Err(CkksError::Malformed {
                what: "compressed ciphertext level",
            });
        }
        let scale = r.scale()?;
        let raw = r.take(4)?;
        if raw[3] != 0 {
            return Err(CkksError::Malformed {
                what: "compressed ciphertext reserved byte",
            });
        }
        let params = CompressionParams {
            bits: u32::from(raw[0]),
            headroom: u32::from(raw[1]),
            dropped: u32::from(raw[2]),
        };
        params.validate(ctx.prime(0))?;
        let n = ctx.degree();
        exact_len(bytes, COMPRESSED_FIXED + params.poly_bytes(n))?;
        let mut read = |bits: u32| -> Result<Vec<u64>> {
            let bits = bits as usize;
            let mut out = vec![0u64; n];
            let raw = r.take(n * bits / 8)?;
            // Every value of `bits` bits is below 2^bits: cannot fail.
            unpack_limb(raw, bits, 1u64 << bits, &mut out)
                .map_err(|index| CkksError::CoefficientOutOfRange { limb: 0, index })?;
            Ok(out)
        };
        let c0 = read(params.bits - params.dropped)?;
        let c1 = read(params.bits)?;
        Ok(Self {
            ctx: ctx.clone(),
            c0,
            c1,
            params,
            scale,
        })
    }
}

impl SeededCiphertext {
    /// Serializes (header, scale, seed, `c0` bit-packed): half a ciphertext.
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let mut out = Vec::with_capacity(HEADER + 40 + poly_bytes(ctx, 0..=self.level));
        header(ctx, Kind::Seeded, self.level, &mut out);
        out.extend_from_slice(&self.scale.to_bits().to_le_bytes());
        out.extend_from_slice(&self.seed);
        pack(ctx, &self.c0, 0..=self.level, &mut out);
        out
    }

    /// Parses a seeded or rounded upload. Errors: [`CkksError`] (`WrongKind` for other kinds).
    pub fn from_upload_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        if kind_byte(bytes)? == Kind::RoundedSeeded as u8 {
            Ok(RoundedSeededCiphertext::from_bytes(ctx, bytes)?.to_seeded())
        } else {
            Self::from_bytes(ctx, bytes)
        }
    }

    /// Parses and validates [`Self::to_bytes`] output. Errors: [`CkksError`]; never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::Seeded)?;
        exact_len(bytes, HEADER + 40 + poly_bytes(ctx, 0..=level))?;
        let scale = r.scale()?;
        let seed = r.seed()?;
        let c0 = r.poly(ctx, 0..=level)?;
        Ok(Self {
            ctx: ctx.clone(),
            c0,
            seed,
            level,
            scale,
        })
    }
}

/// Header, scale, seed and `(d, 0, 0, 0)` of a rounded seeded ciphertext.
const ROUNDED_FIXED: usize = HEADER + 8 + 32 + 4;

fn rounded_len(ctx: &Context, level: usize, dropped: u32) -> usize {
    ROUNDED_FIXED
        + ctx.degree() * rounded::high_bits(ctx, dropped) as usize / 8
        + poly_bytes(ctx, 1..=level)
}

impl RoundedSeededCiphertext {
    /// Serializes: `N·d/8 − 4` bytes fewer than the seeded form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let mut out = Vec::with_capacity(rounded_len(ctx, self.level, self.dropped));
        header(ctx, Kind::RoundedSeeded, self.level, &mut out);
        out.extend_from_slice(&self.scale.to_bits().to_le_bytes());
        out.extend_from_slice(&self.seed);
        out.extend_from_slice(&[self.dropped as u8, 0, 0, 0]);
        pack_limb(
            &self.high,
            rounded::high_bits(ctx, self.dropped) as usize,
            &mut out,
        );
        pack(ctx, &self.rest, 1..=self.level, &mut out);
        out
    }

    /// Parses and validates [`Self::to_bytes`] output. Errors: [`CkksError`] (`InvalidCompression`
    /// for a bad `d`); never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::RoundedSeeded)?;
        let scale = r.scale()?;
        let seed = r.seed()?;
        let raw = r.take(4)?;
        if raw[1..] != [0, 0, 0] {
            return Err(CkksError::Malformed {
                what: "rounded ciphertext reserved bytes",
            });
        }
        let dropped = u32::from(raw[0]);
        rounded::check_dropped(ctx, dropped)?;
        exact_len(bytes, rounded_len(ctx, level, dropped))?;
        let n = ctx.degree();
        let mut high = vec![0u64; n];
        let bits = rounded::high_bits(ctx, dropped) as usize;
        unpack_limb(
            r.take(n * bits / 8)?,
            bits,
            rounded::high_limit(ctx, dropped),
            &mut high,
        )
        .map_err(|index| CkksError::CoefficientOutOfRange { limb: 0, index })?;
        let rest = r.poly(ctx, 1..=level)?;
        Ok(Self {
            ctx: ctx.clone(),
            high,
            rest,
            seed,
            level,
            scale,
            dropped,
        })
    }
}

impl PublicKey {
    /// Serializes (header, seed, `b` bit-packed).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let l = ctx.max_level();
        let mut out = Vec::with_capacity(HEADER + 32 + poly_bytes(ctx, 0..=l));
        header(ctx, Kind::PublicKey, l, &mut out);
        out.extend_from_slice(&self.seed);
        pack(ctx, &unscaled(ctx, &self.b_scaled, 0..=l), 0..=l, &mut out);
        out
    }

    /// Parses and validates [`Self::to_bytes`] output. Errors: [`CkksError`]; never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::PublicKey)?;
        if level != ctx.max_level() {
            return Err(CkksError::Malformed {
                what: "public key level",
            });
        }
        exact_len(bytes, HEADER + 32 + poly_bytes(ctx, 0..=level))?;
        let seed = r.seed()?;
        let b = r.poly(ctx, 0..=level)?;
        Ok(Self::from_parts(ctx, seed, b))
    }
}

impl GaloisKeys {
    fn key_bytes(ctx: &Context) -> usize {
        let l = ctx.max_level();
        8 + 32 + (l + 1) * poly_bytes(ctx, ctx.qp_primes(l))
    }

    /// Serialized size of one Galois key (without the 20-byte set header).
    pub fn serialized_key_size(ctx: &Context) -> usize {
        Self::key_bytes(ctx)
    }

    /// Serializes every key (seeded: only the `b_i` and one seed per key).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ctx = &self.ctx;
        let l = ctx.max_level();
        let mut out = Vec::with_capacity(HEADER + 4 + self.keys.len() * Self::key_bytes(ctx));
        header(ctx, Kind::GaloisKeys, l, &mut out);
        out.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        for (g, k) in &self.keys {
            out.extend_from_slice(&g.to_le_bytes());
            out.extend_from_slice(&k.seed);
            for b in &k.b_scaled {
                pack(
                    ctx,
                    &unscaled(ctx, b, ctx.qp_primes(l)),
                    ctx.qp_primes(l),
                    &mut out,
                );
            }
        }
        out
    }

    /// Parses [`Self::to_bytes`] output, re-expanding seeds. Errors: [`CkksError`]; never panics.
    pub fn from_bytes(ctx: &Arc<Context>, bytes: &[u8]) -> Result<Self> {
        let (level, mut r) = open(ctx, bytes, Kind::GaloisKeys)?;
        if level != ctx.max_level() {
            return Err(CkksError::Malformed {
                what: "Galois key level",
            });
        }
        let count = r.u32()? as usize;
        let expected = count
            .checked_mul(Self::key_bytes(ctx))
            .and_then(|b| b.checked_add(HEADER + 4))
            .ok_or(CkksError::Malformed { what: "key count" })?;
        exact_len(bytes, expected)?;
        let two_n = 2 * ctx.degree() as u64;
        let mut keys = BTreeMap::new();
        for _ in 0..count {
            let g = r.u64()?;
            if g % 2 == 0 || g <= 1 || g >= two_n {
                return Err(CkksError::Malformed {
                    what: "Galois element",
                });
            }
            if keys.contains_key(&g) {
                return Err(CkksError::Malformed {
                    what: "duplicate Galois element",
                });
            }
            let seed = r.seed()?;
            let b = (0..=level)
                .map(|_| r.poly(ctx, ctx.qp_primes(level)))
                .collect::<Result<Vec<_>>>()?;
            keys.insert(g, GaloisKey::from_parts(ctx, g, seed, b));
        }
        Ok(Self {
            ctx: ctx.clone(),
            keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{CkksParameters, Preset};

    /// The bit stream one bit at a time, least significant first.
    fn naive_pack(values: &[u64], bits: usize) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * bits / 8];
        for (k, &v) in values.iter().enumerate() {
            for b in 0..bits {
                let pos = k * bits + b;
                out[pos / 8] |= (((v >> b) & 1) as u8) << (pos % 8);
            }
        }
        out
    }

    #[test]
    fn word_wise_packing_matches_the_bit_stream_definition() {
        for preset in [Preset::N8192Depth2Fast, Preset::N8192Depth2] {
            let ctx = Context::new(CkksParameters::preset(preset).unwrap()).unwrap();
            let n = ctx.degree();
            for i in ctx.qp_primes(ctx.max_level()) {
                let q = ctx.prime(i);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ q;
                let values: Vec<u64> = (0..n)
                    .map(|k| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Include the extremes 0 and q − 1.
                        match k {
                            0 => 0,
                            1 => q - 1,
                            _ => x % q,
                        }
                    })
                    .collect();
                let bits = limb_bits(&ctx, i);
                let mut packed = Vec::new();
                pack(&ctx, &values, std::iter::once(i), &mut packed);
                let reference = naive_pack(&values, bits);
                assert_eq!(packed, reference, "prime {i}");
                let mut back = vec![0u64; n];
                unpack_limb(&reference, bits, q, &mut back).unwrap();
                assert_eq!(back, values);
                // A value ≥ q is reported at its index.
                let mut bad = values.clone();
                bad[77] = q;
                let mut sink = vec![0u64; n];
                assert_eq!(
                    unpack_limb(&naive_pack(&bad, bits), bits, q, &mut sink),
                    Err(77)
                );
            }
        }
    }
}
