//! One layer group's masked-ring exchanges: the offline request (the client's masks `r`
//! encrypted in the group's slot layout), the offline response (`Enc(M̂·r − m)` from
//! [`BfvServer::offline_response`]), and the online request and response of
//! [`crate::ring`], with the ledger and the pool keeping each mask to one use.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use cipherlora_ckks::{Ciphertext, SeededCiphertext};

use super::{GroupKey, MaskLedger, MaskPool, MaskRef, expand};
use crate::adapter::GroupAdapter;
use crate::bfv_backend::{BfvClient, BfvServer};
use crate::error::{HeloraError, Result};
use crate::group_client::GroupClient;
use crate::group_server::PreparedGroup;
use crate::plan::GroupPlan;
use crate::ring::{RING_PRIME, RingGroup, RingInput, RingParams, RingPublic, kept_bits, unmask};

/// The server's side of one group: the adapter in the ring's fixed point, its offline plan
/// prepared on batched BFV, and the plan's slot layout (to read its masks per delta).
#[derive(Debug)]
pub struct MaskedServerGroup {
    ring: RingGroup,
    prepared: PreparedGroup<BfvServer>,
    layout: GroupClient,
}

impl MaskedServerGroup {
    /// Prepares `adapter` for the offline `plan` (T positions per batch) on `server`. Errors: as
    /// [`RingGroup::new`] and [`PreparedGroup::new`].
    pub fn new(
        server: &BfvServer,
        plan: &GroupPlan,
        adapter: &GroupAdapter,
        params: RingParams,
    ) -> Result<Self> {
        let ring = RingGroup::new(adapter, params)?;
        let prepared = PreparedGroup::new(server, plan, ring.adapter())?;
        let layout = ring.group_client(plan)?;
        Ok(MaskedServerGroup {
            ring,
            prepared,
            layout,
        })
    }

    /// Input values per position: d_in (standard LoRA) or the group's total rank R (FFA).
    pub fn width(&self) -> usize {
        self.layout.mask_width()
    }

    /// Encoded diagonals held by plan level, `(ordinary, over Q·P)`
    /// ([`PreparedGroup::diagonal_counts`]).
    pub fn diagonal_counts(&self) -> ([u64; crate::counts::LEVELS], [u64; crate::counts::LEVELS]) {
        self.prepared.diagonal_counts()
    }

    /// Ciphertexts an offline request carries. Errors: as [`GroupPlan::input_cts`].
    pub fn input_ciphertexts(&self) -> Result<usize> {
        self.prepared.plan().input_cts()
    }

    /// What the client needs to encode and decode (published with the offline plan).
    pub fn public(&self) -> RingPublic {
        self.ring.public(self.prepared.plan().mode)
    }

    /// The server's masks of a batch per projection (T × d_out), from its seed.
    fn masks(&self, seed: &[u8; 32]) -> Result<Vec<Vec<u64>>> {
        let slots = self.slot_masks(seed);
        self.layout.unpack_ring(&slots)
    }

    /// N values of `Z_p` per returned ciphertext.
    fn slot_masks(&self, seed: &[u8; 32]) -> Vec<Vec<u64>> {
        let plan = self.prepared.plan();
        (0..plan.stage_b.n_out)
            .map(|c| expand(seed, c as u64, 2 * plan.slots))
            .collect()
    }

    /// Answers offline request `batch` of group `key`: opens the batch in `ledger` and returns
    /// `Enc(M̂·r − m)` per returned ciphertext, flooded. A failed evaluation leaves no open batch.
    /// Errors: as [`MaskLedger::open`] and [`BfvServer::offline_response`].
    pub fn offline(
        &self,
        server: &BfvServer,
        ledger: &mut MaskLedger,
        key: GroupKey,
        batch: u64,
        inputs: &[Ciphertext],
    ) -> Result<Vec<Ciphertext>> {
        let seed = ledger.open(key, batch, self.prepared.plan().t)?;
        let out = server.offline_response(&self.prepared, inputs, &self.slot_masks(&seed));
        if out.is_err() {
            ledger.cancel(key, batch);
        }
        out
    }

