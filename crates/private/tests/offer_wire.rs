//! The session protocol's messages (plan request, offer and its plans, public lora_A): round trips
//! against offers a real [`HeAdapter`] makes, and every malformed input a typed error, never a
//! panic.

use cipherlora_helora::planner::candidates;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{GroupAdapter, Mode, ProjectionAdapter, Reach};
use cipherlora_model::{Proj, ProjGroup};
use cipherlora_private::protocol::*;
use cipherlora_private::{AdapterGroups, HeAdapter, LayerGroup, PrivateError};
use cipherlora_proto::v1;
use proptest::prelude::*;
use prost::Message;

fn groups(kind: LoraKind) -> AdapterGroups {
    let proj = |name: &str, d_out: usize, seed: f32| ProjectionAdapter {
        name: name.into(),
        d_out,
        rank: 2,
        a: (0..2 * 8).map(|i| seed + i as f32 / 16.0).collect(),
        b: (0..d_out * 2).map(|i| i as f32 / 32.0).collect(),
        scaling: 2.0,
    };
    let layer = |layer: usize| {
        [
            LayerGroup::new(
                layer,
                ProjGroup::Qkv,
                GroupAdapter {
                    d_in: 8,
                    projections: vec![proj("q_proj", 8, 0.5), proj("v_proj", 4, -0.5)],
                },
            ),
            LayerGroup::new(
                layer,
                ProjGroup::O,
                GroupAdapter {
                    d_in: 8,
                    projections: vec![proj("o_proj", 8, 0.25)],
                },
            ),
        ]
    };
    AdapterGroups {
        kind,
        groups: layer(0).into_iter().chain(layer(3)).collect(),
        acceptance: None,
    }
}

fn offer(kind: LoraKind) -> SessionOffer {
    HeAdapter::new(groups(kind)).offer(5).unwrap()
}

fn same(a: &SessionOffer, b: &SessionOffer) {
    assert_eq!(
        (
            a.preset,
            a.t,
            a.kind,
            a.grouping,
            a.server_cost_ratio,
            a.acceptance
        ),
        (
            b.preset,
            b.t,
            b.kind,
            b.grouping,
            b.server_cost_ratio,
            b.acceptance
        )
    );
    assert_eq!(a.groups.len(), b.groups.len());
    for (x, y) in a.groups.iter().zip(&b.groups) {
        assert_eq!((x.layer, x.group), (y.layer, y.group));
        assert_eq!(x.projections, y.projections);
        assert_eq!(x.plan, y.plan);
        assert_eq!(x.public_a, y.public_a);
    }
}

/// The offer carries no lora_A; attaching it from the info restores the server's offer.
#[test]
fn offer_round_trips_ffa_and_standard_with_lora_a_attached() {
    for kind in [LoraKind::Ffa, LoraKind::Standard] {
        let o = offer(kind);
        assert_eq!(o.groups.len(), 4);
        assert_eq!(o.groups[0].public_a.is_some(), kind == LoraKind::Ffa);
        let mut got = decode_offer(&encode_offer(&o)).unwrap();
        assert!(got.groups.iter().all(|g| g.public_a.is_none()));
        let a = decode_public_a(&encode_public_a(&groups(kind).public_a())).unwrap();
        attach_public_a(&mut got, &a).unwrap();
        same(&got, &o);
    }
}

/// The cost ratio round-trips; a non-finite or absurd one is malformed.
#[test]
fn offer_cost_ratio_round_trips_and_bad_ones_are_rejected() {
    let mut o = offer(LoraKind::Standard);
    o.server_cost_ratio = 0.6;
    assert_eq!(
        decode_offer(&encode_offer(&o)).unwrap().server_cost_ratio,
        0.6
    );
    for bad in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1000.0] {
        o.server_cost_ratio = bad;
        let e = decode_offer(&encode_offer(&o)).unwrap_err();
        assert!(e.to_string().contains("cost ratio"), "{bad}: {e}");
    }
}

