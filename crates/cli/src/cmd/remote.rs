//! What the private commands (`generate --server`, `api`) share: the adapter server's client
//! configuration from command-line files.

use std::path::Path;

use anyhow::Context;
use cipherlora_service::{ClientConfig, ClientTls, LinkProfile};

/// The client configuration for `url`: TLS trusting `ca_cert` (PEM), the token from `token_file`'s
/// first non-empty line, and the simulated `link`. Errors: unreadable files, a bad certificate.
pub fn client_config(
    url: &str,
    ca_cert: Option<&Path>,
    token_file: Option<&Path>,
    link: Option<LinkProfile>,
) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::new(url);
    if let Some(ca) = ca_cert {
        let host = url.split("://").last().unwrap_or(url);
        let host = host.split(['/', ':']).next().unwrap_or("localhost");
        config.tls = Some(ClientTls::from_file(ca, host)?);
    }
    if let Some(f) = token_file {
        let t = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        config.token = t
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(String::from);
    }
    if let Some(link) = link {
        config.link = link;
    }
    Ok(config)
}
