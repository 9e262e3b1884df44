//! The fixed-point verify schedule end to end over gRPC (TLS + token on loopback, the embedded
//! adapter server): every layer group's deltas of a pass travel in one batched round trip, a
//! constant number of round trips per round, and the private greedy output must still equal the
//! plaintext adapted model token for token — for the committed FFA and standard adapters (5
//! held-out prompts × 32 tokens) and for an adapter on all seven linear projections (PEFT
//! `all-linear`).

mod common;

use std::path::Path;
use std::sync::OnceLock;

use cipherlora_model::{
    LoraAdapter, Model, Proj, RandomAdapterSpec, SamplingParams, Tokenizer, fetch,
    write_random_adapter,
};
use cipherlora_private::{EmbeddedServer, Grouping, connect_widths};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, SpecConfig};
use cipherlora_speculative::schedule::{Prefill, Schedule};

use common::{PROMPTS, adapter_dir, assert_matches, plaintext_reference};

const TOKENS: usize = 32;
const K: usize = 8;
const PREFILL: usize = 16;

fn model() -> &'static (Model, Tokenizer) {
    static M: OnceLock<(Model, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Model::load(&path).unwrap(),
            Tokenizer::for_model(&path).unwrap(),
        )
    })
}

/// Private generation of `prompts` under `schedule` through an embedded server holding the adapter
/// in `dir`; asserts token equality with the plaintext reference and that every round made exactly
/// the schedule's round trips. The verify session's requests are grouped as `grouping` asks (by
/// layers: one request per run of layers, FFA only); prefill passes have `prefill` positions (a
/// width equal to the verify width shares the verify session). Returns the number of rounds.
fn private_matches_plaintext(
    id: &str,
    dir: &Path,
    prompts: &[&str],
    schedule: Schedule,
    (grouping, prefill): (Grouping, usize),
) -> usize {
    let (model, tok) = model();
    let server = EmbeddedServer::start(id, dir, model.config(), None).unwrap();
    let mut hook = connect_widths(
        server.client_config(LinkProfile::LOOPBACK),
        id,
        (K + 1, grouping),
        prefill,
        model.config(),
    )
    .unwrap();
    let verify = hook.session(K + 1).unwrap();
    assert_eq!(verify.plan_space().grouping, grouping, "{id}");
    if let Some(n) = grouping.layers() {
        // One request per run of n layers (the last run may be shorter).
        assert_eq!(
            verify.pass_model().groups,
            model.config().num_layers.div_ceil(n)
        );
    }
    let plain = LoraAdapter::load(dir, model.config()).unwrap();
    let mut rounds = 0;
    for text in prompts {
        let prompt = tok.encode(text).unwrap();
        let want = plaintext_reference(model, tok, &plain, &prompt, TOKENS);
        let cfg = SpecConfig {
            prefill_width: Some(prefill),
            schedule,
            ..common::greedy_spec(K, TOKENS, tok)
        };
        let before = hook.session(K + 1).unwrap().timings().clone();
        let got = decode::generate(model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
        assert_matches(&got, &want, tok, &format!("{id} {schedule}: {text:?}"));
        let mut he = hook.session(K + 1).unwrap().timings().clone();
        he.subtract(&before);
        if let Schedule::FixedPoint(fp) = schedule {
            // Constant work per round: the server sees exactly N round trips of the verify width
            // per round, continuations included, plus the prefill's last chunk when it fits the
            // verify width.
            let prefilled = prompt.len() - 1;
            let last_chunk = (prefilled - 1) % prefill + 1;
            // A group-by-group prefill keeps its last chunk in the wide session (the verify session
            // may be grouped by layer).
            let prefill_trips = match fp.prefill {
                Prefill::FixedPoint(n) => n,
                Prefill::PerGroup => 0,
            };
            let narrow_prefill = if prefill == K + 1 {
                // One session: every prefill pass is on it.
                prefilled.div_ceil(prefill) * prefill_trips
            } else {
                usize::from(last_chunk <= K + 1) * prefill_trips
            };
            assert_eq!(
                he.round_trips as usize,
                got.stats.rounds * fp.round_trips + narrow_prefill
            );
            assert_eq!(
                got.stats.round_trips + narrow_prefill,
                he.round_trips as usize
            );
            // A drafted start replaces every verify pass's pass 0.
            if fp.drafted_start {
                assert_eq!(
                    got.stats.drafted_starts,
                    got.stats.rounds - got.stats.continuations,
                    "{:?}",
                    got.stats
                );
            }
        }
        rounds += got.stats.rounds;
    }
    rounds
}

/// Requests grouped by runs of four layers (30 layers: seven runs of four and a last run of two),
/// streamed: each request leaves when the pass has produced its fourth layer's inputs. Each round's
/// first trip is the drafter's recorded inputs (`/drafted-start`), all sent when the round starts;
/// the other tests start from pass 0.
#[test]
fn fixed_point_schedule_equals_plaintext_ffa() {
    let dir = adapter_dir("code-ffa-r16");
    private_matches_plaintext(
        "code-ffa-r16",
        &dir,
        &PROMPTS,
        "fixed-point/drafted-start".parse().unwrap(),
        (Grouping::ByLayers(4), PREFILL),
    );
}

/// Two trips per round certified against the cached rows' residual (`/shadow`, its settlings
/// included in the trip count), with one batch per trip: the other tests stream their trips. Three
/// of the five prompts (standard LoRA is the slowest adapter to serve); the ignored test below runs
/// all five.
#[test]
fn fixed_point_schedule_equals_plaintext_standard() {
    standard_two_shadowed_trips(&PROMPTS[..3]);
}

/// The test above on all five prompts (too long for CI).
#[test]
#[ignore = "long run: standard LoRA on five prompts; run with --ignored"]
fn fixed_point_schedule_equals_plaintext_standard_on_every_prompt() {
    standard_two_shadowed_trips(&PROMPTS);
}

fn standard_two_shadowed_trips(prompts: &[&str]) {
    let dir = adapter_dir("code-lora-r16");
    private_matches_plaintext(
        "code-lora-r16",
        &dir,
        prompts,
        "fixed-point:2/shadow/batched".parse().unwrap(),
        (Grouping::ByInput, PREFILL),
    );
}

/// An adapter on all seven linear projections (four groups per layer: the per-group schedule's 4
/// round trips per layer become N per round).
#[test]
fn fixed_point_schedule_equals_plaintext_all_linear_adapter() {
    let (model, tok) = model();
    let dir = std::env::temp_dir().join(format!("cipherlora-all-linear-{}", std::process::id()));
    write_random_adapter(
        &dir,
        model.config(),
        &RandomAdapterSpec {
            targets: Proj::ALL.to_vec(),
            rank: 8,
            alpha: 16.0,
            b_std: 0.05,
            ffa: true,
            seed: 11,
        },
    )
    .unwrap();
    // The adapter must matter, or equality proves nothing.
    let plain = LoraAdapter::load(&dir, model.config()).unwrap();
    let prompt = tok.encode(PROMPTS[0]).unwrap();
    let adapted = plaintext_reference(model, tok, &plain, &prompt, TOKENS);
    let base = {
        cipherlora_model::generate(
            model,
            &prompt,
            &cipherlora_model::GenerateOptions {
                max_tokens: TOKENS,
                sampling: SamplingParams::greedy(),
                eos: tok.eos_tokens().to_vec(),
            },
            &mut cipherlora_model::NoAdapter,
            &mut |_| Ok(()),
        )
        .unwrap()
        .tokens
    };
    assert_ne!(
        adapted, base,
        "the random all-linear adapter changes nothing"
    );
    private_matches_plaintext(
        "all-linear-r8",
        &dir,
        &PROMPTS[..2],
        "fixed-point".parse().unwrap(),
        (Grouping::BY_LAYER, PREFILL),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// At equal verify and prefill widths the one shared session is grouped as the verify passes ask
/// (one upload per run of layers) and also serves the prompt's fixed-point prefill passes.
#[test]
fn equal_verify_and_prefill_widths_keep_the_grouping_asked_for() {
    let dir = adapter_dir("code-ffa-r16");
    private_matches_plaintext(
        "code-ffa-r16",
        &dir,
        &PROMPTS[..2],
        "fixed-point".parse().unwrap(),
        (Grouping::ByLayers(2), K + 1),
    );
}
