use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::*;
use crate::{CkksParameters, Encoder, Evaluator, GaloisKeys, Preset};

/// `3·2^58 − 104·2^16 + 1` (the masked-ring prime) and a 40-bit prime, both `≡ 1 mod 2^15`.
const T60: u64 = 0x0bff_ffff_ff98_0001;
const T40: u64 = 0xff_ffe8_0001;

struct Fixture {
    ctx: Arc<Context>,
    sk: SecretKey,
    pk: PublicKey,
}

/// N = 8192, chain 60, 40, 40 + 60 (Q = 140 bits at the top level).
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2).unwrap()).unwrap();
        let mut rng = ChaCha20Rng::from_seed([3; 32]);
        let sk = SecretKey::generate(&ctx, &mut rng);
        let pk = PublicKey::generate(&sk, &mut rng);
        Fixture { ctx, sk, pk }
    })
}

fn uniform(rng: &mut ChaCha20Rng, t: u64, n: usize) -> Vec<u64> {
    (0..n).map(|_| rng.random_range(0..t)).collect()
}

fn mul_mod(a: u64, b: u64, t: u64) -> u64 {
    (a as u128 * b as u128 % t as u128) as u64
}

#[test]
fn encryptions_decrypt_to_their_values_at_every_level() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([1; 32]);
    for t in [T40, T60] {
        let enc = BatchEncoder::new(&f.ctx, t).unwrap();
        let values = uniform(&mut rng, t, enc.slots());
        for level in 0..=f.ctx.max_level() {
            if t == T60 && level == 0 {
                continue; // q_0 = 60 bits leaves no room for a 60-bit message.
            }
            let ct = enc.encrypt_sk(&values, level, &f.sk, &mut rng).unwrap();
            let d = enc.decrypt(&ct.expand(), &f.sk).unwrap();
            assert_eq!(d.values, values, "t {t:#x}, level {level}");
            assert!(d.budget_bits > 5.0, "budget {}", d.budget_bits);
        }
    }
}

#[test]
fn a_short_vector_fills_the_rest_with_zeros() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([2; 32]);
    let enc = BatchEncoder::new(&f.ctx, T40).unwrap();
    let ct = enc
        .encrypt_sk(&[5, 7, T40 - 1], 2, &f.sk, &mut rng)
        .unwrap();
    let d = enc.decrypt(&ct.expand(), &f.sk).unwrap();
    assert_eq!(&d.values[..3], &[5, 7, T40 - 1]);
    assert!(d.values[3..].iter().all(|&v| v == 0));
}

#[test]
fn rotations_turn_each_row_as_they_turn_ckks_slots() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([4; 32]);
    let steps = [1i64, 5, -3];
    let gks = GaloisKeys::generate(&f.sk, &steps, &mut rng);
    let ev = Evaluator::new(&f.ctx);
    let enc = BatchEncoder::new(&f.ctx, T40).unwrap();
    let half = enc.slots() / 2;
    let values = uniform(&mut rng, T40, enc.slots());
    let ct = enc
        .encrypt_sk(&values, 2, &f.sk, &mut rng)
        .unwrap()
        .expand();
    // CKKS's convention, for comparison: slot j of a rotation by k holds slot j + k.
    let ck = Encoder::new(&f.ctx);
    let reals: Vec<f64> = (0..half).map(|j| j as f64).collect();
    let scale = f.ctx.params().scale();
    let cct = Encryptor::new(&f.ctx)
        .encrypt_sk(&ck.encode(&reals, 2, scale).unwrap(), &f.sk, &mut rng)
        .unwrap()
        .expand();
    for k in steps {
        let shift = |j: usize| (j as i64 + k).rem_euclid(half as i64) as usize;
        let got = enc
            .decrypt(&ev.rotate(&ct, k, &gks).unwrap(), &f.sk)
            .unwrap()
            .values;
        for j in 0..half {
            assert_eq!(got[j], values[shift(j)], "row 0, step {k}, slot {j}");
            assert_eq!(got[half + j], values[half + shift(j)], "row 1, step {k}");
        }
        let dec = Decryptor::new(&f.sk);
        let ckks = ck.decode(&dec.decrypt(&ev.rotate(&cct, k, &gks).unwrap()).unwrap());
        for j in [0, 1, half - 1] {
            assert!((ckks[j] - shift(j) as f64).abs() < 1e-3, "CKKS step {k}");
        }
    }
}

#[test]
fn sums_of_rotated_products_are_exact_and_survive_a_modulus_switch() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([5; 32]);
    let steps = [1i64, 2, 3];
    let gks = GaloisKeys::generate(&f.sk, &steps, &mut rng);
    let ev = Evaluator::new(&f.ctx);
    let enc = BatchEncoder::new(&f.ctx, T40).unwrap();
    let (n, half) = (enc.slots(), enc.slots() / 2);
    let x = uniform(&mut rng, T40, n);
    let ct = enc.encrypt_sk(&x, 2, &f.sk, &mut rng).unwrap().expand();
    // Σ_k rot_k(x) ⊙ w_k: the diagonal method's shape.
    let w: Vec<Vec<u64>> = (0..4).map(|_| uniform(&mut rng, T40, n)).collect();
    let mut acc = ev.mul_accumulator(2).unwrap();
    let rotated: Vec<Ciphertext> = (0..4)
        .map(|k| match k {
            0 => ct.clone(),
            k => ev.rotate(&ct, k, &gks).unwrap(),
        })
        .collect();
    for (c, wk) in rotated.iter().zip(&w) {
        acc.add_product(c, &enc.operand(wk, 2).unwrap()).unwrap();
    }
    let sum = acc.finish().unwrap();
    let expect: Vec<u64> = (0..n)
        .map(|j| {
            let (row, col) = (j / half, j % half);
            (0..4).fold(0u64, |s, k| {
                let xj = x[row * half + (col + k) % half];
                (s + mul_mod(xj, w[k][j], T40)) % T40
            })
        })
        .collect();
    let full = enc.decrypt(&sum, &f.sk).unwrap();
    assert_eq!(full.values, expect);
    let switched = ev.rescale(&sum).unwrap();
    let low = enc.decrypt(&switched, &f.sk).unwrap();
    assert_eq!(low.values, expect);
    assert!(full.budget_bits > 20.0, "budget {}", full.budget_bits);
}

