//! `Model::forward_wavefront` against the one-pass forward with the same plaintext adapter: the
//! same logits, deltas and cache for any chunk size, a cached prefix, an adapter on some groups
//! only; the chunks' sends and receives interleave; a failed receive leaves the cache's length.

mod common;

use std::collections::HashMap;

use candle_core::Tensor;
use cipherlora_model::{
    AttentionMask, DeltaHook, DeltaStream, GroupDeltas, GroupInput, KeepDeltas, LoraAdapter, Model,
    ModelError, PlainLora, ProjGroup, TripId, Wavefront,
};
use common::{ALL_MODULES, LLAMA, adapter, weights, write_hf};

const TOKENS: [u32; 7] = [5, 9, 31, 2, 44, 17, 3];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Open(u64),
    Send(u64, usize, ProjGroup),
    Receive(u64, usize, ProjGroup),
}

/// A plaintext LoRA hook offering a wavefront of `rows`: sends are answered at once and kept
/// until received; receiving trip `fail_on` fails.
struct Chunked<'a> {
    lora: PlainLora<'a>,
    rows: usize,
    next: u64,
    answered: HashMap<(u64, usize, ProjGroup), GroupDeltas>,
    log: Vec<Event>,
    fail_on: Option<u64>,
}

impl<'a> Chunked<'a> {
    fn new(lora: &'a LoraAdapter, rows: usize) -> Self {
        Self {
            lora: PlainLora::new(lora),
            rows,
            next: 0,
            answered: HashMap::new(),
            log: Vec::new(),
            fail_on: None,
        }
    }
}

impl DeltaStream for Chunked<'_> {
    fn open_trip(&mut self, _tolerance: Option<f64>) -> Result<TripId, ModelError> {
        self.next += 1;
        self.log.push(Event::Open(self.next));
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
        let refused = ModelError::Hook {
            layer,
            proj: group.projs()[0],
            reason: "refused".into(),
        };
        if self.fail_on == Some(trip.0) {
            return Err(refused);
        }
        self.answered.remove(&(trip.0, layer, group)).ok_or(refused)
    }
}

impl DeltaHook for Chunked<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        panic!("a wavefront pass asked for ({layer}, {group:?}) in one piece, {x:?}");
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.lora.wants(layer, group)
    }

    fn wavefront(&mut self, _t: usize) -> Option<Wavefront<'_>> {
        Some(Wavefront {
            rows: self.rows,
            stream: self,
        })
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    model: Model,
    lora: LoraAdapter,
}

