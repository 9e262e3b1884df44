//! `cipherlora bench e2e`: private generation end to end over the real
//! protocol (gRPC + TLS + token, an embedded adapter server, optionally
//! behind a simulated WAN) per adapter, link and decoding configuration,
//! each checked against the plaintext reference; client and server pinned to
//! different cores ([`EmbeddedServer`]'s thread hook), prefill through a
//! wider session ([`ByWidth`]), time split by [`TimeSplit`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use cipherlora_model::{
    GenerateOptions, LoadOptions, LoraAdapter, Model, PlainLora, SamplingParams, Tokenizer,
    WeightMode, generate,
};
use cipherlora_private::{
    ByWidth, ConnectOptions, DraftLength, EmbeddedServer, Grouping, GrpcTransport, HeTimings,
    LoraKind, TimeSplit, connect_remote,
};
use cipherlora_service::{LinkProfile, Placement};
use cipherlora_speculative::decode::{
    self, ChainDrafter, DraftModel, Drafting, SpecConfig, SpecStats,
};
use cipherlora_speculative::replay::ReplayDrafts;
use cipherlora_speculative::schedule::Schedule;
use cipherlora_speculative::tree_draft::{TreeDrafts, TreeParams};
use serde::{Deserialize, Serialize};

/// Options of `cipherlora bench e2e`.
#[derive(Debug, Clone)]
pub struct E2eBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// The base model (GGUF file or HF folder).
    pub model: PathBuf,
    /// HumanEval prompts (JSON lines with a `prompt` field).
    pub prompts_file: PathBuf,
    /// How many prompts to use.
    pub prompts: usize,
    /// Pin client and server to different cores (when there are two).
    pub pin: bool,
    /// Cores the pinned server computes on: 1 (its own core), or more (the client's core too:
    /// a fixed-point trip's groups then spread over them while the client waits).
    pub server_cores: usize,
    /// The client's target weights ([`WeightMode::for_private_verify`]), each with its own reference.
    pub weights: Vec<WeightMode>,
    /// What runs with each target model.
    pub private: PrivateRuns,
}

/// The private runs of one target model ([`run_target`]; also `bench split`'s).
#[derive(Debug, Clone)]
pub struct PrivateRuns {
    /// PEFT adapter folders (served under their folder names).
    pub adapters: Vec<PathBuf>,
    /// Link profiles by name (`loopback`, `wan80`, …).
    pub links: Vec<String>,
    /// Decoding configurations.
    pub configs: Vec<DecodeConfig>,
    /// Verify schedules (`auto`, `per-group`, `fixed-point[:N]`), each run per configuration.
    pub schedules: Vec<String>,
    /// New tokens per prompt.
    pub max_tokens: usize,
    /// Positions per prefill pass.
    pub prefill_width: usize,
    /// Optimistic drafting during verify passes (base drafter).
    pub optimistic: bool,
    /// [`SpecConfig::draft_stop_below`] of every run.
    pub draft_stop_below: f32,
    /// The prior α for `auto` K (`None`: [`cipherlora_private::width_plan::acceptance_prior`]).
    pub acceptance_prior: Option<f64>,
    /// Sampling temperature (0: greedy); sampled runs seed each prompt with its
    /// index and are not compared (`matches_plaintext` is `None`).
    pub temperature: f32,
    /// Per-token acceptance of the `replay` drafter ([`cipherlora_speculative::replay`]), for
    /// synthetic models whose own drafts mean nothing.
    pub replay_acceptance: f64,
    /// A separate draft model for the base and hybrid drafters
    /// ([`DraftModel::Separate`]; quantized weights as stored), instead of the target's.
    pub draft_model: Option<PathBuf>,
}

/// One decoding configuration of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeConfig {
    /// The drafter.
    pub drafter: DrafterChoice,
    /// K (ignored without drafter); with `auto_k`, the largest K considered.
    pub k: usize,
    /// Choose K per run ([`cipherlora_private::width_plan`]).
    pub auto_k: bool,
    /// How the base drafter holds its weights.
    pub drafter_weights: DrafterWeights,
    /// Tree drafts of this shape ([`cipherlora_speculative::tree_draft`]); with `auto_k`, limits.
    pub tree: Option<TreeParams>,
    /// Delta-guided drafting ([`cipherlora_speculative::draft_bias`]; default on).
    pub guided: bool,
}

