//! Project tasks: `cargo xtask lint | unit | integration | conformance | node-e2e | test | test-vm |
//! test-kubelet | chaos | fuzz | soak | ci | bench | dist | deb | arch`.

mod arch;
mod bench;
mod deb;
mod leftovers;
mod upstream;
mod vm;

use std::process::Command;

use anyhow::{Context, Result, bail};

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // `cargo run` gave this process xtask's own package variables. Build scripts that watch
    // them (ring's watches CARGO_PKG_NAME and CARGO_MANIFEST_DIR) would run again, and every
    // crate above them be rebuilt, each time cargo ran from here after cargo run by hand.
    for (name, _) in std::env::vars_os() {
        if let Some(name) = name.to_str()
            && (name.starts_with("CARGO_PKG_")
                || matches!(
                    name,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                ))
        {
            cmd.env_remove(name);
        }
    }
    cmd
}

fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
}

fn unit() -> Result<()> {
    run(cargo().args(["test", "--workspace", "--lib", "--bins"]))
}

/// The effective uid as the kernel reports it.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Where the host's test tiers note each test that skipped itself (`tests/common`'s `missing`
/// and `not_here`), to be counted apart from the passes.
const SKIP_LOG: &str = "target/skips.log";

/// Runs a host test tier with its skips noted, then says how many tests skipped and why.
fn counted(what: &str, cmd: &mut Command) -> Result<()> {
    let log = std::env::current_dir()?.join(SKIP_LOG);
    let _ = std::fs::remove_file(&log);
    let result = run(cmd.env("CRIUS_SKIP_LOG", &log));
    let skips = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = skips.lines().collect();
    eprintln!("xtask: {what}: {} tests skipped themselves", lines.len());
    for l in lines {
        eprintln!("xtask:   skipped {l}");
    }
    result
}

fn integration() -> Result<()> {
    host_tests(&[])
}

/// The host's integration tests but critest and those named in `skip`.
fn host_tests(skip: &[&str]) -> Result<()> {
    if !is_root() {
        bail!("integration tests need root (they mount overlayfs and create namespaces)");
    }
    // The conformance suite runs on its own, after these (`conformance`).
    let mut cmd = cargo();
    cmd.args(["test", "--test", "*", "--", "--skip", CONFORMANCE_TEST]);
    cmd.args(["--skip", NODE_E2E_TEST]);
    for test in skip {
        cmd.args(["--skip", test]);
    }
    counted("the host's tests", &mut cmd)?;
    // They ran with the newest CNI plugins; the network tests run again with Debian's (what
    // hack/run.sh gives a Debian 12 node).
    counted(
        "the network tests with Debian's CNI plugins",
        cargo()
            .env("CRIUS_CNI", "debian")
            .args(["test", "--test", "network"]),
    )
}

/// The host's package test: it installs the package into the host's root and purges it.
const HOST_PACKAGE_TEST: &str = "package_installs_and_purges";

/// The test in tests/conformance.rs that runs critest.
const CONFORMANCE_TEST: &str = "critest_passes";

/// The node e2e suite's test (`tests/node_e2e.rs`), run by `node-e2e` alone.
const NODE_E2E_TEST: &str = "node_e2e_suite";

/// CI's node e2e subset (58 specs, 81 s here): the families of NodeConformance specs that once
/// failed on crius (SELinux options on emptyDir volumes and log paths, the hostname and FQDN
/// specs, env from ConfigMaps and Secrets, exec and logs over WebSocket, https lifecycle hooks),
/// each a path through API server, kubelet and crius that critest does not take. Less the
/// three whose failures no runtime here can change (docs/conformance.md).
const NODE_E2E_CI_FOCUS: &str = r"EmptyDir volumes|Hostname of Pod|Override hostname of Pod|environment|over websockets|https hook|ContainerLogPath";
const NODE_E2E_CI_SKIP: &str = r"\[Flaky\]|\[Slow\]|\[Serial\]|\[Feature:OffByDefault\]|PrivilegedPod|ContainerMetrics|Summary API";

