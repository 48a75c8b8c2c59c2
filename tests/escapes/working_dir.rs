//! CVE-2024-21626: a working directory on a descriptor the runtime leaked into the container's
//! init (`/proc/self/fd/N`), from the container's config, from the image's `WorkingDir`, or
//! through a symlink the container makes for an exec'd command, puts the process on the host's
//! filesystem, where `../` climbs to the host's root. Covered: N from 3 to 20 for the config and
//! for exec, and four N from an image.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::*;

#[tokio::test]
async fn cve_2024_21626_working_directory_on_a_leaked_descriptor() {
    let marker = Marker::create();
    let probe = format!("cat {}", climb(&marker.path()));
    // The detector: from any directory on the host, the probe reads the secret.
    assert_eq!(
        host_sh(&probe, std::path::Path::new("/tmp")).trim(),
        marker.token,
        "the probe must read the host's secret from a directory on the host"
    );

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("wd");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut escapes = Vec::new();

    // From the container's config.
    for n in 3..=20 {
        let mut cfg = container(&env, &format!("cfg{n}"), &probe);
        cfg.working_dir = format!("/proc/self/fd/{n}");
        let (log, _) = run_to_end(&env, &pod, &sb, cfg).await;
        if log.contains(&marker.token) {
            escapes.push(format!("working_dir /proc/self/fd/{n}"));
        }
    }

    // From the image alone, with nothing in the config.
    for n in [5, 7, 9, 12] {
        let workdir = format!("/proc/self/fd/{n}");
        let reference = push_image(
            &env,
            &format!("workdir{n}"),
            &[],
            &ImageOpts {
                workdir: &workdir,
                ..Default::default()
            },
        )
        .await;
        let mut cfg = container(&env, &format!("img{n}"), &probe);
        cfg.image = Some(spec(&reference));
        let (log, _) = run_to_end(&env, &pod, &sb, cfg).await;
        if log.contains(&marker.token) {
            escapes.push(format!("image WorkingDir {workdir}"));
        }
    }

    // An exec'd command whose working directory the container turned into a link to one of
    // the exec's own descriptors. The container's own loop re-points the link when asked
    // through a volume (an exec can't: its working directory is the link).
    let ctl = tempfile::tempdir().unwrap();
    let mut cfg = container(
        &env,
        "exec",
        "while :; do if [ -f /ctl/req ]; then n=$(cat /ctl/req); rm -f /ctl/req; \
         rm -rf /w; ln -s /proc/self/fd/$n /w; echo $n > /ctl/done; fi; sleep 0.02; done",
    );
    cfg.working_dir = "/w".into();
    cfg.mounts.push(volume(ctl.path(), "/ctl"));
    let c = env.run(&pod, &sb, cfg).await;
    for n in 3..=20 {
        let done = ctl.path().join("done");
        let _ = std::fs::remove_file(&done);
        std::fs::write(ctl.path().join("req"), n.to_string()).unwrap();
        let start = Instant::now();
        while std::fs::read_to_string(&done)
            .ok()
            .is_none_or(|s| s.trim() != n.to_string())
        {
            assert!(start.elapsed() < Duration::from_secs(20), "the link loop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Ok((out, _, _)) = env.exec(&c, &["sh", "-c", &probe], 10).await
            && out.contains(&marker.token)
        {
            escapes.push(format!(
                "exec with its working directory on /proc/self/fd/{n}"
            ));
        }
    }
    env.remove_pod(&pod).await;
    assert!(escapes.is_empty(), "the host's file was read: {escapes:?}");
}