/// The weights of the base drafter (the output does not depend on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterWeights {
    /// The target's f32 weights, shared.
    F32,
    /// An f16 copy ([`Model::to_f16_weights`]).
    F16,
    /// The GGUF weights kept quantized (`WeightMode::Quantized`).
    Quantized,
}

impl DecodeConfig {
    /// "f16", "f32", "quantized", or "-" when the base model does not draft.
    #[must_use]
    pub fn draft_weights(&self) -> &'static str {
        match (self.drafter.runs_base(), self.drafter_weights) {
            (true, DrafterWeights::F16) => "f16",
            (true, DrafterWeights::F32) => "f32",
            (true, DrafterWeights::Quantized) => "quantized",
            (false, _) => "-",
        }
    }
}

/// Which drafter a benchmark configuration runs. The decoder's [`Drafting`] is built per prompt
/// ([`DrafterChoice::drafting`]): replay drafts the prompt's own reference continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterChoice {
    /// No drafts ([`Drafting::None`]).
    None,
    /// [`ChainDrafter::Base`], or tree drafts with a tree shape.
    Base,
    /// [`ChainDrafter::Ngram`].
    Ngram,
    /// [`ChainDrafter::Hybrid`].
    Hybrid,
    /// [`ChainDrafter::Replay`].
    Replay,
}

