//! Node conformance: the upstream node e2e suite (`test/e2e_node` of `k8s.io/kubernetes`, the
//! `node-e2e` part of `hack/upstream.versions`: its test binary, the kubelet beside it, agnhost
//! and the ginkgo CLI), unmodified, against a crius daemon. The suite starts its own etcd and
//! API server in its process, then that kubelet on the daemon's socket, and runs real pods
//! through the API. Its images are built here and served by a registry on loopback, which
//! `KUBE_TEST_REPO_LIST` names; pods get a bridge of the test's own with no route out.
//!
//! `cargo xtask node-e2e` runs it: `NODE_E2E_FOCUS` and `NODE_E2E_SKIP` (regular expressions,
//! by default SIG Node's release-blocking set: `[NodeConformance]` without Flaky, Slow,
//! Serial and OffByDefault), `NODE_E2E_PROCS` (parallel ginkgo processes, 4) and
//! `NODE_E2E_TIMEOUT` (3h), `NODE_E2E_STATUS_FREQUENCY` (kubelet's `nodeStatusUpdateFrequency`,
//! its default unless set; the VM's runs set it), `NODE_E2E_KUBELET_GATES` (kubelet feature
//! gates, `Name=true,Other=false`). It prints every spec, and writes the JSON and JUnit reports, the
//! suite's logs and a summary to `target/node-e2e/crius/`. kubelet changes the machine it runs
//! on (sysctls, cgroups, `/var/lib/kubelet`): what it changed is put back or removed after the
//! suite.
//!
//! It is not part of `cargo xtask integration` (about an hour on two cores).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;
// critest's images: their base and programs (the rest is critest's own).
#[allow(dead_code)]
#[path = "conformance/images.rs"]
mod images;
#[path = "node_e2e/images.rs"]
mod node_images;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::kubelet::{Sysctls, cgroup_v2};
use common::net::*;
use common::*;
use crius::cri::v1 as cri;

/// SIG Node's release-blocking selection (the containerd and CRI-O jobs'), without the alpha
/// specs marked `[Feature:OffByDefault]`: they test a kubelet feature gate those jobs leave off
/// (EmptyDirVolumeMode's modes are kubelet's own, whatever the runtime).
const FOCUS: &str = r"\[NodeConformance\]";
const SKIP: &str = r"\[Flaky\]|\[Slow\]|\[Serial\]|\[Feature:OffByDefault\]";

