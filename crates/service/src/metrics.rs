//! Prometheus-style metrics (text format 0.0.4), served at `GET /metrics` by [`serve_metrics`] when
//! `ServeConfig::metrics_listen` is set: request, refusal, byte, auth-failure and extraction-budget
//! counters, session gauges and counters, a per-group compute-time histogram and the wait for a
//! turn in the compute pool.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bounds (seconds) of the compute-time and queue-wait histogram buckets.
pub const COMPUTE_BUCKETS: [f64; 12] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Default, Clone)]
struct Histogram {
    buckets: [u64; COMPUTE_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The server's metrics registry. Cheap to update from any thread.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    received: Mutex<BTreeMap<&'static str, u64>>,
    sent: Mutex<BTreeMap<&'static str, u64>>,
    auth_failures: AtomicU64,
    sessions_active: AtomicI64,
    sessions_streaming: AtomicI64,
    sessions: Mutex<BTreeMap<&'static str, u64>>,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
    evaluations: Mutex<BTreeMap<String, u64>>,
    compute: Mutex<BTreeMap<u32, Histogram>>,
    queue: Mutex<Histogram>,
}

impl Histogram {
    fn observe(&mut self, t: Duration) {
        let s = t.as_secs_f64();
        for (i, ub) in COMPUTE_BUCKETS.iter().enumerate() {
            if s <= *ub {
                self.buckets[i] += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }

    /// The `_bucket`, `_sum` and `_count` lines of `name` with `labels` (`k="v",` each, or empty).
    fn render(&self, o: &mut String, name: &str, labels: &str) {
        for (ub, n) in COMPUTE_BUCKETS.iter().zip(self.buckets) {
            let _ = writeln!(o, "{name}_bucket{{{labels}le=\"{ub}\"}} {n}");
        }
        let plain = match labels.trim_end_matches(',') {
            "" => String::new(),
            l => format!("{{{l}}}"),
        };
        let _ = writeln!(
            o,
            "{name}_bucket{{{labels}le=\"+Inf\"}} {c}\n{name}_sum{plain} {s}\n{name}_count{plain} {c}",
            c = self.count,
            s = self.sum
        );
    }
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K, by: u64) {
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    *g.entry(k).or_insert(0) += by;
}

/// Name of a gRPC code as Prometheus label (`OK`, `INVALID_ARGUMENT`, ...).
fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

impl Metrics {
    /// Counts one call of `rpc` (one stream message for `rounds`) ending in `code`.
    pub fn request(&self, rpc: &'static str, code: tonic::Code) {
        bump(&self.requests, (rpc, code_label(code)), 1);
    }

    /// Counts one call of `rpc` by its outcome: its code, and a refusal's [`ErrorReason`]
    /// (`none` when the status carries none).
    ///
    /// [`ErrorReason`]: cipherlora_proto::ErrorReason
    pub fn outcome<T>(&self, rpc: &'static str, r: &Result<T, tonic::Status>) {
        match r {
            Ok(_) => self.request(rpc, tonic::Code::Ok),
            Err(s) => self.refused(rpc, s),
        }
    }

    /// Counts one call of `rpc` refused with `s` ([`Metrics::outcome`]).
    pub fn refused(&self, rpc: &'static str, s: &tonic::Status) {
        self.request(rpc, s.code());
        let reason = crate::status::reason_of(s).map_or("none", |r| r.as_str());
        bump(&self.refusals, reason, 1);
    }

    /// Counts delta evaluations charged to the extraction budget of `adapter`.
    pub fn evaluations(&self, adapter: &str, n: u64) {
        let mut g = self.evaluations.lock().unwrap_or_else(|p| p.into_inner());
        match g.get_mut(adapter) {
            Some(v) => *v += n,
            None => {
                g.insert(adapter.to_string(), n);
            }
        }
    }

    /// Records how long a request waited for a turn in the server-wide compute pool.
    pub fn queue_wait(&self, t: Duration) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(t);
    }

    /// Counts payload bytes received by `rpc`.
    pub fn received(&self, rpc: &'static str, bytes: u64) {
        bump(&self.received, rpc, bytes);
    }

    /// Counts payload bytes sent by `rpc`.
    pub fn sent(&self, rpc: &'static str, bytes: u64) {
        bump(&self.sent, rpc, bytes);
    }

    /// Counts a rejected token.
    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a session event and moves the active gauge.
    pub fn session(&self, event: &'static str) {
        let d = if event == "opened" { 1 } else { -1 };
        self.sessions_active.fetch_add(d, Ordering::Relaxed);
        bump(&self.sessions, event, 1);
    }

    /// Moves the gauge of sessions with a live `Rounds` stream (a session without one is idle,
    /// or detached and freed after the detached timeout).
    pub fn streaming(&self, attached: bool) {
        let d = if attached { 1 } else { -1 };
        self.sessions_streaming.fetch_add(d, Ordering::Relaxed);
    }

    /// Records the server compute time of one layer-group request.
    pub fn compute_time(&self, group: u32, t: Duration) {
        let mut g = self.compute.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(group).or_default().observe(t);
    }

    /// Active sessions now.
    pub fn sessions_active(&self) -> i64 {
        self.sessions_active.load(Ordering::Relaxed)
    }

    /// Calls of `rpc` that ended with `code` so far.
    pub fn requests(&self, rpc: &'static str, code: tonic::Code) -> u64 {
        let g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        g.get(&(rpc, code_label(code))).copied().unwrap_or(0)
    }

    /// The metrics in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let lock = |m: &Mutex<BTreeMap<&'static str, u64>>| {
            m.lock().unwrap_or_else(|p| p.into_inner()).clone()
        };
        o.push_str("# HELP cipherlora_requests_total Calls (stream messages for rounds) by rpc and gRPC code.\n# TYPE cipherlora_requests_total counter\n");
        for ((rpc, code), v) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                o,
                "cipherlora_requests_total{{rpc=\"{rpc}\",code=\"{code}\"}} {v}"
            );
        }
        o.push_str("# HELP cipherlora_received_bytes_total Key and ciphertext payload bytes received.\n# TYPE cipherlora_received_bytes_total counter\n");
        for (rpc, v) in lock(&self.received) {
            let _ = writeln!(o, "cipherlora_received_bytes_total{{rpc=\"{rpc}\"}} {v}");
        }
        o.push_str("# HELP cipherlora_sent_bytes_total Ciphertext payload bytes sent.\n# TYPE cipherlora_sent_bytes_total counter\n");
        for (rpc, v) in lock(&self.sent) {
            let _ = writeln!(o, "cipherlora_sent_bytes_total{{rpc=\"{rpc}\"}} {v}");
        }
        let _ = writeln!(
            o,
            "# HELP cipherlora_auth_failures_total Calls rejected for a missing or wrong token.\n# TYPE cipherlora_auth_failures_total counter\ncipherlora_auth_failures_total {}",
            self.auth_failures.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP cipherlora_sessions_active Open sessions.\n# TYPE cipherlora_sessions_active gauge\ncipherlora_sessions_active {}",
            self.sessions_active()
        );
        let _ = writeln!(
            o,
            "# HELP cipherlora_sessions_streaming Open sessions with a live rounds stream.\n# TYPE cipherlora_sessions_streaming gauge\ncipherlora_sessions_streaming {}",
            self.sessions_streaming.load(Ordering::Relaxed)
        );
        o.push_str("# HELP cipherlora_sessions_total Session events.\n# TYPE cipherlora_sessions_total counter\n");
        for (ev, v) in lock(&self.sessions) {
            let _ = writeln!(o, "cipherlora_sessions_total{{event=\"{ev}\"}} {v}");
        }
        o.push_str("# HELP cipherlora_refusals_total Calls refused, by the reason the status carries.\n# TYPE cipherlora_refusals_total counter\n");
        for (reason, v) in lock(&self.refusals) {
            let _ = writeln!(o, "cipherlora_refusals_total{{reason=\"{reason}\"}} {v}");
        }
        o.push_str("# HELP cipherlora_budget_evaluations_total Delta evaluations charged to the extraction budget, by adapter.\n# TYPE cipherlora_budget_evaluations_total counter\n");
        for (adapter, v) in self
            .evaluations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                o,
                "cipherlora_budget_evaluations_total{{adapter=\"{adapter}\"}} {v}"
            );
        }
        o.push_str("# HELP cipherlora_group_compute_seconds Server compute time per layer-group request.\n# TYPE cipherlora_group_compute_seconds histogram\n");
        for (group, h) in self
            .compute
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            h.render(
                &mut o,
                "cipherlora_group_compute_seconds",
                &format!("group=\"{group}\","),
            );
        }
        o.push_str("# HELP cipherlora_compute_queue_seconds Wait for a turn in the compute pool per layer-group request.\n# TYPE cipherlora_compute_queue_seconds histogram\n");
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).render(
            &mut o,
            "cipherlora_compute_queue_seconds",
            "",
        );
        o
    }
}

