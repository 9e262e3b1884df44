//! Speculative decoding on the real default model with the committed standard LoRA adapter
//! (adapters/code-lora-r16), the plaintext LoRA hook standing in for the adapter server.
//!
//! 1. Greedy: for every drafter, with and without constant-K padding and
//!    adaptive K, the output equals sequential greedy decoding of the
//!    adapted model token for token.
//! 2. Sampling: on the real model's distributions at fixed contexts, the
//!    first token of a speculative round (base-model draft, exact
//!    acceptance) follows the adapted model's softmax (χ² over the top
//!    tokens plus a rest bucket), and a wrong acceptance rule fails.

use std::path::PathBuf;

use cipherlora_model::{
    GenerateOptions, LoraAdapter, NoAdapter, PlainLora, Sampler, SamplingParams, generate,
};
use cipherlora_speculative::acceptance::{DraftProbs, accept_sampled, sample};
use cipherlora_speculative::decode::{self, ChainDrafter, Drafting, PrefillSpan, SpecConfig};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;

mod common;
use common::{Fixture, PROMPTS, chi2_p_value, drafted, fixture, last_probs, reference};

/// Positions per group-by-group prefill pass in these runs.
const SPAN: usize = 512;

#[allow(clippy::too_many_arguments)]
fn speculative(
    f: &Fixture,
    prompt: &[u32],
    n: usize,
    drafter: Option<ChainDrafter>,
    k: usize,
    pad: bool,
    adaptive: bool,
    prefill_width: Option<usize>,
    optimistic: bool,
    draft_stop_below: f32,
) -> decode::SpecOutput {
    let cfg = SpecConfig {
        drafting: match drafter {
            Some(drafter) => Drafting::Chain {
                drafter,
                k,
                adaptive,
            },
            None => Drafting::None,
        },
        pad_to_k: pad,
        prefill_width,
        optimistic,
        draft_stop_below,
        delta_guided: true,
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        eos: f.tokenizer.eos_tokens().to_vec(),
        first_token_from_prefill: false,
        prefill_span: PrefillSpan::Positions(SPAN),
        schedule: Default::default(),
    };
    let mut hook = PlainLora::new(&f.adapter);
    let mut streamed = Vec::new();
    let out = decode::generate(&f.model, prompt, &cfg, &mut hook, &mut |t| {
        streamed.extend_from_slice(t);
        Ok(())
    })
    .unwrap();
    assert_eq!(
        streamed, out.tokens,
        "streamed tokens differ from the result"
    );
    out
}

#[test]
fn greedy_speculative_output_equals_sequential_adapted_decoding() {
    let f = fixture();
    let n = 24;
    let mut rounds_base = 0;
    let mut optimistic_hits = 0;
    let mut early_stop_saved = 0;
    for text in PROMPTS {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, n);
        assert_eq!(want.len(), n, "reference stopped early on {text:?}");
        for (drafter, k, pad, adaptive, prefill, optimistic, stop) in [
            (None, 0, true, false, None, false, 0.0),
            (None, 0, true, false, Some(16), false, 0.0),
            (Some(ChainDrafter::Base), 4, true, false, None, false, 0.0),
            (Some(ChainDrafter::Base), 4, true, false, Some(7), true, 0.0),
            (Some(ChainDrafter::Base), 8, false, false, None, false, 0.0),
            (Some(ChainDrafter::Base), 8, true, false, None, true, 0.0),
            (Some(ChainDrafter::Base), 8, true, true, None, false, 0.0),
            (Some(ChainDrafter::Base), 12, true, false, None, false, 0.5),
            (Some(ChainDrafter::Base), 12, false, false, None, true, 0.5),
            (Some(ChainDrafter::Ngram), 4, true, false, None, false, 0.0),
            (Some(ChainDrafter::Hybrid), 4, true, true, None, false, 0.3),
        ] {
            let got = speculative(
                f,
                &prompt,
                n,
                drafter.clone(),
                k,
                pad,
                adaptive,
                prefill,
                optimistic,
                stop,
            );
            assert_eq!(
                got.tokens, want,
                "{drafter:?} K={k} pad={pad} adaptive={adaptive} prefill={prefill:?} optimistic={optimistic} stop={stop} on {text:?}"
            );
            if optimistic {
                optimistic_hits += got.stats.ahead_hits;
            }
            if stop > 0.0 && drafter == Some(ChainDrafter::Base) {
                early_stop_saved += got.stats.rounds * k - got.stats.drafted;
            }
            if pad {
                // Group by group the prompt runs unpadded, in passes of up to the span.
                assert_eq!(
                    got.stats.prefill_passes,
                    (prompt.len() - 1).div_ceil(SPAN),
                    "prefill passes (prefill width {prefill:?}) on {text:?}"
                );
            }
            if drafter.is_none() {
                assert_eq!(got.stats.rounds, n, "no drafter: one round per token");
            }
            if drafter == Some(ChainDrafter::Base) && k == 4 && pad {
                rounds_base += got.stats.rounds;
            }
        }
    }
    // The adapter changes the output, so the base drafter must be rejected sometimes, yet
    // speculation must still save rounds.
    assert!(
        rounds_base < PROMPTS.len() * n,
        "base drafter never accepted anything"
    );
    // Drafts made ahead must actually be used sometimes (and, above, never change the output).
    assert!(optimistic_hits > 0, "optimistic drafting never hit");
    // Low-confidence drafts must actually end early sometimes.
    assert!(early_stop_saved > 0, "no draft ever stopped early");
}

