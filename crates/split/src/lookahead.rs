//! Lookahead decoding (Fu et al., ICML 2024, §3) for split generation: a
//! Jacobi window of guesses and a pool of the n-grams it produced, verified
//! as one token tree beside a prompt-lookup chain. Notes:
//! docs/design/code-notes.md, "split: draft".

use std::collections::{HashMap, VecDeque};

use cipherlora_speculative::ContextDrafter;
use cipherlora_speculative::ngram::PromptLookup;
use cipherlora_speculative::tree::DraftTree;

use crate::batch::Batch;

/// Parameters of lookahead decoding (Fu et al. 2024, §3; their W, N, G).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookahead {
    /// Window W ≥ 1: columns of the lookahead branch (n-grams gathered per step).
    pub window: usize,
    /// N-gram size N ≥ 2: the branch holds N − 1 levels; a pool n-gram drafts N − 1 tokens.
    pub n: usize,
    /// G: pool n-grams kept per first token (0: pool unused).
    pub max_ngrams: usize,
    /// The prompt-lookup chain (K tokens) verified beside the pool's n-grams.
    pub fallback: PromptLookup,
}

impl Default for Lookahead {
    /// W = 3, N = 3, G = 3, prompt lookup of n-grams 3 down to 1.
    fn default() -> Self {
        Self {
            window: 3,
            n: 3,
            max_ngrams: 3,
            fallback: PromptLookup::default(),
        }
    }
}

impl Lookahead {
    /// Nodes of the lookahead branch: W − 1 on level 0, W on each of the N − 2 others.
    #[must_use]
    pub fn branch_nodes(&self) -> usize {
        self.window.saturating_sub(1) + self.n.saturating_sub(2) * self.window
    }

    /// Most verification nodes with prompt-lookup chains of `k`: G·(N − 1) + K.
    #[must_use]
    pub fn max_verify_nodes(&self, k: usize) -> usize {
        self.max_ngrams * self.n.saturating_sub(1) + k
    }

