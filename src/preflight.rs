//! preflight: `crius check`, what an operator asks before running pods on a node: the kernel,
//! cgroup v2 and its controllers, overlayfs, idmapped mounts, seccomp, an LSM, the CNI network
//! list and its plugins, the capabilities crius needs, free space under the root, and whether
//! the image signature policy reads, whether criu can checkpoint here, and the CDI spec
//! files (the devices they offer, and what is wrong with any of them, through `cdi`). Each
//! item is ok, warn (works, with less) or fail (pods will not run), with what to do. Reads the
//! node through `runtime`, `sys` and `sandbox::security`, and the network list through
//! `network::conflist` (from the configuration's `[network]`, as the daemon reads it), the
//! policy through `image::policy`; changes nothing.

use std::path::{Path, PathBuf};

use crate::config::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One checked item.
#[derive(Debug, Clone)]
pub struct Finding {
    pub item: &'static str,
    pub level: Level,
    pub detail: String,
    /// What to do about it; empty when ok.
    pub fix: String,
}

fn ok(item: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        item,
        level: Level::Ok,
        detail: detail.into(),
        fix: String::new(),
    }
}

fn bad(item: &'static str, level: Level, detail: impl Into<String>, fix: &str) -> Finding {
    Finding {
        item,
        level,
        detail: detail.into(),
        fix: fix.to_string(),
    }
}

/// `6.1.0-18-amd64` -> (6, 1).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Every check, in the order printed.
pub fn run(cfg: &Config) -> Vec<Finding> {
    vec![
        kernel(),
        cgroups(cfg),
        device_control(),
        overlay(),
        idmapped_mounts(),
        seccomp(),
        lsm(),
        cni(&cfg.network.conf_dir, &cfg.network.bin_dirs),
        capabilities(),
        free_space(&cfg.root),
        signature_policy(&cfg.image.signature_policy),
        checkpoint(),
    ]
    .into_iter()
    .chain(cdi(cfg))
    .collect()
}

/// The CDI spec files: the devices they offer, and each file or device that cannot be used.
pub fn cdi(cfg: &Config) -> Vec<Finding> {
    let dirs = cfg
        .cdi
        .spec_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if !cfg.cdi.enable {
        return vec![ok(
            "CDI",
            "off ([cdi] enable = false): CDI devices are refused",
        )];
    }
    let survey = crate::cdi::Registry::new(cfg.cdi.spec_dirs.clone()).survey();
    let mut out = Vec::new();
    for (file, why) in &survey.invalid {
        out.push(bad(
            "CDI",
            Level::Warn,
            format!("{}: {why}", file.display()),
            "fix or remove the file: containers asking for its devices are refused",
        ));
    }
    for (device, a, b) in &survey.conflicts {
        out.push(bad(
            "CDI",
            Level::Warn,
            format!(
                "{device} is defined by both {} and {}",
                a.display(),
                b.display()
            ),
            "remove one: containers asking for it are refused",
        ));
    }
    let names: Vec<&str> = survey.devices.iter().map(|(n, _)| n.as_str()).collect();
    out.push(ok(
        "CDI",
        if names.is_empty() {
            format!("no devices in {dirs}")
        } else {
            format!("{} devices in {dirs}: {}", names.len(), names.join(" "))
        },
    ));
    out
}

/// Whether CheckpointContainer can work here: criu installed and its own check passing.
fn checkpoint() -> Finding {
    const ITEM: &str = "checkpoint";
    match std::process::Command::new("criu").arg("check").output() {
        Err(_) => bad(
            ITEM,
            Level::Warn,
            "criu is not installed",
            "install criu (Debian: apt install criu) to checkpoint and restore containers",
        ),
        Ok(out) if out.status.success() => ok(ITEM, "criu check passes"),
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let first = said
                .lines()
                .find(|l| l.contains("Error"))
                .unwrap_or("criu check failed");
            bad(
                ITEM,
                Level::Warn,
                first.trim().to_string(),
                "checkpoints fail on this kernel: CRIU needs CONFIG_CHECKPOINT_RESTORE and a \
                 kernel it supports",
            )
        }
    }
}

/// Whether the image signature policy reads: none is fine (every image is accepted), a broken
/// one fails every pull.
pub fn signature_policy(path: &Path) -> Finding {
    const ITEM: &str = "signature policy";
    match crate::image::policy::Policy::load(path) {
        Ok(None) => ok(
            ITEM,
            format!("none at {}: every image is accepted", path.display()),
        ),
        Ok(Some(_)) => ok(ITEM, format!("{} applies to every pull", path.display())),
        Err(e) => bad(
            ITEM,
            Level::Fail,
            format!("{}: {e}", path.display()),
            "fix the policy: every pull fails while it cannot be read",
        ),
    }
}

