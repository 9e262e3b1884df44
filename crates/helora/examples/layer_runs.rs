//! Uploaded and returned ciphertexts per layer when a session groups its requests by runs of n
//! layers (`Grouping::ByLayers(n)` in `cipherlora-private`), next to one request per input group:
//! the planner's plans for the default model (q,k,v,o at rank 16), default op costs and link, for a
//! few verify widths T, FFA and standard LoRA.
//!
//! Sessions fuse layers for FFA only: a standard-LoRA client uploads the activations themselves,
//! and the standard rows show why it would not pay (a fused stage A costs more server time than the
//! groups it replaces).
//!
//! `cargo run --release -p cipherlora-helora --example layer_runs -- [COSTS.json]`: under the
//! default cost model, or under measured op costs (the JSON of a server's op-cost cache, or of the
//! `opcosts` example).

use cipherlora_helora::adapter::GroupShape;
use cipherlora_helora::planner::choose;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{Link, Mode, OpCosts};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let costs = match std::env::args().nth(1) {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => OpCosts::default(),
    };
    let link = Link::default();
    let model = ModelShape::smollm2_135m();
    println!(
        "| LoRA | T | layers per request | plan | uploaded / returned ciphertexts per layer | server ms per layer (model) |"
    );
    println!("| --- | ---: | --- | --- | --- | ---: |");
    for (mode, widths) in [
        (Mode::Ffa, [6, 8, 10, 12, 16].as_slice()),
        (Mode::Standard, [4, 6, 8, 10].as_slice()),
    ] {
        for &t in widths {
            // One request per input group: each group's own plan.
            let (mut up, mut down, mut ms) = (0, 0, 0.0);
            for (_, g) in &model.groups {
                let (_, e) = choose(g, mode, t, 4096, false, &costs, &link)?;
                up += e.counts.encryptions_total();
                down += e.counts.decryptions;
                ms += e.server_ms;
            }
            println!("| {mode:?} | {t} | by input | (one per group) | {up} / {down} | {ms:.2} |");
            for n in 1..=4usize {
                // n layers' groups side by side: inputs concatenated, outputs and ranks listed in
                // forward order.
                let mut shape = GroupShape {
                    d_in: 0,
                    d_outs: Vec::new(),
                    ranks: Vec::new(),
                };
                for _ in 0..n {
                    for (_, g) in &model.groups {
                        shape.d_in += g.d_in;
                        shape.d_outs.extend_from_slice(&g.d_outs);
                        shape.ranks.extend_from_slice(&g.ranks);
                    }
                }
                let (plan, e) = choose(&shape, mode, t, 4096, false, &costs, &link)?;
                let per_layer = |c: u64| c as f64 / n as f64;
                println!(
                    "| {mode:?} | {t} | {n} | {} | {:.2} / {:.2} | {:.2} |",
                    plan.strategy(),
                    per_layer(e.counts.encryptions_total()),
                    per_layer(e.counts.decryptions),
                    e.server_ms / n as f64
                );
            }
        }
    }
    Ok(())
}
