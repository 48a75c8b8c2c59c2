//! The security profiles of a CRI security context: which seccomp filter a container gets
//! (RuntimeDefault, a Localhost profile file, or none), compiled once per distinct profile and
//! cached; and AppArmor and SELinux, which are applied where the host has them and refused
//! clearly where it has not, so that nothing runs unconfined after a profile was asked for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use oci_spec::runtime::LinuxSeccomp;
use sha2::{Digest as _, Sha256};

use super::config::{self, ProfileType};
use super::{Error, invalid};
use crate::runtime::{seccomp, selinux};

/// The seccomp profile a container asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum SeccompChoice {
    Unconfined,
    RuntimeDefault,
    Localhost(PathBuf),
}

/// The profile from the `seccomp` field, or the deprecated `seccomp_profile_path`; neither set
/// means unconfined, as kubelet expects.
pub fn seccomp_choice(
    profile: Option<&config::SecurityProfile>,
    path: &str,
    field: &str,
) -> Result<SeccompChoice, Error> {
    if let Some(p) = profile {
        let f = format!("{field}.seccomp");
        return match p.profile_type {
            ProfileType::RuntimeDefault => Ok(SeccompChoice::RuntimeDefault),
            ProfileType::Unconfined => Ok(SeccompChoice::Unconfined),
            ProfileType::Localhost => localhost(&p.localhost_ref, &format!("{f}.localhost_ref")),
        };
    }
    let f = format!("{field}.seccomp_profile_path");
    match path {
        "" | "unconfined" => Ok(SeccompChoice::Unconfined),
        "runtime/default" | "docker/default" => Ok(SeccompChoice::RuntimeDefault),
        p => match p.strip_prefix("localhost/") {
            Some(rest) => localhost(rest, &f),
            None => Err(invalid(&f, format!("unknown seccomp profile {p:?}"))),
        },
    }
}

fn localhost(path: &str, field: &str) -> Result<SeccompChoice, Error> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(invalid(
            field,
            format!("{path:?} must be an absolute path to a profile on the node"),
        ));
    }
    Ok(SeccompChoice::Localhost(p.to_path_buf()))
}

/// A resolved and compiled filter, shared by every container with the same profile.
#[derive(Debug)]
pub struct Filter {
    pub profile: LinuxSeccomp,
    /// The program as the bundle stores it.
    pub program: Vec<u8>,
    pub flags: u32,
}

/// Compiled filters by the digest of their resolved profile.
#[derive(Default)]
pub struct Filters {
    compiled: Mutex<HashMap<[u8; 32], Arc<Filter>>>,
}

impl Filters {
    /// The filter for a container with bounding set `bounding`, or none (unconfined or
    /// privileged).
    pub fn resolve(
        &self,
        choice: &SeccompChoice,
        bounding: &[String],
        field: &str,
    ) -> Result<Option<Arc<Filter>>, Error> {
        let profile = match choice {
            SeccompChoice::Unconfined => return Ok(None),
            SeccompChoice::RuntimeDefault => seccomp::runtime_default(bounding),
            SeccompChoice::Localhost(path) => {
                seccomp::load(path, bounding).map_err(|e| invalid(field, e.to_string()))?
            }
        };
        let json = serde_json::to_vec(&profile).map_err(|e| invalid(field, e.to_string()))?;
        let key: [u8; 32] = Sha256::digest(&json).into();
        let mut compiled = self
            .compiled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(f) = compiled.get(&key) {
            return Ok(Some(f.clone()));
        }
        let c = seccomp::compile(&profile).map_err(|e| invalid(field, e.to_string()))?;
        let f = Arc::new(Filter {
            profile,
            program: seccomp::bpf::to_bytes(&c.program),
            flags: c.flags,
        });
        compiled.insert(key, f.clone());
        Ok(Some(f))
    }
}

/// Whether the host runs AppArmor.
pub fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
}

/// Whether the host runs SELinux.
pub fn selinux_enabled() -> bool {
    selinux::enabled()
}

