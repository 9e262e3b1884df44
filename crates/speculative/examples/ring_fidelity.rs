//! Fidelity of a masked-ring encoding of the LoRA delta (Delphi-style
//! preprocessing, Mishra et al., USENIX Security 2020, §4; the design is in
//! `docs/design/wire.md`), measured with the plaintext engine.
//!
//! Every adapted projection runs the online exchange of
//! `cipherlora_helora::ring`: the server holds lora_A and s·lora_B rounded
//! to `--bits` bits; the client encodes each position's input in fixed
//! point with as many bits as the 60-bit field allows for that projection
//! and sends it under a fresh one-time mask; the server returns the top
//! `--response-bits` bits (32 by default) of its masked product in `Z_p`;
//! the client adds what it kept of the
//! offline value and decodes. The offline values (`M̂·r − m`) are computed
//! in the clear here, where a deployment would compute them under
//! encryption. Greedy decoding is compared with the plaintext adapted
//! model's, token for token.
//!
//! For each adapter, weight width and response width it prints the range of input bits
//! over the projections, the prompts whose output diverged (and at which
//! token), and the precision of the deltas in bits below the largest delta
//! seen (median and worst over every adapted projection and position).
//!
//! Run: `cargo run --release -p cipherlora-speculative --example ring_fidelity -- \
//!   --adapters code-lora-r16,code-ffa-r16,general-lora-r16,general-all-r8 --bits 12,14,16 \
//!   --response-bits 32 --limit 10`

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Tensor;
use cipherlora_helora::HeloraError;
use cipherlora_helora::ring::{
    RingInput, RingParams, RingProjection, kept_bits, minus, sample_mask, unmask,
};
use cipherlora_model::{
    DeltaHook, GenerateOptions, GroupDeltas, LoadOptions, LoraAdapter, LoraWeights, Model,
    ModelError, PlainLora, Proj, ProjGroup, SamplingParams, Tokenizer, WeightMode, fetch, generate,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

#[path = "common/eval_prompts.rs"]
mod eval_prompts;
use eval_prompts::prompts;

/// A ring error as the hook's error for `(layer, proj)`.
fn hook_error(layer: usize, proj: Proj) -> impl Fn(HeloraError) -> ModelError {
    move |e| ModelError::Hook {
        layer,
        proj,
        reason: e.to_string(),
    }
}

/// One projection's ring weights, from the adapter's.
fn ring_projection(
    w: &LoraWeights,
    params: RingParams,
    (layer, proj): (usize, Proj),
) -> Result<RingProjection, ModelError> {
    let (r, d_in) = w.a.dims2()?;
    let d_out = w.b.dims2()?.0;
    let a: Vec<f32> = w.a.flatten_all()?.to_vec1()?;
    let b: Vec<f32> = (w.b.flatten_all()? * w.scaling)?.to_vec1()?;
    RingProjection::new(&a, &b, (r, d_in, d_out), params).map_err(hook_error(layer, proj))
}

/// The deltas (T × d_out) for `x` (T × d_in) through the masked online exchange.
fn ring_delta(
    p: &RingProjection,
    x: &[f32],
    t: usize,
    rng: &mut ChaCha20Rng,
) -> Result<Vec<f32>, HeloraError> {
    let mut out = Vec::with_capacity(t * p.d_out());
    for row in x.chunks_exact(p.d_in()).take(t) {
        // Offline (in the clear here): the client's r, the server's m, the client's M̂·r − m.
        let (r, m) = (sample_mask(rng, p.d_in()), sample_mask(rng, p.d_out()));
        let c = minus(&p.product(&r)?, &m)?;
        // Online.
        let input = RingInput::encode(row, p.input_bits());
        let response = p.respond(&input.masked(&r)?, &m)?;
        let z = unmask(&response, &kept_bits(&c, p.shift()), p.shift())?;
        out.extend(p.decode(&z, input.exponent));
    }
    Ok(out)
}

/// The ring pipeline as a delta hook, recording each delta's error against the plaintext LoRA.
struct RingLora<'a> {
    adapter: &'a LoraAdapter,
    params: RingParams,
    weights: HashMap<(usize, Proj), RingProjection>,
    /// The masks' CSPRNG (seeded: the masks cancel, so the output does not depend on it).
    rng: ChaCha20Rng,
    /// Per projection call: log₂(max |delta| / max |error|).
    precision: Vec<f64>,
}

impl<'a> RingLora<'a> {
    fn new(adapter: &'a LoraAdapter, (weight_bits, response_bits): (u32, u32)) -> Self {
        RingLora {
            adapter,
            params: RingParams {
                weight_bits,
                response_bits,
            },
            weights: HashMap::new(),
            rng: ChaCha20Rng::seed_from_u64(7),
            precision: Vec::new(),
        }
    }

    /// The range of input bits over the projections (each fills the field).
    fn input_bits(&self) -> (u32, u32) {
        let bits = self.weights.values().map(RingProjection::input_bits);
        (bits.clone().min().unwrap_or(0), bits.max().unwrap_or(0))
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
                    e.insert(ring_projection(w, self.params, (layer, p))?)
                }
            };
            let got = ring_delta(ring, &xs, t, &mut self.rng).map_err(hook_error(layer, p))?;
            let want: Vec<f32> = w.delta(x)?.flatten_all()?.to_vec1()?;
            let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
            if max > 0.0 && err > 0.0 {
                self.precision.push(f64::from(max / err).log2());
            }
            out.push(p, Tensor::from_vec(got, (t, ring.d_out()), x.device())?);
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
    let mut bits = "12,14,16".to_string();
    let mut response_bits = RingParams::default().response_bits.to_string();
    let (mut limit, mut tokens) = (10usize, 64usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--adapters" => adapters = v,
            "--bits" => bits = v,
            "--response-bits" => response_bits = v,
            "--limit" => limit = v.parse()?,
            "--tokens" => tokens = v.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let bits: Vec<u32> = bits.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let response_bits: Vec<u32> = response_bits
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
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
        "| adapter | bits of lora_A, lora_B | response bits | bits of x | prompts | diverged (prompt: token) | delta precision, bits: median / worst |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | --- | --- |");
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
        for (b, rb) in bits
            .iter()
            .flat_map(|&b| response_bits.iter().map(move |&rb| (b, rb)))
        {
            let mut hook = RingLora::new(&adapter, (b, rb));
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
            let (lo, hi) = hook.input_bits();
            println!(
                "| {name} | {b} | {rb} | {lo}–{hi} | {} | {} | {median:.1} / {worst:.1} |",
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