fn kernel() -> Finding {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    match kernel_version(&release) {
        Some(v) if v >= (5, 12) => ok("kernel", release),
        Some(v) if v >= (5, 4) => bad(
            "kernel",
            Level::Warn,
            format!("{release}: no idmapped mounts before 5.12"),
            "a 5.12 or later kernel lets pods have their own user namespace",
        ),
        _ => bad(
            "kernel",
            Level::Fail,
            format!("{release:?} is older than 5.4"),
            "upgrade the kernel (openat2 and pidfds are needed)",
        ),
    }
}

fn cgroups(cfg: &Config) -> Finding {
    let Some(h) = crate::runtime::cgroup::Hierarchy::detect() else {
        let level = if cfg.cgroup.allow_unenforced {
            Level::Warn
        } else {
            Level::Fail
        };
        return bad(
            "cgroup v2",
            level,
            "not mounted at /sys/fs/cgroup (a v1 or hybrid host)",
            "boot with systemd.unified_cgroup_hierarchy=1 (or cgroup_no_v1=all); until then pods with limits are refused unless cgroup.allow_unenforced",
        );
    };
    let missing: Vec<&str> = ["cpu", "memory", "pids"]
        .into_iter()
        .filter(|c| !h.has(c))
        .collect();
    if !missing.is_empty() {
        return bad(
            "cgroup v2",
            Level::Fail,
            format!("controllers missing: {}", missing.join(" ")),
            "enable them in the parent's cgroup.subtree_control",
        );
    }
    if cfg.cgroup.driver == "systemd" && !crate::systemd::Manager::booted() {
        return bad(
            "cgroup v2",
            Level::Fail,
            "cgroup.driver is systemd but systemd does not run this node",
            "set cgroup.driver = \"cgroupfs\" (and kubelet's cgroupDriver to match)",
        );
    }
    ok(
        "cgroup v2",
        format!(
            "controllers {} ({} driver)",
            h.controllers.join(" "),
            cfg.cgroup.driver
        ),
    )
}

/// Whether containers' device access can be confined: v2's eBPF device programs, or v1's
/// devices controller; without either only privileged containers start.
fn device_control() -> Finding {
    if crate::runtime::cgroup::Hierarchy::detect().is_some() {
        return ok("device control", "cgroup v2 device programs (eBPF)");
    }
    match crate::runtime::devices::V1::detect() {
        Some(v1) => ok(
            "device control",
            format!("cgroup v1 devices controller at {}", v1.root.display()),
        ),
        None => bad(
            "device control",
            Level::Fail,
            "neither cgroup v2 nor cgroup v1's devices controller is mounted",
            "mount the devices controller (or boot with cgroup v2); until then only privileged containers start",
        ),
    }
}

fn overlay() -> Finding {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
    {
        ok("overlayfs", "available")
    } else {
        bad(
            "overlayfs",
            Level::Fail,
            "not in /proc/filesystems",
            "modprobe overlay (and add it to /etc/modules)",
        )
    }
}

fn idmapped_mounts() -> Finding {
    if crate::sys::has_mount_setattr() {
        ok("idmapped mounts", "mount_setattr available")
    } else {
        bad(
            "idmapped mounts",
            Level::Warn,
            "mount_setattr is not available",
            "pods with their own user namespace need a 5.12 or later kernel",
        )
    }
}

fn seccomp() -> Finding {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if status.lines().any(|l| l.starts_with("Seccomp_filters:"))
        || Path::new("/proc/sys/kernel/seccomp/actions_avail").exists()
    {
        ok("seccomp", "filters available")
    } else {
        bad(
            "seccomp",
            Level::Fail,
            "the kernel has no seccomp filters",
            "use a kernel built with CONFIG_SECCOMP_FILTER: RuntimeDefault profiles need it",
        )
    }
}

fn lsm() -> Finding {
    if crate::sandbox::security::apparmor_enabled() {
        ok("LSM", "AppArmor")
    } else if crate::sandbox::security::selinux_enabled() {
        ok("LSM", "SELinux")
    } else {
        bad(
            "LSM",
            Level::Warn,
            "neither AppArmor nor SELinux is on",
            "pods asking for an AppArmor profile or SELinux label are refused",
        )
    }
}

