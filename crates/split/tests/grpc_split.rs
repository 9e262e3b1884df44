//! Split inference over gRPC on loopback with the real default model (SmolLM2-135M-Instruct Q4_1):
//! the output equals the whole model's greedy output run locally (an independent path:
//! `cipherlora_model::generate`, one position per pass, one KV cache of all layers), also across a
//! server restart (the session replayed), with lookahead decoding's token trees too, and every
//! malformed call gets its typed status.

use std::net::SocketAddr;
use std::sync::Arc;

use cipherlora_model::{GenerateOptions, Model, NoAdapter, SamplingParams};
use cipherlora_proto::ErrorReason;
use cipherlora_proto::split::v1::{ActivationEncoding, ForwardRequest};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{
    ClientConfig, Limits, ServeConfig, ServerThread, ServiceError, SplitBackend, SplitClient,
    dev_cert,
};
use cipherlora_speculative::ngram::AdaptiveLookup;
use cipherlora_split::{
    DraftMethod, LocalMiddle, Lookahead, MiddleLayers, MiddlePass, ModelBackend, ReplayingClient,
    SplitConfig, SplitError, generate,
};
use tonic::Code;

mod common;
use common::model;

fn serve(limits: Limits, max_capacity: u32) -> ServerThread {
    serve_on("127.0.0.1:0".parse().unwrap(), limits, max_capacity)
}

fn serve_on(addr: SocketAddr, limits: Limits, max_capacity: u32) -> ServerThread {
    let mut config = ServeConfig::new(addr);
    config.limits = limits;
    let backend: Arc<dyn SplitBackend> =
        Arc::new(ModelBackend::new(model().0.clone(), max_capacity));
    ServerThread::start_serving(config, Vec::new(), Some(backend), 2, None).expect("server")
}

fn client(server: &ServerThread) -> SplitClient {
    SplitClient::connect(&ClientConfig::new(format!("http://{}", server.addr()))).expect("connect")
}

const PROMPTS: [&str; 5] = [
    "Once upon a time, there was a little",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
    "List the days of the week: Monday, Tuesday, Wednesday,",
    "Water boils at 100 degrees Celsius. At sea level, water boils at",
];

const TOKENS: usize = 32;

fn local_greedy(m: &Model, prompt: &[u32]) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingParams::greedy(),
        eos: Vec::new(),
    };
    cipherlora_model::generate(m, prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))
        .unwrap()
        .tokens
}

#[test]
fn split_generation_over_grpc_equals_local_greedy() {
    let (m, tok) = model();
    let server = serve(Limits::default(), 4096);
    let (mut accepted, mut tree_accepted) = (0, 0);
    for text in PROMPTS {
        let prompt = tok.encode(text).unwrap();
        let want = local_greedy(m, &prompt);
        let lookahead = DraftMethod::Lookahead(Lookahead::default());
        // N = 2: the window is level 0 alone (one node beside I).
        let small: Lookahead = "2,2,3".parse().unwrap();
        for (a, b, drafter) in [
            (1, 1, DraftMethod::default()),
            (2, 2, DraftMethod::default()),
            (4, 4, DraftMethod::default()),
            (2, 2, lookahead),
            (3, 1, DraftMethod::Lookahead(small)),
            (
                1,
                3,
                DraftMethod::AdaptivePromptLookup(AdaptiveLookup::default()),
            ),
        ] {
            let config = SplitConfig {
                head_layers: a,
                tail_layers: b,
                k: 4,
                max_tokens: TOKENS,
                eos: Vec::new(),
                drafter,
                sampling: SamplingParams::greedy(),
            };
            let mut c = client(&server);
            let cap = u32::try_from(config.capacity(prompt.len())).unwrap();
            let info = c.open(a as u32, b as u32, cap).unwrap();
            assert_eq!(info.end_layer as usize, m.config().num_layers - b);
            let mut streamed = Vec::new();
            let out = generate(m, &prompt, &config, &mut c, &mut |t| streamed.push(t)).unwrap();
            assert_eq!(out.tokens, want, "split ({a}, {b}) {drafter:?} on {text:?}");
            assert_eq!(streamed, want);
            // One Forward per step, nothing else on the wire.
            assert_eq!(c.stats().forwards, out.steps.len() as u64);
            assert!(out.steps.len() <= TOKENS);
            accepted += out.steps.iter().map(|s| s.accepted).sum::<usize>();
            if let DraftMethod::Lookahead(l) = drafter {
                // Every step sent a tree: pending rows, the trie, the window (but on the last
                // token).
                let last = out.steps.len() - 1;
                for s in &out.steps[1..last] {
                    assert_eq!(s.positions, 1 + s.drafted + l.branch_nodes());
                }
                tree_accepted += out.steps.iter().map(|s| s.accepted).sum::<usize>();
            }
            c.close().unwrap();
        }
    }
    // Drafts must have been accepted somewhere, by lookahead too (else rollback, compaction and
    // multi-token steps went untested).
    assert!(accepted > 0 && tree_accepted > 0);
}

