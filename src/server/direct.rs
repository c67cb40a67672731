//! The gRPC listener's service: one method's calls go straight to the service that answers
//! them, and every other path through tonic's router, as before.
//!
//! tonic serves each call through an axum router: the path matched against every route, a map of
//! URL parameters put in the request's extensions and dropped with it, the service cloned into a
//! boxed one-shot future, the answer's body wrapped once more: about 3,600 instructions a call
//! on the memory backend, most of what the decision itself costs (the benchmark's
//! `instructions` scenario; by hand, 55,400 → 51,750 a call). Nearly every call a rate-limit
//! service takes is `ShouldRateLimit`: one comparison of the path sends it to its service, and
//! the router is left for health checks, reflection and paths no service knows, which it answers
//! exactly as it did. tonic's own layers (the `grpc-timeout` deadline, connection limits) wrap
//! this service as they wrapped the router.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::service::Routes;

/// Sends the calls of one method (by its path) to `service`, and every other request to
/// tonic's router of all the listener's services.
#[derive(Clone, Debug)]
pub struct Direct<S> {
    path: &'static str,
    service: S,
    routes: Routes,
}

impl<S> Direct<S> {
    /// Calls to `path` go to `service`; the rest to `routes` (which should hold `service` too,
    /// for the other methods of its gRPC service).
    pub fn new(path: &'static str, service: S, routes: Routes) -> Self {
        Direct {
            path,
            service,
            // What tonic's own server does with the routes it serves: binds the router's state
            // once, not on every call.
            routes: routes.prepare(),
        }
    }
}

impl<S> Service<http::Request<Body>> for Direct<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, <Routes as Service<http::Request<Body>>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both are asked: either may take the next call.
        let routes = Service::<http::Request<Body>>::poll_ready(&mut self.routes, cx);
        match (self.service.poll_ready(cx), routes) {
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() == self.path {
            Either::Left(self.service.call(request))
        } else {
            Either::Right(self.routes.call(request))
        }
    }
}
