//! A plaintext slot simulator: the HE interface on exact f64 slot vectors, with CKKS rotation
//! semantics, level checks and operation counts; noise-free, so the leak test can demand exact
//! zeros. Not encryption.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::counts::{LEVELS, OpCounts};
use crate::error::{HeloraError, Result};
use crate::he_traits::{Complex64, HeClient, HeServer};

/// A simulated ciphertext: a level and the (complex) slot values.
#[derive(Debug, Clone, PartialEq)]
pub struct SimCt {
    /// Level (number of rescales still possible).
    pub level: usize,
    /// Slot values.
    pub values: Vec<Complex64>,
}

/// A simulated ciphertext over the extended basis `Q·P` (a different type, so the packing cannot
/// mix it with ordinary ciphertexts).
#[derive(Debug, Clone, PartialEq)]
pub struct SimExtCt {
    level: usize,
    values: Vec<Complex64>,
}

/// A simulated plaintext over `Q·P`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimExtPt {
    level: usize,
    values: Vec<f64>,
}

/// A simulated plaintext.
#[derive(Debug, Clone, PartialEq)]
pub struct SimPt {
    level: usize,
    values: Vec<f64>,
}

/// The simulator; client and server halves in one (it holds no secret).
#[derive(Debug)]
pub struct SlotSimulator {
    slots: usize,
    max_level: usize,
    counts: Mutex<OpCounts>,
    steps: Mutex<BTreeSet<i64>>,
}

impl SlotSimulator {
    /// A simulator with `slots` slots and levels `0..=max_level`. Errors: [`HeloraError::SimulatorRange`]
    /// when `slots` is zero or `max_level ≥ LEVELS`.
    pub fn new(slots: usize, max_level: usize) -> Result<Self> {
        if slots == 0 || max_level >= LEVELS {
            return Err(HeloraError::SimulatorRange {
                values: max_level,
                slots,
                levels: LEVELS,
            });
        }
        Ok(SlotSimulator {
            slots,
            max_level,
            counts: Mutex::new(OpCounts::default()),
            steps: Mutex::new(BTreeSet::new()),
        })
    }

    /// Operations counted since creation or the last [`SlotSimulator::reset_counts`].
    pub fn counts(&self) -> OpCounts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rotation steps used since creation or the last reset (the Galois keys a real server would
    /// have needed).
    pub fn steps_used(&self) -> BTreeSet<i64> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Zeroes the counters and forgets the steps used.
    pub fn reset_counts(&self) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = OpCounts::default();
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn note_step(&self, step: i64) {
        self.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(step);
    }

    fn count(&self, f: impl FnOnce(&mut OpCounts)) {
        f(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn padded(&self, values: &[f64]) -> Result<Vec<f64>> {
        self.check_len(values.len())?;
        let mut v = values.to_vec();
        v.resize(self.slots, 0.0);
        Ok(v)
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.slots {
            return Err(HeloraError::SimulatorRange {
                values: len,
                slots: self.slots,
                levels: LEVELS,
            });
        }
        Ok(())
    }

    fn check_level(&self, level: usize) -> Result<()> {
        if level > self.max_level {
            return Err(HeloraError::NotEnoughLevels {
                needed: level,
                available: self.max_level,
            });
        }
        Ok(())
    }

    fn rot<T: Clone>(&self, v: &[T], step: i64) -> Vec<T> {
        let n = self.slots as i64;
        let s = step.rem_euclid(n) as usize;
        let mut out = Vec::with_capacity(v.len());
        out.extend_from_slice(&v[s..]);
        out.extend_from_slice(&v[..s]);
        out
    }
}

fn to_bytes(ct: &SimCt) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 16 * ct.values.len());
    out.extend_from_slice(&(ct.level as u32).to_le_bytes());
    out.extend_from_slice(&(ct.values.len() as u32).to_le_bytes());
    for v in &ct.values {
        out.extend_from_slice(&v.re.to_le_bytes());
        out.extend_from_slice(&v.im.to_le_bytes());
    }
    out
}

fn from_bytes(bytes: &[u8], slots: usize) -> Result<SimCt> {
    let bad = |reason| HeloraError::Malformed {
        what: "simulated ciphertext",
        reason,
    };
    if bytes.len() < 8 {
        return Err(bad("truncated header"));
    }
    let level = u32::from_le_bytes(bytes[0..4].try_into().map_err(|_| bad("header"))?) as usize;
    let n = u32::from_le_bytes(bytes[4..8].try_into().map_err(|_| bad("header"))?) as usize;
    if n != slots || bytes.len() != 8 + 16 * n {
        return Err(bad("wrong length"));
    }
    if level >= LEVELS {
        return Err(bad("level out of range"));
    }
    let part = |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    let values = bytes[8..]
        .chunks_exact(16)
        .map(|c| Complex64::new(part(&c[..8]), part(&c[8..])))
        .collect();
    Ok(SimCt { level, values })
}

impl HeServer for SlotSimulator {
    type Ct = SimCt;
    type Pt = SimPt;
    type ExtCt = SimExtCt;
    type ExtPt = SimExtPt;

