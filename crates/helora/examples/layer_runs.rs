//! Uploaded and returned ciphertexts per layer when an FFA session groups
//! its requests by runs of n layers (`Grouping::ByLayers(n)` in
//! `cipherlora-private`): the planner's plan for the fused shape of n
//! layers of the default model (q,k,v,o at rank 16), default op costs and
//! link, for a few verify widths T.
//!
//! `cargo run --release -p cipherlora-helora --example layer_runs`

use cipherlora_helora::adapter::GroupShape;
use cipherlora_helora::planner::choose;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{Link, Mode, OpCosts};

fn main() -> Result<(), cipherlora_helora::HeloraError> {
    let (costs, link) = (OpCosts::default(), Link::default());
    let model = ModelShape::smollm2_135m();
    println!(
        "| T | layers per request | plan | uploaded / returned ciphertexts per layer | server ms per layer (model) |"
    );
    println!("| ---: | ---: | --- | --- | ---: |");
    for t in [6, 8, 10, 12, 16] {
        for n in 1..=4usize {
            // n layers' groups side by side: inputs concatenated, outputs
            // and ranks listed in forward order.
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
            let (plan, e) = choose(&shape, Mode::Ffa, t, 4096, false, &costs, &link)?;
            let per_layer = |c: u64| c as f64 / n as f64;
            println!(
                "| {t} | {n} | {} | {:.2} / {:.2} | {:.2} |",
                plan.strategy(),
                per_layer(e.counts.encryptions_total()),
                per_layer(e.counts.decryptions),
                e.server_ms / n as f64
            );
        }
    }
    Ok(())
}
