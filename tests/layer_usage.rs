//! A writable layer's disk usage read from its project quota: the daemon's container layers on
//! an ext4 file system made with project quotas (a loop device the test makes), where each
//! layer gets a project ID and ContainerStats reads its bytes and inodes in one call; a layer
//! grown since the last call shows at once (a walk is cached for 10 s).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use crius::cri::v1 as cri;

const LONG: &[&str] = &["sleep", "100000"];

/// An ext4 image with project quotas mounted at a directory; unmounted (and its loop device
/// freed) when dropped.
struct QuotaFs {
    at: PathBuf,
}

impl QuotaFs {
    fn mount(image: &Path, at: &Path) -> Result<QuotaFs, String> {
        let run = |cmd: &str, args: &[&str]| -> Result<(), String> {
            let out = Command::new(cmd)
                .args(args)
                .output()
                .map_err(|e| format!("{cmd}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let img = image.to_str().unwrap();
        std::fs::File::create(image)
            .and_then(|f| f.set_len(128 << 20))
            .map_err(|e| e.to_string())?;
        run(
            "mkfs.ext4",
            &["-q", "-F", "-O", "quota,project", "-I", "256", img],
        )?;
        // The VM's kernel has loop as a module that nothing loaded yet.
        let _ = run("modprobe", &["loop"]);
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        run("mount", &["-o", "loop,prjquota", img, at.to_str().unwrap()])?;
        Ok(QuotaFs {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for QuotaFs {
    fn drop(&mut self) {
        // A loop mount made by mount(8) frees its device when unmounted.
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

#[tokio::test]
#[ignore = "project quotas: the host's kernel has no CONFIG_QUOTA; runs in the VM tier"]
async fn writable_layers_measured_by_project_quota() {
    let mut env = PodEnv::start().await;
    let disk = tempfile::tempdir().unwrap();
    // The container layers' directory, on the quota file system from the next start on.
    env.d.kill9();
    let layers = env.d.root.join("containers");
    // Run where the kernel keeps quotas (the VM tier): not having them here is a failure.
    let fs = QuotaFs::mount(&disk.path().join("ext4.img"), &layers).unwrap();
    env.d.spawn();
    assert!(
        env.d
            .log_text()
            .contains("writable layers are measured by project quota"),
        "{}",
        env.d.log_text()
    );
    let sb = env.sandbox_config("quota");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c", LONG)).await;
    let stats = || {
        let mut rt = env.d.runtime();
        let id = c.clone();
        async move {
            rt.container_stats(cri::ContainerStatsRequest { container_id: id })
                .await
                .unwrap()
                .into_inner()
                .stats
                .unwrap()
                .writable_layer
                .unwrap()
        }
    };
    let before = stats().await;
    let used = |u: &cri::FilesystemUsage| {
        (
            u.used_bytes.as_ref().unwrap().value,
            u.inodes_used.as_ref().unwrap().value,
        )
    };
    let (b0, i0) = used(&before);
    // 8 MiB and 20 files written: seen at once, with no walk.
    env.exec(
        &c,
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/big bs=1M count=8 2>/dev/null && mkdir /many && \
             for i in $(seq 20); do echo $i > /many/$i; done && sync",
        ],
        30,
    )
    .await
    .unwrap();
    let (b1, i1) = used(&stats().await);
    assert!(b1 >= b0 + (8 << 20), "{b0} -> {b1} bytes");
    assert!(i1 >= i0 + 22, "{i0} -> {i1} inodes");
    // The quota is the layer's own: what the kernel charges to its project.
    let project = env.d.container_info(&c).await["writableLayerProject"]
        .as_u64()
        .unwrap() as u32;
    let on = std::fs::File::open(&layers).unwrap();
    assert_eq!(crius::sys::project_usage(&on, project).unwrap(), (b1, i1));
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    // Removed: nothing stays charged, the layer's ID is free again.
    assert_eq!(crius::sys::project_usage(&on, project).unwrap(), (0, 0));
    drop(on);
    env.d.kill9();
    drop(fs);
    env.d.spawn();
}
