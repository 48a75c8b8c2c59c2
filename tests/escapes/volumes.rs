//! CVE-2024-45310: files and directories made on the host through a volume another container
//! changes. Making a mount point under a shared volume by name follows a symlink the attacker
//! swaps in, to a host path. Covered: an attacker swaps a directory of a shared volume for a
//! link to a host directory and back as fast as it can, while 12 victims mount a second,
//! read-only volume below it; nothing may appear in the host directory, and the read-only
//! volume must be read-only in every victim (a remount looked up by path again would follow
//! the link elsewhere).

use std::time::{Duration, Instant};

use crate::common::*;
use crate::*;

#[tokio::test]
async fn cve_2024_45310_no_host_files_through_a_shared_volume() {
    let marker = Marker::create();
    let shared = tempfile::tempdir().unwrap();
    // The detector: on the host, making the path through the link makes it in the directory.
    let host = marker.dir.path().display().to_string();
    std::os::unix::fs::symlink(&host, shared.path().join("d")).unwrap();
    std::fs::create_dir_all(shared.path().join("d/x/y")).unwrap();
    assert_eq!(marker.strangers(), vec!["x".to_string()]);
    std::fs::remove_dir_all(marker.dir.path().join("x")).unwrap();
    std::fs::remove_file(shared.path().join("d")).unwrap();

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("vol");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = container(
        &env,
        "attacker",
        &format!(
            "while [ ! -f /shared/stop ]; do rm -rf /shared/d; mkdir -p /shared/d; \
             rm -rf /shared/d; ln -s {host} /shared/d; done"
        ),
    );
    cfg.mounts.push(volume(shared.path(), "/shared"));
    env.run(&pod, &sb, cfg).await;
    let inner = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut victims = 0;
    let mut writable = 0;
    while victims < 12 && Instant::now() < deadline {
        victims += 1;
        // The read-only volume's own line: its mount options come first.
        let mut cfg = container(
            &env,
            &format!("victim{victims}"),
            "grep ' /s/d/x/y' /proc/self/mountinfo | cut -d' ' -f6",
        );
        cfg.mounts.push(volume(shared.path(), "/s"));
        let mut ro = volume(inner.path(), "/s/d/x/y");
        ro.readonly = true;
        cfg.mounts.push(ro);
        let (log, _) = run_to_end(&env, &pod, &sb, cfg).await;
        writable += log_lines(&log, "stdout")
            .iter()
            .filter(|o| !o.split(',').any(|x| x == "ro"))
            .count();
    }
    std::fs::write(shared.path().join("stop"), "").unwrap();
    env.remove_pod(&pod).await;
    assert_eq!(writable, 0, "a read-only volume was writable");
    assert!(
        list_names(inner.path()).is_empty(),
        "written to the read-only volume"
    );
    assert!(
        marker.strangers().is_empty(),
        "made on the host by {victims} victims: {:?}",
        marker.strangers()
    );
}
