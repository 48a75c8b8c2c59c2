//! A Pod as CRI requests, the way kubelet builds them: the sandbox config (metadata, hostname,
//! DNS, namespaces, security, sysctls, pod resources), and each container's config (command and
//! args with `$(VAR)` expansion, environment from values, fields, resources, Secrets and
//! ConfigMaps, mounts, resources with the QoS class's `oom_score_adj` and swap, security
//! context with kubelet's masked and read-only paths), plus the QoS class itself.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, Pod, PodSpec, ResourceRequirements, Secret,
};

use super::quantity;

/// kubelet's default masked and read-only paths.
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

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
    pub pod_ip: &'a str,
}

/// Labels kubelet puts on what it creates, which let an agent find them again.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

fn millis(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> u64 {
    q.and_then(|q| quantity::parse(&q.0).ok())
        .map(|q| q.milli())
        .unwrap_or(0)
}

fn bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> u64 {
    q.and_then(|q| quantity::parse(&q.0).ok())
        .map(|q| q.value())
        .unwrap_or(0)
}

/// A container's (request, limit) of a resource, the request defaulting to the limit.
fn req_lim(r: Option<&ResourceRequirements>, name: &str, cpu: bool) -> (u64, u64) {
    let get =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            let q = m.and_then(|m| m.get(name));
            if cpu { millis(q) } else { bytes(q) }
        };
    let lim = get(r.and_then(|r| r.limits.as_ref()));
    let mut req = get(r.and_then(|r| r.requests.as_ref()));
    let has_req = r
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|m| m.contains_key(name));
    if !has_req && lim > 0 {
        req = lim;
    }
    (req, lim)
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

/// The pod's QoS class: Guaranteed when every container has equal CPU and memory requests and
/// limits, BestEffort when none has any, else Burstable.
pub fn qos(spec: &PodSpec) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in all_containers(spec) {
        let r = c.resources.as_ref();
        let has = |m: Option<&BTreeMap<String, _>>| {
            m.is_some_and(|m| m.keys().any(|k| k == "cpu" || k == "memory"))
        };
        if has(r.and_then(|r| r.requests.as_ref())) || has(r.and_then(|r| r.limits.as_ref())) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let (req, lim) = req_lim(r, res, res == "cpu");
            if lim == 0 || req != lim {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// kubelet's oom_score_adj for a container of a pod of this class.
pub fn oom_score_adj(qos: &str, memory_request: u64, node_memory: u64) -> i64 {
    match qos {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            if node_memory == 0 {
                return 999;
            }
            let adj = 1000 - (1000 * memory_request as i128 / node_memory as i128) as i64;
            adj.clamp(2, 999)
        }
    }
}

/// cpu.shares from millicores (kubelet's MilliCPUToShares).
fn shares(milli: u64) -> i64 {
    if milli == 0 {
        return 2;
    }
    ((milli * 1024) / 1000).max(2) as i64
}

const CPU_PERIOD: i64 = 100_000;

fn quota(milli: u64) -> i64 {
    ((milli as i64 * CPU_PERIOD) / 1000).max(1000)
}

/// A container's CRI resources.
pub fn container_resources(ctx: &PodContext, c: &Container) -> cri::LinuxContainerResources {
    let r = c.resources.as_ref();
    let (cpu_req, cpu_lim) = req_lim(r, "cpu", true);
    let (mem_req, mem_lim) = req_lim(r, "memory", false);
    let class = qos(ctx.spec);
    let mut out = cri::LinuxContainerResources {
        cpu_shares: shares(cpu_req),
        cpu_period: if cpu_lim > 0 { CPU_PERIOD } else { 0 },
        cpu_quota: if cpu_lim > 0 { quota(cpu_lim) } else { 0 },
        memory_limit_in_bytes: mem_lim as i64,
        oom_score_adj: oom_score_adj(class, mem_req, ctx.node.memory),
        ..Default::default()
    };
    for (name, q) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        if let Some(size) = name.strip_prefix("hugepages-") {
            out.hugepage_limits.push(cri::HugepageLimit {
                page_size: size.replace("Mi", "MB").replace("Gi", "GB"),
                limit: quantity::parse(&q.0).map(|q| q.value()).unwrap_or(0),
            });
        }
    }
    if ctx.node.cgroup_v2 {
        out.unified.insert(
            "memory.swap.max".into(),
            swap_limit(ctx.node, class, mem_req, mem_lim).to_string(),
        );
    }
    out
}

