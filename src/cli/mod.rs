//! cli: the client commands, in the style of crictl. They speak CRI to whatever runtime listens
//! on the socket (`--socket` or `CRIUS_SOCKET`), so they work against containerd too; crius's own
//! `crius.v1.Pulls` adds a progress bar where the runtime offers it; `exec -it`, `attach` and
//! `port-forward` speak SPDY to the runtime's streaming server (`stream`). Output is a table,
//! or JSON or YAML with `-o json|yaml`. `logs` reads the log file kubelet-style, so it runs on the node. Uses
//! `cri::client`, and the pod agent's manifests and records (`frontend`) for its commands.

pub mod agent;
mod images;
mod node;
mod pods;
mod run;
mod stats;
pub mod stream;

use std::path::Path;

use anyhow::{Context, Result};
use tonic::transport::Channel;

pub use images::{images, inspect_image, pull, remove_images};
pub use node::{check, info};
pub use pods::{exec, inspect, inspect_pod, logs, pods, ps, rm, rm_pods, stop, stop_pods};
pub use run::{create, runp, start};
pub use stats::{imagefsinfo, stats, statsp};
pub use stream::{attach, forward};

/// `crius exec -i/-t`.
pub use stream::exec as exec_stream;

/// Output format of listing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    /// A table with more columns where a command has them (the agent's pods: IP and node).
    Wide,
    Json,
    Yaml,
}

/// Prints `v` as JSON or YAML when asked for; false for a table, which the caller prints.
pub fn print_structured(v: &impl serde::Serialize, output: Output) -> Result<bool> {
    match output {
        Output::Table | Output::Wide => return Ok(false),
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(v)?),
    }
    Ok(true)
}

pub fn connect(socket: &Path) -> Result<Channel> {
    crate::cri::client::channel(socket)
        .with_context(|| format!("connecting to {}", socket.display()))
}

/// A status from the runtime, as a readable error.
pub fn rpc_error(what: &str, socket: &Path, s: tonic::Status) -> anyhow::Error {
    if s.code() == tonic::Code::Unavailable && s.message().contains("connect") {
        return anyhow::anyhow!(
            "{what}: no runtime answers on {} ({})",
            socket.display(),
            s.message()
        );
    }
    anyhow::anyhow!("{what}: {} ({:?})", s.message(), s.code())
}

/// Prints rows as left-aligned columns, the first row being the header.
pub fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        println!("{}", line.trim_end());
    }
}

/// 1234567 -> "1.23MB" (decimal units, as crictl prints sizes).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
            + UNITS[u]
    }
}

/// `sha256:0123456789abcdef...` -> `0123456789ab`.
pub fn short_id(id: &str) -> String {
    let hex = id.split_once(':').map(|(_, h)| h).unwrap_or(id);
    hex.chars().take(13).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ids() {
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(1_000), "1kB");
        assert_eq!(human_size(1_234_567), "1.235MB");
        assert_eq!(short_id("sha256:0123456789abcdef0123"), "0123456789abc");
    }
}
