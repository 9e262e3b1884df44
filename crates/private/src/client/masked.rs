//! The client's side of masked ring values (docs/design/wire.md, "Masked ring values"): the
//! offline keys and every group's mask pool ([`MaskedClient`], whose requests travel through
//! any [`Transport`] to a masked session), and [`MaskedHook`], which runs a forward pass on
//! pooled masks when every adapted group has enough of them and on its inner hook (CKKS)
//! otherwise.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use candle_core::Tensor;
use cipherlora_ckks::{Ciphertext, Context, GaloisKeys, PublicKey, SecretKey};
use cipherlora_helora::BfvClient;
use cipherlora_helora::GroupClient;
use cipherlora_helora::bfv_backend::OfflineLevels;
use cipherlora_helora::masks::{GroupKey, MaskPool, MaskedClientGroup, OnlineRows};
use cipherlora_helora::ring::RING_PRIME;
use cipherlora_model::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, ModelConfig, ModelError, Proj, ProjGroup,
    TripId, Wavefront,
};

use super::hook::{permute_columns, row_maps};
use cipherlora_proto::v1::GroupRequest;
use prost::Message;

use crate::PrivateError;
use crate::client::{HeTimings, Reply, Transport};
use crate::protocol::masked::{
    Addressed, check_response, masked_request, offline_request, read_masked_response,
};
use crate::protocol::masked::{MaskedOfferGroup, MaskedPlan};
use crate::protocol::{LoraKind, PublicA};
use crate::server::masked::MaskedSession;

/// Calls a [`MaskedSession`] in process through the protobuf encoding, counting bytes.
#[derive(Debug, Clone)]
pub struct InProcessMasked {
    session: Arc<MaskedSession>,
    /// Offline bytes sent and received.
    pub offline_bytes: (u64, u64),
    /// Online bytes sent and received.
    pub online_bytes: (u64, u64),
}

impl InProcessMasked {
    /// A transport to `session`.
    #[must_use]
    pub fn new(session: Arc<MaskedSession>) -> Self {
        InProcessMasked {
            session,
            offline_bytes: (0, 0),
            online_bytes: (0, 0),
        }
    }
}

/// `message` through its encoding: what the other side decodes, and the bytes it took.
fn through_wire<M: Message + Default>(message: &M) -> Result<(M, u64), PrivateError> {
    let bytes = message.encode_to_vec();
    let back = M::decode(bytes.as_slice()).map_err(PrivateError::Decode)?;
    Ok((back, bytes.len() as u64))
}

impl Transport for InProcessMasked {
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError> {
        let (req, up) = through_wire(request)?;
        let (response, down) = through_wire(&self.session.handle(&req)?)?;
        let count = if req.masked.is_some() {
            &mut self.online_bytes
        } else {
            &mut self.offline_bytes
        };
        count.0 += up;
        count.1 += down;
        Ok(Reply {
            server_ms: Some(response.server_micros as f64 / 1e3),
            response,
        })
    }
}

/// One group on the client: its wire key, projections and masked client.
#[derive(Debug, Clone)]
struct ClientGroup {
    key: GroupKey,
    projections: Vec<Proj>,
    group: MaskedClientGroup,
}

/// The offline keys a client uploads when it opens a masked session.
#[derive(Debug, Clone)]
pub struct OfflineKeys {
    /// The offline context's public key (flooding).
    pub public_key: PublicKey,
    /// Galois keys for every rotation step of the offline plans.
    pub galois_keys: GaloisKeys,
}

