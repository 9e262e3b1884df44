//! The HE hook's streamed trips ([`DeltaStream`]): each session group's
//! request leaves as soon as the client's pass has produced all of its
//! members' inputs, and its reply is decrypted when the next pass first
//! needs one of them.
//!
//! Per trip the server sees what a batched trip shows it: one request per
//! session group, of the session's width, with the trip's response
//! precision (fixed per trip index, never by the data). Only the requests'
//! timing is finer.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::Tensor;
use cipherlora_helora::InputScales;
use cipherlora_model::{DeltaStream, GroupDeltas, GroupInput, ModelError, ProjGroup, TripId};
use prost::Message;

use super::{HeHook, SessionDeltas, concat_members, member_deltas, model_error};
use crate::PrivateError;
use crate::client::Transport;
use crate::protocol::group_index;

/// One session group's request of a trip, from its first member's input to
/// its decrypted deltas.
enum Unit {
    /// Members' inputs gathered so far (a layer's q,k,v input waits for its
    /// o input, and for the next layers' inputs, when the session is
    /// grouped by layers).
    Gathering(Vec<GroupInput>),
    /// Sent; the reply is awaited. Input scales and the rows that are not
    /// padding, for decryption.
    Sent(InputScales, usize),
}

/// A trip in flight.
struct Trip {
    /// The transport's round number.
    round: u64,
    /// The relative precision the trip's deltas need (0: full;
    /// [`HeHook::encrypt_group`]).
    tolerance: f64,
    /// Session groups not yet answered, by session group key.
    units: HashMap<(usize, ProjGroup), Unit>,
    /// Decrypted deltas not yet taken, by model group.
    ready: HashMap<(usize, ProjGroup), GroupDeltas>,
    /// For a wavefront's chunk, the groups not yet taken: its sends and
    /// receives alternate, so an empty trip is not yet a finished one.
    untaken: Option<usize>,
}

/// The trips of one hook.
#[derive(Default)]
pub(super) struct StreamTrips {
    next: u64,
    trips: HashMap<TripId, Trip>,
    /// Trips still to open for a wavefront pass, whose latencies were
    /// counted per group when it began.
    pub(super) wavefront_chunks: usize,
}

impl StreamTrips {
    fn trip(&mut self, id: TripId) -> Result<&mut Trip, PrivateError> {
        self.trips.get_mut(&id).ok_or(PrivateError::NotInFlight {
            round: id.0,
            layer: 0,
            group: 0,
        })
    }
}

impl<T: Transport> HeHook<T> {
    /// Gathers `input`; sends its session group's request once every member
    /// is there.
    fn stream_send(&mut self, id: TripId, input: &GroupInput) -> Result<(), PrivateError> {
        let key = self.session_group(input.layer, input.group)?;
        let members = self.client_group(key.0, key.1)?.members.clone();
        let trip = self.trips.trip(id)?;
        let (round, tolerance) = (trip.round, trip.tolerance);
        let unit = trip
            .units
            .entry(key)
            .or_insert_with(|| Unit::Gathering(Vec::with_capacity(members.len())));
        let Unit::Gathering(gathered) = unit else {
            return Err(PrivateError::GroupedByLayer {
                layer: key.0 as u32,
            });
        };
        gathered.push(input.clone());
        if gathered.len() < members.len() {
            return Ok(());
        }
        let x = if members.len() == 1 {
            input.x.clone()
        } else {
            let of_member = |m: (usize, ProjGroup)| {
                gathered
                    .iter()
                    .find(|g| (g.layer, g.group) == m)
                    .map(|g| &g.x)
            };
            concat_members(key.0, &members, of_member)?
        };
        // A wavefront's last chunk may be shorter than the session's width.
        let t = x.dims().first().copied().unwrap_or(0);
        let x = pad_rows(&x, self.width)?;
        let t0 = Instant::now();
        let (request, scales) = self.encrypt_group(key.0, key.1, &x, tolerance)?;
        let t1 = Instant::now();
        let answered = self.transport.send(round, &request)?;
        let t2 = Instant::now();
        let up = request.encoded_len();
        self.carried_up(key, t, &request);
        match answered {
            // Answered at once (an in-process transport): decrypt now.
            Some(reply) => {
                self.carried_down(key, t, &reply.response);
                let deltas = self.decrypt_rows(key, t, &reply.response, &scales)?;
                let t3 = Instant::now();
                self.file(id, key, &members, &deltas)?;
                let down = reply.response.encoded_len();
                self.account([t0, t1, t2, t3], 1, 0, reply.server_ms, up, down);
            }
            None => {
                self.trips
                    .trip(id)?
                    .units
                    .insert(key, Unit::Sent(scales, t));
                self.account([t0, t1, t1, t1], 1, 0, None, up, 0);
            }
        }
        Ok(())
    }

