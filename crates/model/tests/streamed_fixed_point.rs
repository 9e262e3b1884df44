//! The streamed fixed point (`FixedPointPass::start_sending` / `iterate_sending`) against batched
//! trips and the sequential pass, on a tiny fixture with an adapter on all seven projections.

mod common;

use std::collections::HashMap;

use candle_core::Tensor;
use cipherlora_model::{
    AttentionMask, DeltaHook, DeltaStream, FixedPointPass, GroupDeltas, GroupInput, LoraAdapter,
    Model, ModelError, NextTrip, PassDeltas, PlainLora, ProjGroup, TripId,
};
use common::{ALL_MODULES, LLAMA, QWEN2, adapter, weights, write_hf};

const TOKENS: [u32; 6] = [5, 9, 31, 2, 44, 17];

/// What the stream saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Open(u64, Option<f64>),
    Send(u64, usize, ProjGroup),
    Receive(u64, usize, ProjGroup),
}

/// A plaintext LoRA hook that streams: a sent group is answered at once and kept until received;
/// every call is logged.
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

/// Logits of the sequential pass of `TOKENS` with the adapter: where the fixed point must end.
fn sequential(f: &Fixture) -> Vec<Vec<f32>> {
    let mut cache = f.model.new_cache(32).unwrap();
    rows(
        &f.model
            .forward(
                &TOKENS,
                &mut cache,
                &AttentionMask::Causal,
                &mut PlainLora::new(&f.lora),
            )
            .unwrap(),
    )
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

/// Three trips, streamed and batched, give the same logits and steps; the streamed run sends trip
/// i+1's groups while pass i runs, interleaved with receiving trip i's, and never batches.
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
        max_abs_diff(
            &rows(streamed.logits().unwrap()),
            &rows(batched.logits().unwrap())
        ),
        0.0
    );
    for (s, b) in streamed.steps().iter().zip(batched.steps()) {
        assert_eq!(s, b);
    }
    // The cache holds the last pass's positions, as after batched trips.
    assert_eq!(cache2.len(), TOKENS.len());

    // The wavefront: trip 2's group (l, g) leaves before trip 1's next group is taken, and after
    // trip 1's (l, g) was.
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

/// After as many trips as groups the streamed pass equals the sequential pass with the adapter (the
/// fixed point is exact), within float32 noise.
#[test]
fn streamed_trips_reach_the_sequential_pass() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let sequential = sequential(&f);
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
    let err = max_abs_diff(&rows(pass.logits().unwrap()), &sequential);
    assert!(
        max_abs_diff(&base, &sequential) > 1e-2,
        "the adapter matters"
    );
    assert!(err < 1e-4, "{err}");
}

