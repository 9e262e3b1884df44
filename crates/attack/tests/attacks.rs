//! The attacks on the real default model (SmolLM2-135M-Instruct Q4_1, fetched and sha256-checked by
//! `cipherlora_model::fetch`), with text committed to this repository so the tests need no corpus
//! download: training text is the repository's own Markdown (README, BENCHMARKS), held-out text the
//! general-prose evaluation prompts (held-out Gutenberg works) and the HumanEval prompts. Ground
//! truth is the tokenizer's ids of that text, independent of every attack.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::OnceLock;

use cipherlora_attack::AttackError;
use cipherlora_attack::ciphertext::ciphertext_features;
use cipherlora_attack::dataset::{
    Activations, Corpus, Document, gutenberg_body, is_heldout, load_code_prompts, sample_windows,
};
use cipherlora_attack::exact::{
    EmbeddingRanker, ExactConfig, FirstPositionTable, Ranker, invert_window,
};
use cipherlora_attack::learned::{
    Features, Inverter, InverterKind, TrainConfig, frequency_baseline, recovery_rate,
};
use cipherlora_model::{Model, Tokenizer, fetch};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn model() -> &'static (Model, Tokenizer) {
    static M: OnceLock<(Model, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Model::load(&path).expect("load"),
            Tokenizer::for_model(&path).expect("tokenizer"),
        )
    })
}

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(p)
}

fn doc(p: &str) -> Document {
    Document {
        name: p.into(),
        text: std::fs::read_to_string(repo(p)).unwrap(),
    }
}

/// Train: the repository's README and BENCHMARKS; held out: the general evaluation prompts (prose
/// of held-out Gutenberg works).
fn corpus() -> Corpus {
    Corpus {
        train: vec![doc("README.md"), doc("BENCHMARKS.md")],
        heldout: load_code_prompts(&repo("adapters/eval/general_prompts.jsonl")).unwrap(),
    }
}

/// States at depth 1 of 96 train windows and 24 held-out windows (32 tokens).
fn states() -> &'static (Activations, Activations) {
    static S: OnceLock<(Activations, Activations)> = OnceLock::new();
    S.get_or_init(|| {
        let (m, tok) = model();
        let c = corpus();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let tr = sample_windows(&c.train, tok, 96, 32, &mut rng).unwrap();
        let ev = sample_windows(&c.heldout, tok, 24, 32, &mut rng).unwrap();
        (
            Activations::compute(m, &tr, &[1]).unwrap(),
            Activations::compute(m, &ev, &[1]).unwrap(),
        )
    })
}

fn small_training() -> TrainConfig {
    TrainConfig {
        classes: 512,
        epochs: 4,
        batch: 128,
        lr: 3e-3,
        weight_decay: 1e-4,
        seed: 3,
    }
}

/// Lists the true token of each successive position among 63 seeded random decoys (one `rank` call
/// per position, in order): the search's soundness without depending on a ranker's quality, which
/// the benchmark measures.
struct DecoyRanker {
    truth: Vec<u32>,
    next: Cell<usize>,
}

impl Ranker for DecoyRanker {
    fn rank(&self, _state: &[f32], k: usize) -> cipherlora_attack::Result<Vec<u32>> {
        let p = self.next.get();
        self.next.set(p + 1);
        let mut rng = ChaCha8Rng::seed_from_u64(p as u64);
        let mut v: Vec<u32> = (0..63).map(|_| rng.random_range(0..49_152u32)).collect();
        let at = rng.random_range(0..=v.len());
        v.insert(at, self.truth[p]);
        v.truncate(k);
        Ok(v)
    }
}

/// SipIt-style search with the public weights: given candidates that include the true token, it
/// recovers every token of a held-out prose prompt from its states at depths 1 and 2, each verified
/// within the tolerance, with orders of magnitude between the matches and the nearest wrong
/// candidate; position 0 is also found by the table lookup alone (checked at depth 1).
#[test]
fn exact_attack_recovers_a_heldout_prompt_at_depths_1_and_2() {
    let (m, tok) = model();
    let prompts = load_code_prompts(&repo("adapters/eval/general_prompts.jsonl")).unwrap();
    let ids: Vec<u32> = tok.encode(&prompts[1].text).unwrap()[..24].to_vec();
    let acts = Activations::compute(m, std::slice::from_ref(&ids), &[1, 2]).unwrap();
    let cfg = ExactConfig {
        budget: 64,
        batch: 32,
        tolerance: 1e-3,
        full_search: false,
    };
    for depth in [1, 2] {
        let ranker = DecoyRanker {
            truth: ids.clone(),
            next: Cell::new(0),
        };
        let r =
            invert_window(m, acts.at(depth).unwrap(), depth, &ranker, None, None, &cfg).unwrap();
        assert_eq!(r.recovered, ids, "depth {depth}");
        assert_eq!(r.matched, ids.len());
        assert!(r.matched_at.iter().all(|&b| b));
        assert!(r.farthest_match < 1e-4, "{}", r.farthest_match);
        assert!(r.closest_wrong > 1e-2, "{}", r.closest_wrong);
    }
    // Position 0 from the table: a ranker that never lists the truth.
    let table = FirstPositionTable::new(m, 1, 4096).unwrap();
    let wrong = DecoyRanker {
        truth: vec![0; ids.len()],
        next: Cell::new(0),
    };
    let one = &acts.at(1).unwrap()[..m.config().hidden_size];
    let r = invert_window(m, one, 1, &wrong, None, Some(&table), &cfg).unwrap();
    assert_eq!(r.recovered, ids[..1]);
    assert_eq!(r.matched, 1);
}

