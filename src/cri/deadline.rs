//! A call whose client deadline (`grpc-timeout`) passes is answered DEADLINE_EXCEEDED, as a Go
//! gRPC server (containerd's) answers it and as the CRI validation suite expects. tonic's own
//! timeout answers CANCELLED; this layer, inside it, ends the call a millisecond earlier with
//! the right code.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// What is taken off the client's deadline, so this answer comes before tonic's.
const MARGIN: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

/// `grpc-timeout`: digits and a unit (H, M, S, m, u, n).
pub fn parse_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Deadline<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_timeout);
        let call = self.inner.call(req);
        Box::pin(async move {
            let Some(t) = timeout else {
                return call.await;
            };
            match tokio::time::timeout(t.saturating_sub(MARGIN), call).await {
                Ok(r) => r,
                Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                    "the client's deadline of {t:?} passed"
                ))
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler slower than the client's deadline: the answer is DEADLINE_EXCEEDED, before the
    /// deadline; a quick one passes through.
    #[tokio::test]
    async fn a_call_past_its_deadline_is_deadline_exceeded() {
        use tower::{Layer, Service};
        let slow = tower::service_fn(|req: http::Request<()>| async move {
            let wait = req.uri().path() == "/slow";
            if wait {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
        });
        let mut svc = DeadlineLayer.layer(slow);
        let call = |path: &str| {
            http::Request::builder()
                .uri(path)
                .header("grpc-timeout", "50m")
                .body(())
                .unwrap()
        };
        let started = std::time::Instant::now();
        let resp = svc.call(call("/slow")).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        let status = tonic::Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        let resp = svc.call(call("/quick")).await.unwrap();
        assert!(tonic::Status::from_header_map(resp.headers()).is_none());
    }

    #[test]
    fn timeouts_parse_as_grpc_writes_them() {
        assert_eq!(parse_timeout("1n"), Some(Duration::from_nanos(1)));
        assert_eq!(parse_timeout("120S"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_timeout("999999m"),
            Some(Duration::from_millis(999_999))
        );
        assert_eq!(parse_timeout("5x"), None);
        assert_eq!(parse_timeout("S"), None);
        assert_eq!(parse_timeout("1234567890S"), None);
    }
}