/// The acceptance hint round-trips; one outside (0, 1) is malformed.
#[test]
fn offer_acceptance_hint_round_trips_and_bad_ones_are_rejected() {
    let mut g = groups(LoraKind::Ffa);
    g.acceptance = Some(0.885);
    let mut o = HeAdapter::new(g).offer(5).unwrap();
    assert_eq!(o.acceptance, Some(0.885));
    assert_eq!(
        decode_offer(&encode_offer(&o)).unwrap().acceptance,
        Some(0.885)
    );
    o.acceptance = None;
    assert_eq!(decode_offer(&encode_offer(&o)).unwrap().acceptance, None);
    for bad in [f64::NAN, 0.0, 1.0, 1.5] {
        o.acceptance = Some(bad);
        let e = decode_offer(&encode_offer(&o)).unwrap_err();
        assert!(e.to_string().contains("acceptance"), "{bad}: {e}");
    }
}

/// Grouped by layer, the client rebuilds the server's zero-padded lora_A.
#[test]
fn offer_grouped_by_layer_round_trips_with_padded_lora_a() {
    let server = HeAdapter::new(groups(LoraKind::Ffa));
    let o = server.offer_grouped(5, Grouping::BY_LAYER).unwrap();
    assert_eq!(o.grouping, Grouping::BY_LAYER);
    assert_eq!(o.groups.len(), 2);
    assert_eq!(
        o.groups[0].projections,
        [(0, Proj::Q), (0, Proj::V), (0, Proj::O)]
    );
    assert_eq!(o.groups[0].plan.shape.d_in, 16);
    let a = &o.groups[0].public_a.as_ref().unwrap()[2];
    // o_proj's lora_A row 1 sits in columns 8..16 of the fused input.
    assert!(a[16..24].iter().all(|&v| v == 0.0));
    assert_eq!(a[24], 0.25 + 8.0 / 16.0);
    let mut got = decode_offer(&encode_offer(&o)).unwrap();
    let public = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa).public_a())).unwrap();
    attach_public_a(&mut got, &public).unwrap();
    same(&got, &o);
    let std = HeAdapter::new(groups(LoraKind::Standard));
    let o = std.offer_grouped(5, Grouping::BY_LAYER).unwrap();
    assert_eq!((o.grouping, o.groups.len()), (Grouping::ByInput, 4));
}

/// Two layers per group: layer 3's lora_A lands after layer 0's inputs.
#[test]
fn offer_grouped_by_two_layers_round_trips_with_padded_lora_a() {
    let server = HeAdapter::new(groups(LoraKind::Ffa));
    let o = server.offer_grouped(5, Grouping::ByLayers(2)).unwrap();
    assert_eq!(o.grouping, Grouping::ByLayers(2));
    assert_eq!(o.groups.len(), 1);
    let g = &o.groups[0];
    assert_eq!((g.layer, g.group), (0, ProjGroup::Qkv));
    assert_eq!(
        g.projections,
        [
            (0, Proj::Q),
            (0, Proj::V),
            (0, Proj::O),
            (3, Proj::Q),
            (3, Proj::V),
            (3, Proj::O)
        ]
    );
    assert_eq!(g.plan.shape.d_in, 32);
    // Layer 3's o_proj, row 0: columns 24..32 of the fused input.
    let a = &g.public_a.as_ref().unwrap()[5];
    assert!(a[..24].iter().all(|&v| v == 0.0));
    assert_eq!(a[24], 0.25);
    let mut got = decode_offer(&encode_offer(&o)).unwrap();
    let public = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa).public_a())).unwrap();
    attach_public_a(&mut got, &public).unwrap();
    same(&got, &o);
    // More layers than the adapter has: the same one group.
    let most = server
        .offer_grouped(5, Grouping::ByLayers(Grouping::MAX_LAYERS))
        .unwrap();
    assert_eq!(most.groups.len(), 1);
    // Out of range: a typed error, not a panic or a silent default.
    for n in [0, Grouping::MAX_LAYERS + 1] {
        let e = server.offer_grouped(5, Grouping::ByLayers(n)).unwrap_err();
        assert!(matches!(e, PrivateError::LayersPerGroup { .. }), "{e}");
    }
}

