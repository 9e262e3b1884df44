//! Prints the measured per-operation costs (N = 8192, chain 60,40,40 + 60;
//! `fast`: the default server's `N8192Depth2Fast`).
//!
//! `cargo run --release -p cipherlora-helora --example opcosts -- [fast] [OUT.json]`:
//! with `OUT.json`, also writes them in the op-cost cache's format, which
//! the `plans` and `layer_runs` examples read.

use cipherlora_ckks::{CkksParameters, Context, Preset};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = match args.iter().any(|a| a == "fast") {
        true => Preset::N8192Depth2Fast,
        false => Preset::N8192Depth2,
    };
    let ctx = Context::new(CkksParameters::preset(preset)?)?;
    let c = cipherlora_helora::measure::measure_op_costs(&ctx, 20)?;
    println!("{c:#?}");
    if let Some(out) = args.iter().find(|a| a.ends_with(".json")) {
        std::fs::write(out, serde_json::to_string_pretty(&c)?)?;
    }
    Ok(())
}
