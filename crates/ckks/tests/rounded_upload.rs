//! Seeded ciphertexts with the low bits of `c0` dropped (`rounded`): the added error against its
//! predicted bound, at every level, through the byte format and through evaluation.

mod common;

use cipherlora_ckks::*;
use common::*;

/// The largest difference of the real and imaginary parts of two decodings.
fn max_diff(a: &[Complex64], b: &[Complex64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x.re - y.re).abs().max((x.im - y.im).abs()))
        .fold(0.0, f64::max)
}

/// The error the rounding adds, measured as the distance between the decryptions of the rounded and
/// the original ciphertext (same key, same seed), stays below `rounded::predicted_error` and above
/// a sixteenth of it (the bound is a 2^-40 tail: the observed maximum over N parts sits at about a
/// quarter of it), at every level and from 1 to 24 dropped bits. Decoding above level 0
/// reconstructs the integer from every limb (Garner), so a wrong limb 1 or 2 fails it; a wrong sign
/// of δ in those limbs gives errors of order q_0/Δ.
#[test]
fn rounding_adds_at_most_the_predicted_error_at_every_level() {
    let mut f = fixture(Preset::N8192Depth2Fast, 11);
    let dec = Decryptor::new(&f.sk);
    let scale = f.ctx.params().scale();
    let n = f.ctx.degree();
    let re = values(f.ctx.slots(), 3, 1.0);
    let im = values(f.ctx.slots(), 4, 1.0);
    for level in 0..=f.ctx.max_level() {
        let seeded = Encryptor::new(&f.ctx)
            .encrypt_values_sk(&f.enc, &re, &im, level, scale, &f.sk, &mut f.rng)
            .unwrap();
        let exact = f
            .enc
            .decode_complex(&dec.decrypt(&seeded.expand()).unwrap());
        for dropped in [1, 8, 16, 19, 24] {
            let rounded = seeded.round_low_bits(dropped).unwrap();
            let got = f
                .enc
                .decode_complex(&dec.decrypt(&rounded.expand()).unwrap());
            let err = max_diff(&got, &exact);
            // (Plus the decoder's own floating-point error, ≈ 2^-29.)
            let bound = rounded::predicted_error(n, scale, dropped) + 1e-8;
            eprintln!(
                "level {level}, d = {dropped}: error {err:.3e}, bound {bound:.3e} ({:.1}× below)",
                bound / err
            );
            assert!(
                err <= bound,
                "level {level}, d = {dropped}: {err:e} > {bound:e}"
            );
            if dropped >= 8 {
                assert!(
                    err >= bound / 16.0,
                    "level {level}, d = {dropped}: {err:e} far below {bound:e}: nothing dropped?"
                );
            }
        }
    }
}

/// The bytes round-trip to the same ciphertext, `N·d/8 − 4` bytes smaller than the seeded
/// ciphertext's; the kind is peeked as such.
#[test]
fn rounded_ciphertexts_round_trip_and_are_smaller() {
    let mut f = fixture(Preset::N8192Depth2Fast, 12);
    let scale = f.ctx.params().scale();
    let n = f.ctx.degree();
    let re = values(f.ctx.slots(), 5, 1.0);
    let seeded = Encryptor::new(&f.ctx)
        .encrypt_values_sk(&f.enc, &re, &[], 2, scale, &f.sk, &mut f.rng)
        .unwrap();
    for dropped in [1, 19, 48] {
        let rounded = seeded.round_low_bits(dropped).unwrap();
        let bytes = rounded.to_bytes();
        assert_eq!(
            serialize::peek_kind(&bytes),
            Ok(ObjectKind::RoundedSeededCiphertext)
        );
        assert_eq!(
            bytes.len() + n * dropped as usize / 8,
            seeded.to_bytes().len() + 4
        );
        let back = RoundedSeededCiphertext::from_bytes(&f.ctx, &bytes).unwrap();
        assert_eq!(back.to_bytes(), bytes);
        assert_eq!(back.dropped(), dropped);
        assert_eq!(back.expand(), rounded.expand());
        assert_eq!(back.to_seeded().expand(), rounded.expand());
    }
    for bad in [0, 49, 64] {
        assert!(matches!(
            seeded.round_low_bits(bad),
            Err(CkksError::InvalidCompression { .. })
        ));
    }
}