impl DrafterChoice {
    /// The name in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Base => "base",
            Self::Ngram => "ngram",
            Self::Hybrid => "hybrid",
            Self::Replay => "replay",
        }
    }

    /// Whether the base model drafts.
    #[must_use]
    pub fn runs_base(self) -> bool {
        matches!(self, Self::Base | Self::Hybrid)
    }

    /// The decoder's drafting at K = `k`: a tree when `tree` is given (base drafter), `replay`'s
    /// drafts for [`DrafterChoice::Replay`] (none given: no drafts).
    #[must_use]
    pub fn drafting(
        self,
        k: usize,
        tree: Option<TreeDrafts>,
        replay: Option<ReplayDrafts>,
    ) -> Drafting {
        let chain = |drafter| Drafting::chain(drafter, k);
        match (self, tree, replay) {
            (Self::None, ..) | (Self::Replay, _, None) => Drafting::None,
            (Self::Base, Some(drafts), _) => Drafting::tree(drafts, k),
            (Self::Base, None, _) => chain(ChainDrafter::Base),
            (Self::Ngram, ..) => chain(ChainDrafter::Ngram),
            (Self::Hybrid, ..) => chain(ChainDrafter::Hybrid),
            (Self::Replay, _, Some(r)) => chain(ChainDrafter::Replay(r)),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct E2eRun {
    /// "plaintext" (adapter merged in plaintext, no privacy) or "private".
    pub mode: String,
    /// "ffa" or "standard".
    pub lora: String,
    /// Adapter id (folder name).
    pub adapter: String,
    /// "none", "base", "ngram" or "hybrid".
    pub drafter: String,
    /// The target's weights: "f32" or "quantized" ([`Model::weights_held`]).
    #[serde(default)]
    pub weights: String,
    /// The base drafter's weights: "f32", "quantized", "f16" or "-".
    pub draft_weights: String,
    /// Drafted tokens per round (0 without drafter).
    pub k: usize,
    /// Link profile name ("local" for the plaintext reference).
    pub link: String,
    /// Generated tokens over decode time (prefill and setup excluded), tok/s.
    pub tok_per_s: f64,
    /// Generated tokens per verify round.
    pub mean_accepted: f64,
    /// Verify rounds.
    pub rounds: usize,
    /// The verify schedule (`per-group`, `fixed-point:N`).
    pub schedule: String,
    /// Round trips per verify round (G per group, N on the fixed point).
    pub round_trips_per_round: f64,
    /// Rounds that continued an uncertified pass (fixed-point schedule).
    pub continuations: usize,
    /// Verified rows the fixed-point rounds could not use (uncertified).
    pub uncertified_rows: usize,
    /// Generated tokens (all prompts).
    pub tokens: usize,
    /// Bytes uploaded per generated token (verify passes; prefill excluded).
    pub bytes_up_per_token: f64,
    /// Bytes downloaded per generated token (verify passes; prefill excluded).
    pub bytes_down_per_token: f64,
    /// Where the decode time went, ms, summed over prompts (`prefill` apart).
    pub split_ms: TimeSplit,
    /// The server's reported compute per generated token (decode), ms.
    #[serde(default)]
    pub server_busy_ms_per_token: f64,
    /// The reference's tok/s measured right before this run on the same core
    /// ("plaintext" row: their median); ratios only between such figures.
    pub plaintext_tok_per_s: f64,
    /// tok_per_s / `plaintext_tok_per_s`.
    pub ratio_to_plaintext: f64,
    /// Output equals the reference token for token (`None`: sampled).
    pub matches_plaintext: Option<bool>,
    /// Rounds whose draft was made ahead during the previous verify pass.
    pub ahead_hits: usize,
    /// Verify passes started from the drafter's inputs (`/drafted-start`).
    #[serde(default)]
    pub drafted_starts: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct E2eReport {
    /// "e2e".
    pub bench: String,
    /// The runs.
    pub runs: Vec<E2eRun>,
    /// Plaintext reference decode speed (mean over adapters), tokens/s.
    pub plaintext_tok_per_s: f64,
    /// How client and server were placed on the machine's cores.
    pub pinning: String,
    /// Prompts × new tokens per prompt.
    pub prompts: usize,
    /// New tokens per prompt (fewer when a prompt hits end-of-sequence).
    pub max_tokens: usize,
    /// Positions per prefill pass.
    pub prefill_width: usize,
    /// Sampling temperature of the private runs (0: greedy).
    #[serde(default)]
    pub temperature: f32,
}

/// Every server thread pinned to `core`, computing one group at a time.
fn pin_to(core: core_affinity::CoreId) -> Placement {
    Placement {
        on_thread_start: Arc::new(move || {
            core_affinity::set_for_current(core);
        }),
        cores: 1,
    }
}

/// Pins this thread (and its later children) to the first core; returns the
/// server threads' placement (the second core), `None` with one core.
pub fn place(pin: bool) -> (Option<Placement>, String) {
    place_on(pin, 1)
}

/// [`place`] with the server on `server_cores` cores: the second core alone for 1; for more, its
/// threads unpinned, sharing every core (the client's included) with a pool of that size.
pub fn place_on(pin: bool, server_cores: usize) -> (Option<Placement>, String) {
    if !pin {
        return (None, "none (--no-pin)".into());
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    if cores.len() < 2 {
        return (None, format!("none ({} core)", cores.len()));
    }
    if !core_affinity::set_for_current(cores[0]) {
        return (None, "none (pinning refused)".into());
    }
    if server_cores > 1 {
        let n = server_cores.min(cores.len());
        let placement = Placement {
            on_thread_start: Arc::new(|| {}),
            cores: n,
        };
        return (
            Some(placement),
            format!(
                "client on core {}, server on any {n} of {} cores",
                cores[0].id,
                cores.len()
            ),
        );
    }
    (
        Some(pin_to(cores[1])),
        format!(
            "client on core {}, server on core {} (of {})",
            cores[0].id,
            cores[1].id,
            cores.len()
        ),
    )
}

/// One line per modelled K of a verify-width choice (stderr).
#[must_use]
pub fn width_report(choice: &cipherlora_private::width_plan::WidthChoice) -> String {
    let forward: Vec<String> = (choice.client.forward_ms.iter())
        .map(|ms| format!("{ms:.0}"))
        .collect();
    let mut out = format!(
        "verify width: K = {} (modelled {:.2} tok/s at acceptance {:.3}; client: draft step {:.1} ms, \
         passes of 1.. positions {} ms); K: tok/s [round ms, tokens/round, draft, schedule]",
        choice.best.k,
        choice.best.tok_per_s,
        choice.alpha,
        choice.client.draft_ms,
        forward.join("/")
    );
    for c in &choice.candidates {
        let shape = c
            .tree
            .map_or_else(|| "chain".to_string(), |t| format!("tree {t}"));
        out.push_str(&format!(
            "\n  {:2}: {:5.2} [{:6.0}, {:4.2}, {shape}, {}, grouped {:?}]",
            c.k, c.tok_per_s, c.round_ms, c.expected_tokens, c.schedule.schedule, c.grouping
        ));
    }
    out
}

/// The verify session's counters since the latest prefill (decode only).
fn verify_timings(hook: &ByWidth<GrpcTransport>, width: usize) -> HeTimings {
    hook.session(width)
        .map(cipherlora_private::HeHook::timings_since_prefill)
        .unwrap_or_default()
}

/// The first `n` prompts of a JSON-lines file with a `prompt` field per line.
/// Errors: an unreadable file, a line without a prompt, fewer than `n`.
pub fn read_prompts(file: &Path, n: usize) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()).take(n) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let Some(p) = v.get("prompt").and_then(|p| p.as_str()) else {
            bail!("{}: a line without a \"prompt\" string", file.display());
        };
        out.push(p.to_string());
    }
    if out.len() < n {
        bail!(
            "{} has {} prompts, {n} asked for",
            file.display(),
            out.len()
        );
    }
    Ok(out)
}

/// Runs the benchmark and writes the reports. Errors: model, adapter, server
/// or I/O failures (a mismatch is reported in `matches_plaintext`).
pub fn run(opts: &E2eBenchOptions) -> anyhow::Result<E2eReport> {
    let (server_placement, pinning) = place_on(opts.pin, opts.server_cores);
    eprintln!("placement: {pinning}");
    let tok = Tokenizer::for_model(&opts.model)?;
    let prompts: Vec<Vec<u32>> = read_prompts(&opts.prompts_file, opts.prompts)?
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let eos = tok.eos_tokens().to_vec();
    let mut runs = Vec::new();
    let mut plain_speeds = Vec::new();
    let default_weights = [WeightMode::Auto];
    let modes = if opts.weights.is_empty() {
        &default_weights[..]
    } else {
        &opts.weights
    };
    for &weights in modes {
        let weights = weights.for_private_verify();
        let model = Model::load_with(&opts.model, &LoadOptions { weights })
            .with_context(|| format!("loading {}", opts.model.display()))?;
        let prompts = Prompts {
            ids: &prompts,
            eos: &eos,
        };
        run_target(
            &opts.private,
            &model,
            &prompts,
            &server_placement,
            &mut runs,
            &mut plain_speeds,
        )?;
    }
    let report = E2eReport {
        bench: "e2e".into(),
        plaintext_tok_per_s: plain_speeds.iter().sum::<f64>() / plain_speeds.len().max(1) as f64,
        runs,
        pinning,
        prompts: opts.prompts,
        max_tokens: opts.private.max_tokens,
        prefill_width: opts.private.prefill_width,
        temperature: opts.private.temperature,
    };
    let md = crate::write_report(
        &opts.json,
        opts.markdown.as_deref(),
        &report,
        &markdown(&report),
    )?;
    eprintln!("wrote {} and {}", opts.json.display(), md.display());
    Ok(report)
}

/// The tokenized prompts and end-of-sequence tokens of a run.
#[derive(Debug, Clone, Copy)]
pub struct Prompts<'a> {
    /// Token ids, one prompt each.
    pub ids: &'a [Vec<u32>],
    /// Tokens that end a generation (empty: always `max_tokens`).
    pub eos: &'a [u32],
}