/// CI's node e2e subset, on the host.
fn node_e2e_subset() -> Result<()> {
    counted(
        "the node e2e subset",
        node_e2e_test()
            .env("NODE_E2E_FOCUS", NODE_E2E_CI_FOCUS)
            .env("NODE_E2E_SKIP", NODE_E2E_CI_SKIP),
    )
}

/// The node e2e suite's test alone, its output as it comes.
fn node_e2e_test() -> Command {
    let mut cmd = cargo();
    cmd.args(["test", "--test", "node_e2e", "--", "--nocapture", "--exact"])
        .arg(NODE_E2E_TEST);
    cmd
}

/// The upstream node e2e suite against crius (`tests/node_e2e.rs`): `--focus RE`, `--skip RE`
/// (SIG Node's release-blocking selection by default), `--procs N`, `--timeout D`,
/// `--kubelet-gates G=true,...` (kubelet feature gates); `--vm` runs
/// it in the VM tier's VM (cgroup v2, swap, a kernel with modules, systemd as PID 1), the
/// reports coming back to the same directory. Installs the parts it needs first.
fn node_e2e(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("the node e2e suite needs root (it runs kubelet and a crius daemon)");
    }
    let mut vars = Vec::new();
    let mut in_vm = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let var = match a.as_str() {
            "--focus" => "NODE_E2E_FOCUS",
            "--skip" => "NODE_E2E_SKIP",
            "--procs" => "NODE_E2E_PROCS",
            "--timeout" => "NODE_E2E_TIMEOUT",
            "--kubelet-gates" => "NODE_E2E_KUBELET_GATES",
            "--vm" => {
                in_vm = true;
                continue;
            }
            _ => bail!(
                "node-e2e: unknown argument {a:?} (--focus RE, --skip RE, --procs N, --timeout D, \
                 --kubelet-gates G=true,..., --vm)"
            ),
        };
        let Some(value) = it.next() else {
            bail!("node-e2e: {a} needs a value");
        };
        vars.push((var, value.clone()));
    }
    run(&mut Command::new("hack/install-test-deps.sh"))?;
    upstream::install(&["node-e2e", "cni-plugins"])?;
    let mut cmd = if in_vm {
        node_e2e_in_vm(&vars)?
    } else {
        let mut cmd = node_e2e_test();
        cmd.envs(vars.iter().map(|(k, v)| (k, v)));
        cmd
    };
    let started = std::time::Instant::now();
    let result = run(&mut cmd);
    eprintln!(
        "xtask: node e2e took {:.0} s; its reports are in target/node-e2e/crius/",
        started.elapsed().as_secs_f64()
    );
    result
}

/// The node e2e suite's VM: room for an API server, etcd, kubelet, crius and the pods' images
/// on the guest's tmpfs, and swap for the swap specs.
const NODE_E2E_VM: [&str; 6] = ["-m", "8192", "-s", "2048", "-c", "2"];
/// The suite's own time limit unless given (the test's default), and what the VM adds to it
/// for its boot, the images and the cleanup after the suite.
const NODE_E2E_TIMEOUT: &str = "3h";
const NODE_E2E_VM_EXTRA_SECONDS: u64 = 1800;

