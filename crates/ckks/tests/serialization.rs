//! Byte formats: round trips, sizes, and malformed input (random, truncated, bit-flipped, wrong
//! parameters) giving typed errors, never panics.

mod common;

use cipherlora_ckks::*;
use common::*;
use proptest::prelude::*;

struct Objects {
    f: Fixture,
    ct: Vec<u8>,
    seeded: Vec<u8>,
    pk: Vec<u8>,
    gk: Vec<u8>,
    /// A compressed level-0 ciphertext.
    cc: Vec<u8>,
    /// A seeded ciphertext with 16 low bits of `c0` dropped.
    rs: Vec<u8>,
}

fn objects() -> Objects {
    let mut f = fixture(Preset::N8192Depth2Fast, 5);
    let v = values(f.ctx.slots(), 5, 1.0);
    let pt = f
        .enc
        .encode(&v, f.ctx.max_level(), f.ctx.params().scale())
        .unwrap();
    let seeded = Encryptor::new(&f.ctx)
        .encrypt_sk(&pt, &f.sk, &mut f.rng)
        .unwrap();
    let ct = f.ev.rescale(&seeded.expand()).unwrap();
    let pk = PublicKey::generate(&f.sk, &mut f.rng);
    let gk = GaloisKeys::generate(&f.sk, &[1], &mut f.rng);
    // Two rescales without products: declare the scale Δ again (the content does not matter here).
    let mut ct0 = f.ev.rescale(&ct).unwrap();
    ct0.set_scale(f.ctx.params().scale());
    let p = CompressionParams::choose(
        f.ctx.degree(),
        f.ctx.params().moduli()[0],
        ct0.scale(),
        1.0,
        20,
    )
    .unwrap();
    Objects {
        cc: ct0.compress(&p).unwrap().to_bytes(),
        rs: seeded.round_low_bits(16).unwrap().to_bytes(),
        ct: ct.to_bytes(),
        seeded: seeded.to_bytes(),
        pk: pk.to_bytes(),
        gk: gk.to_bytes(),
        f,
    }
}

fn parse_all(f: &Fixture, b: &[u8]) -> [bool; 6] {
    [
        Ciphertext::from_bytes(&f.ctx, b).is_ok(),
        SeededCiphertext::from_bytes(&f.ctx, b).is_ok(),
        PublicKey::from_bytes(&f.ctx, b).is_ok(),
        GaloisKeys::from_bytes(&f.ctx, b).is_ok(),
        CompressedCiphertext::from_bytes(&f.ctx, b).is_ok(),
        RoundedSeededCiphertext::from_bytes(&f.ctx, b).is_ok(),
    ]
}

#[test]
fn round_trips_preserve_objects_and_function() {
    let mut f = fixture(Preset::N8192Depth2, 6);
    let v = values(f.ctx.slots(), 6, 3.0);
    let scale = f.ctx.params().scale();
    let pt = f.enc.encode(&v, f.ctx.max_level(), scale).unwrap();
    let dec = Decryptor::new(&f.sk);
    let seeded = Encryptor::new(&f.ctx)
        .encrypt_sk(&pt, &f.sk, &mut f.rng)
        .unwrap();
    let s2 = SeededCiphertext::from_bytes(&f.ctx, &seeded.to_bytes()).unwrap();
    assert_eq!(s2, seeded);
    let ct = s2.expand();
    let c2 = Ciphertext::from_bytes(&f.ctx, &ct.to_bytes()).unwrap();
    assert_eq!(c2, ct);
    // Seeded is half the size of the full ciphertext (plus a seed).
    assert_eq!(seeded.to_bytes().len(), (ct.to_bytes().len() - 24) / 2 + 56);
    let pk = PublicKey::generate(&f.sk, &mut f.rng);
    let pk2 = PublicKey::from_bytes(&f.ctx, &pk.to_bytes()).unwrap();
    assert_eq!(pk2.to_bytes(), pk.to_bytes());
    let ct_pk = Encryptor::new(&f.ctx)
        .encrypt_pk(&pt, &pk2, &mut f.rng)
        .unwrap();
    assert!(precision_bits(&f.enc.decode(&dec.decrypt(&ct_pk).unwrap()), &v) > 20.0);
    let gk = GaloisKeys::generate(&f.sk, &[3, -1], &mut f.rng);
    let gk2 = GaloisKeys::from_bytes(&f.ctx, &gk.to_bytes()).unwrap();
    assert_eq!(gk2.to_bytes(), gk.to_bytes());
    assert_eq!(gk2.galois_elements(), gk.galois_elements());
    let r = f.ev.rotate(&ct, 3, &gk2).unwrap();
    let want: Vec<f64> = (0..v.len()).map(|i| v[(i + 3) % v.len()]).collect();
    assert!(precision_bits(&f.enc.decode(&dec.decrypt(&r).unwrap()), &want) > 22.0);
    // Sizes: one key = 3 digits × (60+40+40+60 bits) × N / 8 + g + seed.
    let one = GaloisKeys::serialized_key_size(&f.ctx);
    assert_eq!(one, 8 + 32 + 3 * 200 * 8192 / 8);
    assert_eq!(gk.to_bytes().len(), 16 + 4 + 2 * one);
}

