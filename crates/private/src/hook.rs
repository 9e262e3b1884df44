//! The client's HE delta hook.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use candle_core::{Device, Tensor};
use cipherlora_ckks::{CkksParameters, Context};
use cipherlora_helora::{CkksClient, GroupClient};
use cipherlora_model::{
    DeltaHook, GroupDeltas, ModelConfig, ModelError, Proj, ProjGroup, RopeStyle,
    gguf_qk_row_permutation,
};

use crate::PrivateError;
use crate::adapter_groups::AdapterGroups;
use crate::server::SessionOffer;
use crate::transport::Transport;

/// Where the client's time and bytes went, summed over all group rounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeTimings {
    /// Group round trips.
    pub rounds: u64,
    /// Packing + encryption (incl. FFA's A·x), ms.
    pub encrypt_ms: f64,
    /// Server compute, ms (as reported by the transport).
    pub server_ms: f64,
    /// Round trip minus server compute (network, serialisation), ms.
    pub network_ms: f64,
    /// Decryption + unpacking + row mapping, ms.
    pub decrypt_ms: f64,
    /// Request bytes sent.
    pub bytes_up: u64,
    /// Response bytes received.
    pub bytes_down: u64,
}

impl HeTimings {
    /// Adds `other`'s counters to these.
    pub fn add(&mut self, other: &HeTimings) {
        self.rounds += other.rounds;
        self.encrypt_ms += other.encrypt_ms;
        self.server_ms += other.server_ms;
        self.network_ms += other.network_ms;
        self.decrypt_ms += other.decrypt_ms;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
    }

    /// Subtracts `earlier` (a snapshot of the same counters) from these.
    pub fn subtract(&mut self, earlier: &HeTimings) {
        self.rounds -= earlier.rounds.min(self.rounds);
        self.encrypt_ms -= earlier.encrypt_ms;
        self.server_ms -= earlier.server_ms;
        self.network_ms -= earlier.network_ms;
        self.decrypt_ms -= earlier.decrypt_ms;
        self.bytes_up -= earlier.bytes_up.min(self.bytes_up);
        self.bytes_down -= earlier.bytes_down.min(self.bytes_down);
    }
}

struct ClientGroup {
    client: GroupClient,
    projs: Vec<Proj>,
}

/// A [`DeltaHook`] whose deltas come from the adapter server under CKKS.
///
/// Holds the only secret key of the session. Every decrypted value stays in
/// this process: it is added to the model's projections and never sent back
/// (threat model, guarantee 2).
pub struct HeHook<T: Transport> {
    he: CkksClient,
    groups: HashMap<(usize, ProjGroup), ClientGroup>,
    transport: T,
    /// Row maps from the PEFT layout into the model's (GGUF q/k permutation).
    row_maps: HashMap<Proj, Vec<usize>>,
    timings: HeTimings,
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
    /// `open(galois_key_bytes)`, which returns the transport.
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
        open: impl FnOnce(&[u8]) -> Result<T, PrivateError>,
    ) -> Result<Self, PrivateError> {
        let ctx = Context::new(CkksParameters::preset(offer.preset)?)?;
        let he = CkksClient::new(&ctx)?;
        let mut steps = BTreeSet::new();
        let mut groups = HashMap::with_capacity(offer.groups.len());
        for og in &offer.groups {
            steps.extend(og.plan.galois_steps()?);
            let client = match &og.public_a {
                Some(a) => GroupClient::ffa(&og.plan, a)?,
                None => GroupClient::standard(&og.plan)?,
            };
            let projs = og.projections.clone();
            groups.insert((og.layer, og.group), ClientGroup { client, projs });
        }
        let steps: Vec<i64> = steps.into_iter().collect();
        let keys = he.galois_keys(&steps).to_bytes();
        let transport = open(&keys)?;
        let mut row_maps = HashMap::new();
        if config.rope_style == RopeStyle::Interleaved {
            let to_usize = |v: Vec<u32>| v.into_iter().map(|i| i as usize).collect::<Vec<_>>();
            row_maps.insert(
                Proj::Q,
                to_usize(gguf_qk_row_permutation(config.num_heads, config.head_dim)),
            );
            row_maps.insert(
                Proj::K,
                to_usize(gguf_qk_row_permutation(
                    config.num_kv_heads,
                    config.head_dim,
                )),
            );
        }
        Ok(Self {
            he,
            groups,
            transport,
            row_maps,
            timings: HeTimings::default(),
        })
    }

    /// Time and bytes so far.
    #[must_use]
    pub fn timings(&self) -> &HeTimings {
        &self.timings
    }

    /// The transport (e.g. to read its counters).
    #[must_use]
    pub fn transport(&self) -> &T {
        &self.transport
    }

    fn group_deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, PrivateError> {
        let g = self
            .groups
            .get(&(layer, group))
            .ok_or(PrivateError::UnknownGroup {
                layer: layer as u32,
                group: AdapterGroups::group_index(group),
            })?;
        let (t, _) = x.dims2().map_err(|e| PrivateError::Model(e.into()))?;
        let xs = x
            .flatten_all()
            .and_then(|x| x.to_vec1::<f32>())
            .map_err(|e| PrivateError::Model(e.into()))?;

        let t0 = Instant::now();
        let request = g.client.request(
            &self.he,
            layer as u32,
            AdapterGroups::group_index(group),
            &xs,
        )?;
        let t1 = Instant::now();
        let reply = self.transport.round(&request)?;
        let t2 = Instant::now();
        let deltas = g.client.deltas(&self.he, &reply.response)?;
        let mut out = GroupDeltas::none();
        for (&proj, delta) in g.projs.iter().zip(deltas) {
            let d_out = delta.len() / t;
            let delta = match self.row_maps.get(&proj) {
                Some(map) => permute_columns(&delta, t, map),
                None => delta,
            };
            let tensor = Tensor::from_vec(delta, (t, d_out), &Device::Cpu)
                .map_err(|e| PrivateError::Model(e.into()))?;
            out.push(proj, tensor);
        }
        let t3 = Instant::now();

        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let round_ms = ms(t1, t2);
        let server_ms = reply.server_ms.unwrap_or(0.0).min(round_ms);
        let tm = &mut self.timings;
        tm.rounds += 1;
        tm.encrypt_ms += ms(t0, t1);
        tm.server_ms += server_ms;
        tm.network_ms += round_ms - server_ms;
        tm.decrypt_ms += ms(t2, t3);
        tm.bytes_up += request.byte_len() as u64;
        tm.bytes_down += reply.response.byte_len() as u64;
        Ok(out)
    }
}

/// `out[p][j] = delta[p][map[j]]` for each of the `t` rows.
fn permute_columns(delta: &[f32], t: usize, map: &[usize]) -> Vec<f32> {
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
        self.group_deltas(layer, group, x).map_err(|e| match e {
            PrivateError::Model(m) => m,
            other => ModelError::Hook {
                layer,
                proj: group.projs()[0],
                reason: other.to_string(),
            },
        })
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        self.groups.contains_key(&(layer, group))
    }
}
