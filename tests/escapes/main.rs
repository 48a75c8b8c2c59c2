//! Replays of runc's published container escapes against crius, one module per CVE class. Each
//! test first shows that its detector fires where the escape is real (on the host itself, with
//! the same probe), then runs the escape's mechanism against crius and expects nothing to get
//! out. Races are bounded in count and time, and each test says what it covers. The VM tier runs
//! them again where AppArmor and SELinux are on (`cargo xtask test-vm escapes`), so the halves
//! that bypass an LSM label are shown there.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

#[path = "../common/mod.rs"]
mod common;

mod binary;
mod capabilities;
mod console;
mod descriptors;
mod dev_links;
mod devices;
mod masked;
mod procfs;
mod volumes;
mod working_dir;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use crius::cri::v1 as cri;

/// A secret on the host that no container may read or change: a random token in a file of mode
/// 0600, alone in a fresh directory.
pub struct Marker {
    pub dir: tempfile::TempDir,
    pub token: String,
}

impl Marker {
    pub fn create() -> Marker {
        let dir = tempfile::Builder::new()
            .prefix("crius-escape")
            .tempdir()
            .unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let token = format!("host-secret-{:x}-{}", nanos, std::process::id());
        std::fs::write(dir.path().join("secret"), &token).unwrap();
        std::fs::set_permissions(
            dir.path().join("secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        Marker { dir, token }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    pub fn mode(&self) -> u32 {
        std::fs::symlink_metadata(self.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// What is in the directory besides the secret.
    pub fn strangers(&self) -> Vec<String> {
        list_names(self.dir.path())
            .into_iter()
            .filter(|n| n != "secret")
            .collect()
    }
}

/// `path` reached from any working directory by climbing: `../` far past the root, then the
/// absolute path, so it reads the host's file from wherever on the host the directory is.
pub fn climb(path: &Path) -> String {
    format!(
        "{}{}",
        "../".repeat(40),
        path.strip_prefix("/").unwrap().display()
    )
}

/// Runs a busybox shell script on the host (the same probe a container runs), in `cwd`.
pub fn host_sh(script: &str, cwd: &Path) -> String {
    let out = std::process::Command::new("/bin/busybox")
        .args(["sh", "-c", script])
        .current_dir(cwd)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubelet's default masked and read-only paths (what it sends for `procMount: Default`).
pub fn kubelet_default_paths(sc: &mut cri::LinuxContainerSecurityContext) {
    sc.masked_paths = [
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
    ]
    .map(String::from)
    .to_vec();
    sc.readonly_paths = [
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    ]
    .map(String::from)
    .to_vec();
}

/// A container as kubelet sends it (default masked and read-only paths), running `script`.
pub fn container(env: &PodEnv, name: &str, script: &str) -> cri::ContainerConfig {
    let mut cfg = env.container_config(name, &["sh", "-c", script]);
    kubelet_default_paths(security(&mut cfg));
    cfg
}

/// The container's security context, made if missing.
pub fn security(cfg: &mut cri::ContainerConfig) -> &mut cri::LinuxContainerSecurityContext {
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

/// A host directory bind-mounted at `at`, read-write.
pub fn volume(host: &Path, at: &str) -> cri::Mount {
    cri::Mount {
        container_path: at.into(),
        host_path: host.display().to_string(),
        ..Default::default()
    }
}

/// A pod whose containers share one PID namespace.
pub fn shared_pid_pod(env: &PodEnv, name: &str) -> cri::PodSandboxConfig {
    let mut sb = env.sandbox_config(name);
    namespace_options(&mut sb).pid = cri::NamespaceMode::Pod as i32;
    sb
}

/// The same for a container of such a pod.
pub fn in_shared_pid(cfg: &mut cri::ContainerConfig) {
    security(cfg)
        .namespace_options
        .get_or_insert_with(Default::default)
        .pid = cri::NamespaceMode::Pod as i32;
}

/// Creates, starts and waits for a container that ends by itself; its log (empty when create
/// or start is refused, which is how a runtime may hold) and how it went.
pub async fn run_to_end(
    env: &PodEnv,
    pod: &str,
    sb: &cri::PodSandboxConfig,
    cfg: cri::ContainerConfig,
) -> (String, Result<(), tonic::Status>) {
    let name = cfg.metadata.as_ref().unwrap().name.clone();
    let id = match env.create(pod, sb, cfg).await {
        Ok(id) => id,
        Err(e) => return (String::new(), Err(e)),
    };
    let started = env.start_container(&id).await;
    if started.is_ok() {
        env.wait_exit(&id, Duration::from_secs(60)).await;
    }
    let log = env.log(sb, &name);
    let _ = env
        .d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await;
    (log, started)
}

/// The host pid of a container's init.
pub async fn host_pid(env: &PodEnv, id: &str) -> u32 {
    env.d.container_info(id).await["pid"].as_u64().expect("pid") as u32
}

/// Whether AppArmor confines containers here (the VM tier): on, with apparmor_parser.
pub fn apparmor_usable() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
        && Path::new("/sys/kernel/security/apparmor/profiles").exists()
        && which("apparmor_parser").is_some()
}

/// The AppArmor profile the LSM halves apply: everything allowed (mount too, as an attacker
/// with CAP_SYS_ADMIN needs) but writing under /tmp, so a process shows whether it is confined
/// by trying `touch /tmp/probe`. Loaded once; its name.
pub fn escape_profile() -> &'static str {
    static LOADED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    const NAME: &str = "crius-test-escape";
    LOADED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(NAME);
        std::fs::write(
            &file,
            format!(
                "profile {NAME} flags=(attach_disconnected,mediate_deleted) {{\n  file,\n  \
                 capability,\n  network,\n  signal,\n  ptrace,\n  mount,\n  umount,\n  \
                 pivot_root,\n  deny /tmp/** w,\n}}\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new("apparmor_parser")
            .arg("-r")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    NAME
}

/// A security profile of `kind` (AppArmor or seccomp).
pub fn profile(kind: cri::security_profile::ProfileType, name: &str) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: name.into(),
    }
}

/// Whether SELinux runs here (the VM tier's SELinux boot).
pub fn selinux_on() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
}

/// Pushes an image of busybox plus `extra` layers' entries, with `opts`; its reference.
pub async fn push_image(env: &PodEnv, name: &str, extra: &[Entry], opts: &ImageOpts<'_>) -> String {
    let mut layers = vec![busybox_layer(Compress::Gzip)];
    if !extra.is_empty() {
        layers.push(layer(extra, Compress::Gzip));
    }
    let img = image(layers, opts);
    env.reg.push_image(name, "test", &img).await.unwrap();
    let reference = format!("{}/{name}:test", env.reg.host());
    env.d.pull(&reference).await.unwrap();
    reference
}
