//! The CRI security context, shown from inside containers: capabilities, no_new_privs,
//! read-only rootfs, masked and read-only paths, seccomp, LSM requests, device access and
//! recursively read-only mounts.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::Path;

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

/// containerd's 14 default capabilities as a /proc mask.
const DEFAULT_CAPS: u64 = 0xa804_25fb;

fn secured(
    env: &PodEnv,
    name: &str,
    cmd: &[&str],
    f: impl FnOnce(&mut cri::LinuxContainerSecurityContext),
) -> cri::ContainerConfig {
    let mut cfg = env.container_config(name, cmd);
    let sc = cfg
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default);
    f(sc);
    cfg
}

fn privileged_pod(env: &PodEnv, name: &str) -> cri::PodSandboxConfig {
    let mut sb = env.sandbox_config(name);
    if let Some(sc) = sb.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.privileged = true;
    }
    sb
}

/// `Name:\tvalue` fields of a /proc status file.
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("{name} not in {status}"))
}

fn mask(status: &str, name: &str) -> u64 {
    u64::from_str_radix(&status_field(status, name), 16).expect("hex mask")
}

async fn sh(env: &PodEnv, id: &str, script: &str) -> (String, String, i32) {
    env.exec(id, &["sh", "-c", script], 20).await.expect("exec")
}

async fn init_status(env: &PodEnv, id: &str) -> String {
    env.exec(id, &["cat", "/proc/1/status"], 10)
        .await
        .expect("exec")
        .0
}

#[tokio::test]
async fn capability_sets_and_no_new_privs() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("caps");
    let pod = env.run_pod(&sb).await.unwrap();

    let c = env
        .run(&pod, &sb, env.container_config("plain", LONG))
        .await;
    let s = init_status(&env, &c).await;
    for set in ["CapPrm", "CapEff", "CapBnd"] {
        assert_eq!(mask(&s, set), DEFAULT_CAPS, "{set}: {s}");
    }
    assert_eq!(mask(&s, "CapInh"), 0);
    assert_eq!(mask(&s, "CapAmb"), 0);
    assert_eq!(status_field(&s, "NoNewPrivs"), "0");
    // An exec'd command gets the same sets.
    let own = env
        .exec(&c, &["cat", "/proc/self/status"], 10)
        .await
        .unwrap()
        .0;
    assert_eq!(mask(&own, "CapEff"), DEFAULT_CAPS);

    let cfg = secured(&env, "adddrop", LONG, |sc| {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: vec!["SYS_ADMIN".into()],
            drop_capabilities: vec!["CAP_NET_RAW".into()],
            ..Default::default()
        });
        sc.no_new_privs = true;
    });
    let c = env.run(&pod, &sb, cfg).await;
    let s = init_status(&env, &c).await;
    let want = (DEFAULT_CAPS | 1 << 21) & !(1 << 13);
    assert_eq!(mask(&s, "CapEff"), want, "{s}");
    assert_eq!(mask(&s, "CapBnd"), want, "{s}");
    assert_eq!(status_field(&s, "NoNewPrivs"), "1");

    let cfg = secured(&env, "none", LONG, |sc| {
        sc.capabilities = Some(cri::Capability {
            drop_capabilities: vec!["ALL".into()],
            ..Default::default()
        });
    });
    let c = env.run(&pod, &sb, cfg).await;
    let s = init_status(&env, &c).await;
    for set in ["CapPrm", "CapEff", "CapBnd", "CapInh", "CapAmb"] {
        assert_eq!(mask(&s, set), 0, "{set}: {s}");
    }

    // A non-root user keeps only its ambient capabilities across exec.
    let cfg = secured(&env, "ambient", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 1000 });
        sc.capabilities = Some(cri::Capability {
            add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
            ..Default::default()
        });
    });
    let c = env.run(&pod, &sb, cfg).await;
    let s = init_status(&env, &c).await;
    assert_eq!(
        status_field(&s, "Uid").split_whitespace().next(),
        Some("1000")
    );
    for set in ["CapAmb", "CapEff", "CapPrm", "CapInh"] {
        assert_eq!(mask(&s, set), 1 << 10, "{set}: {s}");
    }
    assert_eq!(mask(&s, "CapBnd"), DEFAULT_CAPS);
    let cfg = secured(&env, "user", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 1000 });
    });
    let c = env.run(&pod, &sb, cfg).await;
    let s = init_status(&env, &c).await;
    assert_eq!(mask(&s, "CapEff"), 0, "{s}");
    assert_eq!(mask(&s, "CapBnd"), DEFAULT_CAPS, "{s}");

    let bad = secured(&env, "badcap", LONG, |sc| {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: vec!["CAP_FLY".into()],
            ..Default::default()
        });
    });
    let e = env.create(&pod, &sb, bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("add_capabilities"), "{}", e.message());

    // Privileged: every capability the node has, writable /sys, no masks.
    let psb = privileged_pod(&env, "priv");
    let ppod = env.run_pod(&psb).await.unwrap();
    let cfg = secured(&env, "root", LONG, |sc| {
        sc.privileged = true;
        sc.masked_paths = vec!["/proc/timer_list".into()];
        sc.readonly_paths = vec!["/proc/sys".into()];
    });
    let c = env.run(&ppod, &psb, cfg).await;
    let s = init_status(&env, &c).await;
    let node = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(mask(&s, "CapEff"), mask(&node, "CapBnd"), "{s}");
    let (out, _, code) = sh(
        &env,
        &c,
        "grep ' /sys sysfs ' /proc/mounts; wc -c < /proc/timer_list; ls /dev",
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("/sys sysfs rw"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_ne!(lines[1].trim(), "0", "timer_list stays unmasked: {out}");
    // The host's devices, too.
    for dev in ["kmsg", "loop-control", "null"] {
        if Path::new("/dev").join(dev).exists() {
            assert!(out.lines().any(|l| l == dev), "/dev/{dev} missing: {out}");
        }
    }
    let unpriv = secured(&env, "escalate", LONG, |sc| sc.privileged = true);
    let e = env.create(&pod, &sb, unpriv).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("privileged"), "{}", e.message());
    env.remove_pod(&pod).await;
    env.remove_pod(&ppod).await;
}

#[tokio::test]
async fn readonly_rootfs_masked_and_readonly_paths() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("paths");
    let pod = env.run_pod(&sb).await.unwrap();

    let cfg = secured(&env, "ro", LONG, |sc| {
        sc.readonly_rootfs = true;
        sc.masked_paths = vec!["/proc/timer_list".into(), "/sys/firmware".into()];
        sc.readonly_paths = vec!["/proc/sys".into()];
    });
    let c = env.run(&pod, &sb, cfg).await;
    let (_, err, code) = sh(&env, &c, "touch /newfile").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");
    let (_, err, code) = sh(&env, &c, "touch /dev/shm/ok && echo x > /etc/hosts").await;
    assert_ne!(code, 0, "/etc/hosts follows the read-only rootfs");
    assert!(err.contains("Read-only file system"), "{err}");
    let (out, _, _) = sh(
        &env,
        &c,
        "wc -c < /proc/timer_list; ls -A /sys/firmware | wc -l",
    )
    .await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["0", "0"],
        "{out}"
    );
    let (_, err, code) = sh(&env, &c, "echo 1 > /proc/sys/net/ipv4/ip_forward").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");
    let (_, err, code) = sh(&env, &c, "touch /sys/kernel/x").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");

    // Empty lists mask nothing (procMount: Unmasked): the same writes and reads work (the
    // network sysctl with CAP_NET_ADMIN).
    let cfg = secured(&env, "rw", LONG, |sc| {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: vec!["NET_ADMIN".into()],
            ..Default::default()
        });
    });
    let c = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = sh(
        &env,
        &c,
        "touch /newfile && echo 1 > /proc/sys/net/ipv4/ip_forward && wc -c < /proc/timer_list",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_ne!(out.trim(), "0");
    env.remove_pod(&pod).await;
}