/// Makes the offline secret key (OS CSPRNG) and the keys the server needs for `plans`. Errors:
/// [`PrivateError::Helora`] for a plan without rotation steps; [`PrivateError::Ckks`] when the
/// OS generator fails.
pub fn offline_keys(
    ctx: &Arc<Context>,
    plans: &[MaskedPlan],
) -> Result<(SecretKey, OfflineKeys), PrivateError> {
    let mut rng = cipherlora_ckks::os_rng()?;
    let rng = &mut rng;
    let sk = SecretKey::generate(ctx, rng);
    let mut steps = std::collections::BTreeSet::new();
    for p in plans {
        steps.extend(p.plan.galois_steps()?);
    }
    let steps: Vec<i64> = steps.into_iter().collect();
    let keys = OfflineKeys {
        public_key: PublicKey::generate(&sk, rng),
        galois_keys: GaloisKeys::generate(&sk, &steps, rng),
    };
    Ok((sk, keys))
}

/// Rows per online request: a longer pass goes out as several pipelined requests, so the link
/// carries one while the server computes another.
pub const ROWS_PER_REQUEST: usize = 32;

/// The client's masked-ring state: the offline secret key and every group's pool.
#[derive(Debug)]
pub struct MaskedClient {
    bfv: BfvClient,
    to: Addressed,
    groups: HashMap<(usize, ProjGroup), ClientGroup>,
    order: Vec<(usize, ProjGroup)>,
    pool: MaskPool,
    /// Column maps from the server's PEFT row layout to the model's.
    row_maps: HashMap<Proj, Vec<usize>>,
    /// Bytes of the offline requests and responses so far, `(up, down)`.
    pub offline_bytes: (u64, u64),
    /// The online exchanges' traffic so far: bytes, values carried (LoRA inputs up, deltas
    /// down) and capacity, which equals the values (a masked value fills what carries it). The
    /// timing fields stay zero.
    pub online: HeTimings,
}

/// The model-side name of a wire group key.
fn model_group(key: GroupKey) -> Option<(usize, ProjGroup)> {
    let group = *ProjGroup::ALL.get(key.group as usize)?;
    Some((key.layer as usize, group))
}

impl MaskedClient {
    /// A client of session `to` with offline secret key `sk` for the server's `offer`
    /// (FFA adapters: with their `public_a`), keeping at most `budget` bytes of masks. Errors:
    /// [`PrivateError::UnknownGroup`] for a group the model has no name for;
    /// [`PrivateError::Helora`] for a plan or lora_A that does not fit.
    pub fn new(
        sk: &SecretKey,
        kind: LoraKind,
        to: Addressed,
        offer: &[MaskedOfferGroup],
        public_a: &[PublicA],
        budget: usize,
    ) -> Result<Self, PrivateError> {
        let bfv = BfvClient::new(sk, RING_PRIME, OfflineLevels::for_mode(kind.mode()))?;
        let mut groups = HashMap::new();
        let mut order = Vec::new();
        for g in offer {
            let key = g.plan.key;
            let name = model_group(key).ok_or(PrivateError::UnknownGroup {
                layer: key.layer,
                group: key.group,
            })?;
            let layout = match kind {
                LoraKind::Standard => GroupClient::standard(&g.plan.plan)?,
                LoraKind::Ffa => {
                    let a: Vec<Vec<f32>> = g
                        .plan
                        .projections
                        .iter()
                        .filter_map(|&p| {
                            public_a
                                .iter()
                                .find(|pa| pa.layer == name.0 && pa.proj == p)
                                .map(|pa| pa.a.clone())
                        })
                        .collect();
                    GroupClient::ffa(&g.plan.plan, &a)?
                }
            };
            order.push(name);
            groups.insert(
                name,
                ClientGroup {
                    key,
                    projections: g.plan.projections.clone(),
                    group: MaskedClientGroup::new(layout, g.public),
                },
            );
        }
        Ok(MaskedClient {
            bfv,
            to,
            groups,
            order,
            pool: MaskPool::new(budget),
            row_maps: HashMap::new(),
            offline_bytes: (0, 0),
            online: HeTimings::default(),
        })
    }

