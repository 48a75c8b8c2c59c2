//! cli: the client commands, in the style of crictl. They speak CRI to whatever runtime listens
//! on the socket (`--socket` or `CRIUS_SOCKET`), so they work against containerd too; crius's own
//! `crius.v1.Pulls` adds a progress bar where the runtime offers it; `exec -it`, `attach` and
//! `port-forward` speak SPDY to the runtime's streaming server (`stream`). Output is a table,
//! or JSON or YAML with `-o json|yaml`. `logs` reads the log file kubelet-style, so it runs on
//! the node. Failures are `Error`s saying what was being done (`main` prints them). Uses
//! `cri::client`, and the pod agent's manifests and records (`frontend`) for its commands.
//! `args` holds the binary's command line (clap definitions), which `main` parses.

pub mod agent;
pub mod args;
mod images;
mod node;
mod pods;
mod run;
mod stats;
pub mod stream;

use std::path::{Path, PathBuf};

use tonic::transport::Channel;

pub use images::{images, inspect_image, pull, remove_images};
pub use node::{check, info};
pub use pods::{exec, inspect, inspect_pod, logs, pods, ps, rm, rm_pods, stop, stop_pods};
pub use run::{create, runp, start};
pub use stats::{imagefsinfo, stats, statsp};
pub use stream::{attach, forward};

/// `crius exec -i/-t`.
pub use stream::exec as exec_stream;

/// Why a client command failed, each saying what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to {socket}: {source}")]
    Connect {
        socket: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("{what}: no runtime answers on {socket} ({message})")]
    NoRuntime {
        what: String,
        socket: PathBuf,
        message: String,
    },
    #[error("{what}: {message} ({code:?})")]
    Rpc {
        what: String,
        code: tonic::Code,
        message: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// What was asked cannot be done, in words (a file's field, a missing pod, a bad flag).
    #[error("{0}")]
    Refused(String),
    #[error("printing {format}: {message}")]
    Print {
        format: &'static str,
        message: String,
    },
    #[error(transparent)]
    Manifest(#[from] crate::frontend::manifest::ManifestError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Ends the command with [`Error::Refused`], worded as `format!` words it.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::cli::Error::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// An I/O error with what was being done (`.doing(|| format!("reading {}", path))`).
pub(crate) trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Doing<T> for std::io::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            what: what(),
            source,
        })
    }
}

/// What a missing value means, as a refusal (`.or_refuse(|| "...".into())`).
pub(crate) trait OrRefuse<T> {
    fn or_refuse(self, why: impl FnOnce() -> String) -> Result<T>;
}

impl<T> OrRefuse<T> for Option<T> {
    fn or_refuse(self, why: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| Error::Refused(why()))
    }
}

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
        Output::Json => println!("{}", json_text(v)?),
        Output::Yaml => print!(
            "{}",
            serde_saphyr::to_string(v).map_err(|e| Error::Print {
                format: "YAML",
                message: e.to_string(),
            })?
        ),
    }
    Ok(true)
}

/// `v` as a JSON value.
pub fn json_value(v: &impl serde::Serialize) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| Error::Print {
        format: "JSON",
        message: e.to_string(),
    })
}

/// `v` as indented JSON.
pub fn json_text(v: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string_pretty(v).map_err(|e| Error::Print {
        format: "JSON",
        message: e.to_string(),
    })
}

pub fn connect(socket: &Path) -> Result<Channel> {
    crate::cri::client::channel(socket).map_err(|source| Error::Connect {
        socket: socket.to_path_buf(),
        source,
    })
}

/// A status from the runtime, as a readable error.
pub fn rpc_error(what: &str, socket: &Path, s: tonic::Status) -> Error {
    // The transport's own answers (no socket, nothing listening), not a runtime's Unavailable.
    let unreachable = ["connect", "No such file or directory", "Connection refused"];
    if s.code() == tonic::Code::Unavailable && unreachable.iter().any(|m| s.message().contains(m)) {
        return Error::NoRuntime {
            what: what.into(),
            socket: socket.to_path_buf(),
            message: s.message().into(),
        };
    }
    Error::Rpc {
        what: what.into(),
        code: s.code(),
        message: s.message().into(),
    }
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

    #[test]
    fn statuses_read_as_what_went_wrong() {
        let socket = Path::new("/run/crius/crius.sock");
        let gone = tonic::Status::unavailable("No such file or directory (os error 2)");
        assert_eq!(
            rpc_error("listing pods", socket, gone).to_string(),
            "listing pods: no runtime answers on /run/crius/crius.sock \
             (No such file or directory (os error 2))"
        );
        // The runtime's own Unavailable (a registry it could not reach) is its answer.
        let busy = tonic::Status::unavailable("registry 127.0.0.1:5000 is busy");
        assert_eq!(
            rpc_error("pulling x", socket, busy).to_string(),
            "pulling x: registry 127.0.0.1:5000 is busy (Unavailable)"
        );
        let none: Result<u8> = None.or_refuse(|| "pod a/b not found".into());
        assert_eq!(none.unwrap_err().to_string(), "pod a/b not found");
    }
}
