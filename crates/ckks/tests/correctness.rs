//! End-to-end correctness against a plaintext reference, every preset.

mod common;

use cipherlora_ckks::*;
use common::*;

fn presets() -> &'static [Preset] {
    CkksParameters::all_presets()
}

#[test]
fn encode_decode_round_trip_every_preset() {
    for &p in presets() {
        let f = fixture(p, 1);
        let v = values(f.ctx.slots(), 11, 4.0);
        for level in 0..=f.ctx.max_level() {
            let pt = f.enc.encode(&v, level, f.ctx.params().scale()).unwrap();
            let bits = precision_bits(&f.enc.decode(&pt), &v);
            assert!(bits >= 30.0, "{p:?} level {level}: {bits} bits");
        }
    }
}

#[test]
fn encrypt_decrypt_sk_and_pk_every_preset() {
    for &p in presets() {
        let mut f = fixture(p, 2);
        let v = values(f.ctx.slots(), 12, 4.0);
        let pt = f
            .enc
            .encode(&v, f.ctx.max_level(), f.ctx.params().scale())
            .unwrap();
        let encryptor = Encryptor::new(&f.ctx);
        let dec = Decryptor::new(&f.sk);
        let ct = encryptor
            .encrypt_sk(&pt, &f.sk, &mut f.rng)
            .unwrap()
            .expand();
        let bits = precision_bits(&f.enc.decode(&dec.decrypt(&ct).unwrap()), &v);
        assert!(bits >= 25.0, "{p:?} sk: {bits}");
        let pk = PublicKey::generate(&f.sk, &mut f.rng);
        let ct = encryptor.encrypt_pk(&pt, &pk, &mut f.rng).unwrap();
        let bits = precision_bits(&f.enc.decode(&dec.decrypt(&ct).unwrap()), &v);
        // Public-key noise u·e + e1·s + e0 is ~√N larger than secret-key noise.
        assert!(bits >= 20.0, "{p:?} pk: {bits}");
    }
}

/// The fused encode + encrypt (error added to the integer coefficients before the NTT) is the
/// two-step path bit for bit, for complex values at every level: same random generator state, same
/// ciphertext; and it decrypts to both parts.
#[test]
fn fused_encode_encrypt_equals_encode_then_encrypt() {
    for &p in presets() {
        let f = fixture(p, 7);
        let scale = f.ctx.params().scale();
        let re = values(f.ctx.slots(), 13, 4.0);
        let im = values(f.ctx.slots() / 3, 14, 4.0);
        let encryptor = Encryptor::new(&f.ctx);
        for level in 0..=f.ctx.max_level() {
            let (mut r1, mut r2) = (f.rng.clone(), f.rng.clone());
            let pt = f.enc.encode_complex(&re, &im, level, scale).unwrap();
            let two_step = encryptor.encrypt_sk(&pt, &f.sk, &mut r1).unwrap();
            let fused = encryptor
                .encrypt_values_sk(&f.enc, &re, &im, level, scale, &f.sk, &mut r2)
                .unwrap();
            assert!(fused == two_step, "{p:?} level {level}");
            let got = f
                .enc
                .decode_complex(&Decryptor::new(&f.sk).decrypt(&fused.expand()).unwrap());
            let got_im: Vec<f64> = got.iter().map(|z| z.im).collect();
            let want_im: Vec<f64> = (0..got.len())
                .map(|i| im.get(i).copied().unwrap_or(0.0))
                .collect();
            assert!(
                precision_bits(&got_im, &want_im) >= 25.0,
                "{p:?} level {level}"
            );
        }
        let other = fixture(Preset::N8192Depth2, 8);
        if p != Preset::N8192Depth2 {
            let mut rng = f.rng.clone();
            assert!(matches!(
                encryptor.encrypt_values_sk(&f.enc, &re, &im, 0, scale, &other.sk, &mut rng),
                Err(CkksError::ParameterMismatch { .. })
            ));
        }
    }
}