    /// Delivers deltas in `config`'s row layout (a GGUF model's q and k rows are permuted from the
    /// server's PEFT layout); without it, in the server's.
    #[must_use]
    pub fn for_model(mut self, config: &ModelConfig) -> Self {
        self.row_maps = row_maps(config);
        self
    }

    /// Positions every group has masks for: the widest pass that can run masked.
    #[must_use]
    pub fn ready(&self) -> usize {
        self.groups
            .values()
            .map(|g| self.pool.available(g.key))
            .min()
            .unwrap_or(0)
    }

    /// The wire key of the first adapted group, in forward order.
    #[must_use]
    pub fn first_key(&self) -> Option<GroupKey> {
        self.order.first().map(|n| self.groups[n].key)
    }

    /// Input values per position of group `key` (d_in, or Σr for FFA).
    #[must_use]
    pub fn width(&self, key: GroupKey) -> Option<usize> {
        self.groups
            .values()
            .find(|g| g.key == key)
            .map(|g| g.group.width())
    }

    /// Forgets every pooled mask (after the server refused one: a reopened session keeps none
    /// of the old session's masks).
    pub fn clear(&mut self) {
        self.pool.clear();
    }

    /// Bytes the pools hold.
    #[must_use]
    pub fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Runs offline batches until every group has masks for at least `positions` positions.
    /// Returns the batches run. Errors: as [`Self::fill_one`].
    pub fn fill<T: Transport>(
        &mut self,
        transport: &mut T,
        positions: usize,
    ) -> Result<usize, PrivateError> {
        let mut batches = 0;
        while self.fill_one(transport, positions)? {
            batches += 1;
        }
        Ok(batches)
    }

    /// Runs one offline batch for the group with the fewest masks, if it has fewer than
    /// `positions`; whether it ran one. Errors: the pool's budget ([`PrivateError::Helora`]), the
    /// transport's and the response's; a failed batch is released.
    pub fn fill_one<T: Transport>(
        &mut self,
        transport: &mut T,
        positions: usize,
    ) -> Result<bool, PrivateError> {
        let Some(g) = self
            .groups
            .values()
            .filter(|g| self.pool.available(g.key) < positions)
            .min_by_key(|g| (self.pool.available(g.key), g.key))
        else {
            return Ok(false);
        };
        let (batch, up) = g.group.offline_request(&self.bfv, &mut self.pool, g.key)?;
        let bytes = up.iter().map(|c| Bytes::from(c.to_bytes())).collect();
        let req = offline_request(&self.to, g.key, batch, bytes);
        let ctx = self.bfv_context();
        let down = transport.round(&req).and_then(|reply| {
            let resp = reply.response;
            check_response(&req, &resp)?;
            self.offline_bytes.0 += req.encoded_len() as u64;
            self.offline_bytes.1 += resp.encoded_len() as u64;
            resp.ciphertexts
                .iter()
                .map(|b| Ok(Ciphertext::from_bytes(&ctx, b)?))
                .collect::<Result<Vec<_>, PrivateError>>()
        });
        match down {
            Ok(cts) => g
                .group
                .absorb(&self.bfv, &mut self.pool, g.key, batch, &cts)?,
            Err(e) => {
                self.pool.abandon(g.key, batch);
                return Err(e);
            }
        }
        Ok(true)
    }

    fn bfv_context(&self) -> Arc<Context> {
        self.bfv.context().clone()
    }

    /// The deltas of group `name` for `x` (T × d_in) through one online exchange: requests of
    /// at most [`ROWS_PER_REQUEST`] rows, all sent before the first reply is awaited, so their
    /// uploads, the server's work and the downloads overlap. Errors: as [`Self::send`] and
    /// [`Self::finish`].
    fn deltas<T: Transport>(
        &mut self,
        transport: &mut T,
        name: (usize, ProjGroup),
        x: &Tensor,
    ) -> Result<GroupDeltas, PrivateError> {
        let exchange = self.send(transport, name, x)?;
        self.finish(transport, exchange)
    }

