//! The planner: enumerates a group's plans and picks the cheapest by Σ (op count × measured cost)
//! on both sides plus bytes / bandwidth ([`GroupPlan::counts`]).

use crate::adapter::GroupShape;
use crate::counts::{LEVELS, OpCounts};
use crate::error::{HeloraError, Result};
use crate::plan::{BabySteps, GroupPlan, Mode, PositionPacking, Reach, StageAPlan, StageBPlan};

/// Per-operation costs (ms) and ciphertext sizes (bytes) by level, measured once per machine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpCosts {
    /// One ct×pt product inside a lazy dot product, its plaintext streamed from memory.
    pub ct_pt_ms: [f64; LEVELS],
    /// The same with a cache-resident working set (reported, not planned with).
    pub ct_pt_cached_ms: [f64; LEVELS],
    /// One plain rotation (key switch included).
    pub rotate_ms: [f64; LEVELS],
    /// The shared decomposition of a batch of hoisted rotations.
    pub hoist_ms: [f64; LEVELS],
    /// Each rotation from a hoisted decomposition.
    pub hoisted_rotate_ms: [f64; LEVELS],
    /// One ct×pt product over `Q·P` inside a lazy dot product, plaintext streamed.
    pub ext_ct_pt_ms: [f64; LEVELS],
    /// Each rotation of a hoisted decomposition kept over `Q·P` (no ModDown).
    pub ext_hoisted_rotate_ms: [f64; LEVELS],
    /// Lifting an unrotated ciphertext to `Q·P` (multiplication by P).
    pub extend_ms: [f64; LEVELS],
    /// One fused ModDown + rescale (from that level).
    pub mod_down_rescale_ms: [f64; LEVELS],
    /// One ciphertext addition.
    pub add_ms: [f64; LEVELS],
    /// One rescale (from that level).
    pub rescale_ms: [f64; LEVELS],
    /// Client: encode + encrypt one ciphertext at that level.
    pub encrypt_ms: [f64; LEVELS],
    /// Client: decrypt + decode one level-0 ciphertext.
    pub decrypt_ms: f64,
    /// Server: one circuit-privacy rerandomisation.
    pub rerandomize_ms: f64,
    /// Server: parse one uploaded seeded ciphertext at that level (unpack, expand the seed).
    pub parse_input_ms: [f64; LEVELS],
    /// Server: serialise one level-0 result ciphertext.
    pub serialize_output_ms: f64,
    /// Bytes of one uploaded (seeded) ciphertext at that level.
    pub upload_ct_bytes: [f64; LEVELS],
    /// Bytes of one downloaded level-0 ciphertext.
    pub download_ct_bytes: f64,
    /// Bytes of one Galois key (sent once per session).
    pub galois_key_bytes: f64,
}

impl Default for OpCosts {
    /// Rough single-thread estimates for N = 8192, used until the engine is measured.
    fn default() -> Self {
        let n = 8192.0;
        OpCosts {
            ct_pt_ms: [0.02, 0.04, 0.06, 0.08],
            ct_pt_cached_ms: [0.02, 0.04, 0.06, 0.08],
            rotate_ms: [0.6, 1.0, 1.4, 1.8],
            hoist_ms: [0.3, 0.5, 0.7, 0.9],
            hoisted_rotate_ms: [0.3, 0.5, 0.7, 0.9],
            ext_ct_pt_ms: [0.03, 0.06, 0.08, 0.1],
            ext_hoisted_rotate_ms: [0.15, 0.25, 0.35, 0.45],
            extend_ms: [0.01, 0.02, 0.03, 0.04],
            mod_down_rescale_ms: [0.0, 0.2, 0.25, 0.3],
            add_ms: [0.005, 0.01, 0.015, 0.02],
            rescale_ms: [0.0, 0.15, 0.2, 0.25],
            encrypt_ms: [0.3, 0.5, 0.7, 0.9],
            decrypt_ms: 0.3,
            rerandomize_ms: 1.0,
            parse_input_ms: [0.1, 0.2, 0.3, 0.4],
            serialize_output_ms: 0.1,
            upload_ct_bytes: [n * 8.0, n * 16.0, n * 24.0, n * 32.0],
            download_ct_bytes: 2.0 * n * 8.0,
            galois_key_bytes: 2.0 * 3.0 * n * 4.0 * 8.0,
        }
    }
}

/// The client–server link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bandwidth in Mbit/s (both directions).
    pub bandwidth_mbit_s: f64,
    /// Round-trip time in ms (once per verify round, not per group).
    pub rtt_ms: f64,
}

impl Default for Link {
    /// 100 Mbit/s, 20 ms.
    fn default() -> Self {
        Link {
            bandwidth_mbit_s: 100.0,
            rtt_ms: 20.0,
        }
    }
}

