//! Speculative sampling must follow the target distribution exactly.
//!
//! Target and drafter are two different Markov chains over a small vocabulary. Two tokens are
//! generated from a fixed context by repeated speculative rounds (K = 3); over 20,000 seeded draws
//! the empirical joint distribution of the two tokens must pass a χ² goodness-of-fit test against
//! the target chain, and two deliberately wrong acceptance rules (resampling from p instead of
//! norm(max(0, p − q)); accepting every draft) must fail it. The same holds for tree drafts:
//! multi-draft speculative sampling over a tree of the drafter's top tokens passes, and a rule that
//! forgets to renormalise after a rejected sibling fails; so does a tree whose first children are
//! drawn from the drafter (recursive rejection sampling with a sampled proposal), and treating
//! those drawn children as chosen ones fails. Certified draws (`cipherlora_speculative::draw_bounds`: each
//! round decided from logits known only to within a bound that shrinks trip by trip, undecided
//! rounds running more trips with the same uniforms) pass; shortening an undecided round to a fresh
//! draw of its first token fails. Seeds are fixed, so the test is deterministic.

use cipherlora_speculative::acceptance::{
    DraftProbs, RoundOutcome, RowUniforms, accept_sampled, accept_sampled_with, sample,
};
use cipherlora_speculative::draw_bounds::{BoundedRow, decided};
use cipherlora_speculative::tree::{DraftTree, accept_tree_sampled, accept_tree_sampled_with};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{ChiSquared, ContinuousCDF};

const V: usize = 8;
const K: usize = 3;
const DRAWS: usize = 20_000;
const CONTEXT: u32 = 2;

fn chain(seed: u64, sharpness: f64) -> Vec<Vec<f32>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..V)
        .map(|_| {
            let w: Vec<f64> = (0..V)
                .map(|_| rng.random::<f64>().powf(sharpness))
                .collect();
            let s: f64 = w.iter().sum();
            w.iter().map(|x| (x / s) as f32).collect()
        })
        .collect()
}

type Rule = fn(&[u32], &[Vec<f32>], &[Vec<f32>], &mut ChaCha20Rng) -> RoundOutcome;

fn correct(d: &[u32], q: &[Vec<f32>], p: &[Vec<f32>], rng: &mut ChaCha20Rng) -> RoundOutcome {
    accept_sampled(d, DraftProbs::Sampled(q), p, rng).unwrap()
}

