//! The canonical binary encoding of a [`GroupPlan`]: little-endian, versioned, a 4-byte magic.
//! [`GroupPlan::id`] hashes it. The decoder validates counts and plan constraints and returns
//! [`HeloraError::Malformed`], never panics. Group requests and responses are the protocol's
//! (`cipherlora_proto::v1::GroupRequest`): ciphertext bytes only.

use crate::adapter::GroupShape;
use crate::error::{HeloraError, Result};
use crate::plan::{BabySteps, GroupPlan, Mode, PositionPacking, Reach, StageAPlan, StageBPlan};

const PLAN_MAGIC: &[u8; 4] = b"HLPL";
/// Version 2: plans carry their [`PositionPacking`]; version 3: their stage-B [`Reach`].
const VERSION: u8 = 3;
/// Upper bound on projections per group.
pub const MAX_PROJECTIONS: usize = 64;

struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self, reason: &'static str) -> HeloraError {
        HeloraError::Malformed {
            what: self.what,
            reason,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(self.bad("truncated"));
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn usize(&mut self) -> Result<usize> {
        Ok(self.u32()? as usize)
    }
    fn header(&mut self, magic: &[u8; 4]) -> Result<()> {
        if self.take(4)? != magic {
            return Err(self.bad("bad magic"));
        }
        if self.u8()? != VERSION {
            return Err(self.bad("unsupported version"));
        }
        Ok(())
    }
    fn finish(&self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.bad("trailing bytes"))
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u32).to_le_bytes());
}

fn baby_code(b: BabySteps) -> u8 {
    match b {
        BabySteps::Server => 0,
        BabySteps::Client => 1,
        BabySteps::ServerExtended => 2,
    }
}

/// Canonical encoding of a plan (also hashed into [`GroupPlan::id`]).
pub fn encode_plan(p: &GroupPlan) -> Vec<u8> {
    let mut o = Vec::with_capacity(64);
    o.extend_from_slice(PLAN_MAGIC);
    o.push(VERSION);
    put_u32(&mut o, p.slots);
    put_u32(&mut o, p.t);
    o.push(match p.packing {
        PositionPacking::Real => 0,
        PositionPacking::ComplexPairs => 1,
    });
    o.push(match p.mode {
        Mode::Ffa => 0,
        Mode::Standard => 1,
    });
    o.push(u8::from(p.rerandomize));
    put_u32(&mut o, p.shape.d_in);
    put_u32(&mut o, p.shape.d_outs.len());
    for (&d, &r) in p.shape.d_outs.iter().zip(&p.shape.ranks) {
        put_u32(&mut o, d);
        put_u32(&mut o, r);
    }
    put_u32(&mut o, p.stage_b.n_out);
    put_u32(&mut o, p.stage_b.g);
    o.push(baby_code(p.stage_b.baby));
    o.push(match p.stage_b.reach {
        Reach::Ahead => 0,
        Reach::TwoSided => 1,
    });
    match p.stage_a {
        None => o.push(0),
        Some(a) => {
            o.push(1);
            put_u32(&mut o, a.period);
            put_u32(&mut o, a.g);
            o.push(baby_code(a.baby));
            o.push(u8::from(a.segmented));
        }
    }
    o
}

/// Decodes and validates a plan. Errors: [`HeloraError::Malformed`]; plan validation errors.
pub fn decode_plan(bytes: &[u8]) -> Result<GroupPlan> {
    let mut r = Reader {
        buf: bytes,
        what: "plan",
    };
    r.header(PLAN_MAGIC)?;
    let slots = r.usize()?;
    let t = r.usize()?;
    let packing = match r.u8()? {
        0 => PositionPacking::Real,
        1 => PositionPacking::ComplexPairs,
        _ => return Err(r.bad("unknown position packing")),
    };
    let mode = match r.u8()? {
        0 => Mode::Ffa,
        1 => Mode::Standard,
        _ => return Err(r.bad("unknown mode")),
    };
    let rerandomize = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(r.bad("bad flag")),
    };
    let d_in = r.usize()?;
    let n = r.usize()?;
    if n == 0 || n > MAX_PROJECTIONS {
        return Err(r.bad("projection count out of range"));
    }
    let mut d_outs = Vec::with_capacity(n);
    let mut ranks = Vec::with_capacity(n);
    for _ in 0..n {
        d_outs.push(r.usize()?);
        ranks.push(r.usize()?);
    }
    let baby = |r: &mut Reader| -> Result<BabySteps> {
        match r.u8()? {
            0 => Ok(BabySteps::Server),
            1 => Ok(BabySteps::Client),
            2 => Ok(BabySteps::ServerExtended),
            _ => Err(r.bad("unknown baby-step owner")),
        }
    };
    let stage_b = StageBPlan {
        n_out: r.usize()?,
        g: r.usize()?,
        baby: baby(&mut r)?,
        reach: match r.u8()? {
            0 => Reach::Ahead,
            1 => Reach::TwoSided,
            _ => return Err(r.bad("unknown stage-B reach")),
        },
    };
    let stage_a = match r.u8()? {
        0 => None,
        1 => Some(StageAPlan {
            period: r.usize()?,
            g: r.usize()?,
            baby: baby(&mut r)?,
            segmented: match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(r.bad("bad segmented flag")),
            },
        }),
        _ => return Err(r.bad("bad stage-A flag")),
    };
    r.finish()?;
    let plan = GroupPlan {
        slots,
        t,
        packing,
        mode,
        shape: GroupShape::new(d_in, d_outs, ranks)?,
        stage_a,
        stage_b,
        rerandomize,
    };
    plan.layout()?;
    Ok(plan)
}

impl GroupPlan {
    /// A stable identifier of the plan (FNV-1a over its canonical encoding), carried by every
    /// request and response.
    pub fn id(&self) -> u64 {
        let bytes = encode_plan(self);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}
