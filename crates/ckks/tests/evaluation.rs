//! Evaluation semantics beyond the basic chain: lazy accumulation, double hoisting, exact scales,
//! level management, typed errors, and property tests over random inputs.

mod common;

use cipherlora_ckks::*;
use common::*;
use proptest::prelude::*;

fn encrypt(f: &mut Fixture, v: &[f64], level: usize, scale: f64) -> Ciphertext {
    let pt = f.enc.encode(v, level, scale).unwrap();
    Encryptor::new(&f.ctx)
        .encrypt_sk(&pt, &f.sk, &mut f.rng)
        .unwrap()
        .expand()
}

fn decrypt(f: &Fixture, ct: &Ciphertext) -> Vec<f64> {
    f.enc.decode(&Decryptor::new(&f.sk).decrypt(ct).unwrap())
}

#[test]
fn mul_accumulator_matches_sum_of_products_and_reference() {
    let mut f = fixture(Preset::N8192Depth2Fast, 30);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let terms = 24;
    let xs: Vec<Vec<f64>> = (0..terms).map(|k| values(slots, 100 + k, 1.0)).collect();
    let ws: Vec<Vec<f64>> = (0..terms).map(|k| values(slots, 200 + k, 1.0)).collect();
    let cts: Vec<Ciphertext> = xs.iter().map(|x| encrypt(&mut f, x, top, scale)).collect();
    let pts: Vec<Plaintext> = ws
        .iter()
        .map(|w| f.enc.encode(w, top, scale).unwrap())
        .collect();
    let mut acc = f.ev.mul_accumulator(top).unwrap();
    for (c, p) in cts.iter().zip(&pts) {
        acc.add_product(c, p).unwrap();
    }
    assert_eq!(acc.terms(), terms as usize);
    let lazy = acc.finish().unwrap();
    let mut eager = f.ev.mul_plain(&cts[0], &pts[0]).unwrap();
    for (c, p) in cts.iter().zip(&pts).skip(1) {
        f.ev.add_assign(&mut eager, &f.ev.mul_plain(c, p).unwrap())
            .unwrap();
    }
    assert_eq!(lazy, eager, "lazy accumulation is exact, not approximate");
    let want: Vec<f64> = (0..slots)
        .map(|i| (0..terms as usize).map(|k| xs[k][i] * ws[k][i]).sum())
        .collect();
    let got = decrypt(&f, &f.ev.rescale(&lazy).unwrap());
    assert!(precision_bits(&got, &want) >= 22.0);
    // Mismatched terms are typed errors.
    let mut acc = f.ev.mul_accumulator(top).unwrap();
    acc.add_product(&cts[0], &pts[0]).unwrap();
    let other = f.enc.encode(&ws[0], top, scale * 2.0).unwrap();
    assert!(matches!(
        acc.add_product(&cts[1], &other),
        Err(CkksError::ScaleMismatch { .. })
    ));
    let low = f.ev.drop_to_level(&cts[1], 1).unwrap();
    assert!(matches!(
        acc.add_product(&low, &pts[1]),
        Err(CkksError::LevelMismatch { .. })
    ));
    assert!(f.ev.mul_accumulator(top).unwrap().finish().is_none());
}