    /// Answers an online request: per row of `masked` (the group's input width each, values in
    /// `Z_p`) the top bits of `M̂·(x̂ − r) + m` for every projection in order, under the mask
    /// `rows` names. Each mask answers once. Errors: [`HeloraError::ShapeMismatch`] and
    /// [`HeloraError::Malformed`] (nothing used); as [`MaskLedger::take`].
    pub fn online(
        &self,
        ledger: &mut MaskLedger,
        key: GroupKey,
        rows: &[MaskRef],
        masked: &[u64],
    ) -> Result<Vec<u32>> {
        let width = self.layout.mask_width();
        if masked.len() != rows.len() * width {
            return Err(HeloraError::ShapeMismatch {
                what: "masked values (rows × input width)",
                expected: rows.len() * width,
                got: masked.len(),
            });
        }
        if masked.iter().any(|&v| v >= RING_PRIME) {
            return Err(HeloraError::Malformed {
                what: "masked values",
                reason: "a value is not below the ring's modulus",
            });
        }
        let seeds = ledger.take(key, rows)?;
        let mode = self.prepared.plan().mode;
        let d_outs = &self.prepared.plan().shape.d_outs;
        let mut by_batch: HashMap<u64, Vec<Vec<u64>>> = HashMap::new();
        let mut out = Vec::with_capacity(rows.len() * d_outs.iter().sum::<usize>());
        for ((at, seed), x) in rows.iter().zip(&seeds).zip(masked.chunks_exact(width)) {
            let m = match by_batch.entry(at.batch) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(self.masks(seed)?),
            };
            let pos = at.position as usize;
            for (j, &d) in d_outs.iter().enumerate() {
                let mj = &m[j][pos * d..(pos + 1) * d];
                out.extend(self.ring.respond(j, x, mj, mode)?);
            }
        }
        Ok(out)
    }
}

/// The rows of one online request and what the client keeps to read its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlineRows {
    /// The masks the server must use, one per row.
    pub refs: Vec<MaskRef>,
    /// `x̂ − r mod p` per row (the group's input width each): what is sent.
    pub masked: Vec<u64>,
    exponents: Vec<i32>,
    kept: Vec<Vec<u32>>,
}

impl OnlineRows {
    /// Cuts the rows into consecutive parts of at most `rows` rows each (at least one row per
    /// part), each its own request: a long pass goes out as pipelined requests whose transfers
    /// and server work overlap.
    #[must_use]
    pub fn into_parts(self, rows: usize) -> Vec<OnlineRows> {
        let rows = rows.max(1);
        let width = self.masked.len() / self.refs.len().max(1);
        let mut masked = self.masked.chunks(rows * width.max(1));
        let mut exponents = self.exponents.chunks(rows);
        let mut kept = self.kept.chunks(rows);
        self.refs
            .chunks(rows)
            .map(|refs| OnlineRows {
                refs: refs.to_vec(),
                masked: masked.next().unwrap_or_default().to_vec(),
                exponents: exponents.next().unwrap_or_default().to_vec(),
                kept: kept.next().unwrap_or_default().to_vec(),
            })
            .collect()
    }
}

/// The client's side of one group: the offline plan's slot layout and the ring's public
/// parameters.
#[derive(Debug, Clone)]
pub struct MaskedClientGroup {
    layout: GroupClient,
    public: RingPublic,
}

impl MaskedClientGroup {
    /// The client of the offline plan `layout` was built for ([`GroupClient::ffa`] with the
    /// public lora_A, or [`GroupClient::standard`]) and the server's `public` parameters.
    pub fn new(layout: GroupClient, public: RingPublic) -> Self {
        MaskedClientGroup { layout, public }
    }

    /// Input values per position: d_in (standard LoRA) or the group's total rank R (FFA).
    pub fn width(&self) -> usize {
        self.layout.mask_width()
    }

    /// Bits per response value on the wire ([`RingPublic::response_bits`]).
    pub fn response_bits(&self) -> u32 {
        self.public.response_bits()
    }

    /// Delta values per position over the group's projections (Σ d_out).
    pub fn kept_width(&self) -> usize {
        self.layout.plan().shape.d_outs.iter().sum()
    }

    /// Starts a batch: reserves T positions in `pool` and encrypts their masks. Errors: as
    /// [`MaskPool::reserve`], [`GroupClient::mask_slots`] and [`BfvClient::encrypt`] (the
    /// reservation is released).
    pub fn offline_request(
        &self,
        bfv: &BfvClient,
        pool: &mut MaskPool,
        key: GroupKey,
    ) -> Result<(u64, Vec<SeededCiphertext>)> {
        let plan = self.layout.plan();
        let width = self.layout.mask_width();
        let reserved = pool.reserve(key, plan.t, width, self.kept_width())?;
        let encrypted = self.layout.mask_slots(&reserved.r).and_then(|uploads| {
            uploads
                .iter()
                .map(|rows| bfv.encrypt(rows, plan.input_level()))
                .collect::<Result<Vec<_>>>()
        });
        if encrypted.is_err() {
            pool.abandon(key, reserved.batch);
        }
        Ok((reserved.batch, encrypted?))
    }

