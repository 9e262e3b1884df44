//! Operation counts of a plan, computed exactly from its geometry; a property test checks them
//! against the simulator's counts.

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
    /// Ct×pt products over the extended basis `Q·P` (double hoisting), by level.
    pub ext_ct_pt: [u64; LEVELS],
    /// Rotations from a hoisted decomposition kept over `Q·P` (no ModDown), by level.
    pub ext_hoisted_rotations: [u64; LEVELS],
    /// Unrotated inputs lifted to `Q·P` (multiplication by P), by level.
    pub extends: [u64; LEVELS],
    /// Fused ModDown + rescales, by level before.
    pub mod_down_rescales: [u64; LEVELS],
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
    /// Total ct×pt products (ordinary and extended).
    pub fn ct_pt_total(&self) -> u64 {
        self.ct_pt.iter().sum::<u64>() + self.ext_ct_pt.iter().sum::<u64>()
    }

    /// Total rotations (plain, hoisted and hoisted-extended).
    pub fn rotations_total(&self) -> u64 {
        self.rotations.iter().sum::<u64>()
            + self.hoisted_rotations.iter().sum::<u64>()
            + self.ext_hoisted_rotations.iter().sum::<u64>()
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
            ext_ct_pt: zip(self.ext_ct_pt, o.ext_ct_pt, s),
            ext_hoisted_rotations: zip(self.ext_hoisted_rotations, o.ext_hoisted_rotations, s),
            extends: zip(self.extends, o.extends, s),
            mod_down_rescales: zip(self.mod_down_rescales, o.mod_down_rescales, s),
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
            ext_ct_pt: m(self.ext_ct_pt),
            ext_hoisted_rotations: m(self.ext_hoisted_rotations),
            extends: m(self.extends),
            mod_down_rescales: m(self.mod_down_rescales),
            adds: m(self.adds),
            rescales: m(self.rescales),
            rerandomizations: self.rerandomizations * k,
            encryptions: m(self.encryptions),
            decryptions: self.decryptions * k,
        }
    }
}

impl GroupPlan {
    /// Whether a stage with these baby steps is double hoisted ([`BabySteps::ServerExtended`] with
    /// at least two baby steps; Bossuat et al., EUROCRYPT 2021, §4.2).
    pub fn double_hoisted(baby: BabySteps, babies: usize) -> bool {
        baby == BabySteps::ServerExtended && babies > 1
    }

    /// Exact operation counts of one evaluation (client and server). Errors as
    /// [`GroupPlan::layout`].
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
            let giants = l.giants_a as u64;
            let products = n_x * l.stride_a as u64;
            if Self::double_hoisted(sa.baby, l.babies_a) {
                c.hoists[la] += n_x;
                c.ext_hoisted_rotations[la] += n_x * (l.babies_a as u64 - 1);
                c.extends[la] += n_x;
                c.ext_ct_pt[la] += products;
                c.mod_down_rescales[la] += giants;
            } else {
                if sa.baby.on_server() && l.babies_a > 1 {
                    c.hoists[la] += n_x;
                    c.hoisted_rotations[la] += n_x * (l.babies_a as u64 - 1);
                }
                c.ct_pt[la] += products;
                c.rescales[la] += giants;
            }
            // Giant partial sums are rescaled, then rotated one level lower.
            c.rotations[lb] += giants - 1;
            c.adds[lb] += giants - 1;
            let w = GroupPlan::window_steps(l.window, 1).len() as u64;
            c.rotations[lb] += w;
            c.adds[lb] += w;
        }
        // Stage B (in standard mode u' is always rotated by the server).
        let giants = l.giants_b as u64;
        let products = n_out * l.diags_b as u64;
        if Self::double_hoisted(self.stage_b.baby, l.babies_b) {
            c.hoists[lb] += 1;
            c.ext_hoisted_rotations[lb] += l.babies_b as u64 - 1;
            c.extends[lb] += 1;
            c.ext_ct_pt[lb] += products;
            c.mod_down_rescales[lb] += n_out * giants;
        } else {
            if self.stage_b.baby.on_server() && l.babies_b > 1 {
                c.hoists[lb] += 1;
                c.hoisted_rotations[lb] += l.babies_b as u64 - 1;
            }
            c.ct_pt[lb] += products;
            c.rescales[lb] += n_out * giants;
        }
        c.rotations[0] += n_out * (giants - 1);
        c.adds[0] += n_out * (giants - 1);
        if self.rerandomize {
            c.rerandomizations += n_out;
        }
        c.decryptions += n_out;
        Ok(c)
    }

    /// Bytes of plaintext diagonals a server holds for this plan (level l: `l + 1` limbs, `l + 2`
    /// over `Q·P`, of N 8-byte words): what a session reserves. Errors as [`GroupPlan::layout`].
    pub fn diagonal_bytes(&self) -> Result<u64> {
        let c = self.counts()?;
        let limbs: u64 = (0..LEVELS)
            .map(|l| c.ct_pt[l] * (l as u64 + 1) + c.ext_ct_pt[l] * (l as u64 + 2))
            .sum();
        Ok(limbs * 2 * self.slots as u64 * 8)
    }
}
