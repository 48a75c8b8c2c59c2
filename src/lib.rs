//! crius: a Kubernetes node runtime. The modules, top to bottom (dependencies point down):
//!
//! - `cli`: the client commands (talks CRI over the socket, like crictl); `frontend`: the pod
//!   agent, a kubelet-like CRI client
//! - `daemon`: the daemon's lifecycle; `cri`: tonic glue for CRI runtime.v1 and `crius.v1`
//! - `pod`: pod sandboxes orchestrated over `sandbox`, `container` and `image`
//! - `image`: references, registries, pulls, the image catalog; `sandbox`: pause processes and
//!   the namespaces, files and cgroups of pods; `container`: containers and their monitors
//! - `content` (blobs by digest), `snapshot` (unpacked layers), `runtime` (the synchronous
//!   helpers: monitor, pause, init, cgroup, seccomp), `systemd` (the systemd cgroup driver's
//!   D-Bus side, used by `sandbox` and `container`)
//! - `config`, `atomic` (state files), `records` (in-memory record index), `fault` (crash points
//!   for tests), `sys` (the only `unsafe`)

pub mod atomic;
pub mod cli;
pub mod config;
pub mod container;
pub mod content;
pub mod cri;
pub mod daemon;
pub mod fault;
pub mod frontend;
pub mod image;
#[cfg(test)]
mod layout;
pub mod metrics;
pub mod mounttable;
pub mod network;
pub mod pod;
pub mod preflight;
pub mod records;
pub mod runtime;
pub mod sandbox;
pub mod snapshot;
pub mod stream;
pub mod sys;
pub mod systemd;
pub mod tls;
