//! Shared fixtures of the service integration tests: a TLS + token server on 127.0.0.1 with the
//! plaintext test backend, clients, an independent reference for the expected deltas, a raw gRPC
//! client for forged requests, and a TCP proxy that can cut a connection mid-message.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use cipherlora_proto::v1::adapter_service_client::AdapterServiceClient;
use cipherlora_proto::v1::{GroupRequest, GroupResponse, PlanRequest};
use cipherlora_service::auth::TokenSet;
use cipherlora_service::testing::{
    TestBackend, decode_ct, encode_ct, test_galois_keys, test_public_key,
};
use cipherlora_service::{
    AdapterBackend, ClientConfig, DevCert, Limits, ServeConfig, ServerThread, SessionParams,
    dev_cert,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const TOKEN: &str = "test-token-0123456789abcdef";
/// A second accepted token (per-token limits).
pub const TOKEN2: &str = "test-token-second-0123456789";
pub const ADAPTER: &str = "test-adapter";
pub const LAYERS: u32 = 4;
pub const SLOTS: usize = 2048; // test-n4096

pub struct Fixture {
    pub server: ServerThread,
    pub cert: DevCert,
}

pub fn start(limits: Limits) -> Fixture {
    let cert = dev_cert(&["localhost"]).unwrap();
    let server = start_on(
        &cert,
        "127.0.0.1:0".parse().unwrap(),
        limits,
        TestBackend::new(ADAPTER, LAYERS),
    );
    Fixture { server, cert }
}

/// A TLS + token server with `cert` on `listen`, serving `backend`.
pub fn start_on(
    cert: &DevCert,
    listen: SocketAddr,
    limits: Limits,
    backend: TestBackend,
) -> ServerThread {
    let mut cfg = ServeConfig::new(listen);
    cfg.tls = Some(cert.server_tls());
    cfg.tokens = Some(TokenSet::new(&[TOKEN, TOKEN2]).unwrap());
    cfg.limits = limits;
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let backends: Vec<Arc<dyn AdapterBackend>> = vec![Arc::new(backend)];
    ServerThread::start(cfg, backends, 2).unwrap()
}

impl Fixture {
    pub fn client_config(&self) -> ClientConfig {
        client_config_for(self.server.addr(), &self.cert)
    }
}

pub fn client_config_for(addr: SocketAddr, cert: &DevCert) -> ClientConfig {
    let mut c = ClientConfig::new(format!("https://127.0.0.1:{}", addr.port()));
    c.tls = Some(cert.client_tls("localhost"));
    c.token = Some(TOKEN.into());
    c.retry_backoff = std::time::Duration::from_millis(20);
    // Refusals at capacity come back at once; the retry's own test waits.
    c.open_wait = std::time::Duration::ZERO;
    c
}

pub fn key_seed(client: u8) -> [u8; 32] {
    let mut s = [0u8; 32];
    for (i, b) in s.iter_mut().enumerate() {
        *b = (usize::from(client) * 37 + i * 11 + 1) as u8;
    }
    s
}

pub fn params(client: u8) -> SessionParams {
    SessionParams {
        adapter_id: ADAPTER.into(),
        ckks_preset: "test-n4096".into(),
        public_key: test_public_key(12, key_seed(client)),
        galois_keys: test_galois_keys(&[1, 2, 4, 8]),
        plan_request: PlanRequest {
            positions: 8,
            ..PlanRequest::default()
        },
    }
}

/// Deterministic inputs of (client, round, layer, group).
pub fn inputs(client: u8, round: u64, layer: u32, group: u32) -> Vec<f64> {
    (0..SLOTS)
        .map(|j| {
            let k = (j as u64 * 31 + round * 7 + u64::from(layer) * 3 + u64::from(group)) % 1000;
            (k as f64 - 500.0) / 8.0 + f64::from(client)
        })
        .collect()
}

/// The test backend's documented function, written out independently: y = ((layer + 1)/2 + group/4)
/// · x + (key bytes 0..4 as u32 mod 1024).
pub fn expected(client: u8, layer: u32, group: u32, x: &[f64]) -> Vec<f64> {
    let s = key_seed(client);
    let tag = (u32::from_le_bytes([s[0], s[1], s[2], s[3]]) % 1024) as f64;
    let f = (layer as f64 + 1.0) / 2.0 + group as f64 / 4.0;
    x.iter().map(|v| f * v + tag).collect()
}

pub fn calls(client: u8, round: u64, layer: u32) -> Vec<GroupRequest> {
    (0..2)
        .map(|group| GroupRequest {
            layer,
            group,
            ciphertexts: vec![encode_ct(12, 2, &inputs(client, round, layer, group))],
            ..GroupRequest::default()
        })
        .collect()
}

/// Checks one layer's pipelined answer exactly ("decrypts correctly").
pub fn check(client: u8, round: u64, layer: u32, out: &[Vec<Bytes>]) {
    assert_eq!(out.len(), 2);
    for (group, cts) in out.iter().enumerate() {
        let group = group as u32;
        assert_eq!(cts.len(), 1);
        let y = decode_ct(&cts[0]).expect("valid output ciphertext");
        assert_eq!(y.level, 1);
        let want = expected(client, layer, group, &inputs(client, round, layer, group));
        assert!(
            y.values == want,
            "client {client} round {round} layer {layer} group {group}: wrong delta"
        );
    }
}

/// Sends `reqs` on one raw `Rounds` stream (bypassing the client library) and returns the
/// responses, or the status that ended the stream.
pub fn raw_rounds(
    addr: SocketAddr,
    cert: &DevCert,
    reqs: Vec<GroupRequest>,
) -> Result<Vec<GroupResponse>, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ep =
            tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
                .unwrap()
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&cert.ca_pem))
                        .domain_name("localhost"),
                )
                .unwrap();
        let ch = ep.connect().await.unwrap();
        let auth: tonic::metadata::AsciiMetadataValue = format!("Bearer {TOKEN}").parse().unwrap();
        let mut rpc =
            AdapterServiceClient::with_interceptor(ch, move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", auth.clone());
                Ok(r)
            });
        let mut inbound = rpc.rounds(tokio_stream::iter(reqs)).await?.into_inner();
        let mut out = Vec::new();
        while let Some(m) = inbound.message().await? {
            out.push(m);
        }
        Ok(out)
    })
}

