//! End-to-end on the real CKKS engine (N = 8192, chain 60,40,40 + 60): correctness against the
//! plaintext LoRA reference with bits of precision, and the leak test (every slot of every returned
//! ciphertext decrypted: delta slots match, all other slots are at the noise level).

mod common;

use cipherlora_ckks::{CkksParameters, Context, Preset};
use cipherlora_helora::planner::{best_per_family, choose};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{
    CkksClient, CkksServer, GroupPlan, GroupShape, Link, Mode, OpCosts, Rerandomization,
};
use common::{Outcome, random_adapter, random_x, run};

fn ckks_run(
    ctx: &std::sync::Arc<Context>,
    plan: &GroupPlan,
    shape: &GroupShape,
    seed: u64,
    rerand: Option<Rerandomization>,
) -> Outcome {
    let client = CkksClient::new(ctx).unwrap();
    let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
    let gks = client.galois_keys(&steps);
    let pk = rerand.map(|r| (client.public_key(), r));
    let server = CkksServer::new(ctx, gks, pk).unwrap();
    let adapter = random_adapter(shape, seed);
    let x = random_x(plan.t, shape.d_in, seed + 1);
    run(&server, &client, plan, &adapter, &x)
}

fn check(out: &Outcome, label: &str, min_bits: f64) {
    eprintln!(
        "{label}: max|Δ| = {:.3e}, max err = {:.3e} ({:.1} bits), max outside = {:.3e}",
        out.max_ref,
        out.max_err,
        out.bits(),
        out.max_outside
    );
    assert!(out.max_ref > 1e-3, "{label}: degenerate reference");
    assert!(
        out.bits() >= min_bits,
        "{label}: only {:.1} bits",
        out.bits()
    );
    // Leak-freedom: slots outside the deltas hold only noise, far below any weight product (a
    // mis-weighted partial sum would be of order max|Δ|).
    assert!(
        out.max_outside <= 1e-5 * out.max_ref,
        "{label}: {:.3e} outside the deltas",
        out.max_outside
    );
}

fn ctx() -> std::sync::Arc<Context> {
    Context::new(CkksParameters::preset(Preset::N8192Depth2).unwrap()).unwrap()
}

fn default_shape_planner_choice(mode: Mode, t: usize) {
    let ctx = ctx();
    let model = ModelShape::smollm2_135m();
    for (gi, (g, shape)) in model.groups.iter().enumerate() {
        let (plan, _) = choose(
            shape,
            mode,
            t,
            ctx.slots(),
            false,
            &OpCosts::default(),
            &Link::default(),
        )
        .unwrap();
        let out = ckks_run(&ctx, &plan, shape, 40 + gi as u64, None);
        check(
            &out,
            &format!("smollm2 {g} {mode:?} T={t} {}", plan.strategy()),
            20.0,
        );
    }
}

#[test]
fn smollm2_ffa_t1() {
    default_shape_planner_choice(Mode::Ffa, 1);
}

#[test]
fn smollm2_ffa_t9() {
    default_shape_planner_choice(Mode::Ffa, 9);
}

#[test]
fn smollm2_standard_t1() {
    default_shape_planner_choice(Mode::Standard, 1);
}

#[test]
fn smollm2_standard_t9() {
    default_shape_planner_choice(Mode::Standard, 9);
}

#[test]
fn smollm2_every_strategy_family_t5() {
    let ctx = ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[0];
    for mode in [Mode::Ffa, Mode::Standard] {
        for (plan, _) in best_per_family(
            shape,
            mode,
            5,
            ctx.slots(),
            false,
            &OpCosts::default(),
            &Link::default(),
        )
        .unwrap()
        {
            let out = ckks_run(&ctx, &plan, shape, 7, None);
            check(
                &out,
                &format!("smollm2 qkv {mode:?} T=5 {}", plan.strategy()),
                20.0,
            );
        }
    }
}

