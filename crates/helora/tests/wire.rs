//! Wire formats: round trips, and typed errors (never panics) on malformed or foreign messages.

mod common;

use cipherlora_helora::planner::candidates;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::wire::{decode_plan, encode_plan};
use cipherlora_helora::{GroupClient, HeloraError, Mode, PreparedGroup, Reach, SlotSimulator};
use common::{random_adapter, random_x};

#[test]
fn plans_round_trip_and_ids_differ() {
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    let mut ids = std::collections::BTreeSet::new();
    for mode in [Mode::Ffa, Mode::Standard] {
        let all = candidates(shape, mode, 9, 4096, false);
        // The first 50, and every plan with dense FFA outputs (which differ from a plan reading
        // ahead only in their reach).
        let two_sided = all
            .iter()
            .skip(50)
            .filter(|p| p.stage_b.reach == Reach::TwoSided);
        for p in all.iter().take(50).chain(two_sided) {
            let bytes = encode_plan(p);
            assert_eq!(&decode_plan(&bytes).unwrap(), p);
            assert!(ids.insert(p.id()), "plan id collision");
        }
    }
    assert!(ids.len() > 100, "too few plans checked: {}", ids.len());
}

#[test]
fn truncated_or_corrupt_plans_are_typed_errors() {
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    let p = &candidates(shape, Mode::Standard, 5, 4096, true)[0];
    let bytes = encode_plan(p);
    for n in 0..bytes.len() {
        assert!(decode_plan(&bytes[..n]).is_err());
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(matches!(
        decode_plan(&extra),
        Err(HeloraError::Malformed { .. })
    ));
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    assert!(matches!(
        decode_plan(&bad),
        Err(HeloraError::Malformed { .. })
    ));
    // A structurally valid encoding of an infeasible plan is rejected too.
    let mut q = p.clone();
    q.stage_b.n_out = 1;
    assert!(decode_plan(&encode_plan(&q)).is_err());
}

/// The plan both halves run is the session's (its id is checked once per request by the service);
/// within it, the server checks the ciphertext count and each ciphertext's bytes, the client the
/// activations' shape.
#[test]
fn server_rejects_wrong_count_and_bad_bytes() {
    let shape = ModelShape::smollm2_135m().groups[1].1.clone();
    let sim = SlotSimulator::new(4096, 2).unwrap();
    let plans = candidates(&shape, Mode::Ffa, 9, 4096, false);
    let p = &plans[0];
    let adapter = random_adapter(&shape, 1);
    let server = PreparedGroup::new(&sim, p, &adapter).unwrap();
    let a: Vec<Vec<f32>> = adapter.projections.iter().map(|q| q.a.clone()).collect();
    let x = random_x(9, shape.d_in, 2);
    let mut cts = GroupClient::ffa(p, &a)
        .unwrap()
        .encrypt(&sim, &x)
        .unwrap()
        .0;
    assert!(server.handle(&sim, &cts, 0).is_ok());
    cts.push(cts[0].clone());
    assert!(matches!(
        server.handle(&sim, &cts, 0),
        Err(HeloraError::CiphertextCount { .. })
    ));
    cts.pop();
    cts[0].truncate(10);
    assert!(server.handle(&sim, &cts, 0).is_err());
    // The client rejects activations for the wrong T.
    let x8 = random_x(8, shape.d_in, 2);
    assert!(GroupClient::ffa(p, &a).unwrap().encrypt(&sim, &x8).is_err());
}