/// `add_products` (one lazy many-term pass per limb, the IFMA kernel where the CPU has it) against
/// `add_product` one term at a time (tfhe-ntt's multiply-accumulate): bit-identical sums for term
/// counts on both sides of the kernel's reduction chunk, at every level, over `Q` and over `Q·P`,
/// also when mixed with single products afterwards.
#[test]
fn add_products_is_bit_identical_to_one_product_at_a_time() {
    let mut f = fixture(Preset::N8192Depth2Fast, 32);
    let (slots, scale) = (f.ctx.slots(), f.ctx.params().scale());
    let max_terms = 24;
    for level in 0..=f.ctx.max_level() {
        let cts: Vec<Ciphertext> = (0..max_terms)
            .map(|k| encrypt(&mut f, &values(slots, 300 + k, 2.0), level, scale))
            .collect();
        let pts: Vec<Plaintext> = (0..max_terms)
            .map(|k| {
                f.enc
                    .encode(&values(slots, 400 + k, 1.0), level, scale)
                    .unwrap()
            })
            .collect();
        let exts: Vec<ExtendedCiphertext> = cts.iter().map(|c| f.ev.extend(c)).collect();
        let epts: Vec<ExtendedPlaintext> = (0..max_terms)
            .map(|k| {
                let w = values(slots, 500 + k, 1.0);
                f.enc.encode_extended(&w, level, scale).unwrap()
            })
            .collect();
        for terms in [1usize, 7, 8, 9, 24] {
            let (c, p): (Vec<_>, Vec<_>) = cts.iter().zip(&pts).take(terms).unzip();
            let mut batch = f.ev.mul_accumulator(level).unwrap();
            batch.add_products(&c, &p).unwrap();
            let mut single = f.ev.mul_accumulator(level).unwrap();
            for (c, p) in c.iter().zip(&p) {
                single.add_product(c, p).unwrap();
            }
            assert_eq!(batch.terms(), terms);
            assert_eq!(
                batch.finish(),
                single.finish(),
                "level {level}, {terms} terms"
            );

            let (c, p): (Vec<_>, Vec<_>) = exts.iter().zip(&epts).take(terms).unzip();
            let mut batch = f.ev.mul_accumulator_extended(level).unwrap();
            batch.add_products(&c, &p).unwrap();
            let mut single = f.ev.mul_accumulator_extended(level).unwrap();
            for (c, p) in c.iter().zip(&p) {
                single.add_product(c, p).unwrap();
            }
            assert_eq!(
                batch.finish(),
                single.finish(),
                "level {level}, {terms} terms, Q·P"
            );
        }
        // A batch, then single products, then a batch onto earlier terms.
        let (c, p): (Vec<_>, Vec<_>) = cts.iter().zip(&pts).unzip();
        let mut mixed = f.ev.mul_accumulator(level).unwrap();
        mixed.add_products(&c[..9], &p[..9]).unwrap();
        mixed.add_product(c[9], p[9]).unwrap();
        mixed.add_products(&c[10..], &p[10..]).unwrap();
        let mut all = f.ev.mul_accumulator(level).unwrap();
        all.add_products(&c, &p).unwrap();
        assert_eq!(mixed.terms(), max_terms as usize);
        assert_eq!(mixed.finish(), all.finish(), "level {level}, mixed");
    }
}

/// A bad batch is refused whole with a typed error and leaves the accumulator as it was.
#[test]
fn add_products_refuses_bad_batches_without_adding_anything() {
    let mut f = fixture(Preset::N8192Depth2Fast, 33);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let cts: Vec<Ciphertext> = (0..3)
        .map(|k| encrypt(&mut f, &values(slots, 600 + k, 1.0), top, scale))
        .collect();
    let pts: Vec<Plaintext> = (0..3)
        .map(|k| {
            f.enc
                .encode(&values(slots, 700 + k, 1.0), top, scale)
                .unwrap()
        })
        .collect();
    let (c, p): (Vec<_>, Vec<_>) = cts.iter().zip(&pts).unzip();
    let mut acc = f.ev.mul_accumulator(top).unwrap();
    assert!(matches!(
        acc.add_products(&c, &p[..2]),
        Err(CkksError::TermCountMismatch {
            ciphertexts: 3,
            plaintexts: 2
        })
    ));
    let other = f
        .enc
        .encode(&values(slots, 9, 1.0), top, scale * 2.0)
        .unwrap();
    assert!(matches!(
        acc.add_products(&c[..2], &[p[0], &other]),
        Err(CkksError::ScaleMismatch { .. })
    ));
    let low = f.ev.drop_to_level(&cts[1], 1).unwrap();
    assert!(matches!(
        acc.add_products(&[c[0], &low], &p[..2]),
        Err(CkksError::LevelMismatch { .. })
    ));
    assert_eq!(acc.terms(), 0);
    // Still usable, and at a scale the refused batch did not pin: a batch of the other scale is
    // accepted.
    let twice: Vec<Plaintext> = (0..3)
        .map(|k| {
            f.enc
                .encode(&values(slots, 700 + k, 1.0), top, scale * 2.0)
                .unwrap()
        })
        .collect();
    let p2: Vec<&Plaintext> = twice.iter().collect();
    acc.add_products(&c, &p2).unwrap();
    assert_eq!(acc.terms(), 3);
}

