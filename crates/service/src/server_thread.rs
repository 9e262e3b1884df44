//! Running a server on its own thread and runtime (tests, benches, and
//! blocking callers).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::backend::AdapterBackend;
use crate::error::{Result, ServiceError};
use crate::metrics::Metrics;
use crate::server::{AdapterServer, ServeConfig};
use crate::split_backend::SplitBackend;

/// Code run at the start of every server thread (see
/// [`ServerThread::start_with`]).
pub type ThreadHook = Arc<dyn Fn() + Send + Sync>;

/// A server running on a background thread with a `workers`-thread tokio
/// runtime. Dropping it shuts the server down gracefully and joins the thread.
pub struct ServerThread {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    metrics_addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl ServerThread {
    /// Binds and starts serving; returns once the listener is bound.
    ///
    /// # Errors
    /// Those of [`AdapterServer::bind`]; [`ServiceError::Io`] if the runtime
    /// or thread cannot start.
    pub fn start(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        workers: usize,
    ) -> Result<Self> {
        Self::start_with(config, backends, workers, None)
    }

    /// [`Self::start`], running `on_thread_start` first on every thread the
    /// server uses: the serving thread, the runtime's workers and its
    /// blocking pool (where backends compute). Benchmarks use it to pin the
    /// server to its own CPU core, so that client and server are measured
    /// like two machines.
    ///
    /// # Errors
    /// Those of [`Self::start`].
    pub fn start_with(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        workers: usize,
        on_thread_start: Option<ThreadHook>,
    ) -> Result<Self> {
        Self::start_serving(config, backends, None, workers, on_thread_start)
    }

    /// [`Self::start_with`] for a split-inference server
    /// ([`AdapterServer::bind_with_split`]) serving `split` and `backends`
    /// (possibly none).
    ///
    /// # Errors
    /// Those of [`AdapterServer::bind_with_split`]; as [`Self::start`].
    pub fn start_serving(
        config: ServeConfig,
        backends: Vec<Arc<dyn AdapterBackend>>,
        split: Option<Arc<dyn SplitBackend>>,
        workers: usize,
        on_thread_start: Option<ThreadHook>,
    ) -> Result<Self> {
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

    /// Shuts down gracefully and returns the server's result.
    ///
    /// # Errors
    /// The serving error, or [`ServiceError::Transport`] if the thread panicked.
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
                .map_err(|_| ServiceError::Transport("server thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
