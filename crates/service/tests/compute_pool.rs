//! Regression test for "connections unbounded": group requests from any number of clients and
//! streams share one server-wide compute pool (`Limits::max_concurrent_computations`), so a crowd
//! of sessions cannot start more HE evaluations at once than the pool allows; and the pool, not
//! something else, is what bounds them (a larger pool lets more run).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cipherlora_proto::v1::GroupRequest;
use cipherlora_service::auth::TokenSet;
use cipherlora_service::testing::TestBackend;
use cipherlora_service::{
    AdapterBackend, AdapterClient, AdapterInfo, BackendError, GroupRequestShape, Limits,
    OpenSessionPayload, OpenedSession, ServeConfig, ServerThread, SessionCompute, dev_cert,
};
use common::{LAYERS, TOKEN, calls, check, client_config_for, params};

/// The test backend, counting the computations running at once.
struct Counting {
    inner: TestBackend,
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

struct CountingSession {
    inner: Box<dyn SessionCompute>,
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl AdapterBackend for Counting {
    fn info(&self) -> AdapterInfo {
        self.inner.info()
    }

    fn open_session(&self, payload: OpenSessionPayload) -> Result<OpenedSession, BackendError> {
        let opened = self.inner.open_session(payload)?;
        Ok(OpenedSession {
            offer: opened.offer,
            compute: Box::new(CountingSession {
                inner: opened.compute,
                now: self.now.clone(),
                peak: self.peak.clone(),
            }),
        })
    }
}

impl SessionCompute for CountingSession {
    fn offer_only(&self) -> bool {
        self.inner.offer_only()
    }

    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError> {
        self.inner.group_shape(layer, group)
    }

    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError> {
        let running = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(running, Ordering::SeqCst);
        // Long enough for every client's requests to be waiting at once.
        std::thread::sleep(Duration::from_millis(30));
        let out = self.inner.compute(request);
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// Peak concurrent computations while 4 clients each pipeline all their layer groups at once, with
/// a pool of `pool`.
fn peak_with_pool(pool: usize) -> usize {
    let cert = dev_cert(&["localhost"]).unwrap();
    let peak = Arc::new(AtomicUsize::new(0));
    let backend = Counting {
        inner: TestBackend::new(common::ADAPTER, LAYERS),
        now: Arc::new(AtomicUsize::new(0)),
        peak: peak.clone(),
    };
    let mut cfg = ServeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = Some(cert.server_tls());
    cfg.tokens = Some(TokenSet::new(&[TOKEN]).unwrap());
    cfg.limits = Limits {
        max_concurrent_computations: pool,
        max_in_flight_per_stream: 8,
        ..Limits::default()
    };
    let backends: Vec<Arc<dyn AdapterBackend>> = vec![Arc::new(backend)];
    let server = ServerThread::start(cfg, backends, 2).unwrap();
    let addr = server.addr();
    std::thread::scope(|s| {
        for client in 0..4u8 {
            let cert = &cert;
            s.spawn(move || {
                let mut c = AdapterClient::connect(client_config_for(addr, cert)).unwrap();
                c.open_session(params(client)).unwrap();
                let all: Vec<_> = (0..LAYERS).flat_map(|l| calls(client, 0, l)).collect();
                let out = c.round_pipelined(0, &all).unwrap();
                for (layer, pair) in out.chunks(2).enumerate() {
                    check(client, 0, layer as u32, pair);
                }
            });
        }
    });
    peak.load(Ordering::SeqCst)
}

#[test]
fn one_server_wide_compute_pool_bounds_concurrent_group_computations() {
    let bounded = peak_with_pool(2);
    assert!(
        bounded <= 2,
        "{bounded} computations ran at once with a pool of 2"
    );
    let wide = peak_with_pool(16);
    assert!(
        wide > 2,
        "a pool of 16 never ran more than 2 at once ({wide}): the bound above proves nothing"
    );
}