#[test]
fn mul_plain_rescale_add_rotate_every_preset() {
    for &p in presets() {
        let mut f = fixture(p, 3);
        let slots = f.ctx.slots();
        let scale = f.ctx.params().scale();
        let top = f.ctx.max_level();
        let x = values(slots, 21, 2.0);
        let w = values(slots, 22, 2.0);
        let y = values(slots, 23, 2.0);
        let encryptor = Encryptor::new(&f.ctx);
        let dec = Decryptor::new(&f.sk);
        let ct_x = encryptor
            .encrypt_sk(&f.enc.encode(&x, top, scale).unwrap(), &f.sk, &mut f.rng)
            .unwrap()
            .expand();
        let ct_y = encryptor
            .encrypt_sk(&f.enc.encode(&y, top, scale).unwrap(), &f.sk, &mut f.rng)
            .unwrap()
            .expand();
        // add
        let sum = f.ev.add(&ct_x, &ct_y).unwrap();
        let want: Vec<f64> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let bits = precision_bits(&f.enc.decode(&dec.decrypt(&sum).unwrap()), &want);
        assert!(bits >= 25.0, "{p:?} add: {bits}");
        // ct×pt + rescale: ≥ 25 bits at scale 2^40
        let pw = f.enc.encode(&w, top, scale).unwrap();
        let prod = f.ev.rescale(&f.ev.mul_plain(&ct_x, &pw).unwrap()).unwrap();
        assert_eq!(prod.level(), top - 1);
        let want: Vec<f64> = x.iter().zip(&w).map(|(a, b)| a * b).collect();
        let bits = precision_bits(&f.enc.decode(&dec.decrypt(&prod).unwrap()), &want);
        assert!(bits >= 25.0, "{p:?} mul+rescale: {bits}");
        // rotate (positive, negative), plain and hoisted
        let steps = [1i64, 5, -3, 64];
        let gks = GaloisKeys::generate(&f.sk, &steps, &mut f.rng);
        let h = f.ev.hoist(&prod);
        for &s in &steps {
            let r = f.ev.rotate(&prod, s, &gks).unwrap();
            let rh = f.ev.rotate_hoisted(&h, s, &gks).unwrap();
            let want_r: Vec<f64> = (0..slots)
                .map(|i| want[(i as i64 + s).rem_euclid(slots as i64) as usize])
                .collect();
            let bits = precision_bits(&f.enc.decode(&dec.decrypt(&r).unwrap()), &want_r);
            assert!(bits >= 22.0, "{p:?} rotate {s}: {bits}");
            let bits = precision_bits(&f.enc.decode(&dec.decrypt(&rh).unwrap()), &want_r);
            assert!(bits >= 22.0, "{p:?} hoisted rotate {s}: {bits}");
        }
        // missing key is a typed error
        assert!(matches!(
            f.ev.rotate(&prod, 2, &gks),
            Err(CkksError::MissingGaloisKey { step: 2, .. })
        ));
    }
}

/// Encrypting or decrypting objects of another parameter set used to panic; it is now a typed
/// error.
#[test]
fn regression_cross_context_encrypt_and_decrypt_are_typed_errors() {
    let mut a = fixture(Preset::N8192Depth2Fast, 3);
    let b = fixture(Preset::N8192Depth2, 4);
    let v = values(a.ctx.slots(), 13, 1.0);
    let pt_a = a.enc.encode(&v, 1, a.ctx.params().scale()).unwrap();
    let pt_b = b.enc.encode(&v, 1, b.ctx.params().scale()).unwrap();
    let enc_a = Encryptor::new(&a.ctx);
    let mismatch = |r: std::result::Result<(), CkksError>| {
        assert!(
            matches!(r, Err(CkksError::ParameterMismatch { .. })),
            "{r:?}"
        );
    };
    // Plaintext, secret key or public key from the other context.
    mismatch(enc_a.encrypt_sk(&pt_b, &a.sk, &mut a.rng).map(drop));
    mismatch(enc_a.encrypt_sk(&pt_a, &b.sk, &mut a.rng).map(drop));
    let pk_b = PublicKey::generate(&b.sk, &mut a.rng);
    mismatch(enc_a.encrypt_pk(&pt_a, &pk_b, &mut a.rng).map(drop));
    // A ciphertext of context A decrypted with B's key.
    let ct_a = enc_a.encrypt_sk(&pt_a, &a.sk, &mut a.rng).unwrap().expand();
    mismatch(Decryptor::new(&b.sk).decrypt(&ct_a).map(drop));
    // The same calls within one context work.
    let back = a.enc.decode(&Decryptor::new(&a.sk).decrypt(&ct_a).unwrap());
    assert!(precision_bits(&back, &v) >= 25.0);
}
