//! `cipherlora bench masked-ring`: what masked ring values (Delphi-style preprocessing,
//! docs/design/wire.md) cost per prefilled position of the default model, measured on one
//! thread: the batched-BFV offline phase (client encryption of the masks, the server's plan
//! evaluation with its masks and flooding, client decryption, bytes both ways) and the online
//! exchange (the server's integer products, the client's encoding and unmasking, 60 bits up and
//! `RingParams::default().response_bits` down per value). Adapters are random in the default model's shapes: costs do not depend on
//! the weights.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use cipherlora_ckks::{Context, GaloisKeys, PublicKey, SecretKey, os_rng};
use cipherlora_helora::bfv_backend::{OfflineLevels, offline_parameters};
use cipherlora_helora::planner::choose;
use cipherlora_helora::ring::{
    RING_PRIME, RingGroup, RingInput, RingParams, kept_bits, sample_mask, unmask,
};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{BfvClient, BfvServer, GroupShape, Link, Mode, OpCosts, PreparedGroup};
use serde::Serialize;

/// Options of `cipherlora bench masked-ring`.
#[derive(Debug, Clone)]
pub struct MaskedRingBenchOptions {
    /// Where the JSON report goes.
    pub json: PathBuf,
    /// Where the Markdown table goes (default: the JSON path with `.md`).
    pub markdown: Option<PathBuf>,
    /// Positions per offline request.
    pub t: usize,
}

/// One group's costs, per offline request of `t` positions and per online position.
#[derive(Debug, Clone, Serialize)]
pub struct GroupCosts {
    /// `ffa` or `standard`.
    pub mode: String,
    /// Group name (`q,k,v` or `o`).
    pub group: String,
    /// The offline plan.
    pub plan: String,
    /// Galois elements the plan rotates by.
    pub galois_elements: Vec<u64>,
    /// Positions per offline request.
    pub t: usize,
    /// Offline: uploaded bytes (seeded BFV ciphertexts of the masks).
    pub offline_up_bytes: usize,
    /// Offline: returned bytes (flooded ciphertexts at the response level).
    pub offline_down_bytes: usize,
    /// Offline: client encryption, ms.
    pub offline_client_encrypt_ms: f64,
    /// Offline: server evaluation, masking and flooding, ms.
    pub offline_server_ms: f64,
    /// Offline: client decryption and unpacking, ms.
    pub offline_client_decrypt_ms: f64,
    /// Online, per position: values up (60 bits each).
    pub online_values_up: usize,
    /// Online, per position: values down.
    pub online_values_down: usize,
    /// Online, per position: the server's integer products, ms.
    pub online_server_ms: f64,
    /// Online, per position: the client's encoding, masking and unmasking, ms.
    pub online_client_ms: f64,
}