fn write_profile(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn seccomp(kind: cri::security_profile::ProfileType, path: &str) -> Option<cri::SecurityProfile> {
    Some(cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: path.into(),
    })
}

/// Whether unprivileged user namespaces can be made here (what the seccomp test uses as the
/// call only RuntimeDefault denies).
fn userns_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/user/max_user_namespaces").is_ok_and(|s| s.trim() != "0")
        && std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone")
            .map(|s| s.trim() == "1")
            .unwrap_or(true)
}

// The deprecated seccomp_profile_path is still what older kubelets send.
#[allow(deprecated)]
#[tokio::test]
async fn seccomp_runtime_default_localhost_and_unconfined() {
    use cri::security_profile::ProfileType;
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("seccomp");
    let pod = env.run_pod(&sb).await.unwrap();
    let profiles = tempfile::tempdir().unwrap();

    // Unset is unconfined, as kubelet expects.
    let c = env
        .run(&pod, &sb, env.container_config("unset", LONG))
        .await;
    assert_eq!(status_field(&init_status(&env, &c).await, "Seccomp"), "0");

    let cfg = secured(&env, "default", LONG, |sc| {
        sc.seccomp = seccomp(ProfileType::RuntimeDefault, "");
    });
    let c = env.run(&pod, &sb, cfg).await;
    let s = init_status(&env, &c).await;
    assert_eq!(status_field(&s, "Seccomp"), "2", "{s}");
    // Exec'd commands run under the same filter.
    let own = env
        .exec(&c, &["cat", "/proc/self/status"], 10)
        .await
        .unwrap()
        .0;
    assert_eq!(status_field(&own, "Seccomp"), "2");
    let (_, err, code) = sh(&env, &c, "unshare -U true").await;
    assert_ne!(code, 0);
    assert!(err.contains("Operation not permitted"), "{err}");
    // Allowed personas pass; the usual tools work.
    let (out, err, code) = sh(&env, &c, "linux32 uname -m; ls / >/dev/null; echo ok").await;
    assert_eq!(code, 0, "{err}");
    assert!(out.ends_with("ok\n"), "{out}");

    let cfg = secured(&env, "unconfined", LONG, |sc| {
        sc.seccomp = seccomp(ProfileType::Unconfined, "");
    });
    let c = env.run(&pod, &sb, cfg).await;
    assert_eq!(status_field(&init_status(&env, &c).await, "Seccomp"), "0");
    if userns_allowed() {
        let (_, err, code) = sh(&env, &c, "unshare -U true").await;
        assert_eq!(code, 0, "{err}");
    }

    // The filter goes on before the user changes without no_new_privs, and after with it.
    for (name, nnp) in [("user", false), ("user-nnp", true)] {
        let cfg = secured(&env, name, LONG, |sc| {
            sc.seccomp = seccomp(ProfileType::RuntimeDefault, "");
            sc.run_as_user = Some(cri::Int64Value { value: 1000 });
            sc.no_new_privs = nnp;
        });
        let c = env.run(&pod, &sb, cfg).await;
        let s = init_status(&env, &c).await;
        assert_eq!(status_field(&s, "Seccomp"), "2", "{s}");
        assert_eq!(status_field(&s, "NoNewPrivs"), if nnp { "1" } else { "0" });
    }

    // A Localhost profile that blocks sethostname, for a container that may otherwise set it.
    let block = write_profile(
        profiles.path(),
        "no-hostname.json",
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [{"names": ["sethostname", "setdomainname"], "action": "SCMP_ACT_ERRNO"}]}"#,
    );
    let with_admin = |name: &str, profile: Option<cri::SecurityProfile>, path: &str| {
        let path = path.to_string();
        secured(&env, name, LONG, move |sc| {
            sc.seccomp = profile;
            sc.seccomp_profile_path = path;
            sc.capabilities = Some(cri::Capability {
                add_capabilities: vec!["SYS_ADMIN".into()],
                ..Default::default()
            });
        })
    };
    let c = env
        .run(
            &pod,
            &sb,
            with_admin("blocked", seccomp(ProfileType::Localhost, &block), ""),
        )
        .await;
    let (_, err, code) = sh(&env, &c, "hostname blocked-name").await;
    assert_ne!(code, 0);
    assert!(err.contains("Operation not permitted"), "{err}");
    let c = env
        .run(
            &pod,
            &sb,
            with_admin("legacy", None, &format!("localhost/{block}")),
        )
        .await;
    let (_, err, code) = sh(&env, &c, "hostname blocked-name").await;
    assert_ne!(code, 0, "the deprecated path field works too: {err}");
    let c = env
        .run(
            &pod,
            &sb,
            with_admin("free", seccomp(ProfileType::Unconfined, ""), ""),
        )
        .await;
    let (_, err, code) = sh(&env, &c, "hostname seccomp-ok && hostname").await;
    assert_eq!(code, 0, "{err}");

    // A privileged container runs without a filter, whatever it asks for.
    let psb = privileged_pod(&env, "seccomp-priv");
    let ppod = env.run_pod(&psb).await.unwrap();
    let cfg = secured(&env, "priv", LONG, |sc| {
        sc.privileged = true;
        sc.seccomp = seccomp(ProfileType::RuntimeDefault, "");
    });
    let c = env.run(&ppod, &psb, cfg).await;
    assert_eq!(status_field(&init_status(&env, &c).await, "Seccomp"), "0");

    // Bad profiles: clear errors naming the field and file, nothing left behind.
    let before = list_names(&env.d.state.join("containers"));
    let missing = profiles.path().join("missing.json").display().to_string();
    let bad_json = write_profile(
        profiles.path(),
        "bad.json",
        "{\n  \"defaultAction\": 7\n}\n",
    );
    let bad_action = write_profile(
        profiles.path(),
        "bad-action.json",
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_SOMETIMES"}]}"#,
    );
    let cases = [
        (
            seccomp(ProfileType::Localhost, &missing),
            "",
            "missing.json",
        ),
        (seccomp(ProfileType::Localhost, &bad_json), "", "line 2"),
        (
            seccomp(ProfileType::Localhost, &bad_action),
            "",
            "syscalls[0].action",
        ),
        (
            seccomp(ProfileType::Localhost, "relative.json"),
            "",
            "absolute",
        ),
        (None, "localhost/relative.json", "absolute"),
        (None, "sometimes", "unknown seccomp profile"),
    ];
    for (i, (profile, path, want)) in cases.into_iter().enumerate() {
        let path = path.to_string();
        let cfg = secured(&env, &format!("bad{i}"), LONG, move |sc| {
            sc.seccomp = profile;
            sc.seccomp_profile_path = path;
        });
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
        assert!(e.message().contains("seccomp"), "{}", e.message());
    }
    assert_eq!(list_names(&env.d.state.join("containers")), before);
    env.remove_pod(&pod).await;
    env.remove_pod(&ppod).await;
}

