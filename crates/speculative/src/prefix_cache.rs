//! Prefix caching across requests (as llama.cpp's `cache_prompt`, vLLM's prefix caching): recent
//! contexts' adapted keys and values under a memory budget, LRU-evicted, reused only under the
//! same schedule. Nothing here leaves the client.

use cipherlora_model::KvCache;

use crate::row_deltas::RowDeltas;
use crate::schedule::Schedule;
use crate::{ConfigError, SpecError};

/// The adapted rows of one context: row `i` holds `tokens[i]`'s keys and values.
#[derive(Debug)]
pub struct CachedContext {
    pub(crate) tokens: Vec<u32>,
    pub(crate) target: KvCache,
    pub(crate) shadow: Option<KvCache>,
    pub(crate) log: Option<RowDeltas>,
    pub(crate) schedule: Schedule,
    /// Rows before this need no settling (`decode`'s settling state).
    pub(crate) settled: usize,
    /// Whether the prompt's rows were settled (or exact).
    pub(crate) prompt_settled: bool,
}

impl CachedContext {
    /// The tokens whose rows are held.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes held (keys, values, shadow rows and logged deltas).
    pub fn bytes(&self) -> usize {
        self.target.bytes()
            + self.shadow.as_ref().map_or(0, KvCache::bytes)
            + self.log.as_ref().map_or(0, RowDeltas::bytes)
    }

    /// Tokens `prompt` shares with this context from the start.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// A copy of the first `len` rows in caches of `capacity` positions (at
    /// least `len`): shrunk to be kept, or grown for a generation, in one copy.
    pub(crate) fn prefix(&self, len: usize, capacity: usize) -> Result<Self, SpecError> {
        let len = len.min(self.tokens.len());
        let capacity = capacity.max(len);
        let cut = |kv: &KvCache| -> Result<KvCache, SpecError> { Ok(kv.prefix(len, capacity)?) };
        let mut log = self.log.clone();
        if let Some(log) = log.as_mut() {
            log.truncate(len);
        }
        Ok(Self {
            tokens: self.tokens[..len].to_vec(),
            target: cut(&self.target)?,
            shadow: self.shadow.as_ref().map(cut).transpose()?,
            log,
            schedule: self.schedule,
            settled: self.settled.min(len),
            prompt_settled: self.prompt_settled,
        })
    }
}

/// Recent contexts under a memory budget, least recently used evicted first.
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    entries: Vec<(u64, CachedContext)>,
    clock: u64,
}

/// What [`PrefixCache::take`] found for a prompt.
#[derive(Debug)]
pub struct PrefixHit {
    /// The entry, already cut to the shared prefix.
    pub context: CachedContext,
    /// Rows reused (the shared prefix's length).
    pub reused: usize,
}

impl PrefixCache {
    /// An empty cache of at most `budget` bytes. Errors: [`ConfigError::ZeroCacheBudget`] for 0.
    pub fn new(budget: usize) -> Result<Self, SpecError> {
        if budget == 0 {
            return Err(ConfigError::ZeroCacheBudget.into());
        }
        Ok(Self {
            budget,
            entries: Vec::new(),
            clock: 0,
        })
    }

    /// The memory budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Bytes held by all entries.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, e)| e.bytes()).sum()
    }

    /// Contexts held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no context is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `schedule`'s entry sharing the longest prefix with `prompt`, cut to it: removed when the
    /// prompt extends all of it (the generation's context will supersede it), copied otherwise
    /// (another conversation sharing only a system prompt keeps its rows).
    /// Errors: [`SpecError::Model`].
    pub fn take(
        &mut self,
        prompt: &[u32],
        schedule: &Schedule,
    ) -> Result<Option<PrefixHit>, SpecError> {
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (_, e))| e.schedule == *schedule)
            .map(|(i, (_, e))| (i, e.common_prefix(prompt)))
            .max_by_key(|&(_, n)| n);
        let Some((i, reused)) = best.filter(|&(_, n)| n > 0) else {
            return Ok(None);
        };
        let context = if reused < self.entries[i].1.tokens.len() {
            self.clock += 1;
            self.entries[i].0 = self.clock;
            self.entries[i].1.prefix(reused, reused)?
        } else {
            self.entries.swap_remove(i).1
        };
        Ok(Some(PrefixHit { context, reused }))
    }

    /// Keeps `context`, evicting LRU entries to fit; returns how many went. Errors: [`SpecError::Model`].
    pub fn put(&mut self, context: CachedContext) -> Result<usize, SpecError> {
        let len = context.tokens.len();
        if len == 0 {
            return Ok(0);
        }
        let context = context.prefix(len, len)?;
        let size = context.bytes();
        if size > self.budget {
            return Ok(0);
        }
        // An entry that is a prefix of the new one is superseded by it.
        self.entries.retain(|(_, e)| {
            !(e.schedule == context.schedule && context.common_prefix(&e.tokens) == e.tokens.len())
        });
        let mut evicted = 0;
        while self.bytes() + size > self.budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    self.entries.swap_remove(i);
                    evicted += 1;
                }
                None => break,
            }
        }
        self.clock += 1;
        self.entries.push((self.clock, context));
        Ok(evicted)
    }
}