/// Serves `GET /metrics`, `GET /healthz` (200 while the process serves) and `GET /readyz` (200
/// until `shutting_down` turns true, then 503, so a load balancer stops sending new sessions) in
/// plain HTTP/1.1, one response per connection, on an already-bound listener until the task is
/// dropped.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let draining = *shutting_down.borrow();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = &buf[..n];
            let resp = if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET / ") {
                let body = metrics.render();
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else if head.starts_with(b"GET /healthz ")
                || (head.starts_with(b"GET /readyz ") && !draining)
            {
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n".into()
            } else if head.starts_with(b"GET /readyz ") {
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\nconnection: close\r\n\r\ndraining\n"
                    .into()
            } else {
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into()
            };
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn readiness_turns_503_when_the_server_drains_and_liveness_stays() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(serve_metrics(listener, Default::default(), rx));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tx.send(true).unwrap();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get(addr, "/metrics")
                .await
                .contains("cipherlora_sessions_active")
        );
        task.abort();
    }

    #[test]
    fn render_lists_counters_gauges_and_histograms() {
        let m = Metrics::default();
        m.request("rounds", tonic::Code::Ok);
        m.request("rounds", tonic::Code::Ok);
        m.request("rounds", tonic::Code::InvalidArgument);
        m.received("rounds", 100);
        m.session("opened");
        m.session("opened");
        m.session("evicted");
        m.compute_time(1, Duration::from_millis(3));
        m.outcome::<()>(
            "open_session",
            &Err(crate::status::status(
                tonic::Code::ResourceExhausted,
                cipherlora_proto::ErrorReason::AtCapacity,
                "full",
            )),
        );
        m.outcome::<()>("rounds", &Err(tonic::Status::internal("no reason")));
        m.outcome("rounds", &Ok(()));
        m.evaluations("code-lora-r16", 9);
        m.evaluations("code-lora-r16", 5);
        m.queue_wait(Duration::from_millis(30));
        m.streaming(true);
        m.streaming(true);
        m.streaming(false);
        let r = m.render();
        assert!(r.contains("cipherlora_sessions_streaming 1"));
        assert!(r.contains("cipherlora_requests_total{rpc=\"rounds\",code=\"OK\"} 3"));
        assert!(r.contains(
            "cipherlora_requests_total{rpc=\"open_session\",code=\"RESOURCE_EXHAUSTED\"} 1"
        ));
        assert!(r.contains("cipherlora_refusals_total{reason=\"at_capacity\"} 1"));
        assert!(r.contains("cipherlora_refusals_total{reason=\"none\"} 1"));
        assert!(r.contains("cipherlora_budget_evaluations_total{adapter=\"code-lora-r16\"} 14"));
        assert!(r.contains("cipherlora_compute_queue_seconds_bucket{le=\"0.025\"} 0"));
        assert!(r.contains("cipherlora_compute_queue_seconds_bucket{le=\"0.05\"} 1"));
        assert!(r.contains("cipherlora_compute_queue_seconds_count 1"));
        assert!(
            r.contains("cipherlora_requests_total{rpc=\"rounds\",code=\"INVALID_ARGUMENT\"} 1")
        );
        assert!(r.contains("cipherlora_received_bytes_total{rpc=\"rounds\"} 100"));
        assert!(r.contains("cipherlora_sessions_active 1"));
        assert!(r.contains("cipherlora_group_compute_seconds_bucket{group=\"1\",le=\"0.0025\"} 0"));
        assert!(r.contains("cipherlora_group_compute_seconds_bucket{group=\"1\",le=\"0.005\"} 1"));
        assert!(r.contains("cipherlora_group_compute_seconds_count{group=\"1\"} 1"));
    }
}