#[test]
fn both_committed_adapters_load_and_change_greedy_output_on_domain_prompts() {
    let f = fixture();
    let opts = GenerateOptions {
        max_tokens: 32,
        sampling: SamplingParams::greedy(),
        eos: f.tokenizer.eos_tokens().to_vec(),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../adapters");
    for name in ["code-lora-r16", "code-ffa-r16"] {
        let adapter = LoraAdapter::load(&root.join(name), f.model.config()).expect("load adapter");
        for text in PROMPTS {
            let prompt = f.tokenizer.encode(text).unwrap();
            let base = generate(&f.model, &prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))
                .unwrap()
                .tokens;
            let adapted = generate(
                &f.model,
                &prompt,
                &opts,
                &mut PlainLora::new(&adapter),
                &mut |_| Ok(()),
            )
            .unwrap()
            .tokens;
            assert_ne!(
                base, adapted,
                "{name} does not change the output on {text:?}"
            );
        }
    }
}

#[test]
fn speculative_sampling_follows_the_adapted_softmax_on_the_real_model() {
    let f = fixture();
    let sampler = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: Some(40),
        seed: 7,
        ..SamplingParams::default()
    })
    .unwrap();
    const DRAWS: usize = 10_000;
    for (ctx_i, text) in PROMPTS.iter().enumerate() {
        let prompt = f.tokenizer.encode(text).unwrap();
        let p_full = last_probs(f, &prompt, &mut PlainLora::new(&f.adapter), &sampler);
        let q_full = last_probs(f, &prompt, &mut NoAdapter, &sampler);
        // Restrict both to the union of their supports (top-k leaves ~80 of 49,152 tokens): the
        // same distributions, 600× cheaper to sample.
        let support: Vec<usize> = (0..p_full.len())
            .filter(|&t| p_full[t] > 0.0 || q_full[t] > 0.0)
            .collect();
        let p: Vec<f32> = support.iter().map(|&t| p_full[t]).collect();
        let q: Vec<f32> = support.iter().map(|&t| q_full[t]).collect();
        // The drafter's proposal must differ from the target for the test to bite.
        let tv: f64 = p
            .iter()
            .zip(&q)
            .map(|(a, b)| f64::from((a - b).abs()))
            .sum::<f64>()
            / 2.0;
        assert!(
            tv > 0.02,
            "base and adapted distributions nearly equal (TV {tv})"
        );
        let next_row = p.clone(); // stands in for p_1; only the first token is tested
        let mut rng = ChaCha20Rng::seed_from_u64(100 + ctx_i as u64);
        let mut right = vec![0usize; p.len()];
        let mut wrong = vec![0usize; p.len()];
        for _ in 0..DRAWS {
            let d = sample(&q, &mut rng);
            let qs = [q.clone()];
            let ps = [p.clone(), next_row.clone()];
            let out = accept_sampled(&[d], DraftProbs::Sampled(&qs), &ps, &mut rng).unwrap();
            right[out.tokens[0] as usize] += 1;
            // Wrong rule: accept with min(1, p/q) but resample from p on rejection.
            let u: f64 = rng.random();
            let tok = if u * f64::from(q[d as usize]) < f64::from(p[d as usize]) {
                d
            } else {
                sample(&p, &mut rng)
            };
            wrong[tok as usize] += 1;
        }
        let pv = chi2_p_value(&p, &right, DRAWS);
        assert!(pv > 1e-3, "context {ctx_i}: exact rule rejected, p = {pv}");
        let pw = chi2_p_value(&p, &wrong, DRAWS);
        assert!(pw < 1e-4, "context {ctx_i}: wrong rule passed, p = {pw}");
    }
}

