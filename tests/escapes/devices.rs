//! Host devices (no CVE: what a runtime without a device controller gives away). A default
//! container keeps CAP_MKNOD and its `/dev` is a tmpfs without nodev, so only the cgroup device
//! controller (v2's eBPF program, v1's devices cgroup) stands between it and a node it makes for
//! a host disk, the host's console or /dev/kmsg. Covered: a host block device (a loop device
//! over a file holding a token) read through a node the container made, by its init and by an
//! exec'd command; host character devices opened read-write; a given device's permissions
//! (`r` only) held; the default devices still usable; a privileged container still reaching the
//! device (the control); a container that may mount moving itself to the controller's root; and
//! on a v1 node, the devices cgroup gone with its container.

use crate::common::*;
use crate::*;

/// A loop device over a file that starts with a token; detached on drop.
struct Loop {
    dev: String,
    _file: tempfile::NamedTempFile,
    token: String,
}

impl Loop {
    fn attach() -> Loop {
        let file = tempfile::Builder::new()
            .prefix("crius-escape-disk")
            .tempfile()
            .unwrap();
        let token = format!("host-disk-{}", std::process::id());
        let mut data = token.clone().into_bytes();
        data.resize(1 << 20, 0);
        std::fs::write(file.path(), &data).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Loop {
            dev,
            _file: file,
            token,
        }
    }

    /// Its major and minor numbers.
    fn numbers(&self) -> (u64, u64) {
        numbers(&self.dev)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .status();
    }
}

/// A script that makes a node for `kind major:minor` in /dev (a tmpfs the container may make
/// nodes in) and reads its first bytes; it prints what it read or `DENIED`.
fn read_node(kind: char, (major, minor): (u64, u64)) -> String {
    format!(
        "mknod /dev/probe {kind} {major} {minor} 2>/dev/null; \
         head -c 64 /dev/probe 2>/dev/null || echo DENIED; rm -f /dev/probe"
    )
}

/// The numbers of a host device node.
fn numbers(path: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(path).unwrap().rdev();
    (libc::major(rdev) as u64, libc::minor(rdev) as u64)
}

/// Whether this node confines devices with cgroup v1 (no v2 at /sys/fs/cgroup).
fn v1_node() -> bool {
    crius::runtime::cgroup::Hierarchy::detect().is_none()
}

