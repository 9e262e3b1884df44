//! Byte encodings inside the service's opaque fields: plan request, session offer and public FFA
//! lora_A. Decoders check counts before allocating and report bad bytes as
//! [`HeloraError::Malformed`](cipherlora_helora::HeloraError::Malformed); never panic.

use cipherlora_ckks::{CkksParameters, Preset};
use cipherlora_helora::wire::{MAX_PROJECTIONS, decode_plan, encode_plan};
use cipherlora_helora::{HeloraError, Mode};
use cipherlora_model::{Proj, ProjGroup};

use crate::PrivateError;
use crate::server::{AdapterGroups, LoraKind};
use crate::server::{
    Grouping, MAX_COST_RATIO, MIN_COST_RATIO, OfferedGroup, SessionOffer, is_acceptance_hint,
};

const REQUEST_MAGIC: &[u8; 4] = b"CLPR";
const OFFER_MAGIC: &[u8; 4] = b"CLOF";
const PUBLIC_A_MAGIC: &[u8; 4] = b"CLPA";
/// Offer format version.
const VERSION: u8 = 4;

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

/// The grouping's wire code: 0 by input, n for [`Grouping::ByLayers`]`(n)`.
fn grouping_code(g: Grouping) -> u8 {
    g.layers().map_or(0, |n| u8::try_from(n).unwrap_or(u8::MAX))
}

impl PlanRequest {
    /// 10 bytes: magic, version, T (u32), flags (bit 0 offer only, bits 1–7 layers per group).
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(10);
        o.extend_from_slice(REQUEST_MAGIC);
        o.push(VERSION);
        put_u32(&mut o, self.t);
        o.push(u8::from(self.offer_only) | (grouping_code(self.grouping).min(127) << 1));
        o
    }

    /// Parses a plan request. Errors: [`PrivateError::Helora`] for bad bytes or T outside
    /// 1..=[`MAX_T`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PrivateError> {
        let mut r = Reader::new(bytes, "plan request");
        r.header(REQUEST_MAGIC)?;
        let t = r.usize()?;
        if t == 0 || t > MAX_T {
            return Err(r.bad("T out of range"));
        }
        let flags = r.u8()?;
        let grouping = match usize::from(flags >> 1) {
            0 => Grouping::ByInput,
            n if n <= Grouping::MAX_LAYERS => Grouping::ByLayers(n),
            _ => return Err(r.bad("layers per group out of range")),
        };
        r.finish()?;
        Ok(Self {
            t,
            offer_only: flags & 1 == 1,
            grouping,
        })
    }
}

/// Stable wire name of a CKKS preset.
#[must_use]
pub fn preset_name(p: Preset) -> &'static str {
    match p {
        Preset::N8192Depth1 => "n8192-depth1",
        Preset::N8192Depth2 => "n8192-depth2",
        Preset::N16384Depth1 => "n16384-depth1",
        Preset::N16384Depth2 => "n16384-depth2",
        Preset::N8192Depth2Fast => "n8192-depth2-fast",
        Preset::N16384Depth2Fast => "n16384-depth2-fast",
        _ => "unknown",
    }
}

const PRESETS: [Preset; 6] = [
    Preset::N8192Depth1,
    Preset::N8192Depth2,
    Preset::N16384Depth1,
    Preset::N16384Depth2,
    Preset::N8192Depth2Fast,
    Preset::N16384Depth2Fast,
];

/// The preset called `name` by [`preset_name`].
#[must_use]
pub fn preset_from_name(name: &str) -> Option<Preset> {
    PRESETS.into_iter().find(|&p| preset_name(p) == name)
}

