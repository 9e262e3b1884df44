//! Property: for random small shapes, T, slot counts and every candidate plan, the counts the plan
//! predicts equal what the simulator counted, the Galois steps equal the rotations used, and the
//! result is exact and leak-free.

mod common;

use cipherlora_helora::planner::candidates;
use cipherlora_helora::{
    GroupPlan, GroupShape, Mode, PositionPacking, PreparedGroup, SlotSimulator,
};
use common::{random_adapter, random_x, run};
use proptest::prelude::*;

fn shape_strategy() -> impl Strategy<Value = GroupShape> {
    (
        4usize..40,
        prop::collection::vec((1usize..30, 1usize..6), 1..4),
        any::<bool>(),
    )
        .prop_map(|(d_in, projs, equal_ranks)| GroupShape {
            d_in,
            d_outs: projs.iter().map(|p| p.0).collect(),
            // Equal ranks half the time, so segmented stage-A plans are drawn.
            ranks: projs
                .iter()
                .map(|p| if equal_ranks { projs[0].1 } else { p.1 })
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn plan_counts_equal_simulated_counts(
        shape in shape_strategy(),
        t in 1usize..6,
        slots_log in 7u32..10,
        standard in any::<bool>(),
        pick in any::<prop::sample::Index>(),
        rerandomize in any::<bool>(),
    ) {
        let slots = 1usize << slots_log;
        let mode = if standard { Mode::Standard } else { Mode::Ffa };
        let plans = candidates(&shape, mode, t, slots, rerandomize);
        prop_assume!(!plans.is_empty());
        let plan = &plans[pick.index(plans.len())];
        let sim = SlotSimulator::new(slots, 2).unwrap();
        let adapter = random_adapter(&shape, 5);
        let x = random_x(t, shape.d_in, 9);
        let out = run(&sim, &sim, plan, &adapter, &x);
        prop_assert_eq!(out.max_outside, 0.0);
        prop_assert!(out.max_err <= 1e-9 * out.max_ref.max(1.0));
        prop_assert_eq!(sim.counts(), plan.counts().unwrap());
        prop_assert_eq!(sim.steps_used(), plan.galois_steps().unwrap());
        // The server holds one diagonal per product: what a session's memory budget reserves
        // (GroupPlan::diagonal_bytes) is exact.
        let prepared = PreparedGroup::new(&sim, plan, &adapter).unwrap();
        let counts = plan.counts().unwrap();
        prop_assert_eq!(prepared.diagonal_counts(), (counts.ct_pt, counts.ext_ct_pt));
        let limbs: u64 = (0..4)
            .map(|l| counts.ct_pt[l] * (l as u64 + 1) + counts.ext_ct_pt[l] * (l as u64 + 2))
            .sum();
        prop_assert_eq!(plan.diagonal_bytes().unwrap(), limbs * 16 * slots as u64);
    }

    /// Two positions per complex slot are invisible to the server: a pairs plan for T has the
    /// layout, operation counts and Galois steps of the one-position-per-slot plan for ⌈T/2⌉ (only
    /// the client's mapping of positions differs).
    #[test]
    fn pairs_plan_is_the_real_plan_at_half_t(
        shape in shape_strategy(),
        t in 2usize..12,
        slots_log in 7u32..10,
        standard in any::<bool>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mode = if standard { Mode::Standard } else { Mode::Ffa };
        let pairs: Vec<GroupPlan> = candidates(&shape, mode, t, 1 << slots_log, false)
            .into_iter()
            .filter(|p| p.packing == PositionPacking::ComplexPairs)
            .collect();
        prop_assume!(!pairs.is_empty());
        let p = &pairs[pick.index(pairs.len())];
        let real = GroupPlan { t: t.div_ceil(2), packing: PositionPacking::Real, ..p.clone() };
        prop_assert_eq!(p.slot_positions(), real.slot_positions());
        prop_assert_eq!(p.layout().unwrap(), real.layout().unwrap());
        prop_assert_eq!(p.counts().unwrap(), real.counts().unwrap());
        prop_assert_eq!(p.galois_steps().unwrap(), real.galois_steps().unwrap());
        prop_assert_ne!(p.id(), real.id());
    }
}
