//! Differential tests against an independent schoolbook negacyclic convolution (O(N²), exact
//! 128-bit) for ct×pt → rescale → rotate: products prime for prime, the rescale identity, and
//! rotation slots against the plaintext reference.

use std::f64::consts::PI;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::*;

/// Schoolbook negacyclic product modulo q (inputs in `[0, q)`, q < 2^51).
fn negacyclic(a: &[u64], b: &[u64], q: u64) -> Vec<u64> {
    let n = a.len();
    let mut pos = vec![0u128; n];
    let mut neg = vec![0u128; n];
    for (i, &x) in a.iter().enumerate() {
        if x == 0 {
            continue;
        }
        for (j, &y) in b.iter().enumerate() {
            let p = x as u128 * y as u128;
            let k = i + j;
            if k < n {
                pos[k] += p;
            } else {
                neg[k - n] += p;
            }
        }
    }
    let q128 = q as u128;
    pos.iter()
        .zip(&neg)
        .map(|(&p, &m)| ((p % q128 + q128 - m % q128) % q128) as u64)
        .collect()
}

fn coeffs(ctx: &Context, ntt: &[u64], limbs: usize) -> Vec<Vec<u64>> {
    let n = ctx.degree();
    (0..limbs)
        .map(|i| {
            let mut v = ntt[i * n..(i + 1) * n].to_vec();
            ctx.inv(i, &mut v);
            v
        })
        .collect()
}

fn centered(x: i128, q: i128) -> i128 {
    let r = x.rem_euclid(q);
    if r > q / 2 { r - q } else { r }
}

/// CRT of two residues to the balanced representative modulo q0·q1.
fn crt2(a0: u64, a1: u64, q0: u64, q1: u64) -> i128 {
    let m1 = crate::modular::Modulus::new(q1);
    let inv = m1.inv(m1.reduce(q0));
    let t = m1.mul(m1.sub(a1, m1.reduce(a0)), inv);
    centered(a0 as i128 + q0 as i128 * t as i128, q0 as i128 * q1 as i128)
}

#[test]
fn schoolbook_chain_ct_pt_rescale_rotate() {
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let n = ctx.degree();
    let slots = n / 2;
    let mut rng = ChaCha20Rng::from_seed([42; 32]);
    let sk = SecretKey::generate(&ctx, &mut rng);
    let enc = Encoder::new(&ctx);
    let ev = Evaluator::new(&ctx);
    let scale = ctx.params().scale();
    let x: Vec<f64> = (0..slots)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 25.0)
        .collect();
    let w: Vec<f64> = (0..slots)
        .map(|i| ((i * 11 % 53) as f64 - 26.0) / 13.0)
        .collect();
    let ct = Encryptor::new(&ctx)
        .encrypt_sk(&enc.encode(&x, 2, scale).unwrap(), &sk, &mut rng)
        .unwrap()
        .expand();
    let pt = enc.encode(&w, 2, scale).unwrap();

    // 1. ct×pt against schoolbook products, every prime.
    let prod = ev.mul_plain(&ct, &pt).unwrap();
    let (c0, c1) = (coeffs(&ctx, &ct.c0, 3), coeffs(&ctx, &ct.c1, 3));
    let mut p = coeffs(&ctx, &pt.data, 3);
    for (i, limb) in p.iter_mut().enumerate() {
        ctx.normalize(i, limb); // plaintexts are stored N-scaled
    }
    let (d0, d1) = (coeffs(&ctx, &prod.c0, 3), coeffs(&ctx, &prod.c1, 3));
    for i in 0..3 {
        let q = ctx.prime(i);
        assert_eq!(d0[i], negacyclic(&c0[i], &p[i], q), "c0·pt mod q_{i}");
        assert_eq!(d1[i], negacyclic(&c1[i], &p[i], q), "c1·pt mod q_{i}");
    }

    // 2. rescale: defining identity, coefficient by coefficient.
    let rs = ev.rescale(&prod).unwrap();
    assert_eq!(rs.level(), 1);
    assert_eq!(rs.scale(), prod.scale() / ctx.prime(2) as f64);
    let q2 = ctx.prime(2) as i128;
    for (before, after) in [
        (&d0, coeffs(&ctx, &rs.c0, 2)),
        (&d1, coeffs(&ctx, &rs.c1, 2)),
    ] {
        for k in 0..n {
            let r = centered(before[2][k] as i128, q2);
            for j in 0..2 {
                let qj = ctx.prime(j) as i128;
                let lhs = (q2 * after[j][k] as i128 + r).rem_euclid(qj);
                assert_eq!(
                    lhs, before[j][k] as i128,
                    "rescale identity, prime {j}, coeff {k}"
                );
            }
        }
    }

    // 3. rotate by 3: schoolbook decryption vs σ_g on coefficients.
    let step = 3i64;
    let gks = GaloisKeys::generate(&sk, &[step], &mut rng);
    let rot = ev.rotate(&rs, step, &gks).unwrap();
    let s = coeffs(&ctx, &sk.s_ntt, 2);
    let (q0, q1) = (ctx.prime(0), ctx.prime(1));
    let naive_decrypt = |ct: &Ciphertext| -> Vec<i128> {
        let (a0, a1) = (coeffs(&ctx, &ct.c0, 2), coeffs(&ctx, &ct.c1, 2));
        let m: Vec<Vec<u64>> = (0..2)
            .map(|i| {
                let q = ctx.prime(i);
                let c1s = negacyclic(&a1[i], &s[i], q);
                a0[i].iter().zip(&c1s).map(|(&u, &v)| (u + v) % q).collect()
            })
            .collect();
        (0..n).map(|k| crt2(m[0][k], m[1][k], q0, q1)).collect()
    };
    let m = naive_decrypt(&rs);
    let m_rot = naive_decrypt(&rot);
    let g = ctx.galois_element(step) as usize;
    let mut expect = vec![0i128; n];
    for (i, &c) in m.iter().enumerate() {
        let e = i * g % (2 * n);
        if e < n {
            expect[e] += c;
        } else {
            expect[e - n] -= c;
        }
    }
    let max_diff = expect
        .iter()
        .zip(&m_rot)
        .map(|(a, b)| (a - b).abs())
        .max()
        .unwrap();
    assert!(
        max_diff < 1 << 24,
        "key-switching noise too large: {max_diff}"
    );

    // Naive canonical embedding of the rotated plaintext vs the reference.
    let scale_out = rot.scale();
    for k in [0usize, 1, 100, slots - 1] {
        let mut e = 1usize;
        for _ in 0..k {
            e = e * 5 % (2 * n);
        }
        let re: f64 = m_rot
            .iter()
            .enumerate()
            .map(|(j, &c)| c as f64 * (PI * (e * j % (2 * n)) as f64 / n as f64).cos())
            .sum();
        let want = x[(k + 3) % slots] * w[(k + 3) % slots];
        assert!(
            (re / scale_out - want).abs() < 1e-6,
            "slot {k}: {} vs {want}",
            re / scale_out
        );
    }
}