/// What kubelet and the suite make outside the test's directories, removed after it when they
/// were not there before.
const KUBELET_DIRS: [&str; 4] = [
    "/var/lib/kubelet",
    "/var/run/kubernetes",
    "/var/log/pods",
    "/var/log/containers",
];

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The base kubelet configuration the suite starts from (its flags and its own settings go
/// over it): the settings of SIG Node's jobs, swap allowed (the suite's swap specs check
/// what kubelet does with it), and a cgroup v1 host allowed where that is what there is.
fn kubelet_config() -> String {
    let mut c = String::from(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         cgroupRoot: /\n\
         cgroupsPerQOS: true\n\
         volumeStatsAggPeriod: 10s\n\
         fileCheckFrequency: 10s\n\
         serializeImagePulls: false\n\
         evictionHard:\n  memory.available: 250Mi\n  nodefs.available: 10%\n  nodefs.inodesFree: 5%\n\
         evictionMinimumReclaim:\n  nodefs.available: 5%\n  nodefs.inodesFree: 5%\n\
         evictionPressureTransitionPeriod: 30s\n\
         failSwapOn: false\n\
         makeIPTablesUtilChains: false\n",
    );
    if !cgroup_v2() {
        c.push_str("failCgroupV1: false\n");
    }
    // Under TCG kubelet takes 20 s to register, at its 10 s status period, and its CSINode
    // set-up has given up its early tries by then (its next comes after the suite's 2 min wait
    // for a Ready node): the VM's runs report status more often.
    if let Ok(period) = std::env::var("NODE_E2E_STATUS_FREQUENCY") {
        c.push_str(&format!("nodeStatusUpdateFrequency: {period}\n"));
    }
    // Kubelet feature gates to run with (`Name=true,Other=false`): kubelet takes pods' stats
    // from cAdvisor unless `PodAndContainerStatsFromCRI` is on, and cAdvisor finds pods' network
    // and processes only through its containerd and CRI-O plugins.
    let gates = std::env::var("NODE_E2E_KUBELET_GATES").unwrap_or_default();
    let gates: Vec<&str> = gates.split(',').filter(|g| !g.is_empty()).collect();
    if !gates.is_empty() {
        c.push_str("featureGates:\n");
        for g in gates {
            let (name, on) = g.split_once('=').unwrap_or((g, "true"));
            c.push_str(&format!("  {}: {}\n", name.trim(), on.trim()));
        }
    }
    c
}

/// The PATH the suite runs with. It calls `sudo` (for `systemctl`, say), which a root machine
/// need not have: a stand-in that runs the command comes first. It starts kubelet through
/// `systemd-run` whenever that is on PATH; where systemd is not PID 1 (this host), the PATH
/// holds every program of the usual directories but systemd's.
fn suite_path(dir: &Path) -> Option<String> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let pid1 = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    let usual = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    let has_sudo = usual.iter().any(|d| Path::new(d).join("sudo").exists());
    if !has_sudo {
        let sudo = bin.join("sudo");
        std::fs::write(&sudo, "#!/bin/sh\nexec \"$@\"\n").unwrap();
        std::fs::set_permissions(&sudo, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    if pid1.trim() == "systemd" {
        if has_sudo {
            return None;
        }
        let path = std::env::var("PATH").unwrap_or_else(|_| usual.join(":"));
        return Some(format!("{}:{path}", bin.display()));
    }
    for d in usual {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name();
            let n = name.to_string_lossy();
            if n.starts_with("systemd") || n == "systemctl" || bin.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), bin.join(&name));
        }
    }
    Some(bin.display().to_string())
}

/// The root of each cgroup hierarchy (v1's), or the unified one (v2).
fn cgroup_roots() -> Vec<PathBuf> {
    if cgroup_v2() {
        vec![PathBuf::from("/sys/fs/cgroup")]
    } else {
        std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("cgroup.procs").exists())
            .collect()
    }
}

