//! Split generation with speculative verification: each step drafts, runs layers `[0, a)` locally,
//! the middle remotely (one round trip), then `[L − b, L)` and the head, keeping what the model
//! agrees with. Notes: docs/design/code-notes.md, "split: decode".

use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use cipherlora_model::{AttentionMask, KvCache, Model, Sampler, SamplingParams};
use cipherlora_speculative::acceptance::accept_greedy;
use cipherlora_speculative::target_probs::{chain_probs, tree_probs};
use cipherlora_speculative::tree::{TreeOutcome, accept_tree_greedy, accept_tree_sampled};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::accept;
use crate::{DraftMethod, MiddleLayers, MiddlePass, SplitError};

/// What a split generation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitConfig {
    /// Decoder layers run locally before the server's, a ≥ 1.
    pub head_layers: usize,
    /// Decoder layers run locally after the server's, b ≥ 1.
    pub tail_layers: usize,
    /// Drafted tokens per step, K.
    pub k: usize,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Tokens that end generation (not emitted).
    pub eos: Vec<u32>,
    /// How drafts are made.
    pub drafter: DraftMethod,
    /// Greedy ([`SamplingParams::greedy`]) or sampled.
    pub sampling: SamplingParams,
}

impl SplitConfig {
    /// KV positions a generation needs on each side: prompt, output and one step's drafts.
    pub fn capacity(&self, prompt_len: usize) -> usize {
        prompt_len + self.max_tokens + self.drafter.max_draft(self.k) + 1
    }
}

/// One step: one round trip to the middle layers.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitStep {
    /// Positions sent (pending tokens plus drafts; with lookahead, plus its lookahead branch).
    pub positions: usize,
    /// Tokens drafted (with lookahead: nodes of the verification trie).
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Tokens emitted (accepted drafts plus the bonus, cut at the limit or an end token).
    pub emitted: usize,
    /// Local compute: drafting, first and last layers, head, acceptance and rollback.
    pub local: Duration,
    /// Wall time of the middle-layer call (transport plus server compute).
    pub remote: Duration,
    /// Server compute time within `remote`.
    pub server: Duration,
    /// Request bytes.
    pub bytes_up: u64,
    /// Response bytes.
    pub bytes_down: u64,
    /// Wall time of the whole step.
    pub total: Duration,
}

/// A finished split generation.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitOutput {
    /// Generated tokens (end token excluded).
    pub tokens: Vec<u32>,
    /// Whether an end token stopped it.
    pub stopped_at_eos: bool,
    /// One entry per round trip; the first is the prefill.
    pub steps: Vec<SplitStep>,
    /// Wall time of the generation.
    pub elapsed: Duration,
}

impl SplitOutput {
    /// Tokens per second over the whole generation (prefill included).
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Mean tokens emitted per decode step (prefill step excluded).
    pub fn tokens_per_step(&self) -> f64 {
        let decode = &self.steps[self.steps.len().min(1)..];
        let n: usize = decode.iter().map(|s| s.emitted).sum();
        n as f64 / decode.len().max(1) as f64
    }

    /// Bytes both ways per generated token.
    pub fn bytes_per_token(&self) -> f64 {
        let b: u64 = self.steps.iter().map(|s| s.bytes_up + s.bytes_down).sum();
        b as f64 / self.tokens.len().max(1) as f64
    }
}

