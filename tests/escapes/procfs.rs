//! Procfs writes redirected: the runtime writes a process's `oom_score_adj` and its LSM label
//! (`attr/exec`, `attr/apparmor/exec`) through `/proc`; whatever the container puts there
//! instead receives them, and the process runs unconfined.
//! - CVE-2025-52881: mounts under `/proc` (a volume at `/proc/self`), and a container with
//!   CAP_SYS_ADMIN that mounts its own fake `/proc` before a command is exec'd in it.
//! - CVE-2019-16884: a volume over `/proc` through a path that an image's symlink sends there.
//! - CVE-2023-28642: the image's `/proc` is a symlink.
//!
//! Covered: each write must reach the real process (its `oom_score_adj` read on the host; under
//! AppArmor, in the VM tier, the profile confines it: `touch /tmp/probe` is denied), and the fake
//! files must stay empty.

use crate::common::*;
use crate::*;

const OOM: i64 = 400;

/// Asks for `OOM` and, where AppArmor confines containers, the escape profile.
fn confined(cfg: &mut cri::ContainerConfig) {
    cfg.linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
        .oom_score_adj = OOM;
    if apparmor_usable() {
        security(cfg).apparmor = Some(profile(
            cri::security_profile::ProfileType::Localhost,
            escape_profile(),
        ));
    }
    if selinux_on() {
        security(cfg).selinux_options = Some(cri::SeLinuxOption {
            level: "s0:c7,c8".into(),
            ..Default::default()
        });
    }
}

/// The label the SELinux half asks for (the policy's container type, `confined`'s level).
const SELINUX_LABEL: &str = "container_t:s0:c7,c8";

/// The writes reached the container's init (on the host) and an exec'd command: its
/// `oom_score_adj`, and under AppArmor its confinement.
async fn assert_applied(env: &PodEnv, id: &str, what: &str) {
    let pid = host_pid(env, id).await;
    let real = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    assert_eq!(
        real.trim(),
        OOM.to_string(),
        "{what}: the init's oom_score_adj"
    );
    if apparmor_usable() {
        let label = std::fs::read_to_string(format!("/proc/{pid}/attr/current")).unwrap();
        assert!(
            label.starts_with(escape_profile()),
            "{what}: init label {label}"
        );
        let (_, err, code) = env
            .exec(id, &["sh", "-c", "touch /tmp/probe"], 10)
            .await
            .unwrap();
        assert_ne!(code, 0, "{what}: an exec'd command is confined ({err})");
    }
    if selinux_on() {
        let label = std::fs::read_to_string(format!("/proc/{pid}/attr/current")).unwrap();
        assert!(label.contains(SELINUX_LABEL), "{what}: init label {label}");
    }
}

/// A fake procfs tree in `dir`: `self` and `thread-self` lead to `x`, which holds empty
/// `oom_score_adj`, `attr/exec`, `attr/current` and `attr/apparmor/exec`.
fn fake_proc_script(dir: &str) -> String {
    format!(
        "mkdir -p {dir}/x/attr/apparmor && touch {dir}/x/oom_score_adj {dir}/x/attr/exec \
         {dir}/x/attr/current {dir}/x/attr/apparmor/exec && ln -sfn x {dir}/self && \
         ln -sfn x {dir}/thread-self"
    )
}

const FAKE_FILES: &str = "x/oom_score_adj x/attr/exec x/attr/current x/attr/apparmor/exec";