/// `sums_of_products` (every limb walked in tiles across the sums) against one accumulator per sum
/// fed one product at a time (tfhe-ntt's multiply-accumulate, no tiling): bit-identical, over `Q`
/// and `Q·P`, at every level, for sums sharing ciphertexts as giant steps share baby steps, of
/// different lengths (one past the kernel's reduction chunk) and empty.
#[test]
fn sums_of_products_are_bit_identical_to_separate_accumulators() {
    let mut f = fixture(Preset::N8192Depth2Fast, 34);
    let (slots, scale) = (f.ctx.slots(), f.ctx.params().scale());
    let terms = 9;
    for level in 0..=f.ctx.max_level() {
        let cts: Vec<Ciphertext> = (0..terms)
            .map(|k| encrypt(&mut f, &values(slots, 800 + k, 2.0), level, scale))
            .collect();
        let exts: Vec<ExtendedCiphertext> = cts.iter().map(|c| f.ev.extend(c)).collect();
        // Three sums' plaintexts: 9, 4 and 0 terms.
        let lens = [terms as usize, 4, 0];
        let pts: Vec<Vec<Plaintext>> = (0..3)
            .map(|m| {
                (0..lens[m])
                    .map(|k| {
                        let w = values(slots, 900 + 10 * m as u64 + k as u64, 1.0);
                        f.enc.encode(&w, level, scale).unwrap()
                    })
                    .collect()
            })
            .collect();
        let epts: Vec<Vec<ExtendedPlaintext>> = (0..3)
            .map(|m| {
                (0..lens[m])
                    .map(|k| {
                        let w = values(slots, 950 + 10 * m as u64 + k as u64, 1.0);
                        f.enc.encode_extended(&w, level, scale).unwrap()
                    })
                    .collect()
            })
            .collect();

        let c: Vec<&Ciphertext> = cts.iter().collect();
        let p: Vec<Vec<&Plaintext>> = pts.iter().map(|v| v.iter().collect()).collect();
        let sums: Vec<(&[&Ciphertext], &[&Plaintext])> =
            (0..3).map(|m| (&c[..lens[m]], &p[m][..])).collect();
        let got = f.ev.sums_of_products(level, &sums).unwrap();
        for (m, got) in got.into_iter().enumerate() {
            let mut single = f.ev.mul_accumulator(level).unwrap();
            for (c, p) in c.iter().zip(&p[m]) {
                single.add_product(c, p).unwrap();
            }
            assert_eq!(got, single.finish(), "level {level}, sum {m}");
        }

        let e: Vec<&ExtendedCiphertext> = exts.iter().collect();
        let ep: Vec<Vec<&ExtendedPlaintext>> = epts.iter().map(|v| v.iter().collect()).collect();
        let sums: Vec<(&[&ExtendedCiphertext], &[&ExtendedPlaintext])> =
            (0..3).map(|m| (&e[..lens[m]], &ep[m][..])).collect();
        let got = f.ev.sums_of_products_extended(level, &sums).unwrap();
        for (m, got) in got.into_iter().enumerate() {
            let mut single = f.ev.mul_accumulator_extended(level).unwrap();
            for (c, p) in e.iter().zip(&ep[m]) {
                single.add_product(c, p).unwrap();
            }
            assert_eq!(got, single.finish(), "level {level}, sum {m}, Q·P");
        }
    }
}

