//! `cipherlora bench split`: split inference end to end over the real
//! protocol (an embedded `SplitInference` server, optionally behind a
//! simulated WAN) per link, split (a, b) and drafter, against the whole model
//! run locally, then HE-LoRA rows ([`crate::e2e::run_target`]). A
//! least-squares model `t = c0 + c1·compute + c2·RTT + c3·bytes·8/bandwidth`
//! of each step, cross-validated per link, projects tok/s to other RTTs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cipherlora_model::{
    GenerateOptions, LoadOptions, Model, NoAdapter, SamplingParams, Tokenizer, WeightMode, generate,
};
use cipherlora_service::{
    ClientConfig, LinkProfile, ServeConfig, ServerThread, SplitBackend, SplitClient,
};
use cipherlora_speculative::ngram::{AdaptiveLookup, PromptLookup};
use cipherlora_split::{DraftMethod, Lookahead, ModelBackend, SplitConfig, SplitOutput};
use serde::{Deserialize, Serialize};

use crate::e2e::{E2eRun, PrivateRuns, Prompts, place, run_target};

/// Options of `cipherlora bench split`.
#[derive(Debug, Clone)]
pub struct SplitBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// The base model (GGUF file or HF folder).
    pub model: PathBuf,
    /// Link profiles by name (`loopback`, `wan20`, `wan80`, …).
    pub links: Vec<String>,
    /// Splits (a, b): layers kept locally before and after the server's.
    pub splits: Vec<(usize, usize)>,
    /// Drafted tokens per prompt-lookup step (0: the no-draft baseline only).
    pub k: usize,
    /// Also run without drafts (one token per round trip).
    pub no_draft_baseline: bool,
    /// Also run lookahead decoding ([`DraftMethod::Lookahead`]) per (W, N, G).
    pub lookahead: Vec<Lookahead>,
    /// Also run adaptive prompt lookup ([`DraftMethod::AdaptivePromptLookup`]).
    pub adaptive_k: bool,
    /// Prompts.
    pub prompts: Vec<String>,
    /// New tokens per prompt.
    pub max_tokens: usize,
    /// Pin client and server to different cores (when there are two).
    pub pin: bool,
    /// RTTs (ms) to project tok/s to, at 100 Mbit/s.
    pub project_rtts_ms: Vec<f64>,
    /// HE-LoRA rows: these private runs per link (`None`: split rows only).
    pub he: Option<PrivateRuns>,
}

/// One (link, split, drafter) configuration over all prompts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SplitRun {
    /// Link profile name.
    pub link: String,
    /// Its added round-trip time, ms.
    pub rtt_ms: f64,
    /// Its bandwidth, Mbit/s (0: unlimited).
    pub mbps: f64,
    /// Local layers before the server's.
    pub a: usize,
    /// Local layers after the server's.
    pub b: usize,
    /// `prompt-lookup`, `lookahead (W,N,G = …)`, … or `none`.
    pub drafter: String,
    /// Drafted tokens per step.
    pub k: usize,
    /// Tokens generated over all prompts.
    pub tokens: usize,
    /// Decode tokens per second (prefill step excluded).
    pub tok_per_s: f64,
    /// The local model's decode tok/s right before each run (mean).
    pub plaintext_tok_per_s: f64,
    /// `tok_per_s / plaintext_tok_per_s`.
    pub ratio_to_plaintext: f64,
    /// Tokens per decode step (one round trip each).
    pub tokens_per_step: f64,
    /// Round trips (Forward calls) over all prompts, prefill included.
    pub round_trips: usize,
    /// Bytes both ways per generated token (protobuf messages).
    pub bytes_per_token: f64,
    /// Per decode step, ms: local compute.
    pub local_ms_per_step: f64,
    /// Per decode step, ms: server compute.
    pub server_ms_per_step: f64,
    /// Per decode step, ms: the rest of the round trip.
    pub network_ms_per_step: f64,
    /// Per decode step, ms: wall time.
    pub step_ms: f64,
    /// Mean request + response bytes per decode step.
    pub bytes_per_step: f64,
    /// Whether every prompt's output equals the local greedy output.
    pub matches_local: bool,
}