/// Seconds in a Go duration of whole hours, minutes and seconds (`3h`, `90m`, `1h30m`).
fn go_duration_seconds(d: &str) -> Option<u64> {
    let (mut total, mut num) = (0u64, String::new());
    for c in d.chars() {
        let unit = match c {
            '0'..='9' => {
                num.push(c);
                continue;
            }
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total += num.parse::<u64>().ok()? * unit;
        num.clear();
    }
    (num.is_empty() && !d.is_empty()).then_some(total)
}

/// The node e2e test built on the host, run in a VM with `vars` set; target/node-e2e is shared
/// read-write so its reports land where the host's run puts them.
fn node_e2e_in_vm(vars: &[(&str, String)]) -> Result<Command> {
    let timeout = vars
        .iter()
        .find(|(k, _)| *k == "NODE_E2E_TIMEOUT")
        .map_or(NODE_E2E_TIMEOUT, |(_, v)| v.as_str());
    let Some(seconds) = go_duration_seconds(timeout) else {
        bail!("node-e2e: --timeout {timeout:?} is not a duration of h, m and s (3h, 90m)");
    };
    let built = test_binaries(&["node_e2e"])?;
    let Some((_, exe)) = built.first() else {
        bail!("building tests/node_e2e.rs gave no executable");
    };
    let reports = std::env::current_dir()?.join("target/node-e2e");
    std::fs::create_dir_all(&reports)?;
    // systemd as PID 1, as on SIG Node's machines: the suite starts kubelet with systemd-run,
    // and the specs that change kubelet's configuration restart it with systemctl.
    let mut cmd = vm::command(&["-S"], (seconds + NODE_E2E_VM_EXTRA_SECONDS) as usize)?;
    cmd.args(NODE_E2E_VM)
        .arg("-w")
        .arg(&reports)
        .arg("--")
        .arg("env");
    // The parts were installed just now: a missing one fails the run instead of skipping it.
    cmd.arg("CRIUS_REQUIRE_ALL=1");
    // Under TCG kubelet registers too late for its CSINode set-up at the default 10 s.
    cmd.arg("NODE_E2E_STATUS_FREQUENCY=2s");
    // Not /tmp: the unit systemd-run makes for kubelet pulls in systemd-tmpfiles, which empties
    // /tmp at boot, and the daemon's socket with it. The VM's /var/tmp is a fresh tmpfs too.
    cmd.arg("TMPDIR=/var/tmp");
    cmd.args(vars.iter().map(|(k, v)| format!("{k}={v}")));
    cmd.args([exe.as_str(), "--nocapture", "--exact", NODE_E2E_TEST]);
    Ok(cmd)
}

/// critest (the CRI validation suites, built by `hack/install-upstream.sh` where they are
/// missing) against a crius daemon, with its per-spec table.
fn conformance() -> Result<()> {
    if !is_root() {
        bail!("the conformance suite needs root (it runs a crius daemon)");
    }
    upstream::install(&["cri-tools", "cri-tools-oldest", "cni-plugins"])?;
    let started = std::time::Instant::now();
    counted(
        "conformance",
        cargo().args([
            "test",
            "--test",
            "conformance",
            "--",
            "--nocapture",
            CONFORMANCE_TEST,
        ]),
    )?;
    eprintln!(
        "xtask: conformance took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the named integration test suites; each suite's name and executable.
fn test_binaries(suites: &[&str]) -> Result<Vec<(String, String)>> {
    let mut cmd = cargo();
    cmd.args(["test", "--no-run", "--message-format=json"]);
    for s in suites {
        cmd.args(["--test", s]);
    }
    eprintln!("xtask: running {cmd:?}");
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("building test suites")?;
    if !out.status.success() {
        bail!("building the test suites {suites:?} failed");
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && let (Some(exe), Some(name)) =
                (v["executable"].as_str(), v["target"]["name"].as_str())
            && suites.contains(&name)
        {
            bins.push((name.to_string(), exe.to_string()));
        }
    }
    Ok(bins)
}

/// The host's target triple, from rustc.
fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV printed no host")
}

/// Builds the production binary: release, statically linked and not position-independent, so
/// the helpers crius runs per pod and per exec start without a dynamic loader or relocations
/// (about 0.6 ms less per exec here) and keep a third of the private memory. The target is
/// given explicitly so build scripts and proc-macros stay ordinary host builds.
fn dist() -> Result<std::path::PathBuf> {
    let triple = host_triple()?;
    let var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        triple.to_uppercase().replace('-', "_")
    );
    run(cargo()
        .args(["build", "--release", "--bin", "crius", "--target", &triple])
        .env(
            var,
            "-C target-feature=+crt-static -C relocation-model=static",
        ))?;
    let built = std::path::PathBuf::from(format!("target/{triple}/release/crius"));
    let out = std::path::PathBuf::from("target/dist/crius");
    std::fs::create_dir_all("target/dist")?;
    // Copied aside and renamed over, so a running crius (its monitors) keeps its own file.
    let tmp = out.with_extension("new");
    std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
    std::fs::rename(&tmp, &out).with_context(|| format!("replacing {}", out.display()))?;
    eprintln!("xtask: {} is ready", out.display());
    Ok(out)
}

fn bench(args: &[String]) -> Result<()> {
    // `--plot [--out FILE]`: charts of a finished run's results, no run (and no root).
    if args.iter().any(|a| a == "--plot") {
        let rest: Vec<String> = args.iter().filter(|a| *a != "--plot").cloned().collect();
        let opts = bench::Options::parse(&rest)?;
        for chart in bench::plot::plot(&opts.out)? {
            println!("xtask: wrote {}", chart.display());
        }
        return Ok(());
    }
    // `--table [--out FILE]`: the same results as docs/performance.md's Markdown table.
    if args.iter().any(|a| a == "--table") {
        let rest: Vec<String> = args.iter().filter(|a| *a != "--table").cloned().collect();
        let opts = bench::Options::parse(&rest)?;
        print!("{}", bench::table::table(&opts.out)?);
        return Ok(());
    }
    if !is_root() {
        bail!("the benchmark needs root (it runs two container runtimes)");
    }
    let mut opts = bench::Options::parse(args)?;
    upstream::install(bench::UPSTREAM)?;
    if !args.iter().any(|a| a == "--crius") {
        opts.crius_bin = dist()?;
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(bench::run(opts))
}

/// The crash-anywhere test alone, as long as asked: `--iterations N` (the CI run does 200),
/// `--seed S` to repeat a run's choices.
fn chaos(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("the chaos test needs root (it runs a crius daemon and kills it)");
    }
    let mut cmd = cargo();
    cmd.args(["test", "--test", "chaos", "--", "--nocapture", "--exact"])
        .arg("crash_anywhere");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let var = match a.as_str() {
            "--iterations" => "CRIUS_CHAOS_ITERATIONS",
            "--seed" => "CRIUS_CHAOS_SEED",
            _ => bail!("chaos: unknown argument {a:?} (--iterations N, --seed S)"),
        };
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        cmd.env(var, v);
    }
    run(&mut cmd)
}