/// Wrong: on rejection, resamples from p instead of the residual.
fn resample_from_p(
    d: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> RoundOutcome {
    let mut tokens = Vec::new();
    for (i, &t) in d.iter().enumerate() {
        let ratio = f64::from(p[i][t as usize]) / f64::from(q[i][t as usize]);
        if rng.random::<f64>() < ratio {
            tokens.push(t);
        } else {
            tokens.push(sample(&p[i], rng));
            return RoundOutcome {
                accepted: i,
                tokens,
            };
        }
    }
    tokens.push(sample(&p[d.len()], rng));
    RoundOutcome {
        accepted: d.len(),
        tokens,
    }
}

/// Wrong: accepts every draft.
fn accept_all(d: &[u32], _q: &[Vec<f32>], p: &[Vec<f32>], rng: &mut ChaCha20Rng) -> RoundOutcome {
    let mut tokens = d.to_vec();
    tokens.push(sample(&p[d.len()], rng));
    RoundOutcome {
        accepted: d.len(),
        tokens,
    }
}

/// The logit bound of a simulated fixed point's first trip, and its contraction per trip.
const FIRST_BOUND: f64 = 0.3;
const CONTRACTION: f64 = 0.2;

/// A simulated fixed point's estimate of `p` after trip `k`: every log-probability moved by up to
/// its bound, FIRST_BOUND × CONTRACTION^k.
fn estimate(p: &[Vec<f32>], k: i32, rng: &mut ChaCha20Rng) -> (Vec<Vec<f32>>, f64) {
    let bound = FIRST_BOUND * CONTRACTION.powi(k);
    let rows = p
        .iter()
        .map(|row| {
            let l: Vec<f64> = row
                .iter()
                .map(|&x| f64::from(x).ln() + bound * (2.0 * rng.random::<f64>() - 1.0))
                .collect();
            let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = l.iter().map(|x| (x - max).exp()).sum();
            l.iter().map(|x| ((x - max).exp() / s) as f32).collect()
        })
        .collect();
    (rows, bound)
}

/// The round's outcome from the estimate after trip `k`, if that estimate decides its draws.
fn decided_after(
    k: i32,
    (d, q, p): (&[u32], &[Vec<f32>], &[Vec<f32>]),
    uniforms: &[RowUniforms],
    rng: &mut ChaCha20Rng,
) -> Option<RoundOutcome> {
    let (rows, bound) = estimate(p, k, rng);
    let bounded: Vec<BoundedRow<'_>> = rows
        .iter()
        .map(|r| BoundedRow {
            probs: r,
            delta: bound,
        })
        .collect();
    decided(d, DraftProbs::Sampled(q), &bounded, uniforms)
        .then(|| accept_sampled_with(d, DraftProbs::Sampled(q), &rows, uniforms).unwrap())
}

/// Certified draws: the uniforms first, then trips until the estimate decides them; the outcome is
/// the estimate's.
fn certified_draws(
    d: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> RoundOutcome {
    let uniforms = RowUniforms::draw(rng, p.len());
    (0..12)
        .find_map(|k| decided_after(k, (d, q, p), &uniforms, rng))
        .unwrap_or_else(|| accept_sampled_with(d, DraftProbs::Sampled(q), p, &uniforms).unwrap())
}

/// Wrong: a round undecided after its first trip is shortened to its first row, a fresh draw from
/// the exact distribution (what ending the round at an undecided row does: the event depends on the
/// uniforms).
fn shortening_undecided_rounds(
    d: &[u32],
    q: &[Vec<f32>],
    p: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> RoundOutcome {
    let uniforms = RowUniforms::draw(rng, p.len());
    decided_after(0, (d, q, p), &uniforms, rng).unwrap_or_else(|| RoundOutcome {
        accepted: 0,
        tokens: vec![sample(&p[0], rng)],
    })
}

/// Generates two tokens after `CONTEXT` with speculative rounds.
fn two_tokens(
    target: &[Vec<f32>],
    draft: &[Vec<f32>],
    rule: Rule,
    rng: &mut ChaCha20Rng,
) -> (u32, u32) {
    let mut out = vec![CONTEXT];
    while out.len() < 3 {
        let last = *out.last().unwrap();
        let mut drafts = Vec::with_capacity(K);
        let mut q = Vec::with_capacity(K);
        let mut prev = last;
        for _ in 0..K {
            let row = draft[prev as usize].clone();
            prev = sample(&row, rng);
            drafts.push(prev);
            q.push(row);
        }
        let p: Vec<Vec<f32>> = std::iter::once(last)
            .chain(drafts.iter().copied())
            .map(|t| target[t as usize].clone())
            .collect();
        out.extend(rule(&drafts, &q, &p, rng).tokens);
    }
    (out[1], out[2])
}

/// χ² p-value of the observed joint counts against the target chain.
fn p_value(rule: Rule, seed: u64) -> f64 {
    let draft = chain(12, 2.0);
    joint_p_value(seed, |target, rng| two_tokens(target, &draft, rule, rng))
}

/// χ² p-value against the target chain of the first two tokens after `CONTEXT` that
/// `generate(target, rng)` produces, over `DRAWS` draws.
fn joint_p_value(
    seed: u64,
    generate: impl FnMut(&[Vec<f32>], &mut ChaCha20Rng) -> (u32, u32),
) -> f64 {
    joint_p_value_for(&chain(11, 2.0), seed, generate)
}

/// [`joint_p_value`] against the chain `target`.
fn joint_p_value_for(
    target: &[Vec<f32>],
    seed: u64,
    mut generate: impl FnMut(&[Vec<f32>], &mut ChaCha20Rng) -> (u32, u32),
) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut counts = vec![0usize; V * V];
    for _ in 0..DRAWS {
        let (a, b) = generate(target, &mut rng);
        counts[a as usize * V + b as usize] += 1;
    }
    // Cells with expected count < 5 are pooled into one rest bucket.
    let (mut chi2, mut cells, mut rest_obs, mut rest_exp) = (0.0, 0usize, 0.0, 0.0);
    for a in 0..V {
        for b in 0..V {
            let e = DRAWS as f64 * f64::from(target[CONTEXT as usize][a]) * f64::from(target[a][b]);
            let o = counts[a * V + b] as f64;
            if e < 5.0 {
                rest_obs += o;
                rest_exp += e;
            } else {
                chi2 += (o - e).powi(2) / e;
                cells += 1;
            }
        }
    }
    if rest_exp > 0.0 {
        chi2 += (rest_obs - rest_exp).powi(2) / rest_exp;
        cells += 1;
    }
    let dist = ChiSquared::new((cells - 1) as f64).unwrap();
    1.0 - dist.cdf(chi2)
}

/// Asserts that `rule` passes the χ² test (p > 10⁻³).
fn assert_follows_the_target(rule: Rule) {
    let p = p_value(rule, 1);
    assert!(p > 1e-3, "a correct rule rejected by χ²: p = {p}");
}

/// Asserts that `rule` fails the χ² test (p < 10⁻⁶).
fn assert_detected(rule: Rule) {
    let p = p_value(rule, 1);
    assert!(p < 1e-6, "a wrong rule passed χ²: p = {p}");
}

#[test]
fn speculative_sampling_follows_the_target_distribution() {
    assert_follows_the_target(correct);
}

#[test]
fn chi2_detects_resampling_from_p_instead_of_the_residual() {
    assert_detected(resample_from_p);
}

#[test]
fn certified_draws_follow_the_target_distribution() {
    assert_follows_the_target(certified_draws);
}

#[test]
fn chi2_detects_shortening_a_round_at_an_undecided_draw() {
    assert_detected(shortening_undecided_rounds);
}

#[test]
fn chi2_detects_accepting_every_draft() {
    assert_detected(accept_all);
}

#[test]
fn point_mass_drafts_also_follow_the_target() {
    // A deterministic drafter (n-gram lookup) proposes token 0 at every position; the first
    // generated token must still be distributed as p.
    let target = chain(21, 2.0);
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let mut counts = [0usize; V];
    for _ in 0..DRAWS {
        let drafts = [0u32; K];
        let p: Vec<Vec<f32>> = std::iter::once(CONTEXT)
            .chain(drafts)
            .map(|t| target[t as usize].clone())
            .collect();
        let out = accept_sampled(&drafts, DraftProbs::PointMass, &p, &mut rng).unwrap();
        counts[out.tokens[0] as usize] += 1;
    }
    let row = &target[CONTEXT as usize];
    let chi2: f64 = (0..V)
        .map(|t| {
            let e = DRAWS as f64 * f64::from(row[t]);
            (counts[t] as f64 - e).powi(2) / e
        })
        .sum();
    let p = 1.0 - ChiSquared::new((V - 1) as f64).unwrap().cdf(chi2);
    assert!(p > 1e-3, "point-mass acceptance biased: p = {p}");
}

/// The drafter's `n` most likely tokens after `token` (ties: lower id).
fn top(draft: &[Vec<f32>], token: u32, n: usize) -> Vec<u32> {
    let row = &draft[token as usize];
    let mut ids: Vec<u32> = (0..V as u32).collect();
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    ids.truncate(n);
    ids
}

/// A deterministic tree after `last`: the drafter's top 3 tokens, each with its own top 2 children
/// (9 nodes, level order).
fn draft_tree(draft: &[Vec<f32>], last: u32) -> DraftTree {
    let first = top(draft, last, 3);
    let mut tree = DraftTree {
        tokens: first.clone(),
        parents: vec![None; 3],
    };
    for (i, &t) in first.iter().enumerate() {
        for c in top(draft, t, 2) {
            tree.tokens.push(c);
            tree.parents.push(Some(i));
        }
    }
    tree
}

/// The target's row at every verify row of `tree` (root: `last`).
fn tree_rows(target: &[Vec<f32>], tree: &DraftTree, last: u32) -> Vec<Vec<f32>> {
    std::iter::once(last)
        .chain(tree.tokens.iter().copied())
        .map(|t| target[t as usize].clone())
        .collect()
}

/// The first two tokens after `CONTEXT` from rounds that each continue the last token with what
/// `round` returns.
fn two_tokens_by_rounds(
    rng: &mut ChaCha20Rng,
    mut round: impl FnMut(u32, &mut ChaCha20Rng) -> Vec<u32>,
) -> (u32, u32) {
    let mut out = vec![CONTEXT];
    while out.len() < 3 {
        let last = *out.last().unwrap();
        out.extend(round(last, rng));
    }
    (out[1], out[2])
}

/// Two tokens after `CONTEXT` from tree rounds accepted by `accept`.
fn two_tokens_by_tree(
    target: &[Vec<f32>],
    accept: impl Fn(&DraftTree, &[Vec<f32>], &mut ChaCha20Rng) -> Vec<u32>,
    rng: &mut ChaCha20Rng,
) -> (u32, u32) {
    // A drafter that differs from the target, so rejections happen.
    let draft = chain(12, 2.0);
    two_tokens_by_rounds(rng, |last, rng| {
        let tree = draft_tree(&draft, last);
        accept(&tree, &tree_rows(target, &tree, last), rng)
    })
}

#[test]
fn tree_speculative_sampling_follows_the_target_distribution() {
    let p = joint_p_value(3, |target, rng| {
        two_tokens_by_tree(
            target,
            |tree, rows, rng| accept_tree_sampled(tree, rows, rng).unwrap().tokens,
            rng,
        )
    });
    assert!(p > 1e-3, "tree acceptance rejected by χ²: p = {p}");
}

/// Wrong: tries each child with its plain target probability p(x), never renormalising after a
/// rejected sibling, then samples p without them.
fn tree_without_renormalising(
    tree: &DraftTree,
    rows: &[Vec<f32>],
    rng: &mut ChaCha20Rng,
) -> Vec<u32> {
    let children = tree.children();
    let (mut row, mut tokens) = (0usize, Vec::new());
    'rows: loop {
        let p = &rows[row];
        let mut rejected = Vec::new();
        for &c in &children[row] {
            let x = tree.tokens[c];
            if rng.random::<f64>() < f64::from(p[x as usize]) {
                tokens.push(x);
                row = c + 1;
                continue 'rows;
            }
            rejected.push(x);
        }
        let rest: Vec<f32> = (0..V as u32)
            .map(|t| {
                if rejected.contains(&t) {
                    0.0
                } else {
                    p[t as usize]
                }
            })
            .collect();
        let total: f32 = rest.iter().sum();
        let rest: Vec<f32> = rest.iter().map(|x| x / total).collect();
        tokens.push(sample(&rest, rng));
        return tokens;
    }
}

#[test]
fn chi2_detects_a_tree_rule_that_does_not_renormalise() {
    let p = joint_p_value(3, |target, rng| {
        two_tokens_by_tree(target, tree_without_renormalising, rng)
    });
    assert!(p < 1e-6, "wrong tree rule passed χ²: p = {p}");
}

/// A tree after `last` whose first children are drawn: the root's first child drawn from the
/// drafter's row, then its next 2 choices without it; each of those 3 nodes with a drawn first
/// child and one chosen sibling (9 nodes, level order). Returns the tree and, per node, the row its
/// token was drawn from (`None`: chosen).
fn sampled_tree(
    draft: &[Vec<f32>],
    last: u32,
    rng: &mut ChaCha20Rng,
) -> (DraftTree, Vec<Option<Vec<f32>>>) {
    let mut tree = DraftTree {
        tokens: Vec::new(),
        parents: Vec::new(),
    };
    let mut proposals = Vec::new();
    let mut children = |tree: &mut DraftTree, after: u32, parent: Option<usize>, n: usize| {
        let q = &draft[after as usize];
        let x = sample(q, rng);
        tree.tokens.push(x);
        tree.parents.push(parent);
        proposals.push(Some(q.clone()));
        for t in top(draft, after, n)
            .into_iter()
            .filter(|&t| t != x)
            .take(n - 1)
        {
            tree.tokens.push(t);
            tree.parents.push(parent);
            proposals.push(None);
        }
    };
    children(&mut tree, last, None, 3);
    for i in 0..3 {
        let t = tree.tokens[i];
        children(&mut tree, t, Some(i), 2);
    }
    (tree, proposals)
}

/// Wrong: accepts a drawn child with min(1, p'(x)/q(x)) as it should, but on its rejection removes
/// only x from the residual (the chosen child's update) instead of taking max(0, p' − q).
/// (Accepting a drawn child with p'(x), as if chosen, is exact, only slower: the token is
/// independent of the target's draws.)
fn drawn_child_with_a_chosen_residual(
    tree: &DraftTree,
    rows: &[Vec<f32>],
    proposals: &[Option<&[f32]>],
    rng: &mut ChaCha20Rng,
) -> Vec<u32> {
    let children = tree.children();
    let (mut row, mut tokens) = (0usize, Vec::new());
    'rows: loop {
        let mut w: Vec<f64> = rows[row].iter().map(|&x| f64::from(x)).collect();
        for &c in &children[row] {
            let x = tree.tokens[c] as usize;
            let mass: f64 = w.iter().sum();
            let accept = match proposals[c] {
                Some(q) => w[x] / mass / f64::from(q[x]),
                None => w[x] / mass,
            };
            if rng.random::<f64>() < accept {
                tokens.push(x as u32);
                row = c + 1;
                continue 'rows;
            }
            w[x] = 0.0;
        }
        let total: f64 = w.iter().sum();
        let rest: Vec<f32> = w.iter().map(|x| (x / total) as f32).collect();
        tokens.push(sample(&rest, rng));
        return tokens;
    }
}