/// The swap a container may use: none under NoSwap; under LimitedSwap, for Burstable pods'
/// containers whose memory request differs from the limit, its share of the node's swap in the
/// proportion of its request to the node's memory.
pub fn swap_limit(node: &Node, qos: &str, mem_req: u64, mem_lim: u64) -> u64 {
    if node.swap_behavior == SwapBehavior::NoSwap || qos != "Burstable" {
        return 0;
    }
    if mem_req == 0 || mem_req == mem_lim || node.memory == 0 || mem_req > node.memory {
        return 0;
    }
    ((mem_req as f64 / node.memory as f64) * node.swap as f64) as u64
}

/// The pod's overall resources for its cgroup: the larger of the biggest init container and the
/// sum of the others, for limits only when every container has one.
pub fn pod_resources(spec: &PodSpec) -> cri::LinuxContainerResources {
    let mut out = cri::LinuxContainerResources::default();
    let (mut cpu_sum, mut mem_sum, mut cpu_lim_sum, mut mem_lim_sum) = (0u64, 0u64, 0u64, 0u64);
    let (mut all_cpu, mut all_mem) = (true, true);
    let (mut cpu_init, mut mem_init, mut cpu_lim_init, mut mem_lim_init) = (0u64, 0u64, 0u64, 0u64);
    for c in all_containers(spec) {
        let r = c.resources.as_ref();
        let (cr, cl) = req_lim(r, "cpu", true);
        let (mr, ml) = req_lim(r, "memory", false);
        all_cpu &= cl > 0;
        all_mem &= ml > 0;
        let regular_init = spec
            .init_containers
            .iter()
            .flatten()
            .any(|i| i.name == c.name && i.restart_policy.as_deref() != Some("Always"));
        if regular_init {
            cpu_init = cpu_init.max(cr);
            mem_init = mem_init.max(mr);
            cpu_lim_init = cpu_lim_init.max(cl);
            mem_lim_init = mem_lim_init.max(ml);
        } else {
            cpu_sum += cr;
            mem_sum += mr;
            cpu_lim_sum += cl;
            mem_lim_sum += ml;
        }
    }
    out.cpu_shares = shares(cpu_sum.max(cpu_init));
    if all_cpu {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = quota(cpu_lim_sum.max(cpu_lim_init));
    }
    if all_mem {
        out.memory_limit_in_bytes = mem_lim_sum.max(mem_lim_init) as i64;
    }
    let _ = mem_sum;
    out
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

/// Namespace modes of the pod.
pub fn namespace_options(spec: &PodSpec) -> cri::NamespaceOption {
    let mode = |on: Option<bool>, otherwise: cri::NamespaceMode| {
        if on == Some(true) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: mode(spec.host_network, cri::NamespaceMode::Pod),
        pid: if spec.host_pid == Some(true) {
            cri::NamespaceMode::Node as i32
        } else if spec.share_process_namespace == Some(true) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: mode(spec.host_ipc, cri::NamespaceMode::Pod),
        target_id: String::new(),
        userns_options: Some(cri::UserNamespace {
            mode: if spec.host_users == Some(false) {
                cri::NamespaceMode::Pod as i32
            } else {
                cri::NamespaceMode::Node as i32
            },
            ..Default::default()
        }),
    }
}

fn labels(ctx: &PodContext) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = ctx
        .pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    l.insert(LABEL_POD_NAME.into(), ctx.name.into());
    l.insert(LABEL_POD_NAMESPACE.into(), ctx.namespace.into());
    l.insert(LABEL_POD_UID.into(), ctx.uid.into());
    l
}