/// Lookahead with the middle layers in process (no transport) and across a server restart (the
/// record compacted like the server's cache, then replayed as a chain) still gives the local
/// model's greedy output.
#[test]
fn lookahead_in_process_and_replayed_equals_local_greedy() {
    let (m, tok) = model();
    let config = SplitConfig {
        drafter: DraftMethod::Lookahead(Lookahead::default()),
        ..split_2_2()
    };
    let prompt = tok.encode(PROMPTS[3]).unwrap();
    let want = local_greedy(m, &prompt);
    let mut mid = LocalMiddle::new(m.clone(), 2, 2, config.capacity(prompt.len())).unwrap();
    let out = generate(m, &prompt, &config, &mut mid, &mut |_| {}).unwrap();
    assert_eq!(out.tokens, want, "in process");
    let emitted: usize = out.steps.iter().map(|s| s.emitted).sum();
    assert!(out.steps.len() < emitted, "no step kept a draft");

    let prompt = tok.encode(PROMPTS[2]).unwrap();
    let want = local_greedy(m, &prompt);
    let mut server = Some(serve(Limits::default(), 4096));
    let mut mid = replaying(server.as_ref().unwrap(), &config, prompt.len());
    let mut on_token = stop_server_after(9, &mut server, true);
    let out = generate(m, &prompt, &config, &mut mid, &mut on_token).unwrap();
    assert_eq!(out.tokens, want, "replayed");
    assert_eq!(mid.replays(), 1);
}

#[test]
fn no_draft_and_in_process_middle_give_the_same_tokens() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPTS[1]).unwrap();
    let want = local_greedy(m, &prompt);
    let config = SplitConfig {
        head_layers: 3,
        tail_layers: 2,
        k: 0,
        max_tokens: TOKENS,
        eos: Vec::new(),
        drafter: DraftMethod::None,
        sampling: SamplingParams::greedy(),
    };
    let mut mid = LocalMiddle::new(m.clone(), 3, 2, config.capacity(prompt.len())).unwrap();
    let out = generate(m, &prompt, &config, &mut mid, &mut |_| {}).unwrap();
    assert_eq!(out.tokens, want);
    assert_eq!(out.steps.len(), TOKENS);
}

/// An end token stops generation before it is emitted, and the token limit cuts a step whose
/// accepted drafts would pass it, both exactly where the local model's greedy output stops.
#[test]
fn end_tokens_and_the_token_limit_cut_where_the_local_model_does() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPTS[3]).unwrap();
    let want = local_greedy(m, &prompt);
    let run = |max_tokens: usize, eos: Vec<u32>| {
        let config = SplitConfig {
            head_layers: 2,
            tail_layers: 2,
            k: 4,
            max_tokens,
            eos,
            drafter: DraftMethod::default(),
            sampling: SamplingParams::greedy(),
        };
        let mut mid = LocalMiddle::new(m.clone(), 2, 2, config.capacity(prompt.len())).unwrap();
        generate(m, &prompt, &config, &mut mid, &mut |_| {}).unwrap()
    };
    for n in [1, 2, 7, 13] {
        let out = run(n, Vec::new());
        assert_eq!(out.tokens, want[..n], "max_tokens {n}");
        assert!(!out.stopped_at_eos);
    }
    // The first token that does not occur earlier in the output ends it.
    let cut = (1..TOKENS)
        .find(|&i| !want[..i].contains(&want[i]))
        .expect("a fresh token");
    let out = run(TOKENS, vec![want[cut]]);
    assert_eq!(out.tokens, want[..cut]);
    assert!(out.stopped_at_eos);
}