/// The AppArmor profile name a container runs under, if any. On a host with AppArmor, nothing
/// asked for means crius's default, as with containerd; when that cannot be loaded (no
/// `apparmor_parser`) the container runs unconfined with a warning, since no profile was asked
/// for. RuntimeDefault asked for explicitly must be applied or refused; on a host without
/// AppArmor it means no profile. A named profile on a host without AppArmor, or one the host has
/// not loaded, is refused.
pub fn apparmor_profile(
    profile: Option<&config::SecurityProfile>,
    deprecated: &str,
    privileged: bool,
    state: &Path,
    field: &str,
) -> Result<Option<String>, Error> {
    let unset = profile.is_none() && deprecated.is_empty();
    let (kind, name, f) = match profile {
        // critest (and containerd) accept the deprecated field's `localhost/` form here too.
        Some(p) => (
            p.profile_type,
            p.localhost_ref
                .strip_prefix("localhost/")
                .unwrap_or(&p.localhost_ref)
                .to_string(),
            format!("{field}.apparmor"),
        ),
        None => {
            let f = format!("{field}.apparmor_profile");
            match deprecated {
                "" | "runtime/default" => (ProfileType::RuntimeDefault, String::new(), f),
                "unconfined" => (ProfileType::Unconfined, String::new(), f),
                p => match p.strip_prefix("localhost/") {
                    Some(n) => (ProfileType::Localhost, n.to_string(), f),
                    None => return Err(invalid(&f, format!("unknown AppArmor profile {p:?}"))),
                },
            }
        }
    };
    match kind {
        ProfileType::Unconfined => Ok(None),
        ProfileType::RuntimeDefault if privileged || !apparmor_enabled() => Ok(None),
        ProfileType::RuntimeDefault => match load_default_apparmor(state) {
            Ok(()) => Ok(Some(APPARMOR_DEFAULT.to_string())),
            Err(e) if unset => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        error = %e,
                        "AppArmor is enabled but crius's default profile cannot be loaded; \
                         containers that ask for no profile run unconfined"
                    );
                });
                Ok(None)
            }
            Err(e) => Err(invalid(&f, e)),
        },
        ProfileType::Localhost => {
            if name.is_empty() {
                return Err(invalid(&f, "a Localhost profile needs its name"));
            }
            if !apparmor_enabled() {
                return Err(invalid(
                    &f,
                    format!(
                        "AppArmor profile {name:?} asked for, but AppArmor is not enabled on this node"
                    ),
                ));
            }
            let loaded = std::fs::read_to_string("/sys/kernel/security/apparmor/profiles")
                .unwrap_or_default();
            if !loaded
                .lines()
                .any(|l| l.rsplit_once(" (").is_some_and(|(n, _)| n == name))
            {
                return Err(invalid(
                    &f,
                    format!("AppArmor profile {name:?} is not loaded on this node"),
                ));
            }
            Ok(Some(name))
        }
    }
}

/// The AppArmor profile crius applies by default on hosts that run AppArmor.
pub const APPARMOR_DEFAULT: &str = "crius-default";

