//! Prints what the planner picks for each benchmark shape, mode and T, with the op counts for one
//! verify round.
//!
//! `cargo run --release -p cipherlora-helora --example plans -- [COSTS.json] [T…]`: under the
//! default cost model, or under a server's cached op costs (the JSON files of
//! `crates/private/src/server/cost_cache.rs`); T = 1, 5, 9, 17 unless given.

use cipherlora_helora::planner::choose;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{Link, Mode, OpCosts};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut costs = OpCosts::default();
    let mut ts = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg.ends_with(".json") {
            costs = serde_json::from_str(&std::fs::read_to_string(&arg)?)?;
        } else {
            ts.push(arg.parse::<usize>()?);
        }
    }
    if ts.is_empty() {
        ts = vec![1, 5, 9, 17];
    }
    let link = Link::default();
    for m in ModelShape::all() {
        for mode in [Mode::Ffa, Mode::Standard] {
            for &t in &ts {
                for (g, s) in &m.groups {
                    let (p, e) = choose(s, mode, t, 4096, false, &costs, &link)?;
                    let floor = (t * s.total_out() * s.total_rank()).div_ceil(4096);
                    println!(
                        "{} {mode:?} T={t} {g}: {} ct_pt={} floor={} rot={} enc={} dec={} keys={} est={:.1}ms",
                        m.name,
                        p.strategy(),
                        e.counts.ct_pt_total(),
                        floor,
                        e.counts.rotations_total(),
                        e.counts.encryptions_total(),
                        e.counts.decryptions,
                        e.galois_keys,
                        e.total_ms
                    );
                }
            }
        }
    }
    Ok(())
}
