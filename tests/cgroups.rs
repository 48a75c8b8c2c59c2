//! cgroup v2 limits, swap, stats and noswap tmpfs, and an NRI plugin's updates and evictions:
//! the VM test tier. These need a pure cgroup v2 host; on another host (this project's build
//! machines are v1/v2 hybrids) they say so and pass without checking anything. `cargo xtask
//! test-vm` runs them in a qemu VM that has one.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

fn cgroup_v2() -> bool {
    let v2 = crius::runtime::cgroup::Hierarchy::detect().is_some();
    if !v2 {
        not_here(
            "/sys/fs/cgroup is not cgroup v2 here; cargo xtask test-vm runs this test in a VM",
        );
    }
    v2
}

const LONG: &[&str] = &["sleep", "100000"];

fn with_resources(
    env: &PodEnv,
    name: &str,
    cmd: &[&str],
    r: cri::LinuxContainerResources,
) -> cri::ContainerConfig {
    let mut c = env.container_config(name, cmd);
    c.linux.as_mut().unwrap().resources = Some(r);
    c
}

async fn verbose(env: &PodEnv, id: &str) -> serde_json::Value {
    env.d.container_info(id).await
}

async fn cgroup_of(env: &PodEnv, id: &str) -> PathBuf {
    PathBuf::from(
        verbose(env, id).await["cgroup"]
            .as_str()
            .expect("the container has a cgroup"),
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn stat(p: &Path, key: &str) -> u64 {
    read(p)
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{key} "))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

const MIB: i64 = 1 << 20;

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn memory_limit_oom_kill_and_swap() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("mem");
    let pod = env.run_pod(&sb).await.unwrap();
    let limit = cri::LinuxContainerResources {
        memory_limit_in_bytes: 32 * MIB,
        ..Default::default()
    };

    // 60 MiB in a 32 MiB container with no swap: the OOM killer ends it.
    let hog = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "hog",
                &["dd", "if=/dev/zero", "of=/dev/null", "bs=60M", "count=1"],
                limit.clone(),
            ),
        )
        .await;
    let st = env.wait_exit(&hog, Duration::from_secs(120)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}"
    );

    // The same with 64 MiB of swap from unified (kubelet's LimitedSwap): it fits and ends well.
    let mut swappy = limit.clone();
    swappy.unified = [("memory.swap.max".to_string(), (64 * MIB).to_string())].into();
    let ok = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "swappy",
                &["dd", "if=/dev/zero", "of=/dev/null", "bs=60M", "count=1"],
                swappy.clone(),
            ),
        )
        .await;
    let st = env.wait_exit(&ok, Duration::from_secs(120)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (0, "Completed"),
        "swap held what memory could not: {st:?}"
    );

    // Beyond memory + swap it is killed again.
    let big = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "big",
                &["dd", "if=/dev/zero", "of=/dev/null", "bs=120M", "count=1"],
                swappy,
            ),
        )
        .await;
    let st = env.wait_exit(&big, Duration::from_secs(120)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}"
    );

    // The files as written: no swap unless asked, unified last.
    let c = env
        .run(&pod, &sb, with_resources(&env, "files", LONG, limit))
        .await;
    let cg = cgroup_of(&env, &c).await;
    assert_eq!(read(&cg.join("memory.max")), (32 * MIB).to_string());
    assert_eq!(
        read(&cg.join("memory.swap.max")),
        "0",
        "a memory limit alone means no swap"
    );
    env.remove_pod(&pod).await;
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn cpu_pids_cpuset_and_weight() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("cpu");
    let pod = env.run_pod(&sb).await.unwrap();
    // cpu.max throttles a busy loop
    let busy = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "busy",
                &["sh", "-c", "while :; do :; done"],
                cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 10_000,
                    cpu_shares: 1024,
                    cpuset_cpus: "0".into(),
                    ..Default::default()
                },
            ),
        )
        .await;
    let cg = cgroup_of(&env, &busy).await;
    assert_eq!(read(&cg.join("cpu.max")), "10000 100000");
    assert_eq!(read(&cg.join("cpu.weight")), "39");
    let t = Instant::now();
    while stat(&cg.join("cpu.stat"), "nr_throttled") == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never throttled: {}",
            read(&cg.join("cpu.stat"))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the container sees its own cgroup: limits and the pinned CPU
    assert_eq!(
        env.exec(&busy, &["cat", "/sys/fs/cgroup/cpu.max"], 30)
            .await
            .unwrap()
            .0
            .trim(),
        "10000 100000"
    );
    let allowed = env
        .exec(
            &busy,
            &["grep", "Cpus_allowed_list", "/proc/self/status"],
            30,
        )
        .await
        .unwrap()
        .0;
    assert!(
        allowed.trim().ends_with("\t0"),
        "pinned to CPU 0: {allowed:?}"
    );

    // pids.max stops a fork bomb
    let bomb = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "bomb",
                &[
                    "sh",
                    "-c",
                    "for i in $(seq 60); do sleep 1000 & done; sleep 1000",
                ],
                cri::LinuxContainerResources {
                    unified: [("pids.max".to_string(), "16".to_string())].into(),
                    ..Default::default()
                },
            ),
        )
        .await;
    let cg = cgroup_of(&env, &bomb).await;
    // The limit holds when forks are refused: the kernel counts each refusal.
    let t0 = Instant::now();
    while stat(&cg.join("pids.events"), "max") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no fork was refused: {}",
            read(&cg.join("pids.events"))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.remove_pod(&pod).await;
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn update_resources_in_place() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("upd");
    let pod = env.run_pod(&sb).await.unwrap();
    // holds about 20 MiB in a shell variable, then sleeps (not as its last command, which the
    // shell would exec in its place, dropping the variable)
    let c = env
        .run(&pod, &sb, with_resources(&env, "holder", &["sh", "-c", "x=$(head -c 20000000 /dev/zero | tr '\\0' a); echo ready; sleep 100000; echo never"], cri::LinuxContainerResources {
            memory_limit_in_bytes: 200 * MIB,
            ..Default::default()
        }))
        .await;
    let t = Instant::now();
    while !env.log(&sb, "holder").contains("ready") {
        assert!(t.elapsed() < Duration::from_secs(120));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cg = cgroup_of(&env, &c).await;
    let update = |mem: i64| cri::UpdateContainerResourcesRequest {
        container_id: c.clone(),
        linux: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: mem,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    env.d
        .runtime()
        .update_container_resources(update(100 * MIB))
        .await
        .unwrap();
    assert_eq!(read(&cg.join("memory.max")), (100 * MIB).to_string());
    assert_eq!(read(&cg.join("cpu.max")), "50000 100000");
    // below what it uses: refused, and it keeps running with the old limit
    let used: i64 = read(&cg.join("memory.current")).parse().unwrap();
    assert!(used > 15 * MIB, "the holder holds its 20 MB: {used}");
    let err = env
        .d
        .runtime()
        .update_container_resources(update(4 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("current memory use"),
        "{}",
        err.message()
    );
    assert_eq!(read(&cg.join("memory.max")), (100 * MIB).to_string());
    assert_eq!(
        env.status(&c).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    let st = env.status(&c).await;
    assert_eq!(
        st.resources.unwrap().linux.unwrap().memory_limit_in_bytes,
        100 * MIB
    );
    // One file the kernel refuses (a CPU the node lacks): none of the update holds, not the
    // CPU limit written before it either, and the status says what the cgroup has.
    let mut bad = update(200 * MIB);
    if let Some(l) = bad.linux.as_mut() {
        l.cpu_quota = 20_000;
        l.cpuset_cpus = "9999".into();
    }
    let err = env
        .d
        .runtime()
        .update_container_resources(bad)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(read(&cg.join("cpu.max")), "50000 100000");
    assert_eq!(read(&cg.join("memory.max")), (100 * MIB).to_string());
    let st = env.status(&c).await;
    assert_eq!(st.resources.unwrap().linux.unwrap().cpu_quota, 50_000);
    env.remove_pod(&pod).await;
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn stats_and_metrics_report_usage() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("stats");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "worker",
                &[
                    "sh",
                    "-c",
                    "head -c 5000000 /dev/zero > /tmp/blob; while :; do :; done",
                ],
            ),
        )
        .await;
    let rt = || env.d.runtime();
    // A CPU rate needs two samples, and the layer's size is measured now and then: ask until
    // both show the busy loop and the 5 MB file.
    let t0 = Instant::now();
    let s = loop {
        let s = rt()
            .container_stats(cri::ContainerStatsRequest {
                container_id: c.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .stats
            .unwrap();
        let rate = s.cpu.as_ref().and_then(|c| c.usage_nano_cores.as_ref());
        let layer = s
            .writable_layer
            .as_ref()
            .and_then(|l| l.used_bytes.as_ref());
        if rate.is_some_and(|r| r.value > 0) && layer.is_some_and(|l| l.value >= 5_000_000) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{s:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let cpu = s.cpu.unwrap();
    assert!(cpu.usage_core_nano_seconds.unwrap().value > 0);
    assert!(
        cpu.usage_nano_cores.unwrap().value > 0,
        "a busy loop uses CPU"
    );
    assert!(s.memory.unwrap().working_set_bytes.unwrap().value > 0);
    let layer = s.writable_layer.unwrap();
    assert!(
        layer.used_bytes.unwrap().value >= 5_000_000,
        "the 5 MB file is in the writable layer"
    );
    assert!(layer.inodes_used.unwrap().value >= 1);
    assert!(s.swap.is_some());
    let list = rt()
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(list.len(), 1);

    let ps = rt()
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let linux = ps.linux.unwrap();
    assert!(linux.cpu.unwrap().usage_core_nano_seconds.unwrap().value > 0);
    assert!(
        linux.process.unwrap().process_count.unwrap().value >= 2,
        "pause and the worker"
    );
    let net = linux.network.unwrap();
    assert!(net.interfaces.iter().any(|i| i.name == "lo"));
    assert_eq!(linux.containers.len(), 1);
    let all = rt()
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(all.len(), 1);

    let descs = rt()
        .list_metric_descriptors(cri::ListMetricDescriptorsRequest {})
        .await
        .unwrap()
        .into_inner()
        .descriptors;
    assert!(
        descs
            .iter()
            .any(|d| d.name == "container_memory_working_set_bytes")
    );
    let metrics = rt()
        .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_metrics;
    assert_eq!(metrics.len(), 1);
    assert!(
        metrics[0].container_metrics[0]
            .metrics
            .iter()
            .any(|m| m.name == "container_cpu_usage_seconds_total")
    );
    env.remove_pod(&pod).await;
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn cgroups_are_made_and_removed_with_pods() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let st = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let enforced = st
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "ResourceLimitsEnforced")
        .unwrap();
    assert!(enforced.status, "{enforced:?}");

    // kubelet's cgroup parent and crius's own
    let mut kube = env.sandbox_config("kube");
    kube.linux.as_mut().unwrap().cgroup_parent = "/kubepods/burstable/pod-kube".into();
    kube.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
        memory_limit_in_bytes: 256 * MIB,
        ..Default::default()
    });
    kube.linux.as_mut().unwrap().overhead = Some(cri::LinuxContainerResources {
        memory_limit_in_bytes: 16 * MIB,
        ..Default::default()
    });
    let own = env.sandbox_config("own");
    let pk = env.run_pod(&kube).await.unwrap();
    let po = env.run_pod(&own).await.unwrap();
    let ck = env.run(&pk, &kube, env.container_config("c", LONG)).await;
    let co = env.run(&po, &own, env.container_config("c", LONG)).await;
    let root = Path::new("/sys/fs/cgroup");
    let kube_pod = root.join("kubepods/burstable/pod-kube");
    assert_eq!(
        read(&kube_pod.join("memory.max")),
        (272 * MIB).to_string(),
        "pod resources plus overhead"
    );
    assert!(kube_pod.join(&ck).is_dir());
    assert!(
        kube_pod.join(&pk).join("cgroup.procs").exists(),
        "the pause process has its leaf"
    );
    assert!(
        !read(&kube_pod.join(&pk).join("cgroup.procs")).is_empty(),
        "and is in it"
    );
    let own_pod = root.join(&env.d.cgroup_parent).join(&po);
    assert!(own_pod.join(&co).is_dir());
    // the container's processes are in its cgroup
    let procs = read(&own_pod.join(&co).join("cgroup.procs"));
    assert!(!procs.is_empty());

    env.remove_pod(&pk).await;
    env.remove_pod(&po).await;
    assert!(
        !kube_pod.join(&ck).exists() && !kube_pod.join(&pk).exists(),
        "container and pause cgroups are gone"
    );
    assert!(
        kube_pod.exists(),
        "kubelet's pod cgroup is kubelet's to remove"
    );
    assert!(!own_pod.exists(), "crius's own pod cgroup is gone");
    let _ = std::fs::remove_dir(&kube_pod);

    // Orphans: cgroups of crius's that no record knows are removed when the daemon starts, and
    // what runs in them is killed; the cgroups of running pods are kept.
    let keep = env.run_pod(&env.sandbox_config("keep")).await.unwrap();
    let keep_sb = env.sandbox_config("keep");
    let kept = env
        .run(&keep, &keep_sb, env.container_config("c", LONG))
        .await;
    let parent = root.join(&env.d.cgroup_parent);
    let orphan_pod = parent.join("0".repeat(64));
    let orphan_ctr = parent.join(&keep).join("f".repeat(64));
    for d in [&orphan_pod, &orphan_ctr] {
        std::fs::create_dir(d).unwrap();
    }
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    std::fs::write(orphan_pod.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let mut env = env;
    env.d.kill9();
    env.d.spawn();
    assert!(
        !orphan_pod.exists() && !orphan_ctr.exists(),
        "orphans removed"
    );
    let status = sleeper.wait().unwrap();
    assert!(!status.success(), "what ran in an orphan was killed");
    assert!(
        parent.join(&keep).join(&kept).is_dir(),
        "a running pod keeps its cgroups"
    );
    assert_eq!(
        env.status(&kept).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    env.remove_pod(&keep).await;
}

#[tokio::test]
async fn secret_tmpfs_is_noswap() {
    let dir = tempfile::tempdir().unwrap();
    let noswap = crius::frontend::node::mount_tmpfs(dir.path(), 1 << 20, 0o700, true).unwrap();
    let shown = crius::frontend::node::is_noswap(dir.path());
    nix::mount::umount(dir.path()).unwrap();
    let release = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    let (major, minor): (u32, u32) = {
        let mut p = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|x| x.parse().ok());
        (p.next().unwrap_or(0), p.next().unwrap_or(0))
    };
    if (major, minor) >= (6, 4) {
        assert!(noswap && shown, "kernel {release} has tmpfs noswap");
    } else {
        assert!(!noswap);
    }
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn device_controller_allows_only_the_containers_devices() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("devices");
    let pod = env.run_pod(&sb).await.unwrap();
    let sh = |id: String, script: &'static str| {
        let env = &env;
        async move {
            env.exec(&id, &["sh", "-c", script], 20)
                .await
                .expect("exec")
        }
    };
    // /dev is the container's own tmpfs (no nodev): only the cgroup stands between a node made
    // there and the host device. /dev/kmsg (1:11) is not in the default list.
    let c = env
        .run(&pod, &sb, env.container_config("plain", LONG))
        .await;
    let (_, err, code) = sh(c.clone(), "mknod /dev/k c 1 11 && echo crius-test > /dev/k").await;
    assert_ne!(code, 0);
    assert!(err.contains("Operation not permitted"), "{err}");
    let (out, err, code) = sh(
        c.clone(),
        "head -c 4 /dev/urandom | wc -c; echo x > /dev/null",
    )
    .await;
    assert_eq!((out.trim(), code), ("4", 0), "{err}");

    // Given as a device, it opens, with the permissions given.
    let mut cfg = env.container_config("given", LONG);
    cfg.devices = vec![cri::Device {
        container_path: "/dev/kmsg".into(),
        host_path: "/dev/kmsg".into(),
        permissions: "w".into(),
    }];
    let c = env.run(&pod, &sb, cfg).await;
    let (_, err, code) = sh(c.clone(), "echo crius-device-test > /dev/kmsg").await;
    assert_eq!(code, 0, "{err}");
    let (_, err, code) = sh(c.clone(), "head -c 1 /dev/kmsg").await;
    assert_ne!(code, 0, "read was not granted");
    assert!(err.contains("Operation not permitted"), "{err}");

    // Privileged: everything.
    let mut psb = env.sandbox_config("devices-priv");
    psb.linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .unwrap()
        .privileged = true;
    let ppod = env.run_pod(&psb).await.unwrap();
    let mut cfg = env.container_config("priv", LONG);
    cfg.linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .unwrap()
        .privileged = true;
    let c = env.run(&ppod, &psb, cfg).await;
    let (_, err, code) = sh(
        c.clone(),
        "mknod /dev/k2 c 1 11 && echo crius-priv > /dev/k2",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    env.remove_pod(&pod).await;
    env.remove_pod(&ppod).await;
}

/// A CDI device node gets exactly the access its spec gives, through the device controller:
/// write to it, but no read, and no other device made in the container's /dev opens.
#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn cdi_device_controller_allows_the_node_only() {
    if !cgroup_v2() {
        return;
    }
    let specs = tempfile::tempdir().unwrap();
    let env = PodEnv::start_with(&format!(
        "[cdi]\nspec_dirs = [\"{}\"]\n",
        specs.path().display()
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("fake0");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(1, 11),
    )
    .unwrap();
    std::fs::write(
        specs.path().join("t.json"),
        format!(
            r#"{{"cdiVersion":"0.5.0","kind":"crius.test/dev","devices":[{{"name":"k","containerEdits":{{"deviceNodes":[{{"path":"/dev/crius-k","hostPath":"{}","permissions":"w"}}]}}}}]}}"#,
            node.display()
        ),
    )
    .unwrap();
    let sb = env.sandbox_config("cdi-devices");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("cdi", LONG);
    cfg.cdi_devices = vec![cri::CdiDevice {
        name: "crius.test/dev=k".into(),
    }];
    let c = env.run(&pod, &sb, cfg).await;
    let sh = |script: &'static str| {
        let (env, c) = (&env, c.clone());
        async move { env.exec(&c, &["sh", "-c", script], 20).await.expect("exec") }
    };
    let (_, err, code) = sh("echo crius-cdi-test > /dev/crius-k").await;
    assert_eq!(code, 0, "write was given: {err}");
    let (_, err, code) = sh("head -c 1 /dev/crius-k").await;
    assert_ne!(code, 0, "read was not given");
    assert!(err.contains("Operation not permitted"), "{err}");
    let (_, err, code) = sh("mknod /dev/m c 1 1 && head -c 1 /dev/m").await;
    assert_ne!(code, 0, "no other device");
    assert!(err.contains("Operation not permitted"), "{err}");
    env.remove_pod(&pod).await;
}

/// Waits until systemd has stopped an emptied scope and removed its cgroup.
async fn scope_gone(unit: &str, cgroup: Option<&Path>) {
    let t = Instant::now();
    while unit_property(unit, "ActiveState") != "inactive" || cgroup.is_some_and(Path::exists) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "systemd did not remove the emptied scope {unit}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends SIGCONT to a stopped process when dropped.
struct Resume(nix::unistd::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A unit property as `systemctl show -P` prints it.
fn unit_property(unit: &str, property: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-P", property, unit])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The systemd cgroup driver: only where systemd is PID 1 (`cargo xtask test-vm` boots a second
/// VM with systemd for this test).
#[tokio::test]
#[ignore = "needs systemd as PID 1: cargo xtask test-vm runs it in a VM booted with systemd"]
async fn systemd_driver_makes_transient_units() {
    if !cgroup_v2() {
        return;
    }
    if !Path::new("/run/systemd/system").is_dir() {
        not_here(
            "systemd is not PID 1 here; cargo xtask test-vm runs this test in a VM booted with systemd",
        );
        return;
    }
    let env = PodEnv::start_with("[cgroup]\ndriver = \"systemd\"\n").await;
    let root = Path::new("/sys/fs/cgroup");
    let parent = env.d.cgroup_parent.clone();

    // A pod crius parents itself: a slice of its own below `<parent>.slice`, the pause process
    // in a scope in it, each container in a scope of its own with its limits as properties.
    let own = env.sandbox_config("own");
    let pod = env.run_pod(&own).await.unwrap();
    let c = env
        .run(
            &pod,
            &own,
            with_resources(
                &env,
                "c",
                LONG,
                cri::LinuxContainerResources {
                    memory_limit_in_bytes: 64 * MIB,
                    cpu_period: 100_000,
                    cpu_quota: 50_000,
                    cpu_shares: 1024,
                    ..Default::default()
                },
            ),
        )
        .await;
    let pod_slice = format!("{parent}-{pod}.slice");
    let scope = format!("crius-{c}.scope");
    let pause_scope = format!("crius-{pod}.scope");
    let cg = cgroup_of(&env, &c).await;
    assert_eq!(
        cg.file_name().unwrap().to_str().unwrap(),
        scope,
        "the container's cgroup is its scope's"
    );
    assert_eq!(
        cg.parent().unwrap().file_name().unwrap().to_str().unwrap(),
        pod_slice
    );
    assert_eq!(unit_property(&scope, "ActiveState"), "active");
    assert_eq!(unit_property(&scope, "Slice"), pod_slice);
    assert_eq!(unit_property(&scope, "Delegate"), "yes");
    assert_eq!(
        unit_property(&scope, "ControlGroup"),
        format!("/{}", cg.strip_prefix(root).unwrap().display())
    );
    assert_eq!(unit_property(&scope, "MemoryMax"), (64 * MIB).to_string());
    assert_eq!(unit_property(&scope, "CPUQuotaPerSecUSec"), "500ms");
    assert_eq!(unit_property(&pause_scope, "ActiveState"), "active");
    assert_eq!(unit_property(&pause_scope, "Slice"), pod_slice);
    assert_eq!(unit_property(&pod_slice, "ActiveState"), "active");
    let procs = read(&cg.join("cgroup.procs"));
    assert!(!procs.is_empty(), "the container runs in its scope");
    assert!(
        !read(&cg.parent().unwrap().join(&pause_scope).join("cgroup.procs")).is_empty(),
        "the pause process runs in its scope"
    );
    assert_eq!(read(&cg.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(read(&cg.join("memory.swap.max")), "0");
    assert_eq!(read(&cg.join("cpu.max")), "50000 100000");
    // An exec'd command joins the scope too: the cgroup namespace shows it as the root.
    let (out, _, code) = env
        .exec(&c, &["cat", "/proc/self/cgroup"], 10)
        .await
        .unwrap();
    assert_eq!((code, out.trim()), (0, "0::/"), "exec output");

    // A reload re-applies unit properties: the limits must survive it.
    let reload = std::process::Command::new("systemctl")
        .arg("daemon-reload")
        .status()
        .unwrap();
    assert!(reload.success());
    assert_eq!(read(&cg.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(read(&cg.join("memory.swap.max")), "0");

    // In place: the unit and the file change together.
    env.d
        .runtime()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: c.clone(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 96 * MIB,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(unit_property(&scope, "MemoryMax"), (96 * MIB).to_string());
    assert_eq!(read(&cg.join("memory.max")), (96 * MIB).to_string());

    // An OOM kill is reported although systemd takes the emptied scope (and its memory.events)
    // away as soon as the container ends.
    let hog = env
        .run(
            &pod,
            &own,
            with_resources(
                &env,
                "hog",
                &["dd", "if=/dev/zero", "of=/dev/null", "bs=60M", "count=1"],
                cri::LinuxContainerResources {
                    memory_limit_in_bytes: 32 * MIB,
                    ..Default::default()
                },
            ),
        )
        .await;
    let st = env.wait_exit(&hog, Duration::from_secs(120)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}"
    );
    // An ended container's scope goes: systemd stops it once it is empty, in its own time.
    scope_gone(&format!("crius-{hog}.scope"), None).await;

    // The race made certain: the monitor is stopped until systemd has removed the OOM-killed
    // container's scope, so its memory.events cannot be read any more; the pod's count tells.
    let gate = tempfile::tempdir().unwrap();
    let mut cfg = with_resources(
        &env,
        "late-hog",
        &[
            "sh",
            "-c",
            "until [ -e /gate/go ]; do sleep 0.05; done; exec dd if=/dev/zero of=/dev/null bs=60M count=1",
        ],
        cri::LinuxContainerResources {
            memory_limit_in_bytes: 32 * MIB,
            ..Default::default()
        },
    );
    cfg.mounts.push(cri::Mount {
        container_path: "/gate".into(),
        host_path: gate.path().display().to_string(),
        ..Default::default()
    });
    let late = env.run(&pod, &own, cfg).await;
    let late_scope = format!("crius-{late}.scope");
    let late_cg = cgroup_of(&env, &late).await;
    let monitor = nix::unistd::Pid::from_raw(
        verbose(&env, &late).await["monitorPid"]
            .as_i64()
            .expect("a monitor pid") as i32,
    );
    nix::sys::signal::kill(monitor, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Resumed whatever happens, so a failure below leaves no stopped process.
    let resume = Resume(monitor);
    std::fs::write(gate.path().join("go"), b"").unwrap();
    scope_gone(&late_scope, Some(&late_cg)).await;
    drop(resume);
    let st = env.wait_exit(&late, Duration::from_secs(120)).await;
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}"
    );

    // A cgroupfs-style parent cannot hold scopes: refused, naming the field.
    let mut bad = env.sandbox_config("bad");
    bad.linux.as_mut().unwrap().cgroup_parent = "/kubepods/burstable/pod-bad".into();
    let err = env.run_pod(&bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("cgroup_parent"), "{err:?}");

    // kubelet's pod slice (kubelet's systemd driver names it; systemd makes it on first use).
    let kube_slice = format!("{parent}-kube.slice");
    let mut kube = env.sandbox_config("kube");
    kube.linux.as_mut().unwrap().cgroup_parent = kube_slice.clone();
    let kpod = env.run_pod(&kube).await.unwrap();
    let kc = env.run(&kpod, &kube, env.container_config("c", LONG)).await;
    let kscope = format!("crius-{kc}.scope");
    assert_eq!(unit_property(&kscope, "Slice"), kube_slice);
    assert_eq!(unit_property(&kscope, "ActiveState"), "active");

    // The daemon restarted: running pods keep their units.
    let mut env = env;
    env.d.kill9();
    env.d.spawn();
    assert_eq!(
        env.status(&c).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    assert_eq!(unit_property(&scope, "ActiveState"), "active");

    env.remove_pod(&pod).await;
    env.remove_pod(&kpod).await;
    for unit in [&scope, &pause_scope, &pod_slice, &kscope] {
        assert_eq!(
            unit_property(unit, "ActiveState"),
            "inactive",
            "{unit} is gone"
        );
    }
    assert!(
        !cg.exists() && !cg.parent().unwrap().exists(),
        "cgroups gone"
    );
    assert_eq!(
        unit_property(&kube_slice, "ActiveState"),
        "active",
        "kubelet's slice is kubelet's"
    );
}

/// In-place resize (Kubernetes 1.33+): UpdatePodSandboxResources sets the pod cgroup's limits
/// (crius's own pod cgroup here), UpdateContainerResources a container's, nothing restarts, and
/// ContainerStatus reports what the cgroup holds.
#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn pod_and_container_resize_in_place() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let mut sb = env.sandbox_config("resize");
    sb.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
        memory_limit_in_bytes: 256 * MIB,
        cpu_period: 100_000,
        cpu_quota: 100_000,
        ..Default::default()
    });
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "app",
                LONG,
                cri::LinuxContainerResources {
                    memory_limit_in_bytes: 64 * MIB,
                    cpu_shares: 512,
                    ..Default::default()
                },
            ),
        )
        .await;
    let pid = verbose(&env, &c).await["pid"].as_u64().unwrap();
    let pod_cg = PathBuf::from(
        env.d.pod_info(&pod).await["cgroup"]
            .as_str()
            .expect("the pod has a cgroup"),
    );
    assert_eq!(read(&pod_cg.join("memory.max")), (256 * MIB).to_string());
    env.d
        .runtime()
        .update_pod_sandbox_resources(cri::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.clone(),
            overhead: None,
            resources: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 512 * MIB,
                cpu_period: 100_000,
                cpu_quota: 200_000,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(read(&pod_cg.join("memory.max")), (512 * MIB).to_string());
    assert_eq!(read(&pod_cg.join("cpu.max")), "200000 100000");
    assert_eq!(
        env.d.pod_info(&pod).await["config"]["linux"]["resources"]["memory_limit_in_bytes"],
        512 * MIB
    );
    env.d
        .runtime()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: c.clone(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 128 * MIB,
                cpu_shares: 1024,
                cpu_period: 100_000,
                cpu_quota: 50_000,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let cg = cgroup_of(&env, &c).await;
    // Written behind crius's back: the status says what the cgroup holds.
    std::fs::write(cg.join("memory.max"), (96 * MIB).to_string()).unwrap();
    let st = env.status(&c).await;
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    let r = st.resources.unwrap().linux.unwrap();
    assert_eq!(
        (
            r.memory_limit_in_bytes,
            r.cpu_quota,
            r.cpu_period,
            r.cpu_shares
        ),
        (96 * MIB, 50_000, 100_000, 1024)
    );
    assert_eq!(
        verbose(&env, &c).await["pid"].as_u64().unwrap(),
        pid,
        "not restarted"
    );
    env.remove_pod(&pod).await;
}

/// Pressure stall figures (PSI) of CPU, memory and I/O in ContainerStats and PodSandboxStats,
/// where the kernel keeps them (the VM boots with psi=1); the I/O figures in their own field.
#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn pressure_stall_figures() {
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("psi");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            with_resources(
                &env,
                "busy",
                &["sh", "-c", "while :; do :; done"],
                cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 10_000,
                    ..Default::default()
                },
            ),
        )
        .await;
    let cg = cgroup_of(&env, &c).await;
    let kept = cg.join("cpu.pressure").exists();
    // Throttled to a tenth of a CPU, it waits: its CPU pressure grows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = env
        .d
        .runtime()
        .container_stats(cri::ContainerStatsRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let cpu = stats.cpu.unwrap();
    if !kept {
        // No PSI in this kernel: left out, never zero.
        assert!(cpu.psi.is_none() && stats.io.is_none_or(|i| i.psi.is_none()));
        not_here("this kernel keeps no pressure stall figures");
        env.remove_pod(&pod).await;
        return;
    }
    let psi = cpu.psi.unwrap();
    assert!(
        psi.some.unwrap().total > 0,
        "a throttled loop waits for CPU"
    );
    assert!(stats.memory.unwrap().psi.is_some());
    assert!(stats.io.unwrap().psi.is_some());
    let pod_stats = env
        .d
        .runtime()
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap()
        .linux
        .unwrap();
    assert!(pod_stats.cpu.unwrap().psi.is_some());
    assert!(pod_stats.io.unwrap().psi.is_some());
    env.remove_pod(&pod).await;
}

/// The plugin end of an NRI connection, on crius's own protocol code (upstream's sample
/// plugins never update or evict): subscribes to RunPodSandbox alone (no event of the test's
/// containers reaches it while it waits on its own UpdateContainers), answers what it is
/// asked.
struct QuietPlugin;

impl crius::nri::ttrpc::Serve for QuietPlugin {
    fn serve(
        &self,
        _service: String,
        method: String,
        _payload: bytes::Bytes,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Vec<u8>, crius::nri::ttrpc::Status>> + Send>,
    > {
        use prost::Message;
        let answer = match method.as_str() {
            "Configure" => crius::nri::api::ConfigureResponse {
                events: 1 << (crius::nri::api::Event::RunPodSandbox as i32 - 1),
            }
            .encode_to_vec(),
            _ => Vec::new(),
        };
        Box::pin(async move { Ok(answer) })
    }
}

#[tokio::test]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn nri_plugin_updates_limits_and_evicts() {
    use crius::nri::api;
    if !cgroup_v2() {
        return;
    }
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("nri");
    let pod = env.run_pod(&sb).await.unwrap();
    let limited = cri::LinuxContainerResources {
        memory_limit_in_bytes: 200 * MIB,
        ..Default::default()
    };
    let c1 = env
        .run(&pod, &sb, with_resources(&env, "c1", LONG, limited))
        .await;
    let c2 = env.run(&pod, &sb, env.container_config("c2", LONG)).await;

    let stream = tokio::net::UnixStream::connect(env.d.nri_socket())
        .await
        .unwrap();
    let plugin = crius::nri::ttrpc::Trunk::plugin_side(stream, std::sync::Arc::new(QuietPlugin));
    let service = crius::nri::plugin::RUNTIME_SERVICE;
    let register = api::RegisterPluginRequest {
        plugin_name: "balancer".into(),
        plugin_idx: "50".into(),
        nri_version: String::new(),
    };
    let long = Duration::from_secs(10);
    let _: api::Empty = plugin
        .call(service, "RegisterPlugin", &register, long)
        .await
        .unwrap();
    let t = Instant::now();
    while !env.d.log_text().contains("NRI plugin connected") {
        assert!(t.elapsed() < long, "plugin not taken on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let update = |id: &str| api::ContainerUpdate {
        container_id: id.into(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(api::LinuxResources {
                memory: Some(api::LinuxMemory {
                    limit: Some(api::OptionalInt64 { value: 96 * MIB }),
                    ..Default::default()
                }),
                cpu: Some(api::LinuxCpu {
                    quota: Some(api::OptionalInt64 { value: 50_000 }),
                    period: Some(api::OptionalUInt64 { value: 100_000 }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ignore_failure: false,
    };
    let req = api::UpdateContainersRequest {
        update: vec![update(&c1), update("no-such-container")],
        evict: vec![api::ContainerEviction {
            container_id: c2.clone(),
            reason: "room for c1".into(),
        }],
    };
    let answer: api::UpdateContainersResponse = plugin
        .call(service, "UpdateContainers", &req, long)
        .await
        .unwrap();
    // The unknown container's update comes back failed; the rest is done when it answers.
    let failed: Vec<&str> = answer
        .failed
        .iter()
        .map(|f| f.container_id.as_str())
        .collect();
    assert_eq!(failed, ["no-such-container"]);
    let cg = cgroup_of(&env, &c1).await;
    assert_eq!(read(&cg.join("memory.max")), (96 * MIB).to_string());
    assert_eq!(read(&cg.join("cpu.max")), "50000 100000");
    let st = env.status(&c1).await;
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    let linux = st.resources.unwrap().linux.unwrap();
    assert_eq!(linux.memory_limit_in_bytes, 96 * MIB);
    assert_eq!(
        env.status(&c2).await.state,
        cri::ContainerState::ContainerExited as i32
    );
    plugin.close();
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}