/// crius's default AppArmor profile: everything a container normally does, but no mounts, no
/// writes to the kernel's knobs under /proc and /sys (bar the container's own cgroup tree), no
/// reads of kernel memory or firmware, and ptrace and signals only among its own kind.
fn apparmor_default_text() -> String {
    let name = APPARMOR_DEFAULT;
    format!(
        r#"#include <tunables/global>

profile {name} flags=(attach_disconnected,mediate_deleted) {{
  #include <abstractions/base>

  network,
  capability,
  file,
  umount,
  signal (send,receive) peer={name},
  signal (receive) peer=unconfined,
  ptrace (trace,read,tracedby,readby) peer={name},

  deny mount,
  deny pivot_root,
  deny @{{PROC}}/sysrq-trigger rwklx,
  deny @{{PROC}}/kcore rwklx,
  deny @{{PROC}}/kmem rwklx,
  deny @{{PROC}}/mem rwklx,
  deny @{{PROC}}/sys/kernel/core_pattern w,
  deny @{{PROC}}/sys/kernel/modprobe w,
  deny @{{PROC}}/sys/vm/** w,
  deny @{{PROC}}/sys/fs/** w,
  deny @{{PROC}}/sys/dev/** w,
  deny @{{PROC}}/sys/debug/** w,
  deny /sys/firmware/** rwklx,
  deny /sys/kernel/security/** rwklx,
  deny /sys/kernel/debug/** rwklx,
  deny /sys/module/** wklx,
  deny /sys/devices/** wklx,
  deny /sys/class/** wklx,
  deny /sys/bus/** wklx,
  deny /sys/power/** wklx,
}}
"#
    )
}

/// Why crius's default AppArmor profile could not be loaded (kept for the daemon's life, so
/// the causes are shared).
#[derive(Debug, Clone, thiserror::Error)]
enum AppArmorLoadError {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("loading crius's default AppArmor profile needs apparmor_parser: {source}")]
    NoParser { source: Arc<std::io::Error> },
    #[error("apparmor_parser {path}: {stderr}")]
    Refused { path: PathBuf, stderr: String },
}

/// Loads crius's default AppArmor profile unless the host already has it: written under the
/// state directory and handed to `apparmor_parser`, once per daemon.
fn load_default_apparmor(state: &Path) -> Result<(), AppArmorLoadError> {
    static LOADED: std::sync::OnceLock<Result<(), AppArmorLoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let loaded = std::fs::read_to_string("/sys/kernel/security/apparmor/profiles")
                .unwrap_or_default();
            if loaded
                .lines()
                .any(|l| l.starts_with(&format!("{APPARMOR_DEFAULT} (")))
            {
                return Ok(());
            }
            let dir = state.join("apparmor");
            let file = dir.join(APPARMOR_DEFAULT);
            std::fs::create_dir_all(&dir)
                .and_then(|_| {
                    crate::atomic::write(&file, apparmor_default_text().as_bytes(), 0o644)
                })
                .map_err(|e| AppArmorLoadError::Write {
                    path: file.clone(),
                    source: Arc::new(e),
                })?;
            let out = std::process::Command::new("apparmor_parser")
                .arg("-Kr")
                .arg(&file)
                .output()
                .map_err(|e| AppArmorLoadError::NoParser {
                    source: Arc::new(e),
                })?;
            if !out.status.success() {
                return Err(AppArmorLoadError::Refused {
                    path: file,
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            Ok(())
        })
        .clone()
}

/// A pod's or container's SELinux labels: its processes' and its files' (the OCI
/// `process.selinuxLabel` and `linux.mountLabel`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SelinuxLabels {
    pub process: String,
    pub mount: String,
}

impl SelinuxLabels {
    /// The MCS/MLS level both labels carry.
    pub fn level(&self) -> &str {
        selinux::parts(&self.process).map_or("", |p| p[3])
    }
}

/// The labels SELinux options ask for, made as containerd makes them: the policy's container
/// contexts (`lxc_contexts`) with the given user, role, type and level put in; without a level,
/// `inherit`'s (the pod's, for a container) or a random pair of categories that `taken` does
/// not hold. Without options, no labels of its own (`inherit`'s) unless `by_default`. On a node
/// without SELinux the options are ignored (a warning logged), as containerd and CRI-O do:
/// kubelet and the conformance suites send them to every kind of node, and there is no label to
/// run under. Refused when the loaded policy does not know a label.
pub fn selinux_labels(
    options: Option<&config::SelinuxOptions>,
    inherit: Option<&SelinuxLabels>,
    by_default: bool,
    taken: &dyn Fn(&str) -> bool,
    field: &str,
) -> Result<Option<SelinuxLabels>, Error> {
    let none = config::SelinuxOptions::default();
    let o = match options.filter(|o| {
        !(o.user.is_empty() && o.role.is_empty() && o.kind.is_empty() && o.level.is_empty())
    }) {
        Some(o) => o,
        None if by_default => &none,
        None => return Ok(inherit.cloned()),
    };
    let f = format!("{field}.selinux_options");
    for (name, v) in [
        ("user", &o.user),
        ("role", &o.role),
        ("type", &o.kind),
        ("level", &o.level),
    ] {
        let bad = |c: char| c.is_whitespace() || c == '"' || (name != "level" && c == ':');
        if v.chars().any(bad) {
            return Err(invalid(
                &format!("{f}.{name}"),
                format!("{v:?} is not a valid SELinux {name}"),
            ));
        }
    }
    if !selinux::enabled() {
        tracing::warn!(
            field = %f,
            user = %o.user,
            role = %o.role,
            r#type = %o.kind,
            level = %o.level,
            "SELinux options ignored: SELinux is not enabled on this node"
        );
        return Ok(None);
    }
    let (process, file) = selinux::container_defaults();
    let (Some(p), Some(fl)) = (selinux::parts(&process), selinux::parts(&file)) else {
        return Err(invalid(
            &f,
            format!("the policy's container contexts {process:?} and {file:?} are malformed"),
        ));
    };
    let pick = |given: &str, default: &str| {
        if given.is_empty() {
            default.to_string()
        } else {
            given.to_string()
        }
    };
    let level = match (o.level.as_str(), inherit) {
        ("", Some(i)) if !i.level().is_empty() => i.level().to_string(),
        ("", _) => random_level(taken)?,
        (l, _) => l.to_string(),
    };
    let labels = SelinuxLabels {
        process: format!(
            "{}:{}:{}:{level}",
            pick(&o.user, p[0]),
            pick(&o.role, p[1]),
            pick(&o.kind, p[2])
        ),
        mount: format!("{}:{}:{}:{level}", pick(&o.user, fl[0]), fl[1], fl[2]),
    };
    for (what, ctx) in [("process", &labels.process), ("file", &labels.mount)] {
        if !selinux::valid(ctx) {
            return Err(invalid(
                &f,
                format!("the {what} label {ctx:?} is not valid in the loaded SELinux policy"),
            ));
        }
    }
    Ok(Some(labels))
}

/// Two distinct categories out of 1024, as container runtimes give each pod (`s0:cA,cB`), not
/// one `taken` holds.
fn random_level(taken: &dyn Fn(&str) -> bool) -> Result<String, Error> {
    for _ in 0..1000 {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).map_err(|e| Error::Io {
            path: "getrandom".into(),
            source: std::io::Error::other(e),
        })?;
        let a = u16::from_le_bytes([b[0], b[1]]) % 1024;
        let mut c = u16::from_le_bytes([b[2], b[3]]) % 1023;
        if c >= a {
            c += 1;
        }
        let level = format!("s0:c{},c{}", a.min(c), a.max(c));
        if !taken(&level) {
            return Ok(level);
        }
    }
    Err(invalid(
        "selinux_options.level",
        "no free pair of SELinux categories left",
    ))
}

/// Paths whose relabelling would break the node, refused as go-selinux refuses them (where they
/// really lead: `/usr/..` is `/`).
pub fn relabel_allowed(path: &str) -> bool {
    let p = std::fs::canonicalize(path).unwrap_or_else(|_| Path::new(path).to_path_buf());
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    ![
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/etc/passwd",
        "/etc/pki",
        "/etc/shadow",
        "/home",
        "/lib",
        "/lib64",
        "/media",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
        "/var/lib",
        "/var/log",
        "/var/spool",
    ]
    .iter()
    .any(|s| p == Path::new(s))
        && home.is_none_or(|h| p != h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(e: Error) -> String {
        match e {
            Error::Invalid { field, .. } => field,
            e => panic!("{e}"),
        }
    }

    fn reason(e: &Error) -> String {
        match e {
            Error::Invalid { reason, .. } => reason.clone(),
            e => panic!("{e}"),
        }
    }

    fn prof(t: ProfileType, r: &str) -> config::SecurityProfile {
        config::SecurityProfile {
            profile_type: t,
            localhost_ref: r.into(),
        }
    }

    #[test]
    fn seccomp_choices() {
        let f = "sc";
        assert_eq!(
            seccomp_choice(None, "", f).unwrap(),
            SeccompChoice::Unconfined
        );
        assert_eq!(
            seccomp_choice(None, "runtime/default", f).unwrap(),
            SeccompChoice::RuntimeDefault
        );
        assert_eq!(
            seccomp_choice(None, "localhost//p/x.json", f).unwrap(),
            SeccompChoice::Localhost("/p/x.json".into())
        );
        assert!(seccomp_choice(None, "bogus", f).is_err());
        let p = prof(ProfileType::RuntimeDefault, "");
        assert_eq!(
            seccomp_choice(Some(&p), "", f).unwrap(),
            SeccompChoice::RuntimeDefault
        );
        let p = prof(ProfileType::Localhost, "rel.json");
        let e = seccomp_choice(Some(&p), "", f).unwrap_err();
        assert_eq!(field(e), "sc.seccomp.localhost_ref");
    }

    #[test]
    fn filters_are_cached() {
        let filters = Filters::default();
        let caps = vec!["CHOWN".to_string()];
        let a = filters
            .resolve(&SeccompChoice::RuntimeDefault, &caps, "f")
            .unwrap()
            .unwrap();
        let b = filters
            .resolve(&SeccompChoice::RuntimeDefault, &caps, "f")
            .unwrap()
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let other = filters
            .resolve(
                &SeccompChoice::RuntimeDefault,
                &["SYS_ADMIN".to_string()],
                "f",
            )
            .unwrap()
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &other));
        assert!(
            filters
                .resolve(&SeccompChoice::Unconfined, &caps, "f")
                .unwrap()
                .is_none()
        );
        let e = filters
            .resolve(
                &SeccompChoice::Localhost("/nonexistent.json".into()),
                &caps,
                "f.ref",
            )
            .unwrap_err();
        assert!(reason(&e).contains("/nonexistent.json"), "{}", reason(&e));
        assert_eq!(field(e), "f.ref");
    }

    #[test]
    fn apparmor_requests_fail_and_selinux_options_are_ignored_without_them() {
        if apparmor_enabled() || selinux_enabled() {
            return;
        }
        let p = prof(ProfileType::Localhost, "my-profile");
        let e = apparmor_profile(Some(&p), "", false, Path::new("/tmp"), "c").unwrap_err();
        assert!(reason(&e).contains("not enabled"), "{}", reason(&e));
        // The `localhost/` form is the same profile.
        let p = prof(ProfileType::Localhost, "localhost/my-profile");
        let e = apparmor_profile(Some(&p), "", false, Path::new("/tmp"), "c").unwrap_err();
        assert!(
            reason(&e).contains("\"my-profile\" asked for"),
            "{}",
            reason(&e)
        );
        assert_eq!(
            apparmor_profile(None, "", false, Path::new("/tmp"), "c").unwrap(),
            None
        );
        let p = prof(ProfileType::RuntimeDefault, "");
        assert_eq!(
            apparmor_profile(Some(&p), "", false, Path::new("/tmp"), "c").unwrap(),
            None
        );
        let e = apparmor_profile(None, "localhost/x", false, Path::new("/tmp"), "c").unwrap_err();
        assert_eq!(field(e), "c.apparmor_profile");
        let o = config::SelinuxOptions {
            level: "s0:c1,c2".into(),
            ..Default::default()
        };
        let free = |_: &str| false;
        assert_eq!(
            selinux_labels(Some(&o), None, false, &free, "c").unwrap(),
            None
        );
        assert_eq!(
            selinux_labels(
                Some(&config::SelinuxOptions::default()),
                None,
                false,
                &free,
                "c"
            )
            .unwrap(),
            None
        );
        let pod = SelinuxLabels {
            process: "u:r:t:s0:c1,c2".into(),
            mount: "u:object_r:f:s0:c1,c2".into(),
        };
        assert_eq!(pod.level(), "s0:c1,c2");
        assert_eq!(
            selinux_labels(None, Some(&pod), false, &free, "c").unwrap(),
            Some(pod)
        );
    }

    #[test]
    fn random_levels_are_two_categories() {
        for _ in 0..200 {
            let l = random_level(&|l| l == "s0:c1,c2").unwrap();
            let (a, b) = l
                .strip_prefix("s0:c")
                .and_then(|r| r.split_once(",c"))
                .unwrap();
            let (a, b): (u16, u16) = (a.parse().unwrap(), b.parse().unwrap());
            assert!(a < b && b < 1024, "{l}");
        }
        assert!(!relabel_allowed("/etc") && !relabel_allowed("/"));
        assert!(relabel_allowed("/var/lib/kubelet/pods/x/volumes"));
    }

    #[test]
    fn default_apparmor_profile_names_itself() {
        let t = apparmor_default_text();
        assert!(t.contains("profile crius-default flags="));
        assert!(t.contains("deny mount,"));
        assert!(t.contains("@{PROC}/sysrq-trigger"));
    }
}
