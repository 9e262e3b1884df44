//! Sampled split generation must follow the model's sampling distribution.
//!
//! At a fixed context that ends with a recurring n-gram, prompt lookup
//! drafts a token x for the first position, so the first generated token is
//! decided by speculative acceptance (kept with probability p(x), else drawn
//! from p without x). Over many seeds the first tokens of the split loop
//! (real default model, middle layers in process) must pass a χ²
//! goodness-of-fit test against the softmax of the whole model run locally
//! (an independent path: one forward pass over the prompt, all layers, one
//! cache); a rule that forgets to remove x before renormalising must fail
//! it. Seeds are fixed: the test is deterministic.

use std::sync::{Arc, OnceLock};

use cipherlora_model::{
    AttentionMask, Model, NoAdapter, Sampler, SamplingParams, Tokenizer, fetch,
};
use cipherlora_spec::acceptance::{RoundOutcome, sample};
use cipherlora_spec::ngram::PromptLookup;
use rand::RngExt;
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{ChiSquared, ContinuousCDF};

use crate::accept::{self, AcceptRule};
use crate::decode::generate_with;
use crate::{Drafter, InProcess, SplitConfig, SplitError};

/// Prompt lookup drafts " C"; the model gives it p ≈ 0.25 at temperature
/// 1 (a short prompt: each draw is a prefill).
const PROMPT: &str = "A B C A B";
const DRAWS: u64 = 300;

fn model() -> &'static (Arc<Model>, Tokenizer) {
    static M: OnceLock<(Arc<Model>, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Arc::new(Model::load(&path).expect("load")),
            Tokenizer::for_model(&path).expect("tokenizer"),
        )
    })
}

fn params(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    }
}

/// The whole model's sampling distribution after `prompt`.
fn local_probs(m: &Model, prompt: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache(prompt.len()).unwrap();
    let logits = m
        .forward(prompt, &mut cache, &AttentionMask::Causal, &mut NoAdapter)
        .unwrap();
    let row = logits
        .get(prompt.len() - 1)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    Sampler::new(params(0)).unwrap().probs(&row, prompt)
}

/// Counts of the split loop's first token over `DRAWS` seeds under `rule`.
fn first_tokens(rule: AcceptRule) -> (Vec<usize>, u32) {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPT).unwrap();
    let mut counts = vec![0usize; m.config().vocab_size];
    for seed in 0..DRAWS {
        let config = SplitConfig {
            head_layers: 2,
            tail_layers: 2,
            k: 1,
            max_tokens: 2,
            eos: Vec::new(),
            drafter: Drafter::PromptLookup(PromptLookup::default()),
            sampling: params(seed),
        };
        let mut mid = InProcess::new(m.clone(), 2, 2, config.capacity(prompt.len())).unwrap();
        let out = generate_with(m, &prompt, &config, &mut mid, &mut |_| {}, rule).unwrap();
        assert!(out.steps[0].drafted > 0, "no draft at the tested position");
        counts[out.tokens[0] as usize] += 1;
    }
    let x = PromptLookup::default().draft(&prompt, 1)[0];
    (counts, x)
}

/// χ² p-value of `counts` against `p`: tokens expected 5 times or more are
/// cells of their own, the rest one pooled cell.
fn chi2_p_value(p: &[f32], counts: &[usize]) -> f64 {
    let n = DRAWS as f64;
    let (mut chi2, mut cells, mut rest_o, mut rest_e) = (0.0, 0usize, 0.0, 0.0);
    for (t, &pt) in p.iter().enumerate() {
        let (e, o) = (n * f64::from(pt), counts[t] as f64);
        if e >= 5.0 {
            chi2 += (o - e).powi(2) / e;
            cells += 1;
        } else {
            rest_o += o;
            rest_e += e;
        }
    }
    if rest_e > 0.0 {
        chi2 += (rest_o - rest_e).powi(2) / rest_e.max(1e-9);
        cells += 1;
    }
    1.0 - ChiSquared::new((cells - 1) as f64).unwrap().cdf(chi2)
}

/// Wrong: a rejected draft is not removed before renormalising (the
/// replacement is drawn from p itself).
fn without_removing_the_draft(
    drafts: &[u32],
    probs: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> Result<RoundOutcome, SplitError> {
    let mut tokens = Vec::new();
    for (i, &d) in drafts.iter().enumerate() {
        if rng.random::<f64>() < f64::from(probs[i][d as usize]) {
            tokens.push(d);
        } else {
            tokens.push(sample(&probs[i], rng));
            return Ok(RoundOutcome {
                accepted: i,
                tokens,
            });
        }
    }
    tokens.push(sample(&probs[drafts.len()], rng));
    Ok(RoundOutcome {
        accepted: drafts.len(),
        tokens,
    })
}

#[test]
fn sampled_split_tokens_follow_the_whole_models_softmax() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPT).unwrap();
    let p = local_probs(m, &prompt);
    let (right, x) = first_tokens(accept::exact);
    // The test bites only if the draft is neither certain nor hopeless.
    let px = p[x as usize];
    assert!((0.05..0.95).contains(&px), "p(draft) = {px}");
    let pv = chi2_p_value(&p, &right);
    assert!(pv > 1e-3, "split sampling rejected by χ²: p = {pv}");
    let (wrong, _) = first_tokens(without_removing_the_draft);
    let pw = chi2_p_value(&p, &wrong);
    assert!(
        pw < 1e-4,
        "a rule that keeps the rejected draft passed: p = {pw}"
    );
}

#[test]
fn a_seed_gives_one_output_and_greedy_ignores_it() {
    let (m, tok) = model();
    let prompt = tok.encode(PROMPT).unwrap();
    let run = |sampling: SamplingParams| {
        let config = SplitConfig {
            head_layers: 1,
            tail_layers: 3,
            k: 3,
            max_tokens: 12,
            eos: Vec::new(),
            drafter: Drafter::default(),
            sampling,
        };
        let mut mid = InProcess::new(m.clone(), 1, 3, config.capacity(prompt.len())).unwrap();
        crate::generate(m, &prompt, &config, &mut mid, &mut |_| {})
            .unwrap()
            .tokens
    };
    assert_eq!(run(params(3)), run(params(3)));
    let greedy = |seed| SamplingParams {
        seed,
        ..SamplingParams::greedy()
    };
    assert_eq!(run(greedy(1)), run(greedy(2)));
    // Bad parameters are refused before any pass.
    let config = SplitConfig {
        head_layers: 1,
        tail_layers: 1,
        k: 0,
        max_tokens: 1,
        eos: Vec::new(),
        drafter: Drafter::None,
        sampling: SamplingParams {
            top_p: Some(0.0),
            ..params(0)
        },
    };
    let mut mid = InProcess::new(m.clone(), 1, 1, 64).unwrap();
    let e = crate::generate(m, &prompt, &config, &mut mid, &mut |_| {}).unwrap_err();
    assert!(matches!(e, SplitError::Model(_)), "{e}");
}