    fn slots(&self) -> usize {
        self.slots
    }

    fn max_level(&self) -> usize {
        self.max_level
    }

    fn level(&self, ct: &SimCt) -> usize {
        ct.level
    }

    fn encode_weights(&self, values: &[f64], level: usize) -> Result<SimPt> {
        self.check_level(level)?;
        Ok(SimPt {
            level,
            values: self.padded(values)?,
        })
    }

    fn encode_weights_extended(&self, values: &[f64], level: usize) -> Result<SimExtPt> {
        self.check_level(level)?;
        Ok(SimExtPt {
            level,
            values: self.padded(values)?,
        })
    }

    fn rotate_hoisted_extended(&self, ct: &SimCt, steps: &[i64]) -> Result<Vec<SimExtCt>> {
        let rotated = steps.iter().filter(|&&s| s != 0).count() as u64;
        let extended = steps.len() as u64 - rotated;
        self.count(|k| {
            if rotated > 0 {
                k.hoists[ct.level] += 1;
            }
            k.ext_hoisted_rotations[ct.level] += rotated;
            k.extends[ct.level] += extended;
        });
        for &s in steps.iter().filter(|&&s| s != 0) {
            self.note_step(s);
        }
        Ok(steps
            .iter()
            .map(|&s| SimExtCt {
                level: ct.level,
                values: self.rot(&ct.values, s),
            })
            .collect())
    }

    fn dot_plain_extended(&self, cts: &[&SimExtCt], pts: &[&SimExtPt]) -> Result<SimExtCt> {
        if cts.is_empty() || cts.len() != pts.len() {
            return Err(HeloraError::TermCount {
                op: "dot_plain_extended",
                ciphertexts: cts.len(),
                plaintexts: pts.len(),
            });
        }
        let level = cts[0].level;
        let mut acc = vec![Complex64::new(0.0, 0.0); self.slots];
        for (c, p) in cts.iter().zip(pts) {
            if c.level != level || p.level != level {
                return Err(HeloraError::LevelMismatch {
                    op: "dot_plain_extended",
                    left: level,
                    right: c.level.max(p.level),
                });
            }
            for ((a, x), w) in acc.iter_mut().zip(&c.values).zip(&p.values) {
                *a += x * w;
            }
        }
        self.count(|k| k.ext_ct_pt[level] += cts.len() as u64);
        Ok(SimExtCt { level, values: acc })
    }

    fn mod_down_rescale(&self, ct: &SimExtCt) -> Result<SimCt> {
        if ct.level == 0 {
            return Err(HeloraError::NotEnoughLevels {
                needed: 1,
                available: 0,
            });
        }
        self.count(|k| k.mod_down_rescales[ct.level] += 1);
        Ok(SimCt {
            level: ct.level - 1,
            values: ct.values.clone(),
        })
    }