/// The dense standard layout (whole-ciphertext stage-A chunks, T' dividing the slots) on the real
/// engine: every baby-step family of the q,k,v group at a verify width (8) and the prefill width
/// (32), correct to 20 bits and at the noise level outside the deltas.
#[test]
fn smollm2_dense_standard_families_t8_t32() {
    let ctx = ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[0];
    for t in [8, 32] {
        let dense: Vec<GroupPlan> = best_per_family(
            shape,
            Mode::Standard,
            t,
            ctx.slots(),
            false,
            &OpCosts::default(),
            &Link::default(),
        )
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.strategy_family().starts_with("dense:"))
        .collect();
        assert!(dense.len() >= 4, "T={t}: {} dense families", dense.len());
        for plan in dense {
            let out = ckks_run(&ctx, &plan, shape, 9, None);
            check(
                &out,
                &format!("smollm2 qkv T={t} {}", plan.strategy()),
                20.0,
            );
        }
    }
}

#[test]
fn rerandomized_outputs_stay_correct() {
    let ctx = ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[1];
    for mode in [Mode::Ffa, Mode::Standard] {
        let (plan, _) = choose(
            shape,
            mode,
            9,
            ctx.slots(),
            true,
            &OpCosts::default(),
            &Link::default(),
        )
        .unwrap();
        assert!(plan.rerandomize);
        // Flooding adds noise of σ = 2^-20 to every slot, delta or not.
        let out = ckks_run(&ctx, &plan, shape, 11, Some(Rerandomization::default()));
        eprintln!(
            "rerandomized {mode:?}: {:.1} bits, outside {:.3e}",
            out.bits(),
            out.max_outside
        );
        assert!(out.bits() >= 12.0, "{mode:?}: {:.1} bits", out.bits());
        assert!(
            out.max_outside < 2f64.powi(-14),
            "{mode:?}: {:.3e}",
            out.max_outside
        );
    }
}

#[test]
#[ignore = "slow: Qwen2.5-3B shapes on real CKKS"]
fn qwen25_3b_planner_choice_t9() {
    let ctx = ctx();
    let model = ModelShape::qwen25_3b();
    for mode in [Mode::Ffa, Mode::Standard] {
        for (gi, (g, shape)) in model.groups.iter().enumerate() {
            let (plan, _) = choose(
                shape,
                mode,
                9,
                ctx.slots(),
                false,
                &OpCosts::default(),
                &Link::default(),
            )
            .unwrap();
            let out = ckks_run(&ctx, &plan, shape, 60 + gi as u64, None);
            check(
                &out,
                &format!("qwen {g} {mode:?} T=9 {}", plan.strategy()),
                20.0,
            );
        }
    }
}

#[test]
fn smollm2_t9_on_the_ifma_preset() {
    // The benchmark's default parameters: chain 50,40,40 + 50.
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let model = ModelShape::smollm2_135m();
    for mode in [Mode::Ffa, Mode::Standard] {
        for (gi, (g, shape)) in model.groups.iter().enumerate() {
            let (plan, _) = choose(
                shape,
                mode,
                9,
                ctx.slots(),
                false,
                &OpCosts::default(),
                &Link::default(),
            )
            .unwrap();
            let out = ckks_run(&ctx, &plan, shape, 80 + gi as u64, None);
            check(
                &out,
                &format!("smollm2 {g} {mode:?} T=9 fast {}", plan.strategy()),
                20.0,
            );
        }
    }
}

#[test]
#[ignore = "slow: bits-of-precision table for both shapes, all T, both modes"]
fn precision_table_all_shapes_all_t() {
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    for model in ModelShape::all() {
        for mode in [Mode::Ffa, Mode::Standard] {
            for t in [1, 5, 9, 17] {
                for (gi, (g, shape)) in model.groups.iter().enumerate() {
                    let (plan, _) = choose(
                        shape,
                        mode,
                        t,
                        ctx.slots(),
                        false,
                        &OpCosts::default(),
                        &Link::default(),
                    )
                    .unwrap();
                    let out = ckks_run(&ctx, &plan, shape, 100 + gi as u64, None);
                    check(&out, &format!("{} {g} {mode:?} T={t}", model.name), 20.0);
                }
            }
        }
    }
}

