//! [`cipherlora_private::connect_with`], the one way every front end opens
//! a private session, driven through an in-process adapter server on a
//! given link: auto K on loopback and wan80 opens a prefill and a verify
//! session of the chosen widths, plans a schedule on the link, and the
//! session generates what the plaintext adapted model does; a given K with
//! a forced schedule models nothing and never asks for the link; an `auto`
//! prefill width the server has no room for falls back to a narrower one
//! and asks for no offer twice;
//! diagonals the server encoded before any client serve sessions exactly.

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cipherlora_model::{
    LoadOptions, LoraAdapter, Model, ModelConfig, Tokenizer, WeightMode, fetch,
};
use cipherlora_private::client::{choose_prefill_width, choose_verify_session};
use cipherlora_private::width_plan::{ClientCosts, PlanSpace};
use cipherlora_private::{
    ConnectOptions, DraftLength, Grouping, HeAdapter, HeBackend, HeHook, InProcess,
    InProcessOpener, PrefillWidth, PrivateError, Room, SessionMemory, SessionOpener, connect_with,
};
use cipherlora_service::LinkProfile;
use cipherlora_speculative::decode::{self, SpecConfig};
use cipherlora_speculative::schedule::Schedule;

use common::{adapter_dir, assert_matches, plaintext_reference};

/// An in-process opener that counts its link measurements and records the widths of the offers
/// it is asked for.
struct Counting {
    inner: InProcessOpener,
    measured: AtomicUsize,
    offers: Vec<usize>,
}

impl SessionOpener for Counting {
    type Transport = InProcess;

    fn open(
        &self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<InProcess>, PrivateError> {
        self.inner.open(t, grouping, config)
    }

    fn plan_space(&mut self, t: usize, grouping: Grouping) -> Result<PlanSpace, PrivateError> {
        self.offers.push(t);
        self.inner.plan_space(t, grouping)
    }

    fn measure_link(&self) -> Result<LinkProfile, PrivateError> {
        self.measured.fetch_add(1, Ordering::Relaxed);
        self.inner.measure_link()
    }
}

/// The default model with its weights held as `weights` says.
fn default_model(weights: WeightMode) -> Model {
    let path = fetch::ensure_default_model().expect("default model");
    Model::load_with(&path, &LoadOptions { weights }).unwrap()
}

fn setup() -> (Model, Tokenizer, Arc<HeAdapter>, LoraAdapter) {
    let path = fetch::ensure_default_model().expect("default model");
    let model = default_model(WeightMode::F32);
    let tok = Tokenizer::for_model(&path).unwrap();
    let dir = adapter_dir("code-ffa-r16");
    let server = Arc::new(HeAdapter::load(&dir, model.config()).unwrap());
    let plain = LoraAdapter::load(&dir, model.config()).unwrap();
    (model, tok, server, plain)
}

/// K and schedule chosen by the models (K ≤ 8), beside a prefill session of width 16.
fn auto_k() -> ConnectOptions {
    ConnectOptions {
        draft: DraftLength::Auto {
            k_max: 8,
            trees: None,
        },
        acceptance_prior: None,
        prefill_width: PrefillWidth::Fixed(16),
        schedule: None,
        grouping: None,
        planning_link: None,
    }
}

#[test]
fn auto_k_opens_both_widths_plans_on_the_link_and_generates_exactly() {
    let (model, tok, server, plain) = setup();
    let prompt = tok.encode(common::PROMPTS[0]).unwrap();
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 12);
    for link in [LinkProfile::LOOPBACK, LinkProfile::WAN80] {
        let mut opener = InProcessOpener {
            server: server.clone(),
            link,
        };
        let session = connect_with(&mut opener, &auto_k(), (&model, &model)).unwrap();
        assert_eq!(session.link, Some(link), "the opener's link is planned on");
        let choice = session.width_choice.as_ref().expect("auto K is modelled");
        assert_eq!(choice.best.k + 1, session.verify_width);
        assert!(
            (2..=9).contains(&session.verify_width),
            "{}",
            session.verify_width
        );
        assert!(
            session.schedule_choice.is_some(),
            "auto schedule is modelled"
        );
        for width in [session.verify_width, 16] {
            assert!(
                session.hook.session(width).is_some(),
                "no session of width {width}"
            );
        }
        let mut hook = session.hook;
        let cfg = SpecConfig {
            prefill_width: Some(16),
            schedule: session.schedule,
            ..common::greedy_spec(session.verify_width - 1, 12, &tok)
        };
        let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
        assert_matches(&got, &want, &tok, &format!("{link:?}"));
    }
}

