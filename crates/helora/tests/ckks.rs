//! End-to-end on the real CKKS engine (N = 8192, chain 60,40,40 + 60):
//! correctness against the plaintext LoRA reference with bits of precision,
//! and the leak test (every slot of every returned ciphertext decrypted:
//! delta slots match, all other slots are at the noise level).

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
    // Leak-freedom: slots outside the deltas hold only noise, far below any
    // weight product (a mis-weighted partial sum would be of order max|Δ|).
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
