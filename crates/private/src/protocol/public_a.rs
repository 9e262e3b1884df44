//! An FFA adapter's public lora_A beside its protobuf form (`cipherlora.adapter.v1.PublicLoraA`,
//! sent once in the adapter's info), and how the client puts it into an offer.

use cipherlora_helora::HeloraError;
use cipherlora_model::Proj;
use cipherlora_proto::v1;

use super::codes::{malformed, proj_code, proj_of, to_u32, to_usize};
use super::offer::{LoraKind, SessionOffer};
use super::wire::MAX_GROUPS;
use crate::PrivateError;

/// One projection's public lora_A ([`encode_public_a`], [`decode_public_a`]).
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

/// The protobuf form of an adapter's public lora_A.
#[must_use]
pub fn encode_public_a(a: &[PublicA]) -> v1::PublicLoraA {
    let n = to_u32;
    v1::PublicLoraA {
        projections: a
            .iter()
            .map(|m| v1::PublicA {
                layer: n(m.layer),
                projection: proj_code(m.proj).into(),
                rank: n(m.rank),
                d_in: n(m.d_in),
                values: m.a.clone(),
            })
            .collect(),
    }
}

/// Reads an adapter's public lora_A: at most [`MAX_GROUPS`] × 7 projections, each with
/// rank × d_in finite values. Errors: [`PrivateError::Helora`] (`Malformed`).
pub fn decode_public_a(m: &v1::PublicLoraA) -> Result<Vec<PublicA>, PrivateError> {
    let bad = |reason| malformed("public lora_A", reason);
    if m.projections.len() > MAX_GROUPS * Proj::ALL.len() {
        return Err(bad("too many projections"));
    }
    m.projections
        .iter()
        .map(|p| {
            let (rank, d_in) = (to_usize(p.rank), to_usize(p.d_in));
            if rank.checked_mul(d_in) != Some(p.values.len()) {
                return Err(bad("lora_A size differs from rank × d_in"));
            }
            if p.values.iter().any(|x| !x.is_finite()) {
                return Err(bad("non-finite lora_A value"));
            }
            Ok(PublicA {
                layer: to_usize(p.layer),
                proj: proj_of(p.projection, "public lora_A")?,
                rank,
                d_in,
                a: p.values.clone(),
            })
        })
        .collect()
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
