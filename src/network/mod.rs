//! network: pod networks through the standard CNI plugins, as containerd and CRI-O run them. A
//! pod without host networking is attached (ADD, the plugins of the node's network list in
//! order, each given the previous one's result) in the network namespace its pause process
//! holds, and detached (DEL, in reverse) when it stops and again, harmlessly, when it is
//! removed. What ADD used and gave is the attachment record, written atomically before the
//! first plugin runs (an intent) and again with the result: a DEL after a daemon restart or a
//! changed network list uses the very list and result the ADD did, and an intent without a
//! result (a crash mid-ADD) is undone at start-up. Readiness (`NetworkReady`) follows the
//! configuration directory, read again when it changes, and for CNI 1.1 lists what the plugins
//! answer to STATUS; at start-up GC hands 1.1 plugins the attachments crius holds, so they drop
//! what no record owns (`upkeep`). Loopback stays crius's own (the pause
//! process brings it up); no plugin runs for it. Uses `atomic` and CRI messages.

pub mod conflist;
pub mod plugin;
mod upkeep;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::atomic;
use crate::sandbox::config::{PodConfig, Protocol};
pub use conflist::{ConfError, NetworkList};
use plugin::{Call, Op, PluginError};
pub use upkeep::Live;

/// The pod's interface, as kubelet expects it.
pub const IFNAME: &str = "eth0";
/// `NetworkReady`'s reason when it is false, as kubelet's runtimes give it.
const NOT_READY: &str = "NetworkPluginNotReady";
/// How long one plugin may take.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Conf(#[from] ConfError),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("annotation {key}: {reason}")]
    Annotation { key: String, reason: String },
}

/// What ADD used, and what it gave; the pod's network state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attachment {
    /// The network list, as ADD used it.
    pub list: Value,
    pub container_id: String,
    pub netns: PathBuf,
    pub ifname: String,
    pub args: String,
    pub runtime_config: Map<String, Value>,
    /// The chain's result; none while ADD runs (an intent, undone at start-up if left).
    pub result: Option<Value>,
}

impl Attachment {
    /// The pod's IPs, IPv4 first (kubelet takes the first as the pod IP): from `ips` (CNI
    /// 0.3.0 on) or `ip4` and `ip6` (0.1.0 and 0.2.0 results).
    pub fn ips(&self) -> Vec<String> {
        let Some(result) = self.result.as_ref() else {
            return Vec::new();
        };
        let listed = result
            .get("ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|ip| ip.get("address").and_then(Value::as_str));
        let old = ["ip4", "ip6"]
            .into_iter()
            .filter_map(|k| result.get(k)?.get("ip")?.as_str());
        let mut ips: Vec<String> = listed
            .chain(old)
            .map(|a| a.split('/').next().unwrap_or(a).to_string())
            .collect();
        ips.sort_by_key(|ip| ip.contains(':'));
        ips.dedup();
        ips
    }
}

/// What CHECK found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The pod has no attachment (host network, or none was made).
    NoAttachment,
    /// Every plugin said the network is as ADD left it.
    Passed,
    /// CHECK cannot be asked of this list, and why.
    Skipped(&'static str),
}

/// The pod being attached.
pub struct Pod<'a> {
    pub sandbox_id: &'a str,
    pub config: &'a PodConfig,
    /// The handle of the pod's network namespace.
    pub netns: &'a Path,
    /// kubelet's pod CIDR (UpdateRuntimeConfig), for the `ipRanges` capability.
    pub pod_cidr: &'a str,
}

/// Whether pods can get a network now, as `Status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

pub struct NetworkService {
    conf_dir: PathBuf,
    bin_dirs: Vec<PathBuf>,
    /// The last list read, with the file and time it came from.
    loaded: Mutex<Option<(Instant, Result<NetworkList, ConfError>)>>,
    /// The first ADD of each network list runs alone; the rest run side by side. Plugins make
    /// their shared state at the first ADD, and some do it racily: the firewall plugin of
    /// Debian 12's containernetworking-plugins 1.1 lists its iptables chains, then creates the
    /// missing ones, so of two first ADDs one fails "CHAIN_USER_ADD failed (File exists)".
    /// Bridges, portmap's chains and host-local's files are made safely at any time.
    first_add: tokio::sync::Mutex<()>,
    /// The lists (file and name) that have had an ADD succeed since the daemon started.
    warm: Mutex<HashSet<String>>,
    /// One network operation per pod at a time: a DEL that ran beside its pod's ADD (a
    /// RemovePodSandbox while the RunPodSandbox its client gave up on still attaches) would
    /// free nothing and leave the ADD's address held.
    pods: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The last STATUS answer: when, and of which list (`upkeep`).
    status: tokio::sync::Mutex<Option<(Instant, String, Readiness)>>,
}

