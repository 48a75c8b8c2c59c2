//! metrics: what the daemon counts for operators, in the OpenMetrics text format (which
//! Prometheus scrapes) on an opt-in address (`[metrics] address`). CRI calls under the names
//! and labels containerd's gRPC interceptor (go-grpc-prometheus) gives them, so dashboards made
//! for containerd work: `grpc_server_handled_total` and `grpc_server_handling_seconds` by
//! `grpc_type`, `grpc_service`, `grpc_method` (and `grpc_code`; ExecSync's latency is exec
//! latency); under `crius_`: image pulls (count by result, bytes, duration, failures by reason), pod network
//! setup latency, and, measured when scraped, pods and containers by state and the memory of
//! the daemon and its helpers. One registry for the process; modules record into it through
//! `global()`. Uses nothing else of crius; the daemon serves it.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A CRI call as go-grpc-prometheus labels it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Rpc {
    pub grpc_type: &'static str,
    pub grpc_service: &'static str,
    pub grpc_method: String,
    pub grpc_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Method {
    pub grpc_type: &'static str,
    pub grpc_service: &'static str,
    pub grpc_method: String,
}

/// The CRI service a method belongs to.
fn service_of(method: &str) -> &'static str {
    match method {
        "PullImage" | "ListImages" | "ImageStatus" | "RemoveImage" | "ImageFsInfo" => {
            "runtime.v1.ImageService"
        }
        _ => "runtime.v1.RuntimeService",
    }
}