/// A bad term in any sum refuses the whole call with the term's typed error.
#[test]
fn sums_of_products_refuse_a_bad_sum_with_a_typed_error() {
    let mut f = fixture(Preset::N8192Depth2Fast, 35);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let cts: Vec<Ciphertext> = (0..2)
        .map(|k| encrypt(&mut f, &values(slots, 980 + k, 1.0), top, scale))
        .collect();
    let pt = f.enc.encode(&values(slots, 990, 1.0), top, scale).unwrap();
    let twice = f
        .enc
        .encode(&values(slots, 991, 1.0), top, scale * 2.0)
        .unwrap();
    let c: Vec<&Ciphertext> = cts.iter().collect();
    let good: [&Plaintext; 2] = [&pt, &pt];
    let mixed: [&Plaintext; 2] = [&pt, &twice];
    assert!(matches!(
        f.ev.sums_of_products(top, &[(&c[..], &good[..]), (&c[..], &mixed[..])]),
        Err(CkksError::ScaleMismatch { .. })
    ));
    assert!(
        f.ev.sums_of_products(top, &[(&c[..], &good[..]), (&c[..1], &good[..1])])
            .is_ok()
    );
    assert!(matches!(
        f.ev.sums_of_products(top, &[(&c[..], &good[..1])]),
        Err(CkksError::TermCountMismatch { .. })
    ));
    let low = f.ev.drop_to_level(&cts[1], 1).unwrap();
    assert!(matches!(
        f.ev.sums_of_products(top, &[(&[c[0], &low][..], &good[..])]),
        Err(CkksError::LevelMismatch { .. })
    ));
    assert!(matches!(
        f.ev.sums_of_products(top + 1, &[(&c[..], &good[..])]),
        Err(CkksError::LevelOutOfRange { .. })
    ));
}

#[test]
fn double_hoisting_sums_rotations_before_one_mod_down() {
    let mut f = fixture(Preset::N8192Depth2Fast, 31);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let x = values(slots, 31, 1.0);
    let ct = encrypt(&mut f, &x, top, scale);
    let steps = [1i64, 2, 7, -5];
    let gks = GaloisKeys::generate(&f.sk, &steps, &mut f.rng);
    let h = f.ev.hoist(&ct);
    let mut acc = f.ev.extend(&ct);
    for &s in &steps {
        let r = f.ev.rotate_hoisted_extended(&h, s, &gks).unwrap();
        f.ev.add_extended_assign(&mut acc, &r).unwrap();
    }
    let got = decrypt(&f, &f.ev.mod_down(&acc).unwrap());
    let want: Vec<f64> = (0..slots)
        .map(|i| {
            x[i] + steps
                .iter()
                .map(|&s| x[(i as i64 + s).rem_euclid(slots as i64) as usize])
                .sum::<f64>()
        })
        .collect();
    assert!(precision_bits(&got, &want) >= 22.0);
}

