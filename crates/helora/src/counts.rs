//! Operation counts of a plan, computed exactly from its geometry.
//!
//! The simulator backend counts the same operations while it evaluates; a
//! property test checks that both agree, so the planner's cost model prices
//! exactly what the server and client will do.

use std::ops::{Add, AddAssign, Mul};

use crate::error::Result;
use crate::plan::{BabySteps, GroupPlan, Mode};

/// Levels distinguished by the counters (0 = lowest, after all rescales).
pub const LEVELS: usize = 4;

/// Counts of homomorphic operations, per level where the cost depends on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Ciphertext × plaintext products, by level of the ciphertext.
    pub ct_pt: [u64; LEVELS],
    /// Plain (non-hoisted) rotations, by level.
    pub rotations: [u64; LEVELS],
    /// Key-switch decompositions shared by hoisted rotations, by level.
    pub hoists: [u64; LEVELS],
    /// Rotations done from a hoisted decomposition, by level.
    pub hoisted_rotations: [u64; LEVELS],
    /// Ciphertext additions outside products, by level.
    pub adds: [u64; LEVELS],
    /// Rescales, by level before the rescale.
    pub rescales: [u64; LEVELS],
    /// Circuit-privacy rerandomisations (at level 0).
    pub rerandomizations: u64,
    /// Client encryptions, by level.
    pub encryptions: [u64; LEVELS],
    /// Client decryptions (at level 0).
    pub decryptions: u64,
}

impl OpCounts {
    /// Total ct×pt products.
    pub fn ct_pt_total(&self) -> u64 {
        self.ct_pt.iter().sum()
    }

    /// Total rotations (plain and hoisted).
    pub fn rotations_total(&self) -> u64 {
        self.rotations.iter().sum::<u64>() + self.hoisted_rotations.iter().sum::<u64>()
    }

    /// Total key switches (every rotation is one).
    pub fn key_switches(&self) -> u64 {
        self.rotations_total()
    }

    /// Total encryptions.
    pub fn encryptions_total(&self) -> u64 {
        self.encryptions.iter().sum()
    }
}

fn zip(a: [u64; LEVELS], b: [u64; LEVELS], f: impl Fn(u64, u64) -> u64) -> [u64; LEVELS] {
    std::array::from_fn(|i| f(a[i], b[i]))
}

impl Add for OpCounts {
    type Output = OpCounts;
    fn add(self, o: OpCounts) -> OpCounts {
        let s = |a: u64, b: u64| a + b;
        OpCounts {
            ct_pt: zip(self.ct_pt, o.ct_pt, s),
            rotations: zip(self.rotations, o.rotations, s),
            hoists: zip(self.hoists, o.hoists, s),
            hoisted_rotations: zip(self.hoisted_rotations, o.hoisted_rotations, s),
            adds: zip(self.adds, o.adds, s),
            rescales: zip(self.rescales, o.rescales, s),
            rerandomizations: self.rerandomizations + o.rerandomizations,
            encryptions: zip(self.encryptions, o.encryptions, s),
            decryptions: self.decryptions + o.decryptions,
        }
    }
}

impl AddAssign for OpCounts {
    fn add_assign(&mut self, o: OpCounts) {
        *self = *self + o;
    }
}

impl Mul<u64> for OpCounts {
    type Output = OpCounts;
    fn mul(self, k: u64) -> OpCounts {
        let m = |a: [u64; LEVELS]| a.map(|v| v * k);
        OpCounts {
            ct_pt: m(self.ct_pt),
            rotations: m(self.rotations),
            hoists: m(self.hoists),
            hoisted_rotations: m(self.hoisted_rotations),
            adds: m(self.adds),
            rescales: m(self.rescales),
            rerandomizations: self.rerandomizations * k,
            encryptions: m(self.encryptions),
            decryptions: self.decryptions * k,
        }
    }
}

impl GroupPlan {
    /// Exact operation counts of one evaluation of this plan (client and
    /// server together).
    ///
    /// # Errors
    /// As [`GroupPlan::layout`].
    pub fn counts(&self) -> Result<OpCounts> {
        let l = self.layout()?;
        let mut c = OpCounts::default();
        let lb = 1; // stage B always runs at level 1
        let n_out = self.stage_b.n_out as u64;
        // Client uploads.
        let inputs = self.input_cts()? as u64;
        c.encryptions[self.input_level()] = inputs;
        if let (Mode::Standard, Some(sa)) = (self.mode, self.stage_a) {
            let la = 2;
            let n_x = l.n_x as u64;
            if sa.baby == BabySteps::Server && l.babies_a > 1 {
                c.hoists[la] += n_x;
                c.hoisted_rotations[la] += n_x * (l.babies_a as u64 - 1);
            }
            c.ct_pt[la] += n_x * l.stride_a as u64;
            // Giant partial sums are rescaled, then rotated one level lower.
            let giants = l.giants_a as u64;
            c.rescales[la] += giants;
            c.rotations[lb] += giants - 1;
            c.adds[lb] += giants - 1;
            let w = GroupPlan::window_steps(l.window, 1).len() as u64;
            c.rotations[lb] += w;
            c.adds[lb] += w;
        }
        // Stage B. In standard mode u' is always rotated by the server.
        if self.stage_b.baby == BabySteps::Server && l.babies_b > 1 {
            c.hoists[lb] += 1;
            c.hoisted_rotations[lb] += l.babies_b as u64 - 1;
        }
        c.ct_pt[lb] += n_out * l.diags_b as u64;
        let giants = l.giants_b as u64;
        c.rescales[lb] += n_out * giants;
        c.rotations[0] += n_out * (giants - 1);
        c.adds[0] += n_out * (giants - 1);
        if self.rerandomize {
            c.rerandomizations += n_out;
        }
        c.decryptions += n_out;
        Ok(c)
    }
}