/// Per prefilled position of the whole model (every layer's groups).
#[derive(Debug, Clone, Serialize)]
pub struct ModelCosts {
    /// `ffa` or `standard`.
    pub mode: String,
    /// Offline bytes up per position.
    pub offline_up_bytes: f64,
    /// Offline bytes down per position.
    pub offline_down_bytes: f64,
    /// Offline bits per value up (mask values) and down (delta values).
    pub offline_bits_up: f64,
    /// Offline bits per delta value down.
    pub offline_bits_down: f64,
    /// Offline client ms per position (encryption and decryption).
    pub offline_client_ms: f64,
    /// Offline server ms per position.
    pub offline_server_ms: f64,
    /// Online bytes up per position.
    pub online_up_bytes: f64,
    /// Online bytes down per position.
    pub online_down_bytes: f64,
    /// Online server ms per position.
    pub online_server_ms: f64,
    /// Online client ms per position.
    pub online_client_ms: f64,
    /// Client memory per pooled position: the kept 32 bits of every delta value, bytes.
    pub pool_bytes_per_position: f64,
    /// Galois keys the offline session needs (the union over the groups' plans).
    pub galois_keys: usize,
    /// Their upload, bytes (seeded).
    pub galois_key_bytes: usize,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct MaskedRingReport {
    /// Ring degree and chain of the offline phase.
    pub offline_parameters: String,
    /// Per group.
    pub groups: Vec<GroupCosts>,
    /// Per prefilled position of the default model.
    pub model: Vec<ModelCosts>,
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Measures one group under `mode`.
fn measure(
    ctx: &std::sync::Arc<Context>,
    name: &str,
    shape: &GroupShape,
    mode: Mode,
    opts: &MaskedRingBenchOptions,
) -> anyhow::Result<GroupCosts> {
    let t = opts.t;
    let ffa = mode == Mode::Ffa;
    let (plan, _) = choose(
        shape,
        mode,
        t,
        ctx.slots(),
        false,
        &OpCosts::default(),
        // The planner's default link (100 Mbit/s, 20 ms).
        &Link::default(),
    )?;
    let mut rng = os_rng()?;
    let ring = RingGroup::new(&crate::helora::adapter(shape), RingParams::default())?;
    let sk = SecretKey::generate(ctx, &mut rng);
    let steps: Vec<i64> = plan.galois_steps()?.into_iter().collect();
    let gks = GaloisKeys::generate(&sk, &steps, &mut rng);
    let galois_elements = gks.galois_elements();
    let levels = OfflineLevels::for_mode(mode);
    let pk = PublicKey::generate(&sk, &mut rng);
    let server = BfvServer::new(ctx, RING_PRIME, gks, pk, levels)?;
    let client = BfvClient::new(&sk, RING_PRIME, levels)?;
    let group = PreparedGroup::new(&server, &plan, ring.adapter())?;
    let gc = ring.group_client(&plan)?;
    let width = gc.mask_width();

    // Offline.
    let r = sample_mask(&mut rng, t * width);
    let start = Instant::now();
    let seeded = gc
        .mask_slots(&r)?
        .iter()
        .map(|rows| client.encrypt(rows, plan.input_level()))
        .collect::<Result<Vec<_>, _>>()?;
    let uploads: Vec<Vec<u8>> = seeded.iter().map(|c| c.to_bytes()).collect();
    let offline_client_encrypt_ms = ms(start);
    let masks: Vec<Vec<u64>> = (0..plan.stage_b.n_out)
        .map(|_| sample_mask(&mut rng, 2 * plan.slots))
        .collect();
    let start = Instant::now();
    let inputs = uploads
        .iter()
        .map(|b| cipherlora_helora::HeServer::input_from_bytes(&server, b))
        .collect::<Result<Vec<_>, _>>()?;
    let responses: Vec<Vec<u8>> = server
        .offline_response(&group, &inputs, &masks)?
        .iter()
        .map(|c| c.to_bytes())
        .collect();
    let offline_server_ms = ms(start);
    let start = Instant::now();
    let decrypted = responses
        .iter()
        .map(|b| {
            let ct = cipherlora_ckks::Ciphertext::from_bytes(ctx, b)?;
            Ok(client.decrypt(&ct)?.values)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let kept = gc.unpack_ring(&decrypted)?;
    let offline_client_decrypt_ms = ms(start);

    // Online, all t positions.
    let server_masks = gc.unpack_ring(&masks)?;
    let x: Vec<f32> = (0..t * width)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let (mut online_server_ms, mut online_client_ms) = (0.0, 0.0);
    for pos in 0..t {
        let start = Instant::now();
        let encoded = RingInput::encode(&x[pos * width..(pos + 1) * width], 12);
        let masked = encoded.masked(&r[pos * width..(pos + 1) * width])?;
        online_client_ms += ms(start);
        let start = Instant::now();
        let responses = shape
            .d_outs
            .iter()
            .enumerate()
            .map(|(j, &d)| {
                let m = &server_masks[j][pos * d..(pos + 1) * d];
                ring.respond(j, &masked, m, mode)
            })
            .collect::<Result<Vec<_>, _>>()?;
        online_server_ms += ms(start);
        let start = Instant::now();
        for (j, resp) in responses.iter().enumerate() {
            let d = shape.d_outs[j];
            let mine = kept_bits(&kept[j][pos * d..(pos + 1) * d], ring.shift());
            std::hint::black_box(unmask(resp, &mine, ring.shift())?);
        }
        online_client_ms += ms(start);
    }
    Ok(GroupCosts {
        mode: if ffa { "ffa" } else { "standard" }.into(),
        group: name.into(),
        plan: plan.strategy(),
        galois_elements,
        t,
        offline_up_bytes: uploads.iter().map(Vec::len).sum(),
        offline_down_bytes: responses.iter().map(Vec::len).sum(),
        offline_client_encrypt_ms,
        offline_server_ms,
        offline_client_decrypt_ms,
        online_values_up: width,
        online_values_down: shape.d_outs.iter().sum(),
        online_server_ms: online_server_ms / t as f64,
        online_client_ms: online_client_ms / t as f64,
    })
}

/// Sums a mode's groups over the model's layers, per position; `key_bytes`: one Galois key.
fn per_position(mode: &str, groups: &[GroupCosts], layers: usize, key_bytes: usize) -> ModelCosts {
    let mine: Vec<&GroupCosts> = groups.iter().filter(|g| g.mode == mode).collect();
    let l = layers as f64;
    let per =
        |f: &dyn Fn(&GroupCosts) -> f64| mine.iter().map(|g| f(g) / g.t as f64).sum::<f64>() * l;
    let sum = |f: &dyn Fn(&GroupCosts) -> f64| mine.iter().map(|g| f(g)).sum::<f64>() * l;
    let values_up = sum(&|g| g.online_values_up as f64);
    let values_down = sum(&|g| g.online_values_down as f64);
    let up = per(&|g| g.offline_up_bytes as f64);
    let down = per(&|g| g.offline_down_bytes as f64);
    let keys: std::collections::BTreeSet<u64> = mine
        .iter()
        .flat_map(|g| g.galois_elements.iter().copied())
        .collect();
    ModelCosts {
        mode: mode.into(),
        offline_up_bytes: up,
        offline_down_bytes: down,
        offline_bits_up: up * 8.0 / values_up,
        offline_bits_down: down * 8.0 / values_down,
        offline_client_ms: per(&|g| g.offline_client_encrypt_ms + g.offline_client_decrypt_ms),
        offline_server_ms: per(&|g| g.offline_server_ms),
        online_up_bytes: values_up * 60.0 / 8.0,
        online_down_bytes: values_down
            * f64::from(cipherlora_helora::ring::RingParams::default().response_bits)
            / 8.0,
        online_server_ms: sum(&|g| g.online_server_ms),
        online_client_ms: sum(&|g| g.online_client_ms),
        pool_bytes_per_position: values_down * 4.0,
        galois_keys: keys.len(),
        galois_key_bytes: keys.len() * key_bytes,
    }
}

fn markdown(report: &MaskedRingReport) -> String {
    let mut md = format!(
        "Offline phase: batched BFV, {}; one thread.\n\n| mode | group | offline plan | T | up kB | down kB | client ms (enc + dec) | server ms | online server µs / position | online client µs / position |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        report.offline_parameters
    );
    for g in &report.groups {
        md += &format!(
            "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} + {:.0} | {:.0} | {:.0} | {:.0} |\n",
            g.mode,
            g.group,
            g.plan,
            g.t,
            g.offline_up_bytes as f64 / 1e3,
            g.offline_down_bytes as f64 / 1e3,
            g.offline_client_encrypt_ms,
            g.offline_client_decrypt_ms,
            g.offline_server_ms,
            g.online_server_ms * 1e3,
            g.online_client_ms * 1e3,
        );
    }
    md += "\nPer prefilled position of the default model (all layers):\n\n| mode | offline up kB (bits/value) | offline down kB (bits/value) | offline client ms | offline server ms | online up kB | online down kB | online server ms | online client ms | client pool kB / position | Galois keys (MB) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    for m in &report.model {
        md += &format!(
            "| {} | {:.0} ({:.0}) | {:.0} ({:.0}) | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {} ({:.0}) |\n",
            m.mode,
            m.offline_up_bytes / 1e3,
            m.offline_bits_up,
            m.offline_down_bytes / 1e3,
            m.offline_bits_down,
            m.offline_client_ms,
            m.offline_server_ms,
            m.online_up_bytes / 1e3,
            m.online_down_bytes / 1e3,
            m.online_server_ms,
            m.online_client_ms,
            m.pool_bytes_per_position / 1e3,
            m.galois_keys,
            m.galois_key_bytes as f64 / 1e6,
        );
    }
    md
}

/// Runs the benchmark on one thread and writes the report. Errors: HE, planner or I/O errors.
pub fn run(opts: &MaskedRingBenchOptions) -> anyhow::Result<()> {
    let params = offline_parameters()?;
    let described = format!(
        "N = {}, chain {:?} + {:?}",
        params.degree(),
        params.moduli_bits(),
        params.special_moduli_bits()
    );
    let ctx = Context::new(params)?;
    let model = ModelShape::smollm2_135m();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("building a one-thread pool")?;
    let mut groups = Vec::new();
    for mode in [Mode::Ffa, Mode::Standard] {
        for (name, shape) in &model.groups {
            let g = pool.install(|| measure(&ctx, name, shape, mode, opts))?;
            eprintln!(
                "{} {}: offline {:.0} ms server, online {:.1} µs / position server",
                g.mode,
                g.group,
                g.offline_server_ms,
                g.online_server_ms * 1e3
            );
            groups.push(g);
        }
    }
    let model_costs = ["ffa", "standard"]
        .iter()
        .map(|m| {
            let key = cipherlora_ckks::GaloisKeys::serialized_key_size(&ctx);
            per_position(m, &groups, model.layers, key)
        })
        .collect();
    let report = MaskedRingReport {
        offline_parameters: described,
        groups,
        model: model_costs,
    };
    let md = markdown(&report);
    let path = crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    println!("{md}");
    eprintln!("wrote {} and {}", opts.json.display(), path.display());
    Ok(())
}