/// The network list the daemon would use (`network::conflist`, the first in `conf_dir`) and
/// whether its plugins are in `bin_dirs`.
pub fn cni(conf_dir: &Path, bin_dirs: &[PathBuf]) -> Finding {
    let list = match crate::network::conflist::load(conf_dir) {
        Ok(list) => list,
        Err(crate::network::conflist::ConfError::None { .. }) => {
            return bad(
                "CNI",
                Level::Warn,
                format!("no network list in {}", conf_dir.display()),
                "install one (hack/run.sh installs crius's default bridge network); until then only host-network pods get a network and kubelet sees NetworkReady false",
            );
        }
        Err(e) => return bad("CNI", Level::Fail, e.to_string(), "fix or remove the file"),
    };
    let first = &list.file;
    let types = list.types();
    let missing: Vec<&String> = types
        .iter()
        .filter(|t| !bin_dirs.iter().any(|d| d.join(t.as_str()).is_file()))
        .collect();
    if types.is_empty() || !missing.is_empty() {
        return bad(
            "CNI",
            Level::Fail,
            format!(
                "{}: plugins not found in {}: {}",
                first.display(),
                bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                missing
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            "install the CNI plugins (Debian: containernetworking-plugins)",
        );
    }
    ok("CNI", format!("{} ({})", first.display(), types.join(", ")))
}

fn capabilities() -> Finding {
    let has = |c| caps::has_cap(None, caps::CapSet::Effective, c).unwrap_or(false);
    if !has(caps::Capability::CAP_SYS_ADMIN) {
        return bad(
            "capabilities",
            Level::Fail,
            "no CAP_SYS_ADMIN",
            "run the daemon as root with full capabilities",
        );
    }
    if !has(caps::Capability::CAP_SYS_RESOURCE) {
        return bad(
            "capabilities",
            Level::Warn,
            "no CAP_SYS_RESOURCE",
            "oom_score_adj below the daemon's own cannot be set (crius clamps it); grant CAP_SYS_RESOURCE",
        );
    }
    ok("capabilities", "CAP_SYS_ADMIN, CAP_SYS_RESOURCE")
}

fn free_space(root: &Path) -> Finding {
    // The root may not exist yet: measure where it will be.
    let mut at = root.to_path_buf();
    while !at.exists() {
        if !at.pop() {
            break;
        }
    }
    let Ok(st) = nix::sys::statvfs::statvfs(&at) else {
        return bad(
            "free space",
            Level::Warn,
            format!("cannot measure {}", at.display()),
            "check that the root's filesystem is mounted",
        );
    };
    let free = st.blocks_available() * st.fragment_size();
    let gib = free as f64 / (1u64 << 30) as f64;
    let detail = format!("{gib:.1} GiB free under {}", root.display());
    if gib < 1.0 {
        bad(
            "free space",
            Level::Fail,
            detail,
            "free space: images are unpacked here",
        )
    } else if gib < 10.0 {
        bad(
            "free space",
            Level::Warn,
            detail,
            "10 GiB or more leaves room for images",
        )
    } else {
        ok("free space", detail)
    }
}

/// The exit code for a set of findings: 0 all ok, 1 a warning, 2 a failure.
pub fn exit_code(findings: &[Finding]) -> i32 {
    match findings.iter().map(|f| f.level).max() {
        Some(Level::Fail) => 2,
        Some(Level::Warn) => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_and_exit_codes() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.15.0"), Some((5, 15)));
        assert_eq!(kernel_version("garbage"), None);
        let f = |level| Finding {
            item: "x",
            level,
            detail: String::new(),
            fix: String::new(),
        };
        assert_eq!(exit_code(&[f(Level::Ok)]), 0);
        assert_eq!(exit_code(&[f(Level::Ok), f(Level::Warn)]), 1);
        assert_eq!(exit_code(&[f(Level::Fail), f(Level::Warn)]), 2);
    }

    #[test]
    fn signature_policies() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("policy.json");
        assert_eq!(signature_policy(&p).level, Level::Ok);
        std::fs::write(&p, r#"{"default": [{"type": "reject"}]}"#).unwrap();
        assert_eq!(signature_policy(&p).level, Level::Ok);
        std::fs::write(&p, r#"{"default": []}"#).unwrap();
        let f = signature_policy(&p);
        assert_eq!(f.level, Level::Fail);
        assert!(f.detail.contains("default: an empty list"), "{}", f.detail);
    }

    #[test]
    fn cni_lists_and_plugins() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("net.d");
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        let bins = [bin.clone()];
        assert_eq!(cni(&conf, &bins).level, Level::Warn);
        std::fs::write(
            conf.join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        std::fs::write(conf.join("20-b.conflist"), "not json").unwrap();
        let f = cni(&conf, &bins);
        assert_eq!(f.level, Level::Fail);
        assert!(f.detail.contains("bridge portmap"), "{}", f.detail);
        std::fs::write(bin.join("bridge"), "").unwrap();
        std::fs::write(bin.join("portmap"), "").unwrap();
        assert_eq!(cni(&conf, &bins).level, Level::Ok);
        std::fs::write(conf.join("00-broken.conf"), "{").unwrap();
        assert_eq!(cni(&conf, &bins).level, Level::Fail);
    }
}
