//! A group's request as the server sees it: typed errors (never panics) on a wrong count or bad
//! ciphertext bytes.

mod common;

use cipherlora_helora::planner::candidates;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{GroupClient, HeloraError, Mode, PreparedGroup, SlotSimulator};
use common::{random_adapter, random_x};

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