/// The modelled cost of one plan (one group, one verify round).
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Operation counts.
    pub counts: OpCounts,
    /// Client CPU, ms.
    pub client_ms: f64,
    /// Server CPU, ms.
    pub server_ms: f64,
    /// Bytes uploaded.
    pub bytes_up: f64,
    /// Bytes downloaded.
    pub bytes_down: f64,
    /// (bytes up + down) / bandwidth, ms.
    pub transfer_ms: f64,
    /// Galois keys the plan needs.
    pub galois_keys: usize,
    /// client + server + transfer, ms (what the planner minimises).
    pub total_ms: f64,
}

fn dot(c: &[u64; LEVELS], m: &[f64; LEVELS]) -> f64 {
    c.iter().zip(m).map(|(&c, &m)| c as f64 * m).sum()
}

impl OpCosts {
    /// Server CPU of `c`, ms (parsing uploads and serialising results included).
    pub fn server_ms(&self, c: &OpCounts) -> f64 {
        dot(&c.ct_pt, &self.ct_pt_ms)
            + dot(&c.rotations, &self.rotate_ms)
            + dot(&c.hoists, &self.hoist_ms)
            + dot(&c.hoisted_rotations, &self.hoisted_rotate_ms)
            + dot(&c.ext_ct_pt, &self.ext_ct_pt_ms)
            + dot(&c.ext_hoisted_rotations, &self.ext_hoisted_rotate_ms)
            + dot(&c.extends, &self.extend_ms)
            + dot(&c.mod_down_rescales, &self.mod_down_rescale_ms)
            + dot(&c.adds, &self.add_ms)
            + dot(&c.rescales, &self.rescale_ms)
            + c.rerandomizations as f64 * self.rerandomize_ms
            + dot(&c.encryptions, &self.parse_input_ms)
            + c.decryptions as f64 * self.serialize_output_ms
    }

    /// Client CPU of `c` (encryptions and decryptions), ms.
    pub fn client_ms(&self, c: &OpCounts) -> f64 {
        dot(&c.encryptions, &self.encrypt_ms) + c.decryptions as f64 * self.decrypt_ms
    }

    /// Bytes up of `c`.
    pub fn bytes_up(&self, c: &OpCounts) -> f64 {
        dot(&c.encryptions, &self.upload_ct_bytes)
    }

    /// Bytes down of `c`.
    pub fn bytes_down(&self, c: &OpCounts) -> f64 {
        c.decryptions as f64 * self.download_ct_bytes
    }

    /// Models one plan. Errors as [`GroupPlan::layout`].
    pub fn estimate(&self, plan: &GroupPlan, link: &Link) -> Result<Estimate> {
        let counts = plan.counts()?;
        let client_ms = self.client_ms(&counts);
        let server_ms = self.server_ms(&counts);
        let (bytes_up, bytes_down) = (self.bytes_up(&counts), self.bytes_down(&counts));
        let transfer_ms = (bytes_up + bytes_down) * 8.0 / (link.bandwidth_mbit_s * 1e3);
        Ok(Estimate {
            counts,
            client_ms,
            server_ms,
            bytes_up,
            bytes_down,
            transfer_ms,
            galois_keys: plan.galois_steps()?.len(),
            total_ms: client_ms + server_ms + transfer_ms,
        })
    }
}

/// Baby-step sizes worth trying for `k` diagonals: per giant count, the smallest g.
fn g_candidates(k: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut last_giants = usize::MAX;
    for g in 1..=k {
        let giants = k.div_ceil(g);
        if giants != last_giants {
            out.push(g);
            last_giants = giants;
        }
    }
    out
}

/// All feasible plans for a group: both packings, and the FFA or standard parameter ranges.
pub fn candidates(
    shape: &GroupShape,
    mode: Mode,
    t: usize,
    slots: usize,
    rerandomize: bool,
) -> Vec<GroupPlan> {
    let mut out = Vec::new();
    for packing in [PositionPacking::Real, PositionPacking::ComplexPairs] {
        if packing == PositionPacking::ComplexPairs && t < 2 {
            continue;
        }
        candidates_packed(shape, mode, t, packing, slots, rerandomize, &mut out);
    }
    out
}

