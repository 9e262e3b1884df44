//! An adapter server embedded in the client's process on loopback, with the real stack (gRPC, TLS
//! with a fresh dev certificate, a fresh token): used by `cipherlora demo` and `cipherlora bench
//! e2e`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use cipherlora_model::ModelConfig;
use cipherlora_service::auth::TokenSet;
use cipherlora_service::{
    AdapterBackend, ClientConfig, DevCert, LinkProfile, Placement, ServeConfig, ServerThread,
    dev_cert,
};

use super::HeBackend;
use crate::{LoraKind, PrivateError};

/// A running loopback adapter server holding one adapter; dropping it shuts it down.
pub struct EmbeddedServer {
    thread: ServerThread,
    cert: DevCert,
    token: String,
    adapter_id: String,
    kind: LoraKind,
}

impl std::fmt::Debug for EmbeddedServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedServer")
            .field("addr", &self.thread.addr())
            .field("adapter_id", &self.adapter_id)
            .finish_non_exhaustive()
    }
}

impl EmbeddedServer {
    /// Loads the PEFT adapter in `dir` (as `adapter_id`) for a base model of shape `config` and
    /// serves it on `127.0.0.1` (ephemeral port) with TLS and a random 32-byte token, threads
    /// placed per `placement`. Errors: those of [`HeBackend::load`]; [`PrivateError::Service`] for
    /// the certificate or listener; [`PrivateError::Ckks`] if the OS generator fails.
    pub fn start(
        adapter_id: &str,
        dir: &Path,
        config: &ModelConfig,
        placement: Option<Placement>,
    ) -> Result<Self, PrivateError> {
        let backend = HeBackend::load(adapter_id, dir, config)?;
        let kind = backend.server().groups().kind;
        let cert = dev_cert(&["localhost", "127.0.0.1"])?;
        let token = random_token()?;
        let mut serve = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        serve.tls = Some(cert.server_tls());
        serve.tokens = Some(TokenSet::new(&[token.as_str()])?);
        let backends: Vec<Arc<dyn AdapterBackend>> = vec![Arc::new(backend)];
        let thread = ServerThread::start_with(serve, backends, 2, placement)?;
        Ok(Self {
            thread,
            cert,
            token,
            adapter_id: adapter_id.into(),
            kind,
        })
    }

    /// The id the adapter is served under.
    pub fn adapter_id(&self) -> &str {
        &self.adapter_id
    }

    /// Whether the served adapter is FFA or standard LoRA.
    pub fn kind(&self) -> LoraKind {
        self.kind
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.thread.addr()
    }

    /// A client configuration for this server (TLS trust, token) over the simulated `link`.
    pub fn client_config(&self, link: LinkProfile) -> ClientConfig {
        let mut c = ClientConfig::new(format!("https://localhost:{}", self.addr().port()));
        c.tls = Some(self.cert.client_tls("localhost"));
        c.token = Some(self.token.clone());
        c.link = link;
        c
    }
}

/// 32 bytes from the OS CSPRNG, hex.
fn random_token() -> Result<String, PrivateError> {
    let seed = cipherlora_ckks::os_seed()?;
    Ok(seed.iter().map(|b| format!("{b:02x}")).collect())
}