#[test]
fn tls_and_bearer_token_are_enforced() {
    let dev = dev_cert(&["localhost", "127.0.0.1"]).unwrap();
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    config.tls = Some(dev.server_tls());
    config.tokens = Some(TokenSet::new(&["split-secret-token-17"]).unwrap());
    let backend: Arc<dyn SplitBackend> = Arc::new(ModelBackend::new(model().0.clone(), 256));
    let server = ServerThread::start_serving(config, Vec::new(), Some(backend), 1, None).unwrap();
    let mut cc = ClientConfig::new(format!("https://localhost:{}", server.addr().port()));
    cc.tls = Some(dev.client_tls("localhost"));
    cc.token = Some("wrong-token-of-enough-bytes".into());
    let mut bad = SplitClient::connect(&cc).unwrap();
    let e = bad.describe().unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    cc.token = Some("split-secret-token-17".into());
    let mut good = SplitClient::connect(&cc).unwrap();
    let info = good.describe().unwrap();
    assert_eq!(info.num_layers as usize, model().0.config().num_layers);
    good.open(2, 2, 16).unwrap();
}

/// A refusal's code and reason.
type Refusal = (Code, Option<ErrorReason>);

fn refused(e: ServiceError) -> Refusal {
    (e.code().expect("an rpc status"), e.reason())
}

#[test]
fn malformed_calls_get_typed_statuses_and_leave_the_session_usable() {
    let (m, _) = model();
    let d = m.config().hidden_size;
    let n = m.config().num_layers;
    // One (1, 1) session of 64 positions holds 28 layers' KV: 2.75 MiB.
    let limits = Limits {
        max_message_bytes: 256 << 10,
        max_key_bytes_per_token: 4 << 20,
        ..Limits::default()
    };
    let server = serve(limits, 64);
    let mut c = client(&server);
    let invalid = (Code::InvalidArgument, Some(ErrorReason::InvalidActivations));
    let exhausted = (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded));

    // Opening: a bad split, a capacity over the limit, memory per token.
    for (a, b) in [(0, 1), (1, 0), (15, 15), (u32::MAX, 2)] {
        let e = c.open(a, b, 8).unwrap_err();
        assert_eq!(e.code(), Some(Code::InvalidArgument), "({a}, {b})");
    }
    assert_eq!(refused(c.open(1, 1, 65).unwrap_err()), exhausted);
    assert_eq!(
        c.open(1, 1, 0).unwrap_err().code(),
        Some(Code::InvalidArgument)
    );
    c.open(1, 1, 64).unwrap();
    // A second session would overrun the server's memory: a capacity
    // refusal, which a client may retry later, not a limit on the request.
    let mut other = client(&server);
    let full = (Code::ResourceExhausted, Some(ErrorReason::AtCapacity));
    assert_eq!(refused(other.open(1, 1, 64).unwrap_err()), full);

    let id = c.session().unwrap().0.to_bytes();
    let x: Vec<f32> = (0..3 * d)
        .map(|i| ((i % 97) as f32 - 48.0) / 50.0)
        .collect();
    let req = |start: u64, positions: u32, values: &[f32]| ForwardRequest {
        session_id: id.clone(),
        start,
        positions,
        encoding: ActivationEncoding::F32Le as i32,
        hidden: cipherlora_proto::activations::encode_f32(values),
        tree_parents: Vec::new(),
        keep: Vec::new(),
    };
    let cases: Vec<(&str, ForwardRequest, Refusal)> = vec![
        (
            "unknown session",
            ForwardRequest {
                session_id: bytes::Bytes::from(vec![7u8; 16]),
                ..req(0, 3, &x)
            },
            (Code::NotFound, Some(ErrorReason::UnknownSession)),
        ),
        (
            "short session id",
            ForwardRequest {
                session_id: bytes::Bytes::from(vec![7u8; 3]),
                ..req(0, 3, &x)
            },
            (Code::InvalidArgument, Some(ErrorReason::MalformedRequest)),
        ),
        ("wrong byte length", req(0, 2, &x), invalid),
        ("wrong width", req(0, 3, &x[..3 * d - 3]), invalid),
        ("no positions", req(0, 0, &[]), invalid),
        (
            "NaN",
            {
                let mut y = x.clone();
                y[d + 5] = f32::NAN;
                req(0, 3, &y)
            },
            invalid,
        ),
        (
            "infinity",
            {
                let mut y = x.clone();
                y[0] = f32::NEG_INFINITY;
                req(0, 3, &y)
            },
            invalid,
        ),
        ("start beyond the cache", req(1, 3, &x), invalid),
        (
            "unknown encoding",
            ForwardRequest {
                encoding: 0,
                ..req(0, 3, &x)
            },
            (Code::InvalidArgument, Some(ErrorReason::MalformedRequest)),
        ),
        (
            "over the session's capacity",
            req(0, 65, &vec![0.5; 65 * d]),
            exhausted,
        ),
        (
            "oversized message",
            req(0, 120, &vec![0.5; 120 * d]),
            (Code::OutOfRange, None),
        ),
    ];
    for (what, r, want) in cases {
        let e = c.forward_raw(r).unwrap_err();
        assert_eq!(refused(e), want, "{what}");
    }

    // The session still computes what the same layers compute in process, including after a
    // rollback by `start`.
    let mut reference = LocalMiddle::new(m.clone(), 1, 1, 64).unwrap();
    let want = reference.forward(0, 3, &x).unwrap().hidden;
    assert_eq!(c.forward(0, 3, &x).unwrap(), want);
    let again = reference.forward(1, 2, &x[d..]).unwrap().hidden;
    assert_eq!(c.forward(1, 2, &x[d..]).unwrap(), again);
    assert_eq!(c.truncate(2).unwrap(), 2);
    assert_eq!(
        refused(c.forward_raw(req(3, 1, &x[..d])).unwrap_err()),
        invalid
    );
    assert!(n > 2);

    // Closed: the id is unknown; memory is free for another session.
    c.close().unwrap();
    let e = c.forward_raw(req(0, 3, &x)).unwrap_err();
    assert_eq!(
        refused(e),
        (Code::NotFound, Some(ErrorReason::UnknownSession))
    );
    other.open(1, 1, 64).unwrap();
}

