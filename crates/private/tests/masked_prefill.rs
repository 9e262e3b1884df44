//! Masked ring values end to end on the default model: the client fills its mask pools through
//! the offline phase (batched BFV on the server), then generates greedily with a hook that runs
//! each pass on pooled masks while every group has enough and on the plaintext adapter after.
//! The output equals the plaintext adapted model's; the online messages carry 60 bits per input
//! value up and 32 per delta value down; a used mask is refused.

#[allow(dead_code)]
mod common;

use std::sync::Arc;

use cipherlora_helora::HeloraError;
use cipherlora_helora::masks::{LedgerLimits, MaskError};
use cipherlora_model::{
    GenerateOptions, LoadOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer,
    WeightMode, fetch, generate,
};
use cipherlora_private::Transport;
use cipherlora_private::client::masked::{InProcessMasked, MaskedClient, MaskedHook, offline_keys};
use cipherlora_private::protocol::LoraKind;
use cipherlora_private::protocol::masked::offline_context;
use cipherlora_private::protocol::masked::{Addressed, masked_request};
use cipherlora_private::server::masked::{MaskedSession, offline_plans};
use cipherlora_private::{AdapterGroups, PrivateError};

use common::{PROMPTS, adapter_dir, plaintext_reference};

/// Positions per offline batch.
const BATCH: usize = 8;
/// New tokens per generation.
const TOKENS: usize = 6;

fn run(adapter: &str, kind: LoraKind) {
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )
    .unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let plain = LoraAdapter::load(&adapter_dir(adapter), model.config()).unwrap();
    // The server's groups in the model's row layout, so the deltas need no permutation.
    let groups = AdapterGroups::from_adapter(&plain, kind).unwrap();
    let ctx = offline_context().unwrap();
    let plans = offline_plans(&ctx, &groups, BATCH).unwrap();
    let (sk, keys) = offline_keys(&ctx, &plans).unwrap();
    let session = Arc::new(
        MaskedSession::open(
            &ctx,
            &groups,
            &plans,
            keys.public_key,
            keys.galois_keys,
            LedgerLimits::default(),
        )
        .unwrap(),
    );
    let to = Addressed {
        session_id: bytes::Bytes::from_static(&[7; 16]),
        plan_id: 1,
    };
    let mut client = MaskedClient::new(
        &sk,
        kind,
        to.clone(),
        session.offer(),
        &groups.public_a(),
        64 << 20,
    )
    .unwrap();
    let mut transport = InProcessMasked::new(session.clone());

    // Masks for the prompt's pass and the first two decoding steps; the rest falls back.
    let prompt = tok.encode(PROMPTS[0]).unwrap();
    let want = plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);
    client.fill(&mut transport, prompt.len() + 2).unwrap();
    let pooled = client.ready();
    assert!(pooled >= prompt.len() + 2 && pooled < prompt.len() + 2 + BATCH);
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingParams::greedy(),
        eos: tok.eos_tokens().to_vec(),
    };
    let mut hook = MaskedHook::new(PlainLora::new(&plain), &mut client, &mut transport);
    let got = generate(&model, &prompt, &opts, &mut hook, &mut |_| Ok(())).unwrap();
    assert_eq!(got.tokens, want, "{adapter}: masked output differs");
    let passes = hook.passes;
    let masked_passes = 1 + (pooled - prompt.len()).min(TOKENS - 1);
    assert_eq!(passes, (masked_passes, TOKENS - masked_passes, 0));

    // Bits per value of the online messages: 60 up, 32 down, plus each row's mask reference
    // (a few bytes; FFA rows are only Σr values long) and each request's header.
    let positions = (prompt.len() + masked_passes - 1) as f64;
    let (up_values, down_values) = values_per_position(&groups);
    let online = &client.online;
    assert_eq!((online.bytes_up, online.bytes_down), transport.online_bytes);
    assert_eq!(
        (online.values_up, online.values_down),
        (
            (positions * up_values) as u64,
            (positions * down_values) as u64
        ),
        "{adapter}: values counted"
    );
    let (up, down) = transport.online_bytes;
    let bits_up = up as f64 * 8.0 / (positions * up_values);
    let bits_down = down as f64 * 8.0 / (positions * down_values);
    assert!(
        (60.0..64.0).contains(&bits_up),
        "{adapter}: {bits_up} bits up"
    );
    assert!(
        (32.0..33.0).contains(&bits_down),
        "{adapter}: {bits_down} bits down"
    );

    // A request naming a used mask is refused, whatever it carries.
    let g = &session.offer()[0];
    let width = g.plan.plan.shape.d_in.max(1);
    let used = cipherlora_helora::masks::MaskRef {
        batch: 0,
        position: 0,
    };
    let req = masked_request(
        &to,
        99,
        g.plan.key,
        &[used],
        &vec![1; mask_width(g, kind, width)],
    );
    let mut transport = InProcessMasked::new(session);
    let refused = transport.round(&req).map(|r| r.response);
    assert!(
        matches!(
            refused,
            Err(PrivateError::Helora(HeloraError::Mask(
                MaskError::MaskReused { .. } | MaskError::BatchClosed { .. }
            )))
        ),
        "{refused:?}"
    );
}

