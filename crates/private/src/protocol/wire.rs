//! The plan request and the session offer beside their protobuf forms
//! (`cipherlora.adapter.v1.PlanRequest`, `SessionOffer`). Decoders check every count, range and
//! plan against the offer and report bad input as
//! [`HeloraError::Malformed`](cipherlora_helora::HeloraError::Malformed); never panic.

use cipherlora_ckks::CkksParameters;
use cipherlora_model::{Proj, ProjGroup};
use cipherlora_proto::v1;

use super::codes::{
    group_of, kind_code, kind_of, malformed, preset_from_name, preset_name, proj_code, proj_of,
    to_u32, to_usize,
};
use super::offer::{
    Grouping, LoraKind, MAX_COST_RATIO, MIN_COST_RATIO, OfferedGroup, SessionOffer, group_index,
    is_acceptance_hint,
};
use super::plan::{decode_plan, encode_plan};
use crate::PrivateError;

/// Largest verify width T a plan request may ask for.
pub const MAX_T: usize = 256;
/// Most adapted (layer, group) pairs in one offer.
pub const MAX_GROUPS: usize = 1 << 14;

/// What the client asks for when opening a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanRequest {
    /// Positions per verify pass (K drafts + 1), `1..=MAX_T`.
    pub t: usize,
    /// `true`: only return the offer for `t` (no keys read).
    pub offer_only: bool,
    /// The grouping asked for (by layers only for FFA adapters).
    pub grouping: Grouping,
}

/// The wire form of a grouping: 0 by input, n for [`Grouping::ByLayers`]`(n)`.
fn layers_per_group(g: Grouping) -> u32 {
    g.layers().map_or(0, to_u32)
}

/// The grouping `code` names; `by_layers_ok`: whether runs of layers may be offered.
fn grouping_of(
    code: u32,
    by_layers_ok: bool,
    what: &'static str,
) -> Result<Grouping, PrivateError> {
    match to_usize(code) {
        0 => Ok(Grouping::ByInput),
        n if n <= Grouping::MAX_LAYERS && by_layers_ok => Ok(Grouping::ByLayers(n)),
        _ => Err(malformed(what, "layers per group out of range")),
    }
}

impl PlanRequest {
    /// The protobuf form.
    #[must_use]
    pub fn to_proto(&self) -> v1::PlanRequest {
        v1::PlanRequest {
            masked: false,
            positions: to_u32(self.t),
            offer_only: self.offer_only,
            layers_per_group: layers_per_group(self.grouping),
        }
    }

    /// Reads a plan request. Errors: [`PrivateError::Helora`] (`Malformed`) for T outside
    /// 1..=[`MAX_T`] or more than [`Grouping::MAX_LAYERS`] layers per group.
    pub fn from_proto(m: &v1::PlanRequest) -> Result<Self, PrivateError> {
        let t = to_usize(m.positions);
        if t == 0 || t > MAX_T {
            return Err(malformed("plan request", "T out of range"));
        }
        Ok(Self {
            t,
            offer_only: m.offer_only,
            grouping: grouping_of(m.layers_per_group, true, "plan request")?,
        })
    }
}

/// The protobuf form of an offer; FFA lora_A travels in the adapter's info
/// ([`super::encode_public_a`]), not here.
#[must_use]
pub fn encode_offer(offer: &SessionOffer) -> v1::SessionOffer {
    v1::SessionOffer {
        ckks_preset: preset_name(offer.preset).to_string(),
        positions: to_u32(offer.t),
        kind: kind_code(offer.kind).into(),
        layers_per_group: layers_per_group(offer.grouping),
        server_cost_ratio: offer.server_cost_ratio,
        acceptance: offer.acceptance,
        groups: offer
            .groups
            .iter()
            .map(|g| v1::OfferedGroup {
                ring: None,
                layer: to_u32(g.layer),
                group: group_index(g.group),
                projections: g
                    .projections
                    .iter()
                    .map(|&(layer, p)| v1::AdaptedProjection {
                        layer: to_u32(layer),
                        projection: proj_code(p).into(),
                    })
                    .collect(),
                plan: Some(encode_plan(&g.plan)),
            })
            .collect(),
    }
}