/// Least-squares fit of the per-step time model (see the module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RttModel {
    /// c0 (ms), c1, c2, c3 fitted on all steps.
    pub coefficients: [f64; 4],
    /// Decode steps fitted.
    pub steps: usize,
    /// Leave-one-link-out: (link, measured step ms, predicted, relative error).
    pub cross_validation: Vec<(String, f64, f64, f64)>,
    /// Projections: (split and drafter, RTT ms, step ms, tok/s) at 100 Mbit/s.
    pub projections: Vec<(String, f64, f64, f64)>,
}

/// The report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SplitBenchReport {
    /// `split`.
    pub bench: String,
    /// The runs.
    pub runs: Vec<SplitRun>,
    /// The fitted RTT model.
    pub model: Option<RttModel>,
    /// Core placement.
    pub pinning: String,
    /// How the split runs' model held its weights ([`Model::weights_held`]).
    #[serde(default)]
    pub weights: String,
    /// Prompts.
    pub prompts: usize,
    /// New tokens per prompt.
    pub max_tokens: usize,
    /// HE-LoRA rows per link (empty without [`SplitBenchOptions::he`]).
    #[serde(default)]
    pub he: Vec<HeLinkRuns>,
}

/// The HE-LoRA rows of one link: per adapter, reference then private runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeLinkRuns {
    /// The link profile's name.
    pub link: String,
    /// [`crate::e2e::run_target`]'s rows.
    pub runs: Vec<E2eRun>,
}