/// "Copy Fail" (CVE-2026-31431): AF_ALG sockets reach the kernel's crypto code. RuntimeDefault
/// refuses socket(AF_ALG) in every ABI, and i386's socketcall(SYS_SOCKET), whose family lies in
/// memory where a filter cannot see it. The probe (tests/programs/af_alg_socketcall.c) asks
/// three ways: x86_64's socket(2), x32's, and i386's socketcall. On the host, unconfined, each
/// reaches the kernel (a socket, or EAFNOSUPPORT where the kernel has no AF_ALG; ENOSYS for x32
/// where the kernel has no x32); in the container each must be the filter's EPERM, which no
/// kernel answers for these calls itself.
#[tokio::test]
async fn runtime_default_refuses_af_alg_through_socketcall() {
    use cri::security_profile::ProfileType;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("af_alg_socketcall");
    let status = std::process::Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(&bin)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/programs/af_alg_socketcall.c"
        ))
        .status()
        .expect("cc (gcc and libc6-dev: run hack/install-build-deps.sh)");
    assert!(status.success(), "compiling the probe failed");
    let answers = |out: &str| -> (i64, i64, i64) {
        let f: Vec<i64> = out
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(f.len(), 3, "{out:?}");
        (f[0], f[1], f[2])
    };
    let host = std::process::Command::new(&bin).output().unwrap();
    let (direct, x32, multiplexed) = answers(&String::from_utf8_lossy(&host.stdout));
    let reached =
        |r: i64, also: i32| r >= 0 || r == -(libc::EAFNOSUPPORT as i64) || r == -(also as i64);
    assert!(
        reached(direct, libc::EAFNOSUPPORT)
            && reached(x32, libc::ENOSYS)
            && reached(multiplexed, libc::EAFNOSUPPORT),
        "the detector: from the host socket answered {direct}, x32 {x32}, socketcall {multiplexed}"
    );

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("afalg");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = secured(&env, "c", LONG, |sc| {
        sc.seccomp = seccomp(ProfileType::RuntimeDefault, "");
    });
    cfg.mounts = vec![cri::Mount {
        container_path: "/probe".into(),
        host_path: dir.path().display().to_string(),
        readonly: true,
        ..Default::default()
    }];
    let c = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = env
        .exec(&c, &["/probe/af_alg_socketcall"], 10)
        .await
        .unwrap();
    env.remove_pod(&pod).await;
    assert_eq!(code, 0, "{err}");
    let eperm = -(libc::EPERM as i64);
    assert_eq!(
        answers(&out),
        (eperm, eperm, eperm),
        "socket(AF_ALG) in x86_64 and x32, and socketcall(SYS_SOCKET, AF_ALG), must be refused: {out}"
    );
}

fn lsm_present() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
        || std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|s| s.trim() == "Y")
}