/// The sandbox of the pod's `attempt`th incarnation.
pub fn sandbox_config(ctx: &PodContext, attempt: u32) -> cri::PodSandboxConfig {
    let spec = ctx.spec;
    let psc = spec.security_context.as_ref();
    let dns = match spec.dns_policy.as_deref() {
        Some("None") => spec.dns_config.as_ref().map(|d| cri::DnsConfig {
            servers: d.nameservers.clone().unwrap_or_default(),
            searches: d.searches.clone().unwrap_or_default(),
            options: d
                .options
                .iter()
                .flatten()
                .map(|o| match &o.value {
                    Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                    None => o.name.clone().unwrap_or_default(),
                })
                .collect(),
        }),
        // No cluster DNS here: the node's resolv.conf, with any dnsConfig added.
        _ => spec.dns_config.as_ref().map(|d| {
            let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            let mut servers: Vec<String> = host
                .lines()
                .filter_map(|l| l.strip_prefix("nameserver"))
                .map(|s| s.trim().to_string())
                .collect();
            servers.extend(d.nameservers.clone().unwrap_or_default());
            let mut searches: Vec<String> = host
                .lines()
                .filter_map(|l| l.strip_prefix("search"))
                .flat_map(|s| s.split_whitespace().map(String::from).collect::<Vec<_>>())
                .collect();
            searches.extend(d.searches.clone().unwrap_or_default());
            cri::DnsConfig {
                servers,
                searches,
                options: d
                    .options
                    .iter()
                    .flatten()
                    .map(|o| match &o.value {
                        Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                        None => o.name.clone().unwrap_or_default(),
                    })
                    .collect(),
            }
        }),
    };
    let privileged = all_containers(spec).any(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    });
    let seccomp = psc.and_then(|s| s.seccomp_profile.as_ref()).and_then(|p| {
        profile(
            &p.type_,
            p.localhost_profile.as_deref(),
            Some(&ctx.node.seccomp_root),
        )
    });
    let apparmor = psc
        .and_then(|s| s.app_armor_profile.as_ref())
        .and_then(|p| profile(&p.type_, p.localhost_profile.as_deref(), None));
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: ctx.name.into(),
            uid: ctx.uid.into(),
            namespace: ctx.namespace.into(),
            attempt,
        }),
        hostname: if spec.host_network == Some(true) {
            String::new()
        } else {
            spec.hostname
                .clone()
                .unwrap_or_else(|| ctx.name.to_string())
        },
        log_directory: ctx.log_dir.display().to_string(),
        dns_config: dns,
        port_mappings: all_containers(spec)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| cri::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => cri::Protocol::Udp as i32,
                    Some("SCTP") => cri::Protocol::Sctp as i32,
                    _ => cri::Protocol::Tcp as i32,
                },
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or(0),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect(),
        labels: labels(ctx),
        annotations: ctx
            .pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                selinux_options: psc.and_then(|s| s.se_linux_options.as_ref()).map(|o| {
                    cri::SeLinuxOption {
                        user: o.user.clone().unwrap_or_default(),
                        role: o.role.clone().unwrap_or_default(),
                        r#type: o.type_.clone().unwrap_or_default(),
                        level: o.level.clone().unwrap_or_default(),
                    }
                }),
                run_as_user: psc
                    .and_then(|s| s.run_as_user)
                    .map(|v| cri::Int64Value { value: v }),
                run_as_group: psc
                    .and_then(|s| s.run_as_group)
                    .map(|v| cri::Int64Value { value: v }),
                readonly_rootfs: false,
                supplemental_groups: psc
                    .and_then(|s| s.supplemental_groups.clone())
                    .unwrap_or_default(),
                privileged,
                seccomp,
                apparmor,
                ..Default::default()
            }),
            sysctls: psc
                .and_then(|s| s.sysctls.as_ref())
                .into_iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            overhead: None,
            resources: Some(pod_resources(spec)),
        }),
        windows: None,
    }
}

