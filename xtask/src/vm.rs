//! The VM tier: which integration test suites run in `hack/vm-run`'s VMs, under which boot, and
//! how the runs of one boot share a VM. Uses the crate's `cargo` and `test_binaries`.

use std::io::Write;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The test suites the VM tier runs: cgroup v2 limits, swap and noswap tmpfs (which only this
/// tier can check), the whole runtime suite again, now with every pod in real cgroups, and the
/// security suite, where the device controller and AppArmor (on in the VM kernel) apply; of the
/// agent suite, the tests named `cgroup_v2` (QoS limits and swap) and `volumes_env` (secrets on
/// a `noswap` tmpfs, checked again under the VM's kernel). Filters pick tests by name; none runs
/// the whole suite. The replays of runc's escapes run in the default boot, where AppArmor is
/// on, and those whose mechanism bypasses an LSM label again with SELinux. The last field is
/// how the VM boots (`hack/vm-run`'s flag): the systemd cgroup driver's test with systemd as
/// PID 1 (`-S`), the SELinux test and the escapes' LSM halves with SELinux instead of
/// AppArmor (`-Z`), the rest with a shell as PID 1 and AppArmor. The newest critest runs there too
/// (`CRITEST`), where its OOM, metrics and AppArmor specs must pass (its table is printed, so
/// `--nocapture`). The package's test installs what `cargo xtask deb` built and runs its unit
/// under systemd. The kubelet tier runs the newest upstream kubelet against crius twice: cgroupfs
/// with a shell as PID 1, and the systemd driver with systemd as PID 1; the oldest supported
/// minor's kubelet runs once, with cgroupfs. The crash-anywhere test runs
/// there too, where pods have cgroups and its cgroup fault points are in reach, and the
/// writable-layer test whose project quotas need the VM kernel's CONFIG_QUOTA. Lazy pulling
/// (FUSE under overlay) runs on the oldest kernel, 6.1, as well as on the host's.
///
/// The runs of one boot share one VM, in this order (a boot costs 9 s, 22 s with systemd, under
/// TCG); kubelet, which may change the machine, comes last in each.
static SUITES: [(&str, &[&str], &[&str]); 19] = [
    ("cgroups", &["--skip", "systemd_driver"], &[]),
    ("cgroups", &["systemd_driver"], &["-S"]),
    ("pods", &[], &[]),
    ("layer_usage", &[], &[]),
    ("layers", &["two_hundred_layers"], &["-k", "6.1."]),
    ("lazy", &[], &["-k", "6.1."]),
    ("checkpoint", &["--skip", "systemd"], &[]),
    ("checkpoint", &["systemd"], &["-S"]),
    ("security", &["--skip", "selinux"], &[]),
    ("security", &["selinux_labels"], &["-Z"]),
    ("escapes", &[], &[]),
    (
        "escapes",
        &["cve_2025_52881", "cve_2019_16884", "cve_2023_28642"],
        &["-Z"],
    ),
    ("agent", &["cgroup_v2", "volumes_env"], &[]),
    (
        "conformance",
        &["--nocapture", crate::CONFORMANCE_TEST],
        &[],
    ),
    ("package", &["package_unit_keeps_pods"], &["-S"]),
    (
        "chaos",
        &["--nocapture", "crash_anywhere_with_cgroups"],
        &[],
    ),
    ("kubelet", &["--nocapture", "--exact", KUBELET_NEWEST], &[]),
    ("kubelet", &["--nocapture", "--exact", KUBELET_OLDEST], &[]),
    (
        "kubelet",
        &["--nocapture", "--exact", KUBELET_NEWEST],
        &["-S"],
    ),
];

/// The kubelet tier's test with the newest kubelet, and with the oldest supported minor's.
const KUBELET_NEWEST: &str = "kubelet_runs_pods_on_crius";
const KUBELET_OLDEST: &str = "oldest_supported_kubelet_runs_pods_on_crius";

/// Suites the VM tier runs only when named (none now: the crash-anywhere test joined the
/// default set after four passing runs in a row).
const OPT_IN: &[&str] = &[];

/// The kubelet tier: upstream kubelets driving crius.
pub const KUBELET_SUITE: &str = "kubelet";

/// The critest suite the VM tier runs: the newest release's (its role in
/// `hack/upstream.versions`).
const CRITEST: &str = "cri-tools";

/// Its specs that need the VM: AppArmor enforcing, and cgroup v2 memory (the OOM kill and the
/// pod metrics of a container with limits). Alternatives of plain words (the conformance test
/// reads them so too).
const CRITEST_FOCUS: &str = "AppArmor|OOMKilled|metrics";

/// A VM's time limit per run it holds, at least three: under TCG the default boot's ten runs
/// took 1080 s (kubelet's 326 s), so a hang fails with vm-run's message well within CI's limit.
const SECONDS_PER_RUN: usize = 300;

/// One test binary's run: its suite, executable and filter.
struct Run {
    suite: &'static str,
    exe: String,
    filter: &'static [&'static str],
}