/// Every adapter, link and configuration of `opts` with one target model:
/// an embedded server per adapter, the reference row, then the private runs
/// (to `runs`; the reference's median speed to `plain_speeds`).
/// Errors: adapter, server, session or model failures, a non-deterministic
/// reference, a schedule or grouping that does not parse.
pub fn run_target(
    opts: &PrivateRuns,
    model: &Model,
    prompts: &Prompts<'_>,
    server_placement: &Option<Placement>,
    runs: &mut Vec<E2eRun>,
    plain_speeds: &mut Vec<f64>,
) -> anyhow::Result<()> {
    let (eos, prompts) = (prompts.eos.to_vec(), prompts.ids);
    let held = model.weights_held();
    let half = if opts.configs.iter().any(|c| c.draft_weights() == "f16") {
        Some(model.to_f16_weights()?)
    } else {
        None
    };
    let quantized = if opts
        .configs
        .iter()
        .any(|c| c.draft_weights() == "quantized")
    {
        Some(model.fast_drafter()?)
    } else {
        None
    };
    let separate = match &opts.draft_model {
        Some(path) => Some(
            Model::load_with(
                path,
                &LoadOptions {
                    weights: WeightMode::Quantized,
                },
            )
            .with_context(|| format!("loading the draft model {}", path.display()))?,
        ),
        None => None,
    };
    for dir in &opts.adapters {
        let id = cipherlora_private::adapter_id(dir)?;
        // Server threads start idle; the plaintext reference runs first.
        let server = EmbeddedServer::start(&id, dir, model.config(), server_placement.clone())?;
        let lora = match server.kind() {
            LoraKind::Ffa => "ffa",
            LoraKind::Standard => "standard",
        }
        .to_string();

        // The plaintext reference, on the client's core.
        let plain = LoraAdapter::load(dir, model.config())?;
        let gen_opts = GenerateOptions {
            max_tokens: opts.max_tokens,
            sampling: SamplingParams::greedy(),
            eos: eos.clone(),
        };
        // Measured once, then again before every private run (its denominator).
        let plain_run = || -> anyhow::Result<(Vec<Vec<u32>>, f64)> {
            let (mut reference, mut secs) = (Vec::new(), 0.0f64);
            for p in prompts {
                let out = generate(
                    model,
                    p,
                    &gen_opts,
                    &mut PlainLora::new(&plain),
                    &mut |_| Ok(()),
                )?;
                secs += out.decode_secs;
                reference.push(out.tokens);
            }
            let tokens: usize = reference.iter().map(Vec::len).sum();
            Ok((reference, tokens as f64 / secs.max(1e-9)))
        };
        let (reference, first_tps) = plain_run()?;
        let plain_tokens: usize = reference.iter().map(Vec::len).sum();
        let mut plain_tps_all = vec![first_tps];
        let plain_row = runs.len();
        runs.push(E2eRun {
            mode: "plaintext".into(),
            lora: lora.clone(),
            adapter: id.clone(),
            drafter: "none".into(),
            weights: held.into(),
            draft_weights: "-".into(),
            k: 0,
            link: "local".into(),
            tok_per_s: first_tps,
            mean_accepted: 1.0,
            rounds: plain_tokens,
            schedule: "-".into(),
            round_trips_per_round: 0.0,
            continuations: 0,
            uncertified_rows: 0,
            tokens: plain_tokens,
            bytes_up_per_token: 0.0,
            bytes_down_per_token: 0.0,
            // Filled in with the median of the measurements below.
            split_ms: TimeSplit::default(),
            server_busy_ms_per_token: 0.0,
            plaintext_tok_per_s: first_tps,
            ratio_to_plaintext: 1.0,
            matches_plaintext: Some(true),
            ahead_hits: 0,
            drafted_starts: 0,
        });

        for link_name in &opts.links {
            let link: LinkProfile = link_name
                .parse()
                .map_err(|e| anyhow::anyhow!("link {link_name}: {e}"))?;
            for (c, schedule) in opts
                .configs
                .iter()
                .flat_map(|c| opts.schedules.iter().map(move |s| (c, s.as_str())))
            {
                let (drafter, k) = (c.drafter, c.k);
                let drafting = match (c.draft_weights(), &half, &quantized, &separate) {
                    ("-", ..) => DraftModel::Copy(model),
                    (_, _, _, Some(m)) => DraftModel::Separate(m),
                    ("f16", Some(h), _, _) => DraftModel::Copy(h),
                    ("quantized", _, Some(q), _) => DraftModel::Copy(q),
                    _ => DraftModel::Copy(model),
                };
                let draft_model = drafting.model();
                let k_fixed = if drafter == DrafterChoice::None { 0 } else { k };
                let mut tree: Option<TreeDrafts> = c.tree.map(Into::into);
                let mut cfg = SpecConfig {
                    // Set per prompt, once the sessions chose K (and replay has its prompt).
                    drafting: Drafting::None,
                    pad_to_k: true,
                    prefill_width: Some(opts.prefill_width),
                    optimistic: opts.optimistic,
                    draft_stop_below: opts.draft_stop_below,
                    delta_guided: c.guided,
                    max_tokens: opts.max_tokens,
                    sampling: SamplingParams {
                        temperature: opts.temperature,
                        ..SamplingParams::greedy()
                    },
                    eos: eos.clone(),
                    first_token_from_prefill: false,
                    prefill_span: cipherlora_speculative::decode::PrefillSpan::default(),
                    schedule: Schedule::PerGroup,
                };
                // `SCHEDULE@by-input` or `SCHEDULE@by-layers:N` overrides the grouping.
                let (schedule, grouping_asked) = match schedule.split_once('@') {
                    Some((s, g)) => (s, Some(parse_grouping(g)?)),
                    None => (schedule, None),
                };
                let forced = match schedule {
                    "auto" => None,
                    s => Some(s.parse::<Schedule>()?),
                };
                let options = ConnectOptions {
                    draft: if c.auto_k {
                        DraftLength::Auto {
                            k_max: k,
                            trees: c.tree,
                        }
                    } else {
                        DraftLength::Fixed(k_fixed)
                    },
                    acceptance_prior: opts.acceptance_prior,
                    prefill_width: cipherlora_private::PrefillWidth::Fixed(opts.prefill_width),
                    schedule: forced,
                    grouping: grouping_asked,
                    planning_link: Some(link),
                };
                // The plaintext rerun goes first: sessions left unstarted while it runs (long at
                // 8B) would time out on the server and be reopened.
                let (again, plain_tps) = plain_run()?;
                anyhow::ensure!(
                    again == reference,
                    "the plaintext reference is not deterministic"
                );
                plain_tps_all.push(plain_tps);
                let session = cipherlora_private::connect(
                    server.client_config(link),
                    &id,
                    &options,
                    (model, draft_model),
                )?;
                if let Some(choice) = &session.width_choice {
                    eprintln!("{}", width_report(choice));
                    tree = choice.best.tree.map(Into::into);
                }
                let width = session.verify_width;
                let greedy = cfg.sampling.is_greedy();
                cfg.schedule = session.schedule_for(greedy);
                let schedule_name = match forced {
                    None => format!("auto: {}", cfg.schedule),
                    Some(_) => cfg.schedule.to_string(),
                };
                let mut hook = session.hook;
                // A verify width equal to the prefill width would share the prefill
                // session's counters: prefill one position wider.
                let prefill_width = if width == opts.prefill_width {
                    let wider = opts.prefill_width + 1;
                    hook = hook.with(
                        wider,
                        connect_remote(
                            server.client_config(link),
                            &id,
                            wider,
                            Grouping::ByInput,
                            model.config(),
                        )?,
                    );
                    wider
                } else {
                    opts.prefill_width
                };
                cfg.prefill_width = Some(prefill_width);
                let grouped = hook
                    .session(width)
                    .map_or(Grouping::ByInput, |h| h.plan_space().grouping);
                let schedule_name = match grouped {
                    Grouping::ByLayers(_) => format!("{schedule_name}, {grouped}"),
                    Grouping::ByInput => schedule_name,
                };
                let mut matches = true;
                let (mut tokens, mut rounds, mut ahead_hits) = (0usize, 0usize, 0usize);
                let mut drafted_starts = 0usize;
                let (mut continuations, mut uncertified) = (0usize, 0usize);
                let mut split = TimeSplit::default();
                let mut decode = HeTimings::default();
                let mut calibration = None;
                for (index, (p, want)) in prompts.iter().zip(&reference).enumerate() {
                    cfg.sampling.seed = index as u64;
                    let replay = (drafter == DrafterChoice::Replay).then(|| ReplayDrafts {
                        prompt_len: p.len(),
                        continuation: want.clone(),
                        acceptance: opts.replay_acceptance,
                        seed: index as u64,
                        vocab_size: model.config().vocab_size,
                    });
                    // Tree drafts carry their acceptance estimate across prompts.
                    if let (Some(tree), Some(c)) = (tree.as_mut(), calibration.take()) {
                        tree.calibration = c;
                    }
                    cfg.drafting = drafter.drafting(width - 1, tree.clone(), replay);
                    let out =
                        decode::generate_drafted(model, drafting, p, &cfg, &mut hook, &mut |_| {
                            Ok(())
                        })?;
                    // The verify session's work since the prompt's passes.
                    let he = verify_timings(&hook, width);
                    let stats = SpecStats {
                        prefill_secs: 0.0,
                        ..out.stats.clone()
                    };
                    let mut s = TimeSplit::new(&stats, &he);
                    s.prefill = out.stats.prefill_secs * 1e3;
                    split = split.plus(&s);
                    decode.add(&he);
                    calibration = out.calibration.clone();
                    tokens += out.tokens.len();
                    rounds += out.stats.rounds;
                    matches &= &out.tokens == want;
                    ahead_hits += out.stats.ahead_hits;
                    drafted_starts += out.stats.drafted_starts;
                    continuations += out.stats.continuations;
                    uncertified += out.stats.uncertified_rows;
                }
                let tps = tokens as f64 / (split.total() / 1e3).max(1e-9);
                let run = E2eRun {
                    mode: "private".into(),
                    lora: lora.clone(),
                    adapter: id.clone(),
                    drafter: {
                        let name = match (c.guided, drafter) {
                            (false, DrafterChoice::Base | DrafterChoice::Hybrid) => {
                                format!("plain {}", drafter.name())
                            }
                            (_, DrafterChoice::Replay) => {
                                format!("replay at acceptance {}", opts.replay_acceptance)
                            }
                            _ => drafter.name().to_string(),
                        };
                        match (c.tree, c.auto_k) {
                            // The shape the width model chose.
                            (Some(limits), true) => match &tree {
                                Some(t) => {
                                    format!("{name} {} (auto of {limits}, K ≤ {k})", t.shape)
                                }
                                None => format!("{name} chain (auto of {limits}, K ≤ {k})"),
                            },
                            (Some(t), false) => format!("{name} {t}"),
                            (None, true) => format!("{name} (auto K ≤ {k})"),
                            (None, false) => name,
                        }
                    },
                    weights: held.into(),
                    // An f16 copy of a quantized model shares its quantized weights.
                    draft_weights: match c.draft_weights() {
                        "-" => "-".into(),
                        _ if drafting.is_separate() => format!(
                            "draft model {}",
                            opts.draft_model
                                .as_deref()
                                .and_then(Path::file_stem)
                                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
                        ),
                        _ => draft_model.weights_held().into(),
                    },
                    k: width - 1,
                    link: link_name.clone(),
                    tok_per_s: tps,
                    mean_accepted: tokens as f64 / rounds.max(1) as f64,
                    rounds,
                    schedule: schedule_name,
                    round_trips_per_round: decode.round_trips as f64 / rounds.max(1) as f64,
                    continuations,
                    uncertified_rows: uncertified,
                    tokens,
                    bytes_up_per_token: decode.bytes_up as f64 / tokens.max(1) as f64,
                    bytes_down_per_token: decode.bytes_down as f64 / tokens.max(1) as f64,
                    split_ms: split,
                    server_busy_ms_per_token: decode.server_busy_ms / tokens.max(1) as f64,
                    plaintext_tok_per_s: plain_tps,
                    ratio_to_plaintext: tps / plain_tps,
                    matches_plaintext: greedy.then_some(matches),
                    ahead_hits,
                    drafted_starts,
                };
                eprintln!(
                    "{id} {held} {link_name} {} {} ({}) K={}: {:.2} tok/s ({:.3}× plaintext), {:.2} tokens/round, {:.1} round trips/round, {:.0}/{:.0} kB/token up/down, server busy {:.0} ms/token, match {}",
                    run.schedule,
                    run.drafter,
                    run.draft_weights,
                    run.k,
                    run.tok_per_s,
                    run.ratio_to_plaintext,
                    run.mean_accepted,
                    run.round_trips_per_round,
                    run.bytes_up_per_token / 1e3,
                    run.bytes_down_per_token / 1e3,
                    run.server_busy_ms_per_token,
                    run.matches_plaintext
                        .map_or("- (sampled)".to_string(), |m| m.to_string())
                );
                runs.push(run);
            }
        }
        // The plaintext row: the median of its measurements.
        plain_tps_all.sort_by(f64::total_cmp);
        let median = plain_tps_all[plain_tps_all.len() / 2];
        plain_speeds.push(median);
        let row = &mut runs[plain_row];
        row.tok_per_s = median;
        row.plaintext_tok_per_s = median;
        row.split_ms.forward = plain_tokens as f64 / median * 1e3;
        eprintln!(
            "{id}: plaintext reference, median of {} measurements: {median:.2} tok/s",
            plain_tps_all.len()
        );
    }
    Ok(())
}