/// `$(VAR)` references to earlier variables expanded, `$$` as a literal `$`; unknown references
/// stay as written (as kubelet does).
pub fn expand(s: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'('
                && let Some(end) = s[i + 2..].find(')')
            {
                let name = &s[i + 2..i + 2 + end];
                if let Some(v) = env.get(name) {
                    out.push_str(v);
                    i += end + 3;
                    continue;
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// A pod field by its downward API path.
pub fn field(ctx: &PodContext, path: &str) -> Option<String> {
    let m = &ctx.pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, rest: &str| {
        let key = rest.strip_prefix("['")?.strip_suffix("']")?;
        Some(map.as_ref()?.get(key).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(ctx.name.to_string()),
        "metadata.namespace" => Some(ctx.namespace.to_string()),
        "metadata.uid" => Some(ctx.uid.to_string()),
        "metadata.labels" | "metadata.annotations" => {
            let map = if path.ends_with("labels") {
                &m.labels
            } else {
                &m.annotations
            };
            Some(
                map.iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        }
        "spec.nodeName" => Some(ctx.node.name.clone()),
        "spec.serviceAccountName" => Some(
            ctx.spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        "status.podIP" | "status.podIPs" => Some(ctx.pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        p => {
            if let Some(rest) = p.strip_prefix("metadata.labels") {
                lookup(&m.labels, rest)
            } else if let Some(rest) = p.strip_prefix("metadata.annotations") {
                lookup(&m.annotations, rest)
            } else {
                None
            }
        }
    }
}

/// A container's resource by the downward API (`limits.cpu`, `requests.memory`), in units of
/// `divisor`, rounded up; a limit not set is the node's capacity.
pub fn resource_field(
    ctx: &PodContext,
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Option<String> {
    let (which, name) = resource.split_once('.')?;
    let r = container.resources.as_ref();
    let cpu = name == "cpu";
    let (req, lim) = req_lim(r, name, cpu);
    let mut v = if which == "limits" { lim } else { req };
    if which == "limits" && v == 0 {
        v = if cpu {
            std::thread::available_parallelism()
                .map(|n| n.get() as u64 * 1000)
                .unwrap_or(1000)
        } else {
            ctx.node.memory
        };
    }
    let div = match divisor {
        Some(d) => quantity::parse(d).ok()?,
        None => quantity::parse("1").ok()?,
    };
    let (num, den) = if cpu {
        (v, div.milli().max(1))
    } else {
        (v, div.value().max(1))
    };
    Some(num.div_ceil(den).to_string())
}

/// Why a container cannot be configured yet (kubelet's CreateContainerConfigError).
#[derive(Debug)]
pub struct ConfigError(pub String);

/// The environment of a container, in order, with `$(VAR)` expanded.
pub fn environment(ctx: &PodContext, c: &Container) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut map: HashMap<String, String> = HashMap::new();
    let set = |env: &mut Vec<(String, String)>,
               map: &mut HashMap<String, String>,
               k: String,
               v: String| {
        map.insert(k.clone(), v.clone());
        match env.iter_mut().find(|(x, _)| *x == k) {
            Some(e) => e.1 = v,
            None => env.push((k, v)),
        }
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (data, name, optional, what) = if let Some(s) = &from.secret_ref {
            (
                ctx.store.secret(ctx.namespace, &s.name),
                s.name.clone(),
                s.optional.unwrap_or(false),
                "secret",
            )
        } else if let Some(m) = &from.config_map_ref {
            (
                ctx.store.config_map(ctx.namespace, &m.name),
                m.name.clone(),
                m.optional.unwrap_or(false),
                "configmap",
            )
        } else {
            continue;
        };
        match data {
            Some(d) => {
                for (k, v) in d {
                    set(
                        &mut env,
                        &mut map,
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
            None if optional => {}
            None => return Err(ConfigError(format!("{what} {name:?} not found"))),
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(vf)) => match value_from(ctx, c, e, vf)? {
                Some(v) => v,
                None => continue,
            },
            (Some(v), None) => expand(v, &map),
            (None, None) => String::new(),
        };
        set(&mut env, &mut map, e.name.clone(), value);
    }
    Ok(env)
}

fn value_from(
    ctx: &PodContext,
    c: &Container,
    e: &EnvVar,
    vf: &k8s_openapi::api::core::v1::EnvVarSource,
) -> Result<Option<String>, ConfigError> {
    if let Some(f) = &vf.field_ref {
        return field(ctx, &f.field_path).map(Some).ok_or_else(|| {
            ConfigError(format!(
                "env {}: unsupported field {}",
                e.name, f.field_path
            ))
        });
    }
    if let Some(r) = &vf.resource_field_ref {
        let target = match r.container_name.as_deref() {
            None | Some("") => c,
            Some(n) => all_containers(ctx.spec)
                .find(|x| x.name == n)
                .ok_or_else(|| ConfigError(format!("env {}: no container {n:?}", e.name)))?,
        };
        return resource_field(
            ctx,
            target,
            &r.resource,
            r.divisor.as_ref().map(|d| d.0.as_str()),
        )
        .map(Some)
        .ok_or_else(|| {
            ConfigError(format!(
                "env {}: unsupported resource {}",
                e.name, r.resource
            ))
        });
    }
    let (data, name, key, optional, what) = if let Some(s) = &vf.secret_key_ref {
        (
            ctx.store.secret(ctx.namespace, &s.name),
            s.name.clone(),
            s.key.clone(),
            s.optional.unwrap_or(false),
            "secret",
        )
    } else if let Some(m) = &vf.config_map_key_ref {
        (
            ctx.store.config_map(ctx.namespace, &m.name),
            m.name.clone(),
            m.key.clone(),
            m.optional.unwrap_or(false),
            "configmap",
        )
    } else {
        return Ok(None);
    };
    match data.and_then(|d| d.get(&key).cloned()) {
        Some(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        None if optional => Ok(None),
        None => Err(ConfigError(format!(
            "couldn't find key {key} in {what} {}/{name}",
            ctx.namespace
        ))),
    }
}

/// The mounts of a container: its volumes (with subPath), and the termination message file.
pub fn mounts(
    ctx: &PodContext,
    c: &Container,
    env: &HashMap<String, String>,
    termination_log: Option<&Path>,
) -> Result<Vec<cri::Mount>, ConfigError> {
    let mut out = Vec::new();
    let selinux = Path::new("/sys/fs/selinux/enforce").exists();
    for m in c.volume_mounts.iter().flatten() {
        let base = ctx
            .volumes
            .get(&m.name)
            .ok_or_else(|| ConfigError(format!("volume {:?} is not ready", m.name)))?;
        let sub = match (&m.sub_path, &m.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(x)) if !x.is_empty() => Some(expand(x, env)),
            _ => None,
        };
        let host = match sub {
            Some(s) => {
                if s.starts_with('/') || s.split('/').any(|p| p == "..") {
                    return Err(ConfigError(format!(
                        "subPath {s:?} must stay inside the volume"
                    )));
                }
                let p = base.join(&s);
                // As kubelet does: a missing subPath becomes a directory.
                if !p.exists() {
                    std::fs::create_dir_all(&p)
                        .map_err(|e| ConfigError(format!("subPath {}: {e}", p.display())))?;
                }
                // It must not lead out of the volume through a symlink.
                let real = p
                    .canonicalize()
                    .map_err(|e| ConfigError(format!("subPath {}: {e}", p.display())))?;
                let base_real = base.canonicalize().unwrap_or_else(|_| base.clone());
                if !real.starts_with(&base_real) {
                    return Err(ConfigError(format!(
                        "subPath {s:?} leads out of the volume"
                    )));
                }
                real
            }
            None => base.clone(),
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            _ => cri::MountPropagation::PropagationPrivate,
        };
        let readonly = m.read_only.unwrap_or(false) || volume_read_only(ctx.spec, &m.name);
        out.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly,
            recursive_read_only: readonly && m.recursive_read_only.as_deref() == Some("Enabled"),
            propagation: propagation as i32,
            // As kubelet: volumes it makes itself take the pod's SELinux label on a node running
            // SELinux; a hostPath keeps its own.
            selinux_relabel: selinux && !volume_is_host_path(ctx.spec, &m.name),
            ..Default::default()
        });
    }
    if let Some(h) = ctx.hosts_file
        && !out.iter().any(|m| m.container_path == "/etc/hosts")
    {
        out.push(cri::Mount {
            container_path: "/etc/hosts".into(),
            host_path: h.display().to_string(),
            selinux_relabel: selinux,
            ..Default::default()
        });
    }
    if let Some(t) = termination_log {
        out.push(cri::Mount {
            container_path: c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
            host_path: t.display().to_string(),
            selinux_relabel: selinux,
            ..Default::default()
        });
    }
    Ok(out)
}

/// Secret, ConfigMap, downward API and projected volumes are read-only to containers.
fn volume_is_host_path(spec: &PodSpec, name: &str) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.name == name && v.host_path.is_some())
}

fn volume_read_only(spec: &PodSpec, name: &str) -> bool {
    spec.volumes.iter().flatten().any(|v| {
        v.name == name
            && (v.secret.is_some()
                || v.config_map.is_some()
                || v.downward_api.is_some()
                || v.projected.is_some())
    })
}

/// The container's CRI config for its `attempt`th run.
pub fn container_config(
    ctx: &PodContext,
    c: &Container,
    attempt: u32,
    image: &str,
    termination_log: Option<&Path>,
) -> Result<cri::ContainerConfig, ConfigError> {
    let env = environment(ctx, c)?;
    let env_map: HashMap<String, String> = env.iter().cloned().collect();
    let psc = ctx.spec.security_context.as_ref();
    let sc = c.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let (masked, readonly) = if privileged || unmasked {
        (Vec::new(), Vec::new())
    } else {
        (
            MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
        )
    };
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()))
        .and_then(|p| {
            profile(
                &p.type_,
                p.localhost_profile.as_deref(),
                Some(&ctx.node.seccomp_root),
            )
        });
    let apparmor = sc
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.app_armor_profile.as_ref()))
        .and_then(|p| profile(&p.type_, p.localhost_profile.as_deref(), None));
    let mut groups: Vec<i64> = psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default();
    if let Some(fs) = psc.and_then(|s| s.fs_group)
        && !groups.contains(&fs)
    {
        groups.push(fs);
    }
    let log_path = format!("{}/{attempt}.log", c.name);
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: image.to_string(),
            ..Default::default()
        }),
        command: c
            .command
            .iter()
            .flatten()
            .map(|s| expand(s, &env_map))
            .collect(),
        args: c
            .args
            .iter()
            .flatten()
            .map(|s| expand(s, &env_map))
            .collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts: mounts(ctx, c, &env_map, termination_log)?,
        labels: [
            (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
            (LABEL_POD_NAME.to_string(), ctx.name.to_string()),
            (LABEL_POD_NAMESPACE.to_string(), ctx.namespace.to_string()),
            (LABEL_POD_UID.to_string(), ctx.uid.to_string()),
        ]
        .into(),
        annotations: [(
            "io.kubernetes.container.restartCount".to_string(),
            attempt.to_string(),
        )]
        .into(),
        log_path,
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(container_resources(ctx, c)),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: sc
                    .and_then(|s| s.capabilities.as_ref())
                    .map(|cap| cri::Capability {
                        add_capabilities: cap.add.clone().unwrap_or_default(),
                        drop_capabilities: cap.drop.clone().unwrap_or_default(),
                        add_ambient_capabilities: Vec::new(),
                    }),
                privileged,
                namespace_options: Some(namespace_options(ctx.spec)),
                selinux_options: sc
                    .and_then(|s| s.se_linux_options.as_ref())
                    .or_else(|| psc.and_then(|s| s.se_linux_options.as_ref()))
                    .map(|o| cri::SeLinuxOption {
                        user: o.user.clone().unwrap_or_default(),
                        role: o.role.clone().unwrap_or_default(),
                        r#type: o.type_.clone().unwrap_or_default(),
                        level: o.level.clone().unwrap_or_default(),
                    }),
                run_as_user: sc
                    .and_then(|s| s.run_as_user)
                    .or_else(|| psc.and_then(|s| s.run_as_user))
                    .map(|v| cri::Int64Value { value: v }),
                run_as_group: sc
                    .and_then(|s| s.run_as_group)
                    .or_else(|| psc.and_then(|s| s.run_as_group))
                    .map(|v| cri::Int64Value { value: v }),
                readonly_rootfs: sc
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                supplemental_groups: groups,
                no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
                masked_paths: masked,
                readonly_paths: readonly,
                seccomp,
                apparmor,
                supplemental_groups_policy: match psc
                    .and_then(|s| s.supplemental_groups_policy.as_deref())
                {
                    Some("Strict") => cri::SupplementalGroupsPolicy::Strict as i32,
                    _ => cri::SupplementalGroupsPolicy::Merge as i32,
                },
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let objs = super::super::manifest::load_str(yaml, Path::new("t.yaml")).unwrap();
        match &objs[0].object {
            super::super::manifest::Object::Pod(p) => (**p).clone(),
            _ => panic!("not a pod"),
        }
    }

    fn node() -> Node {
        Node {
            name: "n1".into(),
            memory: 8 << 30,
            swap: 2 << 30,
            swap_behavior: SwapBehavior::LimitedSwap,
            cgroup_v2: true,
            seccomp_root: "/var/lib/kubelet/seccomp".into(),
        }
    }

    const BURSTABLE: &str = "apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: x}}