#[tokio::test]
async fn default_container_reads_no_host_block_device() {
    let disk = Loop::attach();
    // The detector: the same probe on the host reads the token through a node of its own.
    let scratch = tempfile::tempdir().unwrap();
    let host = host_sh(
        &read_node('b', disk.numbers()).replace("/dev/probe", "probe"),
        scratch.path(),
    );
    assert!(host.contains(&disk.token), "the detector: {host:?}");

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("blk");
    let pod = env.run_pod(&sb).await.unwrap();
    let script = read_node('b', disk.numbers());
    let (log, started) = run_to_end(&env, &pod, &sb, container(&env, "init", &script)).await;
    started.unwrap();
    let c = env
        .run(&pod, &sb, container(&env, "exec", "sleep 100000"))
        .await;
    let (out, _, _) = env.exec(&c, &["sh", "-c", &script], 10).await.unwrap();
    // The rules live exactly as long as the container: a v1 cgroup goes with it.
    let parent = std::path::Path::new("/sys/fs/cgroup/devices").join(&env.d.cgroup_parent);
    let devices_dir = parent.join(&c);
    let had_cgroup = devices_dir.exists();
    let rt = env.d.runtime();
    let _ = rt
        .clone()
        .stop_container(cri::StopContainerRequest {
            container_id: c.clone(),
            timeout: 0,
        })
        .await;
    rt.clone()
        .remove_container(cri::RemoveContainerRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap();
    let gone = !devices_dir.exists();
    env.remove_pod(&pod).await;
    // With its last container, crius's own parent goes too.
    let parent_gone = !parent.exists();
    assert!(
        !log.contains(&disk.token) && log.contains("DENIED"),
        "the init read the host's disk: {log:?}"
    );
    assert!(
        !out.contains(&disk.token) && out.contains("DENIED"),
        "an exec read the host's disk: {out:?}"
    );
    if v1_node() {
        assert!(had_cgroup, "no devices cgroup at {}", devices_dir.display());
        assert!(gone, "{} outlived its container", devices_dir.display());
        assert!(parent_gone, "{} outlived its containers", parent.display());
    }
}

#[tokio::test]
async fn default_container_opens_no_host_character_device() {
    // Writable from a node the container makes, unless something stops it: the kernel log,
    // the host's console, a virtual terminal, KVM.
    let targets: Vec<(&str, (u64, u64))> = ["/dev/kmsg", "/dev/console", "/dev/tty1", "/dev/kvm"]
        .into_iter()
        .filter(|p| std::path::Path::new(p).exists())
        .map(|p| (p, numbers(p)))
        .collect();
    assert!(!targets.is_empty());
    // The detector: the host opens /dev/kmsg for writing through a node of its own.
    let scratch = tempfile::tempdir().unwrap();
    let (kmaj, kmin) = numbers("/dev/kmsg");
    let host = host_sh(
        &format!("mknod probe c {kmaj} {kmin} && : > probe && echo OPENED"),
        scratch.path(),
    );
    assert!(host.contains("OPENED"), "the detector: {host:?}");

    let script: String = targets
        .iter()
        .map(|(p, (major, minor))| {
            format!(
                "mknod /dev/probe c {major} {minor} 2>/dev/null; \
                 if true 3<>/dev/probe 2>/dev/null; then echo 'OPENED {p}'; fi; \
                 rm -f /dev/probe; "
            )
        })
        .collect::<String>()
        + "echo END";
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("chr");
    let pod = env.run_pod(&sb).await.unwrap();
    let (log, started) = run_to_end(&env, &pod, &sb, container(&env, "c", &script)).await;
    env.remove_pod(&pod).await;
    started.unwrap();
    assert!(log.contains("END"), "the probe did not run: {log:?}");
    assert!(!log.contains("OPENED"), "host devices opened: {log:?}");
}

#[tokio::test]
async fn given_device_keeps_its_permissions() {
    let disk = Loop::attach();
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("given");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = container(
        &env,
        "c",
        "head -c 64 /dev/disk0 || echo READ-DENIED; \
         if true 3<>/dev/disk0 2>/dev/null; then echo WRITE-OPENED; fi; echo END",
    );
    cfg.devices = vec![cri::Device {
        container_path: "/dev/disk0".into(),
        host_path: disk.dev.clone(),
        permissions: "r".into(),
    }];
    let (log, started) = run_to_end(&env, &pod, &sb, cfg).await;
    env.remove_pod(&pod).await;
    started.unwrap();
    assert!(
        log.contains(&disk.token),
        "a given device must read: {log:?}"
    );
    assert!(log.contains("END"), "{log:?}");
    assert!(
        !log.contains("WRITE-OPENED"),
        "a device given read-only opened for writing: {log:?}"
    );
}

#[tokio::test]
async fn default_devices_still_work_and_privileged_reaches_all() {
    let disk = Loop::attach();
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("defaults");
    let pod = env.run_pod(&sb).await.unwrap();
    let (log, started) = run_to_end(
        &env,
        &pod,
        &sb,
        container(
            &env,
            "c",
            "echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c \
             && : > /dev/full; head -c 1 /dev/random | wc -c; echo END",
        ),
    )
    .await;
    started.unwrap();
    env.remove_pod(&pod).await;
    assert_eq!(
        log_lines(&log, "stdout"),
        ["4", "4", "1", "END"],
        "/dev/zero, /dev/urandom, /dev/full, /dev/random: {log:?}"
    );

    // The control: a privileged container is given every device, as in runc.
    let mut psb = env.sandbox_config("privileged");
    psb.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .privileged = true;
    let ppod = env.run_pod(&psb).await.unwrap();
    let mut cfg = container(&env, "p", &read_node('b', disk.numbers()));
    security(&mut cfg).privileged = true;
    let (plog, started) = run_to_end(&env, &ppod, &psb, cfg).await;
    env.remove_pod(&ppod).await;
    started.unwrap();
    assert!(
        plog.contains(&disk.token),
        "a privileged container reads the device: {plog:?}"
    );
}

/// A container allowed to mount (CAP_SYS_ADMIN added, not privileged) mounts the device
/// controller's hierarchy and moves itself to its root, then reads the host disk: its cgroup
/// namespace makes its own cgroup that root, so the move changes nothing.
#[tokio::test]
async fn a_container_that_may_mount_stays_in_its_devices_cgroup() {
    let disk = Loop::attach();
    let (kind, opts) = if v1_node() {
        ("cgroup", "-o devices")
    } else {
        ("cgroup2", "")
    };
    let script = format!(
        "mkdir -p /tmp/cg && mount -t {kind} {opts} none /tmp/cg && echo MOUNTED; \
         echo $$ > /tmp/cg/cgroup.procs && echo MOVED; {}",
        read_node('b', disk.numbers())
    );
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("mounter");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = container(&env, "c", &script);
    security(&mut cfg).capabilities = Some(cri::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let (log, started) = run_to_end(&env, &pod, &sb, cfg).await;
    env.remove_pod(&pod).await;
    started.unwrap();
    // Under AppArmor (the VM's boot) crius-default refuses the mount itself.
    if !apparmor_usable() {
        assert!(
            log.contains("MOUNTED"),
            "the attack needs its mount: {log:?}"
        );
    }
    assert!(
        !log.contains(&disk.token) && log.contains("DENIED"),
        "the container left its devices cgroup: {log:?}"
    );
}
