//! A Pod as CRI requests, the way kubelet builds them: the sandbox config (metadata, hostname,
//! DNS, namespaces, security, sysctls, pod resources), and each container's config (command and
//! args with `$(VAR)` expansion, environment from values, fields, resources, Secrets and
//! ConfigMaps, mounts, resources with the QoS class's `oom_score_adj` and swap, security
//! context with kubelet's masked and read-only paths), plus the QoS class itself.
//!
//! `sandbox` builds the sandbox config, `container` each container's config and mounts, `env` the
//! environment and the downward API, `resources` the QoS class and resources; `node` has the
//! node's facts and the Secrets and ConfigMaps. This file has the pod's context they all take.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

mod container;
mod env;
mod node;
mod resources;
mod sandbox;

pub use container::{MASKED_PATHS, READONLY_PATHS, container_config, mounts};
pub use env::{environment, expand, field, resource_field};
pub use node::{Node, Store, SwapBehavior};
pub use resources::{container_resources, oom_score_adj, pod_resources, qos, swap_limit};
pub use sandbox::{namespace_options, sandbox_config};

/// A pod being run: its spec and identity, and what it needs resolved.
pub struct PodContext<'a> {
    pub pod: &'a Pod,
    pub spec: &'a PodSpec,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub store: &'a Store,
    pub node: &'a Node,
    /// The pod's log directory (`/var/log/pods/<ns>_<name>_<uid>`).
    pub log_dir: &'a Path,
    /// Host paths of the pod's volumes by name.
    pub volumes: &'a HashMap<String, PathBuf>,
    /// A hosts file of the agent's own (hostAliases), mounted at /etc/hosts.
    pub hosts_file: Option<&'a Path>,
    /// The pod's IPs, the primary (IPv4 where there is one) first.
    pub pod_ips: &'a [String],
}

/// Labels kubelet puts on what it creates, which let an agent find them again.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Why a container cannot be configured yet (kubelet's CreateContainerConfigError).
#[derive(Debug)]
pub struct ConfigError(pub String);

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

fn profile(kind: &str, local: Option<&str>, root: Option<&Path>) -> Option<cri::SecurityProfile> {
    use cri::security_profile::ProfileType;
    let t = match kind {
        "RuntimeDefault" => ProfileType::RuntimeDefault,
        "Unconfined" => ProfileType::Unconfined,
        "Localhost" => ProfileType::Localhost,
        _ => return None,
    };
    let localhost_ref = match (t, local, root) {
        (ProfileType::Localhost, Some(l), Some(r)) => r.join(l).display().to_string(),
        (ProfileType::Localhost, Some(l), None) => l.to_string(),
        _ => String::new(),
    };
    Some(cri::SecurityProfile {
        profile_type: t as i32,
        localhost_ref,
    })
}

/// For the submodules' tests: a pod from YAML, and a node.
#[cfg(test)]
mod testing {
    use super::*;

    pub(super) fn pod(yaml: &str) -> Pod {
        let objs = super::super::manifest::load_str(yaml, Path::new("t.yaml")).unwrap();
        match &objs[0].object {
            super::super::manifest::Object::Pod(p) => (**p).clone(),
            _ => panic!("not a pod"),
        }
    }

    pub(super) fn node() -> Node {
        Node {
            name: "n1".into(),
            memory: 8 << 30,
            swap: 2 << 30,
            swap_behavior: SwapBehavior::LimitedSwap,
            cgroup_v2: true,
            seccomp_root: "/var/lib/kubelet/seccomp".into(),
        }
    }
}