#[test]
fn offer_grouped_by_layer_refuses_projections_out_of_order() {
    let mut o = HeAdapter::new(groups(LoraKind::Ffa))
        .offer_grouped(5, Grouping::BY_LAYER)
        .unwrap();
    o.groups[0].projections.swap(0, 2);
    assert!(decode_offer(&encode_offer(&o)).is_err());
    let mut o = offer(LoraKind::Ffa);
    o.groups[0].projections.push((0, Proj::O));
    assert!(decode_offer(&encode_offer(&o)).is_err());
    // A projection of another layer in a group by input.
    let mut o = offer(LoraKind::Ffa);
    o.groups[0].projections[1].0 = 3;
    assert!(decode_offer(&encode_offer(&o)).is_err());
    // A group by layers spanning more layers than the grouping says.
    let mut o = HeAdapter::new(groups(LoraKind::Ffa))
        .offer_grouped(5, Grouping::ByLayers(2))
        .unwrap();
    o.grouping = Grouping::BY_LAYER;
    assert!(decode_offer(&encode_offer(&o)).is_err());
}

#[test]
fn regression_ffa_offer_bytes_do_not_repeat_the_lora_a() {
    let mut o = offer(LoraKind::Ffa);
    let with = encode_offer(&o).encoded_len();
    for g in &mut o.groups {
        g.public_a = None;
    }
    assert_eq!(encode_offer(&o).encoded_len(), with);
}

#[test]
fn attach_public_a_refuses_missing_or_misshapen_matrices() {
    let mut got = decode_offer(&encode_offer(&offer(LoraKind::Ffa))).unwrap();
    let mut a = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa).public_a())).unwrap();
    let last = a.pop().unwrap();
    assert!(attach_public_a(&mut got, &a).is_err());
    a.push(PublicA {
        rank: last.rank + 1,
        ..last
    });
    assert!(attach_public_a(&mut got, &a).is_err());
}

#[test]
fn plan_request_round_trips_and_rejects_bad_t() {
    for (t, offer_only, grouping) in [
        (1, false, Grouping::ByInput),
        (5, true, Grouping::BY_LAYER),
        (MAX_T, false, Grouping::BY_LAYER),
        (9, true, Grouping::ByLayers(Grouping::MAX_LAYERS)),
    ] {
        let r = PlanRequest {
            t,
            offer_only,
            grouping,
        };
        assert_eq!(PlanRequest::from_proto(&r.to_proto()).unwrap(), r);
    }
    for t in [0, MAX_T + 1] {
        let m = PlanRequest {
            t,
            offer_only: false,
            grouping: Grouping::ByInput,
        }
        .to_proto();
        assert!(PlanRequest::from_proto(&m).is_err());
    }
    let mut m = PlanRequest {
        t: 5,
        offer_only: false,
        grouping: Grouping::ByInput,
    }
    .to_proto();
    m.layers_per_group = Grouping::MAX_LAYERS as u32 + 1;
    assert!(PlanRequest::from_proto(&m).is_err());
}

#[test]
fn public_a_round_trips() {
    let g = groups(LoraKind::Ffa);
    let got = decode_public_a(&encode_public_a(&g.public_a())).unwrap();
    assert_eq!(got.len(), 6);
    assert_eq!(got[1].proj, Proj::V);
    assert_eq!(got[1].layer, 0);
    assert_eq!(got[5].layer, 3);
    assert_eq!(got[1].a, g.groups[0].adapter.projections[1].a);
}