    /// Checks W ≥ 1 and N ≥ 2. Errors: a description of the first bad parameter.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 {
            return Err("lookahead window W must be at least 1".into());
        }
        if self.n < 2 {
            return Err(format!(
                "lookahead n-gram size N = {} must be at least 2",
                self.n
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Lookahead {
    /// `W,N,G` (the form [`Lookahead::from_str`] reads).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{},{}", self.window, self.n, self.max_ngrams)
    }
}

impl std::str::FromStr for Lookahead {
    type Err = String;

    /// `W,N,G` (window, n-gram size, pool n-grams per token), checked by [`Lookahead::validate`].
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [w, n, g] = parts.as_slice() else {
            return Err(format!("expected W,N,G (e.g. 5,4,5), got {s:?}"));
        };
        let p = |v: &str| v.parse::<usize>().map_err(|e| format!("{v:?}: {e}"));
        let l = Self {
            window: p(w)?,
            n: p(n)?,
            max_ngrams: p(g)?,
            fallback: PromptLookup::default(),
        };
        l.validate()?;
        Ok(l)
    }
}

/// Lookahead decoding's state (Fu et al. 2024, §3): the Jacobi window and n-gram pool.
pub(crate) struct Window {
    params: Lookahead,
    /// N − 1 levels of W guesses; `levels[j][i]` guesses depth i + j after I.
    levels: Vec<Vec<u32>>,
    /// First token → continuations of N − 1 tokens, newest last, at most G.
    pool: HashMap<u32, VecDeque<Vec<u32>>>,
    /// State of the generator that draws context tokens for the window.
    fill: u64,
}

impl Window {
    pub(crate) fn new(params: Lookahead) -> Self {
        Self {
            params,
            levels: Vec::new(),
            pool: HashMap::new(),
            fill: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// A context token chosen by a fixed generator (a 64-bit LCG).
    fn fill_token(&mut self, context: &[u32]) -> u32 {
        self.fill = self
            .fill
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let i = (self.fill >> 33) as usize % context.len().max(1);
        context.get(i).copied().unwrap_or(0)
    }

    /// Node index of level-0 column i ≥ 1, after `verify` nodes.
    fn l0(verify: usize, i: usize) -> usize {
        verify + i - 1
    }

    /// Node index of (j ≥ 1, i), after `verify` nodes.
    fn node(&self, verify: usize, j: usize, i: usize) -> usize {
        verify + (self.params.window - 1) + (j - 1) * self.params.window + i
    }

    /// The next pass's nodes after `context` (last token pending), at most `room` accepted.
    pub(crate) fn batch(&mut self, context: &[u32], k: usize, room: usize) -> Batch {
        let Some(&current) = context.last() else {
            return Batch {
                tree: DraftTree::chain(&[]),
                verify: 0,
                level_rows: Vec::new(),
            };
        };
        let (w, n) = (self.params.window, self.params.n);
        if self.levels.is_empty() {
            let mut levels = vec![vec![0; w]; n - 1];
            for t in levels.iter_mut().flatten() {
                *t = self.fill_token(context);
            }
            self.levels = levels;
        }
        self.levels[0][0] = current;
        // Verification branch (§3.2): the prompt-lookup chain, then the pool's n-grams for I, as a
        // trie.
        let mut tree = DraftTree::chain(&[]);
        let mut candidates = vec![self.params.fallback.draft(context, k)];
        if let Some(grams) = self.pool.get(&current) {
            candidates.extend(grams.iter().rev().cloned());
        }
        for cand in &candidates {
            let mut at: Option<usize> = None;
            for &tok in cand.iter().take(room) {
                let child =
                    (0..tree.len()).find(|&c| tree.parents[c] == at && tree.tokens[c] == tok);
                at = Some(child.unwrap_or_else(|| {
                    tree.tokens.push(tok);
                    tree.parents.push(at);
                    tree.len() - 1
                }));
            }
        }
        let verify = tree.len();
        if room == 0 {
            // The last token: no draft can be kept, nothing to look ahead for.
            return Batch {
                tree,
                verify,
                level_rows: Vec::new(),
            };
        }
        // Lookahead branch (§3.1): level 0 a chain off I, (j, i) off (j − 1, i).
        for i in 1..w {
            tree.tokens.push(self.levels[0][i]);
            tree.parents.push((i > 1).then(|| Self::l0(verify, i - 1)));
        }
        for j in 1..n - 1 {
            for i in 0..w {
                let parent = match (j, i) {
                    (1, 0) => None,
                    (1, i) => Some(Self::l0(verify, i)),
                    (j, i) => Some(self.node(verify, j - 1, i)),
                };
                tree.tokens.push(self.levels[j][i]);
                tree.parents.push(parent);
            }
        }
        let level_rows = (0..w)
            .map(|i| match (n - 2, i) {
                (0, 0) => 0,
                (0, i) => Self::l0(verify, i) + 1,
                (j, i) => self.node(verify, j, i) + 1,
            })
            .collect();
        Batch {
            tree,
            verify,
            level_rows,
        }
    }

    /// Learns from a pass: the next level, drafts `accepted`, and the new `context`.
    pub(crate) fn observe(&mut self, new_level: &[u32], accepted: usize, context: &[u32]) {
        let (w, g) = (self.params.window, self.params.max_ngrams);
        if new_level.len() != w || self.levels.is_empty() {
            return;
        }
        // Each column's n-gram of consecutive positions (§3.1), pooled under its first token.
        if g > 0 {
            for f in 0..w {
                let key = self.levels[0][f];
                let gram: Vec<u32> = self.levels[1..]
                    .iter()
                    .map(|level| level[f])
                    .chain(std::iter::once(new_level[f]))
                    .collect();
                let grams = self.pool.entry(key).or_default();
                grams.retain(|x| *x != gram);
                grams.push_back(gram);
                while grams.len() > g {
                    grams.pop_front();
                }
            }
        }
        // One Jacobi step: every level moves up, the iterate is the last.
        self.levels.remove(0);
        self.levels.push(new_level.to_vec());
        // The window moves `accepted` columns with I, so each guess keeps its position.
        let shift = accepted.min(w);
        if shift > 0 {
            let fills: Vec<u32> = (0..self.levels.len() * shift)
                .map(|_| self.fill_token(context))
                .collect();
            for (level, fill) in self.levels.iter_mut().zip(fills.chunks(shift)) {
                level.drain(..shift);
                level.extend_from_slice(fill);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Depth of every node below I (children of I: 1).
    fn depths(tree: &DraftTree) -> Vec<usize> {
        let mut d = Vec::new();
        for p in &tree.parents {
            let v = p.map_or(1, |p: usize| d[p] + 1);
            d.push(v);
        }
        d
    }

    fn window(w: usize, n: usize, g: usize) -> Window {
        Window::new(Lookahead {
            window: w,
            n,
            max_ngrams: g,
            fallback: PromptLookup::default(),
        })
    }

    #[test]
    fn the_batch_is_a_trie_of_candidates_then_the_lookahead_window() {
        // W = 3, N = 3, G = 2.
        let mut w = window(3, 3, 2);
        w.levels = vec![vec![0, 11, 12], vec![20, 21, 22]];
        w.pool.insert(7, VecDeque::from([vec![8, 9], vec![8, 5]]));
        // Prompt lookup's 8, 9 merges with the pool's 8, 9 (duplicate) and 8, 5 (shared prefix).
        let context = [7, 8, 9, 4, 7];
        let b = w.batch(&context, 2, 9);
        assert_eq!(b.verify, 3);
        assert_eq!(b.tree.tokens, vec![8, 9, 5, 11, 12, 20, 21, 22]);
        assert_eq!(
            b.tree.parents,
            vec![
                None,
                Some(0),
                Some(0),
                None,
                Some(3),
                None,
                Some(3),
                Some(4)
            ]
        );
        // (j, i) sits at depth i + j after I; the verification nodes at their n-gram offset.
        assert_eq!(depths(&b.tree), vec![1, 2, 2, 1, 2, 1, 2, 3]);
        // The new level comes from level N − 2 = 1's rows (node + 1).
        assert_eq!(b.level_rows, vec![6, 7, 8]);
        assert_eq!(w.levels[0][0], 7, "l0[0] is I");
        assert_eq!(b.verify_tree().tokens, vec![8, 9, 5]);

        // N = 2: the branch is level 0 alone; candidates are cut at the room left.
        let mut w2 = window(3, 2, 2);
        w2.levels = vec![vec![0, 11, 12]];
        let b = w2.batch(&context, 4, 1);
        assert_eq!(b.tree.tokens, vec![8, 11, 12]);
        assert_eq!(b.tree.parents, vec![None, None, Some(1)]);
        assert_eq!(b.level_rows, vec![0, 2, 3]);
        // No room: no lookahead branch.
        let b = w2.batch(&context, 4, 0);
        assert!(b.tree.is_empty() && b.level_rows.is_empty());

        // W = 4, N = 4, no pool hit or prompt match: the branch alone, depths i + j.
        let mut w3 = window(4, 4, 5);
        let b = w3.batch(&[1, 2, 3], 4, 9);
        assert_eq!((b.verify, b.tree.len()), (0, 11));
        assert_eq!(depths(&b.tree), vec![1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5]);
        assert_eq!(b.level_rows, vec![8, 9, 10, 11]);
        // The window was filled from the context, deterministically.
        assert!(w3.levels.iter().flatten().all(|t| [1, 2, 3].contains(t)));
        let mut again = window(4, 4, 5);
        assert_eq!(again.batch(&[1, 2, 3], 4, 9), b);
        let l = Lookahead {
            window: 4,
            n: 4,
            max_ngrams: 5,
            fallback: PromptLookup::default(),
        };
        assert_eq!(l.branch_nodes(), 11);
        assert_eq!(l.max_verify_nodes(4), 15 + 4);
    }

    #[test]
    fn columns_feed_the_pool_and_the_window_moves_with_accepted_drafts() {
        let mut w = window(3, 3, 2);
        w.levels = vec![vec![0, 11, 12], vec![20, 21, 22]];
        w.pool.insert(7, VecDeque::from([vec![8, 9], vec![8, 5]]));
        let context = [7, 8, 9, 4, 7];
        w.batch(&context, 2, 9);
        // Column f gives (l0[f], l1[f], new[f]); G = 2 keeps the newest.
        w.observe(&[30, 31, 32], 0, &context);
        assert_eq!(w.pool[&7], VecDeque::from([vec![8, 5], vec![20, 30]]));
        assert_eq!(w.pool[&11], VecDeque::from([vec![21, 31]]));
        assert_eq!(w.pool[&12], VecDeque::from([vec![22, 32]]));
        // A Jacobi step: levels move up, the iterate is the last level.
        assert_eq!(w.levels, vec![vec![20, 21, 22], vec![30, 31, 32]]);
        // A duplicate n-gram becomes the newest instead of a second copy.
        let mut d = window(1, 2, 3);
        for t in [8, 9, 8] {
            d.levels = vec![vec![7]];
            d.observe(&[t], 0, &context);
        }
        assert_eq!(d.pool[&7], VecDeque::from([vec![9], vec![8]]));
        // Two drafts accepted: the window shifts; vacated columns come from the context.
        w.levels = vec![vec![1, 2, 3], vec![4, 5, 6]];
        w.observe(&[60, 61, 62], 2, &context);
        assert_eq!((w.levels[0][0], w.levels[1][0]), (6, 62));
        assert!(
            w.levels
                .iter()
                .all(|l| l.len() == 3 && l[1..].iter().all(|t| context.contains(t)))
        );
        assert_eq!(w.pool[&3], VecDeque::from([vec![6, 62]]));
        // More accepted than the window: all columns refilled.
        w.observe(&[70, 71, 72], 5, &context);
        assert!(w.levels.iter().flatten().all(|t| context.contains(t)));
        // G = 0: nothing pooled.
        let mut none = window(2, 3, 0);
        none.batch(&context, 1, 9);
        none.observe(&[1, 2], 0, &context);
        assert!(none.pool.is_empty());
    }
}