/// A pass started from the inputs pass 0 would record (`start_from_inputs`) is the pass started by
/// pass 0: the same trips sent, the same inputs, logits and steps after every trip, but for the
/// first trip's logit change, unknown without pass 0 (+∞). The first trip leaves on the stream
/// before anything is received.
#[test]
fn a_pass_started_from_given_inputs_equals_one_started_by_pass_zero() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;

    let mut hook = Streaming::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let mut by_pass0 = FixedPointPass::start_sending(
        m,
        &TOKENS,
        &mut cache,
        &mask,
        &mut hook,
        PassDeltas::new(),
        NextTrip::Send(Some(1e-3)),
    )
    .unwrap();
    let given = by_pass0.inputs().to_vec();
    for next in [NextTrip::Send(None), NextTrip::Wait] {
        by_pass0
            .iterate_sending(&mut cache, &mut hook, None, next)
            .unwrap();
    }

    let mut hook2 = Streaming::new(&f.lora);
    let mut cache2 = m.new_cache(32).unwrap();
    let mut from_given = FixedPointPass::start_from_inputs(
        m,
        &TOKENS,
        &cache2,
        &mask,
        &mut hook2,
        given.clone(),
        NextTrip::Send(Some(1e-3)),
    )
    .unwrap();
    assert!(from_given.logits().is_none(), "no plaintext pass yet");
    assert_eq!(cache2.len(), 0, "the cache is not touched");
    let groups = given.len();
    assert_eq!(
        hook2.log.len(),
        1 + groups,
        "the whole first trip leaves at once"
    );
    for next in [NextTrip::Send(None), NextTrip::Wait] {
        from_given
            .iterate_sending(&mut cache2, &mut hook2, None, next)
            .unwrap();
    }

    assert_eq!(hook2.batches, 0);
    assert!(hook2.answered.is_empty(), "every sent group was received");
    assert_eq!(
        max_abs_diff(
            &rows(from_given.logits().unwrap()),
            &rows(by_pass0.logits().unwrap())
        ),
        0.0
    );
    let (a, b) = (from_given.steps(), by_pass0.steps());
    assert_eq!(a.len(), 2);
    assert!(a[0].logit_change.iter().all(|c| c.is_infinite()));
    assert!(b[0].logit_change.iter().all(|c| c.is_finite()));
    assert_eq!(a[0].input_change, b[0].input_change);
    assert_eq!(a[1], b[1]);
    assert_eq!(cache2.len(), TOKENS.len());
}

/// The fixed point does not depend on the start: from inputs far off (every group's input scaled by
/// 1.5), batched trips still reach the sequential pass, after one trip more than groups (the first
/// group's input, exact after any pass 0, is given too).
#[test]
fn a_pass_from_bad_inputs_still_reaches_the_sequential_pass() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let sequential = sequential(&f);
    let mut hook = PlainLora::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let pass0 = FixedPointPass::start(m, &TOKENS, &mut cache, &mask, &hook).unwrap();
    let off: Vec<GroupInput> = pass0
        .inputs()
        .iter()
        .map(|g| GroupInput {
            x: (&g.x * 1.5).unwrap(),
            ..g.clone()
        })
        .collect();
    let groups = off.len();
    let mut cache = m.new_cache(32).unwrap();
    let mut pass = FixedPointPass::start_from_inputs(
        m,
        &TOKENS,
        &cache,
        &mask,
        &mut hook,
        off,
        NextTrip::Wait,
    )
    .unwrap();
    for _ in 0..=groups {
        pass.iterate(&mut cache, &mut hook).unwrap();
    }
    let err = max_abs_diff(&rows(pass.logits().unwrap()), &sequential);
    assert!(err < 1e-4, "{err}");
}

/// Given inputs that are not the wanted groups, or not T rows, are a typed error before anything is
/// sent.
#[test]
fn given_inputs_of_the_wrong_groups_or_shape_are_refused() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let hook = PlainLora::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let pass0 = FixedPointPass::start(m, &TOKENS, &mut cache, &mask, &hook).unwrap();
    let good = pass0.inputs().to_vec();
    let cache = m.new_cache(32).unwrap();
    let mut bad = Vec::new();
    bad.push(good[1..].to_vec());
    let mut swapped = good.clone();
    swapped.swap(0, 1);
    bad.push(swapped);
    let mut short = good.clone();
    short[2].x = short[2].x.narrow(0, 0, TOKENS.len() - 1).unwrap();
    bad.push(short);
    for inputs in bad {
        let mut hook = Streaming::new(&f.lora);
        let err = FixedPointPass::start_from_inputs(
            m,
            &TOKENS,
            &cache,
            &mask,
            &mut hook,
            inputs,
            NextTrip::Send(None),
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Input(_)), "{err}");
        assert!(hook.log.is_empty(), "nothing sent");
    }
}

