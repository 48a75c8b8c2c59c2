//! CVE-2025-52565: the container's terminal. runc bound the terminal's pty over `/dev/console`
//! by name, before the masks; a `/dev/console` (or `/dev/pts/N`) that the container had made a
//! link sent that mount onto a procfs file. crius binds nothing for a terminal: the init and
//! exec'd commands open a new terminal in the container's own devpts and check it is one.
//! Covered: a terminal container and a terminal exec whose `/dev` is a volume where an attacker
//! made `console` and `ptmx` links to `/proc/uptime`; nothing may be mounted over it and
//! the terminals must be the container's own.

use crate::common::*;
use crate::*;

/// Mounts at `/proc/uptime` or `/dev/console` that are not procfs's read-only bind.
const PROBE: &str =
    "grep -E ' /(proc/uptime|dev/console) ' /proc/self/mountinfo | grep -v ' - proc '";

#[tokio::test]
async fn cve_2025_52565_terminal_mounts() {
    // The detector: a bind over the file shows in mountinfo (on the host, in a mount namespace
    // of its own).
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("mount --bind /dev/null /proc/uptime && {PROBE}"))
        .output()
        .unwrap();
    assert!(!out.stdout.is_empty(), "the detector must see the bind");

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("console");
    let pod = env.run_pod(&sb).await.unwrap();
    let dev = tempfile::tempdir().unwrap();
    for name in ["console", "ptmx"] {
        std::os::unix::fs::symlink("/proc/uptime", dev.path().join(name)).unwrap();
    }
    std::fs::create_dir(dev.path().join("pts")).unwrap();
    let mut cfg = container(&env, "tty", "sleep 100000");
    cfg.tty = true;
    cfg.mounts.push(volume(dev.path(), "/dev"));
    let id = env.create(&pod, &sb, cfg).await.unwrap();
    match env.start_container(&id).await {
        // Refused: the terminal it would open is not a terminal.
        Err(e) => assert!(
            e.message().contains("ptmx") || e.message().contains("terminal"),
            "{}",
            e.message()
        ),
        Ok(()) => {
            let (out, _, _) = env.exec(&id, &["sh", "-c", PROBE], 10).await.unwrap();
            assert_eq!(out, "", "mounted over the container's files");
        }
    }
    // The same with the container's own /dev, for an exec'd command with a terminal: the
    // container makes the links itself.
    let mut cfg = container(&env, "ttyexec", "sleep 100000");
    cfg.tty = true;
    let c = env.run(&pod, &sb, cfg).await;
    env.exec(
        &c,
        &[
            "sh",
            "-c",
            "ln -sf /proc/uptime /dev/ptmx; ln -sf /proc/uptime /dev/console",
        ],
        10,
    )
    .await
    .unwrap();
    let out = env
        .d
        .cli(&["exec", "-t", &c, "--", "sh", "-c", &format!("tty; {PROBE}")]);
    let text = String::from_utf8_lossy(&out.stdout);
    // Refused, or a terminal of the container's devpts with nothing mounted.
    if out.status.success() {
        assert!(text.contains("/dev/pts/"), "{text}");
    }
    assert!(!text.contains("uptime"), "{text}");
    env.remove_pod(&pod).await;
}
