//! Real OTLP backends on loopback, for tests/jaeger.rs and tests/collector.rs:
//! Jaeger v1.75.0 (all-in-one, in-memory storage, its HTTP query API) and an
//! OpenTelemetry Collector v0.161.0 (OTLP receiver, file exporter), built once
//! by `scripts/backends.sh` into a cache outside the repository.
//!
//! Each server runs as a child process on free loopback ports, its output in
//! its own temporary folder (shown when it fails to start), and is killed when
//! its value drops, a failing test's unwinding included (and, through
//! `PR_SET_PDEATHSIG`, when the test process itself dies).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a server may take to come up on a loaded 2-core machine.
const START: Duration = Duration::from_secs(90);

/// The folder holding `jaeger` and `otelcol`, or `None` where
/// `TGPU_NO_BACKENDS=1` says to go without them (the caller skips, saying so).
/// Taken from `TGPU_BACKENDS` (scripts/test.sh sets it), else built (or found
/// in the cache) by `scripts/backends.sh`; a failed build fails the test.
pub fn binaries() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if std::env::var("TGPU_NO_BACKENDS").as_deref() == Ok("1") {
            eprintln!("skipped: TGPU_NO_BACKENDS=1 (no Jaeger or Collector)");
            return None;
        }
        if let Some(dir) = std::env::var_os("TGPU_BACKENDS").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(dir));
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/backends.sh");
        let out = Command::new(script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/backends.sh");
        assert!(
            out.status.success(),
            "scripts/backends.sh failed (set TGPU_NO_BACKENDS=1 to skip the backend tests)"
        );
        let dir = String::from_utf8(out.stdout).unwrap();
        Some(PathBuf::from(dir.trim()))
    })
    .clone()
}

/// A free loopback address (bound and released: another process may take it
/// before the server does, which then fails to start, loudly).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A server process, killed on drop.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    name: &'static str,
}