fn fixture(modules: &[&'static str]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let t = LLAMA;
    write_hf(&dir.path().join("hf"), &t, &weights(&t, 41));
    adapter(&t, 4, 16.0, false, modules, 9).write(&dir.path().join("lora"));
    let model = Model::load(&dir.path().join("hf")).unwrap();
    let lora = LoraAdapter::load(&dir.path().join("lora"), model.config()).unwrap();
    Fixture {
        _dir: dir,
        model,
        lora,
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// One token decoded after the prompt: what the cache's rows decide.
fn next_logits(f: &Fixture, cache: &mut cipherlora_model::KvCache) -> Tensor {
    f.model
        .forward(
            &[11],
            cache,
            &AttentionMask::Causal,
            &mut PlainLora::new(&f.lora),
        )
        .unwrap()
}

/// The wavefront pass of `tokens[cached..]` after a one-pass prefix of `cached` tokens, against
/// the one-pass forward of all of them: logits, deltas, the cache (through the next token).
fn check(f: &Fixture, rows: usize, cached: usize) {
    let m = &f.model;
    let mut want_cache = m.new_cache(16).unwrap();
    let mut keeping = KeepDeltas::new(PlainLora::new(&f.lora));
    let want = m
        .forward(
            &TOKENS,
            &mut want_cache,
            &AttentionMask::Causal,
            &mut keeping,
        )
        .unwrap();

    let mut cache = m.new_cache(16).unwrap();
    if cached > 0 {
        m.forward(
            &TOKENS[..cached],
            &mut cache,
            &AttentionMask::Causal,
            &mut PlainLora::new(&f.lora),
        )
        .unwrap();
    }
    let mut hook = Chunked::new(&f.lora, rows);
    let (hidden, deltas) = m
        .forward_wavefront(&TOKENS[cached..], &mut cache, &mut hook)
        .unwrap();
    let logits = m.head(&hidden).unwrap();
    assert!(hook.answered.is_empty(), "every sent group was received");
    assert_eq!(cache.len(), TOKENS.len());
    let tail = want.narrow(0, cached, TOKENS.len() - cached).unwrap();
    let diff = max_abs_diff(&logits, &tail);
    assert!(
        diff < 1e-4,
        "rows {rows}, cached {cached}: logits differ by {diff}"
    );
    assert_eq!(deltas.len(), keeping.added.len());
    for (key, group) in &keeping.added {
        for (p, d) in group.iter() {
            let d = d.narrow(0, cached, TOKENS.len() - cached).unwrap();
            let got = deltas[key].get(p).expect("every adapted projection");
            let scale = max_abs_diff(&d, &d.zeros_like().unwrap()).max(1.0);
            let diff = max_abs_diff(got, &d);
            assert!(diff < 1e-5 * scale, "{key:?} {p:?}: {diff} of {scale}");
        }
    }
    let diff = max_abs_diff(
        &next_logits(f, &mut cache),
        &next_logits(f, &mut want_cache),
    );
    assert!(
        diff < 1e-4,
        "rows {rows}: the next token's logits differ by {diff}"
    );
}

#[test]
fn any_chunk_size_gives_the_one_pass_logits_deltas_and_cache() {
    let f = fixture(&ALL_MODULES);
    for rows in [1, 2, 3, 7, 20] {
        check(&f, rows, 0);
    }
}

#[test]
fn a_cached_prefix_is_extended_as_by_one_pass() {
    let f = fixture(&ALL_MODULES);
    check(&f, 2, 3);
    check(&f, 4, 1);
}

/// Only the adapted groups travel; the others run unadapted in place.
#[test]
fn an_adapter_on_some_groups_sends_only_those() {
    let f = fixture(&["q_proj", "v_proj", "down_proj"]);
    check(&f, 3, 0);
    let mut cache = f.model.new_cache(16).unwrap();
    let mut hook = Chunked::new(&f.lora, 3);
    f.model
        .forward_wavefront(&TOKENS, &mut cache, &mut hook)
        .unwrap();
    let groups: std::collections::BTreeSet<ProjGroup> = hook
        .log
        .iter()
        .filter_map(|e| match e {
            Event::Send(_, _, g) => Some(*g),
            _ => None,
        })
        .collect();
    assert_eq!(
        groups.into_iter().collect::<Vec<_>>(),
        [ProjGroup::Qkv, ProjGroup::Down]
    );
}

/// Chunk c's input to a group leaves before chunk c + 1's deltas of the previous group are taken:
/// the order is open all, then per group and chunk: receive the previous group, send this one.
#[test]
fn chunks_interleave_group_by_group() {
    let f = fixture(&ALL_MODULES);
    let mut cache = f.model.new_cache(16).unwrap();
    let mut hook = Chunked::new(&f.lora, 4);
    f.model
        .forward_wavefront(&TOKENS, &mut cache, &mut hook)
        .unwrap();
    let mut want = vec![Event::Open(1), Event::Open(2)];
    let stages: Vec<(usize, ProjGroup)> = (0..f.model.config().num_layers)
        .flat_map(|l| ProjGroup::ALL.map(|g| (l, g)))
        .collect();
    for (i, &(l, g)) in stages.iter().enumerate() {
        for c in 1..=2 {
            if let Some(&(pl, pg)) = i.checked_sub(1).map(|p| &stages[p]) {
                want.push(Event::Receive(c, pl, pg));
            }
            want.push(Event::Send(c, l, g));
        }
    }
    let &(ll, lg) = stages.last().unwrap();
    want.extend([Event::Receive(1, ll, lg), Event::Receive(2, ll, lg)]);
    assert_eq!(hook.log, want);
}

#[test]
fn a_failed_receive_is_an_error_and_keeps_the_cache_length() {
    let f = fixture(&ALL_MODULES);
    let mut cache = f.model.new_cache(16).unwrap();
    f.model
        .forward(
            &TOKENS[..2],
            &mut cache,
            &AttentionMask::Causal,
            &mut PlainLora::new(&f.lora),
        )
        .unwrap();
    let mut hook = Chunked::new(&f.lora, 2);
    hook.fail_on = Some(2);
    let err = f
        .model
        .forward_wavefront(&TOKENS[2..], &mut cache, &mut hook)
        .unwrap_err();
    assert!(matches!(err, ModelError::Hook { .. }), "{err}");
    assert_eq!(cache.len(), 2);
    // Bad input is refused before anything is sent.
    let mut hook = Chunked::new(&f.lora, 2);
    assert!(matches!(
        f.model.forward_wavefront(&[], &mut cache, &mut hook),
        Err(ModelError::Input(_))
    ));
    assert!(hook.log.is_empty());
}
