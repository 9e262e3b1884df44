//! Simulator-based checks at all required shapes, T and modes: correctness against the plaintext
//! LoRA reference, exact leak-freedom (every slot of every returned ciphertext), and agreement of
//! plan counts with what the simulator counted.

mod common;

use cipherlora_helora::planner::{best_per_family, choose};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{Link, Mode, OpCosts, SlotSimulator};
use common::{random_adapter, random_x, run};

const SLOTS: usize = 4096;

fn check_shape(model: &ModelShape, modes: &[Mode], ts: &[usize], all_families: bool) {
    let sim = SlotSimulator::new(SLOTS, 2).unwrap();
    let costs = OpCosts::default();
    let link = Link::default();
    for (gi, (gname, shape)) in model.groups.iter().enumerate() {
        let adapter = random_adapter(shape, 17 + gi as u64);
        for &mode in modes {
            for &t in ts {
                let x = random_x(t, shape.d_in, t as u64);
                let mut plans = vec![
                    choose(shape, mode, t, SLOTS, false, &costs, &link)
                        .unwrap()
                        .0,
                ];
                if all_families {
                    plans.extend(
                        best_per_family(shape, mode, t, SLOTS, false, &costs, &link)
                            .unwrap()
                            .into_iter()
                            .map(|(p, _)| p),
                    );
                }
                for plan in plans {
                    sim.reset_counts();
                    let out = run(&sim, &sim, &plan, &adapter, &x);
                    let label =
                        format!("{} {gname} {mode:?} T={t} {}", model.name, plan.strategy());
                    // Leak-freedom: exactly zero outside the delta slots.
                    assert_eq!(out.max_outside, 0.0, "{label}: non-zero outside deltas");
                    assert!(out.bits() > 40.0, "{label}: only {:.1} bits", out.bits());
                    // The plan's counts are what the evaluation did.
                    assert_eq!(sim.counts(), plan.counts().unwrap(), "{label}: counts");
                    assert_eq!(
                        sim.steps_used(),
                        plan.galois_steps().unwrap(),
                        "{label}: galois steps"
                    );
                }
            }
        }
    }
}

#[test]
fn smollm2_all_t_both_modes_every_strategy_family() {
    check_shape(
        &ModelShape::smollm2_135m(),
        &[Mode::Ffa, Mode::Standard],
        &[1, 5, 9, 17],
        true,
    );
}

#[test]
fn qwen25_3b_ffa_all_t() {
    check_shape(&ModelShape::qwen25_3b(), &[Mode::Ffa], &[1, 5, 9, 17], true);
}

#[test]
fn qwen25_3b_standard_all_t() {
    check_shape(
        &ModelShape::qwen25_3b(),
        &[Mode::Standard],
        &[1, 5, 9, 17],
        false,
    );
}