/// The same request answered by two servers, one compressing (default) and one not: the compressed
/// responses are smaller, decrypt to the uncompressed values within the compression's predicted
/// error, and the unpacked deltas match the plaintext reference (also with large activations, which
/// the client's normalisation brings back into range).
#[test]
fn compressed_responses_match_uncompressed_ones() {
    use cipherlora_helora::{GroupClient, PreparedGroup, ResponseCompression};
    use common::random_adapter;
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let model = ModelShape::smollm2_135m();
    let client = CkksClient::new(&ctx).unwrap();
    let mut total = (0usize, 0usize, 0usize);
    for mode in [Mode::Ffa, Mode::Standard] {
        for (gi, (g, shape)) in model.groups.iter().enumerate() {
            let (plan, _) = choose(
                shape,
                mode,
                5,
                ctx.slots(),
                false,
                &OpCosts::default(),
                &Link::default(),
            )
            .unwrap();
            let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
            let gks = client.galois_keys(&steps);
            let on = CkksServer::new(&ctx, gks.clone(), None).unwrap();
            assert_eq!(on.compression(), ResponseCompression::default());
            let off = CkksServer::new(&ctx, gks, None)
                .unwrap()
                .with_compression(ResponseCompression::Off);
            let adapter = random_adapter(shape, 200 + gi as u64);
            let gc = match mode {
                Mode::Ffa => {
                    let a: Vec<Vec<f32>> =
                        adapter.projections.iter().map(|p| p.a.clone()).collect();
                    GroupClient::ffa(&plan, &a).unwrap()
                }
                Mode::Standard => GroupClient::standard(&plan).unwrap(),
            };
            // Activations of very different magnitudes per position.
            let mut x = common::random_x(plan.t, shape.d_in, 300 + gi as u64);
            for (p, row) in x.chunks_mut(shape.d_in).enumerate() {
                let f = [1.0f32, 37.0, 0.01, 300.0, 2.5][p % 5];
                row.iter_mut().for_each(|v| *v *= f);
            }
            let prepared_on = PreparedGroup::new(&on, &plan, &adapter).unwrap();
            let prepared_off = PreparedGroup::new(&off, &plan, &adapter).unwrap();
            let (req, scales) = gc.encrypt(&client, &x).unwrap();
            let r_on = prepared_on.handle(&on, &req, 0).unwrap();
            let r_off = prepared_off.handle(&off, &req, 0).unwrap();
            let s_on = gc.decrypt_all(&client, &r_on).unwrap();
            let s_off = gc.decrypt_all(&client, &r_off).unwrap();
            for (c, (a, b)) in r_on.iter().zip(&r_off).enumerate() {
                let bound = prepared_on.output_bounds()[c];
                let p = on
                    .compression_params(ctx.params().scale(), bound)
                    .expect("the default shapes compress");
                assert_eq!(a.len(), 28 + p.poly_bytes(ctx.degree()));
                assert!(a.len() < b.len());
                total.0 += a.len();
                total.1 += b.len();
                total.2 += 1;
                let predicted =
                    p.predicted_error(ctx.degree(), ctx.params().moduli()[0], ctx.params().scale());
                let err = s_on[c]
                    .iter()
                    .zip(&s_off[c])
                    .map(|(u, v)| (u.re - v.re).abs().max((u.im - v.im).abs()))
                    .fold(0.0, f64::max);
                eprintln!(
                    "{g} {mode:?} ct {c}: bound {bound:.2}, {p:?}, {} → {} bytes, err {err:.2e} ≤ {predicted:.2e}",
                    b.len(),
                    a.len()
                );
                assert!(err <= predicted, "{err:e} > {predicted:e}");
                // The precision target relative to the bound holds.
                assert!(
                    predicted
                        <= bound * 2f64.powi(-(ResponseCompression::DEFAULT_BITS as i32)) * 1.01
                            + 1e-9
                );
            }
            // Deltas against the plaintext reference, position by position.
            let got = gc.deltas(&client, &r_on, &scales).unwrap();
            let want = adapter.reference_delta(&x).unwrap();
            for (p, (g_p, w_p)) in got.iter().zip(&want).enumerate() {
                let d = shape.d_outs[p];
                for pos in 0..plan.t {
                    let row = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                    let w = &w_p[pos * d..(pos + 1) * d];
                    let max_ref = row(w);
                    let err = g_p[pos * d..(pos + 1) * d]
                        .iter()
                        .zip(w)
                        .map(|(&a, &b)| (f64::from(a) - b).abs())
                        .fold(0.0, f64::max);
                    let bits = -(err / max_ref).log2();
                    assert!(
                        bits >= 18.0,
                        "{g} {mode:?} proj {p} pos {pos}: {bits:.1} bits"
                    );
                }
            }
        }
    }
    eprintln!(
        "{} ciphertexts: {} → {} bytes ({:.1} %)",
        total.2,
        total.1,
        total.0,
        100.0 * total.0 as f64 / total.1 as f64
    );
}

