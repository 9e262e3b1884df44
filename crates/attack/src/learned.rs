//! Learned inverters (arXiv 2602.16760): linear or one-hidden-layer MLP classifiers from a hidden
//! state to its token, over the `classes` most frequent training tokens, trained with AdamW
//! (Loshchilov & Hutter, ICLR 2019) from a seed.

use std::collections::HashMap;

use candle_core::{D, Device, Tensor, Var};
use candle_nn::{AdamW, Module, Optimizer, ParamsAdamW};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{AttackError, Result};

/// Feature rows and the token each should be mapped to.
#[derive(Debug, Clone)]
pub struct Features {
    /// Features per row.
    pub dim: usize,
    /// Row-major (rows, dim).
    pub x: Vec<f32>,
    /// The token id of each row.
    pub labels: Vec<u32>,
}

impl Features {
    /// Rows from row-major `x` and their labels. Errors: [`AttackError::Input`] for bad sizes.
    pub fn new(dim: usize, x: Vec<f32>, labels: Vec<u32>) -> Result<Self> {
        if dim == 0 || x.len() != dim * labels.len() {
            return Err(AttackError::Input(format!(
                "{} features for {} labels of dimension {dim}",
                x.len(),
                labels.len()
            )));
        }
        Ok(Features { dim, x, labels })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Inverter architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InverterKind {
    /// Softmax regression.
    Linear,
    /// One hidden layer of `hidden` GELU units.
    Mlp {
        /// Hidden width.
        hidden: usize,
    },
}

/// Training sizes and optimiser settings.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Output classes: the most frequent training tokens.
    pub classes: usize,
    /// Passes over the training rows.
    pub epochs: usize,
    /// Rows per AdamW step.
    pub batch: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            classes: 4096,
            epochs: 3,
            batch: 256,
            lr: 2e-3,
            weight_decay: 1e-4,
            seed: 0,
        }
    }
}

/// A trained inverter.
#[derive(Debug)]
pub struct Inverter {
    kind: InverterKind,
    dim: usize,
    mean: Tensor,
    inv_std: Tensor,
    layers: Vec<candle_nn::Linear>,
    /// Class index → token id.
    class_tokens: Vec<u32>,
    coverage: f64,
}

fn init_linear<R: Rng + ?Sized>(rng: &mut R, fan_in: usize, fan_out: usize) -> Result<(Var, Var)> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let w: Vec<f32> = (0..fan_in * fan_out)
        .map(|_| rng.random_range(-bound..bound))
        .collect();
    let b: Vec<f32> = (0..fan_out)
        .map(|_| rng.random_range(-bound..bound))
        .collect();
    let dev = Device::Cpu;
    Ok((
        Var::from_tensor(&Tensor::from_vec(w, (fan_out, fan_in), &dev)?)?,
        Var::from_tensor(&Tensor::from_vec(b, fan_out, &dev)?)?,
    ))
}