#[test]
fn f16_drafter_keeps_greedy_output_and_most_of_the_acceptance() {
    let f = fixture();
    let half = f.model.to_f16_weights().unwrap();
    let n = 24;
    let (mut rounds_f32, mut rounds_f16) = (0, 0);
    for text in PROMPTS {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, n);
        let cfg = SpecConfig::greedy(8, n, f.tokenizer.eos_tokens().to_vec());
        let mut hook = PlainLora::new(&f.adapter);
        let got = drafted(f, &half, &prompt, &cfg, &mut hook);
        assert_eq!(
            got.tokens, want,
            "f16 drafter changed the output on {text:?}"
        );
        rounds_f16 += got.stats.rounds;
        rounds_f32 += speculative(
            f,
            &prompt,
            n,
            Some(ChainDrafter::Base),
            8,
            true,
            false,
            None,
            false,
            0.0,
        )
        .stats
        .rounds;
    }
    // f16 rounding flips a draft only where the base model is nearly tied.
    assert!(
        rounds_f16 * 4 <= rounds_f32 * 5,
        "f16 drafter needs {rounds_f16} rounds, f32 {rounds_f32}"
    );
}

/// The fixed-point schedule (all groups per round trip, iterated over layers) with the plaintext
/// hook: every round makes exactly N trips, the output equals sequential greedy decoding, and
/// drafting ahead during the last trip (on by default) is used and changes nothing; with one trip
/// per round the certification has to continue rounds and still never lets a wrong token through; a
/// prompt prefilled group by group under a fixed- point decode gives the same output too. Greedy,
/// base drafter, K = 8 padded, prefill passes of 16 positions, `n` new tokens, every pass under the
/// fixed point `fp`.
fn fixed_point_config(
    f: &Fixture,
    fp: cipherlora_speculative::schedule::FixedPoint,
    n: usize,
) -> SpecConfig {
    SpecConfig {
        prefill_width: Some(16),
        schedule: cipherlora_speculative::schedule::Schedule::FixedPoint(fp),
        ..SpecConfig::greedy(8, n, f.tokenizer.eos_tokens().to_vec())
    }
}

#[test]
fn fixed_point_schedule_equals_sequential_adapted_decoding() {
    use cipherlora_speculative::schedule::{FixedPoint, Prefill};
    let f = fixture();
    let n = 24;
    let mut hits = 0;
    let mut continuations = 0;
    for text in PROMPTS {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, n);
        for (trips, draft_ahead, prefill) in [
            (2, true, Prefill::FixedPoint(5)),
            (2, false, Prefill::FixedPoint(5)),
            (1, false, Prefill::FixedPoint(5)),
            (3, true, Prefill::FixedPoint(5)),
            // The prompt group by group (exact keys and values), the rounds by the fixed point.
            (2, true, Prefill::PerGroup),
        ] {
            let fp = FixedPoint {
                round_trips: trips,
                draft_ahead,
                prefill,
                ..FixedPoint::default()
            };
            let cfg = fixed_point_config(f, fp, n);
            let mut hook = PlainLora::new(&f.adapter);
            let out =
                decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
            assert_eq!(
                out.tokens, want,
                "{text:?}: fixed point ×{trips}, prefill {prefill}"
            );
            assert_eq!(out.stats.round_trips, out.stats.rounds * trips, "{text:?}");
            let prefill_trips = match prefill {
                Prefill::FixedPoint(m) => m * out.stats.prefill_passes,
                Prefill::PerGroup => 0,
            };
            assert_eq!(out.stats.prefill_round_trips, prefill_trips, "{text:?}");
            if draft_ahead {
                hits += out.stats.ahead_hits;
            }
            if trips == 1 {
                continuations += out.stats.continuations;
            }
        }
    }
    assert!(hits > 0, "drafting ahead never matched the round's outcome");
    assert!(
        continuations > 0,
        "one trip per round never needed a continuation: the certification is not exercised"
    );
}

