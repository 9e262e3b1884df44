use cipherlora_helora::adapter::GroupShape;
use cipherlora_helora::planner::choose;
use cipherlora_helora::{Link, Mode, OpCosts};
fn main() {
    let (costs, link) = (OpCosts::default(), Link::default());
    for t in [6, 8, 10, 12, 16] {
        for k in [1usize, 2, 3, 4] {
            let mut d_outs = vec![];
            let mut ranks = vec![];
            for _ in 0..k { d_outs.extend([576, 192, 192, 576]); ranks.extend([16; 4]); }
            let s = GroupShape { d_in: 1152 * k, d_outs, ranks };
            let (p, e) = choose(&s, Mode::Ffa, t, 4096, false, &costs, &link).unwrap();
            println!("T={t} k={k}: {} up={} down={} per layer: enc {:.2} dec {:.2} server {:.2}ms",
                p.strategy(), e.counts.encryptions_total(), e.counts.decryptions,
                e.counts.encryptions_total() as f64 / k as f64, e.counts.decryptions as f64 / k as f64, e.server_ms / k as f64);
        }
    }
}
