//! The study's report: JSON (serde) and a Markdown table, depth × attacker → held-out token
//! recovery rate.

use serde::{Deserialize, Serialize};

/// One attacker at one depth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttackRow {
    /// Decoder layers the client ran before the split.
    pub depth: usize,
    /// `linear`, `mlp`, `exact`, `ciphertext-linear`, `ciphertext-mlp`.
    pub attacker: String,
    /// Held-out positions evaluated.
    pub eval_tokens: usize,
    /// Fraction of them whose token was recovered (top-1).
    pub recovery: f64,
    /// Training states (learned attackers; 0 for exact).
    pub train_states: usize,
    /// Trainable parameters (learned attackers).
    pub parameters: usize,
    /// Output classes (learned attackers).
    pub classes: usize,
    /// Fraction of training positions whose token is a class.
    pub class_coverage: f64,
    /// Exact attack: mean candidates whose state was computed per position.
    pub candidates_per_token: Option<f64>,
    /// Exact attack: positions where a candidate matched within tolerance.
    pub matched: Option<usize>,
    /// Exact attack: smallest relative distance of a rejected candidate.
    pub closest_wrong: Option<f64>,
    /// Exact attack: largest relative distance of an accepted candidate.
    pub farthest_match: Option<f64>,
    /// Wall-clock seconds (training plus evaluation).
    pub seconds: f64,
}

/// A published figure to compare with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaperFigure {
    /// Split depth.
    pub depth: usize,
    /// Token recovery rate reported.
    pub recovery: f64,
    /// What it is.
    pub source: String,
}

/// The whole study.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttackReport {
    /// Model file.
    pub model: String,
    /// Decoder layers, hidden size, vocabulary.
    pub model_shape: (usize, usize, usize),
    /// Seed of sampling, training and encryption.
    pub seed: u64,
    /// Window length (tokens).
    pub window: usize,
    /// Where training and evaluation text came from.
    pub data: String,
    /// Most frequent training token and the held-out rate of always answering it (the frequency
    /// baseline; chance for an attacker that learns nothing from its input).
    pub baseline_token: u32,
    /// Its decoded text.
    pub baseline_text: String,
    /// Frequency-baseline recovery on the learned attackers' evaluation set.
    pub baseline: f64,
    /// Settings (training, exact search), as JSON.
    pub settings: serde_json::Value,
    /// Results.
    pub rows: Vec<AttackRow>,
    /// Published figures.
    pub paper: Vec<PaperFigure>,
    /// Whether every requested cell was measured.
    pub complete: bool,
}

impl AttackReport {
    /// Attackers in the order they first appear.
    fn attackers(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        for r in &self.rows {
            if !a.contains(&r.attacker) {
                a.push(r.attacker.clone());
            }
        }
        a
    }

    /// The Markdown table (depth rows, attacker columns, the paper's MLP figure and the baseline
    /// alongside) and a details list.
    pub fn markdown(&self) -> String {
        let attackers = self.attackers();
        let mut depths: Vec<usize> = self.rows.iter().map(|r| r.depth).collect();
        depths.sort_unstable();
        depths.dedup();
        let mut s = String::new();
        s.push_str(&format!(
            "Model {} ({} layers, hidden {}, vocab {}), seed {}, windows of {} tokens; {}.\n\n",
            self.model,
            self.model_shape.0,
            self.model_shape.1,
            self.model_shape.2,
            self.seed,
            self.window,
            self.data
        ));
        if !self.complete {
            s.push_str("**Partial: not every requested cell was measured.**\n\n");
        }
        s.push_str("| depth a |");
        for a in &attackers {
            s.push_str(&format!(" {a} |"));
        }
        s.push_str(" frequency baseline | paper (MLP, Mistral-7B) |\n|---|");
        for _ in &attackers {
            s.push_str("---|");
        }
        s.push_str("---|---|\n");
        for d in depths {
            s.push_str(&format!("| {d} |"));
            for a in &attackers {
                match self.rows.iter().find(|r| r.depth == d && &r.attacker == a) {
                    Some(r) => s.push_str(&format!(" {:.1} % |", 100.0 * r.recovery)),
                    None => s.push_str(" — |"),
                }
            }
            s.push_str(&format!(" {:.1} % |", 100.0 * self.baseline));
            match self.paper.iter().find(|p| p.depth == d) {
                Some(p) => s.push_str(&format!(" {:.0} % |\n", 100.0 * p.recovery)),
                None => s.push_str(" — |\n"),
            }
        }
        s.push_str(&format!(
            "\nFrequency baseline: always answering token {} ({:?}), the most frequent training token.\n\n",
            self.baseline_token, self.baseline_text
        ));
        s.push_str("| depth | attacker | eval tokens | recovery | train states | params | classes (coverage) | cand./token | matched | closest wrong | s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("—".into(), f);
            s.push_str(&format!(
                "| {} | {} | {} | {:.2} % | {} | {} | {} | {} | {} | {} | {:.0} |\n",
                r.depth,
                r.attacker,
                r.eval_tokens,
                100.0 * r.recovery,
                r.train_states,
                r.parameters,
                if r.classes > 0 {
                    format!("{} ({:.1} %)", r.classes, 100.0 * r.class_coverage)
                } else {
                    "—".into()
                },
                opt(r.candidates_per_token, &|v| format!("{v:.1}")),
                r.matched.map_or("—".into(), |m| m.to_string()),
                opt(r.closest_wrong, &|v| format!("{v:.3}")),
                r.seconds
            ));
        }
        s
    }
}