/// The VM tier's runs, built and grouped by boot (each boot's runs in the table's order).
pub struct Plan {
    boots: Vec<(&'static [&'static str], Vec<Run>)>,
}

/// Builds the suites on the host and runs their binaries in VMs (`hack/vm-run`), one VM per
/// boot; `only` picks suites by name (all when empty).
pub fn test(only: &[&str]) -> Result<()> {
    plan(only)?.run(None, None)
}

/// The suite that installs the Debian package (`cargo xtask deb`'s, in target/deb).
const PACKAGE_SUITE: &str = "package";

/// Whether a boot's runs install the package (so need it built first).
fn installs_package(runs: &[Run]) -> bool {
    runs.iter().any(|r| r.suite == PACKAGE_SUITE)
}

/// Builds the test suites of the runs `only` names (all when empty) and groups the runs by
/// boot, in the order of each boot's first run but the package's boot last.
pub fn plan(only: &[&str]) -> Result<Plan> {
    if !crate::is_root() {
        bail!("the VM tier needs root (qemu shares the host root over 9p)");
    }
    let wanted = |s: &str| {
        if only.is_empty() {
            !OPT_IN.contains(&s)
        } else {
            only.contains(&s)
        }
    };
    let runs: Vec<_> = SUITES.iter().filter(|(s, ..)| wanted(s)).collect();
    let mut suites: Vec<&str> = runs.iter().map(|(s, ..)| *s).collect();
    suites.sort();
    suites.dedup();
    let built = crate::test_binaries(&suites)?;
    let mut boots: Vec<(&'static [&'static str], Vec<Run>)> = Vec::new();
    for (suite, filter, boot) in runs {
        let Some((_, exe)) = built.iter().find(|(name, _)| name == suite) else {
            bail!("building the test suites gave no executable for {suite}");
        };
        let run = Run {
            suite,
            exe: exe.clone(),
            filter,
        };
        match boots.iter_mut().find(|(b, _)| b == boot) {
            Some((_, list)) => list.push(run),
            None => boots.push((boot, vec![run])),
        }
    }
    // A boot that installs the package last: CI builds the package beside the boots before it.
    boots.sort_by_key(|(_, runs)| installs_package(runs));
    Ok(Plan { boots })
}

impl Plan {
    /// Runs each boot's VM in turn; a failed boot does not stop the rest. With `log`, the VMs'
    /// output and this tier's own lines go there instead of stderr (CI runs the tier beside the
    /// host's tests and prints the log after). With `package`, a boot that installs the package
    /// first waits for word that it is built (CI builds it beside this tier); a sender dropped
    /// without a word means it failed, and that boot is not run.
    pub fn run(
        &self,
        log: Option<&std::fs::File>,
        package: Option<std::sync::mpsc::Receiver<()>>,
    ) -> Result<()> {
        let say = |line: String| match log {
            Some(mut f) => {
                let _ = writeln!(f, "{line}");
            }
            None => eprintln!("{line}"),
        };
        let mut times = Vec::new();
        let mut failed = Vec::new();
        // The word, once heard: whether the package built.
        let mut package = package.map(|word| (word, None::<bool>));
        for (boot, list) in &self.boots {
            if let Some((word, built)) = &mut package
                && installs_package(list)
            {
                let built = *built.get_or_insert_with(|| {
                    say(format!(
                        "xtask: VM tier: the {} boot waits for the package",
                        boot_name(boot)
                    ));
                    word.recv().is_ok()
                });
                if !built {
                    say(format!(
                        "xtask: VM tier: the package did not build; the {} boot is not run",
                        boot_name(boot)
                    ));
                    failed.push(boot_name(boot));
                    continue;
                }
            }
            let labels: Vec<String> = list.iter().map(label).collect();
            say(format!(
                "xtask: VM tier: one VM (boot: {}) for {}",
                boot_name(boot),
                labels.join("; ")
            ));
            let mut cmd = command(boot, SECONDS_PER_RUN * list.len().max(3))?;
            cmd.args(["--", "bash", "-c", &script(list)]);
            if let Some(f) = log {
                cmd.stdout(f.try_clone()?).stderr(f.try_clone()?);
            }
            say(format!("xtask: running {cmd:?}"));
            let started = std::time::Instant::now();
            let result = cmd.status();
            let took = started.elapsed().as_secs();
            times.push(format!("{} ({} runs): {took}", boot_name(boot), list.len()));
            match result {
                Ok(status) if status.success() => {}
                Ok(status) => {
                    say(format!(
                        "xtask: VM tier: the {} boot failed: {status}",
                        boot_name(boot)
                    ));
                    failed.push(boot_name(boot));
                }
                Err(e) => {
                    say(format!(
                        "xtask: VM tier: the {} boot did not start: {e}",
                        boot_name(boot)
                    ));
                    failed.push(boot_name(boot));
                }
            }
        }
        say(format!(
            "xtask: VM tier boots, in seconds: {}",
            times.join(", ")
        ));
        if !failed.is_empty() {
            bail!(
                "VM tier: a run failed in the boots {} (each run's exit is printed above)",
                failed.join(", ")
            );
        }
        Ok(())
    }
}