#[tokio::test]
async fn cve_2025_52881_procfs_writes_redirected() {
    // The detector: where /proc is not the real one, a write to /proc/self lands in the fake
    // file (on the host, in a mount namespace of its own).
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "/bin/busybox", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /proc && {} && echo {OOM} > /proc/self/oom_score_adj && \
             cat /proc/x/oom_score_adj",
            fake_proc_script("/proc")
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), OOM.to_string());

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("procfs");
    let pod = env.run_pod(&sb).await.unwrap();
    let vol = tempfile::tempdir().unwrap();

    // Mounts under /proc are refused by name, but for the files lxcfs emulates.
    for (i, dest) in [
        "/proc",
        "/proc/self",
        "/proc/1",
        "/proc/thread-self/attr",
        "/proc/sys/kernel/core_pattern",
        "/proc/./self/../self",
    ]
    .iter()
    .enumerate()
    {
        let mut cfg = container(&env, &format!("under{i}"), "true");
        cfg.mounts.push(volume(vol.path(), dest));
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{dest}: {e:?}");
        assert!(
            e.message().contains("mounts[0].container_path") && e.message().contains("/proc"),
            "{dest}: {}",
            e.message()
        );
    }
    let cpuinfo = vol.path().join("cpuinfo");
    std::fs::write(&cpuinfo, "processor\t: emulated\n").unwrap();
    let mut cfg = container(&env, "lxcfs", "head -1 /proc/cpuinfo");
    cfg.mounts.push(cri::Mount {
        container_path: "/proc/cpuinfo".into(),
        host_path: cpuinfo.display().to_string(),
        readonly: true,
        ..Default::default()
    });
    let (log, started) = run_to_end(&env, &pod, &sb, cfg).await;
    started.unwrap();
    assert!(log.contains("processor\t: emulated"), "{log}");

    // A container that may mount puts a fake /proc over its own; then a command is exec'd.
    let mut cfg = container(
        &env,
        "fake",
        &format!(
            "mount -t tmpfs none /proc && {} && touch /proc/ready && sleep 100000",
            fake_proc_script("/proc")
        ),
    );
    confined(&mut cfg);
    let sc = security(&mut cfg);
    sc.capabilities = Some(cri::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    sc.seccomp = Some(profile(cri::security_profile::ProfileType::Unconfined, ""));
    let c = env.run(&pod, &sb, cfg).await;
    let start = std::time::Instant::now();
    while env
        .exec(&c, &["test", "-e", "/proc/ready"], 10)
        .await
        .unwrap()
        .2
        != 0
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "fake /proc"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    if apparmor_usable() {
        let (_, err, code) = env
            .exec(&c, &["sh", "-c", "touch /tmp/probe"], 10)
            .await
            .unwrap();
        assert_ne!(code, 0, "the exec'd command runs confined ({err})");
    }
    let (fake, _, _) = env
        .exec(
            &c,
            &["sh", "-c", &format!("cd /proc && cat {FAKE_FILES}")],
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        fake, "",
        "the runtime wrote into the container's fake /proc"
    );
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn cve_2019_16884_a_volume_over_proc_through_an_image_symlink() {
    let env = PodEnv::start().await;
    let reference = push_image(
        &env,
        "procvol",
        &[
            Entry::Symlink("evil".into(), "/proc".into()),
            Entry::Symlink("evilself".into(), "proc/self".into()),
        ],
        &ImageOpts::default(),
    )
    .await;
    let sb = env.sandbox_config("procvol");
    let pod = env.run_pod(&sb).await.unwrap();
    for at in ["/evil", "/evilself"] {
        // The volume holds a fake procfs tree for the writes to land in.
        let vol = tempfile::tempdir().unwrap();
        let dir = vol.path().display().to_string();
        host_sh(&fake_proc_script(&dir), vol.path());
        let mut cfg = container(&env, &format!("v{}", at.len()), "sleep 100000");
        cfg.image = Some(spec(&reference));
        cfg.mounts.push(volume(vol.path(), at));
        confined(&mut cfg);
        let id = env.create(&pod, &sb, cfg).await.unwrap();
        match env.start_container(&id).await {
            // Refused: it names the mount.
            Err(e) => assert!(e.message().contains(at), "{at}: {}", e.message()),
            Ok(()) => assert_applied(&env, &id, at).await,
        }
        let fake = host_sh(&format!("cat {FAKE_FILES} x/oom_score_adj"), vol.path());
        assert_eq!(fake, "", "{at}: the runtime wrote into the volume");
        let written: Vec<String> = list_names(vol.path())
            .into_iter()
            .filter(|n| !["x", "self", "thread-self"].contains(&n.as_str()))
            .collect();
        assert!(
            written.is_empty(),
            "{at}: files made in the volume {written:?}"
        );
    }
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn cve_2023_28642_proc_is_a_symlink_in_the_image() {
    let env = PodEnv::start().await;
    let mut entries = vec![
        Entry::Symlink("proc".into(), "fakeproc".into()),
        Entry::Dir("fakeproc".into()),
        Entry::Dir("fakeproc/x".into()),
        Entry::Dir("fakeproc/x/attr".into()),
        Entry::Dir("fakeproc/x/attr/apparmor".into()),
        Entry::Symlink("fakeproc/self".into(), "x".into()),
        Entry::Symlink("fakeproc/thread-self".into(), "x".into()),
    ];
    for f in FAKE_FILES.split(' ') {
        entries.push(Entry::File(format!("fakeproc/{f}"), Vec::new(), 0o644));
    }
    let reference = push_image(&env, "procsymlink", &entries, &ImageOpts::default()).await;
    let sb = env.sandbox_config("procsym");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = container(&env, "sym", "sleep 100000");
    cfg.image = Some(spec(&reference));
    confined(&mut cfg);
    let id = env.create(&pod, &sb, cfg).await.unwrap();
    match env.start_container(&id).await {
        Err(e) => assert!(e.message().contains("/proc"), "{}", e.message()),
        Ok(()) => {
            assert_applied(&env, &id, "init").await;
            let (out, _, _) = env
                .exec(&id, &["cat", "/proc/self/oom_score_adj"], 10)
                .await
                .unwrap();
            assert_eq!(out.trim(), OOM.to_string(), "an exec'd command");
            if selinux_on() {
                let (label, _, _) = env
                    .exec(&id, &["cat", "/proc/self/attr/current"], 10)
                    .await
                    .unwrap();
                assert!(label.contains(SELINUX_LABEL), "an exec'd command: {label}");
            }
        }
    }
    env.remove_pod(&pod).await;
}