/// One decode step's regressors and time.
struct StepSample {
    link: usize,
    compute_ms: f64,
    rtt_ms: f64,
    wire_ms: f64,
    total_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the benchmark and writes the reports. Errors: model, server or I/O failures.
pub fn run(opts: &SplitBenchOptions) -> anyhow::Result<SplitBenchReport> {
    let (server_placement, pinning) = place(opts.pin);
    eprintln!("placement: {pinning}");
    let model = Arc::new(
        Model::load(&opts.model).with_context(|| format!("loading {}", opts.model.display()))?,
    );
    let tok = Tokenizer::for_model(&opts.model)?;
    let prompts: Vec<Vec<u32>> = opts
        .prompts
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let backend: Arc<dyn SplitBackend> = Arc::new(ModelBackend::new(model.clone(), 1 << 16));
    let server = ServerThread::start_serving(
        ServeConfig::new("127.0.0.1:0".parse()?),
        Vec::new(),
        Some(backend),
        1,
        server_placement.clone(),
    )?;
    let endpoint = format!("http://{}", server.addr());
    let mut drafters = Vec::new();
    if opts.k > 0 {
        drafters.push((DraftMethod::PromptLookup(PromptLookup::default()), opts.k));
        for &l in &opts.lookahead {
            drafters.push((DraftMethod::Lookahead(l), opts.k));
        }
        if opts.adaptive_k {
            let adaptive = DraftMethod::AdaptivePromptLookup(AdaptiveLookup::default());
            drafters.push((adaptive, opts.k));
        }
    }
    if opts.no_draft_baseline || opts.k == 0 {
        drafters.push((DraftMethod::None, 0));
    }
    // A private client verifies with f32 weights (as `bench e2e`).
    let he_model = match &opts.he {
        Some(_) => Some(Model::load_with(
            &opts.model,
            &LoadOptions {
                weights: WeightMode::Auto.for_private_verify(),
            },
        )?),
        None => None,
    };
    let mut he = Vec::new();
    let links: Vec<(String, LinkProfile)> = opts
        .links
        .iter()
        .map(|l| Ok((l.clone(), l.parse::<LinkProfile>()?)))
        .collect::<anyhow::Result<_>>()?;
    let mut runs = Vec::new();
    let mut samples = Vec::new();
    for (li, (link_name, link)) in links.iter().enumerate() {
        for &(a, b) in &opts.splits {
            for &(drafter, k) in &drafters {
                let config = SplitConfig {
                    head_layers: a,
                    tail_layers: b,
                    k,
                    max_tokens: opts.max_tokens,
                    eos: Vec::new(),
                    drafter,
                    sampling: SamplingParams::greedy(),
                };
                let mut cc = ClientConfig::new(endpoint.clone());
                cc.link = *link;
                let mut outs: Vec<SplitOutput> = Vec::new();
                let mut plain = Vec::new();
                let mut matches = true;
                for prompt in &prompts {
                    let (reference, plain_tps) = local_greedy(&model, prompt, opts.max_tokens)?;
                    plain.push(plain_tps);
                    let mut client = SplitClient::connect(&cc)?;
                    let cap = u32::try_from(config.capacity(prompt.len()))?;
                    client.open(a as u32, b as u32, cap)?;
                    let out = cipherlora_split::generate(
                        &model,
                        prompt,
                        &config,
                        &mut client,
                        &mut |_| {},
                    )?;
                    client.close()?;
                    matches &= out.tokens == reference;
                    outs.push(out);
                }
                let row = summarise(link_name, link, a, b, drafter, k, &outs, &plain, matches);
                eprintln!(
                    "{} ({a},{b}) {} K={k}: {:.2} tok/s vs local {:.2} ({:.2}×), {:.2} tokens/step, match {}",
                    row.link,
                    row.drafter,
                    row.tok_per_s,
                    row.plaintext_tok_per_s,
                    row.ratio_to_plaintext,
                    row.tokens_per_step,
                    row.matches_local
                );
                for out in &outs {
                    for s in out.steps.iter().skip(1) {
                        let bytes = (s.bytes_up + s.bytes_down) as f64;
                        samples.push(StepSample {
                            link: li,
                            compute_ms: ms(s.local) + ms(s.server),
                            rtt_ms: ms(link.rtt()),
                            wire_ms: wire_ms(link, bytes),
                            total_ms: ms(s.total),
                        });
                    }
                }
                runs.push(row);
            }
        }
        if let (Some(private), Some(he_model)) = (&opts.he, &he_model) {
            let private = PrivateRuns {
                links: vec![link_name.clone()],
                max_tokens: opts.max_tokens,
                ..private.clone()
            };
            let mut rows = Vec::new();
            let split_prompts = Prompts {
                ids: &prompts,
                eos: &[],
            };
            run_target(
                &private,
                he_model,
                &split_prompts,
                &server_placement,
                &mut rows,
                &mut Vec::new(),
            )?;
            he.push(HeLinkRuns {
                link: link_name.clone(),
                runs: rows,
            });
        }
    }
    drop(server);
    let fitted = fit_model(&samples, &links, &runs, &opts.project_rtts_ms);
    let report = SplitBenchReport {
        bench: "split".into(),
        runs,
        model: fitted,
        pinning,
        weights: model.weights_held().into(),
        prompts: prompts.len(),
        max_tokens: opts.max_tokens,
        he,
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

/// Serialisation of `bytes` at `link`'s download rate (0: unlimited), ms.
fn wire_ms(link: &LinkProfile, bytes: f64) -> f64 {
    link.down_bps()
        .filter(|&b| b > 0)
        .map_or(0.0, |bps| bytes * 8.0 / bps as f64 * 1e3)
}

/// The local whole model's greedy tokens and decode tok/s.
fn local_greedy(model: &Model, prompt: &[u32], n: usize) -> anyhow::Result<(Vec<u32>, f64)> {
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        eos: Vec::new(),
    };
    let g = generate(model, prompt, &opts, &mut NoAdapter, &mut |_| Ok(()))?;
    let tps = g.tokens.len().saturating_sub(1) as f64 / g.decode_secs.max(1e-9);
    Ok((g.tokens, tps))
}

#[allow(clippy::too_many_arguments)]
fn summarise(
    link_name: &str,
    link: &LinkProfile,
    a: usize,
    b: usize,
    drafter: DraftMethod,
    k: usize,
    outs: &[SplitOutput],
    plain: &[f64],
    matches: bool,
) -> SplitRun {
    let decode = || outs.iter().flat_map(|o| o.steps.iter().skip(1));
    let steps = decode().count().max(1) as f64;
    let decode_tokens: usize = decode().map(|s| s.emitted).sum();
    let decode_s: f64 = decode().map(|s| s.total.as_secs_f64()).sum();
    let sum =
        |f: &dyn Fn(&cipherlora_split::SplitStep) -> f64| decode().map(f).sum::<f64>() / steps;
    let tokens: usize = outs.iter().map(|o| o.tokens.len()).sum();
    let bytes: u64 = outs
        .iter()
        .flat_map(|o| &o.steps)
        .map(|s| s.bytes_up + s.bytes_down)
        .sum();
    let tok_per_s = decode_tokens as f64 / decode_s.max(1e-9);
    let plaintext = plain.iter().sum::<f64>() / plain.len().max(1) as f64;
    SplitRun {
        link: link_name.into(),
        rtt_ms: ms(link.rtt()),
        mbps: link.down_bps().map_or(0.0, |b| b as f64 / 1e6),
        a,
        b,
        drafter: match drafter {
            DraftMethod::None => "none".into(),
            DraftMethod::PromptLookup(_) => "prompt-lookup".into(),
            DraftMethod::Lookahead(l) => format!("lookahead (W,N,G = {l})"),
            DraftMethod::AdaptivePromptLookup(_) => "prompt-lookup (adaptive, ≤ 2K)".into(),
        },
        k,
        tokens,
        tok_per_s,
        plaintext_tok_per_s: plaintext,
        ratio_to_plaintext: tok_per_s / plaintext.max(1e-9),
        tokens_per_step: decode_tokens as f64 / steps,
        round_trips: outs.iter().map(|o| o.steps.len()).sum(),
        bytes_per_token: bytes as f64 / tokens.max(1) as f64,
        local_ms_per_step: sum(&|s| ms(s.local)),
        server_ms_per_step: sum(&|s| ms(s.server)),
        network_ms_per_step: sum(&|s| ms(s.remote.saturating_sub(s.server))),
        step_ms: sum(&|s| ms(s.total)),
        bytes_per_step: sum(&|s| (s.bytes_up + s.bytes_down) as f64),
        matches_local: matches,
    }
}

/// Least squares `x·c ≈ y` by the normal equations (`None`: singular).
fn least_squares(rows: &[([f64; 4], f64)]) -> Option<[f64; 4]> {
    let mut m = [[0.0f64; 5]; 4];
    for (x, y) in rows {
        for i in 0..4 {
            for j in 0..4 {
                m[i][j] += x[i] * x[j];
            }
            m[i][4] += x[i] * y;
        }
    }
    for col in 0..4 {
        let p = (col..4).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[p][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, p);
        let pivot = m[col];
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot[col];
                for (x, p) in row.iter_mut().zip(pivot).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some([0, 1, 2, 3].map(|i| m[i][4] / m[i][i]))
}

fn regressors(s: &StepSample) -> [f64; 4] {
    [1.0, s.compute_ms, s.rtt_ms, s.wire_ms]
}

fn predict(c: &[f64; 4], x: &[f64; 4]) -> f64 {
    c.iter().zip(x).map(|(c, x)| c * x).sum()
}

fn fit_model(
    samples: &[StepSample],
    links: &[(String, LinkProfile)],
    runs: &[SplitRun],
    rtts: &[f64],
) -> Option<RttModel> {
    let rows: Vec<([f64; 4], f64)> = samples
        .iter()
        .map(|s| (regressors(s), s.total_ms))
        .collect();
    let coefficients = least_squares(&rows)?;
    let mut cross_validation = Vec::new();
    for (li, (name, _)) in links.iter().enumerate() {
        let train: Vec<_> = samples
            .iter()
            .filter(|s| s.link != li)
            .map(|s| (regressors(s), s.total_ms))
            .collect();
        let test: Vec<_> = samples.iter().filter(|s| s.link == li).collect();
        let Some(c) = least_squares(&train) else {
            continue;
        };
        if test.is_empty() {
            continue;
        }
        let n = test.len() as f64;
        let measured = test.iter().map(|s| s.total_ms).sum::<f64>() / n;
        let predicted = test
            .iter()
            .map(|s| predict(&c, &regressors(s)))
            .sum::<f64>()
            / n;
        cross_validation.push((
            name.clone(),
            measured,
            predicted,
            (predicted - measured) / measured,
        ));
    }
    let mut projections = Vec::new();
    // One projection per (split, drafter) from its first link's row.
    let mut seen = Vec::new();
    for r in runs {
        let key = format!("({},{}) {} K={}", r.a, r.b, r.drafter, r.k);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key.clone());
        let link = LinkProfile::from_rtt_mbps(0.0, 100.0).ok()?;
        for &rtt in rtts {
            let x = [
                1.0,
                r.local_ms_per_step + r.server_ms_per_step,
                rtt,
                wire_ms(&link, r.bytes_per_step),
            ];
            let step = predict(&coefficients, &x);
            projections.push((key.clone(), rtt, step, r.tokens_per_step / step * 1e3));
        }
    }
    Some(RttModel {
        coefficients,
        steps: samples.len(),
        cross_validation,
        projections,
    })
}

/// One Markdown line: a split run, an HE-LoRA run or its reference.
struct TableRow {
    link: String,
    mode: String,
    drafter: String,
    k: usize,
    tok_per_s: f64,
    local_tok_per_s: f64,
    ratio: f64,
    tokens_per_step: f64,
    round_trips: usize,
    bytes_per_token: f64,
    /// local, server, network and whole step, ms per step.
    step_ms: [f64; 4],
    matches: bool,
}

impl TableRow {
    fn split(x: &SplitRun) -> Self {
        Self {
            link: x.link.clone(),
            mode: format!("split ({},{})", x.a, x.b),
            drafter: x.drafter.clone(),
            k: x.k,
            tok_per_s: x.tok_per_s,
            local_tok_per_s: x.plaintext_tok_per_s,
            ratio: x.ratio_to_plaintext,
            tokens_per_step: x.tokens_per_step,
            round_trips: x.round_trips,
            bytes_per_token: x.bytes_per_token,
            step_ms: [
                x.local_ms_per_step,
                x.server_ms_per_step,
                x.network_ms_per_step,
                x.step_ms,
            ],
            matches: x.matches_local,
        }
    }

    /// An HE-LoRA row of `link` (times summed over prompts, decode only).
    fn he(link: &str, x: &E2eRun) -> Self {
        let rounds = x.rounds.max(1) as f64;
        let d = &x.split_ms;
        let (mode, round_trips) = if x.mode == "plaintext" {
            (format!("local plaintext, {} adapter merged", x.lora), 0)
        } else {
            let trips = (x.round_trips_per_round * x.rounds as f64).round() as usize;
            (format!("HE-LoRA {} ({})", x.lora, x.schedule), trips)
        };
        Self {
            link: link.into(),
            mode,
            drafter: x.drafter.clone(),
            k: x.k,
            tok_per_s: x.tok_per_s,
            local_tok_per_s: x.plaintext_tok_per_s,
            ratio: x.ratio_to_plaintext,
            tokens_per_step: x.mean_accepted,
            round_trips,
            bytes_per_token: x.bytes_up_per_token + x.bytes_down_per_token,
            step_ms: [
                (d.draft + d.forward + d.encrypt + d.decrypt) / rounds,
                d.server / rounds,
                d.network / rounds,
                d.total() / rounds,
            ],
            matches: x.matches_plaintext == Some(true),
        }
    }

    fn markdown(&self) -> String {
        let [local, server, network, step] = self.step_ms;
        format!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.3} | {:.2} | {} | {:.0} | {local:.1} | {server:.1} | {network:.1} | {step:.1} | {} |\n",
            self.link,
            self.mode,
            self.drafter,
            self.k,
            self.tok_per_s,
            self.local_tok_per_s,
            self.ratio,
            self.tokens_per_step,
            self.round_trips,
            self.bytes_per_token,
            if self.matches { "yes" } else { "**NO**" },
        )
    }
}