/// The cgroup directories at the top of each hierarchy.
fn top_cgroups() -> BTreeSet<PathBuf> {
    cgroup_roots()
        .iter()
        .flat_map(|r| std::fs::read_dir(r).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// Removes a cgroup and the ones below it, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().join("cgroup.procs").exists() {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A dummy link with a documentation address (192.0.2.1/24, RFC 5737) and a default route
/// through it, made where the machine has no default route and removed when dropped: nothing
/// sent that way leaves the machine.
struct NodeAddress(Option<&'static str>);

impl NodeAddress {
    const LINK: &'static str = "crius-e2e0";

    fn make_if_missing() -> NodeAddress {
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let has_default = routes
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some("00000000"));
        if has_default {
            return NodeAddress(None);
        }
        for args in [
            vec!["link", "add", Self::LINK, "type", "dummy"],
            vec!["addr", "add", "192.0.2.1/24", "dev", Self::LINK],
            vec!["link", "set", Self::LINK, "up"],
            vec![
                "route",
                "add",
                "default",
                "via",
                "192.0.2.2",
                "dev",
                Self::LINK,
            ],
        ] {
            let ok = Command::new("ip").args(&args).status().unwrap().success();
            assert!(ok, "ip {}", args.join(" "));
        }
        println!(
            "node e2e: no default route; {} with 192.0.2.1/24 stands in",
            Self::LINK
        );
        NodeAddress(Some(Self::LINK))
    }
}

impl Drop for NodeAddress {
    fn drop(&mut self) {
        if let Some(link) = self.0 {
            let _ = Command::new("ip").args(["link", "del", link]).status();
        }
    }
}

/// Removes the pods the suite's kubelet left in the daemon (it is stopped without draining).
async fn remove_pods(d: &Daemon) {
    let mut rt = d.runtime();
    let pods = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .map(|r| r.into_inner().items)
        .unwrap_or_default();
    for p in pods {
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: p.id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: p.id,
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn node_e2e_suite() {
    require_root();
    let Some(suite) = upstream::need("node-e2e", "e2e_node.test") else {
        return;
    };
    if !plugins_present() {
        return;
    }
    let part = suite.parent().unwrap().to_path_buf();
    let ginkgo = part.join("ginkgo");
    let kubelet_dirs_before: Vec<&str> = KUBELET_DIRS
        .iter()
        .copied()
        .filter(|d| Path::new(d).exists())
        .collect();
    assert!(
        !Path::new("/var/lib/kubelet").exists(),
        "/var/lib/kubelet exists: the suite's kubelet would take over another kubelet's node"
    );
    let cgroups_before = top_cgroups();
    let _sysctls = Sysctls::save();

    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/node-e2e/crius");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let work = tempfile::Builder::new()
        .prefix("crius-node-e2e")
        .tempdir()
        .unwrap();

    // The images, on a registry of the test's own (never on :5000, where the image pull
    // specs start agnhost's fake registry).
    let reg = Registry::start(None);
    assert_ne!(reg.port, 5000);
    let started = Instant::now();
    let set = node_images::build(work.path(), &part);
    images::publish(&reg, &set).await;
    println!(
        "node e2e images: {} images under {} names, built and pushed in {:.1} s",
        set.len(),
        set.iter().map(|p| p.names.len()).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    let repo_list = work.path().join("repo-list.yaml");
    std::fs::write(&repo_list, node_images::repo_list(&reg)).unwrap();

    // The API server takes its address from the default route's interface; the VM has no
    // network device, so it gets a dummy one with a route that leads nowhere.
    let _route = NodeAddress::make_if_missing();
    // The runtime: pods on a bridge of the test's own, hostPort through portmap, and the
    // RuntimeClass handler the suite's specs name.
    let net = TestNet::new();
    // crius enforces limits with cgroup v2 only: on a v1 node, an operator who runs pods
    // anyway says so (kubelet sets resources on every container), and the specs that check
    // limits show what v1 does not hold.
    let unenforced = if cgroup_v2() {
        ""
    } else {
        "[cgroup]\nallow_unenforced = true\n"
    };
    let d = Daemon::start(&format!(
        "{}\n[runtime.handlers.test-handler]\n{unenforced}",
        net.tables()
    ));
    // The runtime's own cgroup, which the summary API reports as the `runtime` system
    // container (kubelet's `--runtime-cgroups`).
    let runtime_cgroup = "crius-node-e2e";
    for root in cgroup_roots() {
        let cg = root.join(runtime_cgroup);
        std::fs::create_dir_all(&cg).unwrap();
        // A new v1 cpuset has no CPUs or memory nodes to run on until given its parent's.
        for knob in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(root.join(knob)) {
                std::fs::write(cg.join(knob), v.trim()).unwrap();
            }
        }
        std::fs::write(cg.join("cgroup.procs"), d.pid().unwrap().to_string()).unwrap();
    }
    std::fs::write(
        d.net_dir().join("10-node-e2e.conflist"),
        net.conflist(TestNet::portmap()),
    )
    .unwrap();

    let base_config = work.path().join("kubelet-base.yaml");
    std::fs::write(&base_config, kubelet_config()).unwrap();
    let endpoint = format!("unix://{}", d.socket.display());
    let focus = env_or("NODE_E2E_FOCUS", FOCUS);
    let skip = env_or("NODE_E2E_SKIP", SKIP);
    let procs = env_or("NODE_E2E_PROCS", "4");
    let timeout = env_or("NODE_E2E_TIMEOUT", "3h");
    println!("node e2e: focus {focus:?}, skip {skip:?}, {procs} processes, timeout {timeout}");
    let log_path = out.join("suite.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(&ginkgo);
    cmd.arg("run")
        .arg(format!("--procs={procs}"))
        .arg(format!("--timeout={timeout}"))
        .arg(format!("--focus={focus}"))
        .arg(format!("--skip={skip}"))
        .args(["--no-color", "--json-report=report.json"])
        .args(["--junit-report=junit.xml"])
        .arg(format!("--output-dir={}", out.display()))
        .arg(&suite)
        .arg("--")
        .arg(format!("--container-runtime-endpoint={endpoint}"))
        .arg(format!("--image-service-endpoint={endpoint}"))
        .arg(format!("--report-dir={}", out.display()))
        .arg("--prepull-images=false")
        .arg(format!("--kubelet-config-file={}", base_config.display()))
        .arg(format!("--kube-test-repo-list={}", repo_list.display()))
        .arg(format!(
            "--container-runtime-process-name={}",
            std::env::var("CRIUS_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_crius").into())
        ))
        .arg("--container-runtime-pid-file=")
        // Not `--system-cgroups`, which the suite sets where systemd is not PID 1: kubelet
        // would move every process of the root cgroup (the machine's own) into it.
        .arg(format!(
            "--kubelet-flags=--runtime-cgroups=/{runtime_cgroup} --system-cgroups="
        ))
        // The suite's working directory holds the kubeconfig and kubelet configuration it
        // writes, and the static pods.
        .current_dir(work.path())
        .env("KUBE_TEST_REPO_LIST", &repo_list)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    if let Some(path) = suite_path(work.path()) {
        cmd.env("PATH", path);
    }
    let started = Instant::now();
    let status = cmd.status().expect("running the node e2e suite");
    let elapsed = started.elapsed();

    remove_pods(&d).await;
    // The daemon's log goes with the reports (its directory goes with it).
    let _ = std::fs::copy(d.dir.path().join("daemon.log"), out.join("crius.log"));
    drop(d);
    // Pod volumes, and kubelet's bind of its root onto itself.
    unmount_under(&[Path::new("/var/lib/kubelet")]);
    for dir in KUBELET_DIRS {
        if !kubelet_dirs_before.contains(&dir) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    // kubelet's (its own, the pods') and the runtime's; none of the other tests' beside it.
    for cg in top_cgroups().difference(&cgroups_before) {
        let name = cg.file_name().unwrap().to_string_lossy();
        if name.starts_with("kubepods") || ["kubelet", runtime_cgroup].contains(&name.as_ref()) {
            remove_cgroup_tree(cg);
        }
    }
    drop(net);

    let report = out.join("report.json");
    assert!(
        report.exists(),
        "the suite wrote no report ({status}); its output is in {}:\n{}",
        log_path.display(),
        tail(&log_path, 60)
    );
    let specs = common::ginkgo::parse_report(&report);
    let mut summary = String::new();
    let mut counts = [0usize; 3]; // passed, failed, skipped
    let mut failed = Vec::new();
    for s in &specs {
        let (label, i) = match s.state.as_str() {
            "passed" => ("passed", 0),
            "skipped" | "pending" => ("skipped", 2),
            _ => ("FAILED", 1),
        };
        counts[i] += 1;
        // Specs the focus left out are not named, only counted.
        if label == "skipped" && s.message.is_empty() {
            continue;
        }
        let note = if i == 0 {
            String::new()
        } else {
            format!("  -- {} {}", s.first_line(), s.location)
        };
        if i == 1 {
            failed.push(s.name.clone());
        }
        summary.push_str(&format!(
            "{label:<8} {:>6.1}  {}{note}\n",
            s.seconds, s.name
        ));
    }
    let line = format!(
        "node e2e on crius: {} passed, {} failed, {} skipped ({} specs in the suite); {:.0} s ({status})",
        counts[0],
        counts[1],
        counts[2],
        specs.len(),
        elapsed.as_secs_f64()
    );
    summary.push_str(&format!("\n{line}\n"));
    print!("{summary}");
    std::fs::write(out.join("summary.txt"), &summary).unwrap();
    println!("node e2e: reports, logs and summary in {}", out.display());
    assert!(
        failed.is_empty() && status.success(),
        "node e2e specs failed ({status}):\n{}",
        failed.join("\n")
    );
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