spec:
  containers:
  - name: a
    image: busybox
    command: [sh, -c, 'echo $(GREETING) $$(NOT) $(MISSING)']
    env:
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: GREETING, value: 'hi $(NAME)'}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}}
    - {name: MEM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    resources:
      requests: {cpu: 250m, memory: 1Gi}
      limits: {cpu: 500m, memory: 2Gi}
";

    #[test]
    fn env_expansion_and_resources() {
        let p = pod(BURSTABLE);
        let spec = p.spec.as_ref().unwrap();
        let n = node();
        let store = Store::default();
        let vols = HashMap::new();
        let ctx = PodContext {
            pod: &p,
            spec,
            namespace: "default",
            name: "p",
            uid: "u1",
            store: &store,
            node: &n,
            log_dir: Path::new("/var/log/pods/x"),
            volumes: &vols,
            hosts_file: None,
            pod_ip: "",
        };
        assert_eq!(qos(spec), "Burstable");
        let cfg = container_config(&ctx, &spec.containers[0], 3, "busybox:1", None).unwrap();
        assert_eq!(cfg.command[2], "echo hi p $(NOT) $(MISSING)");
        let env: HashMap<_, _> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        assert_eq!(env["APP"], "x");
        assert_eq!(env["MEM"], "2048");
        let r = cfg.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(r.cpu_shares, 256);
        assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
        assert_eq!(r.memory_limit_in_bytes, 2 << 30);
        assert_eq!(r.oom_score_adj, 1000 - 1000 / 8);
        // LimitedSwap: the request's share of the node's swap.
        assert_eq!(r.unified["memory.swap.max"], (256u64 << 20).to_string());
        assert_eq!(cfg.log_path, "a/3.log");
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.masked_paths.len(), MASKED_PATHS.len());
        assert!(!sc.no_new_privs);
    }

    #[test]
    fn qos_classes_and_oom() {
        let g = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec:\n  containers:\n  - {name: a, image: b, resources: {limits: {cpu: 1, memory: 1Gi}}}\n",
        );
        assert_eq!(qos(g.spec.as_ref().unwrap()), "Guaranteed");
        let b = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec:\n  containers:\n  - {name: a, image: b}\n",
        );
        assert_eq!(qos(b.spec.as_ref().unwrap()), "BestEffort");
        assert_eq!(oom_score_adj("Guaranteed", 0, 1), -997);
        assert_eq!(oom_score_adj("BestEffort", 0, 1), 1000);
        assert_eq!(oom_score_adj("Burstable", 10 << 30, 8 << 30), 2);
        assert_eq!(oom_score_adj("Burstable", 0, 8 << 30), 999);
        let mut n = node();
        assert_eq!(swap_limit(&n, "Guaranteed", 1 << 30, 1 << 30), 0);
        assert_eq!(swap_limit(&n, "Burstable", 1 << 30, 1 << 30), 0);
        n.swap_behavior = SwapBehavior::NoSwap;
        assert_eq!(swap_limit(&n, "Burstable", 1 << 30, 2 << 30), 0);
    }

    #[test]
    fn dollar_escapes() {
        let env: HashMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(expand("$(A)-$$(A)-$(B)-$", &env), "1-$(A)-$(B)-$");
        assert_eq!(expand("ü$(A)", &env), "ü1");
    }
}
