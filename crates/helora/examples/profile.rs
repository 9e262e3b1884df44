//! Where the server's time goes in a real evaluation: wraps the CKKS server and sums thread CPU
//! time per operation kind (default model, FFA and standard, planner's plan under the default cost
//! model).
//!
//! `PROFILE_T` sets the positions T (default 9); `PROFILE_LAYERS` prepares that many distinct
//! copies of each group's diagonals and cycles through them (default 1), so that with 30 the
//! plaintexts come from memory as in a round of the default model rather than from the cache.

use std::cell::RefCell;
use std::collections::BTreeMap;

use cipherlora_ckks::{CkksParameters, Context, Preset};
use cipherlora_helora::measure::thread_cpu_ms;
use cipherlora_helora::planner::choose;
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{
    CkksClient, CkksServer, GroupAdapter, GroupClient, HeServer, Link, Mode, PreparedGroup,
    ProductSum, ProjectionAdapter, Result,
};

struct Timed<'a> {
    inner: &'a CkksServer,
    t: RefCell<BTreeMap<&'static str, (f64, usize)>>,
}

impl Timed<'_> {
    fn time<T>(&self, k: &'static str, f: impl FnOnce() -> T) -> T {
        let t0 = thread_cpu_ms();
        let r = f();
        let mut m = self.t.borrow_mut();
        let e = m.entry(k).or_insert((0.0, 0));
        e.0 += thread_cpu_ms() - t0;
        e.1 += 1;
        r
    }
}