    /// Takes masks for `x`'s T rows from group `name`'s pool and sends the masked rows as
    /// requests of at most [`ROWS_PER_REQUEST`] rows, without awaiting a reply. Errors:
    /// [`PrivateError::UnknownGroup`]; the pool's (no masks taken); the transport's.
    fn send<T: Transport>(
        &mut self,
        transport: &mut T,
        name: (usize, ProjGroup),
        x: &Tensor,
    ) -> Result<Exchange, PrivateError> {
        let g = find_group(&self.groups, name)?;
        let (t, _) = x.dims2().map_err(ModelError::from)?;
        let xs: Vec<f32> = x
            .flatten_all()
            .and_then(|v| v.to_vec1())
            .map_err(ModelError::from)?;
        let parts = g
            .group
            .online_request(&mut self.pool, g.key, &xs)?
            .into_parts(ROWS_PER_REQUEST);
        let mut sent = Vec::with_capacity(parts.len());
        for part in parts {
            let round = transport.open_round();
            let req = masked_request(&self.to, round, g.key, &part.refs, &part.masked);
            let values = (part.refs.len() * g.group.width()) as u64;
            self.online.bytes_up += req.encoded_len() as u64;
            self.online.values_up += values;
            self.online.capacity_up += values;
            let answered = transport.send(round, &req);
            sent.push(Sent {
                round,
                req,
                part,
                answered,
            });
        }
        Ok(Exchange { name, t, sent })
    }