/// The fuzz test of the CRI edge alone, as long as asked: `--cases N` (CI: 150), `--seed S`.
fn fuzz(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("the fuzz test needs root (it runs a crius daemon)");
    }
    let mut cmd = cargo();
    cmd.args(["test", "--test", "fuzz", "--", "--nocapture"]);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let var = match a.as_str() {
            "--cases" => "CRIUS_FUZZ_CASES",
            "--seed" => "CRIUS_FUZZ_SEED",
            _ => bail!("fuzz: unknown argument {a:?} (--cases N, --seed S)"),
        };
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        cmd.env(var, v);
    }
    run(&mut cmd)
}

/// The soak test alone, as large and as long as asked: `--pods N` (CI: 40), `--minutes M`
/// (CI: one), `--churn C` (pods replaced a minute, 10).
fn soak(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("the soak test needs root (it runs a crius daemon and the agent)");
    }
    let mut cmd = cargo();
    cmd.args(["test", "--test", "soak", "--", "--nocapture"]);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--pods" => cmd.env("CRIUS_SOAK_PODS", v),
            "--churn" => cmd.env("CRIUS_SOAK_CHURN", v),
            "--minutes" => {
                let m: u64 = v.parse().context("--minutes takes a whole number")?;
                cmd.env("CRIUS_SOAK_SECONDS", (m * 60).to_string())
            }
            _ => bail!("soak: unknown argument {a:?} (--pods N, --minutes M, --churn C)"),
        };
    }
    run(&mut cmd)
}