/// BSGS inner sum `Σ_b w_b ⊙ rot(x, b)` with double hoisting (extended rotations × extended
/// plaintexts, one fused ModDown + rescale) against the plaintext reference and against the
/// ordinary path (hoisted rotations brought down one by one, ct×pt, rescale), on both prime-size
/// regimes (the centered lifts take different branches) and every level ≥ 1.
#[test]
fn double_hoisted_dot_product_matches_plain_path_and_reference() {
    for (preset, seed) in [(Preset::N8192Depth2Fast, 41u8), (Preset::N8192Depth2, 42)] {
        let mut f = fixture(preset, seed);
        let (slots, scale) = (f.ctx.slots(), f.ctx.params().scale());
        let steps = [0i64, 1, 2, 9, -3];
        let gks = GaloisKeys::generate(&f.sk, &steps, &mut f.rng);
        for level in 1..=f.ctx.max_level() {
            let x = values(slots, seed as u64 + level as u64, 2.0);
            let ct = encrypt(&mut f, &x, level, scale);
            let q_l = f.ctx.params().moduli()[level] as f64;
            let ws: Vec<Vec<f64>> = (0..steps.len())
                .map(|b| values(slots, 100 + b as u64, 1.5))
                .collect();
            let h = f.ev.hoist(&ct);
            let mut ext = f.ev.mul_accumulator_extended(level).unwrap();
            let mut plain = f.ev.mul_accumulator(level).unwrap();
            for (&s, w) in steps.iter().zip(&ws) {
                let ept = f.enc.encode_extended(w, level, q_l).unwrap();
                let r = if s == 0 {
                    f.ev.extend(&ct)
                } else {
                    f.ev.rotate_hoisted_extended(&h, s, &gks).unwrap()
                };
                ext.add_product(&r, &ept).unwrap();
                let rot = f.ev.rotate_hoisted(&h, s, &gks).unwrap();
                plain.add_product(&rot, ept.plaintext()).unwrap();
            }
            assert_eq!(ext.terms(), steps.len());
            let got_ext = f.ev.mod_down_rescale(&ext.finish().unwrap()).unwrap();
            let got_plain = f.ev.rescale(&plain.finish().unwrap()).unwrap();
            assert_eq!(got_ext.level(), level - 1);
            assert!((got_ext.scale() / scale - 1.0).abs() < 1e-12);
            let want: Vec<f64> = (0..slots)
                .map(|i| {
                    steps
                        .iter()
                        .zip(&ws)
                        .map(|(&s, w)| w[i] * x[(i as i64 + s).rem_euclid(slots as i64) as usize])
                        .sum()
                })
                .collect();
            let (e, p) = (decrypt(&f, &got_ext), decrypt(&f, &got_plain));
            assert!(
                precision_bits(&e, &want) >= 20.0,
                "{preset:?} level {level}"
            );
            assert!(
                precision_bits(&p, &want) >= 20.0,
                "{preset:?} level {level}"
            );
            assert!(precision_bits(&e, &p) >= 20.0, "{preset:?} level {level}");
        }
    }
}

#[test]
fn fused_mod_down_rescale_refuses_level_zero_and_mismatches() {
    let mut f = fixture(Preset::N8192Depth2Fast, 43);
    let scale = f.ctx.params().scale();
    let x = values(16, 43, 1.0);
    let ct0 = encrypt(&mut f, &x, 0, scale);
    assert!(matches!(
        f.ev.mod_down_rescale(&f.ev.extend(&ct0)),
        Err(CkksError::CannotRescale)
    ));
    let ct1 = encrypt(&mut f, &x, 1, scale);
    let mut acc = f.ev.mul_accumulator_extended(2).unwrap();
    let ept = f.enc.encode_extended(&x, 2, scale).unwrap();
    assert!(matches!(
        acc.add_product(&f.ev.extend(&ct1), &ept),
        Err(CkksError::LevelMismatch { .. })
    ));
    let low = f.enc.encode_extended(&x, 0, scale).unwrap();
    let mut acc1 = f.ev.mul_accumulator_extended(1).unwrap();
    assert!(matches!(
        acc1.add_product(&f.ev.extend(&ct1), &low),
        Err(CkksError::LevelMismatch { .. })
    ));
    assert!(f.ev.mul_accumulator_extended(1).unwrap().finish().is_none());
    assert!(matches!(
        f.ev.mul_accumulator_extended(9),
        Err(CkksError::LevelOutOfRange { .. })
    ));
}

