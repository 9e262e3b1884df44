//! The streamed fixed point (`FixedPointPass::start_sending` /
//! `iterate_sending`) against batched trips and the sequential pass, on a
//! tiny fixture with an adapter on all seven projections.

mod common;

use std::collections::HashMap;

use candle_core::Tensor;
use cipherlora_model::{
    AttentionMask, DeltaHook, DeltaStream, FixedPointPass, GroupDeltas, GroupInput, LoraAdapter,
    Model, ModelError, NextTrip, PassDeltas, PlainLora, ProjGroup, TripId,
};
use common::{ALL_MODULES, LLAMA, adapter, weights, write_hf};

const TOKENS: [u32; 6] = [5, 9, 31, 2, 44, 17];

/// What the stream saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Open(u64, Option<f64>),
    Send(u64, usize, ProjGroup),
    Receive(u64, usize, ProjGroup),
}

/// A plaintext LoRA hook that streams: a sent group is answered at once and
/// kept until received; every call is logged.
struct Streaming<'a> {
    lora: PlainLora<'a>,
    next: u64,
    answered: HashMap<(u64, usize, ProjGroup), GroupDeltas>,
    log: Vec<Event>,
    batches: usize,
}

impl<'a> Streaming<'a> {
    fn new(lora: &'a LoraAdapter) -> Self {
        Self {
            lora: PlainLora::new(lora),
            next: 0,
            answered: HashMap::new(),
            log: Vec::new(),
            batches: 0,
        }
    }
}

impl DeltaStream for Streaming<'_> {
    fn open_trip(&mut self, tolerance: Option<f64>) -> Result<TripId, ModelError> {
        self.next += 1;
        self.log.push(Event::Open(self.next, tolerance));
        Ok(TripId(self.next))
    }

    fn send(&mut self, trip: TripId, g: &GroupInput) -> Result<(), ModelError> {
        self.log.push(Event::Send(trip.0, g.layer, g.group));
        let d = self.lora.deltas(g.layer, g.group, &g.x)?;
        self.answered.insert((trip.0, g.layer, g.group), d);
        Ok(())
    }

    fn receive(
        &mut self,
        trip: TripId,
        layer: usize,
        group: ProjGroup,
    ) -> Result<GroupDeltas, ModelError> {
        self.log.push(Event::Receive(trip.0, layer, group));
        self.answered
            .remove(&(trip.0, layer, group))
            .ok_or_else(|| ModelError::Hook {
                layer,
                proj: group.projs()[0],
                reason: "received but never sent".into(),
            })
    }
}

impl DeltaHook for Streaming<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        self.lora.deltas(layer, group, x)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.lora.wants(layer, group)
    }

    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        self.batches += 1;
        inputs
            .iter()
            .map(|g| self.lora.deltas(g.layer, g.group, &g.x))
            .collect()
    }

    fn stream(&mut self, _t: usize) -> Option<&mut dyn DeltaStream> {
        Some(self)
    }
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2().unwrap()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

struct Fixture {
    _dir: tempfile::TempDir,
    model: Model,
    lora: LoraAdapter,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let t = LLAMA;
    let w = weights(&t, 23);
    write_hf(&dir.path().join("hf"), &t, &w);
    // A strong adapter, so that the trips visibly differ.
    adapter(&t, 4, 16.0, false, &ALL_MODULES, 7).write(&dir.path().join("lora"));
    let model = Model::load(&dir.path().join("hf")).unwrap();
    let lora = LoraAdapter::load(&dir.path().join("lora"), model.config()).unwrap();
    Fixture {
        _dir: dir,
        model,
        lora,
    }
}