    /// Decrypts a response of the session's width and keeps its first `rows`
    /// rows (the rest were padding).
    fn decrypt_rows(
        &self,
        key: (usize, ProjGroup),
        rows: usize,
        response: &cipherlora_proto::v1::GroupResponse,
        scales: &InputScales,
    ) -> Result<SessionDeltas, PrivateError> {
        let width = rows.max(self.width);
        let deltas = self.decrypt_group(key.0, key.1, width, response, scales)?;
        if rows == width {
            return Ok(deltas);
        }
        deltas
            .into_iter()
            .map(|(at, d)| Ok((at, d.narrow(0, 0, rows).map_err(candle)?)))
            .collect()
    }

    /// Files a session group's decrypted deltas under its members.
    fn file(
        &mut self,
        id: TripId,
        key: (usize, ProjGroup),
        members: &[(usize, ProjGroup)],
        deltas: &SessionDeltas,
    ) -> Result<(), PrivateError> {
        let trip = self.trips.trip(id)?;
        trip.units.remove(&key);
        for &m in members {
            trip.ready.insert(m, member_deltas(deltas, m));
        }
        Ok(())
    }

    /// The deltas of (`layer`, `group`), waiting for its session group's
    /// reply if needed.
    fn stream_receive(
        &mut self,
        id: TripId,
        layer: usize,
        group: ProjGroup,
    ) -> Result<GroupDeltas, PrivateError> {
        let key = self.session_group(layer, group)?;
        let trip = self.trips.trip(id)?;
        if let Some(d) = trip.ready.remove(&(layer, group)) {
            self.forget_if_done(id);
            return Ok(d);
        }
        let round = trip.round;
        let Some(Unit::Sent(scales, t)) = trip.units.remove(&key) else {
            return Err(PrivateError::NotInFlight {
                round: id.0,
                layer: layer as u32,
                group: group_index(group),
            });
        };
        let members = self.client_group(key.0, key.1)?.members.clone();
        let t1 = Instant::now();
        let reply = self
            .transport
            .receive(round, key.0 as u32, group_index(key.1))?;
        let t2 = Instant::now();
        self.carried_down(key, t, &reply.response);
        let deltas = self.decrypt_rows(key, t, &reply.response, &scales)?;
        let t3 = Instant::now();
        self.file(id, key, &members, &deltas)?;
        let down = reply.response.encoded_len();
        self.account([t1, t1, t2, t3], 0, 0, reply.server_ms, 0, down);
        let d = self
            .trips
            .trip(id)?
            .ready
            .remove(&(layer, group))
            .unwrap_or_default();
        self.forget_if_done(id);
        Ok(d)
    }

    /// Counts a group taken from trip `id`, and drops the trip when nothing
    /// is left in flight or to take (a wavefront's chunk: once every group
    /// was taken).
    fn forget_if_done(&mut self, id: TripId) {
        let Some(t) = self.trips.trips.get_mut(&id) else {
            return;
        };
        let done = match &mut t.untaken {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => t.units.is_empty() && t.ready.is_empty(),
        };
        if done {
            self.trips.trips.remove(&id);
        }
    }
}

impl<T: Transport> DeltaStream for HeHook<T> {
    /// A new service round; the trip counts as one round trip (a
    /// wavefront's chunk does not: [`DeltaHook::wavefront`]).
    fn open_trip(&mut self, tolerance: Option<f64>) -> Result<TripId, ModelError> {
        self.trips.next += 1;
        let id = TripId(self.trips.next);
        // A wavefront's chunk: its latencies were counted per group when
        // the pass began, and it ends when every group was taken.
        let untaken = match self.trips.wavefront_chunks.checked_sub(1) {
            Some(left) => {
                self.trips.wavefront_chunks = left;
                Some(self.group_of.len())
            }
            None => {
                self.timings.round_trips += 1;
                None
            }
        };
        let trip = Trip {
            round: self.transport.open_round(),
            tolerance: tolerance.unwrap_or(0.0),
            units: HashMap::new(),
            ready: HashMap::new(),
            untaken,
        };
        self.trips.trips.insert(id, trip);
        Ok(id)
    }

    fn send(&mut self, trip: TripId, input: &GroupInput) -> Result<(), ModelError> {
        self.stream_send(trip, input)
            .map_err(|e| model_error(e, input.layer, input.group))
    }

    fn receive(
        &mut self,
        trip: TripId,
        layer: usize,
        group: ProjGroup,
    ) -> Result<GroupDeltas, ModelError> {
        self.stream_receive(trip, layer, group)
            .map_err(|e| model_error(e, layer, group))
    }
}

fn candle(e: candle_core::Error) -> PrivateError {
    PrivateError::Model(e.into())
}

/// `x` (T, d) with zero rows appended up to `width` (unchanged when T ≥ `width`).
pub(super) fn pad_rows(x: &Tensor, width: usize) -> Result<Tensor, PrivateError> {
    let (t, d) = x.dims2().map_err(candle)?;
    if t >= width {
        return Ok(x.clone());
    }
    let pad = Tensor::zeros((width - t, d), x.dtype(), x.device()).map_err(candle)?;
    Tensor::cat(&[x, &pad], 0).map_err(candle)
}
