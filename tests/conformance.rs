//! Conformance: the CRI validation suites (upstream `critest`, unmodified, from the `cri-tools`
//! and `cri-tools-oldest` releases of `hack/upstream.versions`) against crius. The test starts a registry holding critest's
//! image set (built here, served under critest's registry names through hosts.toml mirrors),
//! and for each suite a daemon: it runs critest against the daemon's socket with a JSON report,
//! prints every spec's result, and fails on any failure that is not accepted below; then
//! upstream crictl's smoke run (`conformance/crictl.rs`) on the last daemon.
//! `CRITEST_FOCUS=REGEX` runs only the matching specs, `CRITEST_SKIP=REGEX` leaves some out
//! (printed); `CRITEST_SUITES=v1.37.0` (or `cri-tools`, the role) runs only those suites. Without a
//! suite's binary (`hack/install-upstream.sh` builds them) it prints "skipped: missing ...", or
//! fails under `CRIUS_REQUIRE_ALL=1` (CI); `CRITEST` runs another binary as the newest suite.

mod common;
#[path = "conformance/crictl.rs"]
mod crictl;
#[path = "conformance/images.rs"]
mod images;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::net::*;
use common::*;

/// Fails on every machine without access to upstream registries: the spec pulls
/// `test-image-digest@sha256:9700f9a2...`, a digest fixed in critest's source that no locally
/// built image can have.
const ACCEPTED_OFFLINE: &[&str] = &["public image with digest should be pulled and removed"];

/// Need cgroup v2 limits: accepted only on a host without cgroup v2 (this project's hosts are
/// v1/v2 hybrids; the VM tier runs them on pure cgroup v2, where they must pass). The metrics
/// listing makes a container with CPU and memory limits.
const NEEDS_CGROUP_V2: &[&str] = &[
    "should terminate with exitCode 137 and reason OOMKilled",
    "runtime should support listing pod sandbox metrics",
];

/// A `sudo` for critest (it loads AppArmor profiles with `sudo apparmor_parser`): this test runs
/// as root, so where sudo is not installed a script running its arguments stands in.
fn sudo_shim(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if which("sudo").is_some() {
        return None;
    }
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("shim dir");
    let sudo = bin.join("sudo");
    std::fs::write(&sudo, "#!/bin/sh\nexec \"$@\"\n").expect("sudo shim");
    std::fs::set_permissions(&sudo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Some(bin)
}

fn cgroup_v2_memory() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .map(|c| c.split_whitespace().any(|x| x == "memory"))
        .unwrap_or(false)
}

fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .map(|s| s.trim() == "Y")
        .unwrap_or(false)
}

/// Why a failure is accepted on this host, if it is.
fn accepted(spec: &ginkgo::Spec, cgroup_v2: bool) -> Option<&'static str> {
    let has = |list: &[&str]| list.iter().any(|s| spec.name.contains(s));
    if has(ACCEPTED_OFFLINE) {
        Some("offline: digest fixed upstream")
    } else if !cgroup_v2 && has(NEEDS_CGROUP_V2) {
        Some("no cgroup v2 on this host")
    } else {
        None
    }
}

/// System V shared memory segments of the host's IPC namespace: (id, size).
fn host_shm_segments() -> Vec<(String, u64)> {
    std::fs::read_to_string("/proc/sysvipc/shm")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(1)?.to_string(), f.get(3)?.parse().ok()?))
        })
        .collect()
}

/// The suites to run: (name, binary, whether it has NRI specs), the newest first; each named by
/// its version.
fn suites() -> Vec<(String, Option<PathBuf>, bool)> {
    let wanted = std::env::var("CRITEST_SUITES").ok();
    let mut out = Vec::new();
    for (role, nri) in [("cri-tools", true), ("cri-tools-oldest", false)] {
        let dir = upstream::dir(role);
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("cri-tools-"))
            .unwrap_or(role)
            .to_string();
        if wanted
            .as_deref()
            .is_some_and(|w| !w.split(',').any(|x| x.trim() == name || x.trim() == role))
        {
            continue;
        }
        let bin = match std::env::var_os("CRITEST") {
            Some(p) if role == "cri-tools" => Some(PathBuf::from(p)),
            _ => upstream::need(role, "critest"),
        };
        out.push((name, bin, nri));
    }
    out
}

