//! The whole study: sample text, compute states at every depth, train and evaluate every attacker,
//! and collect an [`AttackReport`].

use std::time::Instant;

use cipherlora_model::{Model, Tokenizer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::ciphertext::ciphertext_features;
use crate::dataset::{Activations, Corpus, Document, sample_windows};
use crate::exact::{
    ChainRanker, EmbeddingRanker, ExactConfig, FirstPositionTable, Ranker, invert_windows,
};
use crate::learned::{
    Features, Inverter, InverterKind, TrainConfig, frequency_baseline, recovery_rate,
};
use crate::report::{AttackReport, AttackRow, PaperFigure};
use crate::{AttackError, Result};

/// An attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Attacker {
    /// Softmax regression on the states.
    Linear,
    /// One-hidden-layer MLP on the states.
    Mlp,
    /// Search with the public weights ([`crate::exact`]).
    Exact,
    /// Linear and MLP on CKKS ciphertexts of the states.
    Ciphertext,
}

impl std::str::FromStr for Attacker {
    type Err = AttackError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "linear" => Ok(Attacker::Linear),
            "mlp" => Ok(Attacker::Mlp),
            "exact" => Ok(Attacker::Exact),
            "ciphertext" => Ok(Attacker::Ciphertext),
            o => Err(AttackError::Input(format!(
                "unknown attacker {o:?} (linear, mlp, exact, ciphertext)"
            ))),
        }
    }
}

/// Sizes and settings of a study.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StudyConfig {
    /// Split depths (decoder layers before the split).
    pub depths: Vec<usize>,
    /// Attackers to run.
    pub attackers: Vec<Attacker>,
    /// Training states for the learned attackers (rounded up to windows).
    pub train_states: usize,
    /// Held-out positions for the learned attackers (half prose, half code).
    pub eval_tokens: usize,
    /// Held-out positions for the exact attack (the first windows of the evaluation set).
    pub exact_tokens: usize,
    /// Training states for the ciphertext attackers.
    pub ciphertext_train_states: usize,
    /// Tokens per window.
    pub window: usize,
    /// Learned attackers' training.
    pub train: TrainConfig,
    /// MLP hidden width.
    pub mlp_hidden: usize,
    /// Ciphertext features per state (32-bit words of `c0`).
    pub ciphertext_dim: usize,
    /// Exact attack's search.
    pub exact: ExactConfig,
    /// Seed of everything.
    pub seed: u64,
}

impl Default for StudyConfig {
    fn default() -> Self {
        StudyConfig {
            depths: vec![1, 2, 4, 8],
            attackers: vec![
                Attacker::Linear,
                Attacker::Mlp,
                Attacker::Exact,
                Attacker::Ciphertext,
            ],
            train_states: 65_536,
            eval_tokens: 4096,
            exact_tokens: 512,
            ciphertext_train_states: 16_384,
            window: 64,
            train: TrainConfig::default(),
            mlp_hidden: 1024,
            ciphertext_dim: 576,
            exact: ExactConfig::default(),
            seed: 17,
        }
    }
}

/// The text a study draws from.
#[derive(Debug)]
pub struct StudyData<'a> {
    /// Train and held-out prose.
    pub corpus: &'a Corpus,
    /// Held-out code.
    pub code: &'a [Document],
    /// How it is described in the report.
    pub description: String,
}

