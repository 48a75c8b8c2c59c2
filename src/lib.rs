//! crius: a Kubernetes node runtime. The modules, top to bottom (dependencies point down;
//! `layout` checks that every module is named here and that no files import each other in a
//! circle; `docs_check`, like it a test only, that the docs' links, configuration keys and
//! commands are true to the tree):
//!
//! - `cli`: the client commands (talks CRI over the socket, like crictl); `frontend`: the pod
//!   agent, a kubelet-like CRI client; `preflight`: `crius check`'s node checks
//! - `daemon`: the daemon's lifecycle; `cri`: tonic glue for CRI runtime.v1 and `crius.v1`, and
//!   the conversion of CRI's messages to crius's own types and back
//! - `pod`: pod sandboxes orchestrated over `sandbox`, `container`, `image` and `network`
//! - `image`: references, registries, pulls, the image catalog; `sandbox`: pause processes and
//!   the namespaces, files and cgroups of pods; `container`: containers and their monitors;
//!   `network`: CNI network lists and plugins; `stream`: the streaming server (exec, attach,
//!   port-forward over SPDY and WebSocket)
//! - `content` (blobs by digest), `snapshot` (unpacked layers), `runtime` (the synchronous
//!   helpers: monitor, pause, init, cgroup, seccomp), `systemd` (the systemd cgroup driver's
//!   D-Bus side, used by `sandbox` and `container`), `metrics` (the OpenMetrics registry and
//!   endpoint), `tls` (the streaming server's certificates), `cdi` (CDI spec files and the
//!   container edits they make), `nri` (NRI plugins: their socket, ttrpc, events and
//!   adjustments, used by `pod` and `container`)
//! - `config`, `atomic` (state files), `records` (in-memory record index), `mounttable` (the
//!   mounts under a directory), `fault` (crash points for tests), `sys` (the only `unsafe`)

pub mod atomic;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod container;
pub mod content;
pub mod cri;
pub mod daemon;
#[cfg(test)]
mod docs_check;
pub mod fault;
pub mod frontend;
pub mod image;
#[cfg(test)]
mod layout;
pub mod metrics;
pub mod mounttable;
pub mod network;
pub mod nri;
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
