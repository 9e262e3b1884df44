//! The client's HE delta hook.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use candle_core::{Device, Tensor};
use cipherlora_ckks::{CkksParameters, Context};
use cipherlora_helora::{CkksClient, GroupClient, InputScales, Mode};
use cipherlora_model::{
    DeltaHook, DeltaStream, GroupDeltas, GroupInput, ModelConfig, ModelError, Proj, ProjGroup,
    RopeStyle, Wavefront, gguf_qk_row_permutation,
};
use cipherlora_proto::v1::{GroupRequest, GroupResponse};
use prost::Message;

use crate::PrivateError;
use crate::client::Transport;
use crate::client::response_bits::{response_bits, upload_error};
use crate::client::schedule_plan::PassModel;
use crate::client::width_plan::PlanSpace;
use crate::protocol::{SessionOffer, group_index};

mod stream;
use stream::StreamTrips;

/// Where the client's time and bytes went, summed over all group rounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeTimings {
    /// Group requests answered (one per adapted layer group per pass).
    pub rounds: u64,
    /// Network round trips: one per group request on the per-group
    /// schedule, one per batch ([`DeltaHook::deltas_many`]) or streamed
    /// trip ([`DeltaStream::open_trip`]) otherwise.
    pub round_trips: u64,
    /// Packing + encryption (incl. FFA's A·x), ms.
    pub encrypt_ms: f64,
    /// Server compute, ms (as reported by the transport), counted only
    /// as far as the client waited for it (a streamed trip's replies that
    /// arrive while the client's pass runs cost no wait).
    pub server_ms: f64,
    /// Round trip minus server compute (network, serialisation), ms.
    pub network_ms: f64,
    /// Server compute as the server reports it, ms, whether or not the
    /// client waited for it: over a streamed round's wall time, the
    /// server's utilisation (the planner's streamed model takes the busiest
    /// resource; this is the server's share).
    pub server_busy_ms: f64,
    /// Decryption + unpacking + row mapping, ms.
    pub decrypt_ms: f64,
    /// Request bytes sent.
    pub bytes_up: u64,
    /// Response bytes received.
    pub bytes_down: u64,
    /// Input values the requests carried (standard LoRA: d_in per position,
    /// FFA: Σr), counting real positions only.
    pub values_up: u64,
    /// Delta values the responses carried (Σd_out per real position).
    pub values_down: u64,
    /// Real values the requests' ciphertexts could hold (N each).
    pub capacity_up: u64,
    /// Real values the responses' ciphertexts could hold (N each).
    pub capacity_down: u64,
}

impl HeTimings {
    /// Adds `other`'s counters to these.
    pub fn add(&mut self, other: &HeTimings) {
        self.rounds += other.rounds;
        self.round_trips += other.round_trips;
        self.encrypt_ms += other.encrypt_ms;
        self.server_ms += other.server_ms;
        self.network_ms += other.network_ms;
        self.server_busy_ms += other.server_busy_ms;
        self.decrypt_ms += other.decrypt_ms;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
        self.values_up += other.values_up;
        self.values_down += other.values_down;
        self.capacity_up += other.capacity_up;
        self.capacity_down += other.capacity_down;
    }

    /// These counters less `part` of them (e.g. a generation's prompt passes:
    /// all of it without [`HeHook::timings_since_prefill`]).
    #[must_use]
    pub fn without(&self, part: &HeTimings) -> HeTimings {
        let mut rest = self.clone();
        rest.subtract(part);
        rest
    }

    /// Subtracts `earlier` (a snapshot of the same counters) from these.
    pub fn subtract(&mut self, earlier: &HeTimings) {
        self.rounds -= earlier.rounds.min(self.rounds);
        self.round_trips -= earlier.round_trips.min(self.round_trips);
        self.encrypt_ms -= earlier.encrypt_ms;
        self.server_ms -= earlier.server_ms;
        self.network_ms -= earlier.network_ms;
        self.server_busy_ms -= earlier.server_busy_ms;
        self.decrypt_ms -= earlier.decrypt_ms;
        self.bytes_up -= earlier.bytes_up.min(self.bytes_up);
        self.bytes_down -= earlier.bytes_down.min(self.bytes_down);
        self.values_up -= earlier.values_up.min(self.values_up);
        self.values_down -= earlier.values_down.min(self.values_down);
        self.capacity_up -= earlier.capacity_up.min(self.capacity_up);
        self.capacity_down -= earlier.capacity_down.min(self.capacity_down);
    }
}

