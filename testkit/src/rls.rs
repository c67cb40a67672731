//! Talking to a running tollgate over gRPC: channels, the RateLimitService client and its
//! requests, and gRPC health.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A plaintext gRPC channel to `addr`, with deadlines that suit a loaded machine.
pub async fn channel(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("an http URI of a socket address is valid")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
}

/// A RateLimitService client connected to `addr`.
pub async fn client(
    addr: SocketAddr,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    Ok(RateLimitServiceClient::new(channel(addr).await?))
}

/// A `RateLimitRequest` for `domain` with one descriptor per list of `(key, value)` entries.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: (*key).to_owned(),
                        value: (*value).to_owned(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Asks `grpc.health.v1.Health/Check` for `service` once.
pub async fn health_status(addr: SocketAddr, service: &str) -> Result<ServingStatus, String> {
    let channel = channel(addr).await.map_err(|err| err.to_string())?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|status| status.to_string())?;
    Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
}
