//! [`connect`]: a private session over gRPC ([`connect_with`] through a [`GrpcOpener`]).

use cipherlora_model::{Model, ModelConfig};
use cipherlora_service::{AdapterClient, ClientConfig, LinkProfile};

use super::grpc_transport::transport_error;
use super::{GrpcTransport, connect_remote, fetch_offer};
use crate::PrivateError;
use crate::client::width_plan::PlanSpace;
use crate::client::{
    ConnectOptions, HeHook, HookPair, PrivateSession, SessionOpener, connect_with,
};
use crate::protocol::Grouping;

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

    fn plan_space(&mut self, t: usize, grouping: Grouping) -> Result<PlanSpace, PrivateError> {
        let mut client = AdapterClient::connect(self.client.clone()).map_err(transport_error)?;
        let offer = fetch_offer(&mut client, &self.adapter_id, t, grouping)?;
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
        let (client, id) = (&self.client, &self.adapter_id);
        std::thread::scope(|s| {
            let a = s.spawn(|| connect_remote(client.clone(), id, ta, ga, config));
            let b = connect_remote(client.clone(), id, tb, gb, config);
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
    let mut opener = GrpcOpener {
        client,
        adapter_id: adapter_id.to_string(),
    };
    connect_with(&mut opener, options, models)
}
