//! Exhaustion. Noisy neighbours: a pod whose container writes 100 MB of log as fast as it can (one endless
//! line, which its monitor cuts into 16 KiB pieces) and whose other container holds 4000 open
//! descriptors, while another pod's CRI calls are timed and the daemon's memory watched. The
//! stated bounds: no call for the quiet pod takes over 250 ms while the flood saturates this
//! 2-core machine, and the daemon's resident memory grows by under 8 MiB (the log goes through
//! the container's monitor, never through the daemon). And a full disk under the daemon's
//! root.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;

const LONG: &[&str] = &["sleep", "100000"];
const FLOOD_BYTES: u64 = 100_000_000;
const CALL_BOUND: Duration = Duration::from_millis(250);
const RSS_BOUND_KIB: i64 = 8 << 10;

/// A round of the calls kubelet makes for a pod: the slowest one's time.
async fn round(env: &PodEnv, pod: &str, c: &str) -> Duration {
    let mut rt = env.d.runtime();
    let mut slowest = Duration::ZERO;
    let mut time = |t: Instant| slowest = slowest.max(t.elapsed());
    let t = Instant::now();
    rt.version(cri::VersionRequest::default()).await.unwrap();
    time(t);
    let t = Instant::now();
    rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: pod.into(),
        verbose: false,
    })
    .await
    .unwrap();
    time(t);
    let t = Instant::now();
    rt.container_status(cri::ContainerStatusRequest {
        container_id: c.into(),
        verbose: false,
    })
    .await
    .unwrap();
    time(t);
    let t = Instant::now();
    rt.list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    time(t);
    let t = Instant::now();
    rt.container_stats(cri::ContainerStatsRequest {
        container_id: c.into(),
    })
    .await
    .unwrap();
    time(t);
    slowest
}

#[tokio::test]
async fn noisy_neighbours_do_not_slow_the_daemon() {
    let env = PodEnv::start().await;
    let quiet_sb = env.sandbox_config("quiet");
    let quiet = env.run_pod(&quiet_sb).await.unwrap();
    let q = env
        .run(&quiet, &quiet_sb, env.container_config("q", LONG))
        .await;
    let pid = env.d.pid().unwrap();
    let mut calm = Duration::ZERO;
    for _ in 0..20 {
        calm = calm.max(round(&env, &quiet, &q).await);
    }
    let rss_before = rss_kib(pid);

    let noisy_sb = env.sandbox_config("noisy");
    let noisy = env.run_pod(&noisy_sb).await.unwrap();
    // 4000 descriptors held open: busybox tail following /dev/null 4000 times.
    let fds = env
        .run(
            &noisy,
            &noisy_sb,
            env.container_config(
                "fds",
                &[
                    "sh",
                    "-c",
                    "ulimit -n 8192 2>/dev/null; i=0; while [ $i -lt 4000 ]; do set -- \"$@\" /dev/null; \
                     i=$((i+1)); done; exec tail -f \"$@\" >/dev/null",
                ],
            ),
        )
        .await;
    // It really holds them before the flood starts.
    let t = Instant::now();
    let held = loop {
        let (out, _, _) = env
            .exec(&fds, &["sh", "-c", "ls /proc/$(pidof tail)/fd | wc -l"], 10)
            .await
            .unwrap();
        let held: usize = out.trim().parse().unwrap_or(0);
        if held >= 4000 {
            break held;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the holder has {held} descriptors: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let flood = format!("head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x; exec sleep 100000");
    env.run(
        &noisy,
        &noisy_sb,
        env.container_config("flood", &["sh", "-c", &flood]),
    )
    .await;
    let log = Path::new(&noisy_sb.log_directory).join("flood.log");
    let t = Instant::now();
    let mut worst = Duration::ZERO;
    let mut rounds = 0;
    while std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) < FLOOD_BYTES {
        worst = worst.max(round(&env, &quiet, &q).await);
        rounds += 1;
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the flood did not finish in 2 minutes"
        );
    }
    let flood_secs = t.elapsed().as_secs_f64();
    let rss_after = rss_kib(pid);
    println!(
        "flood of {FLOOD_BYTES} bytes in {flood_secs:.1} s ({:.0} MB/s); {held} descriptors held; \
         {rounds} rounds of 5 calls: slowest {worst:?} (calm: {calm:?}); daemon RSS {rss_before} \
         -> {rss_after} KiB",
        FLOOD_BYTES as f64 / 1e6 / flood_secs
    );
    assert!(rounds > 0);
    assert!(
        worst < CALL_BOUND,
        "a CRI call took {worst:?} during the flood (bound {CALL_BOUND:?})"
    );
    assert!(
        rss_after - rss_before < RSS_BOUND_KIB,
        "the daemon grew from {rss_before} to {rss_after} KiB"
    );
    env.remove_pod(&noisy).await;
    env.remove_pod(&quiet).await;
}