fn candidates_packed(
    shape: &GroupShape,
    mode: Mode,
    t: usize,
    packing: PositionPacking,
    slots: usize,
    rerandomize: bool,
    out: &mut Vec<GroupPlan>,
) {
    let d = shape.total_out();
    let mk = |stage_a, stage_b| GroupPlan {
        slots,
        t,
        packing,
        mode,
        shape: shape.clone(),
        stage_a,
        stage_b,
        rerandomize,
    };
    match mode {
        Mode::Ffa => {
            let r_max = *shape.ranks.iter().max().unwrap_or(&1);
            for (baby, reach) in [
                (BabySteps::Server, Reach::Ahead),
                (BabySteps::ServerExtended, Reach::Ahead),
                (BabySteps::Client, Reach::Ahead),
                (BabySteps::Server, Reach::TwoSided),
                (BabySteps::ServerExtended, Reach::TwoSided),
            ] {
                let k = match reach {
                    Reach::Ahead => r_max,
                    Reach::TwoSided => 2 * r_max - 1,
                };
                for g in 1..=k {
                    if baby == BabySteps::ServerExtended && g == 1 {
                        continue; // no baby rotation: the same as Server
                    }
                    let mut found = 0;
                    for n_out in 1..=d {
                        let p = mk(
                            None,
                            StageBPlan {
                                n_out,
                                g,
                                baby,
                                reach,
                            },
                        );
                        if p.layout().is_ok() {
                            out.push(p);
                            found += 1;
                            if found == 2 {
                                break;
                            }
                        }
                    }
                }
            }
        }
        Mode::Standard => {
            if t == 0 {
                return;
            }
            let w_in = slots / packing.slot_positions(t);
            let equal_ranks = shape.ranks.iter().all(|&r| r == shape.ranks[0]);
            let probe = |period, segmented, n_out| {
                mk(
                    Some(StageAPlan {
                        period,
                        g: 1,
                        baby: BabySteps::Server,
                        segmented,
                    }),
                    StageBPlan {
                        n_out,
                        g: 1,
                        baby: BabySteps::Server,
                        reach: Reach::Ahead,
                    },
                )
            };
            for segmented in [false, true] {
                if segmented && (!equal_ranks || shape.ranks.len() < 2) {
                    continue;
                }
                let rho = if segmented {
                    shape.ranks[0]
                } else {
                    shape.total_rank()
                };
                let mut period = rho;
                while period <= w_in {
                    // Smallest n_out whose regions fit (checked by layout()).
                    let blocks = if segmented { shape.ranks.len() } else { 1 };
                    let fixed = blocks * (period - 1) + rho - 1;
                    if fixed < w_in {
                        let lower = d.div_ceil(w_in - fixed).max(1);
                        if let Some(n_out) =
                            (lower..=d).find(|&n| probe(period, segmented, n).layout().is_ok())
                        {
                            push_standard(&probe(period, segmented, n_out), rho, out);
                        }
                    }
                    period += rho;
                }
            }
            // The dense layout: whole-ciphertext chunks, when rotations wrap consistently.
            let dense = probe(w_in, false, d.div_ceil(w_in).max(1));
            if dense.dense_standard()
                && let Ok(l) = dense.layout()
            {
                push_standard(&dense, l.stride_a, out);
            }
        }
    }
}

/// Every baby-step choice of a standard plan's two stages, for `rho` diagonals each.
fn push_standard(probe: &GroupPlan, rho: usize, out: &mut Vec<GroupPlan>) {
    let server = [BabySteps::Server, BabySteps::ServerExtended];
    let (Some(sa), sb) = (probe.stage_a, probe.stage_b) else {
        return;
    };
    for gb in g_candidates(rho) {
        for baby_b in server {
            if baby_b == BabySteps::ServerExtended && gb == 1 {
                continue;
            }
            for ga in g_candidates(rho) {
                for baby in [
                    BabySteps::Server,
                    BabySteps::ServerExtended,
                    BabySteps::Client,
                ] {
                    if baby == BabySteps::ServerExtended && ga == 1 {
                        continue;
                    }
                    let p = GroupPlan {
                        stage_a: Some(StageAPlan { g: ga, baby, ..sa }),
                        stage_b: StageBPlan {
                            g: gb,
                            baby: baby_b,
                            ..sb
                        },
                        ..probe.clone()
                    };
                    if p.layout().is_ok() {
                        out.push(p);
                    }
                }
            }
        }
    }
}

/// The plan with the least modelled `client + server + transfer` time. Errors:
/// [`HeloraError::NoFeasiblePlan`].
pub fn choose(
    shape: &GroupShape,
    mode: Mode,
    t: usize,
    slots: usize,
    rerandomize: bool,
    costs: &OpCosts,
    link: &Link,
) -> Result<(GroupPlan, Estimate)> {
    let mut best: Option<(GroupPlan, Estimate)> = None;
    for p in candidates(shape, mode, t, slots, rerandomize) {
        let e = costs.estimate(&p, link)?;
        if best.as_ref().is_none_or(|(_, b)| e.total_ms < b.total_ms) {
            best = Some((p, e));
        }
    }
    best.ok_or(HeloraError::NoFeasiblePlan { t, slots })
}