/// Two tokens after `CONTEXT` from rounds of [`sampled_tree`]s, accepted with the drawn children's
/// proposals by the library's rule when `honest`, else by [`drawn_child_with_a_chosen_residual`].
fn two_tokens_by_sampled_tree(
    target: &[Vec<f32>],
    honest: bool,
    rng: &mut ChaCha20Rng,
) -> (u32, u32) {
    let draft = chain(12, 2.0);
    two_tokens_by_rounds(rng, |last, rng| {
        let (tree, proposals) = sampled_tree(&draft, last, rng);
        let proposals: Vec<Option<&[f32]>> = proposals.iter().map(|q| q.as_deref()).collect();
        let rows = tree_rows(target, &tree, last);
        if honest {
            accept_tree_sampled_with(&tree, &rows, &proposals, rng)
                .unwrap()
                .tokens
        } else {
            drawn_child_with_a_chosen_residual(&tree, &rows, &proposals, rng)
        }
    })
}

#[test]
fn trees_with_drawn_first_children_follow_the_target_distribution() {
    let p = joint_p_value(4, |target, rng| {
        two_tokens_by_sampled_tree(target, true, rng)
    });
    assert!(
        p > 1e-3,
        "drawn-child tree acceptance rejected by χ²: p = {p}"
    );
}