/// Sampling under the fixed-point schedule: rows are certified only when their logits'
/// remaining-error bound is below the sampling tolerance, which takes more than two trips, so
/// rounds are continued; the generation completes, every round still makes exactly N trips, and
/// with the same seed it samples what the per-group schedule samples (the certified logits are
/// within 1e-4 of the exact ones, so an acceptance test could flip only for a uniform draw within
/// ~2e-4 of its threshold).
#[test]
fn fixed_point_sampling_continues_rounds_and_matches_per_group_sampling() {
    use cipherlora_speculative::schedule::Schedule;
    let f = fixture();
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let run = |schedule: Schedule| {
        let cfg = SpecConfig {
            drafting: Drafting::chain(ChainDrafter::Base, 4),
            pad_to_k: true,
            prefill_width: Some(16),
            optimistic: false,
            draft_stop_below: 0.0,
            // Unguided: a guided drafter takes its guide from the deltas each schedule computed,
            // which differ in the last bits, and its sampled drafts (same distribution) then take
            // other paths through the seeded generator; this test compares the paths themselves.
            delta_guided: false,
            max_tokens: 16,
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: None,
                top_p: Some(0.95),
                repetition_penalty: 1.0,
                seed: 5,
            },
            eos: Vec::new(),
            first_token_from_prefill: false,
            prefill_span: PrefillSpan::Positions(SPAN),
            schedule,
        };
        let mut hook = PlainLora::new(&f.adapter);
        decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap()
    };
    let exact = run(Schedule::PerGroup);
    let fixed = run("fixed-point:2".parse().unwrap());
    assert_eq!(fixed.tokens.len(), 16);
    assert!(fixed.stats.continuations > 0, "{:?}", fixed.stats);
    assert_eq!(fixed.stats.round_trips, 2 * fixed.stats.rounds);
    assert_eq!(fixed.tokens, exact.tokens);
}

#[test]
fn a_callback_that_stops_ends_the_generation_with_the_tokens_so_far() {
    let f = fixture();
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let want = reference(f, &prompt, 24);
    let cfg = SpecConfig::greedy(4, 24, f.tokenizer.eos_tokens().to_vec());
    let mut hook = PlainLora::new(&f.adapter);
    let mut calls = 0;
    let out = decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| {
        calls += 1;
        if calls == 2 {
            Err(cipherlora_speculative::SpecError::Stopped)
        } else {
            Ok(())
        }
    })
    .expect("a stop asked for by the callback is not an error");
    assert_eq!(calls, 2, "no round may run after the stop");
    assert!(out.stopped_by_caller && !out.stopped_at_eos);
    assert!(out.tokens.len() < want.len(), "stopped before max_tokens");
    assert_eq!(out.tokens, want[..out.tokens.len()]);
}

fn first_from_prefill_config(f: &Fixture, k: usize, prefill_width: usize, n: usize) -> SpecConfig {
    SpecConfig {
        prefill_width: Some(prefill_width),
        first_token_from_prefill: true,
        prefill_span: PrefillSpan::Positions(SPAN),
        ..SpecConfig::greedy(k, n, f.tokenizer.eos_tokens().to_vec())
    }
}