#[test]
fn offer_with_foreign_values_is_refused() {
    let good = encode_offer(&offer(LoraKind::Ffa));
    let refused = |edit: &dyn Fn(&mut v1::SessionOffer)| {
        let mut m = good.clone();
        edit(&mut m);
        decode_offer(&m).is_err()
    };
    assert!(decode_offer(&good).is_ok());
    assert!(refused(&|m| m.ckks_preset = "n4096".into()));
    assert!(refused(&|m| m.kind = 7));
    // Kind flipped to standard: the FFA plans no longer match.
    assert!(refused(&|m| m.kind = v1::LoraKind::Standard.into()));
    assert!(refused(&|m| m.positions = 0));
    assert!(refused(&|m| m.positions = MAX_T as u32 + 1));
    assert!(refused(&|m| m.groups[0].plan = None));
    assert!(refused(&|m| m.groups[0].group = 9));
    assert!(refused(&|m| m.groups[0].projections[0].projection = 7));
    assert!(refused(&|m| m.groups[1] = m.groups[0].clone()));
    assert!(refused(&|m| m.groups[0].projections.clear()));
    assert!(refused(&|m| {
        if let Some(p) = &mut m.groups[0].plan {
            p.positions += 1;
        }
    }));
    assert!(refused(&|m| {
        if let Some(p) = &mut m.groups[0].plan {
            p.stage_b = None;
        }
    }));
    // Non-finite or misshapen lora_A.
    let public = encode_public_a(&groups(LoraKind::Ffa).public_a());
    let mut nan = public.clone();
    nan.projections[0].values[0] = f32::NAN;
    assert!(decode_public_a(&nan).is_err());
    let mut short = public;
    short.projections[0].values.pop();
    assert!(decode_public_a(&short).is_err());
}

proptest! {
    #[test]
    fn decoders_never_panic_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(m) = v1::SessionOffer::decode(bytes.as_slice()) {
            let _ = decode_offer(&m);
        }
        if let Ok(m) = v1::PublicLoraA::decode(bytes.as_slice()) {
            let _ = decode_public_a(&m);
        }
        if let Ok(m) = v1::PlanRequest::decode(bytes.as_slice()) {
            let _ = PlanRequest::from_proto(&m);
        }
    }

    #[test]
    fn decoders_never_panic_on_mutated_offers(i in any::<usize>(), v in any::<u8>(), cut in any::<usize>()) {
        let good = encode_offer(&offer(LoraKind::Standard)).encode_to_vec();
        let mut b = good.clone();
        let i = i % b.len();
        b[i] = v;
        for bytes in [&b[..], &good[..cut % good.len()]] {
            if let Ok(m) = v1::SessionOffer::decode(bytes) {
                let _ = decode_offer(&m);
            }
        }
    }
}

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
            let m = encode_plan(p);
            let back = v1::GroupPlan::decode(m.encode_to_vec().as_slice()).unwrap();
            assert_eq!(&decode_plan(&back).unwrap(), p);
            assert!(ids.insert(p.id()), "plan id collision");
        }
    }
    assert!(ids.len() > 100, "too few plans checked: {}", ids.len());
}

#[test]
fn foreign_or_infeasible_plans_are_typed_errors() {
    let shape = &ModelShape::smollm2_135m().groups[0].1;
    let p = &candidates(shape, Mode::Standard, 5, 4096, true)[0];
    let good = encode_plan(p);
    let refused = |edit: &dyn Fn(&mut v1::GroupPlan)| {
        let mut m = good.clone();
        edit(&mut m);
        matches!(decode_plan(&m), Err(PrivateError::Helora(_)))
    };
    assert!(decode_plan(&good).is_ok());
    assert!(refused(&|m| m.stage_b = None));
    assert!(refused(&|m| m.d_outs.clear()));
    assert!(refused(&|m| m.ranks.push(1)));
    assert!(refused(&|m| m.d_outs = vec![8; 65]));
    assert!(refused(&|m| {
        if let Some(b) = &mut m.stage_b {
            b.baby = 9;
        }
    }));
    // A structurally valid encoding of an infeasible plan is rejected too.
    let mut q = p.clone();
    q.stage_b.n_out = 1;
    assert!(decode_plan(&encode_plan(&q)).is_err());
}