/// Malformed tree masks and keep lists get `invalid_tree` (a start beyond the cache
/// `invalid_activations`, a pass over the capacity `limit_exceeded`) and change nothing: honest
/// tree passes afterwards compute what the same layers compute in process, and the rows a keep list
/// retains behave as the causal chain they form.
#[test]
fn malformed_trees_and_keep_lists_get_typed_statuses() {
    let (m, _) = model();
    let d = m.config().hidden_size;
    let limits = Limits {
        max_message_bytes: 256 << 10,
        ..Limits::default()
    };
    let server = serve(limits, 64);
    let mut c = client(&server);
    let info = c.open(1, 1, 64).unwrap();
    assert!(info.tree_passes);
    let x: Vec<f32> = (0..3 * d)
        .map(|i| ((i % 89) as f32 - 44.0) / 40.0)
        .collect();
    let mut reference = LocalMiddle::new(m.clone(), 1, 1, 64).unwrap();
    assert_eq!(
        c.forward(0, 3, &x).unwrap(),
        reference.forward(0, 3, &x).unwrap().hidden
    );
    let id = c.session().unwrap().0.to_bytes();
    let req = |start: u64, positions: u32, parents: Vec<u32>, keep: Vec<u32>| ForwardRequest {
        session_id: id.clone(),
        start,
        positions,
        encoding: ActivationEncoding::F32Le as i32,
        hidden: cipherlora_proto::activations::encode_f32(&vec![0.25; positions as usize * d]),
        tree_parents: parents,
        keep,
    };
    let tree = (Code::InvalidArgument, Some(ErrorReason::InvalidTree));
    let cases: Vec<(&str, ForwardRequest, Refusal)> = vec![
        ("too few parents", req(3, 3, vec![0, 1], vec![]), tree),
        ("too many parents", req(3, 1, vec![0, 1], vec![]), tree),
        (
            "a row its own parent",
            req(3, 3, vec![0, 2, 1], vec![]),
            tree,
        ),
        ("a later parent", req(3, 2, vec![2, 0], vec![]), tree),
        ("keep not increasing", req(0, 1, vec![], vec![1, 1]), tree),
        ("keep decreasing", req(0, 1, vec![], vec![2, 0]), tree),
        ("keep out of range", req(1, 1, vec![], vec![0, 2]), tree),
        ("keep at the cache's end", req(3, 1, vec![], vec![0]), tree),
        (
            "start beyond the cache",
            req(4, 1, vec![0], vec![0]),
            (Code::InvalidArgument, Some(ErrorReason::InvalidActivations)),
        ),
        (
            "kept rows and the pass over the capacity",
            req(0, 62, vec![], vec![0, 1, 2]),
            (Code::ResourceExhausted, Some(ErrorReason::LimitExceeded)),
        ),
    ];
    for (what, r, want) in cases {
        let e = c.forward_raw(r).unwrap_err();
        assert_eq!(refused(e), want, "{what}");
    }

    // Nothing changed: a tree pass (rows 0 -> 1, and 2 off the prefix) at position 3, then a pass
    // that keeps rows 0 and 1 of it.
    let tree_pass = MiddlePass {
        start: 3,
        keep: &[],
        parents: &[None, Some(0), None],
        positions: 3,
        hidden: &x,
    };
    let want = reference.forward_pass(&tree_pass).unwrap().hidden;
    let got = c.forward_tree(3, &[], tree_pass.parents, 3, &x).unwrap();
    assert_eq!(got, want);
    let next = MiddlePass {
        start: 3,
        keep: &[0, 1],
        parents: &[],
        positions: 1,
        hidden: &x[2 * d..],
    };
    let want = reference.forward_pass(&next).unwrap().hidden;
    assert_eq!(
        c.forward_tree(3, &[0, 1], &[], 1, &x[2 * d..]).unwrap(),
        want
    );
    // The kept rows are the chain x[0], x[1] at positions 3, 4: a session that ran them causally
    // computes the same (up to summation order).
    let mut chain = LocalMiddle::new(m.clone(), 1, 1, 64).unwrap();
    chain.forward(0, 3, &x).unwrap();
    chain.forward(3, 2, &x[..2 * d]).unwrap();
    let causal = chain.forward(5, 1, &x[2 * d..]).unwrap().hidden;
    let err = causal
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        err < 1e-3,
        "compacted rows differ from their chain by {err}"
    );
    // The session goes on.
    assert_eq!(c.truncate(6).unwrap(), 6);
    c.close().unwrap();
}