    fn dot_plain(&self, cts: &[&SimCt], pts: &[&SimPt]) -> Result<SimCt> {
        if cts.is_empty() || cts.len() != pts.len() {
            return Err(HeloraError::TermCount {
                op: "dot_plain",
                ciphertexts: cts.len(),
                plaintexts: pts.len(),
            });
        }
        let level = cts[0].level;
        if level == 0 {
            return Err(HeloraError::NotEnoughLevels {
                needed: 1,
                available: 0,
            });
        }
        let mut acc = vec![Complex64::new(0.0, 0.0); self.slots];
        for (c, p) in cts.iter().zip(pts) {
            if c.level != level || p.level != level {
                return Err(HeloraError::LevelMismatch {
                    op: "dot_plain",
                    left: level,
                    right: c.level.max(p.level),
                });
            }
            for ((a, x), w) in acc.iter_mut().zip(&c.values).zip(&p.values) {
                *a += x * w;
            }
        }
        self.count(|k| k.ct_pt[level] += cts.len() as u64);
        Ok(SimCt { level, values: acc })
    }

    fn add_assign(&self, acc: &mut SimCt, other: &SimCt) -> Result<()> {
        if acc.level != other.level {
            return Err(HeloraError::LevelMismatch {
                op: "add",
                left: acc.level,
                right: other.level,
            });
        }
        for (a, b) in acc.values.iter_mut().zip(&other.values) {
            *a += b;
        }
        self.count(|k| k.adds[acc.level] += 1);
        Ok(())
    }

    fn rotate(&self, ct: &SimCt, step: i64) -> Result<SimCt> {
        self.count(|k| k.rotations[ct.level] += 1);
        self.note_step(step);
        Ok(SimCt {
            level: ct.level,
            values: self.rot(&ct.values, step),
        })
    }

    fn rotate_hoisted(&self, ct: &SimCt, steps: &[i64]) -> Result<Vec<SimCt>> {
        if !steps.is_empty() {
            self.count(|k| {
                k.hoists[ct.level] += 1;
                k.hoisted_rotations[ct.level] += steps.len() as u64;
            });
        }
        for &s in steps {
            self.note_step(s);
        }
        Ok(steps
            .iter()
            .map(|&s| SimCt {
                level: ct.level,
                values: self.rot(&ct.values, s),
            })
            .collect())
    }

    fn rescale(&self, ct: &SimCt) -> Result<SimCt> {
        if ct.level == 0 {
            return Err(HeloraError::NotEnoughLevels {
                needed: 1,
                available: 0,
            });
        }
        self.count(|k| k.rescales[ct.level] += 1);
        Ok(SimCt {
            level: ct.level - 1,
            values: ct.values.clone(),
        })
    }

    fn rerandomize(&self, ct: &SimCt) -> Result<SimCt> {
        self.count(|k| k.rerandomizations += 1);
        Ok(ct.clone())
    }

    fn input_from_bytes(&self, bytes: &[u8]) -> Result<SimCt> {
        from_bytes(bytes, self.slots)
    }

    fn output_to_bytes(&self, ct: &SimCt) -> Vec<u8> {
        to_bytes(ct)
    }
}

impl HeClient for SlotSimulator {
    fn slots(&self) -> usize {
        self.slots
    }

    fn encrypt_to_bytes(&self, re: &[f64], im: &[f64], level: usize) -> Result<Vec<u8>> {
        self.check_level(level)?;
        self.check_len(re.len().max(im.len()))?;
        let part = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        let ct = SimCt {
            level,
            values: (0..self.slots)
                .map(|i| Complex64::new(part(re, i), part(im, i)))
                .collect(),
        };
        self.count(|k| k.encryptions[level] += 1);
        Ok(to_bytes(&ct))
    }

    fn decrypt_from_bytes(&self, bytes: &[u8]) -> Result<Vec<Complex64>> {
        let ct = from_bytes(bytes, self.slots)?;
        self.count(|k| k.decryptions += 1);
        Ok(ct.values)
    }
}