    /// Awaits `exchange`'s replies and unmasks its deltas (T, d_out) per projection. Errors:
    /// [`PrivateError::UnknownGroup`]; the transport's; the responses' shape (every reply in
    /// flight is drained first).
    fn finish<T: Transport>(
        &mut self,
        transport: &mut T,
        exchange: Exchange,
    ) -> Result<GroupDeltas, PrivateError> {
        let Exchange { name, t, sent } = exchange;
        let g = find_group(&self.groups, name)?;
        let mut deltas: Vec<Vec<f32>> = vec![Vec::new(); g.projections.len()];
        let mut failed = None;
        for Sent {
            round,
            req,
            part,
            answered,
        } in sent
        {
            let reply = match answered {
                Ok(Some(reply)) => Ok(reply),
                Ok(None) => transport.receive(round, req.layer, req.group),
                Err(e) => Err(e),
            };
            let read = reply.and_then(|reply| {
                self.online.bytes_down += reply.response.encoded_len() as u64;
                let count = part.refs.len() * g.group.kept_width();
                let bits = g.group.response_bits();
                let values = read_masked_response(&req, &reply.response, (count, bits))?;
                self.online.values_down += count as u64;
                self.online.capacity_down += count as u64;
                Ok(g.group.deltas(&part, &values)?)
            });
            match read {
                Ok(part_deltas) if failed.is_none() => {
                    for (all, d) in deltas.iter_mut().zip(part_deltas) {
                        all.extend(d);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut out = GroupDeltas::none();
        for (&p, d) in g.projections.iter().zip(deltas) {
            let d_out = d.len() / t;
            let d = match self.row_maps.get(&p) {
                Some(map) => permute_columns(&d, t, map),
                None => d,
            };
            let tensor = Tensor::from_vec(d, (t, d_out), &candle_core::Device::Cpu)
                .map_err(ModelError::from)?;
            out.push(p, tensor);
        }
        Ok(out)
    }
}

/// Group `name` of `groups` (a field borrow, so the pool stays free to lend). Errors:
/// [`PrivateError::UnknownGroup`].
fn find_group(
    groups: &HashMap<(usize, ProjGroup), ClientGroup>,
    name: (usize, ProjGroup),
) -> Result<&ClientGroup, PrivateError> {
    groups.get(&name).ok_or(PrivateError::UnknownGroup {
        layer: name.0 as u32,
        group: crate::protocol::group_index(name.1),
    })
}

/// One online request sent: its round, the request, the rows it masks, and the reply if the
/// transport answered at once.
#[derive(Debug)]
struct Sent {
    round: u64,
    req: GroupRequest,
    part: OnlineRows,
    answered: Result<Option<Reply>, PrivateError>,
}

/// One group's online exchange in flight: its requests sent, their replies not yet read.
#[derive(Debug)]
struct Exchange {
    name: (usize, ProjGroup),
    t: usize,
    sent: Vec<Sent>,
}

/// A delta hook that runs each forward pass on pooled masks when every adapted group has masks
/// for all its positions, and on `inner` otherwise. A pass starts masked or not at its first
/// adapted group; an exchange that fails (a refused mask) clears the pool and the pass goes on
/// through `inner`. Streamed and batched calls (fixed-point trips) always go to `inner`.
#[derive(Debug)]
pub struct MaskedHook<'a, H, T> {
    inner: H,
    client: &'a mut MaskedClient,
    transport: &'a mut T,
    /// Masked passes only until [`DeltaHook::prefill_done`] (the prompt's passes).
    prompt_only: bool,
    prompt_done: bool,
    /// Whether the pass under way runs masked (set at its first adapted group).
    masked: bool,
    /// Passes begun masked, passes on the inner hook, and masked passes that fell back.
    pub passes: (usize, usize, usize),
    /// Positions of the passes run masked.
    pub masked_positions: usize,
    /// Chunks of the wavefront passes run masked ([`DeltaHook::wavefront`]).
    pub masked_chunks: usize,
    /// The wavefront's trips so far, and each sent group's exchange until it is received.
    trips: u64,
    pending: HashMap<(u64, usize, ProjGroup), Pending>,
}

/// A group of a wavefront chunk between its send and its receive.
#[derive(Debug)]
enum Pending {
    /// Masked requests in flight, and the input, should they fail.
    Masked(Exchange, Tensor),
    /// Deltas already there (from the inner hook, after a fallback).
    Ready(GroupDeltas),
}

/// A masked wavefront pass is cut into at least this many chunks (when it has the rows), so that
/// the client's forward of one chunk overlaps the others' exchanges.
pub const WAVEFRONT_CHUNKS: usize = 4;

impl<'a, H: DeltaHook, T: Transport> MaskedHook<'a, H, T> {
    /// A hook over `client`'s pools and `transport`, falling back to `inner`; every pass may run
    /// masked.
    pub fn new(inner: H, client: &'a mut MaskedClient, transport: &'a mut T) -> Self {
        MaskedHook {
            inner,
            client,
            transport,
            prompt_only: false,
            prompt_done: false,
            masked: false,
            passes: (0, 0, 0),
            masked_positions: 0,
            masked_chunks: 0,
            trips: 0,
            pending: HashMap::new(),
        }
    }

    /// Keeps the masks for the prompt's passes (time to first token): passes after
    /// [`DeltaHook::prefill_done`] go to `inner`.
    #[must_use]
    pub fn prompt_only(mut self) -> Self {
        self.prompt_only = true;
        self
    }
}

impl<H: DeltaHook, T: Transport> DeltaHook for MaskedHook<'_, H, T> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        if self.client.order.first() == Some(&(layer, group)) {
            let t = x.dims2()?.0;
            self.masked = self.may_run_masked(t);
            if self.masked {
                self.passes.0 += 1;
                self.masked_positions += t;
            } else {
                self.passes.1 += 1;
            }
        }
        if self.masked {
            match self.client.deltas(self.transport, (layer, group), x) {
                Ok(d) => return Ok(d),
                Err(e) => self.fall_back(layer, group, &e),
            }
        }
        self.inner.deltas(layer, group, x)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.inner.wants(layer, group)
    }

    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        self.inner.deltas_many(inputs)
    }

    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        self.inner.deltas_many_within(inputs, tolerance)
    }

    fn stream(&mut self, t: usize) -> Option<&mut dyn DeltaStream> {
        self.inner.stream(t)
    }

    /// A masked pass of `t` positions when every group has masks for them (chunks of
    /// ⌈t / [`WAVEFRONT_CHUNKS`]⌉ rows, at most [`ROWS_PER_REQUEST`]); otherwise the inner
    /// hook's wavefront.
    fn wavefront(&mut self, t: usize) -> Option<Wavefront<'_>> {
        if !self.may_run_masked(t) {
            self.masked = false;
            let inner = self.inner.wavefront(t);
            if inner.is_some() {
                self.passes.1 += 1;
            }
            return inner;
        }
        self.masked = true;
        self.passes.0 += 1;
        self.masked_positions += t;
        self.pending.clear();
        Some(Wavefront {
            rows: t.div_ceil(WAVEFRONT_CHUNKS).clamp(1, ROWS_PER_REQUEST),
            stream: self,
        })
    }

    fn prefill_done(&mut self) {
        self.prompt_done = true;
        self.inner.prefill_done();
    }
}

