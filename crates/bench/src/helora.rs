//! `cipherlora bench helora`: HE-LoRA cost of one verify round per shape ×
//! mode × T × strategy (op counts × measured op medians, and real
//! ciphertexts for the default model), against the ct×pt floor.

use cipherlora_helora::measure::thread_cpu_ms as cpu_ms;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use cipherlora_ckks::{CkksParameters, Context, Preset};
use cipherlora_helora::planner::{best_per_family, choose};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{
    CkksClient, CkksServer, Estimate, GroupAdapter, GroupClient, GroupPlan, GroupShape, Link, Mode,
    OpCosts, OpCounts, PositionPacking, PreparedGroup, ProjectionAdapter,
};
use serde_json::{Value, json};

/// Options of `cipherlora bench helora`.
#[derive(Debug, Clone)]
pub struct HeloraBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// Timed repetitions per operation when measuring op costs.
    pub reps: usize,
    /// Use the IFMA-friendly preset (primes ≤ 50 bits) instead of 60,40,40.
    pub fast: bool,
    /// Link bandwidth, Mbit/s (planner input).
    pub bandwidth_mbit_s: f64,
    /// Link round-trip time, ms (planner input).
    pub rtt_ms: f64,
    /// Skip the end-to-end CKKS runs (modelled figures only).
    pub no_e2e: bool,
    /// Full repeats, op costs measured afresh (the median repeat is shown).
    pub runs: usize,
}

/// Positions per verify round benchmarked.
const TS: [usize; 4] = [1, 5, 9, 17];

/// TenSEAL per projection per token (ms, 2 threads, N=8192): (shape, mode) → ms.
fn tenseal_ms(shape: &str, mode: Mode) -> f64 {
    match (shape, mode) {
        ("smollm2-135m", Mode::Ffa) => 51.0,
        ("smollm2-135m", Mode::Standard) => 2315.0,
        (_, Mode::Ffa) => 100.0,
        (_, Mode::Standard) => 9356.0,
    }
}

/// The paper's per-projection-token HE cost (speculative-batching-tensafe.md).
const PAPER_MS: f64 = 3411.0;

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Ffa => "ffa",
        Mode::Standard => "standard",
    }
}

fn projections(model: &ModelShape) -> usize {
    model.groups.iter().map(|(_, s)| s.d_outs.len()).sum()
}

/// Σ over the groups of one layer of ⌈T·Σd_out·R / slots⌉.
fn floor_ct_pt(model: &ModelShape, t: usize, slots: usize) -> u64 {
    model
        .groups
        .iter()
        .map(|(_, s)| (t * s.total_out() * s.total_rank()).div_ceil(slots) as u64)
        .sum()
}

struct Row {
    strategy: String,
    chosen: bool,
    counts: OpCounts,
    bytes_up: f64,
    bytes_down: f64,
    /// Galois keys (union of the steps of all groups' plans; shared by layers).
    keys: usize,
    client_ms: f64,
    server_ms: f64,
    plans: Vec<GroupPlan>,
}

fn total(model: &ModelShape, picks: Vec<(GroupPlan, Estimate)>, chosen: bool) -> Row {
    let layers = model.layers as u64;
    let mut counts = OpCounts::default();
    let (mut up, mut down, mut c_ms, mut s_ms) = (0.0, 0.0, 0.0, 0.0);
    let mut steps = std::collections::BTreeSet::new();
    let mut names = Vec::new();
    let mut plans = Vec::new();
    for ((gname, _), (p, e)) in model.groups.iter().zip(picks) {
        counts += e.counts * layers;
        up += e.bytes_up * layers as f64;
        down += e.bytes_down * layers as f64;
        c_ms += e.client_ms * layers as f64;
        s_ms += e.server_ms * layers as f64;
        steps.extend(p.galois_steps().unwrap_or_default());
        names.push(format!("{gname}:{}", p.strategy()));
        plans.push(p);
    }
    Row {
        strategy: names.join(" "),
        chosen,
        counts,
        bytes_up: up,
        bytes_down: down,
        keys: steps.len(),
        client_ms: c_ms,
        server_ms: s_ms,
        plans,
    }
}