impl Server {
    /// Starts `program` with the configuration `config` makes (given the
    /// server's own folder).
    fn spawn(name: &'static str, program: &Path, config: impl FnOnce(&Path) -> String) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config(dir.path())).unwrap();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(program);
        cmd.arg(format!("--config={}", config_path.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: one system call between fork and exec, no allocation.
        unsafe {
            cmd.pre_exec(|| {
                // Dies with the test process, however it ends.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Server { child, dir, name }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Waits until `ready` says so, failing with the server's log past [`START`].
    fn wait_until(&mut self, mut ready: impl FnMut() -> bool) {
        let t = Instant::now();
        while !ready() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}):\n{}", self.name, self.log());
            }
            assert!(
                t.elapsed() < START,
                "{} not ready after {START:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listening(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Jaeger all-in-one: OTLP in (gRPC and HTTP), spans in memory, the query
/// service's HTTP API, with its clock-skew adjustment on.
pub struct Jaeger {
    server: Server,
    /// OTLP/gRPC.
    pub grpc: SocketAddr,
    /// OTLP/HTTP.
    pub http: SocketAddr,
    /// The query service's HTTP API (and UI).
    pub query: SocketAddr,
}

/// What Jaeger's query service may move a span by to fix a clock skew it
/// thinks it sees: on (its default is off), so that a span it would move is
/// moved, and says so in its `warnings`.
pub const MAX_CLOCK_SKEW_ADJUST: &str = "30s";

impl Jaeger {
    /// Starts Jaeger from `dir` ([`binaries`]) and waits until it takes spans
    /// and answers queries.
    pub fn start(dir: &Path) -> Jaeger {
        let (grpc, http, query, query_grpc) = (free_addr(), free_addr(), free_addr(), free_addr());
        let config = format!(
            r#"
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    max_clock_skew_adjust: {MAX_CLOCK_SKEW_ADJUST}
    http:
      endpoint: {query}
    grpc:
      endpoint: {query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {grpc}
        max_recv_msg_size_mib: 64
      http:
        endpoint: {http}
processors:
  batch:
    timeout: 50ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"#
        );
        let mut server = Server::spawn("jaeger", &dir.join("jaeger"), |_| config);
        let url = format!("http://{query}/api/services");
        server.wait_until(|| {
            listening(grpc)
                && listening(http)
                && reqwest::blocking::get(&url).is_ok_and(|r| r.status().is_success())
        });
        Jaeger {
            server,
            grpc,
            http,
            query,
        }
    }

    /// GETs `path_and_query` from the query API, as JSON.
    pub fn get(&self, path_and_query: &str) -> Value {
        let url = format!("http://{}{path_and_query}", self.query);
        let r = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
            .get(&url)
            .send()
            .unwrap_or_else(|e| panic!("GET {url}: {e}\n{}", self.server.log()));
        assert!(r.status().is_success(), "GET {url}: {}", r.status());
        serde_json::from_slice(&r.bytes().unwrap()).unwrap()
    }

    /// The traces of `service` (`/api/traces`, as the UI reads them), once
    /// they hold `spans` spans in all (Jaeger stores what it receives in
    /// batches); panics with what came past `wait`.
    pub fn traces(&self, service: &str, spans: usize, wait: Duration) -> Vec<Value> {
        let t = Instant::now();
        loop {
            let got = self.get(&format!(
                "/api/traces?service={service}&limit=1000&lookback=custom&start=0"
            ));
            let traces = got["data"].as_array().cloned().unwrap_or_default();
            let n: usize = traces
                .iter()
                .map(|t| t["spans"].as_array().map_or(0, Vec::len))
                .sum();
            if n >= spans || t.elapsed() > wait {
                assert_eq!(
                    n,
                    spans,
                    "spans of {service} in Jaeger after {:?}",
                    t.elapsed()
                );
                return traces;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// An OpenTelemetry Collector: OTLP in (gRPC and HTTP), each export written
/// as a line of OTLP/JSON to a file.
pub struct Collector {
    server: Server,
    /// OTLP/gRPC.
    pub grpc: SocketAddr,
    /// OTLP/HTTP.
    pub http: SocketAddr,
    file: PathBuf,
}

impl Collector {
    /// Starts the Collector from `dir` ([`binaries`]) and waits until it takes spans.
    pub fn start(dir: &Path) -> Collector {
        let (grpc, http) = (free_addr(), free_addr());
        let mut file = PathBuf::new();
        let config = |folder: &Path| {
            file = folder.join("spans.jsonl");
            format!(
                r#"
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {grpc}
        max_recv_msg_size_mib: 64
      http:
        endpoint: {http}
exporters:
  file:
    path: {file}
    format: json
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"#,
                file = file.display()
            )
        };
        let mut server = Server::spawn("otelcol", &dir.join("otelcol"), config);
        server.wait_until(|| listening(grpc) && listening(http));
        Collector {
            server,
            grpc,
            http,
            file,
        }
    }

    /// The spans of `service` written so far, each with its resource's
    /// attributes, once there are `spans` of them; panics with what came past
    /// `wait`.
    pub fn spans(&self, service: &str, spans: usize, wait: Duration) -> Vec<(Value, Value)> {
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.file).unwrap_or_default();
            let mut all = Vec::new();
            // A line being written may be incomplete: only whole lines count.
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let Ok(data) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                for rs in data["resourceSpans"].as_array().into_iter().flatten() {
                    let resource = rs["resource"]["attributes"].clone();
                    if attribute(&resource, "service.name")["stringValue"] != service {
                        continue;
                    }
                    for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                        for span in ss["spans"].as_array().into_iter().flatten() {
                            all.push((resource.clone(), span.clone()));
                        }
                    }
                }
            }
            if all.len() >= spans || t.elapsed() > wait {
                assert_eq!(
                    all.len(),
                    spans,
                    "spans of {service} in the Collector's file after {:?}:\n{}",
                    t.elapsed(),
                    self.server.log()
                );
                return all;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The value of attribute `key` in an OTLP/JSON attribute list (`Null` if absent).
pub fn attribute<'a>(attributes: &'a Value, key: &str) -> &'a Value {
    attributes
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv["key"] == key)
        .map_or(&Value::Null, |kv| &kv["value"])
}