impl<H: DeltaHook, T: Transport> MaskedHook<'_, H, T> {
    /// Whether a pass of `t` positions may run masked: the pools cover it and, for a
    /// [`MaskedHook::prompt_only`] hook, the prompt's passes are not done.
    fn may_run_masked(&self, t: usize) -> bool {
        !(self.prompt_only && self.prompt_done) && self.client.ready() >= t
    }

    /// A refused or failed exchange: the masks it named are spent and the rest of the pool may be
    /// stale (a reopened session), so the pool is cleared and the pass goes on without masks.
    fn fall_back(&mut self, layer: usize, group: ProjGroup, e: &PrivateError) {
        if self.masked {
            tracing::warn!(layer, ?group, error = %e, "masked exchange failed; pool cleared");
            self.client.clear();
            self.masked = false;
            self.passes.2 += 1;
        }
    }
}

/// A masked pass's chunks (the trips of [`DeltaHook::wavefront`]); after a fallback, the inner
/// hook answers each group at its send.
impl<H: DeltaHook, T: Transport> DeltaStream for MaskedHook<'_, H, T> {
    fn open_trip(&mut self, _tolerance: Option<f64>) -> Result<TripId, ModelError> {
        self.trips += 1;
        self.masked_chunks += usize::from(self.masked);
        Ok(TripId(self.trips))
    }

    fn send(&mut self, trip: TripId, input: &GroupInput) -> Result<(), ModelError> {
        let (layer, group) = (input.layer, input.group);
        let mut pending = None;
        if self.masked {
            match self.client.send(self.transport, (layer, group), &input.x) {
                Ok(exchange) => pending = Some(Pending::Masked(exchange, input.x.clone())),
                Err(e) => self.fall_back(layer, group, &e),
            }
        }
        let pending = match pending {
            Some(p) => p,
            None => Pending::Ready(self.inner.deltas(layer, group, &input.x)?),
        };
        self.pending.insert((trip.0, layer, group), pending);
        Ok(())
    }

    /// Errors: [`ModelError::Hook`] for a group not sent in `trip`; the inner hook's.
    fn receive(
        &mut self,
        trip: TripId,
        layer: usize,
        group: ProjGroup,
    ) -> Result<GroupDeltas, ModelError> {
        match self.pending.remove(&(trip.0, layer, group)) {
            Some(Pending::Ready(d)) => Ok(d),
            Some(Pending::Masked(exchange, x)) => {
                match self.client.finish(self.transport, exchange) {
                    Ok(d) => Ok(d),
                    Err(e) => {
                        self.fall_back(layer, group, &e);
                        self.inner.deltas(layer, group, &x)
                    }
                }
            }
            None => Err(ModelError::Hook {
                layer,
                proj: group.projs()[0],
                reason: format!("received in trip {} but never sent", trip.0),
            }),
        }
    }
}