/// Deterministic pseudo-random adapter (timing only; values irrelevant).
/// A fixed random adapter of `shape` (timings do not depend on the weights).
pub(crate) fn adapter(shape: &GroupShape) -> GroupAdapter {
    let mut z = 0x1234_5678_u64;
    let mut next = move || {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        ((z >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 0.1
    };
    GroupAdapter {
        d_in: shape.d_in,
        projections: shape
            .d_outs
            .iter()
            .zip(&shape.ranks)
            .enumerate()
            .map(|(i, (&d, &r))| ProjectionAdapter {
                name: format!("p{i}"),
                d_out: d,
                rank: r,
                a: (0..r * shape.d_in).map(|_| next()).collect(),
                b: (0..d * r).map(|_| next()).collect(),
                scaling: 2.0,
            })
            .collect(),
    }
}

/// Timed end-to-end repetitions per group (after one warm-up).
const E2E_REPS: usize = 5;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One layer's groups end to end: (client ms, server ms), median CPU time.
fn e2e_layer(
    ctx: &Arc<Context>,
    model: &ModelShape,
    plans: &[GroupPlan],
) -> anyhow::Result<(f64, f64)> {
    let client = CkksClient::new(ctx)?;
    let (mut c_ms, mut s_ms) = (0.0, 0.0);
    for ((_, shape), plan) in model.groups.iter().zip(plans) {
        let steps: Vec<i64> = plan.galois_steps()?.into_iter().collect();
        let server = CkksServer::new(ctx, client.galois_keys(&steps), None)?;
        let ad = adapter(shape);
        let prepared = PreparedGroup::new(&server, plan, &ad)?;
        let gc = match plan.mode {
            Mode::Ffa => {
                let a: Vec<Vec<f32>> = ad.projections.iter().map(|p| p.a.clone()).collect();
                GroupClient::ffa(plan, &a)?
            }
            Mode::Standard => GroupClient::standard(plan)?,
        };
        let x: Vec<f32> = (0..plan.t * shape.d_in)
            .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
            .collect();
        // One warm-up, then the median of `E2E_REPS` timed rounds.
        let (mut cs, mut ss) = (Vec::new(), Vec::new());
        for rep in 0..=E2E_REPS {
            let t0 = cpu_ms();
            let (req, scales) = gc.encrypt(&client, &x)?;
            let t1 = cpu_ms();
            let resp = prepared.handle(&server, &req, 0)?;
            let t2 = cpu_ms();
            let _ = gc.deltas(&client, &resp, &scales)?;
            let t3 = cpu_ms();
            if rep > 0 {
                cs.push(t1 - t0 + (t3 - t2));
                ss.push(t2 - t1);
            }
        }
        c_ms += median(&mut cs);
        s_ms += median(&mut ss);
    }
    Ok((c_ms, s_ms))
}

/// Runs the benchmark. Errors: CKKS engine errors, unwritable reports.
pub fn run(opts: &HeloraBenchOptions) -> anyhow::Result<()> {
    let preset = if opts.fast {
        Preset::N8192Depth2Fast
    } else {
        Preset::N8192Depth2
    };
    let ctx = Context::new(CkksParameters::preset(preset)?)?;
    let mut runs: Vec<Value> = Vec::new();
    let mut tables: Vec<(String, OpCosts)> = Vec::new();
    for repeat in 0..opts.runs.max(1) {
        eprintln!("run {} of {}", repeat + 1, opts.runs.max(1));
        let (rows, md, costs) = one_run(opts, &ctx, preset, repeat)?;
        runs.extend(rows);
        tables.push((md, costs));
    }
    let mut order: Vec<(f64, usize)> = runs
        .iter()
        .filter(|r| {
            r["shape"] == "smollm2-135m"
                && r["mode"] == "ffa"
                && r["t"] == 9
                && r["chosen_by_planner"] == true
        })
        .filter_map(|r| {
            Some((
                r["ratio_to_cached_floor"].as_f64()?,
                r["repeat"].as_u64()? as usize,
            ))
        })
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let shown = order.get(order.len() / 2).map_or(0, |&(_, i)| i);
    let (mut md, costs) = tables.swap_remove(shown);
    md = format!(
        "Repeat {} of {} (the median one by the default model's FFA T = 9 ratio to the cached floor):\n\n{md}",
        shown + 1,
        opts.runs.max(1)
    );
    md.push_str(&spread_table(&runs));
    let link = Link {
        bandwidth_mbit_s: opts.bandwidth_mbit_s,
        rtt_ms: opts.rtt_ms,
    };
    let report = json!({
        "bench": "helora",
        "preset": format!("{preset:?}"),
        "slots": ctx.slots(),
        "threads": 1,
        "repeats": opts.runs.max(1),
        "shown_repeat": shown,
        "link": {"bandwidth_mbit_s": link.bandwidth_mbit_s, "rtt_ms": link.rtt_ms},
        "op_costs_ms": {
            "ct_pt": costs.ct_pt_ms, "ct_pt_cached": costs.ct_pt_cached_ms, "rotate": costs.rotate_ms, "hoist": costs.hoist_ms,
            "hoisted_rotate": costs.hoisted_rotate_ms, "add": costs.add_ms, "rescale": costs.rescale_ms,
            "encrypt": costs.encrypt_ms, "decrypt": costs.decrypt_ms, "rerandomize": costs.rerandomize_ms,
            "ext_ct_pt": costs.ext_ct_pt_ms, "ext_hoisted_rotate": costs.ext_hoisted_rotate_ms,
            "extend": costs.extend_ms, "mod_down_rescale": costs.mod_down_rescale_ms,
            "parse_input": costs.parse_input_ms, "serialize_output": costs.serialize_output_ms,
        },
        "bytes": {"upload_ct": costs.upload_ct_bytes, "download_ct": costs.download_ct_bytes, "galois_key": costs.galois_key_bytes},
        "runs": runs,
    });
    let md_path = crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    eprintln!("wrote {} and {}", opts.json.display(), md_path.display());
    Ok(())
}

/// Median and range over repeats of the default model's ratios (Markdown).
fn spread_table(runs: &[Value]) -> String {
    let mut out = String::from(
        "\n| mode | T | repeats | (c+s)/floor | (c+s)/cached floor | e2e (c+s)/floor | e2e (c+s)/cached floor |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let cell = |mut v: Vec<f64>| {
        if v.is_empty() {
            return "–".to_string();
        }
        v.sort_by(f64::total_cmp);
        format!("{:.2} [{:.2}–{:.2}]", v[v.len() / 2], v[0], v[v.len() - 1])
    };
    for mode in ["ffa", "standard"] {
        for t in TS {
            let rows: Vec<&Value> = runs
                .iter()
                .filter(|r| {
                    r["shape"] == "smollm2-135m"
                        && r["mode"] == mode
                        && r["t"] == t
                        && r["chosen_by_planner"] == true
                })
                .collect();
            let col = |f: &dyn Fn(&Value) -> Option<f64>| {
                cell(rows.iter().filter_map(|r| f(r)).collect())
            };
            let measured = |r: &Value, floor: &str| {
                Some(
                    (r["measured_client_ms"].as_f64()? + r["measured_server_ms"].as_f64()?)
                        / r[floor].as_f64()?,
                )
            };
            out.push_str(&format!(
                "| {mode} | {t} | {} | {} | {} | {} | {} |\n",
                rows.len(),
                col(&|r| r["ratio_to_floor"].as_f64()),
                col(&|r| r["ratio_to_cached_floor"].as_f64()),
                col(&|r| measured(r, "floor_ms")),
                col(&|r| measured(r, "cached_floor_ms")),
            ));
        }
    }
    out
}

/// One full run: JSON rows tagged with `repeat`, the Markdown, the op costs.
fn one_run(
    opts: &HeloraBenchOptions,
    ctx: &Arc<Context>,
    preset: Preset,
    repeat: usize,
) -> anyhow::Result<(Vec<Value>, String, OpCosts)> {
    let slots = ctx.slots();
    eprintln!("measuring op costs ({preset:?}, {} reps)…", opts.reps);
    let costs: OpCosts = cipherlora_helora::measure::measure_op_costs(ctx, opts.reps)?;
    let link = Link {
        bandwidth_mbit_s: opts.bandwidth_mbit_s,
        rtt_ms: opts.rtt_ms,
    };
    let mut runs: Vec<Value> = Vec::new();
    let mut md = String::new();
    md.push_str(
        "| shape | mode | T | strategy (planner) | rot | ct×pt | floor ct×pt | up MB | down MB | client ms | server ms | floor ms | (c+s)/floor | cached floor ms | (c+s)/cached floor | (c+s)/cached floor, complex slots | e2e c+s ms | e2e c+s ms, one position per slot | ms / proj-token | × vs TenSEAL | × vs 3,411 ms |\n",
    );
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for model in ModelShape::all() {
        for mode in [Mode::Ffa, Mode::Standard] {
            for t in TS {
                eprintln!("{} {} T={t}…", model.name, mode_name(mode));
                let mut chosen = Vec::new();
                let mut families: Vec<Vec<(GroupPlan, Estimate)>> = Vec::new();
                for (_, shape) in &model.groups {
                    chosen.push(choose(shape, mode, t, slots, false, &costs, &link)?);
                    families.push(best_per_family(
                        shape, mode, t, slots, false, &costs, &link,
                    )?);
                }
                let mut rows = vec![total(&model, chosen, true)];
                // The planner's choice again with circuit-privacy rerandomisation.
                let rerand: Vec<_> = model
                    .groups
                    .iter()
                    .map(|(_, shape)| choose(shape, mode, t, slots, true, &costs, &link))
                    .collect::<Result<_, _>>()?;
                rows.push(total(&model, rerand, false));
                // Restricted to one position per slot (what pairing gains).
                let real: Vec<_> = families
                    .iter()
                    .map(|f| {
                        f.iter()
                            .filter(|(p, _)| p.packing == PositionPacking::Real)
                            .min_by(|a, b| a.1.total_ms.total_cmp(&b.1.total_ms))
                            .cloned()
                            .context("no plan with one position per slot")
                    })
                    .collect::<anyhow::Result<_>>()?;
                rows.push(total(&model, real, false));
                // One row per (strategy family, position packing) in every group.
                let fams: Vec<_> = families[0]
                    .iter()
                    .map(|(p, _)| (p.strategy_family(), p.packing))
                    .collect();
                for fam in fams {
                    let picks: Option<Vec<_>> = families
                        .iter()
                        .map(|f| {
                            f.iter()
                                .find(|(p, _)| (p.strategy_family(), p.packing) == fam)
                                .cloned()
                        })
                        .collect();
                    if let Some(picks) = picks {
                        rows.push(total(&model, picks, false));
                    }
                }
                let floor = floor_ct_pt(&model, t, slots) * model.layers as u64;
                let stage_b_level = 1;
                // The floor streams each diagonal once (and cache-resident, for reference).
                let floor_ms = floor as f64 * costs.ct_pt_ms[stage_b_level];
                let cached_floor_ms = floor as f64 * costs.ct_pt_cached_ms[stage_b_level];
                // Two positions per complex slot double a product's work: floor over 2·(N/2).
                let floor_pairs = floor_ct_pt(&model, t, 2 * slots) * model.layers as u64;
                let cached_floor_pairs_ms =
                    floor_pairs as f64 * costs.ct_pt_cached_ms[stage_b_level];
                let proj_tokens = (projections(&model) * model.layers * t) as f64;
                let e2e_wanted = !opts.no_e2e && model.name == "smollm2-135m";
                // Measured for the planner's choice and its one-per-slot restriction.
                let mut measured = Vec::with_capacity(rows.len());
                for (i, row) in rows.iter().enumerate() {
                    measured.push(if e2e_wanted && (i == 0 || i == 2) {
                        let (c, s) = e2e_layer(ctx, &model, &row.plans).with_context(|| {
                            format!("e2e {} {} T={t}", model.name, mode_name(mode))
                        })?;
                        Some((c * model.layers as f64, s * model.layers as f64))
                    } else {
                        None
                    });
                }
                for (i, row) in rows.iter().enumerate() {
                    let e2e = measured[i];
                    let per_pt = (row.client_ms + row.server_ms) / proj_tokens;
                    runs.push(json!({
                        "repeat": repeat,
                        "shape": model.name,
                        "mode": mode_name(mode),
                        "t": t,
                        "strategy": row.strategy,
                        "chosen_by_planner": row.chosen,
                        "rerandomize": row.plans.iter().any(|p| p.rerandomize),
                        "rotations": row.counts.rotations_total(),
                        "key_switches": row.counts.key_switches(),
                        "ct_pt": row.counts.ct_pt_total(),
                        "encryptions": row.counts.encryptions_total(),
                        "decryptions": row.counts.decryptions,
                        "ciphertexts_up": row.counts.encryptions_total(),
                        "ciphertexts_down": row.counts.decryptions,
                        "bytes_up": row.bytes_up,
                        "bytes_down": row.bytes_down,
                        "galois_keys": row.keys,
                        "galois_key_bytes": row.keys as f64 * costs.galois_key_bytes,
                        "client_ms": row.client_ms,
                        "server_ms": row.server_ms,
                        "floor_ct_pt": floor,
                        "floor_ms": floor_ms,
                        "ratio_to_floor": (row.client_ms + row.server_ms) / floor_ms,
                        "cached_floor_ms": cached_floor_ms,
                        "ratio_to_cached_floor": (row.client_ms + row.server_ms) / cached_floor_ms,
                        "floor_ct_pt_complex_slots": floor_pairs,
                        "cached_floor_complex_slots_ms": cached_floor_pairs_ms,
                        "ratio_to_cached_floor_complex_slots": (row.client_ms + row.server_ms) / cached_floor_pairs_ms,
                        "one_position_per_slot_baseline": i == 2,
                        "per_projection_token_ms": per_pt,
                        "measured_client_ms": e2e.map(|e| e.0),
                        "measured_server_ms": e2e.map(|e| e.1),
                    }));
                    if row.chosen {
                        let c_s = |e: Option<(f64, f64)>| {
                            e.map_or("–".to_string(), |(c, s)| format!("{:.0}", c + s))
                        };
                        let (e2e_s, e2e_real) = (c_s(e2e), c_s(measured[2]));
                        md.push_str(&format!(
                            "| {} | {} | {t} | `{}` | {} | {} | {floor} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {e2e_s} | {e2e_real} | {:.3} | {:.0} | {:.0} |\n",
                            model.name,
                            mode_name(mode),
                            row.strategy,
                            row.counts.rotations_total(),
                            row.counts.ct_pt_total(),
                            row.bytes_up / 1e6,
                            row.bytes_down / 1e6,
                            row.client_ms,
                            row.server_ms,
                            floor_ms,
                            (row.client_ms + row.server_ms) / floor_ms,
                            cached_floor_ms,
                            (row.client_ms + row.server_ms) / cached_floor_ms,
                            (row.client_ms + row.server_ms) / cached_floor_pairs_ms,
                            per_pt,
                            tenseal_ms(model.name, mode) / per_pt,
                            PAPER_MS / per_pt,
                        ));
                    }
                }
            }
        }
    }
    Ok((runs, md, costs))
}
