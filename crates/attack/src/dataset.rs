//! Text for the attacks and the hidden states a split server would see: [`Corpus`],
//! [`sample_windows`] and [`Activations`].

use std::path::Path;

use cipherlora_model::{AttentionMask, Model, Tokenizer};
use rand::{Rng, RngExt};
use sha2::{Digest, Sha256};

use crate::{AttackError, Result};

/// Seed of the corpus's document-level split (`SPLIT_SEED` in `tools/train_adapter/common.py`).
pub const SPLIT_SEED: u64 = 20241121;
/// Percentage of works held out.
pub const HELDOUT_PERCENT: u64 = 10;

/// Whether work `key` is held out (its seeded sha256 mod 100 < [`HELDOUT_PERCENT`]).
pub fn is_heldout(key: &str) -> bool {
    let h = Sha256::digest(format!("{SPLIT_SEED}:{key}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    u64::from_be_bytes(b) % 100 < HELDOUT_PERCENT
}

/// One document's text and a name for reports.
#[derive(Debug, Clone)]
pub struct Document {
    /// File path or identifier.
    pub name: String,
    /// The text (Gutenberg header and footer removed).
    pub text: String,
}

/// Train and held-out documents.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    /// Documents the attackers may train on.
    pub train: Vec<Document>,
    /// Documents of held-out works (evaluation only).
    pub heldout: Vec<Document>,
}

impl Corpus {
    /// Loads the general corpus in `manifest` under `root`, sha256-checked, split by work. Errors:
    /// [`AttackError::Corpus`].
    pub fn load_general(manifest: &Path, root: &Path) -> Result<Self> {
        let raw = std::fs::read_to_string(manifest)
            .map_err(|e| AttackError::Corpus(format!("{}: {e}", manifest.display())))?;
        let m: serde_json::Value = serde_json::from_str(&raw)
            .map_err(|e| AttackError::Corpus(format!("{}: {e}", manifest.display())))?;
        let files = m
            .get("files")
            .and_then(|f| f.as_array())
            .ok_or_else(|| AttackError::Corpus("manifest has no \"files\" array".into()))?;
        let mut corpus = Corpus::default();
        for f in files {
            let field = |k: &str| {
                f.get(k).and_then(|v| v.as_str()).ok_or_else(|| {
                    AttackError::Corpus(format!("manifest entry lacks string field {k:?}"))
                })
            };
            let (path, work, sha) = (field("path")?, field("work")?, field("sha256")?);
            let full = root.join(path);
            let bytes = std::fs::read(&full)
                .map_err(|e| AttackError::Corpus(format!("{}: {e}", full.display())))?;
            let digest: String = Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            if digest != sha {
                return Err(AttackError::Corpus(format!(
                    "sha256 mismatch for {}: {digest}, manifest {sha}",
                    full.display()
                )));
            }
            let text = gutenberg_body(&String::from_utf8_lossy(&bytes))
                .ok_or_else(|| AttackError::Corpus(format!("{path}: no START marker")))?;
            let doc = Document {
                name: path.to_string(),
                text,
            };
            if is_heldout(work) {
                corpus.heldout.push(doc);
            } else {
                corpus.train.push(doc);
            }
        }
        if corpus.train.is_empty() || corpus.heldout.is_empty() {
            return Err(AttackError::Corpus(format!(
                "empty split: {} train, {} held-out documents",
                corpus.train.len(),
                corpus.heldout.len()
            )));
        }
        Ok(corpus)
    }
}

/// The text between Project Gutenberg's START and END markers, paragraphs unwrapped.
pub fn gutenberg_body(raw: &str) -> Option<String> {
    let lines: Vec<&str> = raw.lines().collect();
    let start = lines.iter().position(|l| {
        let l = l.trim_start().to_ascii_lowercase();
        l.starts_with("***")
            && (l.contains("start of the project gutenberg")
                || l.contains("start of this project gutenberg"))
    })?;
    let body = &lines[start + 1..];
    let end = body
        .iter()
        .position(|l| {
            let t = l.trim_start().trim_start_matches('*').trim_start();
            let low = t.to_ascii_lowercase();
            low.starts_with("end of the project gutenberg")
                || low.starts_with("end of this project gutenberg")
                || low.starts_with("end of project gutenberg")
                || t.starts_with("The Project Gutenberg Etext of")
        })
        .unwrap_or(body.len());
    let mut paras: Vec<String> = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    // A paragraph's lines joined, runs of whitespace collapsed to one space.
    let flush = |cur: &mut Vec<&str>, paras: &mut Vec<String>| {
        if !cur.is_empty() {
            paras.push(
                cur.join(" ")
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            cur.clear();
        }
    };
    for l in &body[..end] {
        let l = l.trim();
        if l.is_empty() {
            flush(&mut cur, &mut paras);
        } else {
            cur.push(l);
        }
    }
    flush(&mut cur, &mut paras);
    Some(paras.join("\n\n"))
}

/// The `"prompt"` of each line of a JSON-lines file. Errors: [`AttackError::Corpus`].
pub fn load_code_prompts(path: &Path) -> Result<Vec<Document>> {
    let raw = std::fs::read_to_string(path)
        .map_err(|e| AttackError::Corpus(format!("{}: {e}", path.display())))?;
    let mut docs = Vec::new();
    for (i, line) in raw
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| AttackError::Corpus(format!("{}:{}: {e}", path.display(), i + 1)))?;
        let p = v.get("prompt").and_then(|p| p.as_str()).ok_or_else(|| {
            AttackError::Corpus(format!("{}:{}: no \"prompt\"", path.display(), i + 1))
        })?;
        docs.push(Document {
            name: format!("{}:{}", path.display(), i + 1),
            text: p.to_string(),
        });
    }
    if docs.is_empty() {
        return Err(AttackError::Corpus(format!(
            "{}: no prompts",
            path.display()
        )));
    }
    Ok(docs)
}

