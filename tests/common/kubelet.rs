//! An upstream kubelet (built from `k8s.io/kubernetes` by `hack/install-upstream.sh`,
//! standalone: static pods, no API server) over a crius daemon's CRI socket, and what its servers
//! show: for the kubelet tier and the pod-start measurement.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crius::cri::v1 as cri;

use super::PodEnv;

pub const NODE: &str = "node1";

/// The kubelet of `role` (`kubernetes`, the newest release, or `kubernetes-oldest`, the oldest
/// supported minor); `CRIUS_KUBELET_ROLE` picks when `role` is empty (the newest by default).
pub fn kubelet(role: &str) -> Option<PathBuf> {
    let role = match role {
        "" => std::env::var("CRIUS_KUBELET_ROLE").unwrap_or_else(|_| "kubernetes".into()),
        r => r.to_string(),
    };
    super::upstream::need(&role, "kubelet")
}

/// Whether the host's cgroups are v2 alone (the VM tier's), not the v1 hierarchies.
pub fn cgroup_v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Whether this runs in the VM tier (`hack/vm-run` mounts its control directory there).
pub fn in_vm() -> bool {
    Path::new("/run/vm/cmd.sh").exists()
}

/// The network list crius ships (`dist/cni`): bridge `crius0`, 10.89.0.0/16 by host-local in
/// its default data directory, masquerade, portmap, firewall.
pub struct ShippedNet;

impl ShippedNet {
    pub const LIST: &str = include_str!("../../dist/cni/10-crius-bridge.conflist");
    pub const TABLES: &str = "[network]\nconf_dir = \"{NET_D}\"\n";
    pub const PREFIX: &str = "10.89.";
    pub const BRIDGE: &str = "crius0";

    pub fn veths() -> usize {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "master", Self::BRIDGE])
            .output()
            .expect("ip link show");
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// The addresses host-local still holds for pods.
    pub fn allocations() -> Vec<String> {
        std::fs::read_dir("/var/lib/cni/networks/crius")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(Self::PREFIX))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The sysctls any kubelet sets at start, put back when the test ends.
