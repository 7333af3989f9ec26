//! A real OTLP trace receiver on loopback, for the tests, built on OpenTelemetry's
//! published protobuf definitions (`opentelemetry-proto`):
//! - gRPC: the generated `TraceService` server, served by tonic;
//! - HTTP: a small HTTP/1.1 server on a std `TcpListener` that decodes
//!   `POST /v1/traces` bodies (`application/x-protobuf`) with prost;
//! - a "black hole" that accepts connections and never answers (a slow endpoint);
//! - misbehaving HTTP collectors ([`Misbehaving`]): one that trickles its reply a
//!   byte a second, one that refuses with a status, one that answers 200 with a
//!   body that is not an OTLP response; and a gRPC collector that refuses
//!   ([`Receiver::refusing`]).
//!
//! The thread servers stop by themselves after [`SERVER_LIFETIME`] or
//! [`MAX_CONNECTIONS`] connections, whichever comes first, even if a test
//! never drops them.
#![allow(dead_code)] // each test file uses its own part of this module

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// Generous, for a loaded 2-core machine: waits end as soon as the data is there.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How long a thread server lives at most.
pub const SERVER_LIFETIME: Duration = Duration::from_secs(300);
/// How many connections a thread server accepts at most.
pub const MAX_CONNECTIONS: usize = 256;
/// How many bytes the trickling collector sends, one a second, before closing.
pub const TRICKLE_BYTES: usize = 120;

/// Which protocol a receiver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    Http,
}

/// One received span, with its resource and scope.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
    pub scope: String,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        attr(&self.span.attributes, key)
    }

    pub fn str_attr(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    pub fn int_attr(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            Value::IntValue(v) => Some(*v),
            _ => None,
        }
    }

    pub fn resource_str(&self, key: &str) -> Option<&str> {
        match attr(&self.resource, key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }
}

pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

#[derive(Default)]
struct Store {
    spans: Mutex<Vec<Received>>,
    arrived: Condvar,
    requests: AtomicU64,
}

impl Store {
    fn take(&self, request: ExportTraceServiceRequest) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut spans = self.spans.lock().unwrap();
        for rs in request.resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| s.name).unwrap_or_default();
                for span in ss.spans {
                    spans.push(Received {
                        span,
                        resource: resource.clone(),
                        scope: scope.clone(),
                    });
                }
            }
        }
        self.arrived.notify_all();
    }
}

/// The gRPC collector: stores what it receives, or refuses it with `refuse`.
struct Collector {
    store: Arc<Store>,
    refuse: Option<tonic::Code>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if let Some(code) = self.refuse {
            self.store.requests.fetch_add(1, Ordering::Relaxed);
            return Err(tonic::Status::new(code, "refused by the test collector"));
        }
        self.store.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

enum Server {
    Grpc {
        runtime: tokio::runtime::Runtime,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    },
    Threads {
        stop: Arc<AtomicBool>,
        accept: JoinHandle<()>,
    },
}

/// A receiver listening on 127.0.0.1; stops (and closes its port) when dropped.
pub struct Receiver {
    pub transport: Transport,
    pub addr: SocketAddr,
    store: Arc<Store>,
    server: Option<Server>,
}

impl Receiver {
    /// Starts a receiver on a free port.
    pub fn start(transport: Transport) -> Receiver {
        Receiver::start_on(transport, "127.0.0.1:0".parse().unwrap())
    }

    /// A gRPC collector that answers every export with status `code`.
    pub fn refusing(code: tonic::Code) -> Receiver {
        let store = Arc::new(Store::default());
        let (addr, server) = grpc_server("127.0.0.1:0".parse().unwrap(), store.clone(), Some(code));
        Receiver {
            transport: Transport::Grpc,
            addr,
            store,
            server: Some(server),
        }
    }

    /// Starts a receiver on `addr` (to bring an endpoint back on its old port).
    pub fn start_on(transport: Transport, addr: SocketAddr) -> Receiver {
        let store = Arc::new(Store::default());
        let (addr, server) = match transport {
            Transport::Grpc => grpc_server(addr, store.clone(), None),
            Transport::Http => {
                let listener = bind(addr);
                let addr = listener.local_addr().unwrap();
                let store = store.clone();
                (
                    addr,
                    thread_server(listener, move |stream, stop| {
                        serve_http(stream, &store, &stop)
                    }),
                )
            }
        };
        Receiver {
            transport,
            addr,
            store,
            server: Some(server),
        }
    }