#[test]
fn truncated_and_extended_inputs_are_typed_errors() {
    let o = objects();
    for (i, bytes) in [&o.ct, &o.seeded, &o.pk, &o.gk, &o.cc, &o.rs]
        .into_iter()
        .enumerate()
    {
        let mut ok = parse_all(&o.f, bytes);
        assert!(ok[i], "object {i} must parse");
        ok[i] = false;
        assert_eq!(ok, [false; 6], "kinds are not interchangeable");
        for cut in [
            0,
            1,
            4,
            15,
            16,
            17,
            24,
            56,
            bytes.len() / 2,
            bytes.len() - 1,
        ] {
            assert!(
                parse_all(&o.f, &bytes[..cut]).iter().all(|&x| !x),
                "cut {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(parse_all(&o.f, &longer).iter().all(|&x| !x));
    }
    assert!(matches!(
        Ciphertext::from_bytes(&o.f.ctx, &o.ct[..o.ct.len() - 1]),
        Err(CkksError::Truncated { .. })
    ));
}

#[test]
fn header_fields_are_validated() {
    let o = objects();
    let ctx = &o.f.ctx;
    let mut b = o.ct.clone();
    b[0] ^= 1;
    assert_eq!(Ciphertext::from_bytes(ctx, &b), Err(CkksError::BadMagic));
    let mut b = o.ct.clone();
    b[4] = 9;
    assert_eq!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::UnsupportedVersion { version: 9 })
    );
    let mut b = o.ct.clone();
    b[6] = 14;
    assert!(matches!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::ParameterMismatch { .. })
    ));
    let mut b = o.ct.clone();
    b[7] = 7;
    assert!(matches!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::LevelOutOfRange { .. })
    ));
    let mut b = o.ct.clone();
    b[9] ^= 0x40;
    assert!(matches!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::ParameterMismatch { .. })
    ));
    // Non-finite scale.
    let mut b = o.ct.clone();
    b[16..24].copy_from_slice(&f64::NAN.to_bits().to_le_bytes());
    assert!(matches!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::InvalidScale { .. })
    ));
    // A coefficient ≥ its modulus: all-ones bits in the first coefficient.
    let mut b = o.ct.clone();
    for x in &mut b[24..32] {
        *x = 0xff;
    }
    assert!(matches!(
        Ciphertext::from_bytes(ctx, &b),
        Err(CkksError::CoefficientOutOfRange { limb: 0, index: 0 })
    ));
    // Galois keys: even element, huge count.
    let mut b = o.gk.clone();
    b[20..28].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(
        GaloisKeys::from_bytes(ctx, &b),
        Err(CkksError::Malformed { .. })
    ));
    let mut b = o.gk.clone();
    b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        GaloisKeys::from_bytes(ctx, &b),
        Err(CkksError::Truncated { .. })
    ));
    // Objects of another parameter set are refused.
    let other = fixture(Preset::N8192Depth2, 1);
    assert!(matches!(
        Ciphertext::from_bytes(&other.ctx, &o.ct),
        Err(CkksError::ParameterMismatch { .. })
    ));
}

