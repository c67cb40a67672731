//! The gRPC listener's service on the fast path: one method's calls go straight to the service
//! that answers them, and every other path through tonic's router, as before.
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

#[cfg(test)]
mod tests {
    use std::future::{Ready, ready};

    use tonic::server::NamedService;

    use super::*;

    /// A service that answers every call with its own name in a header.
    #[derive(Clone)]
    struct Named(&'static str);

    impl NamedService for Named {
        const NAME: &'static str = "test.Service";
    }

    impl Service<http::Request<Body>> for Named {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = Ready<Result<http::Response<Body>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let mut response = http::Response::new(Body::empty());
            response
                .headers_mut()
                .insert("served-by", http::HeaderValue::from_static(self.0));
            ready(Ok(response))
        }
    }

    /// Who answered a call to `path`, and its gRPC status, if any.
    fn answered(direct: &mut Direct<Named>, path: &str) -> (Option<String>, Option<String>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let request = http::Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .expect("a request");
        let response = runtime.block_on(async {
            std::future::poll_fn(|cx| direct.poll_ready(cx))
                .await
                .expect("ready");
            direct.call(request).await.expect("infallible")
        });
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        };
        (header("served-by"), header("grpc-status"))
    }

    /// The one path goes to the service it names, past the router; another method of the same
    /// gRPC service goes through the router to the service registered there; a service the
    /// router does not know is refused as tonic refuses it.
    #[test]
    fn one_path_goes_straight_and_the_rest_through_the_router() {
        let routes = Routes::new(Named("router"));
        let mut direct = Direct::new("/test.Service/Direct", Named("direct"), routes);
        assert_eq!(
            answered(&mut direct, "/test.Service/Direct").0.as_deref(),
            Some("direct")
        );
        assert_eq!(
            answered(&mut direct, "/test.Service/Other").0.as_deref(),
            Some("router")
        );
        // UNIMPLEMENTED, from tonic's fallback.
        assert_eq!(
            answered(&mut direct, "/no.such.Service/Call"),
            (None, Some("12".to_owned()))
        );
    }
}