/// A limb-0 value at or above `⌊(q_0 − 1)/2^d⌋ + 1`, an invalid `d` and non-zero reserved bytes are
/// typed errors.
#[test]
fn rounded_ciphertext_fields_are_validated() {
    let mut f = fixture(Preset::N8192Depth2Fast, 13);
    let scale = f.ctx.params().scale();
    let re = values(f.ctx.slots(), 6, 1.0);
    let seeded = Encryptor::new(&f.ctx)
        .encrypt_values_sk(&f.enc, &re, &[], 1, scale, &f.sk, &mut f.rng)
        .unwrap();
    // d = 1: limb 0 at 49 bits, whose all-ones value is above ⌈q_0/2⌉ (q_0 − 1 has zero bits above
    // the 14th).
    let bytes = seeded.round_low_bits(1).unwrap().to_bytes();
    // Body: scale (8), seed (32), d and reserved (4), then limb 0.
    let body = 16 + 8 + 32;
    let mut b = bytes.clone();
    for x in &mut b[body + 4..body + 4 + 7] {
        *x = 0xff;
    }
    assert!(matches!(
        RoundedSeededCiphertext::from_bytes(&f.ctx, &b),
        Err(CkksError::CoefficientOutOfRange { limb: 0, index: 0 })
    ));
    for d in [0u8, 49, 255] {
        let mut b = bytes.clone();
        b[body] = d;
        assert!(matches!(
            RoundedSeededCiphertext::from_bytes(&f.ctx, &b),
            Err(CkksError::InvalidCompression { .. })
        ));
    }
    let mut b = bytes.clone();
    b[body + 2] = 1;
    assert!(matches!(
        RoundedSeededCiphertext::from_bytes(&f.ctx, &b),
        Err(CkksError::Malformed { .. })
    ));
    // A valid `d` of another size: the length no longer matches.
    let mut b = bytes.clone();
    b[body] = 2;
    assert!(matches!(
        RoundedSeededCiphertext::from_bytes(&f.ctx, &b),
        Err(CkksError::TrailingBytes { .. })
    ));
}

/// What the server does with an upload: a product with a plaintext and a rescale from the top
/// level, from the rounded ciphertext, lands within the rounding's bound (scaled by the weight) of
/// the same evaluation on the original ciphertext.
#[test]
fn evaluation_on_a_rounded_ciphertext_carries_the_bound() {
    let mut f = fixture(Preset::N8192Depth2Fast, 14);
    let dec = Decryptor::new(&f.sk);
    let scale = f.ctx.params().scale();
    let level = f.ctx.max_level();
    let re = values(f.ctx.slots(), 7, 1.0);
    let w = values(f.ctx.slots(), 8, 0.5);
    let seeded = Encryptor::new(&f.ctx)
        .encrypt_values_sk(&f.enc, &re, &[], level, scale, &f.sk, &mut f.rng)
        .unwrap();
    let dropped = 19;
    let rounded = seeded.round_low_bits(dropped).unwrap();
    let pt = f.enc.encode(&w, level, scale).unwrap();
    let eval = |ct: &Ciphertext| {
        let mut prod = ct.clone();
        f.ev.mul_plain_assign(&mut prod, &pt).unwrap();
        let out = f.ev.rescale(&prod).unwrap();
        f.enc.decode(&dec.decrypt(&out).unwrap())
    };
    let exact = eval(&seeded.expand());
    let got = eval(&rounded.expand());
    let want: Vec<f64> = re.iter().zip(&w).map(|(a, b)| a * b).collect();
    assert!(precision_bits(&exact, &want) > 20.0);
    let err = got
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    // |w| ≤ 0.5 per slot: the slot-wise product scales the rounding error
    // by at most that (plus the rescale's own noise, ≈ 2^-30 here).
    let bound = 0.5 * rounded::predicted_error(f.ctx.degree(), scale, dropped) + 1e-8;
    assert!(err <= bound, "{err:e} > {bound:e}");
    assert!(err > bound / 64.0, "{err:e}: nothing dropped?");
}