#[tokio::test]
/// AppArmor profiles asked for on a node without AppArmor are refused, as containerd refuses
/// them; SELinux options on a node without SELinux are ignored, as containerd and CRI-O ignore
/// them (node e2e's volume specs ask for level `s0` on every node).
async fn apparmor_requests_fail_and_selinux_options_are_ignored_without_them() {
    use cri::security_profile::ProfileType;
    if lsm_present() {
        not_here("this host runs AppArmor or SELinux");
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("lsm");
    let pod = env.run_pod(&sb).await.unwrap();
    let cfg = secured(&env, "aa", LONG, |sc| {
        sc.apparmor = seccomp(ProfileType::Localhost, "my-profile");
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("apparmor") && e.message().contains("not enabled"),
        "{}",
        e.message()
    );
    let cfg = secured(&env, "se", LONG, |sc| {
        sc.selinux_options = Some(cri::SeLinuxOption {
            r#type: "container_t".into(),
            level: "s0:c1,c2".into(),
            ..Default::default()
        });
    });
    let se = env.run(&pod, &sb, cfg).await;
    let (out, _, code) = sh(&env, &se, "echo ran").await;
    assert_eq!((out.trim(), code), ("ran", 0));
    // A malformed option is still refused, naming it.
    let cfg = secured(&env, "se-bad", LONG, |sc| {
        sc.selinux_options = Some(cri::SeLinuxOption {
            r#type: "container_t s0".into(),
            ..Default::default()
        });
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("selinux_options.type"),
        "{}",
        e.message()
    );
    // The runtime default and unconfined need nothing from the host.
    let cfg = secured(&env, "aa-default", LONG, |sc| {
        sc.apparmor = seccomp(ProfileType::RuntimeDefault, "");
    });
    env.run(&pod, &sb, cfg).await;
    // A pod asking for a profile fails too.
    let mut psb = env.sandbox_config("lsm-pod");
    if let Some(sc) = psb.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.apparmor = seccomp(ProfileType::Localhost, "my-profile");
    }
    let e = env.run_pod(&psb).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not enabled"), "{}", e.message());
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn device_nodes_outside_dev_open_nothing() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("nodev");
    let pod = env.run_pod(&sb).await.unwrap();
    let vol = tempfile::tempdir().unwrap();
    let mut cfg = env.container_config("mk", LONG);
    cfg.mounts = vec![cri::Mount {
        container_path: "/vol".into(),
        host_path: vol.path().display().to_string(),
        ..Default::default()
    }];
    let c = env.run(&pod, &sb, cfg).await;
    // CAP_MKNOD makes the node; nodev on the rootfs and on volumes keeps it closed.
    for dir in ["/tmp", "/vol"] {
        let (_, err, code) = sh(
            &env,
            &c,
            &format!("mknod {dir}/zero c 1 5 && head -c 1 {dir}/zero"),
        )
        .await;
        assert_ne!(code, 0, "{dir}");
        assert!(err.contains("Permission denied"), "{dir}: {err}");
    }
    // The container's own /dev works.
    let (out, err, code) = sh(&env, &c, "head -c 3 /dev/zero | wc -c").await;
    assert_eq!((out.trim(), code), ("3", 0), "{err}");
    env.remove_pod(&pod).await;
}

/// Unmounts a test's submount (lazily, so a test that failed mid-way leaves nothing).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A volume directory with a tmpfs mounted at its `sub`: what a bind's recursive options
/// reach and its plain ones do not. The guard unmounts it; it must go before the directory.
fn volume_with_submount() -> (tempfile::TempDir, Unmount) {
    let vol = tempfile::tempdir().unwrap();
    let sub = vol.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(ok.success());
    (vol, Unmount(sub))
}

#[tokio::test]
async fn recursive_read_only_mounts() {
    let env = PodEnv::start().await;
    let status = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let rro = status.runtime_handlers[0]
        .features
        .as_ref()
        .is_some_and(|f| f.recursive_read_only_mounts);
    assert!(rro, "kernel 5.12+ has mount_setattr");

    let sb = env.sandbox_config("rro");
    let pod = env.run_pod(&sb).await.unwrap();
    // A volume with a submount: plain read-only leaves the submount writable, rro does not.
    let (vol, _guard) = volume_with_submount();
    let volume = |rro: bool, propagation: cri::MountPropagation| cri::Mount {
        container_path: "/vol".into(),
        host_path: vol.path().display().to_string(),
        readonly: true,
        recursive_read_only: rro,
        propagation: propagation as i32,
        ..Default::default()
    };
    let mut cfg = env.container_config("ro", LONG);
    cfg.mounts = vec![volume(false, cri::MountPropagation::PropagationPrivate)];
    let c = env.run(&pod, &sb, cfg).await;
    let (_, err, code) = sh(&env, &c, "touch /vol/sub/x").await;
    assert_eq!(
        code, 0,
        "a plain read-only bind leaves submounts writable: {err}"
    );
    let (_, err, code) = sh(&env, &c, "touch /vol/x").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");

    let mut cfg = env.container_config("rro", LONG);
    cfg.mounts = vec![volume(true, cri::MountPropagation::PropagationPrivate)];
    let c = env.run(&pod, &sb, cfg).await;
    let (_, err, code) = sh(&env, &c, "touch /vol/sub/y").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");

    for (name, m, want) in [
        (
            "rw",
            cri::Mount {
                readonly: false,
                ..volume(true, cri::MountPropagation::PropagationPrivate)
            },
            "needs readonly",
        ),
        (
            "slave",
            volume(true, cri::MountPropagation::PropagationHostToContainer),
            "needs private propagation",
        ),
    ] {
        let mut cfg = env.container_config(name, LONG);
        cfg.mounts = vec![m];
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("recursive_read_only") && e.message().contains(want),
            "{}",
            e.message()
        );
    }
    env.remove_pod(&pod).await;
}

/// Bind-mount options (CRI v0.37's Mount.mount_options, KEP-5855): advertised; `noexec` on a
/// volume stops a program there and leaves its submount alone, `rnoexec` reaches the submount
/// too, `nosuid` and `nodev` show in the container's mount table; the host's own mounts keep
/// none of it; ContainerStatus shows the options; an option crius does not apply is refused,
/// naming it.
#[tokio::test]
async fn bind_mount_options() {
    let env = PodEnv::start().await;
    let status = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(
        status.features.as_ref().is_some_and(|f| f.mount_options),
        "{status:?}"
    );
    let sb = env.sandbox_config("mount-options");
    let pod = env.run_pod(&sb).await.unwrap();
    let (vol, _guard) = volume_with_submount();
    let sub = vol.path().join("sub");
    for dir in [vol.path(), sub.as_path()] {
        // busybox runs the applet it is named after.
        std::fs::copy("/bin/busybox", dir.join("true")).unwrap();
    }
    let volume = |at: &str, opts: &[&str]| cri::Mount {
        container_path: at.into(),
        host_path: vol.path().display().to_string(),
        mount_options: opts.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    let mut cfg = env.container_config("c", LONG);
    cfg.mounts = vec![
        volume("/top", &["noexec"]),
        volume("/tree", &["rnoexec", "nosuid", "nodev"]),
    ];
    let c = env.run(&pod, &sb, cfg).await;
    let runs = |path: &str| format!("{path} && echo RAN || echo REFUSED");
    for (path, want) in [
        ("/top/true", "REFUSED"),
        ("/top/sub/true", "RAN"),
        ("/tree/true", "REFUSED"),
        ("/tree/sub/true", "REFUSED"),
    ] {
        let (out, err, _) = sh(&env, &c, &runs(path)).await;
        assert_eq!(out.trim(), want, "{path}: {err}");
    }
    let (table, _, _) = sh(&env, &c, "cat /proc/self/mountinfo").await;
    let options_of = |at: &str| -> String {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some(at))
            .and_then(|l| l.split_whitespace().nth(5))
            .unwrap_or_else(|| panic!("{at} not in {table}"))
            .to_string()
    };
    let tree = options_of("/tree");
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(tree.split(',').any(|t| t == o), "/tree: {tree}");
    }
    assert!(options_of("/tree/sub").split(',').any(|t| t == "noexec"));
    assert!(!options_of("/top/sub").split(',').any(|t| t == "noexec"));
    // The host's mounts are the container's source, never changed.
    let host = std::process::Command::new(vol.path().join("true"))
        .status()
        .unwrap();
    assert!(host.success(), "the host's volume lost exec");
    let shown: Vec<Vec<String>> = env
        .status(&c)
        .await
        .mounts
        .iter()
        .map(|m| m.mount_options.clone())
        .collect();
    assert!(
        shown.contains(&vec!["rnoexec".into(), "nosuid".into(), "nodev".into()]),
        "{shown:?}"
    );
    let mut cfg = env.container_config("bad", LONG);
    cfg.mounts = vec![volume("/bad", &["nosuid", "exec"])];
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("mounts[0].mount_options[1]") && e.message().contains("\"exec\""),
        "{}",
        e.message()
    );
    env.remove_pod(&pod).await;
}

/// Whether AppArmor can confine containers here: enabled in the kernel, with its filesystem
/// mounted and apparmor_parser installed (the VM tier has all three).
fn apparmor_usable() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
        && Path::new("/sys/kernel/security/apparmor/profiles").exists()
        && which("apparmor_parser").is_some()
}