/// A TCP proxy on 127.0.0.1 that can cut its connections after a budget of client-to-server bytes
/// (once).
pub struct Proxy {
    pub addr: SocketAddr,
    budget: Arc<AtomicI64>,
    _rt: tokio::runtime::Runtime,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let budget = Arc::new(AtomicI64::new(-1));
        let b = budget.clone();
        rt.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let b = b.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let left = b.load(Ordering::SeqCst);
                            if left >= 0 && n as i64 >= left {
                                // Forward part of the message, then cut.
                                let _ = sw.write_all(&buf[..left as usize]).await;
                                b.store(-1, Ordering::SeqCst);
                                return;
                            }
                            if left >= 0 {
                                b.fetch_sub(n as i64, Ordering::SeqCst);
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = tokio::io::copy(&mut sr, &mut cw);
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                    // Both halves drop here: the connection is gone.
                });
            }
        });
        Self {
            addr,
            budget,
            _rt: rt,
        }
    }

    /// Cut the connection once `bytes` more client-to-server bytes passed.
    pub fn cut_after(&self, bytes: i64) {
        self.budget.store(bytes, Ordering::SeqCst);
    }

    /// Whether the armed cut has happened.
    pub fn has_cut(&self) -> bool {
        self.budget.load(Ordering::SeqCst) < 0
    }
}

/// GET /metrics over plain HTTP.
pub fn scrape(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Sends and receives raw bytes as gRPC messages.
#[derive(Clone, Copy)]
pub struct RawCodec;

pub struct RawEncoder;
pub struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