#[test]
fn first_token_from_prefill_keeps_greedy_output_equal_to_sequential_decoding() {
    let f = fixture();
    for (i, text) in PROMPTS.iter().enumerate() {
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, 20);
        // A prefill width below, at and above the prompt's length.
        for (k, width) in [(4, 8), (3, prompt.len()), (8, 64)] {
            let cfg = first_from_prefill_config(f, k, width, 20);
            let mut streamed = Vec::new();
            let mut first_call = None;
            let out = decode::generate(
                &f.model,
                &prompt,
                &cfg,
                &mut PlainLora::new(&f.adapter),
                &mut |t| {
                    first_call.get_or_insert(t.len());
                    streamed.extend_from_slice(t);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(out.tokens, want, "prompt {i}, K {k}, width {width}");
            assert_eq!(streamed, want);
            assert_eq!(
                first_call,
                Some(1),
                "the first token arrives alone, before any verify round"
            );
        }
    }
}

#[test]
fn first_token_from_prefill_samples_the_adapted_softmax() {
    let f = fixture();
    let params = SamplingParams {
        temperature: 1.0,
        top_k: Some(40),
        ..SamplingParams::default()
    };
    let sampler = Sampler::new(params.clone()).unwrap();
    let prompt = f.tokenizer.encode(PROMPTS[2]).unwrap();
    let p = last_probs(f, &prompt, &mut PlainLora::new(&f.adapter), &sampler);
    let q = last_probs(f, &prompt, &mut NoAdapter, &sampler);
    // Wrong rule for contrast (the χ² must be able to tell): the base model's softmax, what a
    // prefill without the adapter's deltas samples.
    let tv: f64 = p
        .iter()
        .zip(&q)
        .map(|(a, b)| f64::from((a - b).abs()))
        .sum::<f64>()
        / 2.0;
    assert!(tv > 0.05, "adapter barely changes this row (TV {tv})");
    const DRAWS: usize = 300;
    let mut counts = vec![0usize; p.len()];
    let mut base_counts = vec![0usize; p.len()];
    for seed in 0..DRAWS as u64 {
        let mut cfg = first_from_prefill_config(f, 2, 16, 1);
        cfg.sampling = SamplingParams {
            seed,
            ..params.clone()
        };
        let out = decode::generate(
            &f.model,
            &prompt,
            &cfg,
            &mut PlainLora::new(&f.adapter),
            &mut |_| Ok(()),
        )
        .unwrap();
        counts[out.tokens[0] as usize] += 1;
    }
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    for _ in 0..DRAWS {
        base_counts[sample(&q, &mut rng) as usize] += 1;
    }
    let pv = chi2_p_value(&p, &counts, DRAWS);
    assert!(
        pv > 1e-3,
        "first tokens do not follow the adapted softmax: p = {pv}"
    );
    let pw = chi2_p_value(&p, &base_counts, DRAWS);
    assert!(
        pw < 1e-3,
        "the base model's draws passed as adapted: p = {pw}"
    );
}

/// Records the width of every batch of deltas asked for, and where the decoder said its prefill was
/// done.
struct Marked<'a> {
    inner: PlainLora<'a>,
    /// `Some(T)`: a batch of T-position inputs; `None`: the prefill mark (shared, so a token
    /// callback can see how far the hook got).
    events: std::rc::Rc<std::cell::RefCell<Vec<Option<usize>>>>,
}

impl<'a> Marked<'a> {
    fn new(inner: PlainLora<'a>) -> Self {
        Marked {
            inner,
            events: Default::default(),
        }
    }
}

impl cipherlora_model::DeltaHook for Marked<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: cipherlora_model::ProjGroup,
        x: &cipherlora_model::Tensor,
    ) -> Result<cipherlora_model::GroupDeltas, cipherlora_model::ModelError> {
        self.events.borrow_mut().push(Some(x.dims()[0]));
        self.inner.deltas(layer, group, x)
    }

    fn wants(&self, layer: usize, group: cipherlora_model::ProjGroup) -> bool {
        self.inner.wants(layer, group)
    }

    fn deltas_many(
        &mut self,
        inputs: &[cipherlora_model::GroupInput],
    ) -> Result<Vec<cipherlora_model::GroupDeltas>, cipherlora_model::ModelError> {
        self.events
            .borrow_mut()
            .push(inputs.first().map(|g| g.x.dims()[0]));
        self.inner.deltas_many(inputs)
    }

    fn prefill_done(&mut self) {
        self.events.borrow_mut().push(None);
    }
}