#[tokio::test]
#[ignore = "needs AppArmor: cargo xtask test-vm runs it in a VM with AppArmor on"]
async fn apparmor_profiles_confine_containers() {
    use cri::security_profile::ProfileType;
    if !apparmor_usable() {
        not_here("AppArmor is not usable here; cargo xtask test-vm runs this in a VM");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crius-test-deny-tmp");
    std::fs::write(
        &file,
        "profile crius-test-deny-tmp flags=(attach_disconnected,mediate_deleted) {\n  file,\n  \
         capability,\n  network,\n  signal,\n  ptrace,\n  mount,\n  umount,\n  deny /tmp/** w,\n}\n",
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

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("apparmor");
    let pod = env.run_pod(&sb).await.unwrap();
    let admin = |sc: &mut cri::LinuxContainerSecurityContext| {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: vec!["SYS_ADMIN".into()],
            ..Default::default()
        });
    };

    // Nothing asked for: crius's default profile, for exec'd commands too.
    let c = env
        .run(&pod, &sb, secured(&env, "default", LONG, admin))
        .await;
    let (out, _, _) = sh(&env, &c, "cat /proc/1/attr/current /proc/self/attr/current").await;
    assert_eq!(out, "crius-default (enforce)\ncrius-default (enforce)\n");
    let (_, err, code) = sh(&env, &c, "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t").await;
    assert_ne!(code, 0, "the default profile denies mount");
    assert!(err.contains("Permission denied"), "{err}");

    let c = env
        .run(
            &pod,
            &sb,
            secured(&env, "unconfined", LONG, |sc| {
                admin(sc);
                sc.apparmor = seccomp(ProfileType::Unconfined, "");
            }),
        )
        .await;
    let (out, err, code) = sh(
        &env,
        &c,
        "cat /proc/1/attr/current; mkdir -p /mnt/t && mount -t tmpfs none /mnt/t",
    )
    .await;
    assert_eq!((out.as_str(), code), ("unconfined\n", 0), "{err}");

    let c = env
        .run(
            &pod,
            &sb,
            secured(&env, "local", LONG, |sc| {
                sc.apparmor = seccomp(ProfileType::Localhost, "crius-test-deny-tmp");
            }),
        )
        .await;
    let (out, err, code) = sh(&env, &c, "cat /proc/1/attr/current; touch /tmp/x").await;
    assert_eq!(out, "crius-test-deny-tmp (enforce)\n");
    assert_ne!(code, 0);
    assert!(err.contains("Permission denied"), "{err}");

    let cfg = secured(&env, "missing", LONG, |sc| {
        sc.apparmor = seccomp(ProfileType::Localhost, "crius-no-such-profile");
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not loaded"), "{}", e.message());

    let psb = privileged_pod(&env, "apparmor-priv");
    let ppod = env.run_pod(&psb).await.unwrap();
    let c = env
        .run(
            &ppod,
            &psb,
            secured(&env, "priv", LONG, |sc| sc.privileged = true),
        )
        .await;
    let (out, _, _) = sh(&env, &c, "cat /proc/1/attr/current").await;
    assert_eq!(out, "unconfined\n");
    env.remove_pod(&pod).await;
    env.remove_pod(&ppod).await;
}

fn with_userns(env: &PodEnv, name: &str, u: Option<cri::UserNamespace>) -> cri::PodSandboxConfig {
    let mut sb = env.sandbox_config(name);
    sb.linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .unwrap()
        .userns_options = u;
    sb
}

fn pod_userns(uids: Vec<cri::IdMapping>, gids: Vec<cri::IdMapping>) -> cri::UserNamespace {
    cri::UserNamespace {
        mode: cri::NamespaceMode::Pod as i32,
        uids,
        gids,
    }
}

fn idmap(host: u32, container: u32, len: u32) -> cri::IdMapping {
    cri::IdMapping {
        host_id: host,
        container_id: container,
        length: len,
    }
}

async fn host_pid(env: &PodEnv, id: &str) -> u32 {
    let info = env.d.container_info(id).await;
    info["pid"].as_u64().expect("pid") as u32
}

#[tokio::test]
async fn user_namespaces_map_pods_onto_unprivileged_ids() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let env = PodEnv::start().await;
    let features = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner()
        .runtime_handlers[0]
        .features
        .unwrap();
    assert!(
        features.user_namespaces,
        "kernel 6.3+ idmaps overlayfs and tmpfs"
    );

    // Below a directory only the host's root may search, the pod's processes could not reach
    // their files from inside the user namespace (StartContainer failed on "open net
    // namespace"): the pod is refused up front, naming the directory.
    let top = env.d.dir.path();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sb = with_userns(&env, "unreachable", Some(pod_userns(vec![], vec![])));
    let e = env.run_pod(&sb).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("{} (mode 700)", top.display())),
        "{}",
        e.message()
    );
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();

    // Kubelet's maps: container root is host 983040.
    const BASE: u32 = 15 * 65536;
    let u = pod_userns(vec![idmap(BASE, 0, 65536)], vec![idmap(BASE, 0, 65536)]);
    let sb = with_userns(&env, "userns", Some(u));
    let pod = env.run_pod(&sb).await.unwrap();
    let vol = tempfile::tempdir().unwrap();
    std::fs::write(vol.path().join("from-host"), "x").unwrap();
    let mut cfg = env.container_config("app", LONG);
    cfg.mounts = vec![cri::Mount {
        container_path: "/vol".into(),
        host_path: vol.path().display().to_string(),
        ..Default::default()
    }];
    let c = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = sh(
        &env,
        &c,
        "cat /proc/self/uid_map /proc/self/gid_map; id -u; stat -c %u:%g /etc/passwd /vol/from-host; \
         touch /etc/made-inside /vol/made-inside && echo x > /dev/null && echo ok",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["0", "983040", "65536"], "{out}");
    assert_eq!(lines[1], ["0", "983040", "65536"], "{out}");
    assert_eq!(lines[2], ["0"], "root inside: {out}");
    assert_eq!(
        lines[3],
        ["0:0"],
        "the image's files are root's inside: {out}"
    );
    assert_eq!(lines[4], ["0:0"], "a volume's files too: {out}");
    assert_eq!(lines[5], ["ok"]);
    // Outside, the container is an unprivileged user. Through the idmapped volume, what it
    // made is stored with its IDs inside, as the volume's own files are.
    let pid = host_pid(&env, &c).await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_eq!(
        status_field(&status, "Uid").split_whitespace().next(),
        Some("983040")
    );
    let made = std::fs::metadata(vol.path().join("made-inside")).unwrap();
    assert_eq!((made.uid(), made.gid()), (0, 0));
    // Its capabilities are the namespace's: nothing of the host's can be done with them.
    let (_, err, code) = sh(&env, &c, "mknod /tmp/null c 1 3").await;
    assert_ne!(code, 0);
    assert!(err.contains("Operation not permitted"), "{err}");

    // Another user in the pod maps to its own host ID.
    let cfg = secured(&env, "user", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 1000 });
    });
    let c = env.run(&pod, &sb, cfg).await;
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", host_pid(&env, &c).await)).unwrap();
    assert_eq!(
        status_field(&status, "Uid").split_whitespace().next(),
        Some("984040")
    );
    let cfg = secured(&env, "unmapped", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 70000 });
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not mapped"), "{}", e.message());

    // The pod's status reports the maps.
    let st = env
        .d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let got = st
        .linux
        .unwrap()
        .namespaces
        .unwrap()
        .options
        .unwrap()
        .userns_options
        .unwrap();
    assert_eq!(got.uids, vec![idmap(BASE, 0, 65536)]);

    // Without maps, crius picks a free 65536-ID block per pod.
    let auto = pod_userns(vec![], vec![]);
    let sb1 = with_userns(&env, "auto1", Some(auto.clone()));
    let sb2 = with_userns(&env, "auto2", Some(auto));
    let p1 = env.run_pod(&sb1).await.unwrap();
    let p2 = env.run_pod(&sb2).await.unwrap();
    let c1 = env.run(&p1, &sb1, env.container_config("a", LONG)).await;
    let c2 = env.run(&p2, &sb2, env.container_config("b", LONG)).await;
    let m1 = sh(&env, &c1, "cat /proc/self/uid_map").await.0;
    let m2 = sh(&env, &c2, "cat /proc/self/uid_map").await.0;
    let host = |m: &str| m.split_whitespace().nth(1).unwrap().parse::<u32>().unwrap();
    assert!(host(&m1) >= 524288 && host(&m1) % 65536 == 0, "{m1}");
    assert!(host(&m1).abs_diff(host(&m2)) >= 65536, "{m1} {m2}");

    // What kubelet expects refused.
    let bad = [
        (
            pod_userns(
                vec![idmap(BASE * 2, 0, 1000), idmap(BASE * 2 + 1000, 1000, 1000)],
                vec![idmap(BASE * 2, 0, 65536)],
            ),
            "exactly one mapping",
        ),
        (
            pod_userns(
                vec![idmap(BASE * 2, 1, 65536)],
                vec![idmap(BASE * 2, 0, 65536)],
            ),
            "container ID 0",
        ),
        (
            cri::UserNamespace {
                mode: cri::NamespaceMode::Container as i32,
                ..Default::default()
            },
            "CONTAINER mode is not supported",
        ),
        (
            cri::UserNamespace {
                mode: cri::NamespaceMode::Target as i32,
                ..Default::default()
            },
            "TARGET mode is not supported",
        ),
        (
            pod_userns(
                vec![idmap(BASE + 100, 0, 65536)],
                vec![idmap(BASE + 100, 0, 65536)],
            ),
            "overlap",
        ),
    ];
    for (i, (u, want)) in bad.into_iter().enumerate() {
        let e = env
            .run_pod(&with_userns(&env, &format!("bad{i}"), Some(u)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
        assert!(e.message().contains("userns_options"), "{}", e.message());
    }
    let mut hostnet = with_userns(&env, "hostnet", Some(pod_userns(vec![], vec![])));
    hostnet
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .unwrap()
        .network = cri::NamespaceMode::Node as i32;
    // On the host's network (KEP-5607): the host's interfaces, a read-only sysfs that is the
    // host's, and still an unprivileged user outside with no power over the host's network.
    let hn = env.run_pod(&hostnet).await.unwrap();
    let c = env
        .run(&hn, &hostnet, env.container_config("hn", LONG))
        .await;
    let (out, err, code) = sh(
        &env,
        &c,
        "ls /sys/class/net | sort | tr '\\n' ' '; echo; cat /proc/self/uid_map; \
         touch /sys/class/net/lo/x 2>&1; ip link add crius-x type dummy 2>&1; \
         echo 1 > /proc/sys/net/ipv4/ip_forward 2>&1; echo end",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let mut host_ifaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    host_ifaces.sort();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        host_ifaces,
        "the host's interfaces: {out}"
    );
    assert_ne!(lines[1].split_whitespace().nth(1), Some("0"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(
        !std::path::Path::new("/sys/class/net/crius-x").exists(),
        "the pod made a host interface: {out}"
    );
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", host_pid(&env, &c).await)).unwrap();
    assert_ne!(
        status_field(&status, "Uid").split_whitespace().next(),
        Some("0"),
        "root outside"
    );
    let (_, _, code) = sh(&env, &c, "ls /sys/fs/cgroup/devices").await;
    assert_ne!(code, 0, "the host's cgroup mounts must not come with /sys");

    for p in [pod, p1, p2, hn] {
        env.remove_pod(&p).await;
    }
    // Nothing stays mounted: no rootfs, no idmapped layer, no namespace handle.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = env.d.dir.path().display().to_string();
    let state = env.d.state.display().to_string();
    let left: Vec<&str> = info
        .lines()
        .filter(|l| l.contains(&root) && l.split(' ').nth(4) != Some(state.as_str()))
        .collect();
    assert!(left.is_empty(), "{left:#?}");
}

#[tokio::test]
async fn target_pid_namespace_for_ephemeral_containers() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("target");
    let pod = env.run_pod(&sb).await.unwrap();
    let app = env
        .run(&pod, &sb, env.container_config("app", &["sleep", "4242"]))
        .await;
    let target = |name: &str, id: &str| {
        let id = id.to_string();
        secured(&env, name, LONG, move |sc| {
            sc.namespace_options = Some(cri::NamespaceOption {
                pid: cri::NamespaceMode::Target as i32,
                target_id: id,
                ..Default::default()
            });
        })
    };
    let debug = env.run(&pod, &sb, target("debug", &app)).await;
    // The debugger sees the app as PID 1, and itself beside it.
    let (out, err, code) = sh(
        &env,
        &debug,
        "tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].trim(), "sleep 4242", "{out}");
    assert!(lines[1].trim().parse::<u32>().unwrap() >= 3, "{out}");
    // Stopping the debugger leaves the app running.
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: debug.clone(),
            timeout: 2,
        })
        .await
        .unwrap();
    assert_eq!(
        env.status(&app).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    for (name, id, want) in [
        ("none", "", "needs the target"),
        ("ghost", "0123456789ab", "not found"),
        ("stopped", debug.as_str(), "not running"),
    ] {
        let e = env.create(&pod, &sb, target(name, id)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("target_id") && e.message().contains(want),
            "{want}: {}",
            e.message()
        );
    }
    let sb2 = env.sandbox_config("other");
    let pod2 = env.run_pod(&sb2).await.unwrap();
    let e = env
        .create(&pod2, &sb2, target("cross", &app))
        .await
        .unwrap_err();
    assert!(e.message().contains("another pod"), "{}", e.message());
    env.remove_pod(&pod).await;
    env.remove_pod(&pod2).await;
}

#[tokio::test]
async fn groups_by_supplemental_groups_policy() {
    let env = PodEnv::start().await;
    let status = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(
        status
            .features
            .is_some_and(|f| f.supplemental_groups_policy)
    );
    let sb = env.sandbox_config("groups");
    let pod = env.run_pod(&sb).await.unwrap();
    let with = |name: &str, strict: bool| {
        secured(&env, name, LONG, move |sc| {
            sc.run_as_username = "app".into();
            sc.supplemental_groups = vec![3000];
            if strict {
                sc.supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
            }
        })
    };
    // Merge (the default): the primary group 1000 first (as containerd), the image's
    // /etc/group gives app group 2000, the pod adds 3000; ContainerStatus.user reports exactly
    // the process's groups (critest compares them).
    let c = env.run(&pod, &sb, with("merge", false)).await;
    let s = init_status(&env, &c).await;
    assert_eq!(status_field(&s, "Groups"), "1000 2000 3000", "{s}");
    let st = env.status(&c).await;
    let user = st.user.unwrap().linux.unwrap();
    assert_eq!(
        (user.uid, user.gid, user.supplemental_groups),
        (1000, 1000, vec![1000, 2000, 3000])
    );
    // Strict: the primary group and what the pod asked for.
    let c = env.run(&pod, &sb, with("strict", true)).await;
    let s = init_status(&env, &c).await;
    assert_eq!(status_field(&s, "Groups"), "1000 3000", "{s}");
    let st = env.status(&c).await;
    let user = st.user.unwrap().linux.unwrap();
    assert_eq!(user.supplemental_groups, vec![1000, 3000]);
    let (out, ..) = env.exec(&c, &["id", "-G"], 10).await.unwrap();
    assert_eq!(out, "1000 3000\n", "exec'd processes get the same groups");
    // A group without a user is refused, as kubelet expects.
    let cfg = secured(&env, "grouponly", LONG, |sc| {
        sc.run_as_group = Some(cri::Int64Value { value: 5 });
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("run_as_group"), "{}", e.message());
    env.remove_pod(&pod).await;
}

/// CVE-2026-47262: an image's `/etc/passwd` and `/etc/group` of 64 MiB each (passwd: `app`
/// first, then users up to 64 MiB with `far` last; group: `app`'s group, then one line of
/// 64 MiB naming `app` as a member of 5000) cost the daemon no more than the bounded read: its
/// peak resident memory (VmHWM, reset after the pull) over creating and starting the
/// containers stays within 8 MiB of where it was (3-5 MiB here; 12 MiB while every entry of
/// the megabyte read was parsed and held at once). `app` resolves from the first lines and
/// gets no group from the line the bound cuts; `far`, past it, is refused by name.
#[tokio::test]
async fn huge_passwd_and_group_files_are_read_to_a_bound() {
    let env = PodEnv::start().await;
    let mut passwd =
        b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n".to_vec();
    let filler = b"u:x:7:7::/:/bin/sh\n";
    passwd.extend(filler.repeat((64 << 20) / filler.len()));
    passwd.extend_from_slice(b"far:x:3000:3000::/:/bin/sh\n");
    let mut group = b"root:x:0:\napp:x:1000:\nbig:x:5000:".to_vec();
    group.extend(b"app,".repeat(16 << 20));
    group.push(b'\n');
    let etc = layer(
        &[
            Entry::File("etc/passwd".into(), passwd, 0o644),
            Entry::File("etc/group".into(), group, 0o644),
        ],
        Compress::Gzip,
    );
    let img = image(
        vec![busybox_layer(Compress::Gzip), etc],
        &ImageOpts::default(),
    );
    env.reg.push_image("hugeusers", "1", &img).await.unwrap();
    let name = format!("{}/hugeusers:1", env.reg.host());
    env.d.pull(&name).await.unwrap();
    let sb = env.sandbox_config("hugeusers");
    let pod = env.run_pod(&sb).await.unwrap();
    let as_user = |cname: &str, user: &str| {
        let user = user.to_string();
        let mut cfg = secured(&env, cname, LONG, move |sc| sc.run_as_username = user);
        cfg.image = Some(spec(&name));
        cfg
    };
    let pid = env.d.pid().unwrap();
    // 5 resets the peak resident size to the current one.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = rss_kib(pid);
    let c = env.run(&pod, &sb, as_user("app", "app")).await;
    let e = env
        .create(&pod, &sb, as_user("far", "far"))
        .await
        .unwrap_err();
    let peak = status_kib(pid, "VmHWM");
    println!(
        "64 MiB passwd and group: the daemon's peak grew {} KiB over {before} KiB",
        peak - before
    );
    assert!(
        peak - before < 8 << 10,
        "the daemon's peak grew {} KiB reading them",
        peak - before
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("\"far\""), "{}", e.message());
    let s = init_status(&env, &c).await;
    assert_eq!(status_field(&s, "Uid"), "1000\t1000\t1000\t1000", "{s}");
    assert_eq!(status_field(&s, "Groups"), "1000", "{s}");
    env.remove_pod(&pod).await;
}

/// CVE-2026-15809: a newline in a user name or in HOME must not become a line of the
/// container's `/etc/passwd` or `/etc/group`. crius writes neither file (the image's are the
/// container's, byte for byte); a `run_as_username` with a newline names no user and is
/// refused naming it; a HOME with one is the process's environment as given, nothing more.
#[tokio::test]
async fn newlines_in_user_names_and_home_write_no_lines() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("newlines");
    let pod = env.run_pod(&sb).await.unwrap();
    let injected = "evil:x:0:0:evil:/:/bin/sh";
    let name = format!("app\n{injected}");
    let cfg = secured(&env, "byname", LONG, move |sc| sc.run_as_username = name);
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("security_context") && e.message().contains(injected),
        "{}",
        e.message()
    );
    let home = format!("/home/x\n{injected}");
    let mut cfg = secured(&env, "byid", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 4242 });
        sc.run_as_group = Some(cri::Int64Value { value: 4242 });
    });
    cfg.envs.push(cri::KeyValue {
        key: "HOME".into(),
        value: home.clone().into(),
    });
    let c = env.run(&pod, &sb, cfg).await;
    let cfg = secured(&env, "nohome", LONG, |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 4242 });
    });
    let plain = env.run(&pod, &sb, cfg).await;
    let image_file = |path: &str| -> String {
        busybox_entries()
            .into_iter()
            .find_map(|e| match e {
                Entry::File(p, data, _) if p == path => Some(String::from_utf8(data).unwrap()),
                _ => None,
            })
            .unwrap()
    };
    for id in [&c, &plain] {
        for file in ["etc/passwd", "etc/group"] {
            let (out, err, code) = env
                .exec(id, &["cat", &format!("/{file}")], 10)
                .await
                .unwrap();
            assert_eq!(code, 0, "{err}");
            assert_eq!(out, image_file(file), "/{file} is the image's");
        }
    }
    let (out, _, _) = sh(&env, &c, "printf %s \"$HOME\"").await;
    assert_eq!(out, home, "HOME as given");
    let (out, _, _) = sh(&env, &plain, "printf %s \"$HOME\"").await;
    assert_eq!(out, "/", "no passwd entry: HOME is /");
    env.remove_pod(&pod).await;
}

