//! The planner follows the measured costs: it trades server rotations for
//! client encryptions and upload bytes exactly when the costs say so.

use cipherlora_helora::planner::{candidates, choose};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{BabySteps, HeloraError, Link, Mode, OpCosts};

fn qkv() -> cipherlora_helora::GroupShape {
    ModelShape::smollm2_135m().groups[0].1.clone()
}

#[test]
fn expensive_rotations_and_free_link_choose_client_replication() {
    let costs = OpCosts {
        rotate_ms: [1e3; 4],
        hoist_ms: [1e3; 4],
        hoisted_rotate_ms: [1e3; 4],
        ..OpCosts::default()
    };
    let link = Link {
        bandwidth_mbit_s: 1e12,
        rtt_ms: 0.0,
    };
    let (p, e) = choose(&qkv(), Mode::Ffa, 9, 4096, false, &costs, &link).unwrap();
    assert_eq!(p.stage_b.baby, BabySteps::Client);
    assert_eq!(e.counts.rotations_total(), 0, "{}", p.strategy());
    assert_eq!(p.galois_steps().unwrap().len(), 0);
}

#[test]
fn slow_link_keeps_rotations_on_the_server() {
    let link = Link {
        bandwidth_mbit_s: 1.0,
        rtt_ms: 50.0,
    };
    let (p, e) = choose(
        &qkv(),
        Mode::Ffa,
        9,
        4096,
        false,
        &OpCosts::default(),
        &link,
    )
    .unwrap();
    assert!(p.stage_b.baby.on_server(), "{}", p.strategy());
    assert_eq!(e.counts.encryptions_total(), 1);
}

#[test]
fn chosen_plan_is_the_cheapest_candidate() {
    let (costs, link) = (OpCosts::default(), Link::default());
    for mode in [Mode::Ffa, Mode::Standard] {
        let (_, best) = choose(&qkv(), mode, 5, 4096, false, &costs, &link).unwrap();
        for p in candidates(&qkv(), mode, 5, 4096, false) {
            assert!(costs.estimate(&p, &link).unwrap().total_ms >= best.total_ms - 1e-9);
        }
    }
}

#[test]
fn too_many_positions_is_a_typed_error() {
    // 2048 dims × 4096 positions cannot fit 4096 slots.
    let r = choose(
        &qkv(),
        Mode::Standard,
        4096,
        4096,
        false,
        &OpCosts::default(),
        &Link::default(),
    );
    assert!(matches!(r, Err(HeloraError::NoFeasiblePlan { .. })));
}
