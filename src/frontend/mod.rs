//! frontend: a kubelet-like agent that runs Pod manifests on one node without a control plane.
//! It reads manifests (`manifest`, `yaml`), turns pods into CRI requests, and drives them through
//! their lifecycle: volumes, sandbox, pulls, init containers and sidecars, containers, probes,
//! restarts with back-off, hooks and termination. It talks to the runtime only through CRI
//! (`cri::client`), exactly as kubelet does, so it runs on containerd too; of the image module it
//! uses only the pure parsers (references, docker config credentials); its own state (pod
//! status, events) lives in files under its state directory. What it does on the node itself, as
//! kubelet does (tmpfs mounts for volumes, removing a pod's directory), is its own (`node`,
//! `mounttable`), never the runtime's.

pub mod agent;
pub mod convert;
pub mod manifest;
pub mod node;
pub mod probe;
pub mod quantity;
pub mod status;
pub mod volumes;
pub mod worker;
pub mod yaml;

/// The label that marks sandboxes the agent made (the agent finds its own by it; the worker puts
/// it on the sandboxes it makes).
pub const AGENT_LABEL: &str = "io.crius.agent";