/// Stops `server` once `at` tokens have been generated (between two steps: `on_token` runs inside
/// the loop) and, with `restart`, starts it again on the same address (a fresh process: no session,
/// a new connection).
fn stop_server_after(
    at: usize,
    server: &mut Option<ServerThread>,
    restart: bool,
) -> impl FnMut(u32) + '_ {
    let mut seen = 0;
    move |_| {
        seen += 1;
        if seen == at
            && let Some(s) = server.take()
        {
            let addr = s.addr();
            s.stop().unwrap();
            if restart {
                *server = Some(serve_on(addr, Limits::default(), 4096));
            }
        }
    }
}

fn replaying(server: &ServerThread, config: &SplitConfig, prompt_len: usize) -> ReplayingClient {
    let cc = ClientConfig::new(format!("http://{}", server.addr()));
    let client = SplitClient::connect(&cc).unwrap();
    let cap = u32::try_from(config.capacity(prompt_len)).unwrap();
    let split = (config.head_layers as u32, config.tail_layers as u32);
    ReplayingClient::open(cc, client, split, cap).unwrap()
}

fn split_2_2() -> SplitConfig {
    SplitConfig {
        head_layers: 2,
        tail_layers: 2,
        k: 4,
        max_tokens: TOKENS,
        eos: Vec::new(),
        drafter: DraftMethod::default(),
        sampling: SamplingParams::greedy(),
    }
}

/// A server restart mid-generation: the client reopens a session, replays the accepted prefix, and
/// the output is still the local model's greedy output.
#[test]
fn a_server_restart_mid_generation_is_replayed_transparently() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPTS[2]).unwrap();
    let want = local_greedy(m, &prompt);
    let config = split_2_2();
    let mut server = Some(serve(Limits::default(), 4096));
    let mut mid = replaying(server.as_ref().unwrap(), &config, prompt.len());
    let mut on_token = stop_server_after(8, &mut server, true);
    let out = generate(m, &prompt, &config, &mut mid, &mut on_token).unwrap();
    assert_eq!(out.tokens, want);
    assert_eq!(mid.replays(), 1);
    // The replay's calls (the prompt and more) are counted in the step that needed them.
    let replayed = out
        .steps
        .iter()
        .filter(|s| s.bytes_up > out.steps[0].bytes_up);
    assert_eq!(replayed.count(), 1);
}

/// A server that stays down: the replay fails with its typed error; with no replay allowed, the
/// loss itself is the error.
#[test]
fn a_lost_server_ends_the_generation_with_a_typed_error() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPTS[0]).unwrap();
    let config = split_2_2();
    for max_replays in [1, 0] {
        let mut server = Some(serve(Limits::default(), 4096));
        let mid = replaying(server.as_ref().unwrap(), &config, prompt.len());
        let mut mid = mid.with_max_replays(max_replays);
        let mut on_token = stop_server_after(4, &mut server, false);
        let e = generate(m, &prompt, &config, &mut mid, &mut on_token).unwrap_err();
        match (max_replays, &e) {
            (1, SplitError::Replay { positions, .. }) => assert!(*positions > prompt.len()),
            (0, SplitError::SessionLost { replays: 0, .. }) => {}
            _ => panic!("max_replays {max_replays}: {e}"),
        }
    }
}