impl Inverter {
    /// Trains an inverter of `kind` on `train`. Errors: [`AttackError::Input`]; candle errors.
    pub fn train(kind: InverterKind, train: &Features, cfg: &TrainConfig) -> Result<Self> {
        if train.is_empty() || cfg.classes == 0 || cfg.batch == 0 || cfg.epochs == 0 {
            return Err(AttackError::Input(
                "empty training set, or zero classes, batch or epochs".into(),
            ));
        }
        if kind == (InverterKind::Mlp { hidden: 0 }) {
            return Err(AttackError::Input("MLP of width 0".into()));
        }
        let dim = train.dim;
        let dev = Device::Cpu;
        // Classes: most frequent tokens, ties broken by id.
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for &t in &train.labels {
            *counts.entry(t).or_default() += 1;
        }
        let mut by_freq: Vec<(u32, usize)> = counts.into_iter().collect();
        by_freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        by_freq.truncate(cfg.classes);
        let class_tokens: Vec<u32> = by_freq.iter().map(|&(t, _)| t).collect();
        let class_of: HashMap<u32, u32> = class_tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, i as u32))
            .collect();
        let covered: usize = by_freq.iter().map(|&(_, c)| c).sum();
        let coverage = covered as f64 / train.len() as f64;

        // Standardisation statistics (f64 accumulation).
        let n = train.len();
        let mut mean = vec![0f64; dim];
        let mut sq = vec![0f64; dim];
        for row in train.x.chunks_exact(dim) {
            for ((m, s), &v) in mean.iter_mut().zip(sq.iter_mut()).zip(row) {
                *m += v as f64;
                *s += (v as f64) * (v as f64);
            }
        }
        let mean_f: Vec<f32> = mean.iter().map(|m| (m / n as f64) as f32).collect();
        let inv_std_f: Vec<f32> = mean
            .iter()
            .zip(&sq)
            .map(|(m, s)| {
                let mu = m / n as f64;
                let var = (s / n as f64 - mu * mu).max(0.0);
                (1.0 / (var.sqrt() + 1e-6)) as f32
            })
            .collect();
        let mean_t = Tensor::from_vec(mean_f, (1, dim), &dev)?;
        let inv_std_t = Tensor::from_vec(inv_std_f, (1, dim), &dev)?;

        // Rows whose token is a class.
        let rows: Vec<usize> = (0..n)
            .filter(|&i| class_of.contains_key(&train.labels[i]))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let classes = class_tokens.len();
        let shapes: Vec<(usize, usize)> = match kind {
            InverterKind::Linear => vec![(dim, classes)],
            InverterKind::Mlp { hidden } => vec![(dim, hidden), (hidden, classes)],
        };
        let mut vars = Vec::new();
        let mut layers = Vec::new();
        for (fi, fo) in shapes {
            let (w, b) = init_linear(&mut rng, fi, fo)?;
            layers.push(candle_nn::Linear::new(
                w.as_tensor().clone(),
                Some(b.as_tensor().clone()),
            ));
            vars.push(w);
            vars.push(b);
        }
        let inv = Inverter {
            kind,
            dim,
            mean: mean_t,
            inv_std: inv_std_t,
            layers,
            class_tokens,
            coverage,
        };
        let mut opt = AdamW::new(
            vars,
            ParamsAdamW {
                lr: cfg.lr,
                weight_decay: cfg.weight_decay,
                ..Default::default()
            },
        )?;
        let mut order = rows;
        let total_steps = cfg.epochs * order.len().div_ceil(cfg.batch);
        let mut step = 0usize;
        for _ in 0..cfg.epochs {
            // Fisher–Yates with the seeded generator.
            for i in (1..order.len()).rev() {
                let j = rng.random_range(0..=i);
                order.swap(i, j);
            }
            for chunk in order.chunks(cfg.batch) {
                let mut xb = Vec::with_capacity(chunk.len() * dim);
                let mut yb = Vec::with_capacity(chunk.len());
                for &r in chunk {
                    xb.extend_from_slice(&train.x[r * dim..(r + 1) * dim]);
                    yb.push(class_of[&train.labels[r]]);
                }
                let x = Tensor::from_vec(xb, (chunk.len(), dim), &dev)?;
                let y = Tensor::from_vec(yb, chunk.len(), &dev)?;
                // Linear decay of the learning rate to 10 % over training.
                let frac = step as f64 / total_steps.max(1) as f64;
                opt.set_learning_rate(cfg.lr * (1.0 - 0.9 * frac));
                let logits = inv.class_logits(&x)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
                opt.backward_step(&loss)?;
                step += 1;
            }
        }
        // The layers hold the Vars' tensors, which AdamW updated in place.
        Ok(inv)
    }

    /// Logits over the classes for raw rows `x` (rows, dim).
    fn class_logits(&self, x: &Tensor) -> Result<Tensor> {
        let z = x.broadcast_sub(&self.mean)?.broadcast_mul(&self.inv_std)?;
        let out = match self.kind {
            InverterKind::Linear => self.layers[0].forward(&z)?,
            InverterKind::Mlp { .. } => {
                let h = self.layers[0].forward(&z)?.gelu_erf()?;
                self.layers[1].forward(&h)?
            }
        };
        Ok(out)
    }

    /// The architecture.
    pub fn kind(&self) -> InverterKind {
        self.kind
    }

    /// Number of output classes.
    pub fn classes(&self) -> usize {
        self.class_tokens.len()
    }

    /// Fraction of training positions whose token is one of the classes.
    pub fn coverage(&self) -> f64 {
        self.coverage
    }

    /// Trainable parameters.
    pub fn parameters(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.weight().elem_count() + l.bias().map_or(0, |b| b.elem_count()))
            .sum()
    }

    fn check(&self, x: &[f32]) -> Result<usize> {
        if x.is_empty() || !x.len().is_multiple_of(self.dim) {
            return Err(AttackError::Input(format!(
                "{} features is not a positive multiple of dimension {}",
                x.len(),
                self.dim
            )));
        }
        Ok(x.len() / self.dim)
    }

    /// The most likely token per row of `x` (rows, dim). Errors: [`AttackError::Input`].
    pub fn predict(&self, x: &[f32]) -> Result<Vec<u32>> {
        let rows = self.check(x)?;
        let mut out = Vec::with_capacity(rows);
        for chunk in x.chunks(1024 * self.dim) {
            let t = Tensor::from_slice(chunk, (chunk.len() / self.dim, self.dim), &Device::Cpu)?;
            let idx = self.class_logits(&t)?.argmax(D::Minus1)?.to_vec1::<u32>()?;
            out.extend(idx.iter().map(|&i| self.class_tokens[i as usize]));
        }
        Ok(out)
    }

    /// The `k` most likely tokens for one row `x` (dim). Errors: [`AttackError::Input`].
    pub fn rank(&self, x: &[f32], k: usize) -> Result<Vec<u32>> {
        if x.len() != self.dim {
            return Err(AttackError::Input(format!(
                "{} features, expected {}",
                x.len(),
                self.dim
            )));
        }
        let t = Tensor::from_slice(x, (1, self.dim), &Device::Cpu)?;
        let logits = self.class_logits(&t)?.squeeze(0)?.to_vec1::<f32>()?;
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        Ok(idx
            .into_iter()
            .take(k)
            .map(|i| self.class_tokens[i])
            .collect())
    }
}

/// Fraction of positions where `predicted` equals `truth`. Errors: [`AttackError::Input`].
pub fn recovery_rate(predicted: &[u32], truth: &[u32]) -> Result<f64> {
    if predicted.len() != truth.len() || truth.is_empty() {
        return Err(AttackError::Input(format!(
            "{} predictions for {} tokens",
            predicted.len(),
            truth.len()
        )));
    }
    let hits = predicted.iter().zip(truth).filter(|(p, t)| p == t).count();
    Ok(hits as f64 / truth.len() as f64)
}

/// Recovery on `eval` of always answering `train`'s most frequent token. Errors: empty input.
pub fn frequency_baseline(train: &[u32], eval: &[u32]) -> Result<(u32, f64)> {
    if train.is_empty() || eval.is_empty() {
        return Err(AttackError::Input("empty token list".into()));
    }
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for &t in train {
        *counts.entry(t).or_default() += 1;
    }
    let (&top, _) = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .expect("non-empty");
    let hits = eval.iter().filter(|&&t| t == top).count();
    Ok((top, hits as f64 / eval.len() as f64))
}
