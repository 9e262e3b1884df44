//! Simulator-based checks at all required shapes, T and modes: correctness
//! against the plaintext LoRA reference, exact leak-freedom (every slot of
//! every returned ciphertext), and agreement of plan counts with what the
//! simulator counted.

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