/// Input values per position: the group's d_in (standard) or total rank (FFA).
fn mask_width(
    g: &cipherlora_private::protocol::masked::MaskedOfferGroup,
    kind: LoraKind,
    d_in: usize,
) -> usize {
    match kind {
        LoraKind::Standard => d_in,
        LoraKind::Ffa => g.plan.plan.shape.total_rank(),
    }
}

/// Input and delta values per position over every group.
fn values_per_position(groups: &AdapterGroups) -> (f64, f64) {
    let (mut up, mut down) = (0, 0);
    for g in &groups.groups {
        let shape = g.adapter.shape();
        up += match groups.kind {
            LoraKind::Standard => shape.d_in,
            LoraKind::Ffa => shape.total_rank(),
        };
        down += shape.d_outs.iter().sum::<usize>();
    }
    (up as f64, down as f64)
}

#[test]
fn ffa_masked_passes_give_the_plaintext_adapted_answer() {
    run("code-ffa-r16", LoraKind::Ffa);
}

#[test]
fn standard_masked_passes_give_the_plaintext_adapted_answer() {
    run("code-lora-r16", LoraKind::Standard);
}

/// Over gRPC with TLS and a token: the backend opens a masked session (offer-only first, then
/// with the client's batched-BFV keys), the client fills its pools and generates; the answer is
/// the plaintext adapted model's, and a request naming a used mask is refused with
/// `FAILED_PRECONDITION` / `mask_refused`, after which the hook falls back without failing.
#[test]
fn grpc_masked_session_gives_the_plaintext_adapted_answer_and_refuses_a_used_mask() {
    use std::net::SocketAddr;

    use cipherlora_proto::ErrorReason;
    use cipherlora_service::auth::TokenSet;
    use cipherlora_service::{ClientConfig, ServeConfig, ServerThread, dev_cert};

    const TOKEN: &str = "masked-test-token-0123456789abcdef";
    let adapter = "code-ffa-r16";
    let path = fetch::ensure_default_model().expect("default model");
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::for_model(&path).unwrap();
    let plain = LoraAdapter::load(&adapter_dir(adapter), model.config()).unwrap();
    let backend =
        cipherlora_private::HeBackend::load(adapter, &adapter_dir(adapter), model.config())
            .unwrap();
    let cert = dev_cert(&["localhost"]).unwrap();
    let mut config = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.tls = Some(cert.server_tls());
    config.tokens = Some(TokenSet::new(&[TOKEN]).unwrap());
    let server = ServerThread::start(config, vec![Arc::new(backend)], 2).unwrap();
    let mut client = ClientConfig::new(format!("https://localhost:{}", server.addr().port()));
    client.tls = Some(cert.client_tls("localhost"));
    client.token = Some(TOKEN.into());

    let (masked, mut transport) =
        cipherlora_private::remote::open_masked(client, adapter, BATCH, 64 << 20, model.config())
            .unwrap();
    // Longer than one online request: each group's rows go out as pipelined requests.
    let prompt = tok.encode(&PROMPTS[1..4].concat()).unwrap();
    assert!(prompt.len() > cipherlora_private::client::masked::ROWS_PER_REQUEST);
    let want = plaintext_reference(&model, &tok, &plain, &prompt, TOKENS);
    let mut masked = masked;
    masked.fill(&mut transport, prompt.len() + 1).unwrap();
    let mut hook =
        MaskedHook::new(PlainLora::new(&plain), &mut masked, &mut transport).prompt_only();
    // Speculative decoding as the endpoint runs it: the prompt in one group-by-group pass, its
    // last row giving the first token, then verify passes of K + 1 = 4 positions.
    let cfg = cipherlora_speculative::decode::SpecConfig {
        first_token_from_prefill: true,
        ..cipherlora_speculative::decode::SpecConfig::greedy(3, TOKENS, tok.eos_tokens().to_vec())
    };
    let got =
        cipherlora_speculative::decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(()))
            .unwrap();
    assert_eq!(got.tokens, want, "masked output over gRPC differs");
    // The prompt's pass only, although masks for a decoding step are left.
    assert_eq!((hook.passes.0, hook.passes.2), (1, 0), "{:?}", hook.passes);
    assert!(hook.passes.1 >= 1);
    assert_eq!(hook.masked_positions, prompt.len());
    // The prompt's pass ran as a wavefront of chunks.
    use cipherlora_private::client::masked::{ROWS_PER_REQUEST, WAVEFRONT_CHUNKS};
    let rows = prompt
        .len()
        .div_ceil(WAVEFRONT_CHUNKS)
        .min(ROWS_PER_REQUEST);
    assert_eq!(hook.masked_chunks, prompt.len().div_ceil(rows));

    // Batch 0 of the first group is used up: naming it again is refused.
    let client = &masked;
    let key = client.first_key().unwrap();
    let width = client.width(key).unwrap();
    let to = Addressed {
        session_id: bytes::Bytes::new(),
        plan_id: 0,
    };
    let used = cipherlora_helora::masks::MaskRef {
        batch: 0,
        position: 0,
    };
    let req = masked_request(&to, 1, key, &[used], &vec![1; width]);
    match transport.round(&req) {
        Err(PrivateError::Service(e)) => {
            assert_eq!(e.reason(), Some(ErrorReason::MaskRefused), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(server);
}