/// Regression (`bench e2e` counted the prompt's last chunk as decode): under the fixed point the
/// prompt's last chunk runs at the verify width, through the verify session, so a hook's decode
/// counters taken from the start of a generation included one prefill pass. The decoder now marks
/// the end of the prompt's passes ([`cipherlora_model::DeltaHook::prefill_done`]): once, after
/// every prefill batch (the narrow chunk among them) and before the first verify batch.
#[test]
fn prefill_done_marks_the_end_of_the_prompts_passes_including_a_verify_width_chunk() {
    use cipherlora_speculative::schedule::FixedPoint;
    let f = fixture();
    // 16 + a remainder of at most K + 1 = 9 tokens: the last chunk is narrow.
    let prompt = f.tokenizer.encode(PROMPTS[0]).unwrap();
    let prompt: Vec<u32> = prompt.iter().copied().cycle().take(16 + 6).collect();
    let cfg = fixed_point_config(f, FixedPoint::default(), 12);
    let mut hook = Marked::new(PlainLora::new(&f.adapter));
    let out = decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
    let events = hook.events.borrow();
    let marks: Vec<usize> = (0..events.len()).filter(|&i| events[i].is_none()).collect();
    assert_eq!(marks.len(), 1, "one mark per generation: {events:?}");
    let (before, after) = events.split_at(marks[0]);
    // Prompt minus its last token (it opens the first round): 16 + 5.
    assert_eq!(before.len(), out.stats.prefill_round_trips);
    assert_eq!(before.first(), Some(&Some(16)));
    assert_eq!(
        before.last(),
        Some(&Some(9)),
        "the prompt's last chunk ran at the verify width"
    );
    assert_eq!(after.len() - 1, out.stats.round_trips, "{after:?}");
    assert!(after[1..].iter().all(|e| *e == Some(9)), "{after:?}");
}

/// Under the fixed point with a group-by-group prefill (`auto`'s shadowed
/// default), the prompt's rows are exact, so the first token comes from the
/// prefill's last row: it is streamed after the prefill mark and before any
/// verify batch, and greedy output still equals sequential adapted decoding.
#[test]
fn a_per_group_prefill_under_the_fixed_point_streams_the_first_token_before_any_verify_pass() {
    use cipherlora_speculative::schedule::Schedule;

    let f = fixture();
    let n = 16;
    for (text, schedule) in PROMPTS.iter().zip([
        "fixed-point:3/prefill:per-group/shadow",
        "fixed-point:2/prefill:per-group",
        "fixed-point:3/prefill:per-group/shadow",
    ]) {
        let schedule: Schedule = schedule.parse().unwrap();
        let prompt = f.tokenizer.encode(text).unwrap();
        let want = reference(f, &prompt, n);
        let cfg = SpecConfig {
            prefill_width: Some(16),
            first_token_from_prefill: true,
            schedule,
            ..SpecConfig::greedy(5, n, f.tokenizer.eos_tokens().to_vec())
        };
        let mut hook = Marked::new(PlainLora::new(&f.adapter));
        let log = hook.events.clone();
        // How many hook events had happened when each batch of tokens arrived.
        let mut arrivals = Vec::new();
        let out = decode::generate(&f.model, &prompt, &cfg, &mut hook, &mut |t| {
            arrivals.push((log.borrow().len(), t.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(out.tokens, want, "{schedule}: {text}");
        assert_eq!(out.stats.prefilled_tokens, prompt.len(), "{schedule}");
        let log = log.borrow();
        let mark = log
            .iter()
            .position(Option::is_none)
            .expect("a prefill mark");
        assert_eq!(
            arrivals.first(),
            Some(&(mark + 1, 1)),
            "{schedule}: the first token arrives alone, right after the prefill ({log:?})"
        );
    }
}