/// The best plan per strategy family and position packing. Errors as [`OpCosts::estimate`].
pub fn best_per_family(
    shape: &GroupShape,
    mode: Mode,
    t: usize,
    slots: usize,
    rerandomize: bool,
    costs: &OpCosts,
    link: &Link,
) -> Result<Vec<(GroupPlan, Estimate)>> {
    let mut best: Vec<(GroupPlan, Estimate)> = Vec::new();
    for p in candidates(shape, mode, t, slots, rerandomize) {
        let e = costs.estimate(&p, link)?;
        let fam = (p.strategy_family(), p.packing);
        match best
            .iter_mut()
            .find(|(q, _)| (q.strategy_family(), q.packing) == fam)
        {
            Some(slot) if e.total_ms < slot.1.total_ms => *slot = (p, e),
            Some(_) => {}
            None => best.push((p, e)),
        }
    }
    Ok(best)
}

impl GroupPlan {
    /// Strategy family: `hoisted-bsgs`, `double-hoisted-bsgs` (`-two-sided`), `client-prerotated`,
    /// `client-replicated`; standard mode names its row blocks and stage-A baby-step owner.
    pub fn strategy_family(&self) -> &'static str {
        let diags = match self.layout() {
            Ok(l) => l.diags_b,
            Err(_) => 0,
        };
        /// `[fused, segmented, dense][stage-A owner][stage-B owner]`.
        const STANDARD: [[[&str; 2]; 3]; 3] = [
            [
                [
                    "fused:hoisted-bsgs-A+hoisted-bsgs-B",
                    "fused:hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "fused:double-hoisted-bsgs-A+hoisted-bsgs-B",
                    "fused:double-hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "fused:client-prerotated-A+hoisted-bsgs-B",
                    "fused:client-prerotated-A+double-hoisted-bsgs-B",
                ],
            ],
            [
                [
                    "segmented:hoisted-bsgs-A+hoisted-bsgs-B",
                    "segmented:hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "segmented:double-hoisted-bsgs-A+hoisted-bsgs-B",
                    "segmented:double-hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "segmented:client-prerotated-A+hoisted-bsgs-B",
                    "segmented:client-prerotated-A+double-hoisted-bsgs-B",
                ],
            ],
            [
                [
                    "dense:hoisted-bsgs-A+hoisted-bsgs-B",
                    "dense:hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "dense:double-hoisted-bsgs-A+hoisted-bsgs-B",
                    "dense:double-hoisted-bsgs-A+double-hoisted-bsgs-B",
                ],
                [
                    "dense:client-prerotated-A+hoisted-bsgs-B",
                    "dense:client-prerotated-A+double-hoisted-bsgs-B",
                ],
            ],
        ];
        let owner = |b: BabySteps| match b {
            BabySteps::Server => 0,
            BabySteps::ServerExtended => 1,
            BabySteps::Client => 2,
        };
        match self.stage_a {
            None => match (self.stage_b.baby, self.stage_b.reach) {
                (BabySteps::Server, Reach::Ahead) => "hoisted-bsgs",
                (BabySteps::ServerExtended, Reach::Ahead) => "double-hoisted-bsgs",
                (BabySteps::Server, Reach::TwoSided) => "hoisted-bsgs-two-sided",
                (BabySteps::ServerExtended, Reach::TwoSided) => "double-hoisted-bsgs-two-sided",
                (BabySteps::Client, _) if self.stage_b.g >= diags => "client-replicated",
                (BabySteps::Client, _) => "client-prerotated",
            },
            Some(a) => {
                // Standard stage B is always on the server.
                let b = owner(self.stage_b.baby).min(1);
                let blocks = match (a.segmented, self.dense_standard()) {
                    (true, _) => 1,
                    (false, true) => 2,
                    (false, false) => 0,
                };
                STANDARD[blocks][owner(a.baby)][b]
            }
        }
    }

    /// A human-readable label with the parameters (`pairs:` for two positions per slot).
    pub fn strategy(&self) -> String {
        let b = self.stage_b;
        let pairs = match self.packing {
            PositionPacking::Real => "",
            PositionPacking::ComplexPairs => "pairs:",
        };
        match self.stage_a {
            None => format!(
                "{pairs}{}(g={},n_out={})",
                self.strategy_family(),
                b.g,
                b.n_out
            ),
            Some(a) => format!(
                "{pairs}{}(P={},gA={},gB={},n_out={})",
                self.strategy_family(),
                a.period,
                a.g,
                b.g,
                b.n_out
            ),
        }
    }
}
