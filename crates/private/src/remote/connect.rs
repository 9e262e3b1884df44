//! [`connect`]: a private session over gRPC ([`connect_with`] through a [`GrpcOpener`]).

use cipherlora_model::{Model, ModelConfig};
use cipherlora_service::{ClientConfig, LinkProfile};

use super::{GrpcTransport, connect_remote};
use crate::PrivateError;
use crate::client::{ConnectOptions, HeHook, PrivateSession, SessionOpener, connect_with};
use crate::server::Grouping;

/// Sessions over gRPC ([`connect_remote`]).
#[derive(Debug, Clone)]
pub struct GrpcOpener {
    /// The adapter server and how to reach it.
    pub client: ClientConfig,
    /// The adapter's id on it.
    pub adapter_id: String,
}

impl SessionOpener for GrpcOpener {
    type Transport = GrpcTransport;

    fn open(
        &mut self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<GrpcTransport>, PrivateError> {
        connect_remote(self.client.clone(), &self.adapter_id, t, grouping, config)
    }

    fn measure_link(&self) -> Result<LinkProfile, PrivateError> {
        Ok(LinkProfile::measure_tcp(&self.client.endpoint)?)
    }
}

/// [`connect_with`] over gRPC.
///
/// # Errors
/// As [`connect_with`].
pub fn connect(
    client: ClientConfig,
    adapter_id: &str,
    options: &ConnectOptions,
    models: (&Model, &Model),
) -> Result<PrivateSession<GrpcTransport>, PrivateError> {
    let mut opener = GrpcOpener {
        client,
        adapter_id: adapter_id.to_string(),
    };
    connect_with(&mut opener, options, models)
}