/// A linear inverter trained on a few thousand depth-1 states of unrelated text (the repository's
/// Markdown) recovers held-out prose well above the frequency baseline.
#[test]
fn linear_inverter_beats_the_frequency_baseline_at_depth_1() {
    let (tr, ev) = states();
    let train = Features::new(tr.dim, tr.at(1).unwrap().to_vec(), tr.tokens.clone()).unwrap();
    let inv = Inverter::train(InverterKind::Linear, &train, &small_training()).unwrap();
    let rate = recovery_rate(&inv.predict(ev.at(1).unwrap()).unwrap(), &ev.tokens).unwrap();
    let (_, base) = frequency_baseline(&tr.tokens, &ev.tokens).unwrap();
    assert!(base < 0.1, "baseline {base}");
    assert!(rate > base + 0.2, "linear {rate} vs baseline {base}");
}

/// The same inverter on CKKS ciphertexts of the same states scores no better than the frequency
/// baseline beyond a binomial margin (4σ).
#[test]
fn ciphertext_attacker_stays_at_the_frequency_baseline() {
    let (tr, ev) = states();
    let dim = 256;
    let xtr = ciphertext_features(tr.at(1).unwrap(), tr.dim, &tr.window_lens, dim, 5).unwrap();
    let xev = ciphertext_features(ev.at(1).unwrap(), ev.dim, &ev.window_lens, dim, 6).unwrap();
    assert!(xtr.iter().all(|v| (0.0..1.0).contains(v)));
    let train = Features::new(dim, xtr, tr.tokens.clone()).unwrap();
    let inv = Inverter::train(InverterKind::Linear, &train, &small_training()).unwrap();
    let rate = recovery_rate(&inv.predict(&xev).unwrap(), &ev.tokens).unwrap();
    let (_, base) = frequency_baseline(&tr.tokens, &ev.tokens).unwrap();
    let n = ev.tokens.len() as f64;
    let p = base.max(0.05);
    let margin = 4.0 * (p * (1.0 - p) / n).sqrt();
    assert!(
        rate <= base + margin,
        "ciphertext {rate} vs baseline {base} (+{margin})"
    );
}

/// The work-level split agrees with tools/train_adapter/common.py (values computed there with
/// Python's hashlib).
#[test]
fn split_matches_the_python_tools() {
    for w in [
        "a-christmas-carol",
        "the-time-machine",
        "grimms-fairy-tales",
    ] {
        assert!(is_heldout(w), "{w}");
    }
    for w in ["alices-adventures-in-wonderland", "the-secret-adversary"] {
        assert!(!is_heldout(w), "{w}");
    }
}

#[test]
fn gutenberg_body_keeps_the_text_between_the_markers() {
    let raw = "Header\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n\r\nOne\r\ntwo  three.\r\n\r\nFour.\r\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nLicence";
    assert_eq!(gutenberg_body(raw).unwrap(), "One two three.\n\nFour.");
    assert!(gutenberg_body("no markers here").is_none());
}

#[test]
fn bad_inputs_give_typed_errors() {
    let (m, tok) = model();
    let layers = m.config().num_layers;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let e = sample_windows(&[], tok, 1, 16, &mut rng).unwrap_err();
    assert!(matches!(e, AttackError::Input(_)), "{e}");
    let empty = [Document {
        name: "empty".into(),
        text: String::new(),
    }];
    assert!(matches!(
        sample_windows(&empty, tok, 1, 16, &mut rng),
        Err(AttackError::Input(_))
    ));
    let e = Activations::compute(m, &[vec![1, 2, 3]], &[layers + 1]).unwrap_err();
    assert!(matches!(e, AttackError::Input(_)), "{e}");
    let ranker = EmbeddingRanker::new(m).unwrap();
    let h = m.config().hidden_size;
    let e = invert_window(
        m,
        &vec![0.0; h],
        layers + 1,
        &ranker,
        None,
        None,
        &ExactConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, AttackError::Input(_)), "{e}");
    let e = invert_window(
        m,
        &vec![0.0; h + 1],
        1,
        &ranker,
        None,
        None,
        &ExactConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, AttackError::Input(_)), "{e}");
    let e = Corpus::load_general(&repo("no/such/manifest.json"), &repo(".")).unwrap_err();
    assert!(matches!(e, AttackError::Corpus(_)), "{e}");
    let e = Features::new(4, vec![0.0; 7], vec![1, 2]).unwrap_err();
    assert!(matches!(e, AttackError::Input(_)), "{e}");
    let f = Features::new(2, vec![], vec![]).unwrap();
    assert!(Inverter::train(InverterKind::Linear, &f, &TrainConfig::default()).is_err());
    assert!(frequency_baseline(&[], &[1]).is_err());
    assert!(ciphertext_features(&[0.0; 3], 2, &[1], 8, 0).is_err());
}