#[test]
fn a_given_k_and_schedule_model_nothing() {
    let (model, _, server, _) = setup();
    let mut opener = Counting {
        inner: InProcessOpener {
            server,
            link: LinkProfile::WAN80,
        },
        measured: AtomicUsize::new(0),
        offers: Vec::new(),
    };
    let options = ConnectOptions {
        draft: DraftLength::Fixed(4),
        acceptance_prior: None,
        prefill_width: PrefillWidth::Fixed(16),
        schedule: Some(Schedule::PerGroup),
        grouping: None,
        planning_link: None,
    };
    let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
    assert_eq!(opener.measured.load(Ordering::Relaxed), 0);
    assert_eq!(session.link, None);
    assert_eq!(session.verify_width, 5);
    assert!(session.width_choice.is_none() && session.schedule_choice.is_none());
    assert_eq!(session.schedule, Schedule::PerGroup);
    let grouped = session.hook.session(5).unwrap().plan_space().grouping;
    assert_eq!(grouped, Grouping::ByInput);
    // A fixed point is modelled on the link: now it is measured, once.
    let options = ConnectOptions {
        schedule: None,
        ..options
    };
    let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
    assert_eq!(opener.measured.load(Ordering::Relaxed), 1);
    assert_eq!(session.link, Some(LinkProfile::WAN80));
}

#[test]
fn an_adapter_the_server_does_not_serve_is_a_typed_refusal() {
    let (model, _, _, _) = setup();
    let dir = adapter_dir("code-ffa-r16");
    let server =
        cipherlora_private::EmbeddedServer::start("code-ffa-r16", &dir, model.config(), None)
            .unwrap();
    let options = ConnectOptions {
        draft: DraftLength::Fixed(2),
        acceptance_prior: None,
        prefill_width: PrefillWidth::Fixed(8),
        schedule: Some(Schedule::PerGroup),
        grouping: None,
        planning_link: None,
    };
    let id = "no-such-adapter";
    let e = cipherlora_private::connect(
        server.client_config(LinkProfile::LOOPBACK),
        id,
        &options,
        (&model, &model),
    )
    .err()
    .expect("an unknown adapter is refused");
    assert!(
        matches!(&e, PrivateError::UnknownAdapter { adapter_id } if adapter_id == id),
        "{e}"
    );
}

#[test]
fn an_auto_prefill_width_asks_for_each_offer_once() {
    let (model, _, server, _) = setup();
    // FFA keeps the narrowest candidate: the offer `auto` chooses from serves the width model too.
    for prefill_width in [PrefillWidth::Auto, PrefillWidth::Fixed(32)] {
        let mut opener = Counting {
            inner: InProcessOpener {
                server: server.clone(),
                link: LinkProfile::WAN20,
            },
            measured: AtomicUsize::new(0),
            offers: Vec::new(),
        };
        let options = ConnectOptions {
            draft: DraftLength::Auto {
                k_max: 4,
                trees: None,
            },
            acceptance_prior: None,
            prefill_width,
            schedule: None,
            grouping: None,
            planning_link: Some(LinkProfile::WAN20),
        };
        let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
        assert_eq!(session.prefill_width, 32, "{prefill_width}");
        assert_eq!(opener.offers, [32], "{prefill_width}");
    }
}

/// Sessions on `server`, with widths chosen from `space`'s shapes, refusing every prefill session
/// wider than `room` the way a server whose memory it exceeds does.
struct Cramped {
    server: InProcessOpener,
    space: PlanSpace,
    room: usize,
    refusal: fn(usize) -> PrivateError,
    asked: Mutex<Vec<usize>>,
}

impl SessionOpener for Cramped {
    type Transport = InProcess;