/// What one suite found: its counts (passed, failed, accepted, skipped) and the unexpected.
struct Outcome {
    counts: [usize; 4],
    unexpected: Vec<ginkgo::Spec>,
    output: PathBuf,
}

/// Runs one critest suite against a daemon of its own on `reg`, which has critest's images.
async fn run_suite(
    name: &str,
    critest: &Path,
    nri: bool,
    work: &Path,
    reg: &Registry,
) -> (Outcome, Daemon, Option<TestNet>) {
    // Pods get IPs on a bridge of the test's own, with portmap for hostPort (critest's
    // networking specs and port forwarding reach them from the host).
    let net = plugins_present().then(TestNet::new);
    let d = Daemon::start(&net.as_ref().map(TestNet::tables).unwrap_or_default());
    if let Some(net) = &net {
        std::fs::write(
            d.net_dir().join("10-critest.conflist"),
            net.conflist(TestNet::portmap()),
        )
        .expect("network list");
    }
    images::point_at(reg, &d);
    let dir = work.join(name);
    std::fs::create_dir_all(&dir).expect("suite dir");
    let shm_before = host_shm_segments();
    let report = dir.join("critest.json");
    let output = dir.join("critest.log");
    let endpoint = format!("unix://{}", d.socket.display());
    let started = Instant::now();
    let log = std::fs::File::create(&output).expect("critest log");
    let mut cmd = Command::new(critest);
    // CRITEST_FOCUS (a regex over spec names) runs a part of the suite, while fixing one spec.
    let focus = std::env::var("CRITEST_FOCUS").ok();
    if let Some(focus) = &focus {
        println!("critest {name}: only specs matching {focus:?} (CRITEST_FOCUS)");
        cmd.arg(format!("--ginkgo.focus={focus}"));
    }
    // Left out by the focus (read as alternatives of plain words, as the VM tier's is).
    let focused_out = |spec: &str| {
        focus
            .as_ref()
            .is_some_and(|f| !f.split('|').any(|word| spec.contains(word)))
    };
    if let Ok(skip) = std::env::var("CRITEST_SKIP") {
        println!("critest {name}: leaving out specs matching {skip:?} (CRITEST_SKIP)");
        cmd.arg(format!("--ginkgo.skip={skip}"));
    }
    if let Some(bin) = sudo_shim(&dir) {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", bin.display()));
    }
    // Suites with NRI specs: their stub plugin connects to the daemon's socket.
    if nri {
        cmd.arg("-nri-socket").arg(d.nri_socket());
    }
    let status = cmd
        .arg("--runtime-endpoint")
        .arg(&endpoint)
        .arg("--image-endpoint")
        .arg(&endpoint)
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .args(["--ginkgo.no-color", "--ginkgo.timeout=30m"])
        // critest reads crictl's config from its own directory when /etc/crictl.yaml is missing.
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .status()
        .expect("running critest");
    let elapsed = started.elapsed();

    // critest's HostIpc specs make segments with ipcmk on the host and never remove them.
    for (id, size) in host_shm_segments() {
        if size == 1_048_576 && !shm_before.iter().any(|(b, _)| *b == id) {
            let _ = Command::new("ipcrm").args(["-m", &id]).status();
        }
    }

    if !report.exists() {
        panic!(
            "critest {name} wrote no report ({status}); its output:\n{}",
            std::fs::read_to_string(&output).unwrap_or_default()
        );
    }
    let specs = ginkgo::parse_report(&report);
    let cgroup_v2 = cgroup_v2_memory();
    let apparmor = apparmor_enabled();
    let mut unexpected = Vec::new();
    let mut counts = [0usize; 4]; // passed, failed, accepted, skipped
    println!("\ncritest {name}\n{:<8} {:>6}  spec", "result", "secs");
    for s in specs {
        let (label, note) = match s.state.as_str() {
            "passed" => {
                counts[0] += 1;
                let note = accepted(&s, cgroup_v2)
                    .map(|why| format!("  (passes now; accepted as {why}: update the list)"))
                    .unwrap_or_default();
                ("passed", note)
            }
            "skipped" | "pending" => {
                counts[3] += 1;
                let note = format!("  -- {}", s.first_line());
                // AppArmor specs skip only where the host has no AppArmor; NRI specs skip
                // when the runtime misses what they check (a "spec discrepancy").
                if ((apparmor && s.name.contains("AppArmor")) || s.name.contains("NRI"))
                    && !focused_out(&s.name)
                {
                    unexpected.push(s.clone());
                }
                ("skipped", note)
            }
            _ => match accepted(&s, cgroup_v2) {
                Some(why) => {
                    counts[2] += 1;
                    ("ACCEPTED", format!("  [{why}] {}", s.first_line()))
                }
                None => {
                    counts[1] += 1;
                    let note = format!("  -- {}", s.first_line());
                    unexpected.push(s.clone());
                    ("FAILED", note)
                }
            },
        };
        println!("{label:<8} {:>6.1}  {}{note}", s.seconds, s.name);
    }
    println!(
        "\ncritest {name}: {} specs: {} passed, {} failed, {} accepted failures, {} skipped; {:.0} s ({status})",
        counts.iter().sum::<usize>(),
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        elapsed.as_secs_f64()
    );
    (
        Outcome {
            counts,
            unexpected,
            output,
        },
        d,
        net,
    )
}