#[test]
fn chi2_detects_a_drawn_child_rejected_with_a_chosen_child_s_residual() {
    let p = joint_p_value(4, |target, rng| {
        two_tokens_by_sampled_tree(target, false, rng)
    });
    assert!(p < 1e-6, "wrong drawn-child rule passed χ²: p = {p}");
}

/// Regression: a drawn child whose token the target gives no probability (a top-k or top-p target)
/// was skipped without the max(0, p' − q) update its rejection implies, which biased the residual.
/// A target that gives each row's three least likely tokens nothing makes such draws common.
#[test]
fn drawn_children_the_target_rules_out_still_update_the_residual() {
    let target: Vec<Vec<f32>> = chain(11, 2.0)
        .into_iter()
        .map(|row| {
            let mut ids: Vec<usize> = (0..V).collect();
            ids.sort_by(|&a, &b| row[a].total_cmp(&row[b]));
            let mut r = row.clone();
            for &t in &ids[..3] {
                r[t] = 0.0;
            }
            let s: f32 = r.iter().sum();
            r.iter().map(|x| x / s).collect()
        })
        .collect();
    let p = joint_p_value_for(&target, 5, |target, rng| {
        two_tokens_by_sampled_tree(target, true, rng)
    });
    assert!(
        p > 1e-3,
        "drawn-child tree acceptance rejected by χ²: p = {p}"
    );
}