/// The table's rows per link: split runs, then HE-LoRA rows.
fn table_rows(r: &SplitBenchReport) -> Vec<TableRow> {
    let mut links: Vec<&str> = Vec::new();
    for l in r.runs.iter().map(|x| x.link.as_str()) {
        if !links.contains(&l) {
            links.push(l);
        }
    }
    for h in &r.he {
        if !links.contains(&h.link.as_str()) {
            links.push(&h.link);
        }
    }
    let mut rows = Vec::new();
    for link in links {
        rows.extend(
            r.runs
                .iter()
                .filter(|x| x.link == link)
                .map(TableRow::split),
        );
        for h in r.he.iter().filter(|h| h.link == link) {
            rows.extend(h.runs.iter().map(|x| TableRow::he(link, x)));
        }
    }
    rows
}

/// The Markdown tables of a report.
#[must_use]
pub fn markdown(r: &SplitBenchReport) -> String {
    let mut s = format!(
        "Split inference end to end ({} prompts × {} tokens, greedy, gRPC on loopback behind the link simulator; {}).\n\n\
         | link | mode | drafter | K | tok/s | local tok/s, side by side | × local | tokens/step | round trips | bytes/token | local ms/step | server ms/step | network ms/step | step ms | match |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        r.prompts, r.max_tokens, r.pinning
    );
    for row in table_rows(r) {
        s.push_str(&row.markdown());
    }
    s.push_str(
        "\ntok/s and ms/step: decode steps only (the first step, the prompt's prefill, is \
         excluded); split round trips include it. bytes/token: protobuf request + response bytes \
         (f32 hidden states) over all steps. Split rows: \"local\" is the whole base model run \
         locally, \"match\" equality with its greedy tokens.\n",
    );
    s.push_str(&format!(
        "Split rows' weights (client, server and local model): {}.\n",
        r.weights
    ));
    if !r.he.is_empty() {
        s.push_str(
            "HE-LoRA rows (`bench e2e`'s measurement on the same prompts and link): a step is a \
             verify round; prefill runs through a separate session and is excluded, from round \
             trips and bytes too; \"local\" is the plaintext model with the adapter merged, \
             timed right before the run with f32 weights, as a private client verifies (the \
             plaintext row: the median of those timings), \"match\" equality with its greedy tokens; local ms/step: drafting, plaintext \
             passes, encryption and decryption.\n",
        );
    }
    if let Some(m) = &r.model {
        let c = m.coefficients;
        s.push_str(&format!(
            "\nRTT decomposition, least squares over {} decode steps: step ms = {:.2} + {:.3}·(local + server compute) + {:.3}·RTT + {:.3}·(bytes·8/bandwidth) (ideal 0, 1, 1, 1).\n\n\
             | held-out link | measured step ms | predicted step ms | error |\n| --- | ---: | ---: | ---: |\n",
            m.steps, c[0], c[1], c[2], c[3]
        ));
        for (link, meas, pred, err) in &m.cross_validation {
            s.push_str(&format!(
                "| {link} | {meas:.1} | {pred:.1} | {:+.1} % |\n",
                err * 100.0
            ));
        }
        s.push_str(
            "\nProjected decode tok/s at 100 Mbit/s (fitted model, each configuration's measured \
             compute, bytes and tokens/step):\n\n| configuration | RTT ms | step ms | tok/s |\n| --- | ---: | ---: | ---: |\n",
        );
        for (cfg, rtt, step, tps) in &m.projections {
            s.push_str(&format!("| {cfg} | {rtt:.0} | {step:.1} | {tps:.2} |\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_an_exact_linear_model() {
        let truth = [2.0, 1.0, 1.0, 1.5];
        let rows: Vec<_> = (0..20)
            .map(|i| {
                let x = [
                    1.0,
                    (i % 7) as f64,
                    (i % 3) as f64 * 20.0,
                    (i % 5) as f64 * 0.3,
                ];
                (x, predict(&truth, &x))
            })
            .collect();
        let c = least_squares(&rows).unwrap();
        for (a, b) in c.iter().zip(truth) {
            assert!((a - b).abs() < 1e-6, "{c:?}");
        }
        assert!(least_squares(&rows[..1]).is_none());
    }
}