/// How long a process may take to show the label its exec gives it.
const LABEL_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

fn label_of(pid: impl std::fmt::Display) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/attr/current"))
        .unwrap()
        .trim_end_matches(['\0', '\n'])
        .to_string()
}

/// A file's SELinux label, as coreutils shows it.
fn file_label(path: &Path) -> String {
    let out = std::process::Command::new("stat")
        .args(["-c", "%C"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Only where SELinux runs with a policy: `cargo xtask test-vm` boots a VM with SELinux
/// (permissive, Debian's reference policy plus the two container types of `hack/selinux`).
#[tokio::test]
#[ignore = "needs SELinux: cargo xtask test-vm runs it in a VM booted with SELinux"]
async fn selinux_labels_processes_and_files() {
    if !Path::new("/sys/fs/selinux/enforce").exists() {
        not_here(
            "SELinux is not enabled here; cargo xtask test-vm runs this test in a VM booted with it",
        );
        return;
    }
    let env = PodEnv::start().await;
    // The pod's level; user, role and type from the policy's lxc_contexts.
    let mut sb = env.sandbox_config("se");
    sb.linux
        .as_mut()
        .unwrap()
        .security_context
        .get_or_insert_with(Default::default)
        .selinux_options = Some(cri::SeLinuxOption {
        level: "s0:c5,c6".into(),
        ..Default::default()
    });
    let pod = env.run_pod(&sb).await.unwrap();
    let pod_label = "system_u:system_r:container_t:s0:c5,c6";
    assert_eq!(label_of(env.pause_pid(&pod).await), pod_label);

    // A container without options of its own takes the pod's labels: its processes, exec'd
    // commands, its root filesystem and its tmpfs mounts.
    let vol = tempfile::tempdir().unwrap();
    std::fs::write(vol.path().join("data"), "x").unwrap();
    // A link in the volume to a file outside: the link is labelled, never what it points at.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "x").unwrap();
    let outside_label = file_label(&outside.path().join("secret"));
    std::os::unix::fs::symlink(outside.path(), vol.path().join("link")).unwrap();
    let mut cfg = env.container_config("inherit", LONG);
    cfg.mounts.push(cri::Mount {
        container_path: "/vol".into(),
        host_path: vol.path().display().to_string(),
        selinux_relabel: true,
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;
    let pid = host_pid(&env, &c).await;
    assert_eq!(label_of(pid), pod_label);
    let (out, _, code) = sh(&env, &c, "cat /proc/self/attr/current").await;
    assert_eq!(
        (code, out.trim_end_matches(['\0', '\n'])),
        (0, pod_label),
        "an exec'd command"
    );
    let files = "system_u:object_r:container_file_t:s0:c5,c6";
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    assert_eq!(file_label(&root.join("bin")), files, "the root filesystem");
    assert_eq!(file_label(&root.join("dev")), files, "a tmpfs mount");
    assert_eq!(
        file_label(&vol.path().join("data")),
        files,
        "a relabelled volume"
    );
    assert_eq!(
        file_label(&outside.path().join("secret")),
        outside_label,
        "relabelling does not follow links"
    );
    // The pod's own files and shm carry its file label too.
    let (out, _, _) = sh(&env, &c, "cat /proc/self/mountinfo").await;
    assert!(
        out.lines()
            .any(|l| l.contains(" /dev/shm ") && l.contains("container_file_t")),
        "{out}"
    );

    // Options of its own: its level and type win.
    let c2 = env
        .run(
            &pod,
            &sb,
            secured(&env, "own", LONG, |sc| {
                sc.selinux_options = Some(cri::SeLinuxOption {
                    user: "system_u".into(),
                    role: "system_r".into(),
                    r#type: "container_t".into(),
                    level: "s0:c7,c8".into(),
                });
            }),
        )
        .await;
    assert_eq!(
        label_of(host_pid(&env, &c2).await),
        "system_u:system_r:container_t:s0:c7,c8"
    );

    // A privileged pod and container keep the runtime's label, as with containerd.
    let mut psb = privileged_pod(&env, "se-privileged");
    psb.linux
        .as_mut()
        .unwrap()
        .security_context
        .get_or_insert_with(Default::default)
        .selinux_options = sb
        .linux
        .as_ref()
        .unwrap()
        .security_context
        .as_ref()
        .unwrap()
        .selinux_options
        .clone();
    let ppod = env.run_pod(&psb).await.unwrap();
    assert!(!label_of(env.pause_pid(&ppod).await).contains("container_t"));
    let c3 = env
        .run(
            &ppod,
            &psb,
            secured(&env, "privileged", LONG, |sc| sc.privileged = true),
        )
        .await;
    assert!(!label_of(host_pid(&env, &c3).await).contains("container_t"));
    env.remove_pod(&ppod).await;

    // Labels the policy does not know, and relabelling a system directory, are refused.
    let e = env
        .create(
            &pod,
            &sb,
            secured(&env, "bad", LONG, |sc| {
                sc.selinux_options = Some(cri::SeLinuxOption {
                    r#type: "no_such_t".into(),
                    ..Default::default()
                });
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("selinux_options") && e.message().contains("no_such_t"),
        "{}",
        e.message()
    );
    let mut cfg = env.container_config("etc", LONG);
    cfg.mounts.push(cri::Mount {
        container_path: "/host-etc".into(),
        host_path: "/etc".into(),
        selinux_relabel: true,
        ..Default::default()
    });
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("selinux_relabel"), "{}", e.message());

    // A pod without a level gets a pair of categories of its own, shared by its containers.
    let mut sb2 = env.sandbox_config("se-random");
    sb2.linux
        .as_mut()
        .unwrap()
        .security_context
        .get_or_insert_with(Default::default)
        .selinux_options = Some(cri::SeLinuxOption {
        r#type: "container_t".into(),
        ..Default::default()
    });
    let pod2 = env.run_pod(&sb2).await.unwrap();
    let l2 = label_of(env.pause_pid(&pod2).await);
    assert!(
        l2.starts_with("system_u:system_r:container_t:s0:c") && l2.contains(','),
        "{l2}"
    );
    let c4 = env.run(&pod2, &sb2, env.container_config("c", LONG)).await;
    assert_eq!(label_of(host_pid(&env, &c4).await), l2);
    env.remove_pod(&pod).await;
    env.remove_pod(&pod2).await;

    // runtime.selinux: every pod that is not privileged is labelled, each with its own level.
    let env = PodEnv::start_with("[runtime]\nselinux = true\n").await;
    let mut levels = std::collections::HashSet::new();
    for i in 0..3 {
        let mut sb = env.sandbox_config(&format!("plain-{i}"));
        if i == 1 {
            // A shared PID namespace: the pod's PID 1 is a child of the holder, labelled too.
            sb.linux
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap()
                .namespace_options = Some(cri::NamespaceOption {
                pid: cri::NamespaceMode::Pod as i32,
                ..Default::default()
            });
        }
        let p = env.run_pod(&sb).await.unwrap();
        let l = label_of(env.pause_pid(&p).await);
        assert!(l.starts_with("system_u:system_r:container_t:s0:c"), "{l}");
        assert!(levels.insert(l), "a level handed out twice");
        if i < 2 {
            let c = env.run(&p, &sb, env.container_config("c", LONG)).await;
            assert!(label_of(host_pid(&env, &c).await).contains("container_t"));
        }
        env.remove_pod(&p).await;
    }

    // A configured pause image: its process takes the pod's label when it is exec'd (the label
    // is set before the holder moves into the image's root, which has no /proc).
    let pause = image(
        vec![busybox_layer(Compress::Gzip)],
        &ImageOpts {
            entrypoint: &["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            cmd: &[],
            user: "65535:65535",
            ..Default::default()
        },
    );
    env.reg.push_image("pause", "3.10", &pause).await.unwrap();
    let host = env.reg.host();
    let d = Daemon::start(&format!(
        "[runtime]\nselinux = true\nsandbox_image = \"{host}/pause:3.10\"\n"
    ));
    let imaged = PodEnv {
        image: env.image.clone(),
        reg: env.reg,
        d,
        logs: tempfile::tempdir().unwrap(),
    };
    imaged.d.pull(&imaged.image).await.unwrap();
    let sb = imaged.sandbox_config("imaged");
    let p = imaged.run_pod(&sb).await.unwrap();
    // The holder takes its label with the exec of the image's command, right after the answer.
    let holder = imaged.pause_pid(&p).await;
    let t = std::time::Instant::now();
    let l = loop {
        let l = label_of(holder);
        if l.starts_with("system_u:system_r:container_t:s0:c") || t.elapsed() > LABEL_WAIT {
            break l;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(l.starts_with("system_u:system_r:container_t:s0:c"), "{l}");
    let c = imaged
        .run(&p, &sb, imaged.container_config("c", LONG))
        .await;
    assert_eq!(label_of(host_pid(&imaged, &c).await), l);
    imaged.remove_pod(&p).await;
}