/// Version 1 expanded seeds with ChaCha20: its bytes (same layout) would silently mean other
/// polynomials, so every kind refuses them with a typed error; objects written now carry version 2.
#[test]
fn version_1_objects_are_refused() {
    assert_eq!(serialize::FORMAT_VERSION, 2);
    let o = objects();
    let ctx = &o.f.ctx;
    for bytes in [&o.ct, &o.seeded, &o.pk, &o.gk, &o.cc, &o.rs] {
        assert_eq!(bytes[4], 2);
        let mut b = bytes.clone();
        b[4] = 1;
        let want = CkksError::UnsupportedVersion { version: 1 };
        assert_eq!(Ciphertext::from_bytes(ctx, &b).err(), Some(want.clone()));
        assert_eq!(
            SeededCiphertext::from_bytes(ctx, &b).err(),
            Some(want.clone())
        );
        assert_eq!(PublicKey::from_bytes(ctx, &b).err(), Some(want.clone()));
        assert_eq!(GaloisKeys::from_bytes(ctx, &b).err(), Some(want.clone()));
        assert_eq!(
            RoundedSeededCiphertext::from_bytes(ctx, &b).err(),
            Some(want)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let f = fixture_small();
        let _ = parse_all(&f, &bytes);
    }

    #[test]
    fn random_header_with_valid_prefix_never_panics(kind in 0u8..7, level in 0u8..4, tail in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let f = fixture_small();
        let mut b = b"CKLR".to_vec();
        // The current version, so that parsing goes past the version check.
        b.extend_from_slice(&[serialize::FORMAT_VERSION, kind, 13, level]);
        b.extend_from_slice(&f.ctx.params().digest().to_le_bytes());
        b.extend_from_slice(&tail);
        prop_assert!(parse_all(&f, &b).iter().all(|&x| !x));
    }

    /// A valid compressed-ciphertext header with random `(b, k, d)` and a random body of about the
    /// implied length: parses iff the parameters are valid and the length is exact (every bit
    /// pattern of the body is a valid coefficient), a typed error otherwise; never panics.
    #[test]
    fn compressed_headers_with_random_parameters_and_bodies(
        bits in 0u8..64,
        headroom in 0u8..70,
        dropped in 0u8..64,
        delta in -3i64..=3,
        seed in any::<u64>(),
    ) {
        let f = fixture_small();
        let mut b = b"CKLR".to_vec();
        b.extend_from_slice(&[serialize::FORMAT_VERSION, 5, 13, 0]);
        b.extend_from_slice(&f.ctx.params().digest().to_le_bytes());
        b.extend_from_slice(&f.ctx.params().scale().to_bits().to_le_bytes());
        b.extend_from_slice(&[bits, headroom, dropped, 0]);
        let p = CompressionParams {
            bits: u32::from(bits),
            headroom: u32::from(headroom),
            dropped: u32::from(dropped),
        };
        let valid = p.validate(f.ctx.params().moduli()[0]).is_ok();
        let body = if valid { p.poly_bytes(f.ctx.degree()) } else { 64 };
        let len = (body as i64 + delta).max(0) as usize;
        b.extend(random_body(seed, len));
        let r = CompressedCiphertext::from_bytes(&f.ctx, &b);
        prop_assert_eq!(r.is_ok(), valid && delta == 0);
        if let Ok(c) = r {
            prop_assert_eq!(c.to_bytes(), b);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A valid rounded-seeded header at a random level with a random `d` and a random body of about
    /// the implied length: a typed error unless `d` is valid and the length exact; when it parses,
    /// it writes back the same bytes; never panics.
    #[test]
    fn rounded_headers_with_random_parameters_and_bodies(
        level in 0u8..3,
        dropped in 0u8..64,
        delta in -3i64..=3,
        seed in any::<u64>(),
    ) {
        let f = fixture_small();
        let ctx = &f.ctx;
        let mut b = b"CKLR".to_vec();
        b.extend_from_slice(&[serialize::FORMAT_VERSION, 6, 13, level]);
        b.extend_from_slice(&ctx.params().digest().to_le_bytes());
        b.extend_from_slice(&ctx.params().scale().to_bits().to_le_bytes());
        b.extend_from_slice(&[7u8; 32]);
        b.extend_from_slice(&[dropped, 0, 0, 0]);
        let bits: Vec<u32> = ctx.params().moduli().iter().map(|q| 64 - q.leading_zeros()).collect();
        let valid = dropped >= 1 && u32::from(dropped) + 2 <= bits[0];
        let n = ctx.degree();
        let body = if valid {
            n * (bits[0] - u32::from(dropped)) as usize / 8
                + bits[1..=usize::from(level)].iter().map(|&b| n * b as usize / 8).sum::<usize>()
        } else {
            64
        };
        let len = (body as i64 + delta).max(0) as usize;
        b.extend(random_body(seed, len));
        let r = RoundedSeededCiphertext::from_bytes(ctx, &b);
        if !(valid && delta == 0) {
            prop_assert!(r.is_err());
        }
        if let Ok(c) = r {
            prop_assert_eq!(c.to_bytes(), b);
        }
    }
}

#[test]
fn bit_flips_and_truncations_of_valid_objects_never_panic() {
    let o = objects();
    let mut x = 0x1234_5678_9abc_def1u64;
    for bytes in [&o.ct, &o.seeded, &o.pk, &o.gk, &o.cc, &o.rs] {
        for _ in 0..24 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = bytes.clone();
            let pos = (x as usize) % b.len();
            b[pos] ^= 1 << (x >> 61);
            let _ = parse_all(&o.f, &b);
            let cut = (x >> 20) as usize % b.len();
            assert!(parse_all(&o.f, &b[..cut]).iter().all(|&v| !v));
        }
    }
}

#[test]
fn compressed_ciphertexts_round_trip_and_validate_their_fields() {
    let o = objects();
    let ctx = &o.f.ctx;
    let cc = CompressedCiphertext::from_bytes(ctx, &o.cc).unwrap();
    assert_eq!(cc.to_bytes(), o.cc);
    let p = cc.params();
    assert_eq!(o.cc.len(), 28 + p.poly_bytes(ctx.degree()));
    assert!(o.cc.len() < o.ct.len() / 2 * 3 / 2, "no saving");
    assert_eq!(
        serialize::peek_kind(&o.cc),
        Ok(ObjectKind::CompressedCiphertext)
    );
    assert_eq!(serialize::peek_kind(&o.ct), Ok(ObjectKind::Ciphertext));
    assert!(serialize::peek_kind(&o.cc[..15]).is_err());
    let mut b = o.cc.clone();
    b[5] = 77;
    assert!(matches!(
        serialize::peek_kind(&b),
        Err(CkksError::Malformed { .. })
    ));
    // Level other than 0.
    let mut b = o.cc.clone();
    b[7] = 1;
    assert!(matches!(
        CompressedCiphertext::from_bytes(ctx, &b),
        Err(CkksError::Malformed { .. })
    ));
    // b ≥ bits(q0), d ≥ b, b + k > 64: typed errors before any allocation.
    for (at, v) in [(24, 50u8), (24, 0), (26, 200), (25, 60)] {
        let mut b = o.cc.clone();
        b[at] = v;
        assert!(
            matches!(
                CompressedCiphertext::from_bytes(ctx, &b),
                Err(CkksError::InvalidCompression { .. })
            ),
            "byte {at} = {v}"
        );
    }
    // Reserved byte.
    let mut b = o.cc.clone();
    b[27] = 1;
    assert!(matches!(
        CompressedCiphertext::from_bytes(ctx, &b),
        Err(CkksError::Malformed { .. })
    ));
    // A smaller b that is valid changes the expected length: truncated.
    let mut b = o.cc.clone();
    b[24] += 1;
    assert!(matches!(
        CompressedCiphertext::from_bytes(ctx, &b),
        Err(CkksError::Truncated { .. })
    ));
    b[24] -= 2;
    assert!(matches!(
        CompressedCiphertext::from_bytes(ctx, &b),
        Err(CkksError::TrailingBytes { .. })
    ));
    // Another parameter set.
    let other = fixture(Preset::N8192Depth2, 1);
    assert!(matches!(
        CompressedCiphertext::from_bytes(&other.ctx, &o.cc),
        Err(CkksError::ParameterMismatch { .. })
    ));
}

/// `len` pseudo-random bytes from `seed` (xorshift64).
fn random_body(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fixture_small() -> Fixture {
    use std::sync::OnceLock;
    static CTX: OnceLock<std::sync::Arc<Context>> = OnceLock::new();
    let ctx = CTX
        .get_or_init(|| {
            Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap()
        })
        .clone();
    let mut rng = <rand_chacha::ChaCha20Rng as rand::SeedableRng>::from_seed([3; 32]);
    let sk = SecretKey::generate(&ctx, &mut rng);
    Fixture {
        enc: Encoder::new(&ctx),
        ev: Evaluator::new(&ctx),
        ctx,
        sk,
        rng,
    }
}
