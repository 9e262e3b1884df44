//! `cipherlora bench trip`: how one session's fixed-point trip (every adapted group of every layer,
//! sent at once) scales with the adapter server's cores. The client encrypts the trip's requests;
//! the server computes them on a pool of 1, 2, … threads, alternating, and the wall time of the
//! server's part is timed. Inputs are random activations of the model's shapes: what is timed does
//! not depend on their values.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use cipherlora_model::{DeltaHook, Device, GroupInput, ModelConfig, ProjGroup, Tensor};
use cipherlora_private::remote::COST_REPS;
use cipherlora_private::{GroupRequest, adapter_id};
use cipherlora_private::{
    Grouping, HeAdapter, HeHook, PrivateError, Reply, ServerSession, Transport,
};
use serde::{Deserialize, Serialize};

/// What `bench trip` runs.
#[derive(Debug, Clone)]
pub struct TripBenchOptions {
    /// Where the JSON report goes (Markdown beside it unless `markdown`).
    pub json: PathBuf,
    /// Where the Markdown table goes.
    pub markdown: Option<PathBuf>,
    /// The base model (GGUF file or HF folder): only its shape is used.
    pub model: PathBuf,
    /// PEFT adapter folders.
    pub adapters: Vec<PathBuf>,
    /// Rows per group request (the verify width K + 1).
    pub width: usize,
    /// Server thread counts, alternated.
    pub threads: Vec<usize>,
    /// Timed trips per thread count (after one warm-up each).
    pub reps: usize,
}

/// One adapter at one thread count.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TripRun {
    /// Adapter id (folder name).
    pub adapter: String,
    /// Server threads.
    pub threads: usize,
    /// Group requests in the trip.
    pub groups: usize,
    /// Median wall time of the server's part of a trip, ms.
    pub median_ms: f64,
    /// Every timed trip, ms, in the order run.
    pub trips_ms: Vec<f64>,
    /// The one-thread median over this one (1 for the one-thread run).
    pub speedup: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TripReport {
    /// "trip".
    pub bench: String,
    /// Rows per group request.
    pub width: usize,
    /// Cores this machine has.
    pub machine_cores: usize,
    /// The runs.
    pub runs: Vec<TripRun>,
}

/// The server's side of a session: computes a batch of requests on the pool it is given.
struct PoolServer {
    session: Arc<ServerSession>,
    pool: Arc<Mutex<Arc<rayon::ThreadPool>>>,
    timed_ms: Arc<Mutex<Vec<f64>>>,
}

impl Transport for PoolServer {
    fn round(&mut self, request: &GroupRequest) -> Result<Reply, PrivateError> {
        let mut replies = self.rounds(std::slice::from_ref(request))?;
        Ok(replies.remove(0))
    }

    fn rounds(&mut self, requests: &[GroupRequest]) -> Result<Vec<Reply>, PrivateError> {
        use rayon::prelude::*;
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let session = &self.session;
        let compute = || {
            requests
                .par_iter()
                .map(|r| session.handle(r))
                .collect::<Result<Vec<_>, _>>()
        };
        let t0 = Instant::now();
        let responses = pool.install(compute)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.timed_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ms);
        Ok(responses
            .into_iter()
            .map(|response| Reply {
                response,
                server_ms: Some(ms),
            })
            .collect())
    }
}

/// (T, d_in) of group `g` in `config`'s shape.
fn d_in(config: &ModelConfig, g: ProjGroup) -> usize {
    match g {
        ProjGroup::Qkv | ProjGroup::GateUp => config.hidden_size,
        ProjGroup::O => config.num_heads * config.head_dim,
        ProjGroup::Down => config.intermediate_size,
    }
}