/// How long each stage of `ci` took, said after each one, to keep CI under its budget.
#[derive(Default)]
struct Stages(Vec<(&'static str, u64)>);

impl Stages {
    fn time<T>(&mut self, stage: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let result = f();
        self.0.push((stage, started.elapsed().as_secs()));
        eprintln!("xtask: ci so far: {}", self.said());
        result
    }

    /// Each stage with its seconds, in order.
    fn said(&self) -> String {
        let said: Vec<String> = self.0.iter().map(|(s, t)| format!("{s} {t} s")).collect();
        said.join(", ")
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    match task.as_str() {
        "arch" => arch::write(),
        "lint" => lint(),
        "unit" => unit(),
        "integration" => integration(),
        "test" => {
            unit()?;
            integration()
        }
        "ci" => {
            let mut clock = Stages::default();
            clock.time("lint", lint)?;
            clock.time("unit", unit)?;
            let before = leftovers::Inventory::take();
            leftovers::forget_strays();
            // The VM tier (the longest) starts as soon as the test binaries are built and runs
            // beside the rest: each VM is a machine of its own, and alone it leaves a third of
            // the two cores idle. Its boot that installs the package waits for it.
            let vm_plan = clock.time("test build", || {
                run(cargo().args(["test", "--no-run", "--test", "*"]))?;
                vm::plan(&[])
            })?;
            let vm_log = std::path::PathBuf::from("target/vm-tier.log");
            let log = std::fs::File::create(&vm_log)
                .with_context(|| format!("creating {}", vm_log.display()))?;
            eprintln!(
                "xtask: the VM tier runs beside the package build, the host's tests, critest and the benchmark; its output goes to {} and is printed when it ends",
                vm_log.display()
            );
            let (package_built, package_word) = std::sync::mpsc::channel();
            let vm_started = std::time::Instant::now();
            let vm_tier = std::thread::spawn(move || vm_plan.run(Some(&log), Some(package_word)));
            // The package first: the host's package test installs it. The VM tier hears that
            // it built and the host is done with it, or, from the sender dropped without a
            // word, that it did not build.
            let packaged = clock.time("package", || deb::build(&dist()?).map(drop));
            // The host's root is the VM's too (read-only under its overlay): a dpkg on the
            // host changing files under the VM's dpkg failed an install there. So the host's
            // package test runs, and ends, before the VM's package boot hears the word.
            let package_tested = match &packaged {
                Ok(()) => clock.time("host package test", || {
                    counted(
                        "the host's package test",
                        cargo()
                            .args(["test", "--test", "package", "--", "--exact"])
                            .arg(HOST_PACKAGE_TEST),
                    )
                }),
                Err(_) => Ok(()),
            };
            if packaged.is_ok() {
                // Err only if the VM tier has ended already.
                let _ = package_built.send(());
            }
            drop(package_built);
            // The other host tests run whether or not the package test passed.
            let host = packaged
                .and_then(|()| clock.time("host tests", || host_tests(&[HOST_PACKAGE_TEST])))
                .and(package_tested)
                .and_then(|()| clock.time("conformance", conformance))
                .and_then(|()| clock.time("node e2e subset", node_e2e_subset));
            leftovers::report_strays("the host's tests");
            let host =
                host.and_then(|()| clock.time("bench smoke", || bench(&["--smoke".to_string()])));
            let vm_result = vm_tier
                .join()
                .map_err(|_| anyhow::anyhow!("the VM tier's thread panicked"))
                .and_then(|r| r);
            eprintln!(
                "xtask: ---- the VM tier's output ({}) ----",
                vm_log.display()
            );
            eprint!("{}", std::fs::read_to_string(&vm_log).unwrap_or_default());
            eprintln!("xtask: ---- end of the VM tier's output ----");
            clock
                .0
                .push(("VM tier (beside them)", vm_started.elapsed().as_secs()));
            eprintln!("xtask: ci: {}", clock.said());
            host?;
            vm_result?;
            leftovers::Inventory::take()
                .check_since(&before, "the host's tests, the benchmark and the VM tier")
        }
        "conformance" => conformance(),
        "node-e2e" => node_e2e(&args[1..]),
        "test-vm" => vm::test(&args[1..].iter().map(String::as_str).collect::<Vec<_>>()),
        "test-kubelet" => vm::test(&[vm::KUBELET_SUITE]),
        "bench" => bench(&args[1..]),
        "chaos" => chaos(&args[1..]),
        "soak" => soak(&args[1..]),
        "fuzz" => fuzz(&args[1..]),
        "dist" => dist().map(drop),
        "deb" => deb::build(&dist()?).map(drop),
        _ => {
            eprintln!("usage: cargo xtask <task>");
            eprintln!("  lint         rustfmt --check and clippy -D warnings");
            eprintln!("  unit         unit tests (no root)");
            eprintln!(
                "  integration  root tests against a real registry, overlayfs and namespaces"
            );
            eprintln!(
                "  conformance  critest (the CRI validation suite) against crius, per-spec table"
            );
            eprintln!(
                "  node-e2e     the upstream node e2e suite (kubelet with an API server) against crius"
            );
            eprintln!(
                "               [--focus RE] [--skip RE] [--procs N] [--timeout D] \
                 [--kubelet-gates G=true,...] [--vm]"
            );
            eprintln!("  test         unit + integration");
            eprintln!(
                "  test-vm      cgroup v2, swap and noswap tests (and the runtime suite) in a qemu VM"
            );
            eprintln!("               [SUITE...] (only these suites, e.g. chaos)");
            eprintln!(
                "  test-kubelet an upstream kubelet driving crius in the VM (both cgroup drivers)"
            );
            eprintln!(
                "  dist         the production binary (static, release) in target/dist/crius"
            );
            eprintln!(
                "  deb          the Debian package (binary, unit, config, completions, man pages)"
            );
            eprintln!(
                "  bench        crius against containerd, side by side [--rounds N] [--smoke]"
            );
            eprintln!(
                "               [--large-mb MIB] [--concurrent N] [--idle-seconds S] [--out FILE]"
            );
            eprintln!("               [--probed-pods N] [--probe-seconds S] [--kubelet-pods N]");
            eprintln!("               [--forward-mb MB] [--crius BINARY]");
            eprintln!("  chaos        the crash-anywhere test alone [--iterations N] [--seed S]");
            eprintln!(
                "  fuzz         hostile CRI requests against a daemon [--cases N] [--seed S]"
            );
            eprintln!(
                "  soak         many probed pods with churn [--pods N] [--minutes M] [--churn C]"
            );
            eprintln!("  ci           everything CI runs (the benchmark as a smoke run)");
            eprintln!(
                "  arch         draw docs/architecture.svg (modules and processes) from the code"
            );
            bail!("unknown task {task:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn go_durations_are_read_as_the_suite_reads_them() {
        assert_eq!(super::go_duration_seconds("3h"), Some(10800));
        assert_eq!(super::go_duration_seconds("1h30m"), Some(5400));
        assert_eq!(super::go_duration_seconds("90m"), Some(5400));
        assert_eq!(super::go_duration_seconds("45s"), Some(45));
        for bad in ["", "3", "1.5h", "2d"] {
            assert_eq!(super::go_duration_seconds(bad), None, "{bad:?}");
        }
    }
}
