//! `cipherlora attack`: the inversion-attack study (learned, exact and ciphertext attackers on
//! split activations), written as JSON and Markdown. The work is in `cipherlora_attack`.

use std::path::PathBuf;

use anyhow::Context;
use cipherlora_attack::dataset::{Corpus, load_code_prompts};
use cipherlora_attack::study::{Attacker, StudyConfig, StudyData, run_study};
use cipherlora_model::{Model, Tokenizer, fetch};
use clap::Args;

/// Arguments of `cipherlora attack`.
#[derive(Debug, Args)]
pub struct AttackArgs {
    /// Split depths (decoder layers the client runs).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    depths: Vec<usize>,
    /// Attackers: linear, mlp, exact, ciphertext.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "linear,mlp,exact,ciphertext"
    )]
    attackers: Vec<String>,
    /// Training states for the learned attackers.
    #[arg(long, default_value_t = 65_536)]
    train_states: usize,
    /// Held-out positions for the learned attackers (half prose, half code).
    #[arg(long, default_value_t = 4096)]
    eval_tokens: usize,
    /// Held-out positions for the exact attack.
    #[arg(long, default_value_t = 512)]
    exact_tokens: usize,
    /// Training states for the ciphertext attackers.
    #[arg(long, default_value_t = 16_384)]
    ciphertext_train_states: usize,
    /// Output classes of the learned attackers (most frequent train tokens).
    #[arg(long, default_value_t = 4096)]
    classes: usize,
    /// Training epochs.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// MLP hidden width.
    #[arg(long, default_value_t = 1024)]
    mlp_hidden: usize,
    /// Exact attack: candidates per position at most.
    #[arg(long, default_value_t = 256)]
    budget: usize,
    /// Exact attack: after the budget, search the whole vocabulary until a candidate matches (every
    /// position verified; slow at depth).
    #[arg(long)]
    full_search: bool,
    /// Seed of sampling, training and encryption.
    #[arg(long, default_value_t = 17)]
    seed: u64,
    /// GGUF file or HF folder (default: the fetched SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The general corpus's manifest.
    #[arg(long, default_value = "tools/train_adapter/general_corpus.json")]
    manifest: PathBuf,
    /// Root of the corpus checkout (default: $CIPHERLORA_GENERAL_CORPUS, or
    /// <cache>/corpora/ECE451-Parallel).
    #[arg(long)]
    corpus_root: Option<PathBuf>,
    /// Held-out code: JSON lines with a "prompt" field.
    #[arg(long, default_value = "adapters/eval/humaneval_0_19.jsonl")]
    code: PathBuf,
    /// JSON report.
    #[arg(long, default_value = "reports/attack.json")]
    json: PathBuf,
    /// Markdown report (default: the JSON path with .md).
    #[arg(long)]
    markdown: Option<PathBuf>,
}

impl AttackArgs {
    /// Runs the study and writes the reports.
    pub fn run(self) -> anyhow::Result<()> {
        let attackers = self
            .attackers
            .iter()
            .map(|a| a.parse::<Attacker>())
            .collect::<Result<Vec<_>, _>>()?;
        let path = match self.model {
            Some(p) => p,
            None => fetch::ensure_default_model()?,
        };
        let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
        let tok = Tokenizer::for_model(&path)?;
        let root = self.corpus_root.unwrap_or_else(|| {
            std::env::var_os("CIPHERLORA_GENERAL_CORPUS")
                .map(PathBuf::from)
                .unwrap_or_else(|| fetch::cache_dir().join("corpora").join("ECE451-Parallel"))
        });
        let corpus = Corpus::load_general(&self.manifest, &root)?;
        let code = load_code_prompts(&self.code)?;
        let data = StudyData {
            corpus: &corpus,
            code: &code,
            description: format!(
                "train: {} Gutenberg files of non-held-out works ({}); held out: {} files of held-out works \
                 (split by work as tools/train_adapter) and {} code prompts ({})",
                corpus.train.len(),
                self.manifest.display(),
                corpus.heldout.len(),
                code.len(),
                self.code.display()
            ),
        };
        let mut cfg = StudyConfig {
            depths: self.depths,
            attackers,
            train_states: self.train_states,
            eval_tokens: self.eval_tokens,
            exact_tokens: self.exact_tokens,
            ciphertext_train_states: self.ciphertext_train_states,
            mlp_hidden: self.mlp_hidden,
            seed: self.seed,
            ..StudyConfig::default()
        };
        cfg.train.classes = self.classes;
        cfg.train.epochs = self.epochs;
        cfg.train.seed = self.seed;
        cfg.exact.budget = self.budget;
        cfg.exact.full_search = self.full_search;
        let report = run_study(&model, &tok, &data, &cfg, &mut |line| eprintln!("{line}"))?;
        if let Some(dir) = self.json.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&self.json, serde_json::to_string_pretty(&report)?)?;
        let md_path = self
            .markdown
            .unwrap_or_else(|| self.json.with_extension("md"));
        let md = report.markdown();
        std::fs::write(&md_path, &md)?;
        println!("{md}");
        eprintln!("wrote {} and {}", self.json.display(), md_path.display());
        Ok(())
    }
}
