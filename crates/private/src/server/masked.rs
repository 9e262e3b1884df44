//! The adapter server's side of masked ring values (docs/design/wire.md, "Masked ring
//! values"): per session, batched BFV under the client's offline keys, every adapted group's
//! weights in the ring's fixed point with its offline plan, and the ledger of one-time masks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use cipherlora_ckks::{Context, GaloisKeys, PublicKey, SeededCiphertext};
use cipherlora_helora::bfv_backend::OfflineLevels;
use cipherlora_helora::masks::{GroupKey, LedgerLimits, MaskLedger, MaskedServerGroup};
use cipherlora_helora::planner::choose;
use cipherlora_helora::ring::{RING_PRIME, RingParams};
use cipherlora_helora::{BfvServer, Link, OpCosts};
use cipherlora_proto::v1::{GroupRequest, GroupResponse};

use crate::protocol::group_index;
use crate::protocol::masked::{MaskedOfferGroup, MaskedPlan, masked_response, read_masked_request};
use crate::server::he_adapter::check_galois_keys;
use crate::{AdapterGroups, PrivateError};

/// The planner's offline plan for every group of `groups` at `t` positions per batch. Errors:
/// [`PrivateError::Helora`] when no plan fits.
pub fn offline_plans(
    ctx: &Context,
    groups: &AdapterGroups,
    t: usize,
) -> Result<Vec<MaskedPlan>, PrivateError> {
    groups
        .groups
        .iter()
        .map(|g| {
            let shape = g.adapter.shape();
            let (plan, _) = choose(
                &shape,
                groups.kind.mode(),
                t,
                ctx.slots(),
                false,
                &OpCosts::default(),
                &Link::default(),
            )?;
            Ok(MaskedPlan {
                key: GroupKey {
                    layer: g.layer as u32,
                    group: group_index(g.group),
                },
                plan,
                projections: g.layer_projections().into_iter().map(|(_, p)| p).collect(),
            })
        })
        .collect()
}

/// One client's masked-ring session on the server.
pub struct MaskedSession {
    ctx: Arc<Context>,
    bfv: BfvServer,
    groups: HashMap<GroupKey, MaskedServerGroup>,
    offer: Vec<MaskedOfferGroup>,
    ledger: Mutex<MaskLedger>,
}

impl std::fmt::Debug for MaskedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaskedSession")
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}

impl MaskedSession {
    /// Opens a session for `groups` under `plans` ([`offline_plans`]) with the client's offline
    /// public key and Galois keys. Errors: [`PrivateError::Helora`] for keys or plans that do
    /// not fit, [`PrivateError::UnknownGroup`] for a plan of no group.
    pub fn open(
        ctx: &Arc<Context>,
        groups: &AdapterGroups,
        plans: &[MaskedPlan],
        pk: PublicKey,
        gks: GaloisKeys,
        limits: LedgerLimits,
    ) -> Result<Self, PrivateError> {
        check_galois_keys(ctx, plans.iter().map(|p| &p.plan), &gks)?;
        let levels = OfflineLevels::for_mode(groups.kind.mode());
        let bfv = BfvServer::new(ctx, RING_PRIME, gks, pk, levels)?;
        let by_key: HashMap<GroupKey, _> = groups
            .groups
            .iter()
            .map(|g| {
                let key = GroupKey {
                    layer: g.layer as u32,
                    group: group_index(g.group),
                };
                (key, &g.adapter)
            })
            .collect();
        let mut prepared = HashMap::new();
        let mut offer = Vec::new();
        for p in plans {
            let adapter = by_key.get(&p.key).ok_or(PrivateError::UnknownGroup {
                layer: p.key.layer,
                group: p.key.group,
            })?;
            let group = MaskedServerGroup::new(&bfv, &p.plan, adapter, RingParams::default())?;
            offer.push(MaskedOfferGroup {
                plan: p.clone(),
                public: group.public(),
            });
            prepared.insert(p.key, group);
        }
        Ok(MaskedSession {
            ctx: ctx.clone(),
            bfv,
            groups: prepared,
            offer,
            ledger: Mutex::new(MaskLedger::new(limits)),
        })
    }

    /// An upper bound on the bytes the session's encoded diagonals hold: each diagonal over every
    /// prime of the chain and one special prime.
    #[must_use]
    pub fn diagonal_bytes(&self) -> u64 {
        let primes = self.ctx.params().moduli_bits().len() as u64 + 1;
        let per = self.ctx.degree() as u64 * 8 * primes;
        self.groups
            .values()
            .map(|g| {
                let (ordinary, extended) = g.diagonal_counts();
                (ordinary.iter().sum::<u64>() + extended.iter().sum::<u64>()) * per
            })
            .sum()
    }

    /// Every group's plan and public parameters, in forward order.
    #[must_use]
    pub fn offer(&self) -> &[MaskedOfferGroup] {
        &self.offer
    }

    fn group(&self, layer: u32, group: u32) -> Result<&MaskedServerGroup, PrivateError> {
        self.groups
            .get(&GroupKey { layer, group })
            .ok_or(PrivateError::UnknownGroup { layer, group })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, MaskLedger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ciphertexts an offline request of group `key` carries. Errors:
    /// [`PrivateError::UnknownGroup`].
    pub fn offline_inputs(&self, key: GroupKey) -> Result<usize, PrivateError> {
        Ok(self.group(key.layer, key.group)?.input_ciphertexts()?)
    }

    /// Answers one request of the session: online when it carries masked rows, else offline.
    /// Errors: as [`Self::offline`] and [`Self::online`].
    pub fn handle(&self, req: &GroupRequest) -> Result<GroupResponse, PrivateError> {
        if req.masked.is_some() {
            self.online(req)
        } else {
            self.offline(req)
        }
    }

    /// Answers an offline request (batch `req.batch`). Errors: [`PrivateError::UnknownGroup`];
    /// bad ciphertexts ([`PrivateError::Ckks`]); as [`MaskedServerGroup::offline`].
    pub fn offline(&self, req: &GroupRequest) -> Result<GroupResponse, PrivateError> {
        let started = Instant::now();
        let group = self.group(req.layer, req.group)?;
        let inputs = req
            .ciphertexts
            .iter()
            .map(|b| Ok(SeededCiphertext::from_upload_bytes(&self.ctx, b)?.expand()))
            .collect::<Result<Vec<_>, PrivateError>>()?;
        let key = GroupKey {
            layer: req.layer,
            group: req.group,
        };
        let out = group.offline(&self.bfv, &mut self.ledger(), key, req.batch, &inputs)?;
        Ok(GroupResponse {
            round: req.round,
            layer: req.layer,
            group: req.group,
            ciphertexts: out.iter().map(|c| Bytes::from(c.to_bytes())).collect(),
            server_micros: started.elapsed().as_micros() as u64,
            masked_values: Bytes::new(),
        })
    }

    /// Answers an online request. Errors: [`PrivateError::UnknownGroup`],
    /// [`PrivateError::Message`]; as [`MaskedServerGroup::online`].
    pub fn online(&self, req: &GroupRequest) -> Result<GroupResponse, PrivateError> {
        let started = Instant::now();
        let group = self.group(req.layer, req.group)?;
        let rows = read_masked_request(req, group.width())?;
        let values = group.online(&mut self.ledger(), rows.key, &rows.refs, &rows.masked)?;
        Ok(masked_response(
            req,
            &values,
            group.public().response_bits(),
            started.elapsed().as_micros() as u64,
        ))
    }
}