/// The Markdown table of a report.
#[must_use]
pub fn markdown(r: &E2eReport) -> String {
    let mut s = format!(
        "Private generation end to end ({} prompts × {} tokens, {}, prefill width {}; {}).\n\n\
         | mode | weights | LoRA | drafter (weights) | K | schedule | link | tok/s | plaintext tok/s, side by side | × plaintext | tokens/round | round trips/round | up kB/token | down kB/token | draft | forward | encrypt | server | network | decrypt | server busy | match |\n\
         | --- | --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        r.prompts,
        r.max_tokens,
        if r.temperature > 0.0 {
            format!(
                "sampled at temperature {} (one seed per prompt)",
                r.temperature
            )
        } else {
            "greedy".to_string()
        },
        r.prefill_width,
        r.pinning
    );
    for x in &r.runs {
        let d = &x.split_ms;
        let per = |v: f64| v / x.tokens.max(1) as f64;
        s.push_str(&format!(
            "| {} | {} | {} | {}{} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
            x.mode,
            x.weights,
            x.lora,
            x.drafter,
            if x.draft_weights == "-" {
                String::new()
            } else {
                format!(" ({})", x.draft_weights)
            },
            x.k,
            x.schedule,
            x.link,
            x.tok_per_s,
            x.plaintext_tok_per_s,
            x.ratio_to_plaintext,
            x.mean_accepted,
            x.round_trips_per_round,
            x.bytes_up_per_token / 1e3,
            x.bytes_down_per_token / 1e3,
            per(d.draft),
            per(d.forward),
            per(d.encrypt),
            per(d.server),
            per(d.network),
            per(d.decrypt),
            x.server_busy_ms_per_token,
            match x.matches_plaintext {
                Some(true) => "yes",
                Some(false) => "**NO**",
                None => "sampled",
            },
        ));
    }
    s.push_str(
        "\nTime columns: ms per generated token, decode only (prefill runs through a separate \
         session of the prefill width and is excluded, as is session setup). Each private \
         run's ratio is to the plaintext reference measured right before it; the plaintext \
         row shows the median of those measurements. \"server busy\": the server's compute as \
         it reports it, whether or not the client waited for it (over 1000 / tok/s: its \
         utilisation).\n",
    );
    s
}

/// A `SCHEDULE@GROUPING` suffix: `by-input`, `by-layer` or `by-layers:N`.
fn parse_grouping(s: &str) -> anyhow::Result<Grouping> {
    match s {
        "by-input" => Ok(Grouping::ByInput),
        "by-layer" => Ok(Grouping::BY_LAYER),
        _ => {
            let n = s
                .strip_prefix("by-layers:")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| (1..=Grouping::MAX_LAYERS).contains(n))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown grouping @{s} (by-input, by-layer or by-layers:N with N ≤ {})",
                        Grouping::MAX_LAYERS
                    )
                })?;
            Ok(Grouping::ByLayers(n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_grouping_suffixes_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_grouping("by-input").unwrap(), Grouping::ByInput);
        assert_eq!(parse_grouping("by-layer").unwrap(), Grouping::BY_LAYER);
        assert_eq!(
            parse_grouping("by-layers:3").unwrap(),
            Grouping::ByLayers(3)
        );
        for bad in [
            "by-layers:0",
            "by-layers:9",
            "by-layers:x",
            "by-layers",
            "bylayer",
        ] {
            assert!(parse_grouping(bad).is_err(), "{bad}");
        }
    }
}