    fn open(
        &self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<InProcess>, PrivateError> {
        self.asked.lock().unwrap().push(t);
        if t > self.room {
            return Err((self.refusal)(t));
        }
        self.server.open(t, grouping, config)
    }

    fn plan_space(&mut self, t: usize, _: Grouping) -> Result<PlanSpace, PrivateError> {
        Ok(PlanSpace {
            width: Some(t),
            ..self.space.clone()
        })
    }

    fn measure_link(&self) -> Result<LinkProfile, PrivateError> {
        self.server.measure_link()
    }
}

#[test]
fn an_auto_prefill_width_without_room_falls_back_to_a_narrower_one() {
    let (model, tok, server, plain) = setup();
    // The standard adapter's shapes (d = 576) fill their slots at width 128 only.
    let standard = HeAdapter::load(&adapter_dir("general-lora-r16"), model.config()).unwrap();
    let space = PlanSpace::of(&standard.offer_grouped(32, Grouping::ByInput).unwrap());
    let wide = choose_prefill_width(&space).unwrap();
    assert_eq!(wide, 128);
    let over_limit = |t| PrivateError::MemoryBudget {
        got: t as u64,
        need: 2,
        limit: 1,
    };
    let at_capacity = |t| PrivateError::MemoryBudget {
        got: t as u64,
        need: 1,
        limit: 1,
    };
    let prompt = tok.encode(common::PROMPTS[0]).unwrap();
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 8);
    // A given K opens both sessions after choosing; an auto K opens the prefill session while
    // the width model runs.
    let drafts = [
        DraftLength::Fixed(4),
        DraftLength::Auto {
            k_max: 4,
            trees: None,
        },
    ];
    let cases = [
        (usize::MAX, over_limit as fn(usize) -> PrivateError),
        (32, over_limit),
        (32, at_capacity),
    ];
    for (draft, (room, refusal)) in drafts.into_iter().flat_map(|d| cases.map(|c| (d, c))) {
        let options = ConnectOptions {
            draft,
            acceptance_prior: None,
            prefill_width: PrefillWidth::Auto,
            schedule: Some(Schedule::PerGroup),
            grouping: None,
            planning_link: Some(LinkProfile::LOOPBACK),
        };
        let mut opener = Cramped {
            server: InProcessOpener {
                server: server.clone(),
                link: LinkProfile::LOOPBACK,
            },
            space: space.clone(),
            room,
            refusal,
            asked: Mutex::new(Vec::new()),
        };
        let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
        let opened = if room == usize::MAX { wide } else { 32 };
        let k = session.verify_width - 1;
        assert_eq!(session.prefill_width, opened, "room {room}, {draft:?}");
        assert!(session.hook.session(opened).is_some());
        assert!(session.hook.session(k + 1).is_some());
        if room < wide {
            assert_eq!(
                opener.asked.lock().unwrap().first(),
                Some(&wide),
                "the wide width is asked first"
            );
        }
        let mut hook = session.hook;
        let cfg = SpecConfig {
            prefill_width: Some(session.prefill_width),
            schedule: session.schedule,
            ..common::greedy_spec(k, 8, &tok)
        };
        let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
        assert_matches(&got, &want, &tok, &format!("room {room}, {draft:?}"));
    }
}