/// Three trips, streamed and batched, give the same logits and steps; the
/// streamed run sends trip i+1's groups while pass i runs, interleaved
/// with receiving trip i's, and never batches.
#[test]
fn streamed_trips_equal_batched_trips_and_interleave_by_layer() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let tol = [Some(1e-3), Some(1e-4), None];

    let mut batched_hook = PlainLora::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let mut batched = FixedPointPass::start(m, &TOKENS, &mut cache, &mask, &batched_hook).unwrap();
    for t in tol {
        batched
            .iterate_within(&mut cache, &mut batched_hook, t)
            .unwrap();
    }

    let mut hook = Streaming::new(&f.lora);
    let mut cache2 = m.new_cache(32).unwrap();
    let mut streamed = FixedPointPass::start_sending(
        m,
        &TOKENS,
        &mut cache2,
        &mask,
        &mut hook,
        PassDeltas::new(),
        NextTrip::Send(tol[0]),
    )
    .unwrap();
    streamed
        .iterate_sending(&mut cache2, &mut hook, None, NextTrip::Send(tol[1]))
        .unwrap();
    streamed
        .iterate_sending(&mut cache2, &mut hook, None, NextTrip::Send(tol[2]))
        .unwrap();
    streamed
        .iterate_sending(&mut cache2, &mut hook, None, NextTrip::Wait)
        .unwrap();

    assert_eq!(hook.batches, 0, "a streaming hook is never batched");
    assert!(hook.answered.is_empty(), "every sent group was received");
    assert_eq!(streamed.round_trips(), 3);
    assert_eq!(
        max_abs_diff(&rows(streamed.logits()), &rows(batched.logits())),
        0.0
    );
    for (s, b) in streamed.steps().iter().zip(batched.steps()) {
        assert_eq!(s, b);
    }
    // The cache holds the last pass's positions, as after batched trips.
    assert_eq!(cache2.len(), TOKENS.len());

    // The wavefront: trip 2's group (l, g) leaves before trip 1's next
    // group is taken, and after trip 1's (l, g) was.
    let pos = |e: Event| hook.log.iter().position(|x| *x == e).unwrap();
    let groups = streamed.inputs().len();
    assert_eq!(
        hook.log
            .iter()
            .filter(|e| matches!(e, Event::Send(..)))
            .count(),
        3 * groups
    );
    assert_eq!(pos(Event::Open(1, tol[0])), 0);
    assert!(pos(Event::Open(2, tol[1])) < pos(Event::Receive(1, 0, ProjGroup::Qkv)));
    let layers = m.config().num_layers;
    for l in 0..layers {
        assert!(
            pos(Event::Send(2, l, ProjGroup::Qkv)) < pos(Event::Receive(1, l, ProjGroup::Qkv)),
            "layer {l}"
        );
        if l + 1 < layers {
            assert!(
                pos(Event::Send(2, l, ProjGroup::Down))
                    < pos(Event::Receive(1, l + 1, ProjGroup::Qkv)),
                "layer {l}"
            );
        }
    }
}

/// After as many trips as groups the streamed pass equals the sequential
/// pass with the adapter (the fixed point is exact), within float32 noise.
#[test]
fn streamed_trips_reach_the_sequential_pass() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let mut seq_cache = m.new_cache(32).unwrap();
    let sequential = rows(
        &m.forward(&TOKENS, &mut seq_cache, &mask, &mut PlainLora::new(&f.lora))
            .unwrap(),
    );
    let mut hook = Streaming::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let mut pass = FixedPointPass::start_sending(
        m,
        &TOKENS,
        &mut cache,
        &mask,
        &mut hook,
        PassDeltas::new(),
        NextTrip::Send(None),
    )
    .unwrap();
    let groups = pass.inputs().len();
    for i in 0..groups {
        let next = if i + 1 < groups {
            NextTrip::Send(None)
        } else {
            NextTrip::Wait
        };
        pass.iterate_sending(&mut cache, &mut hook, None, next)
            .unwrap();
    }
    let base = {
        let mut c = m.new_cache(32).unwrap();
        rows(
            &m.forward(&TOKENS, &mut c, &mask, &mut cipherlora_model::NoAdapter)
                .unwrap(),
        )
    };
    let err = max_abs_diff(&rows(pass.logits()), &sequential);
    assert!(
        max_abs_diff(&base, &sequential) > 1e-2,
        "the adapter matters"
    );
    assert!(err < 1e-4, "{err}");
}