/// Reads and validates an offer: preset, T, kind, grouping, cost ratio, acceptance hint, at most
/// [`MAX_GROUPS`] groups, each group's projections (in its group or run of layers, in forward
/// order, not repeated) and plan (matching the offer's T, slots and kind and its projections).
/// Errors: [`PrivateError::Helora`].
pub fn decode_offer(m: &v1::SessionOffer) -> Result<SessionOffer, PrivateError> {
    let bad = |reason| malformed("session offer", reason);
    let preset = preset_from_name(&m.ckks_preset).ok_or_else(|| bad("unknown preset"))?;
    let slots = CkksParameters::preset(preset)?.slots();
    let t = to_usize(m.positions);
    if t == 0 || t > MAX_T {
        return Err(bad("T out of range"));
    }
    let kind = kind_of(m.kind, "session offer")?;
    let grouping = grouping_of(m.layers_per_group, kind == LoraKind::Ffa, "session offer")?;
    if !(MIN_COST_RATIO..=MAX_COST_RATIO).contains(&m.server_cost_ratio) {
        return Err(bad("server cost ratio out of range"));
    }
    if m.acceptance.is_some_and(|a| !is_acceptance_hint(a)) {
        return Err(bad("acceptance hint out of (0, 1)"));
    }
    if m.groups.len() > MAX_GROUPS {
        return Err(bad("too many groups"));
    }
    let mode = kind.mode();
    let mut groups: Vec<OfferedGroup> = Vec::with_capacity(m.groups.len());
    for g in &m.groups {
        let (layer, group) = (to_usize(g.layer), group_of(g.group, "session offer")?);
        if groups.iter().any(|o| o.layer == layer && o.group == group) {
            return Err(bad("group offered twice"));
        }
        let projections = offered_projections(g, (layer, group), grouping)?;
        let plan = decode_plan(g.plan.as_ref().ok_or_else(|| bad("no plan"))?)?;
        if plan.t != t || plan.slots != slots || plan.mode != mode {
            return Err(bad("plan does not match the offer's T, slots or kind"));
        }
        if plan.shape.ranks.len() != projections.len() {
            return Err(bad("plan shape does not match the projections"));
        }
        groups.push(OfferedGroup {
            layer,
            group,
            projections,
            plan,
            public_a: None,
        });
    }
    Ok(SessionOffer {
        preset,
        t,
        kind,
        grouping,
        groups,
        server_cost_ratio: m.server_cost_ratio,
        acceptance: m.acceptance,
    })
}

/// The projections of offered group `(layer, group)`: by input, its own projections once each;
/// by layers, forward order from the keyed group over at most n layers.
pub(crate) fn offered_projections(
    g: &v1::OfferedGroup,
    (layer, group): (usize, ProjGroup),
    grouping: Grouping,
) -> Result<Vec<(usize, Proj)>, PrivateError> {
    let bad = |reason| malformed("session offer", reason);
    let most = match grouping {
        Grouping::ByInput => group.projs().len(),
        Grouping::ByLayers(n) => n * Proj::ALL.len(),
    };
    if g.projections.is_empty() || g.projections.len() > most {
        return Err(bad("projection count out of range"));
    }
    let mut projections: Vec<(usize, Proj)> = Vec::with_capacity(g.projections.len());
    let mut layers = 0;
    for ap in &g.projections {
        let (l, p) = (to_usize(ap.layer), proj_of(ap.projection, "session offer")?);
        let fits = match grouping {
            Grouping::ByInput => {
                l == layer && group.projs().contains(&p) && !projections.contains(&(l, p))
            }
            Grouping::ByLayers(n) => match projections.last() {
                None => l == layer && p.group() == group,
                Some(&(last_l, last_p)) => {
                    if l != last_l {
                        layers += 1;
                    }
                    (last_l, last_p) < (l, p) && layers < n
                }
            },
        };
        if !fits {
            return Err(bad("projection not in group, repeated or out of order"));
        }
        projections.push((l, p));
    }
    Ok(projections)
}