/// Passes on another model of the same configuration (other weights: the drafter's, for the passes
/// that only estimate the next trip's inputs) leave a pass that, once it runs on the target again,
/// ends on the target's fixed point; passes that stay on the other model do not. A model of another
/// configuration is refused.
#[test]
fn estimates_on_another_model_end_on_the_target_s_fixed_point() {
    let f = fixture();
    let m = &f.model;
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), &LLAMA, &weights(&LLAMA, 24));
    let other = Model::load(dir.path()).unwrap();
    let mask = AttentionMask::Causal;
    let sequential = sequential(&f);
    let mut hook = PlainLora::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let mut pass = FixedPointPass::start(&other, &TOKENS, &mut cache, &mask, &hook).unwrap();
    let groups = pass.inputs().len();
    for _ in 0..2 {
        pass.iterate(&mut cache, &mut hook).unwrap();
    }
    let off = max_abs_diff(&rows(pass.logits().unwrap()), &sequential);
    assert!(
        off > 1e-1,
        "the other model's passes are another function: {off}"
    );
    pass.run_on(m).unwrap();
    // The first trip on the target still takes the other model's inputs.
    for _ in 0..=groups {
        pass.iterate(&mut cache, &mut hook).unwrap();
    }
    let err = max_abs_diff(&rows(pass.logits().unwrap()), &sequential);
    assert!(err < 1e-4, "{err}");

    let q_dir = tempfile::tempdir().unwrap();
    write_hf(q_dir.path(), &QWEN2, &weights(&QWEN2, 23));
    let shaped_otherwise = Model::load(q_dir.path()).unwrap();
    assert!(matches!(
        pass.run_on(&shaped_otherwise),
        Err(ModelError::Input(_))
    ));
}

/// A repeated trip sends the latest inputs as one batch and changes nothing but the trip count; it
/// is refused while a streamed trip is pending.
#[test]
fn a_repeated_trip_changes_nothing_but_the_trip_count() {
    let f = fixture();
    let m = &f.model;
    let mask = AttentionMask::Causal;
    let mut hook = Streaming::new(&f.lora);
    let mut cache = m.new_cache(32).unwrap();
    let mut pass = FixedPointPass::start_sending(
        m,
        &TOKENS,
        &mut cache,
        &mask,
        &mut hook,
        PassDeltas::new(),
        NextTrip::Send(Some(1e-3)),
    )
    .unwrap();
    assert!(matches!(
        pass.repeat_trip(&mut hook, Some(1e-3)),
        Err(ModelError::Input(_))
    ));
    pass.iterate_sending(&mut cache, &mut hook, None, NextTrip::Wait)
        .unwrap();
    let (logits, steps) = (rows(pass.logits().unwrap()), pass.steps().to_vec());
    let inputs: Vec<Vec<Vec<f32>>> = pass.inputs().iter().map(|g| rows(&g.x)).collect();
    assert_eq!(hook.batches, 0);

    pass.repeat_trip(&mut hook, Some(1e-3)).unwrap();
    assert_eq!(hook.batches, 1, "one batch of the latest inputs");
    assert_eq!(pass.round_trips(), 2);
    assert_eq!(pass.steps(), &steps[..]);
    assert_eq!(rows(pass.logits().unwrap()), logits);
    let again: Vec<Vec<Vec<f32>>> = pass.inputs().iter().map(|g| rows(&g.x)).collect();
    assert_eq!(again, inputs);

    // The next trip moves the pass from where it was, as if the repeat had not been made.
    pass.iterate_sending(&mut cache, &mut hook, None, NextTrip::Wait)
        .unwrap();
    let mut plain = PlainLora::new(&f.lora);
    let mut cache2 = m.new_cache(32).unwrap();
    let mut direct = FixedPointPass::start(m, &TOKENS, &mut cache2, &mask, &plain).unwrap();
    for _ in 0..2 {
        direct.iterate(&mut cache2, &mut plain).unwrap();
    }
    assert_eq!(pass.round_trips(), 3);
    assert_eq!(
        max_abs_diff(
            &rows(pass.logits().unwrap()),
            &rows(direct.logits().unwrap())
        ),
        0.0
    );
}
