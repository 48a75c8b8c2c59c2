//! CVE-2019-5736: the runtime's own binary reached from the container. A process the runtime
//! starts in the container runs the runtime's binary until it execs; exec'ing `/proc/self/exe`
//! there (as a container's command, or an exec'd one) keeps running it as a process of the
//! container, whose `/proc/PID/exe` then opens the host's file, to be overwritten once nothing
//! executes it. Covered: the container's own command and an exec'd command run
//! `/proc/self/exe pause hold` (crius's pause helper, which waits); every process the container
//! sees must have an executable that is not the host's binary, and writing to it must fail.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::common::*;
use crate::*;

#[tokio::test]
async fn cve_2019_5736_the_host_binary_out_of_reach() {
    let env = PodEnv::start().await;
    let daemon = env.d.pid().unwrap();
    let host = std::fs::metadata(format!("/proc/{daemon}/exe")).unwrap();
    let host_id = format!("{}:{}", host.dev(), host.ino());
    let probe = "stat -L -c '%d:%i' /proc/[0-9]*/exe 2>/dev/null";
    // The detector: on the host, the daemon's executable is that file.
    assert!(
        host_sh(probe, std::path::Path::new("/"))
            .lines()
            .any(|l| l.trim() == host_id),
        "the probe must find the host's binary behind the daemon's /proc/PID/exe"
    );
    let size_before = host.len();

    // An image with the C library the binary links against (none for a static build), as
    // any glibc image has: so the binary runs in the container if it is reached.
    let reference = push_image(
        &env,
        "glibc",
        &loader_entries(daemon),
        &ImageOpts::default(),
    )
    .await;
    let sb = env.sandbox_config("exe");
    let pod = env.run_pod(&sb).await.unwrap();
    // The container's own command: it may be refused (crius's init has let go of the host's
    // mounts by then), or run as a process of the container.
    let mut cfg = env.container_config("self", &["/proc/self/exe", "pause", "hold"]);
    cfg.image = Some(spec(&reference));
    let own = env.create(&pod, &sb, cfg).await.unwrap();
    let own_started = env.start_container(&own).await;
    let mut cfg = env.container_config("plain", &["sleep", "100000"]);
    cfg.image = Some(spec(&reference));
    let c = env.run(&pod, &sb, cfg).await;
    // An exec'd command doing the same, alive while the container looks.
    let exec_env = env.d.runtime();
    let held = c.clone();
    let exec = tokio::spawn(async move {
        let mut rt = exec_env;
        rt.exec_sync(cri::ExecSyncRequest {
            container_id: held,
            cmd: vec!["/proc/self/exe".into(), "pause".into(), "hold".into()],
            timeout: 3,
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every executable the container sees; each that is not busybox (nor the host's file,
    // which must not be touched even to show a failure) is written to.
    let look = format!(
        "for p in /proc/[0-9]*; do id=$(stat -L -c '%d:%i' $p/exe 2>/dev/null) || continue; \
         echo $id; case $(readlink $p/exe) in *busybox*) ;; *) [ $id != {host_id} ] && \
         (printf x >> $p/exe) 2>/dev/null && echo wrote $p;; esac; done"
    );
    let (mut seen, _, _) = env.exec(&c, &["sh", "-c", &look], 10).await.unwrap();
    if own_started.is_ok() {
        // It has no shell of its own to look with: its exe seen from the host's side of its
        // mount namespace is what a process of the container would open.
        let pid = host_pid(&env, &own).await;
        let m = std::fs::metadata(format!("/proc/{pid}/exe")).unwrap();
        seen.push_str(&format!("{}:{}\n", m.dev(), m.ino()));
    }
    let _ = exec.await;
    let reached: Vec<&str> = seen.lines().filter(|l| l.trim() == host_id).collect();
    assert!(
        reached.is_empty(),
        "the container reached the host's binary ({host_id}) through /proc: {seen}"
    );
    assert!(
        seen.lines().count() >= 3,
        "the container's sleep, the exec'd crius and the prober: {seen}"
    );
    // What it does reach cannot be written.
    assert!(!seen.contains("wrote"), "{seen}");
    env.remove_pod(&pod).await;
    let after = std::fs::metadata(format!("/proc/{daemon}/exe")).unwrap();
    assert_eq!(
        (after.len(), after.ino()),
        (size_before, host.ino()),
        "the host's binary"
    );
}

/// The dynamic loader and libraries `ldd` names for the process `pid`'s executable, as layer
/// entries at their own paths.
fn loader_entries(pid: u32) -> Vec<Entry> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let out = std::process::Command::new("ldd")
        .arg(&exe)
        .output()
        .unwrap();
    let mut entries = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(path) = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(std::path::PathBuf::from)
        else {
            continue;
        };
        let Ok(data) = std::fs::read(&path) else {
            continue;
        };
        let rel = path.strip_prefix("/").unwrap().to_path_buf();
        for a in rel.ancestors().skip(1) {
            if !a.as_os_str().is_empty() {
                dirs.insert(a.display().to_string());
            }
        }
        entries.push(Entry::File(rel.display().to_string(), data, 0o755));
    }
    let mut all: Vec<Entry> = dirs.into_iter().map(Entry::Dir).collect();
    all.extend(entries);
    all
}