/// Shortest window [`sample_windows`] keeps (tokens).
pub const MIN_WINDOW: usize = 8;

/// `count` windows of [`MIN_WINDOW`]..=`len` tokens cut at random. Errors: [`AttackError::Input`];
/// tokenizer errors.
pub fn sample_windows<R: Rng + ?Sized>(
    docs: &[Document],
    tok: &Tokenizer,
    count: usize,
    len: usize,
    rng: &mut R,
) -> Result<Vec<Vec<u32>>> {
    if len < MIN_WINDOW {
        return Err(AttackError::Input(format!(
            "window length {len} < {MIN_WINDOW}"
        )));
    }
    let total: usize = docs.iter().map(|d| d.text.len()).sum();
    if total == 0 {
        return Err(AttackError::Input("no text to sample windows from".into()));
    }
    let mut out = Vec::with_capacity(count);
    let mut failures = 0usize;
    while out.len() < count {
        let mut at = rng.random_range(0..total);
        let doc = docs
            .iter()
            .find(|d| {
                if at < d.text.len() {
                    true
                } else {
                    at -= d.text.len();
                    false
                }
            })
            .expect("at < total");
        let text = &doc.text;
        let mut s = at;
        while !text.is_char_boundary(s) {
            s -= 1;
        }
        let mut e = (s + 8 * len).min(text.len());
        while !text.is_char_boundary(e) {
            e -= 1;
        }
        let ids = tok.encode(&text[s..e])?;
        if ids.len() > MIN_WINDOW {
            let end = (1 + len).min(ids.len());
            out.push(ids[1..end].to_vec());
        } else {
            failures += 1;
            if failures > 100 + 10 * count {
                return Err(AttackError::Input(format!(
                    "cannot cut {MIN_WINDOW}-token windows from these documents"
                )));
            }
        }
    }
    Ok(out)
}

/// Hidden states of many windows at several depths.
#[derive(Debug, Clone)]
pub struct Activations {
    /// Depths (decoder layers run), in the order of `states`.
    pub depths: Vec<usize>,
    /// Hidden size (features per state).
    pub dim: usize,
    /// `states[i]`: row-major (positions, dim) f32 at `depths[i]`.
    pub states: Vec<Vec<f32>>,
    /// The token at each position (the label to recover).
    pub tokens: Vec<u32>,
    /// Positions of each window, in order.
    pub window_lens: Vec<usize>,
}

impl Activations {
    /// Number of positions (states per depth).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there is no position.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The states at `depth`, (positions, dim). Errors: [`AttackError::Input`].
    pub fn at(&self, depth: usize) -> Result<&[f32]> {
        self.depths
            .iter()
            .position(|&d| d == depth)
            .map(|i| self.states[i].as_slice())
            .ok_or_else(|| AttackError::Input(format!("depth {depth} not computed")))
    }

    /// The residual stream after `depths` layers for every window position (one causal pass per
    /// window). Errors: [`AttackError::Input`]; model errors.
    pub fn compute(model: &Model, windows: &[Vec<u32>], depths: &[usize]) -> Result<Self> {
        let layers = model.config().num_layers;
        if windows.is_empty() || windows.iter().any(|w| w.is_empty()) {
            return Err(AttackError::Input("no windows (or an empty one)".into()));
        }
        if depths.is_empty() {
            return Err(AttackError::Input("no depth".into()));
        }
        if let Some(&d) = depths.iter().find(|&&d| d > layers) {
            return Err(AttackError::Input(format!(
                "depth {d} > the model's {layers} layers"
            )));
        }
        let dim = model.config().hidden_size;
        let cap = windows.iter().map(|w| w.len()).max().unwrap_or(1);
        let mut cache = model.new_cache(cap)?;
        let mut states = vec![Vec::new(); depths.len()];
        let mut tokens = Vec::new();
        let mut window_lens = Vec::with_capacity(windows.len());
        for w in windows {
            cache.truncate(0);
            let hs = model.hidden_states_at(w, &mut cache, &AttentionMask::Causal, depths)?;
            for (dst, h) in states.iter_mut().zip(hs) {
                dst.extend(h.flatten_all()?.to_vec1::<f32>()?);
            }
            tokens.extend_from_slice(w);
            window_lens.push(w.len());
        }
        Ok(Activations {
            depths: depths.to_vec(),
            dim,
            states,
            tokens,
            window_lens,
        })
    }
}
