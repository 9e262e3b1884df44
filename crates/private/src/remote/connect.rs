//! [`connect`]: a private session over gRPC ([`connect_with`] through a [`GrpcOpener`]).

use std::sync::OnceLock;

use cipherlora_model::{Model, ModelConfig};
use cipherlora_service::{AdapterClient, AdapterInfo, ClientConfig, LinkProfile};

use super::GrpcTransport;
use super::grpc_transport::{adapter_info, fetch_listed_offer, open_listed, transport_error};
use crate::PrivateError;
use crate::client::width_plan::PlanSpace;
use crate::client::{
    ConnectOptions, HeHook, HookPair, PrivateSession, SessionOpener, connect_with,
};
use crate::protocol::Grouping;

/// Sessions over gRPC ([`super::connect_remote`]), each on its own connection. The adapter's
/// description (`ListAdapters`) is asked for once and serves every offer this opener fetches.
#[derive(Debug, Clone)]
pub struct GrpcOpener {
    client: ClientConfig,
    adapter_id: String,
    listed: OnceLock<AdapterInfo>,
}

impl GrpcOpener {
    /// Sessions of `adapter_id` on the server `client` reaches.
    #[must_use]
    pub fn new(client: ClientConfig, adapter_id: &str) -> Self {
        Self {
            client,
            adapter_id: adapter_id.to_string(),
            listed: OnceLock::new(),
        }
    }

    /// A connection to the server and the adapter's description.
    fn connect(&self) -> Result<(AdapterClient, AdapterInfo), PrivateError> {
        let mut client = AdapterClient::connect(self.client.clone()).map_err(transport_error)?;
        let info = match self.listed.get() {
            Some(info) => info.clone(),
            None => {
                let info = adapter_info(&mut client, &self.adapter_id)?;
                self.listed.get_or_init(|| info).clone()
            }
        };
        Ok((client, info))
    }
}

impl SessionOpener for GrpcOpener {
    type Transport = GrpcTransport;

    fn open(
        &self,
        t: usize,
        grouping: Grouping,
        config: &ModelConfig,
    ) -> Result<HeHook<GrpcTransport>, PrivateError> {
        let (client, info) = self.connect()?;
        open_listed(client, info, t, grouping, config)
    }

    fn plan_space(&mut self, t: usize, grouping: Grouping) -> Result<PlanSpace, PrivateError> {
        let (mut client, info) = self.connect()?;
        let offer = fetch_listed_offer(&mut client, info, t, grouping)?;
        Ok(PlanSpace::of(&offer.offer))
    }

    /// Each session on its own connection and thread: while one's keys upload, the server
    /// prepares the other's plans.
    fn open_pair(
        &mut self,
        (ta, ga): (usize, Grouping),
        (tb, gb): (usize, Grouping),
        config: &ModelConfig,
    ) -> Result<HookPair<GrpcTransport>, PrivateError> {
        let opener = &*self;
        std::thread::scope(|s| {
            let a = s.spawn(|| opener.open(ta, ga, config));
            let b = opener.open(tb, gb, config);
            // A panic there is a bug: raise it here.
            let a = a.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            Ok((a?, b?))
        })
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
    let mut opener = GrpcOpener::new(client, adapter_id);
    connect_with(&mut opener, options, models)
}