/// What a plugin says when another made the same shared thing a moment before (iptables,
/// netlink): an ADD that fails so is undone and run once more, alone.
fn lost_a_race(e: &PluginError) -> bool {
    let text = e.to_string();
    text.contains("File exists") || text.contains("already exists")
}

/// Reading the directory again more often than this is pointless (kubelet asks every 5 s).
const RELOAD_AFTER: Duration = Duration::from_millis(500);

impl NetworkService {
    pub fn new(conf_dir: PathBuf, bin_dirs: Vec<PathBuf>) -> NetworkService {
        NetworkService {
            conf_dir,
            bin_dirs,
            loaded: Mutex::new(None),
            first_add: tokio::sync::Mutex::new(()),
            warm: Mutex::new(HashSet::new()),
            pods: Mutex::new(HashMap::new()),
            status: tokio::sync::Mutex::new(None),
        }
    }

    /// The node's network list: read again when the directory's first file or its time changed.
    pub fn current(&self) -> Result<NetworkList, ConfError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        // A list read just now is used as it is; a missing or broken one is looked for again.
        if let Some((at, Ok(cached))) = loaded.as_ref()
            && at.elapsed() < RELOAD_AFTER
        {
            return Ok(cached.clone());
        }
        let first = conflist::candidates(&self.conf_dir).into_iter().next();
        let stale = match (loaded.as_ref(), &first) {
            (Some((_, Ok(l))), Some(f)) => {
                &l.file != f || std::fs::metadata(f).and_then(|m| m.modified()).ok() != l.modified
            }
            _ => true,
        };
        if stale {
            let fresh = conflist::load(&self.conf_dir);
            if let (Ok(l), Some((_, Ok(old)))) = (&fresh, loaded.as_ref())
                && l.file != old.file
            {
                tracing::info!(file = %l.file.display(), network = l.name, "network configuration changed");
            }
            *loaded = Some((Instant::now(), fresh));
        } else if let Some((at, _)) = loaded.as_mut() {
            *at = Instant::now();
        }
        match loaded.as_ref() {
            Some((_, r)) => r.clone(),
            None => Err(ConfError::None {
                dir: self.conf_dir.clone(),
            }),
        }
    }

    /// Whether the node has a network list, as `NetworkReady` says before any plugin is
    /// asked (`readiness` asks the plugins that take STATUS, too).
    pub fn configured(&self) -> Readiness {
        match self.current() {
            Ok(l) => Readiness {
                ready: true,
                reason: String::new(),
                message: format!("network {:?} from {}", l.name, l.file.display()),
            },
            Err(e) => Readiness {
                ready: false,
                reason: NOT_READY.into(),
                message: format!("Network plugin returns error: cni config uninitialized: {e}"),
            },
        }
    }

    /// The pod's own turn at its network; entries nobody waits on are dropped as others come.
    async fn pod_turn(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            pods.retain(|_, l| Arc::strong_count(l) > 1);
            pods.entry(id.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// ADD: attaches `pod` to the node's network and records it in `record`. A failing plugin
    /// undoes what the ones before it did; nothing is left but the error.
    pub async fn attach(&self, pod: &Pod<'_>, record: &Path) -> Result<Attachment, Error> {
        let _turn = self.pod_turn(pod.sandbox_id).await;
        let list = self.current()?;
        let mut att = Attachment {
            list: list.to_json(),
            container_id: pod.sandbox_id.to_string(),
            netns: pod.netns.to_path_buf(),
            ifname: IFNAME.to_string(),
            args: cni_args(pod),
            runtime_config: runtime_config(pod)?,
            result: None,
        };
        atomic::write_json(record, &att).map_err(|source| Error::Io {
            path: record.to_path_buf(),
            source,
        })?;
        let started = Instant::now();
        let key = format!("{}\0{}", list.file.display(), list.name);
        let warm = || {
            self.warm
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&key)
        };
        let mut held = None;
        if !warm() {
            let first = self.first_add.lock().await;
            // Those that queued behind the first go side by side once it is through.
            if !warm() {
                held = Some(first);
            }
        }
        let outcome = match self.add(&list, &mut att).await {
            Err((e, true)) if held.is_none() && lost_a_race(&e) => {
                tracing::info!(sandbox = pod.sandbox_id, error = %e, "network ADD raced another; again, alone");
                held = Some(self.first_add.lock().await);
                self.add(&list, &mut att).await
            }
            other => other,
        };
        drop(held);
        match outcome {
            Ok(()) => {}
            // Undone: nothing is left but the error.
            Err((e, true)) => {
                let _ = atomic::remove(record);
                return Err(e.into());
            }
            // Not all undone: the record stays, so the next stop or remove runs DEL again.
            Err((e, false)) => return Err(e.into()),
        }
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
        atomic::write_json(record, &att).map_err(|source| Error::Io {
            path: record.to_path_buf(),
            source,
        })?;
        crate::metrics::global().network("add", started.elapsed().as_secs_f64());
        Ok(att)
    }

    /// The plugins' ADDs in order; a failing plugin undoes what the ones before it did (and
    /// itself, unless it never ran), and says whether that undo went through. The result goes
    /// into `att`.
    async fn add(
        &self,
        list: &NetworkList,
        att: &mut Attachment,
    ) -> Result<(), (PluginError, bool)> {
        let mut prev: Option<Value> = None;
        for (i, p) in list.plugins.iter().enumerate() {
            let conf = plugin::stdin_config(
                p,
                &list.name,
                &list.cni_version,
                prev.as_ref(),
                &att.runtime_config,
            );
            match plugin::run(&self.call(att, Op::Add), &conf).await {
                Ok(r) => prev = r.or(prev),
                Err(e) => {
                    let ran = match e {
                        PluginError::NotFound { .. } | PluginError::Spawn { .. } => i,
                        _ => i + 1,
                    };
                    att.result = prev;
                    let undone = match self.delete(att, ran).await {
                        Ok(()) => true,
                        Err(undo) => {
                            tracing::warn!(sandbox = att.container_id, error = %undo, "undoing a failed network ADD");
                            false
                        }
                    };
                    att.result = None;
                    return Err((e, undone));
                }
            }
        }
        att.result = prev;
        Ok(())
    }

    /// DEL: detaches the pod recorded in `record` (if any) with the list and result its ADD
    /// used. On failure the record stays, so the next stop or remove tries again.
    pub async fn detach(&self, sandbox_id: &str, record: &Path) -> Result<(), Error> {
        // Read in the pod's turn, so a DEL after its ADD sees what the ADD recorded.
        let _turn = self.pod_turn(sandbox_id).await;
        let Some(att) = read(record)? else {
            return Ok(());
        };
        let started = Instant::now();
        let all = att
            .list
            .get("plugins")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        self.delete(&att, all).await?;
        atomic::remove(record).map_err(|source| Error::Io {
            path: record.to_path_buf(),
            source,
        })?;
        crate::metrics::global().network("del", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// CHECK: asks the plugins whether the pod's network is still as ADD left it.
    pub async fn check(&self, record: &Path) -> Result<Checked, Error> {
        let Some(att) = read(record)? else {
            return Ok(Checked::NoAttachment);
        };
        if att.result.is_none() {
            return Ok(Checked::Skipped("the network is still being attached"));
        }
        let Some(list) = NetworkList::from_json(&att.list) else {
            return Ok(Checked::Skipped("the stored network list is unreadable"));
        };
        if !list.checks() {
            return Ok(Checked::Skipped(if list.disable_check {
                "the network list sets disableCheck"
            } else {
                "CHECK is not in CNI versions before 0.4.0"
            }));
        }
        for p in &list.plugins {
            let conf = plugin::stdin_config(
                p,
                &list.name,
                &list.cni_version,
                att.result.as_ref(),
                &att.runtime_config,
            );
            plugin::run(&self.call(&att, Op::Check), &conf).await?;
        }
        Ok(Checked::Passed)
    }

    /// DEL of the first `count` plugins, last first; all are tried, the first error is
    /// returned.
    async fn delete(&self, att: &Attachment, count: usize) -> Result<(), Error> {
        let Some(list) = NetworkList::from_json(&att.list) else {
            return Ok(());
        };
        let mut first = None;
        let prev = att.result.as_ref().filter(|_| list.del_takes_result());
        let mut call = self.call(att, Op::Del);
        // A namespace already taken down (by a removal that ran alongside, or one a crash cut
        // short) is passed as none, as the spec allows for DEL: the plugins then release what
        // they hold outside it (addresses, rules) instead of failing on the file left behind.
        if !holds_namespace(&att.netns) {
            call.netns = Path::new("");
        }
        for p in list.plugins.iter().take(count).rev() {
            let conf =
                plugin::stdin_config(p, &list.name, &list.cni_version, prev, &att.runtime_config);
            if let Err(e) = plugin::run(&call, &conf).await {
                tracing::warn!(sandbox = att.container_id, error = %e, "network DEL");
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    fn call<'a>(&'a self, att: &'a Attachment, op: Op) -> Call<'a> {
        Call {
            op,
            container_id: &att.container_id,
            netns: &att.netns,
            ifname: &att.ifname,
            args: &att.args,
            bin_dirs: &self.bin_dirs,
            timeout: PLUGIN_TIMEOUT,
        }
    }
}

/// Whether `path` is a namespace handle (a mounted nsfs file), not what is left of one.
fn holds_namespace(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// The attachment recorded in `record`, if any.
pub fn read(record: &Path) -> Result<Option<Attachment>, Error> {
    atomic::read_json::<Attachment>(record).map_err(|source| Error::Io {
        path: record.to_path_buf(),
        source,
    })
}

/// `CNI_ARGS` as kubelet's runtimes pass them.
fn cni_args(pod: &Pod<'_>) -> String {
    let meta = pod.config.metadata.clone().unwrap_or_default();
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        meta.namespace, meta.name, pod.sandbox_id, meta.uid
    )
}

/// The values of the capabilities a plugin may declare: `portMappings` (hostPort), `bandwidth`
/// (the kubernetes.io bandwidth annotations), `dns`, `ipRanges` (kubelet's pod CIDR) and
/// `cgroupPath`.
fn runtime_config(pod: &Pod<'_>) -> Result<Map<String, Value>, Error> {
    let c = pod.config;
    let mut rc = Map::new();
    let ports: Vec<Value> = c
        .port_mappings
        .iter()
        .filter(|p| p.host_port > 0)
        .map(|p| {
            let proto = match p.protocol {
                Protocol::Udp => "udp",
                Protocol::Sctp => "sctp",
                Protocol::Tcp => "tcp",
            };
            serde_json::json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": proto,
                "hostIP": p.host_ip,
            })
        })
        .collect();
    if !ports.is_empty() {
        rc.insert("portMappings".into(), Value::Array(ports));
    }
    let bandwidth = bandwidth(&c.annotations)?;
    if !bandwidth.is_empty() {
        rc.insert("bandwidth".into(), Value::Object(bandwidth));
    }
    if let Some(dns) = &c.dns_config {
        rc.insert(
            "dns".into(),
            serde_json::json!({
                "servers": dns.servers, "searches": dns.searches, "options": dns.options,
            }),
        );
    }
    if !pod.pod_cidr.is_empty() {
        let ranges: Vec<Value> = pod
            .pod_cidr
            .split(',')
            .map(|cidr| serde_json::json!([{ "subnet": cidr.trim() }]))
            .collect();
        rc.insert("ipRanges".into(), Value::Array(ranges));
    }
    if let Some(parent) = c.linux.as_ref().map(|l| &l.cgroup_parent)
        && !parent.is_empty()
    {
        rc.insert("cgroupPath".into(), Value::String(parent.clone()));
    }
    Ok(rc)
}

/// `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` (bits per second, as Kubernetes
/// quantities) for the bandwidth plugin; bursts as containerd sets them.
fn bandwidth(annotations: &HashMap<String, String>) -> Result<Map<String, Value>, Error> {
    let mut out = Map::new();
    for (key, rate, burst) in [
        (
            "kubernetes.io/ingress-bandwidth",
            "ingressRate",
            "ingressBurst",
        ),
        (
            "kubernetes.io/egress-bandwidth",
            "egressRate",
            "egressBurst",
        ),
    ] {
        let Some(v) = annotations.get(key) else {
            continue;
        };
        let bits = quantity(v).ok_or_else(|| Error::Annotation {
            key: key.to_string(),
            reason: format!("{v:?} is not a quantity like 10M"),
        })?;
        // kubelet's limits: 1 kbit/s to 32 Gbit/s.
        if !(1_000..=32_000_000_000).contains(&bits) {
            return Err(Error::Annotation {
                key: key.to_string(),
                reason: format!("{v:?} is outside 1k..32G"),
            });
        }
        out.insert(rate.into(), Value::from(bits));
        // No burst of its own in Kubernetes: as large as the plugin takes (containerd).
        out.insert(burst.into(), Value::from(i32::MAX));
    }
    Ok(out)
}

/// A Kubernetes quantity as an integer: `10M`, `1Gi`, `500k`, `100`.
fn quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::config::{Dns, PodMetadata, PortMapping};

    #[test]
    fn runtime_config_from_the_sandbox() {
        let config = PodConfig {
            metadata: Some(PodMetadata {
                name: "web".into(),
                namespace: "ns".into(),
                uid: "u1".into(),
                attempt: 0,
            }),
            port_mappings: vec![
                PortMapping {
                    protocol: Protocol::Tcp,
                    container_port: 80,
                    host_port: 8080,
                    host_ip: "127.0.0.1".into(),
                },
                PortMapping {
                    protocol: Protocol::Udp,
                    container_port: 53,
                    host_port: 0,
                    host_ip: String::new(),
                },
            ],
            annotations: [(
                "kubernetes.io/ingress-bandwidth".to_string(),
                "10M".to_string(),
            )]
            .into(),
            dns_config: Some(Dns {
                servers: vec!["10.0.0.10".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = Pod {
            sandbox_id: "abc",
            config: &config,
            netns: Path::new("/run/netns/x"),
            pod_cidr: "10.244.1.0/24",
        };
        let rc = runtime_config(&pod).unwrap();
        assert_eq!(rc["portMappings"].as_array().unwrap().len(), 1);
        assert_eq!(rc["portMappings"][0]["hostIP"], "127.0.0.1");
        assert_eq!(rc["bandwidth"]["ingressRate"], 10_000_000);
        assert!(rc["bandwidth"].get("egressRate").is_none());
        assert_eq!(rc["dns"]["servers"][0], "10.0.0.10");
        assert_eq!(rc["ipRanges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(
            cni_args(&pod),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1"
        );
        let mut bad = config.clone();
        bad.annotations
            .insert("kubernetes.io/egress-bandwidth".into(), "fast".into());
        let e = runtime_config(&Pod {
            config: &bad,
            ..pod
        })
        .unwrap_err();
        assert!(e.to_string().contains("egress-bandwidth"), "{e}");
    }

    #[test]
    fn ips_ipv4_first() {
        let att = Attachment {
            list: Value::Null,
            container_id: String::new(),
            netns: PathBuf::new(),
            ifname: IFNAME.into(),
            args: String::new(),
            runtime_config: Map::new(),
            result: Some(serde_json::json!({"ips": [
                {"address": "fd00::5/64"}, {"address": "10.88.0.5/16", "gateway": "10.88.0.1"}
            ]})),
        };
        assert_eq!(att.ips(), vec!["10.88.0.5", "fd00::5"]);
        let old = Attachment {
            result: Some(serde_json::json!({"cniVersion": "0.2.0",
                "ip6": {"ip": "fd00::7/64"}, "ip4": {"ip": "10.1.0.7/16", "gateway": "10.1.0.1"}})),
            ..att
        };
        assert_eq!(old.ips(), vec!["10.1.0.7", "fd00::7"]);
        assert_eq!(quantity("1Gi"), Some(1 << 30));
        assert_eq!(quantity("1.5M"), Some(1_500_000));
        assert_eq!(quantity("x"), None);
    }
}
