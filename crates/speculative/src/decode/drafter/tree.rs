//! The base model's tree drafts ([`crate::tree_draft`]): growing a round's
//! tree, keeping the accepted path, and growing the next tree ahead.

use cipherlora_model::{KvCache, KvRows, Model, Sampler};
use rand_chacha::ChaCha20Rng;

use super::{Draft, Drafter, Guess};
use crate::SpecError;
use crate::draft_bias::DraftBias;
use crate::tree::path_rows;
use crate::tree_draft::{Calibration, GrownTree, SampledGrowth, TreeParams, grow};

impl Draft {
    /// A tree of at most k nodes grown by [`grow`] after feeding `feed`.
    fn grown(
        models: (&Model, &Model),
        cache: &mut KvCache,
        feed: &[u32],
        k: usize,
        params: &TreeParams,
        (calibration, bias): (&Calibration, &mut DraftBias),
        sampled: Option<SampledGrowth<'_>>,
    ) -> Result<Self, SpecError> {
        let grown = grow(
            models,
            cache,
            feed,
            (k, params),
            (calibration, bias),
            sampled,
        )?;
        Ok(Self {
            tokens: grown.tree.tokens.clone(),
            probs: None,
            from_base: true,
            tree: Some(grown),
            inputs: None,
        })
    }
}

impl Drafter<'_> {
    /// A tree of at most k nodes ([`crate::tree_draft`]), synced as draft_base.
    pub(in crate::decode) fn draft_tree(
        &mut self,
        context: &[u32],
        target: &KvCache,
        (k, params): (usize, &TreeParams),
        sampling: (&Sampler, &mut ChaCha20Rng),
    ) -> Result<Draft, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        let from = self.synced.min(cache.len());
        cache.sync_from(target, from)?;
        self.synced = target.len();
        let feed = context[cache.len()..].to_vec();
        let models = (self.model, self.batch_model);
        let (sampler, rng) = sampling;
        let sampled = (!sampler.is_greedy()).then_some(SampledGrowth {
            sampler,
            context,
            rng,
        });
        Draft::grown(
            models,
            cache,
            &feed,
            k,
            params,
            (&self.calibration, &mut self.bias),
            sampled,
        )
    }

    /// After a tree round: keeps the context and the accepted path's nodes.
    pub(in crate::decode) fn keep_tree_path(
        &mut self,
        context_len: usize,
        grown: &GrownTree,
        path: &[usize],
    ) -> Result<(), SpecError> {
        if let Some(cache) = self.cache.as_mut() {
            cache.compact(context_len, &grown.cached_path(path))?;
        }
        Ok(())
    }

    /// [`Self::draft_from`] for a tree round (window row n + 1 holds node n).
    pub(in crate::decode) fn tree_from(
        &mut self,
        (start, window): (usize, &KvRows),
        predicted: &crate::tree::TreeOutcome,
        k: usize,
        params: &TreeParams,
    ) -> Result<Guess, SpecError> {
        let cache = self.cache.as_mut().expect("base drafter has a cache");
        cache.put_rows(start, window, &path_rows(&predicted.path))?;
        let bonus = *predicted
            .tokens
            .last()
            .expect("an outcome has a bonus token");
        let models = (self.model, self.batch_model);
        Ok(Guess {
            accepted: predicted.path.len(),
            bonus,
            path: predicted.path.clone(),
            next: Draft::grown(
                models,
                cache,
                &[bonus],
                k,
                params,
                (&self.calibration, &mut self.bias),
                // Drafting ahead is greedy only (`FixedPoint::draft_ahead`).
                None,
            )?,
        })
    }
}