impl HeServer for Timed<'_> {
    type Ct = <CkksServer as HeServer>::Ct;
    type Pt = <CkksServer as HeServer>::Pt;
    type ExtCt = <CkksServer as HeServer>::ExtCt;
    type ExtPt = <CkksServer as HeServer>::ExtPt;
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn max_level(&self) -> usize {
        self.inner.max_level()
    }
    fn level(&self, ct: &Self::Ct) -> usize {
        self.inner.level(ct)
    }
    fn encode_weights(&self, v: &[f64], l: usize) -> Result<Self::Pt> {
        self.inner.encode_weights(v, l)
    }
    fn encode_weights_extended(&self, v: &[f64], l: usize) -> Result<Self::ExtPt> {
        self.inner.encode_weights_extended(v, l)
    }
    fn rotate_hoisted_extended(&self, c: &Self::Ct, s: &[i64]) -> Result<Vec<Self::ExtCt>> {
        self.time("rotate_hoisted_ext(batch)", || {
            self.inner.rotate_hoisted_extended(c, s)
        })
    }
    fn dot_plain_extended(&self, c: &[&Self::ExtCt], p: &[&Self::ExtPt]) -> Result<Self::ExtCt> {
        self.time("dot_plain_ext", || self.inner.dot_plain_extended(c, p))
    }
    fn dot_plain_extended_many(
        &self,
        sums: &[ProductSum<'_, Self::ExtCt, Self::ExtPt>],
    ) -> Result<Vec<Self::ExtCt>> {
        self.time("dot_plain_ext(sums)", || {
            self.inner.dot_plain_extended_many(sums)
        })
    }
    fn dot_plain_many(&self, sums: &[ProductSum<'_, Self::Ct, Self::Pt>]) -> Result<Vec<Self::Ct>> {
        self.time("dot_plain(sums)", || self.inner.dot_plain_many(sums))
    }
    fn mod_down_rescale(&self, c: &Self::ExtCt) -> Result<Self::Ct> {
        self.time("mod_down_rescale", || self.inner.mod_down_rescale(c))
    }
    fn dot_plain(&self, c: &[&Self::Ct], p: &[&Self::Pt]) -> Result<Self::Ct> {
        self.time("dot_plain", || self.inner.dot_plain(c, p))
    }
    fn add_assign(&self, a: &mut Self::Ct, b: &Self::Ct) -> Result<()> {
        self.time("add", || self.inner.add_assign(a, b))
    }
    fn rotate(&self, c: &Self::Ct, s: i64) -> Result<Self::Ct> {
        self.time("rotate", || self.inner.rotate(c, s))
    }
    fn rotate_hoisted(&self, c: &Self::Ct, s: &[i64]) -> Result<Vec<Self::Ct>> {
        self.time("rotate_hoisted(batch)", || self.inner.rotate_hoisted(c, s))
    }
    fn rescale(&self, c: &Self::Ct) -> Result<Self::Ct> {
        self.time("rescale", || self.inner.rescale(c))
    }
    fn rerandomize(&self, c: &Self::Ct) -> Result<Self::Ct> {
        self.time("rerandomize", || self.inner.rerandomize(c))
    }
    fn input_from_bytes(&self, b: &[u8]) -> Result<Self::Ct> {
        self.time("input_from_bytes", || self.inner.input_from_bytes(b))
    }
    fn output_to_bytes(&self, c: &Self::Ct) -> Vec<u8> {
        self.time("output_to_bytes", || self.inner.output_to_bytes(c))
    }
    fn output_to_bytes_bounded(&self, c: &Self::Ct, bound: f64, bits: u32) -> Result<Vec<u8>> {
        self.time("output_to_bytes", || {
            self.inner.output_to_bytes_bounded(c, bound, bits)
        })
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(CkksParameters::preset(Preset::N8192Depth2Fast)?)?;
    let client = CkksClient::new(&ctx)?;
    let costs = cipherlora_helora::measure::measure_op_costs(&ctx, 20)?;
    let t: usize = std::env::var("PROFILE_T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    for mode in [Mode::Ffa, Mode::Standard] {
        for (g, shape) in ModelShape::smollm2_135m().groups {
            let (plan, est) = choose(
                &shape,
                mode,
                t,
                ctx.slots(),
                false,
                &costs,
                &Link::default(),
            )?;
            let steps: Vec<i64> = plan.galois_steps()?.into_iter().collect();
            let server = CkksServer::new(&ctx, client.galois_keys(&steps), None)?;
            let timed = Timed {
                inner: &server,
                t: RefCell::new(BTreeMap::new()),
            };
            let ad = GroupAdapter {
                d_in: shape.d_in,
                projections: shape
                    .d_outs
                    .iter()
                    .zip(&shape.ranks)
                    .map(|(&d, &r)| ProjectionAdapter {
                        name: String::new(),
                        d_out: d,
                        rank: r,
                        a: vec![0.01; r * shape.d_in],
                        b: vec![0.01; d * r],
                        scaling: 1.0,
                    })
                    .collect(),
            };
            // PROFILE_LAYERS distinct copies of the group's diagonals, run one after the other as a
            // round does (their plaintexts then come from memory, not from the cache).
            let layers: usize = std::env::var("PROFILE_LAYERS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            let prepared = (0..layers)
                .map(|_| PreparedGroup::new(&timed, &plan, &ad))
                .collect::<Result<Vec<_>>>()?;
            let gc = match mode {
                Mode::Ffa => GroupClient::ffa(
                    &plan,
                    &ad.projections
                        .iter()
                        .map(|p| p.a.clone())
                        .collect::<Vec<_>>(),
                )?,
                Mode::Standard => GroupClient::standard(&plan)?,
            };
            let x = vec![0.5f32; t * shape.d_in];
            let (req, _scales) = gc.encrypt(&client, &x)?;
            let reps = 10 * layers;
            timed.t.borrow_mut().clear();
            let t0 = thread_cpu_ms();
            for i in 0..reps {
                prepared[i % layers].handle(&timed, &req, 0)?;
            }
            let total = (thread_cpu_ms() - t0) / reps as f64;
            println!(
                "{mode:?} {g} {} total {total:.2} ms (model {:.2})",
                plan.strategy(),
                est.server_ms
            );
            for (k, (ms, n)) in timed.t.borrow().iter() {
                println!(
                    "  {k:24} {:7.3} ms  ({} calls, {:.4} ms each)",
                    ms / reps as f64,
                    n / reps,
                    ms / *n as f64
                );
            }
        }
    }
    Ok(())
}