#[test]
fn flooding_keeps_the_message_within_the_budget_and_spends_it() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([6; 32]);
    let enc = BatchEncoder::new(&f.ctx, T40).unwrap();
    let values = uniform(&mut rng, T40, enc.slots());
    let fresh = enc
        .encrypt_sk(&values, 2, &f.sk, &mut rng)
        .unwrap()
        .expand();
    // Q = 2^140, t = 2^40: noise below about 2^99 decrypts; 2^60 leaves about 39 bits.
    let mut ok = fresh.clone();
    flood(&mut ok, &f.pk, 60, &mut rng).unwrap();
    let after = enc.decrypt(&ok, &f.sk).unwrap();
    assert_eq!(after.values, values);
    assert!(
        (37.0..40.5).contains(&after.budget_bits),
        "flooded budget {} bits",
        after.budget_bits
    );
    assert_ne!(ok, fresh);
    // At level 0 (Q = 2^60) the same flooding drowns the message.
    let mut drowned = ev_drop(&fresh, 0);
    flood(&mut drowned, &f.pk, 61, &mut rng).unwrap();
    let d = enc.decrypt(&drowned, &f.sk).unwrap();
    assert_ne!(d.values, values);
}

fn ev_drop(ct: &Ciphertext, level: usize) -> Ciphertext {
    Evaluator::new(ct.context())
        .drop_to_level(ct, level)
        .unwrap()
}

#[test]
fn bad_input_gets_typed_errors() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([7; 32]);
    let bad_t = |t| {
        matches!(
            BatchEncoder::new(&f.ctx, t),
            Err(CkksError::InvalidPlaintextModulus { .. })
        )
    };
    assert!(bad_t(T40 + 2)); // not prime
    assert!(bad_t(12289)); // prime, but 2N = 16384 does not divide t − 1
    assert!(bad_t(f.ctx.prime(0))); // a ciphertext prime
    let enc = BatchEncoder::new(&f.ctx, T40).unwrap();
    assert!(matches!(
        enc.operand(&vec![0; enc.slots() + 1], 0),
        Err(CkksError::TooManyValues { .. })
    ));
    assert!(matches!(
        enc.operand(&[1, T40], 0),
        Err(CkksError::ValueOutOfRange { index: 1 })
    ));
    assert!(matches!(
        enc.encrypt_sk(&[1], 3, &f.sk, &mut rng),
        Err(CkksError::LevelOutOfRange { level: 3, max: 2 })
    ));
    let mut ct = enc.encrypt_sk(&[1], 0, &f.sk, &mut rng).unwrap().expand();
    assert!(flood(&mut ct, &f.pk, MAX_FLOOD_BITS + 1, &mut rng).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Decrypt(Enc(a) × operand(b)) = a ⊙ b mod t, slot by slot, for the 60-bit prime.
    #[test]
    fn products_are_slotwise_mod_t(seed in any::<[u8; 32]>(), len in 1usize..64) {
        let f = fixture();
        let mut rng = ChaCha20Rng::from_seed(seed);
        let enc = BatchEncoder::new(&f.ctx, T60).unwrap();
        let a = uniform(&mut rng, T60, enc.slots());
        let b = uniform(&mut rng, T60, len);
        let ct = enc.encrypt_sk(&a, 2, &f.sk, &mut rng).unwrap().expand();
        let prod = Evaluator::new(&f.ctx).mul_plain(&ct, &enc.operand(&b, 2).unwrap()).unwrap();
        let got = enc.decrypt(&prod, &f.sk).unwrap().values;
        for j in 0..enc.slots() {
            let bj = b.get(j).copied().unwrap_or(0);
            prop_assert_eq!(got[j], mul_mod(a[j], bj, T60));
        }
    }
}

#[test]
fn an_added_message_adds_slotwise_mod_t() {
    let f = fixture();
    let mut rng = ChaCha20Rng::from_seed([8; 32]);
    let enc = BatchEncoder::new(&f.ctx, T60).unwrap();
    let (a, b) = (
        uniform(&mut rng, T60, enc.slots()),
        uniform(&mut rng, T60, 100),
    );
    for level in 1..=2 {
        let mut ct = enc.encrypt_sk(&a, level, &f.sk, &mut rng).unwrap().expand();
        Evaluator::new(&f.ctx)
            .add_plain_assign(&mut ct, &enc.message(&b, level).unwrap())
            .unwrap();
        let got = enc.decrypt(&ct, &f.sk).unwrap().values;
        for (j, (&g, &x)) in got.iter().zip(&a).enumerate() {
            assert_eq!(
                g,
                (x + b.get(j).copied().unwrap_or(0)) % T60,
                "level {level}"
            );
        }
    }
}
