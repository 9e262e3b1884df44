//! A group-by-group prefill pass wider than any session: the hook splits
//! each group's input into requests of a session's width (the last one
//! zero-padded) and sends them before awaiting the first reply. The answer
//! is the plaintext adapted model's, the prompt costs one round trip per
//! adapted group instead of one per group and chunk, and every request the
//! server sees has its session's width. The client counts the activation
//! values of real positions only (not the padding) for its bits per value.

mod common;

use std::sync::Arc;

use cipherlora_model::{LoadOptions, LoraAdapter, Model, Proj, Tokenizer, WeightMode, fetch};
use cipherlora_private::{
    ByWidth, ConnectOptions, DraftLength, Grouping, HeAdapter, HeTimings, InProcess,
    InProcessOpener, SessionMemory, WireDensity, connect_with,
};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, PrefillSpan, SpecConfig, SpecOutput};
use cipherlora_speculative::schedule::{FixedPoint, Prefill, Schedule};

use common::{adapter_dir, assert_matches, plaintext_reference};

const PREFILL_WIDTH: usize = 8;

fn setup(adapter: &str) -> (Model, Tokenizer, Arc<HeAdapter>, LoraAdapter) {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )
    .unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let dir = adapter_dir(adapter);
    let server = Arc::new(HeAdapter::load(&dir, model.config()).unwrap());
    let plain = LoraAdapter::load(&dir, model.config()).unwrap();
    (model, tok, server, plain)
}

/// Input and delta values per position the adapter's groups carry (FFA:
/// Σr; standard: each group's d_in, q,k,v sharing one input), adapters on
/// q,k,v,o.
fn values_per_position(plain: &LoraAdapter, ffa: bool) -> (u64, u64) {
    let (mut up, mut down) = (0, 0);
    for layer in 0..plain.num_layers() {
        let mut qkv_input = false;
        for &proj in plain.target_modules() {
            assert!(matches!(proj, Proj::Q | Proj::K | Proj::V | Proj::O));
            let Some(w) = plain.get(layer, proj) else {
                continue;
            };
            let (r, d_in) = w.a.dims2().unwrap();
            down += w.b.dims()[0] as u64;
            if ffa {
                up += r as u64;
            } else if proj == Proj::O || !qkv_input {
                up += d_in as u64;
                qkv_input |= proj != Proj::O;
            }
        }
    }
    (up, down)
}

/// Checks the prefill's counted values against the real positions and
/// that every floor lies below its bits per value.
fn check_values(prefill: &HeTimings, positions: usize, per_position: (u64, u64)) {
    let n = positions as u64;
    assert_eq!(prefill.values_up, n * per_position.0, "values up");
    assert_eq!(prefill.values_down, n * per_position.1, "values down");
    let w = WireDensity::of(prefill);
    let (up, floor_up) = (w.bits_up.unwrap(), w.floor_up.unwrap());
    let (down, floor_down) = (w.bits_down.unwrap(), w.floor_down.unwrap());
    assert!(floor_up < up && floor_down < down, "{w}");
    // A ciphertext coefficient carries at least a few bits, at most its
    // 180-bit modulus.
    assert!((4.0..180.0).contains(&floor_up), "{w}");
    assert!((4.0..180.0).contains(&floor_down), "{w}");
}