/// A trip's inputs: every group `hook` wants, `width` rows of values in ±1.
fn trip_inputs(
    hook: &impl DeltaHook,
    config: &ModelConfig,
    width: usize,
) -> anyhow::Result<Vec<GroupInput>> {
    let mut out = Vec::new();
    for layer in 0..config.num_layers {
        for group in ProjGroup::ALL {
            if !hook.wants(layer, group) {
                continue;
            }
            let d = d_in(config, group);
            let values: Vec<f32> = (0..width * d)
                .map(|i| ((i * 7919 + layer * 31) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            out.push(GroupInput {
                layer,
                group,
                x: Tensor::from_vec(values, (width, d), &Device::Cpu)?,
            });
        }
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// Runs the benchmark and writes the reports. Errors: model, adapter or CKKS failures.
pub fn run(opts: &TripBenchOptions) -> anyhow::Result<TripReport> {
    anyhow::ensure!(opts.reps >= 1, "--reps must be at least 1");
    anyhow::ensure!(
        !opts.threads.is_empty() && opts.threads.iter().all(|&t| t >= 1),
        "--threads needs one or more counts ≥ 1"
    );
    let config = ModelConfig::read(&opts.model)?;
    let pools = opts
        .threads
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map(Arc::new)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut runs = Vec::new();
    for dir in &opts.adapters {
        let id = adapter_id(dir)?;
        let mut server =
            HeAdapter::load(dir, &config).with_context(|| format!("loading {}", dir.display()))?;
        // The plans `serve` offers: from this machine's cached op costs.
        server.cached_costs(COST_REPS)?;
        let offer = server.offer_grouped(opts.width, Grouping::ByInput)?;
        let pool = Arc::new(Mutex::new(pools[0].clone()));
        let timed = Arc::new(Mutex::new(Vec::new()));
        let mut hook = HeHook::connect(&offer, &config, |keys, _| {
            Ok(PoolServer {
                session: Arc::new(server.open_session(&offer, keys)?),
                pool: pool.clone(),
                timed_ms: timed.clone(),
            })
        })?;
        let inputs = trip_inputs(&hook, &config, opts.width)?;
        let mut trips: Vec<Vec<f64>> = vec![Vec::new(); pools.len()];
        for rep in 0..=opts.reps {
            for (i, p) in pools.iter().enumerate() {
                *pool.lock().unwrap_or_else(|p| p.into_inner()) = p.clone();
                timed.lock().unwrap_or_else(|p| p.into_inner()).clear();
                hook.deltas_many(&inputs)?;
                let ms: f64 = timed.lock().unwrap_or_else(|p| p.into_inner()).iter().sum();
                if rep > 0 {
                    trips[i].push(ms);
                }
            }
        }
        let one = opts
            .threads
            .iter()
            .position(|&t| t == 1)
            .map(|i| median(&trips[i]));
        for (i, &threads) in opts.threads.iter().enumerate() {
            let median_ms = median(&trips[i]);
            runs.push(TripRun {
                adapter: id.clone(),
                threads,
                groups: inputs.len(),
                median_ms,
                trips_ms: trips[i].clone(),
                speedup: one.map_or(f64::NAN, |o| o / median_ms),
            });
            eprintln!(
                "{id}: {threads} thread(s), {} groups: {median_ms:.0} ms per trip (median of {})",
                inputs.len(),
                opts.reps
            );
        }
    }
    let report = TripReport {
        bench: "trip".into(),
        width: opts.width,
        machine_cores: std::thread::available_parallelism().map_or(1, usize::from),
        runs,
    };
    let md = markdown(&report);
    let path = crate::write_report(&opts.json, opts.markdown.as_deref(), &report, &md)?;
    eprintln!("wrote {} and {}", opts.json.display(), path.display());
    print!("{md}");
    Ok(report)
}

fn markdown(r: &TripReport) -> String {
    let mut s = format!(
        "One session's fixed-point trip, T = {}, server part only ({} cores here)\n\n\
         | adapter | groups | server threads | ms per trip, median | speedup over 1 thread |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        r.width, r.machine_cores
    );
    for x in &r.runs {
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2}× |\n",
            x.adapter, x.groups, x.threads, x.median_ms, x.speedup
        ));
    }
    s
}