struct ClientGroup {
    client: GroupClient,
    /// Each projection with its decoder layer, in plan order.
    projs: Vec<(usize, Proj)>,
    /// The model groups (layer, group) whose inputs make this group's
    /// input, concatenated in this order (one, unless the offer is
    /// [`Grouping::ByLayers`](crate::Grouping::ByLayers)).
    members: Vec<(usize, ProjGroup)>,
}

/// One session group's decrypted deltas: each projection's, with its
/// decoder layer, in the model's row layout.
type SessionDeltas = Vec<((usize, Proj), Tensor)>;

/// One encrypted request of a batch: the session group it goes to, its
/// input, and which of the batch's [`GroupInput`]s it answers.
struct Unit {
    key: (usize, ProjGroup),
    x: Tensor,
    inputs: Vec<usize>,
}

/// A [`DeltaHook`] whose deltas come from the adapter server under CKKS.
///
/// Holds the only secret key of the session. Every decrypted value stays in
/// this process: it is added to the model's projections and never sent back
/// (threat model, guarantee 2).
pub struct HeHook<T: Transport> {
    he: CkksClient,
    groups: HashMap<(usize, ProjGroup), ClientGroup>,
    /// The session group each adapted model group's input goes to (itself,
    /// unless the offer is [`Grouping::ByLayers`](crate::Grouping::ByLayers)).
    group_of: HashMap<(usize, ProjGroup), (usize, ProjGroup)>,
    transport: T,
    /// Row maps from the PEFT layout into the model's (GGUF q/k permutation).
    row_maps: HashMap<Proj, Vec<usize>>,
    timings: HeTimings,
    /// [`Self::timings`] when the decoder last said its prefill was done
    /// ([`DeltaHook::prefill_done`]).
    at_prefill_done: Option<HeTimings>,
    /// The modelled cost of one pass of this session's plans.
    pass_model: PassModel,
    /// The preset, mode and group shapes of the offer (for the plans of
    /// other widths, [`crate::width_plan`]).
    plan_space: PlanSpace,
    /// Streamed trips in flight ([`DeltaStream`]).
    trips: StreamTrips,
    /// Positions per request: the session's T.
    width: usize,
}