#[test]
fn diagonals_encoded_before_any_client_serve_its_sessions_exactly() {
    let (model, tok, server, plain) = setup();
    // The verify width's diagonals, encoded with no client keys (as `serve` does at start).
    let early = server
        .prewarm(5, Grouping::ByInput, Room::EvictIdle)
        .unwrap();
    let memory = server.session_memory().clone();
    assert!(early > 0);
    assert_eq!(memory.reserved(), early);
    let options = ConnectOptions {
        draft: DraftLength::Fixed(4),
        acceptance_prior: None,
        prefill_width: PrefillWidth::Fixed(16),
        schedule: Some(Schedule::PerGroup),
        grouping: None,
        planning_link: None,
    };
    let mut opener = InProcessOpener {
        server: server.clone(),
        link: LinkProfile::LOOPBACK,
    };
    let session = connect_with(&mut opener, &options, (&model, &model)).unwrap();
    // The verify session shares them: only the prefill width's diagonals are new.
    let prefill = server.offer(16).unwrap().diagonal_bytes().unwrap();
    assert_eq!(memory.reserved(), early + prefill);
    let prompt = tok.encode(common::PROMPTS[0]).unwrap();
    let want = plaintext_reference(&model, &tok, &plain, &prompt, 8);
    let mut hook = session.hook;
    let cfg = SpecConfig {
        prefill_width: Some(session.prefill_width),
        schedule: session.schedule,
        ..common::greedy_spec(4, 8, &tok)
    };
    let got = decode::generate(&model, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
    assert_matches(&got, &want, &tok, "prewarmed verify width");
}

/// A client's pass times (ms) that grow with the width as a CPU's do.
fn some_client() -> ClientCosts {
    ClientCosts {
        forward_ms: (1..=17).map(|t| 40.0 + 6.0 * t as f64).collect(),
        draft_ms: 8.0,
    }
}

/// The verify session a client with `client`'s costs opens beside `backend`'s `auto` prefill width.
fn clients_choice(backend: &HeBackend, client: &ClientCosts) -> (usize, Grouping) {
    let narrowest = backend
        .server()
        .offer_grouped(32, Grouping::ByInput)
        .unwrap();
    let t = choose_prefill_width(&PlanSpace::of(&narrowest)).unwrap();
    let space = PlanSpace::of(
        &backend
            .server()
            .offer_grouped(t, Grouping::ByInput)
            .unwrap(),
    );
    choose_verify_session(
        &space,
        client,
        &LinkProfile::WAN20,
        (None, 16.into()),
        (None, None),
    )
    .unwrap()
    .0
}

#[test]
fn a_servers_guessed_verify_width_opens_without_encoding_and_evicts_nothing() {
    let path = fetch::ensure_default_model().expect("default model");
    let config = Model::load(&path).unwrap().config().clone();
    for name in ["code-ffa-r16", "general-lora-r16"] {
        let backend = HeBackend::load(name, &adapter_dir(name), &config).unwrap();
        let client = some_client();
        let (width, grouping) = clients_choice(&backend, &client);
        let need = backend
            .server()
            .offer_grouped(width, grouping)
            .unwrap()
            .diagonal_bytes()
            .unwrap();
        let memory = backend.session_memory().clone();
        let (guess_w, guess_g, bytes) = backend
            .prewarm_verify(&client, &LinkProfile::WAN20, 16)
            .unwrap()
            .expect("a verify width other than the prefill width");
        assert_eq!((guess_w, guess_g), (width, grouping), "{name}");
        assert_eq!((bytes, memory.reserved()), (need, need), "{name}");
        // The client's session of that width holds the warm diagonals: nothing new is reserved.
        let offer = backend.server().offer_grouped(width, grouping).unwrap();
        let hook = HeHook::connect(&offer, &config, |keys, _| {
            Ok(InProcess::new(Arc::new(
                backend.server().open_session(&offer, keys)?,
            )))
        })
        .unwrap();
        assert_eq!(memory.reserved(), need, "{name}: opening encoded again");
        drop(hook);
    }

    // A guess uses free memory only: with room for the prefill width alone it is refused and the
    // prefill width's warm diagonals stay.
    let name = "code-ffa-r16";
    let load = |memory: SessionMemory| {
        HeBackend::load(name, &adapter_dir(name), &config)
            .unwrap()
            .with_session_memory(memory)
    };
    let client = some_client();
    let unbounded = load(SessionMemory::new(u64::MAX));
    let (width, grouping) = clients_choice(&unbounded, &client);
    let need = unbounded
        .server()
        .offer_grouped(width, grouping)
        .unwrap()
        .diagonal_bytes()
        .unwrap();
    let (t, prefill) = unbounded.prewarm_prefill().unwrap();
    let tight = load(SessionMemory::new(prefill + need - 1));
    assert_eq!(tight.prewarm_prefill().unwrap(), (t, prefill));
    let refused = tight.prewarm_verify(&client, &LinkProfile::WAN20, 16);
    assert!(
        matches!(refused, Err(PrivateError::MemoryBudget { .. })),
        "{refused:?}"
    );
    assert_eq!(tight.session_memory().reserved(), prefill);
}

#[test]
fn a_target_on_quantized_weights_runs_per_group_and_generates_exactly() {
    let (f32_model, tok, server, plain) = setup();
    let quantized = default_model(WeightMode::Quantized);
    assert_eq!(quantized.weights_held(), "quantized");
    let open = |model: &Model| {
        let mut opener = InProcessOpener {
            server: server.clone(),
            link: LinkProfile::WAN80,
        };
        connect_with(&mut opener, &auto_k(), (model, model)).unwrap()
    };
    // On f32 weights the same adapter and link run a fixed point.
    let on_f32 = open(&f32_model);
    assert!(
        matches!(on_f32.schedule, Schedule::FixedPoint(_)),
        "{:?}",
        on_f32.schedule
    );
    drop(on_f32);
    let session = open(&quantized);
    assert_eq!(session.schedule, Schedule::PerGroup);
    assert_eq!(session.sampled_schedule, Schedule::PerGroup);
    let choice = session.width_choice.as_ref().expect("auto K is modelled");
    assert_eq!(choice.best.grouping, Grouping::ByInput);
    assert_eq!(choice.best.k + 1, session.verify_width);
    let prompt = tok.encode(common::PROMPTS[1]).unwrap();
    let want = plaintext_reference(&quantized, &tok, &plain, &prompt, 12);
    let mut hook = session.hook;
    let cfg = SpecConfig {
        prefill_width: Some(16),
        schedule: session.schedule,
        ..common::greedy_spec(session.verify_width - 1, 12, &tok)
    };
    let got = decode::generate(&quantized, &prompt, &cfg, &mut hook, &mut |_| Ok(())).unwrap();
    assert_matches(&got, &want, &tok, "quantized weights, per group");
}