/// A client may ask for fewer bits per request (the first trips of a fixed-point round): the
/// responses shrink, stay within the asked precision relative to the output bound (against an
/// uncompressed server), never get more precise than the server's default, and never fewer than
/// `MIN_BITS`. The default model's first group (q,k,v) at T = 8 in `mode`: the planner's plan at
/// default costs, a client, and the Galois keys the plan needs.
fn first_group_at_t8(
    ctx: &std::sync::Arc<Context>,
    mode: Mode,
) -> (
    cipherlora_helora::GroupPlan,
    CkksClient,
    cipherlora_ckks::GaloisKeys,
) {
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    let (plan, _) = choose(
        shape,
        mode,
        8,
        ctx.slots(),
        false,
        &OpCosts::default(),
        &Link::default(),
    )
    .unwrap();
    let client = CkksClient::new(ctx).unwrap();
    let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
    let gks = client.galois_keys(&steps);
    (plan, client, gks)
}

#[test]
fn coarse_responses_are_smaller_and_within_the_asked_precision() {
    use cipherlora_helora::{GroupClient, PreparedGroup, ResponseCompression};
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    let (plan, client, gks) = first_group_at_t8(&ctx, Mode::Ffa);
    let on = CkksServer::new(&ctx, gks.clone(), None).unwrap();
    let off = CkksServer::new(&ctx, gks, None)
        .unwrap()
        .with_compression(ResponseCompression::Off);
    let adapter = common::random_adapter(shape, 77);
    let a: Vec<Vec<f32>> = adapter.projections.iter().map(|p| p.a.clone()).collect();
    let gc = GroupClient::ffa(&plan, &a).unwrap();
    let x = common::random_x(plan.t, shape.d_in, 78);
    let prepared_on = PreparedGroup::new(&on, &plan, &adapter).unwrap();
    let prepared_off = PreparedGroup::new(&off, &plan, &adapter).unwrap();
    let (req, _) = gc.encrypt(&client, &x).unwrap();
    let exact = gc
        .decrypt_all(&client, &prepared_off.handle(&off, &req, 0).unwrap())
        .unwrap();
    let size = |bits: u32| {
        let r = prepared_on.handle(&on, &req, bits).unwrap();
        let got = gc.decrypt_all(&client, &r).unwrap();
        for (c, (g, e)) in got.iter().zip(&exact).enumerate() {
            let bound = prepared_on.output_bounds()[c];
            let err = g
                .iter()
                .zip(e)
                .map(|(u, v)| (u.re - v.re).abs().max((u.im - v.im).abs()))
                .fold(0.0, f64::max);
            let asked = bits.clamp(
                ResponseCompression::MIN_BITS,
                ResponseCompression::DEFAULT_BITS,
            );
            let allowed = bound * 2f64.powi(-(asked as i32));
            assert!(err <= allowed, "{bits} bits, ct {c}: {err:e} > {allowed:e}");
        }
        r.iter().map(|c| c.len()).sum::<usize>()
    };
    let default = size(0);
    let (b16, b12) = (size(16), size(12));
    eprintln!("response bytes: default {default}, 16 bits {b16}, 12 bits {b12}");
    assert!(b12 < b16 && b16 < default);
    assert_eq!(size(40), default, "more bits than the default");
    assert_eq!(size(3), size(ResponseCompression::MIN_BITS));
}