pub struct Sysctls(Vec<(&'static str, String)>);

impl Sysctls {
    pub fn save() -> Sysctls {
        let keys = [
            "/proc/sys/vm/overcommit_memory",
            "/proc/sys/kernel/panic",
            "/proc/sys/kernel/panic_on_oops",
        ];
        Sysctls(
            keys.iter()
                .filter_map(|k| std::fs::read_to_string(k).ok().map(|v| (*k, v)))
                .collect(),
        )
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            let _ = std::fs::write(k, v);
        }
    }
}

pub struct Kubelet {
    child: Child,
    pub log: PathBuf,
    pub manifests: PathBuf,
    pub root: PathBuf,
    /// kubelet's own cgroup (see `start`), removed after it.
    cgroup: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kubelet {
    /// Starts kubelet; `gates` are its `--feature-gates` (none when empty).
    pub fn start(bin: &Path, socket: &Path, driver: &str, gates: &str) -> Kubelet {
        let dir = tempfile::Builder::new()
            .prefix("crius-kubelet")
            .tempdir()
            .expect("kubelet temp dir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        let log = dir.path().join("kubelet.log");
        let endpoint = format!("unix://{}", socket.display());
        let root = dir.path().join("root");
        // Settings without a flag: swap for Burstable pods in proportion to their memory
        // requests (LimitedSwap). No API server: anonymous requests, always allowed (1.37
        // refuses to start with its default webhook authentication and no client).
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failSwapOn: false\nmemorySwap:\n  swapBehavior: LimitedSwap\n\
             featureGates:\n  NodeSwap: true\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
             authorization:\n  mode: AlwaysAllow\n{}",
                // Since 1.35 kubelet refuses a cgroup v1 host unless told otherwise.
                if cgroup_v2() {
                    ""
                } else {
                    "failCgroupV1: false\n"
                }
            ),
        )
        .expect("kubelet config");
        // kubelet offers swap only when its own cgroup has a swap controller, which the root
        // cgroup (where a shell as PID 1 runs everything) has not: it starts in one of its own.
        let cgroup =
            Path::new("/sys/fs/cgroup").join(format!("crius-test-kubelet-{}", std::process::id()));
        let in_cgroup =
            std::fs::create_dir_all(&cgroup).is_ok() && cgroup.join("memory.swap.max").exists();
        eprintln!(
            "kubelet's cgroup: {} ({})",
            cgroup.display(),
            if in_cgroup {
                "with a swap controller"
            } else {
                "none: it stays where it is"
            }
        );
        let mut cmd = if in_cgroup {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(cgroup.join("cgroup.procs"))
                .arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let child = cmd
            .arg("--config")
            .arg(&config)
            .arg("--root-dir")
            .arg(&root)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .args(["--hostname-override", NODE, "--node-ip", "127.0.0.1"])
            .args(["--container-runtime-endpoint", &endpoint])
            .args(["--image-service-endpoint", &endpoint])
            .args(["--file-check-frequency", "2s", "--sync-frequency", "5s"])
            .args(["--fail-swap-on=false", "--cgroup-driver", driver])
            .args(["--cgroups-per-qos=true", "--enforce-node-allocatable=pods"])
            .args([
                "--enable-server=true",
                "--read-only-port",
                "10255",
                "--port",
                "10250",
            ])
            .args([
                "--address",
                "127.0.0.1",
                "--healthz-bind-address",
                "127.0.0.1",
            ])
            .args(["--local-storage-capacity-isolation=false"])
            .args(["--make-iptables-util-chains=false"])
            .args(["--eviction-hard", "", "--image-gc-high-threshold", "100"])
            .args((!gates.is_empty()).then(|| format!("--feature-gates={gates}")))
            // More of kubelet's log when looking into it.
            .args(
                std::env::var("CRIUS_KUBELET_V")
                    .ok()
                    .map(|v| format!("--v={v}")),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("kubelet log"))
            .stderr(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("kubelet log"),
            )
            .spawn()
            .expect("starting kubelet");
        Kubelet {
            child,
            log,
            manifests,
            root,
            cgroup,
            _dir: dir,
        }
    }

    /// Fails the test, with kubelet's log, if kubelet has ended (it refused its configuration,
    /// say): waiting for its pods would only time out.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("kubelet ended ({status}):\n{}", self.log_tail());
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    pub fn manifest(&self, name: &str, yaml: &str) {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml).expect("writing a manifest");
        std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml")))
            .expect("placing a manifest");
    }

    pub fn remove_manifest(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(format!("{name}.yaml")))
            .expect("removing a manifest");
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Whatever kubelet mounted below its root (pod volumes).
        super::unmount_under(&[&self.root]);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// A request to kubelet's `port` (`method`, no body): the whole answer, status line first, or
/// nothing when kubelet does not answer. Its authenticated port, 10250, is https with a
/// certificate of its own, which is not verified; the read-only port is plain http.
fn request(method: &str, port: u16, path: &str, seconds: u32) -> String {
    let scheme = if port == 10250 { "https" } else { "http" };
    let out = Command::new("curl")
        .args(["-s", "-k", "-i", "--http1.1", "-X", method])
        .args(["-m", &seconds.to_string()])
        .arg(format!("{scheme}://127.0.0.1:{port}{path}"))
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A GET of kubelet's: the whole answer, status line first.
pub fn get_raw(port: u16, path: &str) -> String {
    request("GET", port, path, 30)
}

/// A POST of kubelet's with no body: the whole answer, status line first.
pub fn post_raw(port: u16, path: &str) -> String {
    request("POST", port, path, 150)
}

pub fn body_if_ok(all: String) -> Option<String> {
    let (head, body) = all.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
}

/// GET from kubelet's read-only port: the body.
pub fn get(path: &str) -> Option<String> {
    body_if_ok(get_raw(10255, path))
}

/// A GET on the authenticated port (plain HTTP, anonymous and always allowed here).
pub fn get_api(path: &str) -> Option<String> {
    body_if_ok(get_raw(10250, path))
}

/// The pod kubelet reports under `name` (the static pod's name, `-node1` appended).
pub fn pod(name: &str) -> Option<serde_json::Value> {
    let list: serde_json::Value = serde_json::from_str(&get("/pods")?).ok()?;
    let full = format!("{name}-{NODE}");
    list["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == full.as_str())
        .cloned()
}

pub fn ready(p: &serde_json::Value) -> bool {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

pub fn container_status<'a>(p: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    p["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// Waits for `what` to hold of kubelet's view, up to `secs`.
pub fn wait_pod(
    k: &Kubelet,
    name: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(p) = pod(name)
            && ok(&p)
        {
            return p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "pod {name} never {what} in {secs} s; kubelet sees {}\n---- kubelet log ----\n{}",
            pod(name)
                .map(|p| serde_json::to_string_pretty(&p["status"]).unwrap_or_default())
                .unwrap_or_else(|| "nothing".into()),
            k.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sandboxes crius holds for a pod of kubelet's (by the pod's name).
pub async fn sandboxes(env: &PodEnv, name: &str) -> Vec<cri::PodSandbox> {
    let full = format!("{name}-{NODE}");
    env.d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == full))
        .collect()
}