impl<T: Transport> std::fmt::Debug for HeHook<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeHook")
            .field("groups", &self.groups.len())
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> HeHook<T> {
    /// Generates a fresh secret key (OS CSPRNG), the Galois keys for exactly
    /// the rotation steps of the offered plans, and opens the session with
    /// `open(galois_key_bytes, public_key_bytes)`, which returns the
    /// transport; the public key is `Some` only when a plan rerandomises its
    /// outputs (circuit privacy), the one use the server has for it.
    ///
    /// `config` is the client model's shape: for llama-family GGUF files the
    /// decrypted q/k deltas are permuted into llama.cpp's row layout.
    ///
    /// # Errors
    /// [`PrivateError::Ckks`] for bad parameters, [`PrivateError::Helora`]
    /// for plans that do not fit, and whatever `open` returns.
    pub fn connect(
        offer: &SessionOffer,
        config: &ModelConfig,
        open: impl FnOnce(&[u8], Option<&[u8]>) -> Result<T, PrivateError>,
    ) -> Result<Self, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let he = CkksClient::new(&ctx)?;
        let mut steps = BTreeSet::new();
        let mut groups = HashMap::with_capacity(offer.groups.len());
        let mut group_of = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            steps.extend(og.plan.galois_steps()?);
            let client = match &og.public_a {
                Some(a) => GroupClient::ffa(&og.plan, a)?,
                None => GroupClient::standard(&og.plan)?,
            };
            let projs = og.projections.clone();
            let mut members: Vec<(usize, ProjGroup)> =
                projs.iter().map(|&(l, p)| (l, p.group())).collect();
            members.dedup();
            for &m in &members {
                group_of.insert(m, (og.layer, og.group));
            }
            groups.insert(
                (og.layer, og.group),
                ClientGroup {
                    client,
                    projs,
                    members,
                },
            );
        }
        let steps: Vec<i64> = steps.into_iter().collect();
        let pass_model = PassModel::of(offer, &ctx)?;
        let plan_space = PlanSpace::of(offer);
        let t0 = std::time::Instant::now();
        let keys = he.galois_keys(&steps).to_bytes();
        let public_key = offer
            .groups
            .iter()
            .any(|g| g.plan.rerandomize)
            .then(|| he.public_key().to_bytes());
        let keygen_ms = t0.elapsed().as_secs_f64() * 1e3;
        let transport = open(&keys, public_key.as_deref())?;
        tracing::debug!(
            galois_keys = steps.len(),
            key_bytes = keys.len(),
            keygen_ms,
            open_ms = t0.elapsed().as_secs_f64() * 1e3 - keygen_ms,
            "session keys made and uploaded"
        );
        let row_maps = row_maps(config);
        Ok(Self {
            he,
            groups,
            group_of,
            transport,
            row_maps,
            timings: HeTimings::default(),
            at_prefill_done: None,
            pass_model,
            plan_space,
            trips: StreamTrips::default(),
            width: offer.t,
        })
    }

    /// Time and bytes so far.
    #[must_use]
    pub fn timings(&self) -> &HeTimings {
        &self.timings
    }

    /// Time and bytes since the decoder last finished a prompt's passes
    /// ([`DeltaHook::prefill_done`]): the decode part of the latest
    /// generation, even when the prompt's last chunk ran through this
    /// session. All of [`Self::timings`] before any generation marked it.
    #[must_use]
    pub fn timings_since_prefill(&self) -> HeTimings {
        let mut since = self.timings.clone();
        if let Some(mark) = &self.at_prefill_done {
            since.subtract(mark);
        }
        since
    }

    /// The modelled cost of one verify pass of this session (for
    /// [`crate::choose_schedule`]).
    #[must_use]
    pub fn pass_model(&self) -> &PassModel {
        &self.pass_model
    }

    /// The preset, LoRA variant and group shapes of this session's offer:
    /// what [`crate::width_plan::choose_width`] needs to model other widths.
    #[must_use]
    pub fn plan_space(&self) -> &PlanSpace {
        &self.plan_space
    }

    /// Positions per request: the session's T.
    #[must_use]
    pub fn width(&self) -> usize {
        self.width
    }

    /// The transport (e.g. to read its counters).
    #[must_use]
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport, the session's keys dropped (e.g. to close it).
    #[must_use]
    pub fn into_transport(self) -> T {
        self.transport
    }

    fn client_group(&self, layer: usize, group: ProjGroup) -> Result<&ClientGroup, PrivateError> {
        self.groups
            .get(&(layer, group))
            .ok_or(PrivateError::UnknownGroup {
                layer: layer as u32,
                group: group_index(group),
            })
    }

    /// The session group that answers model group (`layer`, `group`).
    fn session_group(
        &self,
        layer: usize,
        group: ProjGroup,
    ) -> Result<(usize, ProjGroup), PrivateError> {
        self.group_of
            .get(&(layer, group))
            .copied()
            .ok_or(PrivateError::UnknownGroup {
                layer: layer as u32,
                group: group_index(group),
            })
    }

    /// Packs and encrypts one group's input (T, d_in) for deltas needed to
    /// relative precision `tolerance` (0: full): the upload may lose
    /// [`upload_error`] per normalised input value and the request asks for
    /// [`response_bits`].
    fn encrypt_group(
        &self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
        tolerance: f64,
    ) -> Result<(GroupRequest, InputScales), PrivateError> {
        let g = self.client_group(layer, group)?;
        let xs = x
            .flatten_all()
            .and_then(|x| x.to_vec1::<f32>())
            .map_err(|e| PrivateError::Model(e.into()))?;
        let (ciphertexts, scales) =
            g.client
                .encrypt_within(&self.he, &xs, upload_error(tolerance))?;
        let request = GroupRequest::for_group(
            layer as u32,
            group_index(group),
            ciphertexts,
            response_bits(tolerance),
        );
        Ok((request, scales))
    }

    /// Decrypts one session group's response into the model's row layout.
    fn decrypt_group(
        &self,
        layer: usize,
        group: ProjGroup,
        t: usize,
        response: &GroupResponse,
        scales: &InputScales,
    ) -> Result<SessionDeltas, PrivateError> {
        let g = self.client_group(layer, group)?;
        let deltas = g.client.deltas(&self.he, &response.ciphertexts, scales)?;
        let mut out = Vec::with_capacity(g.projs.len());
        for (&(l, proj), delta) in g.projs.iter().zip(deltas) {
            let d_out = delta.len() / t;
            let delta = match self.row_maps.get(&proj) {
                Some(map) => permute_columns(&delta, t, map),
                None => delta,
            };
            let tensor = Tensor::from_vec(delta, (t, d_out), &Device::Cpu)
                .map_err(|e| PrivateError::Model(e.into()))?;
            out.push(((l, proj), tensor));
        }
        Ok(out)
    }

    fn group_deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, PrivateError> {
        if self.client_group(layer, group)?.members.len() > 1 {
            return Err(PrivateError::GroupedByLayer {
                layer: layer as u32,
            });
        }
        let (t, _) = x.dims2().map_err(|e| PrivateError::Model(e.into()))?;
        if t != self.width {
            return self.group_deltas_split(layer, group, x);
        }
        let t0 = Instant::now();
        let (request, scales) = self.encrypt_group(layer, group, x, 0.0)?;
        let t1 = Instant::now();
        let reply = self.transport.round(&request)?;
        let t2 = Instant::now();
        self.carried_up((layer, group), t, &request);
        self.carried_down((layer, group), t, &reply.response);
        let out = member_deltas(
            &self.decrypt_group(layer, group, t, &reply.response, &scales)?,
            (layer, group),
        );
        let t3 = Instant::now();
        self.account(
            [t0, t1, t2, t3],
            1,
            1,
            reply.server_ms,
            request.encoded_len(),
            reply.response.encoded_len(),
        );
        Ok(out)
    }

    /// One group's input of any number of rows `T` as `⌈T / width⌉` requests
    /// of the session's width (the last zero-padded), all sent before the
    /// first reply is awaited: the uploads, the server's compute and the
    /// downloads of consecutive requests overlap, and the whole pass pays
    /// one latency per group. Each request is a round of its own, so the
    /// server sees what a pass of its width shows it, `⌈T / width⌉` times.
    fn group_deltas_split(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, PrivateError> {
        let model = |e: candle_core::Error| PrivateError::Model(e.into());
        let (t, _) = x.dims2().map_err(model)?;
        let w = self.width;
        let t0 = Instant::now();
        let mut sent = Vec::with_capacity(t.div_ceil(w));
        let (mut up, mut encrypt_ms) = (0, 0.0);
        for start in (0..t).step_by(w) {
            let rows = w.min(t - start);
            let chunk = stream::pad_rows(&x.narrow(0, start, rows).map_err(model)?, w)?;
            let e0 = Instant::now();
            let (request, scales) = self.encrypt_group(layer, group, &chunk, 0.0)?;
            encrypt_ms += e0.elapsed().as_secs_f64() * 1e3;
            up += request.encoded_len();
            self.carried_up((layer, group), rows, &request);
            let round = self.transport.open_round();
            let early = self.transport.send(round, &request)?;
            sent.push((round, rows, scales, early));
        }
        let (mut parts, mut down, mut server_ms, mut decrypt_ms) = (Vec::new(), 0, 0.0, 0.0);
        for (round, rows, scales, early) in sent {
            let reply = match early {
                Some(r) => r,
                None => self
                    .transport
                    .receive(round, layer as u32, group_index(group))?,
            };
            down += reply.response.encoded_len();
            self.carried_down((layer, group), rows, &reply.response);
            server_ms += reply.server_ms.unwrap_or(0.0);
            let d0 = Instant::now();
            let deltas = self.decrypt_group(layer, group, w, &reply.response, &scales)?;
            decrypt_ms += d0.elapsed().as_secs_f64() * 1e3;
            parts.push((rows, member_deltas(&deltas, (layer, group))));
        }
        let mut out = GroupDeltas::none();
        for &proj in group.projs() {
            let pieces = parts
                .iter()
                .filter_map(|(rows, g)| g.get(proj).map(|d| d.narrow(0, 0, *rows)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(model)?;
            if !pieces.is_empty() {
                out.push(proj, Tensor::cat(&pieces, 0).map_err(model)?);
            }
        }
        // Encryption and decryption interleave with the wait: book them as
        // measured and the rest of the wall time as the round trip.
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let wait_ms = (wall - encrypt_ms - decrypt_ms).max(0.0);
        let tm = &mut self.timings;
        tm.rounds += parts.len() as u64;
        tm.round_trips += 1;
        tm.encrypt_ms += encrypt_ms;
        tm.decrypt_ms += decrypt_ms;
        tm.server_busy_ms += server_ms;
        tm.server_ms += server_ms.min(wait_ms);
        tm.network_ms += wait_ms - server_ms.min(wait_ms);
        tm.bytes_up += up as u64;
        tm.bytes_down += down as u64;
        Ok(out)
    }

    /// All groups of `inputs` in one batched round trip
    /// ([`Transport::rounds`]).
    /// The encrypted requests of a batch: one per session group, its input
    /// concatenated from its members' (every member must be in the batch).
    fn units(&self, inputs: &[GroupInput]) -> Result<Vec<Unit>, PrivateError> {
        let mut units: Vec<Unit> = Vec::new();
        for (i, g) in inputs.iter().enumerate() {
            let key = self.session_group(g.layer, g.group)?;
            match units.iter_mut().find(|u| u.key == key) {
                Some(u) => u.inputs.push(i),
                None => units.push(Unit {
                    key,
                    x: g.x.clone(),
                    inputs: vec![i],
                }),
            }
        }
        for u in &mut units {
            let members = &self.client_group(u.key.0, u.key.1)?.members;
            if members.len() == 1 && u.inputs.len() == 1 {
                continue;
            }
            if u.inputs.len() != members.len() {
                return Err(PrivateError::GroupedByLayer {
                    layer: u.key.0 as u32,
                });
            }
            let of_member = |m: (usize, ProjGroup)| {
                u.inputs
                    .iter()
                    .map(|&i| &inputs[i])
                    .find(|g| (g.layer, g.group) == m)
                    .map(|g| &g.x)
            };
            u.x = concat_members(u.key.0, members, of_member)?;
        }
        Ok(units)
    }

    /// `tolerance`: the relative precision the deltas need (0: full), which
    /// sets the response bits asked of the server ([`response_bits`]) and
    /// the error the upload may lose ([`upload_error`]).
    fn many_group_deltas(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, PrivateError> {
        let t0 = Instant::now();
        let units = self.units(inputs)?;
        let (requests, scales): (Vec<GroupRequest>, Vec<InputScales>) = units
            .iter()
            .map(|u| self.encrypt_group(u.key.0, u.key.1, &u.x, tolerance))
            .collect::<Result<Vec<_>, PrivateError>>()?
            .into_iter()
            .unzip();
        let t1 = Instant::now();
        let replies = self.transport.rounds(&requests)?;
        let t2 = Instant::now();
        if replies.len() != requests.len() {
            return Err(PrivateError::ReplyCount {
                replies: replies.len(),
                requests: requests.len(),
            });
        }
        let mut out = vec![GroupDeltas::none(); inputs.len()];
        for ((u, r), (sc, request)) in units.iter().zip(&replies).zip(scales.iter().zip(&requests))
        {
            let t = u.x.dims().first().copied().unwrap_or(0);
            self.carried_up(u.key, t, request);
            self.carried_down(u.key, t, &r.response);
            let deltas = self.decrypt_group(u.key.0, u.key.1, t, &r.response, sc)?;
            for &i in &u.inputs {
                out[i] = member_deltas(&deltas, (inputs[i].layer, inputs[i].group));
            }
        }
        let t3 = Instant::now();
        let server_ms = replies.iter().map(|r| r.server_ms).sum::<Option<f64>>();
        self.account(
            [t0, t1, t2, t3],
            requests.len(),
            1,
            server_ms,
            requests.iter().map(GroupRequest::encoded_len).sum(),
            replies.iter().map(|r| r.response.encoded_len()).sum(),
        );
        Ok(out)
    }

    /// Input values per position of session group `key` (standard LoRA:
    /// d_in, FFA: Σr) and delta values per position (Σd_out).
    fn values_per_row(&self, key: (usize, ProjGroup)) -> (u64, u64) {
        self.groups.get(&key).map_or((0, 0), |g| {
            let plan = g.client.plan();
            let input = match plan.mode {
                Mode::Standard => plan.shape.d_in,
                Mode::Ffa => plan.shape.total_rank(),
            };
            (input as u64, plan.shape.total_out() as u64)
        })
    }

    /// Counts the values `request` carried for `rows` real positions of
    /// session group `key`, and its ciphertexts' capacity ([`crate::WireDensity`]).
    fn carried_up(&mut self, key: (usize, ProjGroup), rows: usize, request: &GroupRequest) {
        let n = self.he.context().degree() as u64;
        let values = self.values_per_row(key).0 * rows as u64;
        self.timings.values_up += values;
        self.timings.capacity_up += n * request.ciphertexts.len() as u64;
    }

    /// As [`Self::carried_up`], for a response.
    fn carried_down(&mut self, key: (usize, ProjGroup), rows: usize, response: &GroupResponse) {
        let n = self.he.context().degree() as u64;
        let values = self.values_per_row(key).1 * rows as u64;
        self.timings.values_down += values;
        self.timings.capacity_down += n * response.ciphertexts.len() as u64;
    }

    /// Books `trips` round trips carrying `groups` group requests; `at` =
    /// before encryption, after it, after the wait for the reply, after
    /// decryption.
    #[allow(clippy::too_many_arguments)]
    fn account(
        &mut self,
        at: [Instant; 4],
        groups: usize,
        trips: u64,
        server_ms: Option<f64>,
        up: usize,
        down: usize,
    ) {
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let round_ms = ms(at[1], at[2]);
        // Pipelined groups overlap on the server and the wire: the server's
        // compute counts only as far as the round trip lasted.
        let busy_ms = server_ms.unwrap_or(0.0);
        let server_ms = busy_ms.min(round_ms);
        let tm = &mut self.timings;
        tm.server_busy_ms += busy_ms;
        tm.rounds += groups as u64;
        tm.round_trips += trips;
        tm.encrypt_ms += ms(at[0], at[1]);
        tm.server_ms += server_ms;
        tm.network_ms += round_ms - server_ms;
        tm.decrypt_ms += ms(at[2], at[3]);
        tm.bytes_up += up as u64;
        tm.bytes_down += down as u64;
    }
}

/// The input of a session group: its members' inputs side by side (T,
/// Σ d_in), in the session's member order. `of_member` finds each.
fn concat_members<'a>(
    layer: usize,
    members: &[(usize, ProjGroup)],
    of_member: impl Fn((usize, ProjGroup)) -> Option<&'a Tensor>,
) -> Result<Tensor, PrivateError> {
    let xs = members
        .iter()
        .map(|&m| {
            of_member(m).ok_or(PrivateError::GroupedByLayer {
                layer: layer as u32,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Tensor::cat(&xs, 1).map_err(|e| PrivateError::Model(e.into()))
}

/// The deltas of one model group (layer, group) out of its session
/// group's.
fn member_deltas(deltas: &SessionDeltas, (layer, group): (usize, ProjGroup)) -> GroupDeltas {
    let mut out = GroupDeltas::none();
    for ((l, proj), d) in deltas {
        if *l == layer && proj.group() == group {
            out.push(*proj, d.clone());
        }
    }
    out
}

/// A [`PrivateError`] as the model's hook error at (`layer`, `group`).
fn model_error(e: PrivateError, layer: usize, group: ProjGroup) -> ModelError {
    match e {
        PrivateError::Model(m) => m,
        other => ModelError::Hook {
            layer,
            proj: group.projs()[0],
            reason: other.to_string(),
        },
    }
}

/// Per projection, the column map from the server's PEFT row layout to the model's: q and k
/// of a GGUF model (interleaved RoPE) are permuted, everything else kept.
pub(crate) fn row_maps(config: &ModelConfig) -> HashMap<Proj, Vec<usize>> {
    let mut maps = HashMap::new();
    if config.rope_style == RopeStyle::Interleaved {
        let to_usize = |v: Vec<u32>| v.into_iter().map(|i| i as usize).collect::<Vec<_>>();
        maps.insert(
            Proj::Q,
            to_usize(gguf_qk_row_permutation(config.num_heads, config.head_dim)),
        );
        maps.insert(
            Proj::K,
            to_usize(gguf_qk_row_permutation(
                config.num_kv_heads,
                config.head_dim,
            )),
        );
    }
    maps
}

/// `out[p][j] = delta[p][map[j]]` for each of the `t` rows.
pub(crate) fn permute_columns(delta: &[f32], t: usize, map: &[usize]) -> Vec<f32> {
    let d = map.len();
    let mut out = Vec::with_capacity(delta.len());
    for row in delta.chunks(d).take(t) {
        out.extend(map.iter().map(|&j| row[j]));
    }
    out
}

impl<T: Transport> DeltaHook for HeHook<T> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        self.group_deltas(layer, group, x)
            .map_err(|e| model_error(e, layer, group))
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.group_of.contains_key(&(layer, group))
    }

    fn deltas_many(&mut self, inputs: &[GroupInput]) -> Result<Vec<GroupDeltas>, ModelError> {
        self.deltas_many_within(inputs, 0.0)
    }

    /// Asks the server for `⌈log2(1/tolerance)⌉ + 1` bits of response
    /// precision relative to each returned ciphertext's output bound (a
    /// worst-case bound, 2²–2⁴ above the largest delta of typical inputs:
    /// [`cipherlora_helora::ResponseCompression`]), at least
    /// [`cipherlora_helora::ResponseCompression::MIN_BITS`]; a tolerance of
    /// 0 asks for the server's default. The bits asked for depend only on
    /// the tolerance, which the caller fixes per trip of a round (never on
    /// the data), so they reveal nothing the trip count does not. The
    /// upload of such a request drops low bits of its ciphertexts'
    /// `c0` within a quarter of the tolerance ([`upload_error`]; a
    /// tolerance of 0, within a quarter of the default response
    /// precision's); their number depends on the tolerance and the
    /// parameters only, so the upload's size reveals no more.
    fn deltas_many_within(
        &mut self,
        inputs: &[GroupInput],
        tolerance: f64,
    ) -> Result<Vec<GroupDeltas>, ModelError> {
        self.many_group_deltas(inputs, tolerance).map_err(|e| {
            let (layer, group) = inputs
                .first()
                .map_or((0, ProjGroup::Qkv), |g| (g.layer, g.group));
            model_error(e, layer, group)
        })
    }

    /// Always: every trip of a fixed point is streamed group by group (a
    /// transport that answers at once, e.g. [`crate::client::InProcess`],
    /// gives the batched result in the same order).
    fn stream(&mut self, _t: usize) -> Option<&mut dyn DeltaStream> {
        Some(self)
    }

    /// Chunks of the session's width, each a streamed trip, for a pass wider
    /// than it on a session grouped by input (a layer-grouped request would
    /// wait for inputs that depend on its own reply). The pass counts one
    /// round trip per group, the latencies on its critical path.
    fn wavefront(&mut self, t: usize) -> Option<Wavefront<'_>> {
        let by_input = self.plan_space().grouping.layers().is_none();
        if !by_input || t <= self.width {
            return None;
        }
        self.trips.wavefront_chunks = t.div_ceil(self.width);
        self.timings.round_trips += self.group_of.len() as u64;
        Some(Wavefront {
            rows: self.width,
            stream: self,
        })
    }

    fn prefill_done(&mut self) {
        self.at_prefill_done = Some(self.timings.clone());
    }
}