fn used_bytes(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    (s.blocks() - s.blocks_free()) as u64 * s.fragment_size() as u64
}

/// The daemon's root on a 6 MiB tmpfs: a pull larger than the disk fails naming ENOSPC and
/// leaves no partial blob or snapshot behind (the space used is what it was), the daemon goes
/// on serving (a smaller pull succeeds), and when even a record cannot be written the image
/// records already there stay whole across a restart.
#[tokio::test]
async fn a_full_disk_fails_pulls_cleanly() {
    let reg = Registry::start(None);
    let small = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    reg.push_image("small", "1", &small).await.unwrap();
    let mut noise = vec![0u8; 8 << 20];
    getrandom::fill(&mut noise).unwrap();
    let big = image(
        vec![layer(
            &[Entry::File("noise".into(), noise, 0o644)],
            Compress::None,
        )],
        &ImageOpts::default(),
    );
    reg.push_image("big", "1", &big).await.unwrap();

    let mut d = Daemon::start("");
    d.restart_on_tmpfs_root("6m");
    let before = used_bytes(&d.root);
    let err = d.pull(&format!("{}/big:1", reg.host())).await.unwrap_err();
    assert!(err.message().contains("No space left on device"), "{err:?}");
    let after = used_bytes(&d.root);
    assert!(
        after <= before + (64 << 10),
        "a failed pull left {} bytes behind",
        after - before
    );
    // Still serving.
    let small_ref = format!("{}/small:1", reg.host());
    d.pull(&small_ref).await.unwrap();
    assert_eq!(d.list_images().await.len(), 1);

    // A disk so full that no record can be written: the new tag fails, the records already
    // there stay whole.
    let filler = d.root.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    // The registry's own name for the same image: a record to write, no blob.
    let again = format!("{}/small:again", reg.host());
    reg.push_image("small", "again", &small).await.unwrap();
    let err = d.pull(&again).await.unwrap_err();
    assert!(err.message().contains("No space left on device"), "{err:?}");
    std::fs::remove_file(&filler).unwrap();
    d.kill9();
    d.spawn();
    let images = d.list_images().await;
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(
        images[0].repo_tags.iter().any(|t| t == &small_ref),
        "{images:?}"
    );
    d.pull(&again).await.unwrap();
}

#[tokio::test]
async fn a_container_cannot_make_the_daemon_read_its_pods_hostname_file() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("hostile");
    let pod = env.run_pod(&sb).await.unwrap();
    // The pod's /etc/hostname is bound into its containers read-write: this one makes it a
    // sparse 256 MiB file, which costs it nothing (large enough to show the daemon reading it,
    // small enough not to exhaust a machine where it does: 4 GiB took the daemon to 23 GB).
    let grower = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "grower",
                &[
                    "sh",
                    "-c",
                    "truncate -s 268435456 /etc/hostname; exec sleep 100000",
                ],
            ),
        )
        .await;
    let t = Instant::now();
    loop {
        let (out, _, _) = env
            .exec(&grower, &["stat", "-c", "%s", "/etc/hostname"], 10)
            .await
            .unwrap();
        if out.trim() == "268435456" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = env.d.pid().unwrap();
    let before = status_kib(pid, "VmHWM");
    // The next container of the pod: its spec takes the pod's hostname, which was read from
    // that file whole.
    let t = Instant::now();
    let next = env.run(&pod, &sb, env.container_config("next", LONG)).await;
    let took = t.elapsed();
    let grew = status_kib(pid, "VmHWM") - before;
    assert!(took < Duration::from_secs(10), "create+start took {took:?}");
    assert!(grew < 64 << 10, "the daemon's peak memory grew {grew} KiB");
    // It runs, in the pod's UTS namespace with the pod's hostname.
    let (name, _, _) = env.exec(&next, &["hostname"], 10).await.unwrap();
    assert_eq!(name.trim(), sb.hostname, "{name}");
    env.remove_pod(&pod).await;
}