/// The cost model's download size is the compressed size a default server sends (what `cipherlora
/// bench helora` reports as down MB).
#[test]
fn modelled_download_size_is_the_compressed_size() {
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let (_, down, _) = cipherlora_helora::measure::wire_sizes(&ctx).unwrap();
    let p = cipherlora_helora::measure::model_compression(&ctx).unwrap();
    assert_eq!(down as usize, 28 + p.poly_bytes(ctx.degree()));
    // Uncompressed: 16 + 8 + 2 × 8192 × 50 / 8.
    assert!(down < 0.8 * 102_424.0, "{down}");
}

/// A lossy upload (`GroupClient::encrypt_within`) is smaller by the bits it drops, and moves each
/// returned delta by at most the group's output bound times the error it allowed (plus the
/// evaluation's own noise), in both modes: what `upload_error` in the private client relies on.
#[test]
fn lossy_uploads_are_smaller_and_move_deltas_within_the_bound() {
    use cipherlora_helora::{GroupClient, PreparedGroup, ResponseCompression};
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast).unwrap()).unwrap();
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    for mode in [Mode::Ffa, Mode::Standard] {
        let (plan, client, gks) = first_group_at_t8(&ctx, mode);
        let server = CkksServer::new(&ctx, gks, None)
            .unwrap()
            .with_compression(ResponseCompression::Off);
        let adapter = common::random_adapter(shape, 91);
        let gc = match mode {
            Mode::Ffa => {
                let a: Vec<Vec<f32>> = adapter.projections.iter().map(|p| p.a.clone()).collect();
                GroupClient::ffa(&plan, &a).unwrap()
            }
            Mode::Standard => GroupClient::standard(&plan).unwrap(),
        };
        let x = common::random_x(plan.t, shape.d_in, 92);
        let prepared = PreparedGroup::new(&server, &plan, &adapter).unwrap();
        let answer = |max_error: f64| {
            let (req, _) = gc.encrypt_within(&client, &x, max_error).unwrap();
            let bytes: usize = req.iter().map(|c| c.len()).sum();
            let resp = prepared.handle(&server, &req, 0).unwrap();
            (bytes, gc.decrypt_all(&client, &resp).unwrap())
        };
        let (exact_bytes, exact) = answer(0.0);
        let mut last = exact_bytes;
        for max_error in [2f64.powi(-17), 2f64.powi(-13)] {
            let (bytes, got) = answer(max_error);
            assert!(
                bytes < last,
                "{mode:?} {max_error:e}: {bytes} ≥ {last} bytes"
            );
            last = bytes;
            let mut worst = 0.0f64;
            for (c, (g, e)) in got.iter().zip(&exact).enumerate() {
                let bound = prepared.output_bounds()[c];
                let err = g
                    .iter()
                    .zip(e)
                    .map(|(u, v)| (u.re - v.re).abs().max((u.im - v.im).abs()))
                    .fold(0.0, f64::max);
                let allowed = bound * (max_error + 2f64.powi(-20));
                assert!(err <= allowed, "{mode:?} ct {c}: {err:e} > {allowed:e}");
                worst = worst.max(err / bound);
            }
            eprintln!(
                "{mode:?}: max error {max_error:e} → {bytes} of {exact_bytes} bytes, \
                 worst delta error {worst:e} × bound"
            );
            assert!(worst > max_error / 4096.0, "{mode:?}: nothing was dropped?");
        }
    }
}
