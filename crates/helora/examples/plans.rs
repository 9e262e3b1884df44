//! Prints what the planner picks for each benchmark shape, mode and T under
//! the default cost model, with the op counts for one verify round.

use cipherlora_helora::planner::choose;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{Link, Mode, OpCosts};

fn main() -> Result<(), cipherlora_helora::HeloraError> {
    let (costs, link) = (OpCosts::default(), Link::default());
    for m in ModelShape::all() {
        for mode in [Mode::Ffa, Mode::Standard] {
            for t in [1, 5, 9, 17] {
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
