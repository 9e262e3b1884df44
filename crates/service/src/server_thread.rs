//! Running a server on its own thread and runtime (tests, benches, and blocking callers).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::backend::AdapterBackend;
use crate::error::{Result, ServiceError, TransportError};
use crate::metrics::Metrics;
use crate::server::{AdapterServer, ServeConfig};
use crate::split_backend::SplitBackend;

/// Code run at the start of every server thread (see [`ServerThread::start_with`]).
pub type ThreadHook = Arc<dyn Fn() + Send + Sync>;

/// Where a [`ServerThread`]'s threads run (benchmarks pin the server to its own cores).
#[derive(Clone)]
pub struct Placement {
    /// Run first on every server thread (serving, runtime workers, blocking pool), e.g. to pin it.
    pub on_thread_start: ThreadHook,
    /// Cores those threads share; the compute pool is capped at it (more groups than cores only
    /// take turns and share caches).
    pub cores: usize,
}

impl Placement {
    /// The compute pool a server configured for `configured` concurrent computations gets here: at
    /// most one per core it runs on.
    #[must_use]
    pub fn compute_pool(&self, configured: usize) -> usize {
        configured.min(self.cores.max(1))
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("cores", &self.cores)
            .finish_non_exhaustive()
    }
}

/// A server running on a background thread with a `workers`-thread tokio runtime. Dropping it shuts
/// the server down gracefully and joins the thread.
pub struct ServerThread {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    metrics_addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl ServerThread {
    /// Binds and starts serving; returns once bound. Errors: those of [`AdapterServer::bind`];
    /// [`ServiceError::Io`] if the runtime or thread cannot start.
    pub fn start(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        workers: usize,
    ) -> Result<Self> {
        Self::start_with(config, backends, workers, None)
    }

    /// [`Self::start`] with threads placed per `placement` (pool ≤ its cores). Errors as
    /// [`Self::start`].
    pub fn start_with(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        workers: usize,
        placement: Option<Placement>,
    ) -> Result<Self> {
        Self::start_serving(config, backends, None, workers, placement)
    }

    /// [`Self::start_with`] for a split-inference server also serving `split`. Errors: those of
    /// [`AdapterServer::bind_with_split`]; as [`Self::start`].
    pub fn start_serving(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        split: Option<Arc<dyn SplitBackend>>,
        workers: usize,
        placement: Option<Placement>,
    ) -> Result<Self> {
        let mut config = config;
        if let Some(p) = &placement {
            let pool = &mut config.limits.max_concurrent_computations;
            *pool = p.compute_pool(*pool);
        }
        let on_thread_start = placement.map(|p| p.on_thread_start);
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers.max(1)).enable_all();
        if let Some(hook) = on_thread_start.clone() {
            builder.on_thread_start(move || hook());
        }
        let rt = builder
            .build()
            .map_err(|e| ServiceError::io("starting the server runtime", e))?;
        let server = rt.block_on(AdapterServer::bind_with_split(config, backends, split))?;
        let addr = server.local_addr();
        let metrics = server.metrics();
        let metrics_addr = server.metrics_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cipherlora-serve".into())
            .spawn(move || {
                if let Some(hook) = on_thread_start {
                    hook();
                }
                rt.block_on(server.run(async move {
                    let _ = stopped.await;
                }))
            })
            .map_err(|e| ServiceError::io("spawning the server thread", e))?;
        Ok(Self {
            addr,
            metrics,
            metrics_addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics endpoint's address, if configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The live metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Shuts down gracefully and returns the server's result. Errors: the serving error, or
    /// [`ServiceError::Transport`] if the thread panicked.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| ServiceError::Transport(TransportError::ServerThreadPanicked))?,
            None => Ok(()),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server pinned to one core computes one group at a time.
    #[test]
    fn one_core_placement_computes_one_group_at_a_time() {
        let one = Placement {
            on_thread_start: Arc::new(|| {}),
            cores: 1,
        };
        assert_eq!(one.compute_pool(2), 1);
        assert_eq!(one.compute_pool(1), 1);
        let four = Placement {
            cores: 4,
            ..one.clone()
        };
        assert_eq!(four.compute_pool(2), 2, "never above the configured pool");
        assert_eq!(four.compute_pool(16), 4);
        let none = Placement { cores: 0, ..one };
        assert_eq!(none.compute_pool(8), 1, "a pool is never empty");
    }
}