/// The server's output bounds hold for every returned slot part (exact simulator, inputs normalised
/// by the client, activations of very different magnitudes), and in standard mode they are
/// attained: with `x_p = sign(W_row)` for a row of the map `W = s·B·A`, the returned value of that
/// row is exactly `Σ_j |W_row,j|`.
#[test]
fn output_bounds_hold_and_are_attained() {
    use cipherlora_helora::{FusedGroup, GroupClient, PreparedGroup};
    let sim = SlotSimulator::new(SLOTS, 2).unwrap();
    let model = ModelShape::smollm2_135m();
    for (gi, (g, shape)) in model.groups.iter().enumerate() {
        let adapter = random_adapter(shape, 70 + gi as u64);
        for mode in [Mode::Ffa, Mode::Standard] {
            let t = 5;
            let (plan, _) = choose(
                shape,
                mode,
                t,
                SLOTS,
                false,
                &OpCosts::default(),
                &Link::default(),
            )
            .unwrap();
            let prepared = PreparedGroup::new(&sim, &plan, &adapter).unwrap();
            let bounds = prepared.output_bounds().to_vec();
            assert_eq!(bounds.len(), plan.stage_b.n_out);
            let gc = match mode {
                Mode::Ffa => {
                    let a: Vec<Vec<f32>> =
                        adapter.projections.iter().map(|p| p.a.clone()).collect();
                    GroupClient::ffa(&plan, &a).unwrap()
                }
                Mode::Standard => GroupClient::standard(&plan).unwrap(),
            };
            let mut x = random_x(t, shape.d_in, 9 + gi as u64);
            for (p, row) in x.chunks_mut(shape.d_in).enumerate() {
                let f = [1.0f32, 1e3, 1e-3, 3.0, 0.5][p];
                row.iter_mut().for_each(|v| *v *= f);
            }
            // Standard: position 0 is the sign pattern of fused row 7 of W.
            let fused = FusedGroup::new(&adapter).unwrap();
            let (row, r0) = (7, 0);
            let r = shape.ranks[0];
            let w: Vec<f64> = (0..shape.d_in)
                .map(|j| {
                    (0..r)
                        .map(|k| {
                            fused.b_blocks[0][row * r + k] * fused.a[(r0 + k) * shape.d_in + j]
                        })
                        .sum()
                })
                .collect();
            let exact: f64 = w.iter().map(|v| v.abs()).sum();
            if mode == Mode::Standard {
                for (o, &wj) in x[..shape.d_in].iter_mut().zip(&w) {
                    *o = if wj >= 0.0 { 1.0 } else { -1.0 };
                }
            }
            let (req, scales) = gc.encrypt(&sim, &x).unwrap();
            for &c in scales.factors() {
                assert_eq!(c, 2f64.powi(c.log2().round() as i32), "not a power of two");
            }
            let resp = prepared.handle(&sim, &req, 0).unwrap();
            let slots = gc.decrypt_all(&sim, &resp).unwrap();
            for (c, (vals, map)) in slots.iter().zip(gc.output_map()).enumerate() {
                for (v, parts) in vals.iter().zip(map) {
                    for (value, ix) in [v.re, v.im].into_iter().zip(parts) {
                        assert!(
                            value.abs() <= bounds[c] * (1.0 + 1e-12),
                            "{g} {mode:?} ct {c}: {value} above the bound {}",
                            bounds[c]
                        );
                        if mode == Mode::Standard
                            && *ix
                                == Some(cipherlora_helora::packing::DeltaIndex {
                                    proj: 0,
                                    row,
                                    pos: 0,
                                })
                        {
                            assert!(
                                (value - exact).abs() <= 1e-9 * exact,
                                "{g}: row {row} gives {value}, bound {exact}"
                            );
                            assert!(exact <= bounds[c] && exact >= 0.5 * bounds[c]);
                        }
                    }
                }
            }
            // And the unpacked deltas are the reference (scales undone).
            let got = gc.deltas(&sim, &resp, &scales).unwrap();
            let want = adapter.reference_delta(&x).unwrap();
            for (gp, wp) in got.iter().zip(&want) {
                for (&a, &b) in gp.iter().zip(wp) {
                    assert!(
                        (f64::from(a) - b).abs() <= 1e-5 * b.abs().max(1e-3),
                        "{a} vs {b}"
                    );
                }
            }
        }
    }
}

/// Dense FFA outputs ([`Reach::TwoSided`]) on the shape a session fuses when it groups four layers
/// (16 projections of rank 16, the default model's q,k,v,o): exact against the plaintext reference,
/// zero outside the deltas, counts as planned, and as few output ciphertexts as the deltas need,
/// where reading ahead leaves a quarter of every output ciphertext empty. T = 8 lays the dimensions
/// out cyclically (T' = 4 divides the slots), T = 9 does not (the lead costs dimensions).
#[test]
fn two_sided_reach_fills_every_output_dimension_of_a_four_layer_group() {
    use cipherlora_helora::planner::candidates;
    use cipherlora_helora::{GroupShape, PositionPacking, Reach};
    let model = ModelShape::smollm2_135m();
    let mut shape = GroupShape {
        d_in: 0,
        d_outs: Vec::new(),
        ranks: Vec::new(),
    };
    for _ in 0..4 {
        for (_, g) in &model.groups {
            shape.d_in += g.d_in;
            shape.d_outs.extend_from_slice(&g.d_outs);
            shape.ranks.extend_from_slice(&g.ranks);
        }
    }
    let sim = SlotSimulator::new(SLOTS, 2).unwrap();
    let adapter = random_adapter(&shape, 5);
    for (t, dense_n_out, ahead_n_out) in [(8, 6, 8), (9, 8, 11)] {
        let x = random_x(t, shape.d_in, 11);
        let pairs: Vec<_> = candidates(&shape, Mode::Ffa, t, SLOTS, false)
            .into_iter()
            .filter(|p| p.packing == PositionPacking::ComplexPairs)
            .collect();
        let fewest = |reach| {
            pairs
                .iter()
                .filter(|p| p.stage_b.reach == reach && p.stage_b.baby.on_server())
                .map(|p| p.stage_b.n_out)
                .min()
                .unwrap()
        };
        assert_eq!(fewest(Reach::Ahead), ahead_n_out, "T={t}: reading ahead");
        assert_eq!(fewest(Reach::TwoSided), dense_n_out, "T={t}: two-sided");
        for plan in pairs
            .iter()
            .filter(|p| p.stage_b.reach == Reach::TwoSided && [1, 4, 31].contains(&p.stage_b.g))
        {
            sim.reset_counts();
            let out = run(&sim, &sim, plan, &adapter, &x);
            let label = format!("T={t} {}", plan.strategy());
            assert_eq!(out.max_outside, 0.0, "{label}: non-zero outside deltas");
            assert!(out.bits() > 40.0, "{label}: only {:.1} bits", out.bits());
            assert_eq!(sim.counts(), plan.counts().unwrap(), "{label}: counts");
            assert_eq!(sim.steps_used(), plan.galois_steps().unwrap(), "{label}");
        }
    }
}