/// Runs the study; `progress` receives one line per step. Errors: [`AttackError::Input`] for no
/// depth or attacker, a depth beyond the model, zero sizes, or empty text; errors of every step.
pub fn run_study(
    model: &Model,
    tok: &Tokenizer,
    data: &StudyData<'_>,
    cfg: &StudyConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<AttackReport> {
    let c = model.config();
    if cfg.depths.is_empty() || cfg.attackers.is_empty() {
        return Err(AttackError::Input("no depth or no attacker".into()));
    }
    if let Some(&d) = cfg.depths.iter().find(|&&d| d > c.num_layers) {
        return Err(AttackError::Input(format!(
            "depth {d} > the model's {} layers",
            c.num_layers
        )));
    }
    if cfg.train_states == 0 || cfg.eval_tokens == 0 || cfg.window == 0 {
        return Err(AttackError::Input(
            "zero train states, eval tokens or window".into(),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let t0 = Instant::now();
    let n_train = cfg.train_states.div_ceil(cfg.window);
    let train_windows = sample_windows(&data.corpus.train, tok, n_train, cfg.window, &mut rng)?;
    let n_eval = cfg.eval_tokens.div_ceil(cfg.window);
    let prose = sample_windows(
        &data.corpus.heldout,
        tok,
        n_eval.div_ceil(2),
        cfg.window,
        &mut rng,
    )?;
    let code = sample_windows(data.code, tok, n_eval / 2, cfg.window, &mut rng)?;
    // Interleave prose and code so any prefix of windows mixes both.
    let mut eval_windows = Vec::with_capacity(n_eval);
    let (mut p, mut q) = (prose.into_iter(), code.into_iter());
    loop {
        match (p.next(), q.next()) {
            (None, None) => break,
            (a, b) => eval_windows.extend(a.into_iter().chain(b)),
        }
    }
    progress(&format!(
        "sampled {} train and {} held-out windows ({:.0} s)",
        train_windows.len(),
        eval_windows.len(),
        t0.elapsed().as_secs_f64()
    ));
    let train_acts = Activations::compute(model, &train_windows, &cfg.depths)?;
    let eval_acts = Activations::compute(model, &eval_windows, &cfg.depths)?;
    progress(&format!(
        "states: {} train, {} held-out positions at depths {:?} ({:.0} s)",
        train_acts.len(),
        eval_acts.len(),
        cfg.depths,
        t0.elapsed().as_secs_f64()
    ));
    let (baseline_token, baseline) = frequency_baseline(&train_acts.tokens, &eval_acts.tokens)?;

    let has = |a: Attacker| cfg.attackers.contains(&a);
    let embed_ranker = if has(Attacker::Exact) {
        Some(EmbeddingRanker::new(model)?)
    } else {
        None
    };
    let mut rows = Vec::new();
    let dim = c.hidden_size;
    for &depth in &cfg.depths {
        let train = Features::new(
            dim,
            train_acts.at(depth)?.to_vec(),
            train_acts.tokens.clone(),
        )?;
        let eval_x = eval_acts.at(depth)?;
        let mut linear: Option<Inverter> = None;
        for (attacker, kind) in [
            (Attacker::Linear, InverterKind::Linear),
            (
                Attacker::Mlp,
                InverterKind::Mlp {
                    hidden: cfg.mlp_hidden,
                },
            ),
        ] {
            if !has(attacker) {
                continue;
            }
            let t = Instant::now();
            let inv = Inverter::train(kind, &train, &cfg.train)?;
            let pred = inv.predict(eval_x)?;
            let rate = recovery_rate(&pred, &eval_acts.tokens)?;
            let name = if attacker == Attacker::Linear {
                "linear"
            } else {
                "mlp"
            };
            progress(&format!(
                "depth {depth} {name}: {:.1} % ({:.0} s)",
                100.0 * rate,
                t.elapsed().as_secs_f64()
            ));
            rows.push(learned_row(
                depth,
                name,
                eval_acts.len(),
                rate,
                train.len(),
                &inv,
                t,
            ));
            if attacker == Attacker::Linear {
                linear = Some(inv);
            }
        }
        if let Some(er) = &embed_ranker {
            let t = Instant::now();
            let table = FirstPositionTable::new(model, depth, 2048)?;
            let mut lens = Vec::new();
            let mut n = 0;
            for &l in &eval_acts.window_lens {
                if n >= cfg.exact_tokens {
                    break;
                }
                lens.push(l);
                n += l;
            }
            let chain;
            let ranker: &dyn Ranker = match &linear {
                Some(lin) => {
                    chain = ChainRanker {
                        first: lin,
                        second: er,
                    };
                    &chain
                }
                None => er,
            };
            let res = invert_windows(
                model,
                &eval_x[..n * dim],
                &lens,
                depth,
                ranker,
                Some(er),
                Some(&table),
                &cfg.exact,
            )?;
            let rate = recovery_rate(&res.recovered, &eval_acts.tokens[..n])?;
            progress(&format!(
                "depth {depth} exact: {:.1} %, {} matched, {:.1} candidates/token ({:.0} s)",
                100.0 * rate,
                res.matched,
                res.candidates_tried as f64 / n as f64,
                t.elapsed().as_secs_f64()
            ));
            rows.push(AttackRow {
                depth,
                attacker: "exact".into(),
                eval_tokens: n,
                recovery: rate,
                train_states: 0,
                parameters: 0,
                classes: 0,
                class_coverage: 0.0,
                candidates_per_token: Some(res.candidates_tried as f64 / n as f64),
                matched: Some(res.matched),
                closest_wrong: Some(res.closest_wrong),
                farthest_match: Some(res.farthest_match),
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        if has(Attacker::Ciphertext) {
            let t = Instant::now();
            // The first windows of the training set, up to the budget.
            let mut lens = Vec::new();
            let mut n = 0;
            for &l in &train_acts.window_lens {
                if n >= cfg.ciphertext_train_states {
                    break;
                }
                lens.push(l);
                n += l;
            }
            let seed = cfg.seed ^ (depth as u64) << 32;
            let xtr = ciphertext_features(
                &train_acts.at(depth)?[..n * dim],
                dim,
                &lens,
                cfg.ciphertext_dim,
                seed,
            )?;
            let xev = ciphertext_features(
                eval_x,
                dim,
                &eval_acts.window_lens,
                cfg.ciphertext_dim,
                seed ^ 1,
            )?;
            let ctrain = Features::new(cfg.ciphertext_dim, xtr, train_acts.tokens[..n].to_vec())?;
            for (name, kind) in [
                ("ciphertext-linear", InverterKind::Linear),
                (
                    "ciphertext-mlp",
                    InverterKind::Mlp {
                        hidden: cfg.mlp_hidden,
                    },
                ),
            ] {
                let t1 = Instant::now();
                let inv = Inverter::train(kind, &ctrain, &cfg.train)?;
                let pred = inv.predict(&xev)?;
                let rate = recovery_rate(&pred, &eval_acts.tokens)?;
                progress(&format!(
                    "depth {depth} {name}: {:.1} % ({:.0} s)",
                    100.0 * rate,
                    t1.elapsed().as_secs_f64()
                ));
                rows.push(learned_row(
                    depth,
                    name,
                    eval_acts.len(),
                    rate,
                    ctrain.len(),
                    &inv,
                    t,
                ));
            }
        }
    }
    let source = "MLP inverter on Mistral-7B split activations, arXiv 2602.16760 \
                  (Privacy-Aware Split Inference with Speculative Decoding over WANs)";
    Ok(AttackReport {
        model: model.path().display().to_string(),
        model_shape: (c.num_layers, c.hidden_size, c.vocab_size),
        seed: cfg.seed,
        window: cfg.window,
        data: data.description.clone(),
        baseline_token,
        baseline_text: tok.decode(&[baseline_token])?,
        baseline,
        settings: serde_json::to_value(cfg)?,
        rows,
        paper: vec![
            PaperFigure {
                depth: 2,
                recovery: 0.59,
                source: source.into(),
            },
            PaperFigure {
                depth: 8,
                recovery: 0.35,
                source: source.into(),
            },
        ],
        complete: true,
    })
}

/// The report row of a learned attacker (no exact-search fields).
fn learned_row(
    depth: usize,
    name: &str,
    eval_tokens: usize,
    recovery: f64,
    train_states: usize,
    inv: &Inverter,
    started: Instant,
) -> AttackRow {
    AttackRow {
        depth,
        attacker: name.into(),
        eval_tokens,
        recovery,
        train_states,
        parameters: inv.parameters(),
        classes: inv.classes(),
        class_coverage: inv.coverage(),
        candidates_per_token: None,
        matched: None,
        closest_wrong: None,
        farthest_match: None,
        seconds: started.elapsed().as_secs_f64(),
    }
}