/// Generates up to `config.max_tokens` tokens after `prompt`, `middle` running `[a, L − b)` (a
/// fresh session of at least [`SplitConfig::capacity`]); `on_token` sees each accepted token.
/// Errors: [`SplitError::Config`], `Model` (bad sampling), `MiddleShape`; the middle's errors.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    config: &SplitConfig,
    middle: &mut dyn MiddleLayers,
    on_token: &mut dyn FnMut(u32),
) -> Result<SplitOutput, SplitError> {
    let c = model.config();
    let (n, d) = (c.num_layers, c.hidden_size);
    let (a, b) = (config.head_layers, config.tail_layers);
    if prompt.is_empty() {
        return Err(SplitError::Config {
            reason: "empty prompt".into(),
        });
    }
    if a == 0 || b == 0 || a + b >= n {
        return Err(SplitError::Config {
            reason: format!("split ({a}, {b}) must keep a, b ≥ 1 and a + b < {n}"),
        });
    }
    if let DraftMethod::Lookahead(l) = &config.drafter {
        l.validate()
            .map_err(|reason| SplitError::Config { reason })?;
    }
    let sampler = Sampler::new(config.sampling.clone())?;
    // Greedy without a penalty: the argmax rows alone decide.
    let argmax_only = sampler.is_greedy() && config.sampling.repetition_penalty == 1.0;
    let mut rng = ChaCha20Rng::seed_from_u64(config.sampling.seed);
    let capacity = config.capacity(prompt.len());
    let mut head = KvCache::for_layers(c, capacity, 0..a)?;
    let mut tail = KvCache::for_layers(c, capacity, n - b..n)?;
    let mut drafter = config.drafter.start();
    let mut context = prompt.to_vec();
    let mut pending = prompt.to_vec();
    // What the server keeps of the last pass, sent with the next one.
    let mut compaction = (0usize, Vec::<usize>::new());
    let mut out = SplitOutput {
        tokens: Vec::new(),
        stopped_at_eos: false,
        steps: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let t_start = Instant::now();
    while out.tokens.len() < config.max_tokens {
        let t0 = Instant::now();
        let _span = tracing::debug_span!("split_step", step = out.steps.len()).entered();
        let room = config.max_tokens - out.tokens.len();
        let batch = drafter.batch(&context, config.k, room - 1);
        let q = pending.len();
        let mut input = pending.clone();
        input.extend_from_slice(&batch.tree.tokens);
        let t = input.len();
        // Pending rows form a chain; the nodes hang off the last one.
        let parents: Vec<Option<usize>> = (0..q)
            .map(|i| i.checked_sub(1))
            .chain(
                batch
                    .tree
                    .parents
                    .iter()
                    .map(|p| Some(p.map_or(q - 1, |p| q + p))),
            )
            .collect();
        let chain = parents
            .iter()
            .enumerate()
            .all(|(i, &p)| p == i.checked_sub(1));
        let mask = if chain {
            AttentionMask::Causal
        } else {
            AttentionMask::tree(parents.clone())
        };
        let start = head.len();
        let x = model.hidden_states(&input, &mut head, &mask, a)?;
        let x = x.flatten_all()?.to_vec1::<f32>()?;
        let (keep_start, keep) = shortest_compaction(&compaction);
        let local_before = t0.elapsed();
        let t_remote = Instant::now();
        let fwd = middle.forward_pass(&MiddlePass {
            start: keep_start,
            keep: &keep,
            parents: if chain { &[] } else { &parents },
            positions: t,
            hidden: &x,
        })?;
        let remote = t_remote.elapsed();
        if fwd.hidden.len() != t * d {
            return Err(SplitError::MiddleShape {
                got: fwd.hidden.len(),
                expected: t * d,
            });
        }
        let t_after = Instant::now();
        let y = Tensor::from_vec(fwd.hidden, (t, d), &Device::Cpu)?;
        let z = model.forward_layers(&y, n - b..n, &mut tail, &mask)?;
        // Rows from the last pending token on predict the drafts and the bonus.
        let first = q - 1;
        let accepted_tokens;
        let accepted;
        if drafter.is_tree() {
            let verify = batch.verify_tree();
            let rows: Vec<u32> = (0..=batch.verify)
                .chain(batch.level_rows.iter().copied())
                .map(|r| u32::try_from(first + r).unwrap_or(u32::MAX))
                .collect();
            let idx = Tensor::new(rows.as_slice(), &Device::Cpu)?;
            let logits = model.head(&z.index_select(&idx, 0)?)?;
            let argmax = Model::argmax_rows(&logits)?;
            let TreeOutcome { path, tokens } = if argmax_only {
                accept_tree_greedy(&verify, &argmax[..=batch.verify], usize::MAX)?
            } else {
                let rows = logits.narrow(0, 0, batch.verify + 1)?.to_vec2::<f32>()?;
                let probs = tree_probs(&sampler, &rows, &context, &verify);
                accept_tree_sampled(&verify, &probs, &mut rng)?
            };
            // Keep the pending rows and the accepted path.
            let kept: Vec<usize> = (0..q).chain(path.iter().map(|&node| q + node)).collect();
            head.compact(start, &kept)?;
            tail.compact(start, &kept)?;
            compaction = (start, kept);
            let mut after = context.clone();
            after.extend_from_slice(&tokens);
            drafter.observe(&argmax[batch.verify + 1..], path.len(), &after);
            accepted = path.len();
            accepted_tokens = tokens;
        } else {
            let drafts = &batch.tree.tokens;
            let logits = model.head(&z.narrow(0, first, t - first)?)?;
            let argmax = Model::argmax_rows(&logits)?;
            let outcome = if argmax_only {
                accept_greedy(drafts, &argmax)?
            } else {
                let rows = logits.to_vec2::<f32>()?;
                let probs = chain_probs(&sampler, &rows, &context, drafts);
                accept::exact(drafts, &probs, &mut rng)?
            };
            let keep = start + q + outcome.accepted;
            head.truncate(keep);
            tail.truncate(keep);
            compaction = (keep, Vec::new());
            accepted = outcome.accepted;
            accepted_tokens = outcome.tokens;
        }
        let mut emitted = 0;
        for &tok in &accepted_tokens {
            if config.eos.contains(&tok) {
                out.stopped_at_eos = true;
                break;
            }
            out.tokens.push(tok);
            context.push(tok);
            on_token(tok);
            emitted += 1;
            if out.tokens.len() == config.max_tokens {
                break;
            }
        }
        pending = accepted_tokens[accepted_tokens.len() - 1..].to_vec();
        let local = local_before + t_after.elapsed();
        out.steps.push(SplitStep {
            positions: t,
            drafted: batch.verify,
            accepted,
            emitted,
            local,
            remote,
            server: fwd.server,
            bytes_up: fwd.bytes_up,
            bytes_down: fwd.bytes_down,
            total: t0.elapsed(),
        });
        if out.stopped_at_eos {
            break;
        }
    }
    out.elapsed = t_start.elapsed();
    Ok(out)
}

/// `(start, keep)` with its leading in-place run (`keep[i] == i`) folded into `start`.
fn shortest_compaction((start, keep): &(usize, Vec<usize>)) -> (usize, Vec<usize>) {
    let same = keep
        .iter()
        .enumerate()
        .take_while(|&(i, &k)| i == k)
        .count();
    (
        start + same,
        keep[same..].iter().map(|k| k - same).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_stay_in_place_fold_into_start() {
        assert_eq!(
            shortest_compaction(&(10, vec![0, 1, 2, 5, 7])),
            (13, vec![2, 4])
        );
        assert_eq!(shortest_compaction(&(4, vec![0, 1])), (6, vec![]));
        assert_eq!(shortest_compaction(&(4, vec![1, 2])), (4, vec![1, 2]));
        assert_eq!(shortest_compaction(&(4, vec![])), (4, vec![]));
    }
}