/// gRPC's own names for codes (as Go spells them), which tonic's Debug form mostly matches.
fn code_name(code: &str) -> String {
    match code {
        "Ok" => "OK".to_string(),
        "Cancelled" => "Canceled".to_string(),
        other => other.to_string(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct State {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Process {
    pub process: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginRun {
    pub plugin: String,
    pub operation: String,
}

fn latency() -> Histogram {
    // 0.5 ms to about 65 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

pub struct Metrics {
    registry: Registry,
    pub rpcs: Family<Rpc, Counter>,
    pub rpc_seconds: Family<Method, Histogram, fn() -> Histogram>,
    pub pulls: Family<Outcome, Counter>,
    pub pull_failures: Family<Reason, Counter>,
    pub pull_bytes: Counter,
    pub pull_seconds: Histogram,
    pub network_seconds: Family<Operation, Histogram, fn() -> Histogram>,
    pub plugin_seconds: Family<PluginRun, Histogram, fn() -> Histogram>,
    pub pods: Family<State, Gauge>,
    pub containers: Family<State, Gauge>,
    pub memory: Family<Process, Gauge>,
    pub processes: Family<Process, Gauge>,
}

impl Metrics {
    fn new() -> Metrics {
        let mut root = Registry::default();
        let m = Metrics {
            rpcs: Family::default(),
            rpc_seconds: Family::new_with_constructor(latency),
            pulls: Family::default(),
            pull_failures: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            network_seconds: Family::new_with_constructor(latency),
            plugin_seconds: Family::new_with_constructor(latency),
            pods: Family::default(),
            containers: Family::default(),
            memory: Family::default(),
            processes: Family::default(),
            registry: Registry::default(),
        };
        root.register(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            m.rpcs.clone(),
        );
        root.register(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            m.rpc_seconds.clone(),
        );
        let registry = root.sub_registry_with_prefix("crius");
        registry.register("image_pulls", "Image pulls by result", m.pulls.clone());
        registry.register(
            "image_pull_failures",
            "Failed image pulls by reason",
            m.pull_failures.clone(),
        );
        registry.register(
            "image_pull_bytes",
            "Bytes of image layers pulled",
            m.pull_bytes.clone(),
        );
        registry.register(
            "image_pull_duration_seconds",
            "Image pull duration",
            m.pull_seconds.clone(),
        );
        registry.register(
            "network_duration_seconds",
            "Pod network setup and teardown (CNI) duration by operation",
            m.network_seconds.clone(),
        );
        registry.register(
            "network_plugin_duration_seconds",
            "CNI plugin runs by plugin type and operation",
            m.plugin_seconds.clone(),
        );
        registry.register("pods", "Pod sandboxes by state", m.pods.clone());
        registry.register("containers", "Containers by state", m.containers.clone());
        registry.register(
            "resident_memory_bytes",
            "Resident memory of the daemon and its helper processes, by kind",
            m.memory.clone(),
        );
        registry.register(
            "helper_processes",
            "Processes of crius by kind",
            m.processes.clone(),
        );
        Metrics {
            registry: root,
            ..m
        }
    }

    /// The registry in the OpenMetrics text format, `# EOF` included.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts one CRI call; `code` as tonic names it.
    pub fn rpc(&self, method: &str, code: &str, seconds: f64) {
        let grpc_type = if method == "GetContainerEvents" {
            "server_stream"
        } else {
            "unary"
        };
        let grpc_service = service_of(method);
        self.rpcs
            .get_or_create(&Rpc {
                grpc_type,
                grpc_service,
                grpc_method: method.to_string(),
                grpc_code: code_name(code),
            })
            .inc();
        self.rpc_seconds
            .get_or_create(&Method {
                grpc_type,
                grpc_service,
                grpc_method: method.to_string(),
            })
            .observe(seconds);
    }

    /// Counts one image pull: its bytes, duration, and result (a failure by its reason).
    /// A network ADD or DEL (`operation`) that took `seconds`.
    pub fn network(&self, operation: &str, seconds: f64) {
        self.network_seconds
            .get_or_create(&Operation {
                operation: operation.into(),
            })
            .observe(seconds);
    }

    pub fn pull(&self, bytes: u64, seconds: f64, failure: Option<&str>) {
        self.pull_bytes.inc_by(bytes);
        self.pull_seconds.observe(seconds);
        let result = if failure.is_some() {
            "failure"
        } else {
            "success"
        };
        self.pulls
            .get_or_create(&Outcome {
                result: result.to_string(),
            })
            .inc();
        if let Some(reason) = failure {
            self.pull_failures
                .get_or_create(&Reason {
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    /// Sets a gauge family to exactly these values (states that vanished go to zero).
    pub fn set_states(family: &Family<State, Gauge>, counts: &[(&str, i64)]) {
        for (state, n) in counts {
            family
                .get_or_create(&State {
                    state: state.to_string(),
                })
                .set(*n);
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

/// Resident memory and count of crius's processes by kind, read from `/proc`: the daemon
/// itself, container monitors and pause processes (by their process names).
pub fn sample_processes() {
    let m = global();
    let me = std::process::id();
    let mut totals: std::collections::BTreeMap<&str, (i64, i64)> =
        [("daemon", (0, 0)), ("monitor", (0, 0)), ("pause", (0, 0))].into();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("")
        };
        let kind = match field("Name:") {
            _ if pid == me => "daemon",
            "crius-monitor" => "monitor",
            "pause" => "pause",
            _ => continue,
        };
        let kib: i64 = field("VmRSS:")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0);
        if let Some(t) = totals.get_mut(kind) {
            t.0 += kib * 1024;
            t.1 += 1;
        }
    }
    for (kind, (bytes, count)) in totals {
        let label = Process {
            process: kind.to_string(),
        };
        m.memory.get_or_create(&label).set(bytes);
        m.processes.get_or_create(&label).set(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_parses() {
        let m = global();
        m.rpc("Version", "Ok", 0.001);
        m.pull(1234, 0.5, None);
        m.pull(0, 0.1, Some("Unauthenticated"));
        Metrics::set_states(&m.pods, &[("ready", 2), ("notready", 1)]);
        sample_processes();
        let text = m.encode();
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
        let find = |name: &str| {
            scrape
                .samples
                .iter()
                .filter(|s| s.metric == name)
                .collect::<Vec<_>>()
        };
        let version = find("grpc_server_handled_total")
            .into_iter()
            .find(|s| s.labels.get("grpc_method") == Some("Version"))
            .map(|s| {
                (
                    s.labels.get("grpc_service").map(str::to_string),
                    s.labels.get("grpc_code").map(str::to_string),
                )
            });
        assert_eq!(
            version,
            Some((
                Some("runtime.v1.RuntimeService".to_string()),
                Some("OK".to_string())
            )),
            "{text}"
        );
        assert!(!find("crius_image_pull_bytes_total").is_empty(), "{text}");
        assert_eq!(find("crius_pods").len(), 2, "{text}");
        let daemon = find("crius_helper_processes")
            .into_iter()
            .find(|s| s.labels.get("process") == Some("daemon"))
            .map(|s| s.value.clone());
        assert!(
            matches!(daemon, Some(prometheus_parse::Value::Gauge(v)) if v == 1.0),
            "{text}"
        );
    }
}
