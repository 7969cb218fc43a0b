//! Serving an axum app on a port that untrusted clients can reach: the
//! cloud's API and the gateway's local port both go through here.
//!
//! `axum::serve` reads a request head and body for as long as the client
//! takes, and accepts every connection offered, so a client that opens
//! connections and then trickles (or never sends) its request holds a
//! task and its buffers for good, and enough of them hold all of them.
//! Here each connection takes one of [`ServeLimits::max_connections`]
//! places before it is accepted (the rest wait in the kernel's backlog),
//! its request head must arrive within [`ServeLimits::header_timeout`],
//! and its body must not stall for longer than
//! [`ServeLimits::body_timeout`] between pieces. A body cut off that way
//! fails to read: [`read_body`] tells that apart from one too large.
//! Both binaries stop serving the same way too ([`stop_on_signal`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tower_http::timeout::TimeoutBody;

/// What one served port allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once; later ones wait to be accepted.
    pub max_connections: usize,
    /// Longest wait for a request head, from the connection's start or
    /// the previous response (an idle keep-alive connection is closed
    /// after it too).
    pub header_timeout: Duration,
    /// Longest pause within a request body.
    pub body_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// The problems of `limits`, each as its key (under the server's `http`
/// table) and what it must be: a zero would refuse every client, and the
/// ceilings catch a unit typed wrong.
pub fn problems(limits: &ServeLimits) -> Vec<(&'static str, &'static str)> {
    let mut problems = Vec::new();
    if !(1..=1_000_000).contains(&limits.max_connections) {
        problems.push(("max_connections", "must be 1 to 1000000"));
    }
    let timeouts = Duration::from_millis(100)..=Duration::from_secs(3600);
    if !timeouts.contains(&limits.header_timeout) {
        problems.push(("header_timeout", "must be 100ms to 1h"));
    }
    if !timeouts.contains(&limits.body_timeout) {
        problems.push(("body_timeout", "must be 100ms to 1h"));
    }
    problems
}

/// Serves `app` on `listener` within `limits` until `shutdown` ends, then
/// stops accepting, lets each connection finish the request it is on, and
/// returns once all have closed. Handlers find the peer's address as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) {
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let place = tokio::select! {
            place = Arc::clone(&places).acquire_owned() => place,
            () = &mut shutdown => break,
        };
        // The semaphore is never closed.
        let Ok(place) = place else { break };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, mostly: accepting again at
                    // once would spin; a closing connection frees one.
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        connections.spawn(connection(stream, peer, app.clone(), limits, place, stop.clone()));
    }
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
}

/// Cancels `shutdown` at SIGTERM or Ctrl-C: where a binary's graceful stop
/// begins.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            tracing::error!("cannot listen for SIGTERM");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
    shutdown.cancel();
}

/// Why a request body could not be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyReadError {
    /// Longer than the limit.
    TooLarge,
    /// Paused for longer than [`ServeLimits::body_timeout`].
    Stalled,
    /// Cut off by the client, or framed wrong.
    Broken,
}

impl BodyReadError {
    /// What to tell the client, `limit` the body's bound.
    pub fn message(self, limit: usize) -> String {
        match self {
            BodyReadError::TooLarge => format!("request body is larger than {limit} bytes"),
            BodyReadError::Stalled => "request body stalled: sent too slowly".to_owned(),
            BodyReadError::Broken => "request body could not be read".to_owned(),
        }
    }

    /// The status to answer with.
    pub fn status(self) -> StatusCode {
        match self {
            BodyReadError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BodyReadError::Stalled => StatusCode::REQUEST_TIMEOUT,
            BodyReadError::Broken => StatusCode::BAD_REQUEST,
        }
    }

    /// The error shape's code, also the rejection reason in metrics.
    pub fn code(self) -> &'static str {
        match self {
            BodyReadError::TooLarge => "payload_too_large",
            BodyReadError::Stalled => "request_timeout",
            BodyReadError::Broken => "unreadable_body",
        }
    }
}

/// Refuses, before any of it is read, a body whose `Content-Length`
/// passes `limit`.
pub fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<(), BodyReadError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(BodyReadError::TooLarge),
        _ => Ok(()),
    }
}

/// Reads `body` whole, up to `limit` bytes.
pub async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, BodyReadError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(error) = cause {
            if error.is::<http_body_util::LengthLimitError>() {
                return BodyReadError::TooLarge;
            }
            if error.is::<tower_http::timeout::TimeoutError>() {
                return BodyReadError::Stalled;
            }
            cause = error.source();
        }
        BodyReadError::Broken
    })
}