#[tokio::test]
async fn critest_passes() {
    require_root();
    let work = tempfile::Builder::new()
        .prefix("crius-conformance")
        .tempdir()
        .expect("tempdir");
    let suites = suites();
    if suites.iter().all(|(_, b, _)| b.is_none()) {
        return;
    }
    let built = Instant::now();
    let set = images::build(work.path());
    let reg = Registry::start(None);
    images::publish(&reg, &set).await;
    println!(
        "critest images: {} images under {} names, built and pushed in {:.1} s",
        set.len(),
        set.iter().map(|p| p.names.len()).sum::<usize>(),
        built.elapsed().as_secs_f64()
    );
    let mut summary = Vec::new();
    let mut failed = Vec::new();
    let mut last = None;
    for (name, bin, nri) in &suites {
        let Some(bin) = bin else {
            continue;
        };
        let (outcome, d, net) = run_suite(name, bin, *nri, work.path(), &reg).await;
        let c = outcome.counts;
        summary.push(format!(
            "critest {name}: {} passed, {} failed, {} accepted failures, {} skipped",
            c[0], c[1], c[2], c[3]
        ));
        if !outcome.unexpected.is_empty() {
            for s in &outcome.unexpected {
                println!("\n---- {name}: {} ({}) at {}", s.name, s.state, s.location);
                for l in s.message.lines().take(25) {
                    println!("    {l}");
                }
            }
            let tail: Vec<String> = std::fs::read_to_string(&outcome.output)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(40)
                .map(str::to_string)
                .collect();
            println!("\n---- end of critest {name}'s output ----");
            for l in tail.iter().rev() {
                println!("{l}");
            }
            let names: Vec<&str> = outcome.unexpected.iter().map(|s| s.name.as_str()).collect();
            failed.push(format!(
                "{} in {name} ({})",
                outcome.unexpected.len(),
                names.join("; ")
            ));
        }
        last = Some((d, net));
    }
    // crictl's smoke run on the last suite's daemon, with critest's default image.
    let smoke = last.as_ref().map(|(d, net)| {
        crictl::smoke(
            &d.socket,
            "registry.k8s.io/e2e-test-images/busybox:1.29-2",
            work.path(),
            net.is_some(),
        )
    });
    println!();
    for l in &summary {
        println!("{l}");
    }
    if !failed.is_empty() {
        panic!(
            "critest specs failed unexpectedly: {}{}",
            failed.join(", "),
            smoke
                .and_then(|s| s.err())
                .map(|e| format!("; {e}"))
                .unwrap_or_default()
        );
    }
    if let Some(Err(e)) = smoke {
        panic!("{e}");
    }
}