    /// What the exporter is given: for HTTP the base URL (our builder appends
    /// `/v1/traces`), for gRPC the server's URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> u64 {
        self.store.requests.load(Ordering::Relaxed)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.store.spans.lock().unwrap().clone()
    }

    /// Waits (at most [`PATIENCE`]) until `done` holds for the spans received.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + PATIENCE;
        let mut spans = self.store.spans.lock().unwrap();
        while !done(&spans) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}; received {} spans: {:?}",
                spans.len(),
                spans.iter().map(|s| &s.span.name).collect::<Vec<_>>()
            );
            spans = self.store.arrived.wait_timeout(spans, left).unwrap().0;
        }
        spans.clone()
    }

    /// Waits until at least `n` spans arrived.
    pub fn wait_spans(&self, n: usize) -> Vec<Received> {
        self.wait_for(&format!("{n} spans"), |s| s.len() >= n)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            stop_server(server);
        }
    }
}

/// A listener that accepts connections, reads whatever comes and never answers:
/// an endpoint that is up but slow past any timeout.
pub struct BlackHole {
    pub addr: SocketAddr,
    server: Option<Server>,
}

impl BlackHole {
    pub fn start() -> BlackHole {
        let listener = bind("127.0.0.1:0".parse().unwrap());
        let addr = listener.local_addr().unwrap();
        let server = thread_server(listener, |mut stream, stop| {
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::Acquire) {
                match stream.read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if is_timeout(&e) => {}
                    Err(_) => return,
                }
            }
        });
        BlackHole {
            addr,
            server: Some(server),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            stop_server(server);
        }
    }
}

/// How a [`Misbehaving`] HTTP collector answers each request (read whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// 200 and its headers at once (announcing [`TRICKLE_BYTES`] of body),
    /// then the body one byte a second.
    Trickle,
    /// This status, with an empty body.
    Status(u16),
    /// 200, with a body that is not an `ExportTraceServiceResponse`.
    Garbage,
    /// 200, with an `ExportTraceServiceResponse` whose `partial_success`
    /// rejects this many spans of each request.
    Reject(i64),
}

/// The body of [`Misbehaviour::Garbage`]: not protobuf (`t` = field 14 with
/// wire type 4, an end-group tag without its start).
pub const GARBAGE: &[u8] = b"this is not an OTLP response";

/// An HTTP collector that misbehaves as told.
pub struct Misbehaving {
    pub addr: SocketAddr,
    pub how: Misbehaviour,
    requests: Arc<AtomicU64>,
    server: Option<Server>,
}

