//! A [`GroupPlan`] beside its protobuf form (`cipherlora.adapter.v1.GroupPlan`).

use cipherlora_helora::adapter::MAX_PROJECTIONS;
use cipherlora_helora::{
    BabySteps, GroupPlan, GroupShape, Mode, PositionPacking, Reach, StageAPlan, StageBPlan,
};
use cipherlora_proto::v1;

use super::codes::{malformed, to_u32, to_usize};
use crate::PrivateError;

fn baby_code(b: BabySteps) -> v1::BabySteps {
    match b {
        BabySteps::Server => v1::BabySteps::Server,
        BabySteps::Client => v1::BabySteps::Client,
        BabySteps::ServerExtended => v1::BabySteps::ServerExtended,
    }
}

fn baby_of(code: i32) -> Result<BabySteps, PrivateError> {
    match v1::BabySteps::try_from(code) {
        Ok(v1::BabySteps::Server) => Ok(BabySteps::Server),
        Ok(v1::BabySteps::Client) => Ok(BabySteps::Client),
        Ok(v1::BabySteps::ServerExtended) => Ok(BabySteps::ServerExtended),
        Err(_) => Err(malformed("plan", "unknown baby-step owner")),
    }
}

/// The protobuf form of `p`.
#[must_use]
pub fn encode_plan(p: &GroupPlan) -> v1::GroupPlan {
    let n = to_u32;
    v1::GroupPlan {
        slots: n(p.slots),
        positions: n(p.t),
        complex_pairs: p.packing == PositionPacking::ComplexPairs,
        standard: p.mode == Mode::Standard,
        rerandomize: p.rerandomize,
        d_in: n(p.shape.d_in),
        d_outs: p.shape.d_outs.iter().map(|&d| n(d)).collect(),
        ranks: p.shape.ranks.iter().map(|&r| n(r)).collect(),
        stage_b: Some(v1::StageB {
            outputs: n(p.stage_b.n_out),
            giant_steps: n(p.stage_b.g),
            baby: baby_code(p.stage_b.baby).into(),
            two_sided: p.stage_b.reach == Reach::TwoSided,
        }),
        stage_a: p.stage_a.map(|a| v1::StageA {
            period: n(a.period),
            giant_steps: n(a.g),
            baby: baby_code(a.baby).into(),
            segmented: a.segmented,
        }),
    }
}

/// Reads and validates a plan (shape, stages, layout). Errors: [`PrivateError::Helora`]
/// (`Malformed`, or the plan's own validation errors).
pub fn decode_plan(m: &v1::GroupPlan) -> Result<GroupPlan, PrivateError> {
    let bad = |reason| malformed("plan", reason);
    if m.d_outs.is_empty() || m.d_outs.len() > MAX_PROJECTIONS || m.ranks.len() != m.d_outs.len() {
        return Err(bad("projection count out of range"));
    }
    let b = m.stage_b.as_ref().ok_or_else(|| bad("no stage B"))?;
    let stage_b = StageBPlan {
        n_out: to_usize(b.outputs),
        g: to_usize(b.giant_steps),
        baby: baby_of(b.baby)?,
        reach: if b.two_sided {
            Reach::TwoSided
        } else {
            Reach::Ahead
        },
    };
    let stage_a = match &m.stage_a {
        None => None,
        Some(a) => Some(StageAPlan {
            period: to_usize(a.period),
            g: to_usize(a.giant_steps),
            baby: baby_of(a.baby)?,
            segmented: a.segmented,
        }),
    };
    let plan = GroupPlan {
        slots: to_usize(m.slots),
        t: to_usize(m.positions),
        packing: if m.complex_pairs {
            PositionPacking::ComplexPairs
        } else {
            PositionPacking::Real
        },
        mode: if m.standard {
            Mode::Standard
        } else {
            Mode::Ffa
        },
        shape: GroupShape::new(
            to_usize(m.d_in),
            m.d_outs.iter().map(|&d| to_usize(d)).collect(),
            m.ranks.iter().map(|&r| to_usize(r)).collect(),
        )?,
        stage_a,
        stage_b,
        rerandomize: m.rerandomize,
    };
    plan.layout()?;
    Ok(plan)
}
