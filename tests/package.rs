//! The Debian package (`cargo xtask deb`), installed as an operator would: on the host its
//! files land and go again with `dpkg -P`; in the VM booted with systemd the unit starts, crictl
//! talks to the daemon, and `systemctl restart crius` leaves the pods running.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;

/// The package `cargo xtask deb` built, if any.
fn package() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CRIUS_DEB") {
        return Some(PathBuf::from(p));
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/deb");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    debs.sort();
    debs.pop()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn installable() -> Option<PathBuf> {
    require_root();
    let Some(deb) = package() else {
        missing("the package (cargo xtask deb builds target/deb/crius_*.deb)");
        return None;
    };
    let installed = Command::new("dpkg")
        .args(["-s", "crius"])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed || Path::new("/usr/bin/crius").exists() {
        not_here("crius is already installed on this machine; not touching it");
        return None;
    }
    Some(deb)
}

/// Installed and purged again: the binary, unit, configuration (a conffile), completions and
/// man pages are where Debian puts them, and nothing of them is left afterwards.
#[test]
fn package_installs_and_purges() {
    if Path::new("/run/systemd/system").is_dir() {
        not_here("systemd runs here; package_unit_keeps_pods covers this machine");
        return;
    }
    let Some(deb) = installable() else { return };
    run(Command::new("dpkg").arg("-i").arg(&deb));
    let files = [
        "/usr/bin/crius",
        "/lib/systemd/system/crius.service",
        "/etc/crius/config.toml",
        "/usr/share/bash-completion/completions/crius",
        "/usr/share/zsh/vendor-completions/_crius",
        "/usr/share/fish/vendor_completions.d/crius.fish",
        "/usr/share/man/man1/crius.1.gz",
        "/usr/share/man/man1/crius-check.1.gz",
    ];
    let present: Vec<bool> = files.iter().map(|f| Path::new(f).exists()).collect();
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "crius"]));
    let unit = std::fs::read_to_string("/lib/systemd/system/crius.service").unwrap_or_default();
    let version = Command::new("/usr/bin/crius")
        .arg("config")
        .arg("default")
        .output();
    run(Command::new("dpkg").args(["-P", "crius"]));
    assert!(present.iter().all(|p| *p), "{files:?}: {present:?}");
    assert!(conffiles.contains("/etc/crius/config.toml"), "{conffiles}");
    for want in [
        "Delegate=yes",
        "KillMode=process",
        "LimitNOFILE=",
        "OOMScoreAdjust=",
    ] {
        assert!(unit.contains(want), "{want}: {unit}");
    }
    assert!(version.unwrap().status.success());
    for f in files {
        assert!(!Path::new(f).exists(), "{f} left after purge");
    }
}

/// In a machine run by systemd: the unit starts and serves CRI on the default socket, crictl
/// talks to it, and a restart of the daemon keeps a pod's container running.
#[tokio::test]
#[ignore = "needs systemd as PID 1: cargo xtask test-vm runs it in a VM booted with systemd"]
async fn package_unit_keeps_pods() {
    if !Path::new("/run/systemd/system").is_dir() {
        not_here(
            "systemd is not PID 1 here; cargo xtask test-vm runs this in a VM booted with systemd",
        );
        return;
    }
    let Some(deb) = installable() else { return };
    // The VM's own root is an overlay, which cannot hold overlay upper directories: the
    // daemon's root gets a tmpfs, as a node's /var/lib is a plain filesystem.
    let data = Path::new("/var/lib/crius");
    std::fs::create_dir_all(data).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        data,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1g"),
    )
    .unwrap();
    run(Command::new("dpkg").arg("-i").arg(&deb));
    run(Command::new("systemctl").args(["start", "crius.service"]));
    let socket = Path::new("/run/crius/crius.sock");
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no socket");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let endpoint = format!("unix://{}", socket.display());
    if let Some(crictl) = upstream::need("cri-tools", "crictl") {
        let v = run(Command::new(&crictl).args(["--runtime-endpoint", &endpoint, "version"]));
        assert!(v.contains("RuntimeName:  crius"), "{v}");
    }

    // A pod from a local registry through the packaged daemon's default configuration.
    let reg = Registry::start(None);
    let img = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    reg.push_image("busybox", "test", &img).await.unwrap();
    let image_ref = format!("{}/busybox:test", reg.host());
    let ch = crius::cri::client::channel(socket).unwrap();
    let mut images = crius::cri::client::images(ch.clone());
    images
        .pull_image(cri::PullImageRequest {
            image: Some(spec(&image_ref)),
            ..Default::default()
        })
        .await
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let sb = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "packaged".into(),
            uid: "uid-packaged".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "packaged".into(),
        log_directory: logs.path().display().to_string(),
        ..Default::default()
    };
    let mut rt = crius::cri::client::runtime(ch);
    let pod = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let c = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "sleeper".into(),
                    attempt: 0,
                }),
                image: Some(spec(&image_ref)),
                command: vec!["sleep".into(), "100000".into()],
                log_path: "sleeper.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(sb),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: c.clone(),
    })
    .await
    .unwrap();
    let pid_of = |st: &cri::ContainerStatusResponse| -> i64 {
        let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
        info["pid"].as_i64().unwrap()
    };
    let before = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: c.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let pid = pid_of(&before);

    run(Command::new("systemctl").args(["restart", "crius.service"]));
    let start = Instant::now();
    let after = loop {
        let ch = crius::cri::client::channel(socket).unwrap();
        let got = crius::cri::client::runtime(ch)
            .container_status(cri::ContainerStatusRequest {
                container_id: c.clone(),
                verbose: true,
            })
            .await;
        if let Ok(st) = got {
            break st.into_inner();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "daemon back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        after.status.as_ref().unwrap().state,
        cri::ContainerState::ContainerRunning as i32
    );
    assert_eq!(
        pid_of(&after),
        pid,
        "the same process, kept across the restart"
    );
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    let ch = crius::cri::client::channel(socket).unwrap();
    let mut rt = crius::cri::client::runtime(ch);
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await
    .unwrap();
    run(Command::new("dpkg").args(["-P", "crius"]));
    let _ = nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(data);
    let active = Command::new("systemctl")
        .args(["is-active", "crius.service"])
        .output()
        .unwrap();
    assert!(!active.status.success(), "the unit is stopped on removal");
}