fn label(run: &Run) -> String {
    format!("{} {}", run.suite, run.filter.join(" "))
        .trim_end()
        .to_string()
}

/// The guest's script for one boot: each run in turn (a failed one does not stop the rest),
/// its time and exit printed; exits 1 if any failed.
fn script(list: &[Run]) -> String {
    let mut s = String::from(
        "failed=0; times=''\n\
         run() {\n  \
           label=$1; shift\n  \
           echo \"xtask: VM tier: $label\" >&2\n  \
           t=$(date +%s); \"$@\"; rc=$?; took=$(( $(date +%s) - t ))\n  \
           echo \"xtask: VM tier: $label took $took s, exit $rc\" >&2\n  \
           times=\"$times, $label ($took)\"\n  \
           [ $rc = 0 ] || failed=1\n\
         }\n",
    );
    for run in list {
        let mut words = vec![quote(&label(run))];
        if run.suite == "conformance" && std::env::var_os("CRITEST_SUITES").is_none() {
            // The host runs all three critest suites in full; here only the newest, and of it
            // only the specs that need this tier (the host accepts or skips them).
            let focus = std::env::var("CRITEST_FOCUS").unwrap_or_else(|_| CRITEST_FOCUS.into());
            words.push("env".into());
            words.push(quote(&format!("CRITEST_SUITES={CRITEST}")));
            words.push(quote(&format!("CRITEST_FOCUS={focus}")));
        }
        words.push(quote(&run.exe));
        // Tests ignored on the host because they need what only the VM has (cgroup v2,
        // AppArmor, SELinux, systemd as PID 1, a machine kubelet may change) run here.
        words.push("--test-threads=2".into());
        words.push("--include-ignored".into());
        words.extend(run.filter.iter().map(|f| quote(f)));
        s.push_str(&format!("run {}\n", words.join(" ")));
    }
    s.push_str(
        "echo \"xtask: VM tier runs in this boot, in seconds: ${times#, }\" >&2\nexit $failed\n",
    );
    s
}

/// `word` as one shell word.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// How a VM run boots, for the log: its `hack/vm-run` flags.
fn boot_name(boot: &[&str]) -> String {
    if boot.is_empty() {
        "default".into()
    } else {
        boot.join(" ")
    }
}

/// `hack/vm-run` (with `boot`'s flags and a limit of `seconds`) sharing what host-built tests
/// need, up to the `--`.
pub fn command(boot: &[&str], seconds: usize) -> Result<Command> {
    // The guest has its own /tmp and /run: the workspace (a CI clone may live there) is shared
    // read-only at its own path.
    let workspace = std::env::current_dir().context("current directory")?;
    let mut cmd = Command::new("hack/vm-run");
    cmd.args(boot);
    cmd.arg("-t").arg(seconds.to_string());
    cmd.arg("-r").arg(&workspace);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_runs_last_in_its_boots() {
        for (i, (suite, _, boot)) in SUITES.iter().enumerate() {
            if *suite != KUBELET_SUITE {
                assert!(
                    !SUITES[..i]
                        .iter()
                        .any(|(s, _, b)| *s == KUBELET_SUITE && b == boot),
                    "{suite} runs after kubelet in the {} boot",
                    boot_name(boot)
                );
            }
        }
    }

    #[test]
    fn words_are_quoted() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