impl Misbehaving {
    pub fn start(how: Misbehaviour) -> Misbehaving {
        let listener = bind("127.0.0.1:0".parse().unwrap());
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        let server = thread_server(listener, move |stream, stop| {
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            while read_request(&mut reader, &stop).is_some() {
                count.fetch_add(1, Ordering::Relaxed);
                let sent = match how {
                    Misbehaviour::Status(code) => writer.write_all(
                        format!("HTTP/1.1 {code} Misbehaving\r\ncontent-length: 0\r\n\r\n")
                            .as_bytes(),
                    ),
                    Misbehaviour::Garbage => writer.write_all(
                        &[
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                                 content-length: {}\r\n\r\n",
                                GARBAGE.len()
                            )
                            .as_bytes(),
                            GARBAGE,
                        ]
                        .concat(),
                    ),
                    Misbehaviour::Reject(spans) => {
                        use opentelemetry_proto::tonic::collector::trace::v1::{
                            ExportTracePartialSuccess, ExportTraceServiceResponse,
                        };
                        use prost::Message;
                        let body = ExportTraceServiceResponse {
                            partial_success: Some(ExportTracePartialSuccess {
                                rejected_spans: spans,
                                error_message: "span too large".into(),
                            }),
                        }
                        .encode_to_vec();
                        writer.write_all(
                            &[
                                format!(
                                    "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                                     content-length: {}\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                                &body,
                            ]
                            .concat(),
                        )
                    }
                    Misbehaviour::Trickle => trickle(&mut writer, &stop),
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        Misbehaving {
            addr,
            how,
            requests,
            server: Some(server),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests read so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Misbehaving {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            stop_server(server);
        }
    }
}

/// [`Misbehaviour::Trickle`]'s reply: the headers, then a byte a second until
/// [`TRICKLE_BYTES`] or `stop`.
fn trickle(writer: &mut TcpStream, stop: &AtomicBool) -> std::io::Result<()> {
    writer.write_all(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {TRICKLE_BYTES}\r\n\r\n"
        )
        .as_bytes(),
    )?;
    for _ in 0..TRICKLE_BYTES {
        for _ in 0..10 {
            if stop.load(Ordering::Acquire) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // A byte of an empty field 1 (`rejected_spans`), so far as it goes.
        writer.write_all(&[0x08])?;
    }
    Ok(())
}

/// A loopback address on which nothing listens (yet): bound, then released.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn bind(addr: SocketAddr) -> TcpListener {
    // The port may still be held by a connection closing down: retry a while.
    let deadline = Instant::now() + PATIENCE;
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("bind {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("cannot bind {addr}: {e}"),
        }
    }
}

fn grpc_server(
    addr: SocketAddr,
    store: Arc<Store>,
    refuse: Option<tonic::Code>,
) -> (SocketAddr, Server) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = bind(addr);
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(
                TraceServiceServer::new(Collector { store, refuse }),
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
    });
    (
        addr,
        Server::Grpc {
            runtime,
            stop: Some(stop),
            task,
        },
    )
}

/// Accepts on `listener`, one thread per connection running `serve` until
/// the stop flag is set, which happens when the server is dropped, after
/// [`SERVER_LIFETIME`] or after [`MAX_CONNECTIONS`] connections.
fn thread_server(
    listener: TcpListener,
    serve: impl Fn(TcpStream, Arc<AtomicBool>) + Send + Sync + Clone + 'static,
) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // Polled, so that the loop sees the flag and the time without a wake-up.
    listener.set_nonblocking(true).unwrap();
    let accept = std::thread::spawn(move || {
        let end = Instant::now() + SERVER_LIFETIME;
        let mut connections = Vec::new();
        while !flag.load(Ordering::Acquire)
            && Instant::now() < end
            && connections.len() < MAX_CONNECTIONS
        {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            stream.set_nonblocking(false).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let (serve, flag) = (serve.clone(), flag.clone());
            connections.push(std::thread::spawn(move || serve(stream, flag)));
        }
        // Closes the port; the connections see the flag within 100 ms.
        drop(listener);
        flag.store(true, Ordering::Release);
        for c in connections {
            let _ = c.join();
        }
    });
    Server::Threads { stop, accept }
}

fn stop_server(server: Server) {
    match server {
        Server::Grpc {
            runtime,
            mut stop,
            task,
        } => {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            // Waits for open connections to close; the exporters close theirs
            // when their requests end.
            let _ = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), task).await });
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        Server::Threads { stop, accept } => {
            stop.store(true, Ordering::Release);
            let _ = accept.join();
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// One HTTP/1.1 request: its request line, headers (lower-case names) and body.
struct HttpRequest {
    line: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// Reads one request; `None` when the connection closes or `stop` is set.
fn read_request(reader: &mut BufReader<TcpStream>, stop: &AtomicBool) -> Option<HttpRequest> {
    // Request line and headers.
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return None,
            Ok(_) => {
                if line == "\r\n" || line == "\n" {
                    if head.is_empty() {
                        continue;
                    }
                    break;
                }
                head.push(line);
            }
            Err(e) if is_timeout(&e) => {
                if stop.load(Ordering::Acquire) {
                    return None;
                }
                // A partial line stays in `line` only on a timeout mid-line,
                // which loopback clients do not cause; keep what we have.
                if !line.is_empty() {
                    head.push(line);
                }
            }
            Err(_) => return None,
        }
    }
    let headers: HashMap<String, String> = head[1..]
        .iter()
        .filter_map(|h| h.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let mut got = 0;
    while got < length {
        match reader.read(&mut body[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if is_timeout(&e) && !stop.load(Ordering::Acquire) => {}
            Err(_) => return None,
        }
    }
    Some(HttpRequest {
        line: head.swap_remove(0),
        headers,
        body,
    })
}

/// Serves HTTP/1.1 requests on one connection until it closes or `stop` is set.
fn serve_http(stream: TcpStream, store: &Store, stop: &AtomicBool) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader, stop) {
        let ok = request.line.starts_with("POST /v1/traces ")
            && request
                .headers
                .get("content-type")
                .is_some_and(|t| t.starts_with("application/x-protobuf"));
        let response = if ok {
            match ExportTraceServiceRequest::decode(request.body.as_slice()) {
                Ok(decoded) => {
                    store.take(decoded);
                    let body = ExportTraceServiceResponse::default().encode_to_vec();
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend_from_slice(&body);
                    r
                }
                Err(_) => b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_vec(),
            }
        } else {
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec()
        };
        if writer.write_all(&response).is_err() {
            return;
        }
    }
}
