//! What pods run with besides their own spec: the facts of the node (name, memory, swap and how
//! it is given, cgroup version, seccomp root), and the Secrets and ConfigMaps they may refer to.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// How swap is given to containers (kubelet's `memorySwap.swapBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, Default)]
pub enum SwapBehavior {
    #[default]
    NoSwap,
    LimitedSwap,
}

/// Facts of the node the pods run on.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub memory: u64,
    pub swap: u64,
    pub swap_behavior: SwapBehavior,
    /// Whether the node's cgroups are v2 (swap settings mean nothing otherwise).
    pub cgroup_v2: bool,
    /// Where Localhost seccomp profiles are, as kubelet's `<root>/seccomp`.
    pub seccomp_root: PathBuf,
}

impl Node {
    pub fn detect(swap_behavior: SwapBehavior, seccomp_root: PathBuf) -> Node {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        Node {
            name: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            memory: field("MemTotal:"),
            swap: field("SwapTotal:"),
            swap_behavior,
            cgroup_v2: std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            seccomp_root,
        }
    }
}

/// The Secrets and ConfigMaps pods may refer to, by `namespace/name`.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub secrets: HashMap<String, Secret>,
    pub config_maps: HashMap<String, ConfigMap>,
}

impl Store {
    /// A Secret's data, `stringData` over `data`.
    pub fn secret(&self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let s = self.secrets.get(&format!("{ns}/{name}"))?;
        let mut out: BTreeMap<String, Vec<u8>> = s
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        for (k, v) in s.string_data.iter().flatten() {
            out.insert(k.clone(), v.clone().into_bytes());
        }
        Some(out)
    }

    pub fn config_map(&self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let c = self.config_maps.get(&format!("{ns}/{name}"))?;
        let mut out: BTreeMap<String, Vec<u8>> = c
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        for (k, v) in c.binary_data.iter().flatten() {
            out.insert(k.clone(), v.0.clone());
        }
        Some(out)
    }
}
