//! Fidelity of a masked-ring encoding of the LoRA delta (Delphi-style
//! preprocessing, Mishra et al., USENIX Security 2020, §4; the design is in
//! `docs/design/wire.md`), measured with the plaintext engine.
//!
//! The online path of that design carries fixed-point integers: the client
//! scales each position's input to max |x| ≤ 1 by a power of two and
//! rounds it to `BX` fractional bits; the server holds lora_A and
//! s·lora_B rounded to `BW` bits below each matrix's largest entry and
//! computes Y = B̂·(Â·x̂) exactly in Z_{2^ℓ}; it returns the 32 bits of Y
//! below its bound β = maxᵢ Σₖ |(B̂Â)ᵢₖ|·2^BX, so the client learns Y to
//! within one unit of 2^k, k = ⌈log₂ β⌉ + 1 − 32. The masks cancel exactly
//! and change nothing here, so this example skips them: it replaces the
//! plaintext LoRA by that integer pipeline and compares greedy decoding
//! with the plaintext adapted model's, token for token.
//!
//! For each adapter and bit width it prints the prompts whose output
//! diverged (and at which token), the ring ℓ the exact product needs (the
//! bits each uploaded value must carry: log₂ β + 1), and the precision of
//! the deltas in bits below the largest delta seen (median and worst over
//! every adapted projection and position).
//!
//! Run: `cargo run --release -p cipherlora-speculative --example ring_fidelity -- \
//!   --adapters code-lora-r16,code-ffa-r16,general-lora-r16,general-all-r8 --bits 14,16,18 --limit 10`

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Tensor;
use cipherlora_model::{
    DeltaHook, GenerateOptions, GroupDeltas, LoadOptions, LoraAdapter, LoraWeights, Model,
    ModelError, PlainLora, Proj, ProjGroup, SamplingParams, Tokenizer, WeightMode, fetch, generate,
};

#[path = "common/eval_prompts.rs"]
mod eval_prompts;
use eval_prompts::prompts;

/// Bits each response value carries (the design's download per value).
const RESPONSE_BITS: i32 = 32;

/// One projection's weights in fixed point, with its bound.
struct RingWeights {
    /// lora_A rounded, (r × d_in), and its scale 2^ea.
    a: Vec<i64>,
    /// s·lora_B rounded, (d_out × r), and its scale 2^eb.
    b: Vec<i64>,
    r: usize,
    d_in: usize,
    d_out: usize,
    /// log₂ of the integer scale of Y: ea + eb + BX.
    scale_log2: i32,
    /// ⌈log₂ β⌉: every |Y| is below 2^bound_log2.
    bound_log2: i32,
}

/// Rounds `w` to `bits` bits below its largest magnitude; returns the integers and the exponent e
/// with ŵ = round(w·2^e).
fn quantize(w: &[f32], bits: u32) -> (Vec<i64>, i32) {
    let max = w
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let e = bits as i32 - 1 - max.log2().ceil() as i32;
    let q = w
        .iter()
        .map(|&v| (f64::from(v) * 2f64.powi(e)).round() as i64)
        .collect();
    (q, e)
}

impl RingWeights {
    fn new(w: &LoraWeights, bits: u32) -> Result<Self, ModelError> {
        let (r, d_in) = w.a.dims2()?;
        let d_out = w.b.dims2()?.0;
        let a: Vec<f32> = w.a.flatten_all()?.to_vec1()?;
        let b: Vec<f32> = (w.b.flatten_all()? * w.scaling)?.to_vec1()?;
        let (a, ea) = quantize(&a, bits);
        let (b, eb) = quantize(&b, bits);
        // β = max_i Σ_k |(B̂Â)_ik| · 2^BX, in f64 (an upper bound to within rounding).
        let mut beta = 0f64;
        for i in 0..d_out {
            let mut row = 0f64;
            for k in 0..d_in {
                let m: i64 = (0..r).map(|j| b[i * r + j] * a[j * d_in + k]).sum();
                row += (m as f64).abs();
            }
            beta = beta.max(row);
        }
        Ok(RingWeights {
            a,
            b,
            r,
            d_in,
            d_out,
            scale_log2: ea + eb + bits as i32,
            bound_log2: (beta * 2f64.powi(bits as i32)).log2().ceil() as i32,
        })
    }

    /// The deltas (T × d_out) the client reconstructs for `x` (T × d_in), inputs at `bits`.
    fn delta(&self, x: &[f32], t: usize, bits: u32) -> Vec<f32> {
        let k = (self.bound_log2 + 1 - RESPONSE_BITS).max(0);
        let mut out = vec![0f32; t * self.d_out];
        for p in 0..t {
            let row = &x[p * self.d_in..(p + 1) * self.d_in];
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            // The client's power-of-two normalisation to max |x| ≤ 1.
            let s = if max > 0.0 {
                max.log2().ceil() as i32
            } else {
                0
            };
            let xq: Vec<i128> = row
                .iter()
                .map(|&v| (f64::from(v) * 2f64.powi(bits as i32 - s)).round() as i128)
                .collect();
            let u: Vec<i128> = (0..self.r)
                .map(|j| {
                    let a = &self.a[j * self.d_in..(j + 1) * self.d_in];
                    a.iter().zip(&xq).map(|(&a, &x)| i128::from(a) * x).sum()
                })
                .collect();
            for i in 0..self.d_out {
                let y: i128 = (0..self.r)
                    .map(|j| i128::from(self.b[i * self.r + j]) * u[j])
                    .sum();
                // The 32 returned bits: Y to one unit of 2^k (the carry from the masked low bits).
                let y = (y >> k) << k;
                out[p * self.d_out + i] = (y as f64 * 2f64.powi(s - self.scale_log2)) as f32;
            }
        }
        out
    }
}

