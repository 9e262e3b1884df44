//! Prints the measured per-operation costs (N = 8192, chain 60,40,40 + 60).

use cipherlora_ckks::{CkksParameters, Context, Preset};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let preset = match std::env::args().nth(1).as_deref() {
        Some("fast") => Preset::N8192Depth2Fast,
        _ => Preset::N8192Depth2,
    };
    let ctx = Context::new(CkksParameters::preset(preset)?)?;
    let c = cipherlora_helora::measure::measure_op_costs(&ctx, 20)?;
    println!("{c:#?}");
    Ok(())
}