/// The dense standard layout (whole-ciphertext stage-A chunks when T' divides the slots) on the
/// default model's groups and the Qwen2.5-3B q,k,v group (R = 96, padded to 128): exact against
/// the plaintext reference, zero outside the deltas, counts and Galois steps as planned, and never
/// more uploaded or returned ciphertexts than the best other standard layout (strictly fewer of
/// both for the 135M q,k,v group at the prefill width).
#[test]
fn dense_standard_layout_fills_inputs_and_outputs() {
    use cipherlora_helora::planner::candidates;
    use cipherlora_helora::{GroupPlan, PositionPacking};
    let sim = SlotSimulator::new(SLOTS, 2).unwrap();
    let mut groups = ModelShape::smollm2_135m().groups;
    groups.push(ModelShape::qwen25_3b().groups[0].clone());
    for (gi, (gname, shape)) in groups.iter().enumerate() {
        let adapter = random_adapter(shape, 40 + gi as u64);
        for t in [2, 8, 32] {
            let x = random_x(t, shape.d_in, 3 + t as u64);
            let pairs: Vec<GroupPlan> = candidates(shape, Mode::Standard, t, SLOTS, false)
                .into_iter()
                .filter(|p| p.packing == PositionPacking::ComplexPairs)
                .collect();
            let (dense, other): (Vec<&GroupPlan>, Vec<&GroupPlan>) =
                pairs.iter().partition(|p| p.dense_standard());
            let label = format!("{gname} T={t}");
            assert!(!dense.is_empty(), "{label}: no dense candidate");
            let fewest = |plans: &[&GroupPlan]| {
                (
                    plans.iter().map(|p| p.input_cts().unwrap()).min().unwrap(),
                    plans.iter().map(|p| p.stage_b.n_out).min().unwrap(),
                )
            };
            let (dense_in, dense_out) = fewest(&dense);
            let (other_in, other_out) = fewest(&other);
            assert!(
                dense_in <= other_in && dense_out <= other_out,
                "{label}: dense {dense_in}/{dense_out} vs {other_in}/{other_out}"
            );
            // Ciphertexts both ways of one plan: strictly fewer for q,k,v at the prefill width.
            let moved = |plans: &[&GroupPlan]| {
                plans
                    .iter()
                    .map(|p| p.input_cts().unwrap() + p.stage_b.n_out)
                    .min()
                    .unwrap()
            };
            if *gname == "qkv" && shape.d_in == 576 && t == 32 {
                assert!(
                    moved(&dense) < moved(&other),
                    "{label}: {} vs {}",
                    moved(&dense),
                    moved(&other)
                );
            }
            for plan in dense.iter().filter(|p| [1, 4].contains(&p.stage_b.g)) {
                sim.reset_counts();
                let out = run(&sim, &sim, plan, &adapter, &x);
                let label = format!("{label} {}", plan.strategy());
                assert_eq!(out.max_outside, 0.0, "{label}: non-zero outside deltas");
                assert!(out.bits() > 40.0, "{label}: only {:.1} bits", out.bits());
                assert_eq!(sim.counts(), plan.counts().unwrap(), "{label}: counts");
                assert_eq!(sim.steps_used(), plan.galois_steps().unwrap(), "{label}");
            }
        }
    }
}