#[test]
fn exact_scale_management_with_prime_scaled_plaintexts() {
    let mut f = fixture(Preset::N8192Depth2, 32);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let x = values(slots, 32, 1.0);
    let w = values(slots, 33, 1.0);
    let ct = encrypt(&mut f, &x, top, scale);
    // Encode the plaintext at exactly the prime the rescale divides by.
    let q_top = f.ctx.params().moduli()[top] as f64;
    let pt = f.enc.encode(&w, top, q_top).unwrap();
    let r = f.ev.rescale(&f.ev.mul_plain(&ct, &pt).unwrap()).unwrap();
    assert_eq!(r.scale(), scale, "scale stays exactly 2^40");
    let want: Vec<f64> = x.iter().zip(&w).map(|(a, b)| a * b).collect();
    assert!(precision_bits(&decrypt(&f, &r), &want) >= 25.0);
    // It can now be added to a fresh ciphertext dropped to the same level.
    let fresh_top = encrypt(&mut f, &x, top, scale);
    let fresh = f.ev.drop_to_level(&fresh_top, top - 1).unwrap();
    let sum = f.ev.add(&r, &fresh).unwrap();
    let want2: Vec<f64> = want.iter().zip(&x).map(|(a, b)| a + b).collect();
    assert!(precision_bits(&decrypt(&f, &sum), &want2) >= 25.0);
    // add_plain and sub.
    let mut c = fresh.clone();
    f.ev.add_plain_assign(&mut c, &f.enc.encode(&w, top, scale).unwrap())
        .unwrap();
    let d = f.ev.sub(&c, &fresh).unwrap();
    assert!(precision_bits(&decrypt(&f, &d), &w) >= 25.0);
}

#[test]
fn mismatches_and_bad_inputs_are_typed_errors() {
    let mut f = fixture(Preset::N8192Depth1, 33);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let x = values(slots, 1, 1.0);
    let a = encrypt(&mut f, &x, top, scale);
    let b = encrypt(&mut f, &x, top, scale * 2.0);
    assert!(matches!(
        f.ev.add(&a, &b),
        Err(CkksError::ScaleMismatch { .. })
    ));
    let low = f.ev.drop_to_level(&a, 0).unwrap();
    assert!(matches!(
        f.ev.add(&a, &low),
        Err(CkksError::LevelMismatch { left: 1, right: 0 })
    ));
    assert_eq!(f.ev.rescale(&low), Err(CkksError::CannotRescale));
    assert!(matches!(
        f.ev.drop_to_level(&low, 1),
        Err(CkksError::LevelOutOfRange { .. })
    ));
    let pt_low = f.enc.encode(&x, 0, scale).unwrap();
    assert!(matches!(
        f.ev.mul_plain(&a, &pt_low),
        Err(CkksError::LevelMismatch { .. })
    ));
    assert!(matches!(
        f.enc.encode(&vec![0.0; slots + 1], 0, scale),
        Err(CkksError::TooManyValues { .. })
    ));
    assert_eq!(
        f.enc.encode(&[1.0, f64::NAN], 0, scale),
        Err(CkksError::ValueOutOfRange { index: 1 })
    );
    assert_eq!(
        f.enc.encode(&[1e30], 0, scale),
        Err(CkksError::ValueOutOfRange { index: 0 })
    );
    assert!(matches!(
        f.enc.encode(&[1.0], 0, f64::INFINITY),
        Err(CkksError::InvalidScale { .. })
    ));
    assert!(matches!(
        f.enc.encode(&[1.0], 5, scale),
        Err(CkksError::LevelOutOfRange { .. })
    ));
    assert_eq!(
        f.ev.required_galois_elements(&[0, 1, 1, slots as i64 + 1]),
        vec![5]
    );
}