/// Serialises an offer; FFA lora_A travels separately ([`encode_public_a`]).
#[must_use]
pub fn encode_offer(offer: &SessionOffer) -> Vec<u8> {
    let mut o = Vec::new();
    o.extend_from_slice(OFFER_MAGIC);
    o.push(VERSION);
    o.push(preset_code(offer.preset));
    put_u32(&mut o, offer.t);
    o.push(kind_code(offer.kind));
    o.push(grouping_code(offer.grouping));
    o.extend_from_slice(&offer.server_cost_ratio.to_le_bytes());
    match offer.acceptance {
        Some(a) => {
            o.push(1);
            o.extend_from_slice(&a.to_le_bytes());
        }
        None => o.push(0),
    }
    put_u32(&mut o, offer.groups.len());
    for g in &offer.groups {
        put_u32(&mut o, g.layer);
        o.push(AdapterGroups::group_index(g.group) as u8);
        put_u32(&mut o, g.projections.len());
        for &(layer, p) in &g.projections {
            put_u32(&mut o, layer);
            o.push(proj_code(p));
        }
        let plan = encode_plan(&g.plan);
        put_u32(&mut o, plan.len());
        o.extend_from_slice(&plan);
        // Inline lora_A (flag 1) is still read, never written.
        o.push(0);
    }
    o
}

/// Parses and validates an offer from [`encode_offer`] (plans, groups ≤ [`MAX_GROUPS`], lora_A).
/// Errors: [`PrivateError::Helora`].
pub fn decode_offer(bytes: &[u8]) -> Result<SessionOffer, PrivateError> {
    let mut r = Reader::new(bytes, "session offer");
    r.header(OFFER_MAGIC)?;
    let preset = *PRESETS
        .get(r.u8()? as usize)
        .ok_or_else(|| r.bad("unknown preset"))?;
    let slots = CkksParameters::preset(preset)?.slots();
    let t = r.usize()?;
    if t == 0 || t > MAX_T {
        return Err(r.bad("T out of range"));
    }
    let kind = match r.u8()? {
        0 => LoraKind::Ffa,
        1 => LoraKind::Standard,
        _ => return Err(r.bad("unknown LoRA kind")),
    };
    let grouping = match usize::from(r.u8()?) {
        0 => Grouping::ByInput,
        n if n <= Grouping::MAX_LAYERS && kind == LoraKind::Ffa => Grouping::ByLayers(n),
        _ => return Err(r.bad("unknown grouping")),
    };
    let server_cost_ratio = r.f64()?;
    if !(MIN_COST_RATIO..=MAX_COST_RATIO).contains(&server_cost_ratio) {
        return Err(r.bad("server cost ratio out of range"));
    }
    let acceptance = match r.u8()? {
        0 => None,
        1 => match r.f64()? {
            a if is_acceptance_hint(a) => Some(a),
            _ => return Err(r.bad("acceptance hint out of (0, 1)")),
        },
        _ => return Err(r.bad("bad acceptance flag")),
    };
    let n = r.usize()?;
    if n > MAX_GROUPS {
        return Err(r.bad("too many groups"));
    }
    let mut groups: Vec<OfferedGroup> = Vec::with_capacity(n.min(r.left() / 16));
    for _ in 0..n {
        let layer = r.usize()?;
        let code = r.u8()?;
        let group = group_of(&r, code)?;
        if groups.iter().any(|g| g.layer == layer && g.group == group) {
            return Err(r.bad("group offered twice"));
        }
        let np = r.usize()?;
        let most = match grouping {
            Grouping::ByInput => group.projs().len(),
            Grouping::ByLayers(n) => n * Proj::ALL.len(),
        };
        if np == 0 || np > most {
            return Err(r.bad("projection count out of range"));
        }
        let mut projections: Vec<(usize, Proj)> = Vec::with_capacity(np);
        let mut layers = 0;
        for _ in 0..np {
            let l = r.usize()?;
            let p = *Proj::ALL
                .get(r.u8()? as usize)
                .ok_or_else(|| r.bad("unknown projection"))?;
            let fits = match grouping {
                Grouping::ByInput => {
                    l == layer && group.projs().contains(&p) && !projections.contains(&(l, p))
                }
                // Forward order from the keyed group, over at most n layers.
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
                return Err(r.bad("projection not in group, repeated or out of order"));
            }
            projections.push((l, p));
        }
        let plan_len = r.usize()?;
        let plan = decode_plan(r.take(plan_len)?)?;
        let mode = match kind {
            LoraKind::Ffa => Mode::Ffa,
            LoraKind::Standard => Mode::Standard,
        };
        if plan.t != t || plan.slots != slots || plan.mode != mode {
            return Err(r.bad("plan does not match the offer's T, slots or kind"));
        }
        if plan.shape.ranks.len() != np || np > MAX_PROJECTIONS {
            return Err(r.bad("plan shape does not match the projections"));
        }
        let public_a = match r.u8()? {
            0 => None,
            1 if kind == LoraKind::Ffa => {
                let mut a = Vec::with_capacity(np);
                for &rank in &plan.shape.ranks {
                    a.push(r.f32s(rank.checked_mul(plan.shape.d_in))?);
                }
                Some(a)
            }
            _ => return Err(r.bad("bad public lora_A flag")),
        };
        groups.push(OfferedGroup {
            layer,
            group,
            projections,
            plan,
            public_a,
        });
    }
    r.finish()?;
    Ok(SessionOffer {
        preset,
        t,
        kind,
        grouping,
        groups,
        server_cost_ratio,
        acceptance,
    })
}

