//! CVE-2016-9962: the runtime's descriptors reachable from the container. Between entering the
//! container and its exec, a container's init and an exec'd command hold descriptors of the
//! runtime's (log files, the bundle directory); if the process is dumpable, another process of
//! the container (same user, same capabilities) opens them through `/proc/PID/fd`. Covered: a
//! watcher in a pod with a shared PID namespace lists every process's descriptors for a bounded
//! time while containers start and commands are exec'd in its pod. Their PATH is 30,000 entries
//! of a symlink loop, so the lookup before the exec (after the capabilities are dropped) lasts
//! long enough to be seen.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::*;

/// A PATH whose entries each cost a symlink loop's 40 steps before `/bin`.
fn slow_path() -> String {
    let mut p = "/l:".repeat(30_000);
    p.push_str("/bin");
    p
}

/// The loop: `/l` -> `/l1` -> ... -> `/l39` -> `/l`.
fn loop_entries() -> Vec<Entry> {
    let mut e = vec![Entry::Symlink("l".into(), "l1".into())];
    for i in 1..40 {
        let next = if i == 39 {
            "l".to_string()
        } else {
            format!("l{}", i + 1)
        };
        e.push(Entry::Symlink(format!("l{i}"), next));
    }
    e
}

#[tokio::test]
async fn cve_2016_9962_runtime_descriptors_in_a_shared_pid_namespace() {
    let env = PodEnv::start().await;
    // What only the runtime's own descriptors name: the daemon's directories and the logs'.
    let needles = [
        env.d.dir.path().display().to_string(),
        env.logs.path().display().to_string(),
    ];
    let watch = format!(
        "ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -F -e '{}' -e '{}'",
        needles[0], needles[1]
    );
    // The detector: on the host, the daemon's own descriptors show in the listing.
    assert!(
        !host_sh(&watch, std::path::Path::new("/")).is_empty(),
        "the watcher must see the runtime's descriptors on the host"
    );

    let reference = push_image(&env, "slowpath", &loop_entries(), &ImageOpts::default()).await;
    let sb = shared_pid_pod(&env, "fds");
    let pod = env.run_pod(&sb).await.unwrap();
    let out = tempfile::tempdir().unwrap();
    let seconds = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        90
    } else {
        30
    };
    let mut cfg = container(
        &env,
        "watcher",
        &format!(
            "end=$(($(date +%s)+{seconds})); while [ $(date +%s) -lt $end ] && [ ! -f /out/stop ]; \
             do {watch} >> /out/found; done; echo done > /out/done; sleep 100000"
        ),
    );
    in_shared_pid(&mut cfg);
    cfg.mounts.push(volume(out.path(), "/out"));
    env.run(&pod, &sb, cfg).await;

    let slow = |name: &str, cmd: &[&str]| {
        let mut cfg = env.container_config(name, cmd);
        kubelet_default_paths(security(&mut cfg));
        in_shared_pid(&mut cfg);
        cfg.image = Some(spec(&reference));
        cfg.envs.push(cri::KeyValue {
            key: "PATH".into(),
            value: slow_path().into_bytes(),
        });
        cfg
    };
    let target = env
        .run(&pod, &sb, slow("target", &["sleep", "100000"]))
        .await;
    let deadline = Instant::now() + Duration::from_secs(seconds - 5);
    let mut rounds = 0;
    while Instant::now() < deadline && rounds < 40 {
        rounds += 1;
        // A command exec'd in the pod: its lookup runs with the container's capabilities.
        let _ = env.exec(&target, &["true"], 30).await;
        // A container's init starting in the pod.
        let name = format!("init{rounds}");
        let (_, started) = run_to_end(&env, &pod, &sb, slow(&name, &["true"])).await;
        started.unwrap();
    }
    std::fs::write(out.path().join("stop"), "").unwrap();
    let start = Instant::now();
    while !out.path().join("done").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "the watcher");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.remove_pod(&pod).await;
    let found = std::fs::read_to_string(out.path().join("found")).unwrap_or_default();
    assert!(
        found.is_empty(),
        "after {rounds} rounds, the runtime's descriptors were seen from the container:\n{found}"
    );
    eprintln!("{rounds} rounds of exec and container start: no descriptor seen");
}