/// Serves one connection, holding its `place` until it closes.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ServeLimits,
    place: OwnedSemaphorePermit,
    stop: CancellationToken,
) {
    let body_timeout = limits.body_timeout;
    let service = app.map_request(move |request: hyper::Request<Incoming>| {
        let mut request = request.map(|body| Body::new(TimeoutBody::new(body_timeout, body)));
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let served = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(served);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = served.as_mut() => {
                // A client gone or too slow; nothing to answer.
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "HTTP connection ended");
                }
                break;
            }
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
    drop(place);
}

#[cfg(test)]
mod tests {
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A guard on each wait below: far longer than any of them takes.
    const GUARD: Duration = Duration::from_secs(20);

    struct Server {
        addr: SocketAddr,
        stop: CancellationToken,
        /// Told each time `/echo` is called, before it reads the body.
        echo_called: tokio::sync::mpsc::UnboundedReceiver<()>,
    }

    async fn start(limits: ServeLimits) -> Server {
        let (called, echo_called) = tokio::sync::mpsc::unbounded_channel();
        let echo = move |body: Body| async move {
            let _ = called.send(());
            read_body(body, 8).await.map_err(BodyReadError::status)
        };
        let app = Router::new()
            .route(
                "/peer",
                get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
            )
            .route("/echo", post(echo));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, app, limits, stop.clone().cancelled_owned()));
        Server { addr, stop, echo_called }
    }

    /// Everything the server sends until it closes the connection.
    async fn until_closed(stream: &mut TcpStream) -> String {
        let mut reply = Vec::new();
        let read = tokio::time::timeout(GUARD, stream.read_to_end(&mut reply));
        // A reset counts as closed too.
        let _ = read.await.expect("the server closes the connection");
        String::from_utf8_lossy(&reply).into_owned()
    }

    fn limits(max_connections: usize) -> ServeLimits {
        ServeLimits {
            max_connections,
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_millis(300),
        }
    }

    #[tokio::test]
    async fn a_request_head_that_never_ends_is_cut_off() {
        let addr = start(limits(8)).await.addr;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        assert!(!until_closed(&mut partial).await.contains("200 OK"));
        assert!(!until_closed(&mut silent).await.contains("200 OK"));
    }

    #[tokio::test]
    async fn a_stalled_body_is_not_read_to_the_end() {
        let addr = start(limits(8)).await.addr;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc";
        stream.write_all(head.as_bytes()).await.unwrap();
        let reply = until_closed(&mut stream).await;
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        // Told apart from a body past the limit.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789";
        stream.write_all(head.as_bytes()).await.unwrap();
        let reply = until_closed(&mut stream).await;
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    }

    #[tokio::test]
    async fn connections_past_the_limit_wait_for_a_place() {
        let addr = start(ServeLimits { header_timeout: GUARD, ..limits(1) }).await.addr;
        let request = b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        second.write_all(request).await.unwrap();
        // The first holds the only place while it sends nothing; the
        // second, already sent, is not answered meanwhile.
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(300), second.read(&mut byte));
        assert!(early.await.is_err(), "answered past the limit");
        first.write_all(request).await.unwrap();
        let reply = until_closed(&mut first).await;
        assert!(reply.contains(&first.local_addr().unwrap().to_string()), "{reply}");
        let reply = until_closed(&mut second).await;
        assert!(reply.contains(&second.local_addr().unwrap().to_string()), "{reply}");
    }

    #[tokio::test]
    async fn shutdown_lets_the_request_in_progress_finish() {
        let mut server = start(ServeLimits { body_timeout: GUARD, ..limits(8) }).await;
        let addr = server.addr;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc";
        stream.write_all(head.as_bytes()).await.unwrap();
        server.echo_called.recv().await.unwrap();
        server.stop.cancel();
        stream.write_all(b"def").await.unwrap();
        let reply = until_closed(&mut stream).await;
        assert!(reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("abcdef"), "{reply}");
        assert!(TcpStream::connect(addr).await.is_err(), "still accepting after shutdown");
    }

    #[test]
    fn limits_out_of_range_are_named() {
        assert!(problems(&ServeLimits::default()).is_empty());
        let zero = ServeLimits {
            max_connections: 0,
            header_timeout: Duration::ZERO,
            body_timeout: Duration::from_secs(7200),
        };
        let named: Vec<&str> = problems(&zero).iter().map(|(key, _)| *key).collect();
        assert_eq!(named, ["max_connections", "header_timeout", "body_timeout"]);
    }
}