#[test]
fn rotation_steps_wrap_and_compose() {
    let mut f = fixture(Preset::N8192Depth2Fast, 34);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let x = values(slots, 34, 1.0);
    let ct = encrypt(&mut f, &x, top, scale);
    let gks = GaloisKeys::generate(&f.sk, &[1, -1], &mut f.rng);
    // Left then right is the identity; step 0 and full turns need no key.
    let back =
        f.ev.rotate(&f.ev.rotate(&ct, 1, &gks).unwrap(), -1, &gks)
            .unwrap();
    assert!(precision_bits(&decrypt(&f, &back), &x) >= 22.0);
    assert_eq!(f.ev.rotate(&ct, 0, &gks).unwrap(), ct);
    assert_eq!(f.ev.rotate(&ct, slots as i64, &gks).unwrap(), ct);
    // Right rotation by 1 equals left rotation by slots − 1.
    let r1 = decrypt(&f, &f.ev.rotate(&ct, slots as i64 - 1, &gks).unwrap());
    let want: Vec<f64> = (0..slots).map(|i| x[(i + slots - 1) % slots]).collect();
    assert!(precision_bits(&r1, &want) >= 22.0);
    // Hoisted step 0 reproduces the input.
    let h = f.ev.hoist(&ct);
    assert_eq!(f.ev.rotate_hoisted(&h, 0, &gks).unwrap(), ct);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// ≥ 25 bits after one ct×pt + rescale at scale 2^40, random inputs.
    #[test]
    fn prop_ct_pt_rescale_precision(seed in any::<u64>(), amp_x in 0.01f64..8.0, amp_w in 0.01f64..8.0, len in 1usize..4096) {
        let mut f = fixture(Preset::N8192Depth2Fast, (seed % 251) as u8);
        let (scale, top) = (f.ctx.params().scale(), f.ctx.max_level());
        let x = values(len, seed, amp_x);
        let w = values(len, seed ^ 0xabcdef, amp_w);
        let ct = encrypt(&mut f, &x, top, scale);
        let pt = f.enc.encode(&w, top, scale).unwrap();
        let got = decrypt(&f, &f.ev.rescale(&f.ev.mul_plain(&ct, &pt).unwrap()).unwrap());
        let want: Vec<f64> = (0..f.ctx.slots()).map(|i| if i < len { x[i] * w[i] } else { 0.0 }).collect();
        prop_assert!(precision_bits(&got, &want) >= 25.0);
    }

    /// Encoding round trip: error ≤ 2^-30 at scale 2^40 for |values| ≤ 100.
    #[test]
    fn prop_encode_decode(seed in any::<u64>(), amp in 0.0f64..100.0, level in 0usize..3) {
        let f = fixture(Preset::N8192Depth2Fast, 1);
        let v = values(f.ctx.slots(), seed, amp);
        let pt = f.enc.encode(&v, level, f.ctx.params().scale()).unwrap();
        prop_assert!(precision_bits(&f.enc.decode(&pt), &v) >= 30.0);
    }

    /// Homomorphic addition is commutative and matches the plaintext sum.
    #[test]
    fn prop_add_commutes(seed in any::<u64>()) {
        let mut f = fixture(Preset::N8192Depth1, (seed % 200) as u8);
        let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
        let x = values(slots, seed, 10.0);
        let y = values(slots, !seed, 10.0);
        let a = encrypt(&mut f, &x, top, scale);
        let b = encrypt(&mut f, &y, top, scale);
        let ab = f.ev.add(&a, &b).unwrap();
        prop_assert_eq!(&ab, &f.ev.add(&b, &a).unwrap());
        let want: Vec<f64> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        prop_assert!(precision_bits(&decrypt(&f, &ab), &want) >= 25.0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// `extend` multiplies by P exactly, so ModDown undoes it and the fused ModDown + rescale
    /// equals the ordinary rescale, bit for bit.
    #[test]
    fn prop_extend_then_mod_down_is_exact(seed in any::<u64>(), level in 1usize..3, fast in any::<bool>()) {
        let preset = if fast { Preset::N8192Depth2Fast } else { Preset::N8192Depth2 };
        let mut f = fixture(preset, (seed % 61) as u8);
        let x = values(f.ctx.slots(), seed, 3.0);
        let scale = f.ctx.params().scale();
        let ct = encrypt(&mut f, &x, level, scale);
        let e = f.ev.extend(&ct);
        prop_assert_eq!(&f.ev.mod_down(&e).unwrap(), &ct);
        prop_assert_eq!(&f.ev.mod_down_rescale(&e).unwrap(), &f.ev.rescale(&ct).unwrap());
    }

    /// Random rotation steps, plain and hoisted, against the rotated reference.
    #[test]
    fn prop_rotate_random_steps(step in -4095i64..4096, seed in any::<u64>()) {
        let mut f = fixture(Preset::N8192Depth2Fast, (seed % 97) as u8);
        let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
        let x = values(slots, seed, 2.0);
        let ct = encrypt(&mut f, &x, top, scale);
        let gks = GaloisKeys::generate(&f.sk, &[step], &mut f.rng);
        let want: Vec<f64> = (0..slots).map(|i| x[(i as i64 + step).rem_euclid(slots as i64) as usize]).collect();
        prop_assert!(precision_bits(&decrypt(&f, &f.ev.rotate(&ct, step, &gks).unwrap()), &want) >= 22.0);
        let h = f.ev.hoist(&ct);
        prop_assert!(precision_bits(&decrypt(&f, &f.ev.rotate_hoisted(&h, step, &gks).unwrap()), &want) >= 22.0);
    }
}

#[test]
fn parallel_evaluator_gives_identical_results() {
    let mut f = fixture(Preset::N8192Depth2Fast, 35);
    let (slots, scale, top) = (f.ctx.slots(), f.ctx.params().scale(), f.ctx.max_level());
    let x = values(slots, 35, 1.0);
    let ct = encrypt(&mut f, &x, top, scale);
    let steps = [1i64, 2, -3];
    let gks = GaloisKeys::generate(&f.sk, &steps, &mut f.rng);
    let par = Evaluator::new(&f.ctx).with_parallelism(true);
    let seq_r =
        f.ev.rotate_hoisted_many(&f.ev.hoist(&ct), &steps, &gks)
            .unwrap();
    let par_r = par
        .rotate_hoisted_many(&par.hoist(&ct), &steps, &gks)
        .unwrap();
    assert_eq!(seq_r, par_r);
    for (r, &s) in seq_r.iter().zip(&steps) {
        let want: Vec<f64> = (0..slots)
            .map(|i| x[(i as i64 + s).rem_euclid(slots as i64) as usize])
            .collect();
        assert!(precision_bits(&decrypt(&f, r), &want) >= 22.0);
    }
}

#[test]
fn objects_of_another_context_are_refused() {
    let mut a = fixture(Preset::N8192Depth2Fast, 36);
    let mut b = fixture(Preset::N16384Depth2Fast, 37);
    let (sa, sb) = (a.ctx.params().scale(), b.ctx.params().scale());
    let x = values(16, 36, 1.0);
    let ca = encrypt(&mut a, &x, 2, sa);
    let cb = encrypt(&mut b, &x, 2, sb);
    let pb = b.enc.encode(&x, 2, sb).unwrap();
    let gb = GaloisKeys::generate(&b.sk, &[1], &mut b.rng);
    let mismatch = |r: Result<Ciphertext>| matches!(r, Err(CkksError::ParameterMismatch { .. }));
    assert!(mismatch(a.ev.add(&ca, &cb)));
    assert!(mismatch(a.ev.add(&cb, &cb)));
    assert!(mismatch(a.ev.mul_plain(&ca, &pb)));
    assert!(mismatch(a.ev.rescale(&cb)));
    assert!(mismatch(a.ev.rotate(&ca, 1, &gb)));
    assert!(mismatch(a.ev.rotate(&cb, 1, &gb)));
    assert!(mismatch(a.ev.rotate_hoisted(&b.ev.hoist(&cb), 1, &gb)));
    let mut acc = a.ev.mul_accumulator(2).unwrap();
    assert!(matches!(
        acc.add_product(&ca, &pb),
        Err(CkksError::ParameterMismatch { .. })
    ));
    assert!(matches!(
        a.ev.mod_down(&b.ev.extend(&cb)),
        Err(CkksError::ParameterMismatch { .. })
    ));
}