/// The ring pipeline as a delta hook, recording each delta's error against the plaintext LoRA.
struct RingLora<'a> {
    adapter: &'a LoraAdapter,
    bits: u32,
    weights: HashMap<(usize, Proj), RingWeights>,
    /// Per projection call: log₂(max |delta| / max |error|).
    precision: Vec<f64>,
}

impl<'a> RingLora<'a> {
    fn new(adapter: &'a LoraAdapter, bits: u32) -> Self {
        RingLora {
            adapter,
            bits,
            weights: HashMap::new(),
            precision: Vec::new(),
        }
    }

    /// The largest ring ℓ any projection needs: ⌈log₂ β⌉ + 1.
    fn ring_bits(&self) -> i32 {
        self.weights
            .values()
            .map(|w| w.bound_log2 + 1)
            .max()
            .unwrap_or(0)
    }
}

impl DeltaHook for RingLora<'_> {
    fn deltas(
        &mut self,
        layer: usize,
        group: ProjGroup,
        x: &Tensor,
    ) -> Result<GroupDeltas, ModelError> {
        let (t, _) = x.dims2()?;
        let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let mut out = GroupDeltas::none();
        for &p in group.projs() {
            let Some(w) = self.adapter.get(layer, p) else {
                continue;
            };
            let ring = match self.weights.entry((layer, p)) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(RingWeights::new(w, self.bits)?)
                }
            };
            let got = ring.delta(&xs, t, self.bits);
            let want: Vec<f32> = w.delta(x)?.flatten_all()?.to_vec1()?;
            let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
            if max > 0.0 && err > 0.0 {
                self.precision.push(f64::from(max / err).log2());
            }
            out.push(p, Tensor::from_vec(got, (t, ring.d_out), x.device())?);
        }
        Ok(out)
    }

    fn wants(&self, layer: usize, group: ProjGroup) -> bool {
        PlainLora::new(self.adapter).wants(layer, group)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut adapters = "code-lora-r16,code-ffa-r16,general-lora-r16,general-all-r8".to_string();
    let mut bits = "14,16,18".to_string();
    let (mut limit, mut tokens) = (10usize, 64usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--adapters" => adapters = v,
            "--bits" => bits = v,
            "--limit" => limit = v.parse()?,
            "--tokens" => tokens = v.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let bits: Vec<u32> = bits.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let path = fetch::ensure_default_model()?;
    let model = Model::load_with(
        &path,
        &LoadOptions {
            weights: WeightMode::F32,
        },
    )?;
    let tok = Tokenizer::for_model(&path)?;
    let opts = GenerateOptions {
        max_tokens: tokens,
        sampling: SamplingParams::greedy(),
        eos: tok.eos_tokens().to_vec(),
    };
    println!(
        "| adapter | bits (x, lora_A, lora_B) | ring ℓ (bits up per value) | prompts | diverged (prompt: token) | delta precision, bits: median / worst |"
    );
    println!("| --- | ---: | ---: | ---: | --- | --- |");
    for name in adapters.split(',') {
        let adapter = LoraAdapter::load(&root.join("adapters").join(name), model.config())?;
        let prompts = prompts(&root, name)?;
        let prompts = &prompts[..limit.min(prompts.len())];
        let mut want = Vec::new();
        for text in prompts {
            let ids = tok.encode(text)?;
            let out = generate(
                &model,
                &ids,
                &opts,
                &mut PlainLora::new(&adapter),
                &mut |_| Ok(()),
            )?;
            want.push((ids, out.tokens));
        }
        for &b in &bits {
            let mut hook = RingLora::new(&adapter, b);
            let mut diverged = Vec::new();
            for (i, (ids, reference)) in want.iter().enumerate() {
                let got = generate(&model, ids, &opts, &mut hook, &mut |_| Ok(()))?.tokens;
                if let Some(at) =
                    (0..got.len().max(reference.len())).find(|&j| got.get(j) != reference.get(j))
                {
                    diverged.push(format!("{i}: {at}"));
                }
            }
            let mut p = std::mem::take(&mut hook.precision);
            p.sort_by(f64::total_cmp);
            let median = p.get(p.len() / 2).copied().unwrap_or(f64::NAN);
            let worst = p.first().copied().unwrap_or(f64::NAN);
            println!(
                "| {name} | {b} | {} | {} | {} | {median:.1} / {worst:.1} |",
                hook.ring_bits(),
                prompts.len(),
                if diverged.is_empty() {
                    "none".to_string()
                } else {
                    diverged.join(", ")
                },
            );
        }
    }
    Ok(())
}
