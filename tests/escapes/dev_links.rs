//! CVE-2026-41579 (and crun's CVE-2026-47766): the container's `/dev` set up through links in
//! the image. A runtime that follows them makes its nodes and mounts where they lead: a node
//! written over a host file, a mount over a host directory, or over the container's own root
//! or `/etc`. The images: one whose `/dev` holds links (`null` to a host file, `zero` to a
//! missing host path, `mqueue` to a host directory, `pts` to `/`, `shm` to `/etc`), and ones
//! whose `/dev` itself is a link (to `/`, to `/etc`, to a host directory).
//!
//! Covered: the host's file keeps its content and mode, its directory gains no file and the
//! host gains no mount at any of the targets; each container is either refused naming `/dev`
//! or starts with crius's own `/dev` (a tmpfs holding the 1:3 null, devpts on `/dev/pts`, the
//! pod's shm on `/dev/shm`, mqueue on `/dev/mqueue`), its root and `/etc` the image's.

use std::path::Path;

use crate::common::*;
use crate::*;

/// How many mounts the host has at each of `points`.
fn host_mounts_at(points: &[&str]) -> Vec<usize> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    points
        .iter()
        .map(|p| {
            info.lines()
                .filter(|l| l.split(' ').nth(4) == Some(p))
                .count()
        })
        .collect()
}

/// The container's mounts: mount point and filesystem type, from its own mountinfo.
async fn container_mounts(env: &PodEnv, id: &str) -> Vec<(String, String)> {
    let (info, err, code) = env
        .exec(id, &["cat", "/proc/self/mountinfo"], 10)
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    info.lines()
        .filter_map(|l| {
            let point = l.split(' ').nth(4)?;
            let kind = l.split(" - ").nth(1)?.split(' ').next()?;
            Some((point.to_string(), kind.to_string()))
        })
        .collect()
}

/// The container runs on crius's own `/dev`, with its root and `/etc` the image's.
async fn assert_own_dev(env: &PodEnv, id: &str, what: &str) {
    let mounts = container_mounts(env, id).await;
    let at = |p: &str| -> Vec<&str> {
        mounts
            .iter()
            .filter(|(point, _)| point == p)
            .map(|(_, kind)| kind.as_str())
            .collect()
    };
    assert_eq!(at("/dev"), ["tmpfs"], "{what}: /dev in {mounts:?}");
    assert_eq!(at("/dev/pts"), ["devpts"], "{what}: /dev/pts in {mounts:?}");
    assert_eq!(at("/dev/mqueue"), ["mqueue"], "{what}: {mounts:?}");
    assert_eq!(at("/dev/shm").len(), 1, "{what}: /dev/shm in {mounts:?}");
    assert_eq!(at("/"), ["overlay"], "{what}: / in {mounts:?}");
    assert!(at("/etc").is_empty(), "{what}: /etc in {mounts:?}");
    let (out, err, code) = env
        .exec(
            id,
            &[
                "sh",
                "-c",
                "for d in /dev /dev/null /dev/pts /dev/shm /dev/mqueue; do \
                 [ -L $d ] && echo link $d; done; stat -c '%F %t:%T' /dev/null; \
                 echo x > /dev/null && head -1 /etc/passwd && ls /bin/busybox",
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(code, 0, "{what}: {out} {err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "character special file 1:3",
            "root:x:0:0:root:/root:/bin/sh",
            "/bin/busybox"
        ],
        "{what}"
    );
}

#[tokio::test]
async fn cve_2026_41579_dev_through_links_in_the_image() {
    let marker = Marker::create();
    let secret = marker.path().display().to_string();
    let host_dir = marker.dir.path().display().to_string();
    let missing = marker.dir.path().join("made").display().to_string();
    // The detector: followed on the host, the image's /dev/null writes the host's file.
    let decoy = Marker::create();
    let check = tempfile::tempdir().unwrap();
    std::fs::create_dir(check.path().join("dev")).unwrap();
    std::os::unix::fs::symlink(decoy.path(), check.path().join("dev/null")).unwrap();
    host_sh("echo overwritten > dev/null", check.path());
    assert_eq!(
        std::fs::read_to_string(decoy.path()).unwrap(),
        "overwritten\n"
    );

    let points = [
        "/",
        "/etc",
        "/dev",
        "/dev/pts",
        "/dev/shm",
        host_dir.as_str(),
    ];
    let mounts_before = host_mounts_at(&points);
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("devlinks");
    let pod = env.run_pod(&sb).await.unwrap();
    let images: [(&str, Vec<Entry>); 4] = [
        (
            "links in /dev",
            vec![
                Entry::Dir("dev".into()),
                Entry::Symlink("dev/null".into(), secret.clone()),
                Entry::Symlink("dev/zero".into(), missing.clone()),
                Entry::Symlink("dev/mqueue".into(), host_dir.clone()),
                Entry::Symlink("dev/pts".into(), "/".into()),
                Entry::Symlink("dev/shm".into(), "/etc".into()),
            ],
        ),
        ("/dev to /", vec![Entry::Symlink("dev".into(), "/".into())]),
        (
            "/dev to /etc",
            vec![Entry::Symlink("dev".into(), "/etc".into())],
        ),
        (
            "/dev to a host directory",
            vec![Entry::Symlink("dev".into(), host_dir.clone())],
        ),
    ];
    for (i, (what, entries)) in images.into_iter().enumerate() {
        let reference = push_image(
            &env,
            &format!("devlinks{i}"),
            &entries,
            &ImageOpts::default(),
        )
        .await;
        let mut cfg = container(&env, &format!("c{i}"), "sleep 100000");
        cfg.image = Some(spec(&reference));
        let id = env.create(&pod, &sb, cfg).await.unwrap();
        match env.start_container(&id).await {
            Err(e) => {
                println!("{what}: refused: {}", e.message());
                assert!(e.message().contains("/dev"), "{what}: {}", e.message());
            }
            Ok(()) => {
                println!("{what}: started");
                assert_own_dev(&env, &id, what).await;
            }
        }
        assert_eq!(marker.mode(), 0o600, "{what}: the host file's mode");
        assert_eq!(
            std::fs::read_to_string(marker.path()).unwrap(),
            marker.token,
            "{what}: the host file"
        );
        assert!(
            marker.strangers().is_empty(),
            "{what}: {:?}",
            marker.strangers()
        );
        assert_eq!(
            host_mounts_at(&points),
            mounts_before,
            "{what}: the host's mounts at {points:?}"
        );
    }
    env.remove_pod(&pod).await;
    assert!(!Path::new(&missing).exists());
}