/// Prefill round trips and group requests of one generation, its output and
/// its prefill's traffic.
fn run(
    (model, tok, server): (&Model, &Tokenizer, &Arc<HeAdapter>),
    prompt: &[u32],
    (schedule, grouping): (Schedule, Option<Grouping>),
    span: usize,
) -> (SpecOutput, u64, u64, usize, HeTimings) {
    let mut opener = InProcessOpener {
        server: server.clone(),
        link: LinkProfile::LOOPBACK,
    };
    let options = ConnectOptions {
        draft: DraftLength::Fixed(4),
        acceptance_prior: None,
        prefill_width: cipherlora_private::PrefillWidth::Fixed(PREFILL_WIDTH),
        schedule: Some(schedule),
        grouping,
        planning_link: None,
    };
    let session = connect_with(&mut opener, &options, (model, model)).unwrap();
    let mut hook: ByWidth<InProcess> = session.hook;
    let cfg = SpecConfig {
        prefill_width: Some(PREFILL_WIDTH),
        prefill_span: PrefillSpan::Positions(span),
        schedule,
        ..common::greedy_spec(4, 6, tok)
    };
    let out = decode::generate(model, prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
    let groups = hook
        .session(PREFILL_WIDTH)
        .expect("prefill session")
        .pass_model()
        .groups;
    let prefill = hook.timings().without(&hook.timings_since_prefill());
    let (mut trips, mut requests) = (0, 0);
    for (_, h) in hook.into_sessions() {
        let (all, decode) = (h.timings().clone(), h.timings_since_prefill());
        trips += all.round_trips - decode.round_trips;
        requests += all.rounds - decode.rounds;
    }
    (out, trips, requests, groups, prefill)
}

#[test]
fn a_wide_prefill_pass_is_exact_and_pays_one_round_trip_per_group() {
    let (model, tok, server, plain) = setup("code-ffa-r16");
    // About 40 tokens: five prefill chunks of 8, the last one short.
    let text = format!("{}{}", common::PROMPTS[0], common::PROMPTS[4]);
    let prompt = tok.encode(&text).unwrap();
    assert!(prompt.len() > 4 * PREFILL_WIDTH, "{}", prompt.len());
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 6);
    let prefilled = prompt.len() - 1;
    let fixed_point = FixedPoint {
        prefill: Prefill::PerGroup,
        ..FixedPoint::default()
    };
    // A verify session grouped by layers cannot serve a per-group pass.
    for (schedule, grouping) in [
        (Schedule::PerGroup, None),
        (Schedule::FixedPoint(fixed_point), None),
        (
            Schedule::FixedPoint(fixed_point),
            Some(Grouping::ByLayers(2)),
        ),
    ] {
        let parts = (&model, &tok, &server);
        let how = (schedule, grouping);
        let (chunked, chunked_trips, _, groups, _) = run(parts, &prompt, how, PREFILL_WIDTH);
        let (wide, wide_trips, wide_requests, _, traffic) = run(parts, &prompt, how, 512);
        // The wide pass's last request is zero-padded: only real positions count.
        check_values(&traffic, prefilled, values_per_position(&plain, true));
        assert_matches(&chunked, &want, &tok, &format!("{how:?}, chunked"));
        assert_matches(&wide, &want, &tok, &format!("{how:?}, wide"));
        let chunks = prefilled.div_ceil(PREFILL_WIDTH) as u64;
        assert_eq!(chunked_trips, chunks * groups as u64, "{how:?}");
        assert_eq!(wide_trips, groups as u64, "{how:?}: one trip per group");
        assert!(
            wide_requests >= 2 * groups as u64,
            "{how:?}: each group's input is split ({wide_requests} requests)"
        );
        assert_eq!(wide.stats.prefill_passes, 1);
        assert_eq!(chunked.stats.prefill_passes, chunks as usize);
    }
}

#[test]
fn a_standard_adapter_prefills_a_short_prompt_below_every_width_exactly() {
    let (model, tok, server, plain) = setup("general-lora-r16");
    let prompt = tok.encode("The river").unwrap();
    assert!(prompt.len() < PREFILL_WIDTH);
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 6);
    let how = (Schedule::PerGroup, None);
    let (got, trips, _, groups, traffic) = run((&model, &tok, &server), &prompt, how, 512);
    assert_matches(&got, &want, &tok, "short prompt");
    // The prompt's last token opens the first verify pass.
    check_values(
        &traffic,
        prompt.len() - 1,
        values_per_position(&plain, false),
    );
    assert_eq!(trips, groups as u64);
}

/// A server whose session memory holds one width's diagonals but not two: the prefill session is
/// refused at capacity, the client opens the verify session alone and prefills through it in
/// requests of its width, and the output is still the plaintext adapted model's.
#[test]
fn a_server_with_room_for_one_width_serves_the_prompt_through_the_verify_session() {
    let (model, tok, server, plain) = setup("general-lora-r16");
    let need = |t| {
        server
            .offer_grouped(t, Grouping::ByInput)
            .unwrap()
            .diagonal_bytes()
            .unwrap()
    };
    let (wide, verify) = (need(PREFILL_WIDTH), need(5));
    let mut small = HeAdapter::load(&adapter_dir("general-lora-r16"), model.config()).unwrap();
    small.set_session_memory(SessionMemory::new(wide.max(verify) + 1));
    let mut opener = InProcessOpener {
        server: Arc::new(small),
        link: LinkProfile::LOOPBACK,
    };
    let options = ConnectOptions {
        draft: DraftLength::Fixed(4),
        acceptance_prior: None,
        prefill_width: cipherlora_private::PrefillWidth::Fixed(PREFILL_WIDTH),
        schedule: Some(Schedule::PerGroup),
        grouping: None,
        planning_link: None,
    };
    let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
    let mut hook: ByWidth<InProcess> = session.hook;
    assert!(hook.session(PREFILL_WIDTH).is_none(), "two widths held");
    assert!(hook.session(5).is_some());
    let text = format!("{}{}", common::PROMPTS[0], common::PROMPTS[4]);
    let prompt = tok.encode(&text).unwrap();
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 6);
    let cfg = SpecConfig {
        prefill_width: Some(PREFILL_WIDTH),
        schedule: Schedule::PerGroup,
        ..common::greedy_spec(4, 6, &tok)
    };
    let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
    assert_matches(&got, &want, &tok, "one width");
}