    /// Reads batch `batch`'s offline response into `pool`: each position's kept top bits of
    /// `M̂·r − m`. Errors: as [`BfvClient::decrypt`], [`GroupClient::unpack_ring`] (the
    /// reservation is released) and [`MaskPool::fill`].
    pub fn absorb(
        &self,
        bfv: &BfvClient,
        pool: &mut MaskPool,
        key: GroupKey,
        batch: u64,
        responses: &[Ciphertext],
    ) -> Result<()> {
        let read = responses
            .iter()
            .map(|c| bfv.decrypt(c).map(|d| d.values))
            .collect::<Result<Vec<_>>>()
            .and_then(|values| self.layout.unpack_ring(&values));
        let per_projection = match read {
            Ok(v) => v,
            Err(e) => {
                pool.abandon(key, batch);
                return Err(e);
            }
        };
        let d_outs = &self.layout.plan().shape.d_outs;
        let kept = (0..self.layout.plan().t)
            .map(|pos| {
                d_outs
                    .iter()
                    .zip(&per_projection)
                    .flat_map(|(&d, c)| kept_bits(&c[pos * d..(pos + 1) * d], self.public.shift))
                    .collect()
            })
            .collect();
        Ok(pool.fill(key, batch, kept)?)
    }

    /// Masks the LoRA input of `x` (positions × d_in; FFA sends `lora_A·x`,
    /// [`GroupClient::lora_input`]) with pooled masks, each used once. Errors:
    /// [`HeloraError::ShapeMismatch`]; [`crate::masks::MaskError::PoolEmpty`] (nothing taken).
    pub fn online_request(
        &self,
        pool: &mut MaskPool,
        key: GroupKey,
        x: &[f32],
    ) -> Result<OnlineRows> {
        let width = self.layout.mask_width();
        let x: Vec<f32> = self
            .layout
            .lora_input(x)?
            .into_iter()
            .map(|v| v as f32)
            .collect();
        if x.is_empty() {
            return Err(HeloraError::ShapeMismatch {
                what: "ring input (positions × d_in)",
                expected: self.layout.plan().shape.d_in,
                got: 0,
            });
        }
        let masks = pool.take(key, x.len() / width)?;
        let mut rows = OnlineRows {
            refs: Vec::with_capacity(masks.len()),
            masked: Vec::with_capacity(x.len()),
            exponents: Vec::with_capacity(masks.len()),
            kept: Vec::with_capacity(masks.len()),
        };
        for (mask, row) in masks.into_iter().zip(x.chunks_exact(width)) {
            let encoded = RingInput::encode(row, self.public.input_bits);
            rows.masked.extend(encoded.masked(&mask.r)?);
            rows.refs.push(mask.at);
            rows.exponents.push(encoded.exponent);
            rows.kept.push(mask.kept);
        }
        Ok(rows)
    }

    /// The deltas of an online response (`rows`' positions × every projection's d_out values):
    /// per projection, positions × d_out values. Errors: [`HeloraError::ShapeMismatch`].
    pub fn deltas(&self, rows: &OnlineRows, response: &[u32]) -> Result<Vec<Vec<f32>>> {
        let d_outs = &self.layout.plan().shape.d_outs;
        let kept_width = self.kept_width();
        if response.len() != rows.refs.len() * kept_width {
            return Err(HeloraError::ShapeMismatch {
                what: "online response (rows × Σ d_out)",
                expected: rows.refs.len() * kept_width,
                got: response.len(),
            });
        }
        let mut out: Vec<Vec<f32>> = d_outs
            .iter()
            .map(|&d| Vec::with_capacity(rows.refs.len() * d))
            .collect();
        for ((answer, kept), &exponent) in response
            .chunks_exact(kept_width)
            .zip(&rows.kept)
            .zip(&rows.exponents)
        {
            let z = unmask(answer, kept, self.public.shift)?;
            let mut start = 0;
            for (j, &d) in d_outs.iter().enumerate() {
                out[j].extend(self.public.decode(&z[start..start + d], exponent));
                start += d;
            }
        }
        Ok(out)
    }
}