/// Serialises an FFA adapter's public lora_A, per group and projection.
#[must_use]
pub fn encode_public_a(groups: &AdapterGroups) -> Vec<u8> {
    let mut o = Vec::new();
    o.extend_from_slice(PUBLIC_A_MAGIC);
    o.push(VERSION);
    put_u32(&mut o, groups.groups.len());
    for g in &groups.groups {
        put_u32(&mut o, g.layer);
        o.push(AdapterGroups::group_index(g.group) as u8);
        put_u32(&mut o, g.adapter.projections.len());
        for p in &g.adapter.projections {
            o.push(Proj::from_peft_name(&p.name).map_or(u8::MAX, proj_code));
            put_u32(&mut o, p.rank);
            put_u32(&mut o, g.adapter.d_in);
            put_f32s(&mut o, &p.a);
        }
    }
    o
}

/// Puts an FFA adapter's public lora_A into a decoded offer. Errors: [`PrivateError::Helora`] for a
/// missing or misshapen lora_A.
pub fn attach_public_a(offer: &mut SessionOffer, a: &[PublicA]) -> Result<(), PrivateError> {
    if offer.kind != LoraKind::Ffa {
        return Ok(());
    }
    let bad = |reason| {
        PrivateError::Helora(HeloraError::Malformed {
            what: "public lora_A",
            reason,
        })
    };
    for g in &mut offer.groups {
        let mine = g
            .projections
            .iter()
            .map(|&(layer, proj)| {
                a.iter()
                    .find(|m| m.layer == layer && m.proj == proj)
                    .ok_or_else(|| bad("no lora_A for an offered projection"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Each projection's columns start after the inputs of the groups before it.
        let mut offsets = Vec::with_capacity(mine.len());
        let mut d_in = 0;
        for (i, m) in mine.iter().enumerate() {
            if i > 0 && (m.layer, m.proj.group()) != (mine[i - 1].layer, mine[i - 1].proj.group()) {
                d_in += mine[i - 1].d_in;
            }
            offsets.push(d_in);
        }
        d_in += mine.last().map_or(0, |m| m.d_in);
        if d_in != g.plan.shape.d_in {
            return Err(bad("lora_A shape differs from the plan's"));
        }
        let mut mats = Vec::with_capacity(mine.len());
        for ((i, m), &offset) in mine.iter().enumerate().zip(&offsets) {
            if m.rank != g.plan.shape.ranks[i] {
                return Err(bad("lora_A shape differs from the plan's"));
            }
            let mut padded = vec![0.0f32; m.rank * d_in];
            for (row, src) in m.a.chunks(m.d_in.max(1)).enumerate() {
                padded[row * d_in + offset..][..src.len()].copy_from_slice(src);
            }
            mats.push(padded);
        }
        g.public_a = Some(mats);
    }
    Ok(())
}

/// One projection's public lora_A from [`decode_public_a`].
#[derive(Debug, Clone, PartialEq)]
pub struct PublicA {
    /// Decoder layer.
    pub layer: usize,
    /// The projection.
    pub proj: Proj,
    /// Rank r.
    pub rank: usize,
    /// Input width d_in.
    pub d_in: usize,
    /// r × d_in values, row-major.
    pub a: Vec<f32>,
}

/// Parses [`encode_public_a`] bytes. Errors: [`PrivateError::Helora`] (`Malformed`).
pub fn decode_public_a(bytes: &[u8]) -> Result<Vec<PublicA>, PrivateError> {
    let mut r = Reader::new(bytes, "public lora_A");
    r.header(PUBLIC_A_MAGIC)?;
    let n = r.usize()?;
    if n > MAX_GROUPS {
        return Err(r.bad("too many groups"));
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let layer = r.usize()?;
        let code = r.u8()?;
        let group = group_of(&r, code)?;
        let np = r.usize()?;
        if np == 0 || np > group.projs().len() {
            return Err(r.bad("projection count out of range"));
        }
        for _ in 0..np {
            let proj = *Proj::ALL
                .get(r.u8()? as usize)
                .ok_or_else(|| r.bad("unknown projection"))?;
            if !group.projs().contains(&proj) {
                return Err(r.bad("projection not in group"));
            }
            let rank = r.usize()?;
            let d_in = r.usize()?;
            let a = r.f32s(rank.checked_mul(d_in))?;
            out.push(PublicA {
                layer,
                proj,
                rank,
                d_in,
                a,
            });
        }
    }
    r.finish()?;
    Ok(out)
}

fn group_of(r: &Reader<'_>, code: u8) -> Result<ProjGroup, PrivateError> {
    ProjGroup::ALL
        .into_iter()
        .find(|&g| AdapterGroups::group_index(g) == u32::from(code))
        .ok_or_else(|| r.bad("unknown group"))
}

fn preset_code(p: Preset) -> u8 {
    PRESETS
        .iter()
        .position(|&q| q == p)
        .map_or(u8::MAX, |i| i as u8)
}

fn kind_code(k: LoraKind) -> u8 {
    match k {
        LoraKind::Ffa => 0,
        LoraKind::Standard => 1,
    }
}

fn proj_code(p: Proj) -> u8 {
    Proj::ALL
        .iter()
        .position(|&q| q == p)
        .map_or(u8::MAX, |i| i as u8)
}

fn put_u32(o: &mut Vec<u8>, v: usize) {
    o.extend_from_slice(&(v as u32).to_le_bytes());
}

fn put_f32s(o: &mut Vec<u8>, v: &[f32]) {
    o.reserve(4 * v.len());
    for x in v {
        o.extend_from_slice(&x.to_le_bytes());
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    fn bad(&self, reason: &'static str) -> PrivateError {
        PrivateError::Helora(HeloraError::Malformed {
            what: self.what,
            reason,
        })
    }

    fn left(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PrivateError> {
        if self.buf.len() < n {
            return Err(self.bad("truncated"));
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }

    fn u8(&mut self) -> Result<u8, PrivateError> {
        Ok(self.take(1)?[0])
    }

    fn f64(&mut self) -> Result<f64, PrivateError> {
        let b = self.take(8)?;
        Ok(f64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn usize(&mut self) -> Result<usize, PrivateError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// `n` finite f32 values (`None`: the count overflowed).
    fn f32s(&mut self, n: Option<usize>) -> Result<Vec<f32>, PrivateError> {
        let bytes = n
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| self.bad("size overflows"))?;
        let raw = self.take(bytes)?;
        let v: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if v.iter().any(|x| !x.is_finite()) {
            return Err(self.bad("non-finite lora_A value"));
        }
        Ok(v)
    }

    fn header(&mut self, magic: &[u8; 4]) -> Result<(), PrivateError> {
        if self.take(4)? != magic {
            return Err(self.bad("bad magic"));
        }
        if self.u8()? != VERSION {
            return Err(self.bad("unsupported version"));
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), PrivateError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.bad("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::HeAdapter;
    use crate::server::LayerGroup;
    use cipherlora_helora::{GroupAdapter, ProjectionAdapter};
    use proptest::prelude::*;

    fn groups(kind: LoraKind) -> AdapterGroups {
        let proj = |name: &str, d_out: usize, seed: f32| ProjectionAdapter {
            name: name.into(),
            d_out,
            rank: 2,
            a: (0..2 * 8).map(|i| seed + i as f32 / 16.0).collect(),
            b: (0..d_out * 2).map(|i| i as f32 / 32.0).collect(),
            scaling: 2.0,
        };
        let layer = |layer: usize| {
            [
                LayerGroup::new(
                    layer,
                    ProjGroup::Qkv,
                    GroupAdapter {
                        d_in: 8,
                        projections: vec![proj("q_proj", 8, 0.5), proj("v_proj", 4, -0.5)],
                    },
                ),
                LayerGroup::new(
                    layer,
                    ProjGroup::O,
                    GroupAdapter {
                        d_in: 8,
                        projections: vec![proj("o_proj", 8, 0.25)],
                    },
                ),
            ]
        };
        AdapterGroups {
            kind,
            groups: layer(0).into_iter().chain(layer(3)).collect(),
            acceptance: None,
        }
    }

    fn offer(kind: LoraKind) -> SessionOffer {
        HeAdapter::new(groups(kind)).offer(5).unwrap()
    }

    fn same(a: &SessionOffer, b: &SessionOffer) {
        assert_eq!(
            (
                a.preset,
                a.t,
                a.kind,
                a.grouping,
                a.server_cost_ratio,
                a.acceptance
            ),
            (
                b.preset,
                b.t,
                b.kind,
                b.grouping,
                b.server_cost_ratio,
                b.acceptance
            )
        );
        assert_eq!(a.groups.len(), b.groups.len());
        for (x, y) in a.groups.iter().zip(&b.groups) {
            assert_eq!((x.layer, x.group), (y.layer, y.group));
            assert_eq!(x.projections, y.projections);
            assert_eq!(x.plan, y.plan);
            assert_eq!(x.public_a, y.public_a);
        }
    }

    /// The offer carries no lora_A; attaching it from the info restores the server's offer.
    #[test]
    fn offer_round_trips_ffa_and_standard_with_lora_a_attached() {
        for kind in [LoraKind::Ffa, LoraKind::Standard] {
            let o = offer(kind);
            assert_eq!(o.groups.len(), 4);
            assert_eq!(o.groups[0].public_a.is_some(), kind == LoraKind::Ffa);
            let mut got = decode_offer(&encode_offer(&o)).unwrap();
            assert!(got.groups.iter().all(|g| g.public_a.is_none()));
            let a = decode_public_a(&encode_public_a(&groups(kind))).unwrap();
            attach_public_a(&mut got, &a).unwrap();
            same(&got, &o);
        }
    }

    /// The cost ratio round-trips; a non-finite or absurd one is malformed.
    #[test]
    fn offer_cost_ratio_round_trips_and_bad_ones_are_rejected() {
        let mut o = offer(LoraKind::Standard);
        o.server_cost_ratio = 0.6;
        assert_eq!(
            decode_offer(&encode_offer(&o)).unwrap().server_cost_ratio,
            0.6
        );
        for bad in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1000.0] {
            o.server_cost_ratio = bad;
            let e = decode_offer(&encode_offer(&o)).unwrap_err();
            assert!(e.to_string().contains("cost ratio"), "{bad}: {e}");
        }
    }

    /// The acceptance hint round-trips; one outside (0, 1) is malformed.
    #[test]
    fn offer_acceptance_hint_round_trips_and_bad_ones_are_rejected() {
        let mut g = groups(LoraKind::Ffa);
        g.acceptance = Some(0.885);
        let mut o = HeAdapter::new(g).offer(5).unwrap();
        assert_eq!(o.acceptance, Some(0.885));
        assert_eq!(
            decode_offer(&encode_offer(&o)).unwrap().acceptance,
            Some(0.885)
        );
        o.acceptance = None;
        assert_eq!(decode_offer(&encode_offer(&o)).unwrap().acceptance, None);
        for bad in [f64::NAN, 0.0, 1.0, 1.5] {
            o.acceptance = Some(bad);
            let e = decode_offer(&encode_offer(&o)).unwrap_err();
            assert!(e.to_string().contains("acceptance"), "{bad}: {e}");
        }
    }

    /// Grouped by layer, the client rebuilds the server's zero-padded lora_A.
    #[test]
    fn offer_grouped_by_layer_round_trips_with_padded_lora_a() {
        let server = HeAdapter::new(groups(LoraKind::Ffa));
        let o = server.offer_grouped(5, Grouping::BY_LAYER).unwrap();
        assert_eq!(o.grouping, Grouping::BY_LAYER);
        assert_eq!(o.groups.len(), 2);
        assert_eq!(
            o.groups[0].projections,
            [(0, Proj::Q), (0, Proj::V), (0, Proj::O)]
        );
        assert_eq!(o.groups[0].plan.shape.d_in, 16);
        let a = &o.groups[0].public_a.as_ref().unwrap()[2];
        // o_proj's lora_A row 1 sits in columns 8..16 of the fused input.
        assert!(a[16..24].iter().all(|&v| v == 0.0));
        assert_eq!(a[24], 0.25 + 8.0 / 16.0);
        let mut got = decode_offer(&encode_offer(&o)).unwrap();
        let public = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa))).unwrap();
        attach_public_a(&mut got, &public).unwrap();
        same(&got, &o);
        let std = HeAdapter::new(groups(LoraKind::Standard));
        let o = std.offer_grouped(5, Grouping::BY_LAYER).unwrap();
        assert_eq!((o.grouping, o.groups.len()), (Grouping::ByInput, 4));
    }

    /// Two layers per group: layer 3's lora_A lands after layer 0's inputs.
    #[test]
    fn offer_grouped_by_two_layers_round_trips_with_padded_lora_a() {
        let server = HeAdapter::new(groups(LoraKind::Ffa));
        let o = server.offer_grouped(5, Grouping::ByLayers(2)).unwrap();
        assert_eq!(o.grouping, Grouping::ByLayers(2));
        assert_eq!(o.groups.len(), 1);
        let g = &o.groups[0];
        assert_eq!((g.layer, g.group), (0, ProjGroup::Qkv));
        assert_eq!(
            g.projections,
            [
                (0, Proj::Q),
                (0, Proj::V),
                (0, Proj::O),
                (3, Proj::Q),
                (3, Proj::V),
                (3, Proj::O)
            ]
        );
        assert_eq!(g.plan.shape.d_in, 32);
        // Layer 3's o_proj, row 0: columns 24..32 of the fused input.
        let a = &g.public_a.as_ref().unwrap()[5];
        assert!(a[..24].iter().all(|&v| v == 0.0));
        assert_eq!(a[24], 0.25);
        let mut got = decode_offer(&encode_offer(&o)).unwrap();
        let public = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa))).unwrap();
        attach_public_a(&mut got, &public).unwrap();
        same(&got, &o);
        // More layers than the adapter has: the same one group.
        let most = server
            .offer_grouped(5, Grouping::ByLayers(Grouping::MAX_LAYERS))
            .unwrap();
        assert_eq!(most.groups.len(), 1);
        // Out of range: a typed error, not a panic or a silent default.
        for n in [0, Grouping::MAX_LAYERS + 1] {
            let e = server.offer_grouped(5, Grouping::ByLayers(n)).unwrap_err();
            assert!(matches!(e, PrivateError::LayersPerGroup { .. }), "{e}");
        }
    }

    #[test]
    fn offer_grouped_by_layer_refuses_projections_out_of_order() {
        let mut o = HeAdapter::new(groups(LoraKind::Ffa))
            .offer_grouped(5, Grouping::BY_LAYER)
            .unwrap();
        o.groups[0].projections.swap(0, 2);
        assert!(decode_offer(&encode_offer(&o)).is_err());
        let mut o = offer(LoraKind::Ffa);
        o.groups[0].projections.push((0, Proj::O));
        assert!(decode_offer(&encode_offer(&o)).is_err());
        // A projection of another layer in a group by input.
        let mut o = offer(LoraKind::Ffa);
        o.groups[0].projections[1].0 = 3;
        assert!(decode_offer(&encode_offer(&o)).is_err());
        // A group by layers spanning more layers than the grouping says.
        let mut o = HeAdapter::new(groups(LoraKind::Ffa))
            .offer_grouped(5, Grouping::ByLayers(2))
            .unwrap();
        o.grouping = Grouping::BY_LAYER;
        assert!(decode_offer(&encode_offer(&o)).is_err());
    }

    #[test]
    fn regression_ffa_offer_bytes_do_not_repeat_the_lora_a() {
        let mut o = offer(LoraKind::Ffa);
        let with = encode_offer(&o).len();
        for g in &mut o.groups {
            g.public_a = None;
        }
        assert_eq!(encode_offer(&o).len(), with);
    }

    #[test]
    fn attach_public_a_refuses_missing_or_misshapen_matrices() {
        let mut got = decode_offer(&encode_offer(&offer(LoraKind::Ffa))).unwrap();
        let mut a = decode_public_a(&encode_public_a(&groups(LoraKind::Ffa))).unwrap();
        let last = a.pop().unwrap();
        assert!(attach_public_a(&mut got, &a).is_err());
        a.push(PublicA {
            rank: last.rank + 1,
            ..last
        });
        assert!(attach_public_a(&mut got, &a).is_err());
    }

    #[test]
    fn plan_request_round_trips_and_rejects_bad_t() {
        for (t, offer_only, grouping) in [
            (1, false, Grouping::ByInput),
            (5, true, Grouping::BY_LAYER),
            (MAX_T, false, Grouping::BY_LAYER),
            (9, true, Grouping::ByLayers(Grouping::MAX_LAYERS)),
        ] {
            let r = PlanRequest {
                t,
                offer_only,
                grouping,
            };
            assert_eq!(PlanRequest::from_bytes(&r.to_bytes()).unwrap(), r);
        }
        for t in [0, MAX_T + 1] {
            let b = PlanRequest {
                t,
                offer_only: false,
                grouping: Grouping::ByInput,
            }
            .to_bytes();
            assert!(PlanRequest::from_bytes(&b).is_err());
        }
        let mut b = PlanRequest {
            t: 5,
            offer_only: false,
            grouping: Grouping::ByInput,
        }
        .to_bytes();
        b[9] = ((Grouping::MAX_LAYERS as u8) + 1) << 1;
        assert!(PlanRequest::from_bytes(&b).is_err());
    }

    #[test]
    fn public_a_round_trips() {
        let g = groups(LoraKind::Ffa);
        let got = decode_public_a(&encode_public_a(&g)).unwrap();
        assert_eq!(got.len(), 6);
        assert_eq!(got[1].proj, Proj::V);
        assert_eq!(got[1].layer, 0);
        assert_eq!(got[5].layer, 3);
        assert_eq!(got[1].a, g.groups[0].adapter.projections[1].a);
    }

    #[test]
    fn offer_with_foreign_values_is_refused() {
        let o = offer(LoraKind::Ffa);
        let good = encode_offer(&o);
        // Every truncation fails.
        for n in [0, 4, 5, 10, good.len() / 2, good.len() - 1] {
            assert!(decode_offer(&good[..n]).is_err(), "prefix {n}");
        }
        // Trailing byte.
        let mut long = good.clone();
        long.push(0);
        assert!(decode_offer(&long).is_err());
        // Non-finite lora_A: the last 4 bytes are an f32 of the last matrix.
        let mut nan = good.clone();
        let n = nan.len();
        nan[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(decode_offer(&nan).is_err());
        // Kind flipped to standard while public lora_A is present.
        let mut kind = good.clone();
        kind[10] = 1;
        assert!(decode_offer(&kind).is_err());
        // Unknown preset.
        let mut preset = good;
        preset[5] = 200;
        assert!(decode_offer(&preset).is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_offer(&bytes);
            let _ = decode_public_a(&bytes);
            let _ = PlanRequest::from_bytes(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_mutated_offers(i in any::<usize>(), v in any::<u8>(), cut in any::<usize>()) {
            let good = encode_offer(&offer(LoraKind::Standard));
            let mut b = good.clone();
            let i = i % b.len();
            b[i] = v;
            let _ = decode_offer(&b);
            let _ = decode_offer(&good[..cut % good.len()]);
        }
    }
}
