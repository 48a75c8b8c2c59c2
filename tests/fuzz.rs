//! A fuzz test of the CRI edge: a seeded generator sends pod, container, exec, lookup and pod
//! checkpoint requests with one field made hostile (huge, empty, NUL, line breaks, climbing
//! paths, numbers at their edges, unknown references), each under a random deadline that often
//! cuts the call short, against a running daemon. After every case the daemon must be alive and answering,
//! and no answer may be Internal or Unknown: a caller's mistake is InvalidArgument (or
//! NotFound, FailedPrecondition, ...), and a cut-short call DeadlineExceeded. At the end, with
//! every pod removed, nothing is left (no pod, container, mount or process of the daemon's),
//! the daemon's memory has grown by less than 64 MiB, and its log holds no panic.
//!
//! `CRIUS_FUZZ_CASES` (default 150) and `CRIUS_FUZZ_SEED` (default fixed, so CI repeats one
//! run) make it longer or different; a failure prints the seed and the case.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::time::Duration;

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Hostile strings: sizes, bytes and shapes the runtime must refuse or carry safely.
fn hostile_string(rng: &mut Rng) -> String {
    match rng.below(14) {
        0 => String::new(),
        1 => "x".repeat(1 << 20),
        2 => "a\0b".into(),
        3 => "a\nb".into(),
        4 => "../../../../etc/passwd".into(),
        5 => "/".into(),
        6 => ".".into(),
        7 => "/proc/self/root/etc".into(),
        8 => "é😀\u{202e}".into(),
        9 => "x".repeat(300),
        10 => " ".into(),
        11 => "=".into(),
        12 => "/dev/null".into(),
        _ => "a/b/../../..".into(),
    }
}

fn hostile_i64(rng: &mut Rng) -> i64 {
    *rng.pick(&[
        i64::MIN,
        -1,
        0,
        1,
        1001,
        4_294_967_301,
        i64::MAX,
        i64::from(i32::MAX) + 1,
    ])
}

/// A pod's configuration with one field made hostile; what was changed.
fn hostile_pod(env: &PodEnv, rng: &mut Rng, n: usize) -> (cri::PodSandboxConfig, String) {
    let mut sb = env.sandbox_config(&format!("fuzz{n}"));
    let s = hostile_string(rng);
    let linux = sb.linux.as_mut().unwrap();
    let what = match rng.below(12) {
        0 => {
            sb.metadata.as_mut().unwrap().name = s.clone();
            "metadata.name"
        }
        1 => {
            sb.metadata.as_mut().unwrap().namespace = s.clone();
            "metadata.namespace"
        }
        2 => {
            sb.hostname = s.clone();
            "hostname"
        }
        3 => {
            sb.log_directory = s.clone();
            "log_directory"
        }
        4 => {
            sb.dns_config = Some(cri::DnsConfig {
                servers: vec![s.clone()],
                searches: vec![s.clone()],
                options: vec![s.clone()],
            });
            "dns_config"
        }
        5 => {
            sb.port_mappings = vec![cri::PortMapping {
                protocol: rng.below(5) as i32,
                container_port: hostile_i64(rng) as i32,
                host_port: hostile_i64(rng) as i32,
                host_ip: s.clone(),
            }];
            "port_mappings"
        }
        6 => {
            sb.labels.insert(s.clone(), s.clone());
            "labels"
        }
        7 => {
            sb.annotations.insert(s.clone(), s.clone());
            "annotations"
        }
        8 => {
            linux.sysctls.insert(s.clone(), s.clone());
            "linux.sysctls"
        }
        9 => {
            linux.cgroup_parent = s.clone();
            "linux.cgroup_parent"
        }
        10 => {
            let sc = linux.security_context.as_mut().unwrap();
            sc.run_as_user = Some(cri::Int64Value {
                value: hostile_i64(rng),
            });
            sc.supplemental_groups = vec![hostile_i64(rng); 1 + rng.below(3)];
            "linux.security_context"
        }
        _ => {
            sb.metadata.as_mut().unwrap().uid = s.clone();
            "metadata.uid"
        }
    };
    (sb, format!("{what} = {}", shown(&s)))
}

/// A container's configuration with one field made hostile; what was changed.
fn hostile_container(env: &PodEnv, rng: &mut Rng, n: usize) -> (cri::ContainerConfig, String) {
    let mut c = env.container_config(&format!("fuzz{n}"), LONG);
    let s = hostile_string(rng);
    let what = match rng.below(13) {
        0 => {
            c.metadata.as_mut().unwrap().name = s.clone();
            "metadata.name"
        }
        1 => {
            c.image = Some(cri::ImageSpec {
                image: s.clone(),
                ..Default::default()
            });
            "image"
        }
        2 => {
            c.command = vec![s.clone()];
            "command"
        }
        3 => {
            c.args = vec![s.clone(); 1 + rng.below(3)];
            "args"
        }
        4 => {
            c.envs = vec![cri::KeyValue {
                key: s.clone(),
                value: s.clone().into_bytes(),
            }];
            "envs"
        }
        5 => {
            c.mounts = vec![cri::Mount {
                container_path: s.clone(),
                host_path: env.logs.path().display().to_string(),
                ..Default::default()
            }];
            "mounts.container_path"
        }
        6 => {
            c.mounts = vec![cri::Mount {
                container_path: "/data".into(),
                host_path: s.clone(),
                ..Default::default()
            }];
            "mounts.host_path"
        }
        7 => {
            c.working_dir = s.clone();
            "working_dir"
        }
        8 => {
            c.log_path = s.clone();
            "log_path"
        }
        9 => {
            c.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
                cpu_period: hostile_i64(rng),
                cpu_quota: hostile_i64(rng),
                memory_limit_in_bytes: hostile_i64(rng),
                oom_score_adj: hostile_i64(rng),
                cpuset_cpus: s.clone(),
                ..Default::default()
            });
            "linux.resources"
        }
        10 => {
            c.devices = vec![cri::Device {
                container_path: s.clone(),
                host_path: s.clone(),
                permissions: s.clone(),
            }];
            "devices"
        }
        11 => {
            let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
            sc.run_as_user = Some(cri::Int64Value {
                value: hostile_i64(rng),
            });
            sc.masked_paths = vec![s.clone()];
            "linux.security_context"
        }
        _ => {
            c.annotations.insert(s.clone(), s.clone());
            "annotations"
        }
    };
    (c, format!("{what} = {}", shown(&s)))
}

/// A value as a failure names it: its start and length.
fn shown(s: &str) -> String {
    let start: String = s.chars().take(40).collect();
    format!("{start:?} ({} bytes)", s.len())
}

/// Codes that say the runtime, not the caller, failed.
fn runtime_failed(code: Code) -> bool {
    matches!(code, Code::Internal | Code::Unknown | Code::Unavailable)
}

/// Processes whose command line names the daemon's directory (its pauses and monitors).
fn processes_under(dir: &std::path::Path, daemon: u32) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == daemon {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&needle) {
            out.push(format!("{pid}: {cmd}"));
        }
    }
    out
}

fn mounts_under(dir: &std::path::Path) -> usize {
    let needle = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

#[tokio::test]
async fn hostile_requests_leave_the_daemon_whole() {
    let env = PodEnv::start().await;
    let cases: usize = std::env::var("CRIUS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let seed: u64 = std::env::var("CRIUS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x00c0_ffee);
    let mut rng = Rng(seed);
    let pid = env.d.pid().unwrap();
    // One good pod and container for the calls that need something to aim at.
    let good_sb = env.sandbox_config("fuzzgood");
    let good_pod = env.run_pod(&good_sb).await.unwrap();
    let good = env
        .run(&good_pod, &good_sb, env.container_config("fuzzgood", LONG))
        .await;
    let mounts_before = mounts_under(env.d.dir.path());
    let rss_before = rss_kib(pid);
    let mut failures = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for n in 0..cases {
        // Mostly enough time; one case in four cut short somewhere in the call.
        let deadline = if rng.below(4) == 0 {
            Duration::from_millis(1 + rng.below(300) as u64)
        } else {
            Duration::from_secs(20)
        };
        let mut rt = env.d.runtime();
        let (what, result): (String, Result<(), tonic::Status>) = match rng.below(5) {
            0 => {
                let (sb, what) = hostile_pod(&env, &mut rng, n);
                let mut req = tonic::Request::new(cri::RunPodSandboxRequest {
                    config: Some(sb),
                    runtime_handler: String::new(),
                });
                req.set_timeout(deadline);
                let r = rt.run_pod_sandbox(req).await;
                (format!("RunPodSandbox {what}"), r.map(drop))
            }
            1 | 2 => {
                let (c, what) = hostile_container(&env, &mut rng, n);
                let mut req = tonic::Request::new(cri::CreateContainerRequest {
                    pod_sandbox_id: good_pod.clone(),
                    config: Some(c),
                    sandbox_config: Some(good_sb.clone()),
                });
                req.set_timeout(deadline);
                let r = rt.create_container(req).await;
                if let Ok(created) = &r {
                    // What was made runs and goes, as any container would.
                    let id = created.get_ref().container_id.clone();
                    let _ = rt
                        .start_container(cri::StartContainerRequest {
                            container_id: id.clone(),
                        })
                        .await;
                    let _ = rt
                        .remove_container(cri::RemoveContainerRequest { container_id: id })
                        .await;
                }
                (format!("CreateContainer {what}"), r.map(drop))
            }
            3 => {
                let s = hostile_string(&mut rng);
                let cmd = match rng.below(3) {
                    0 => vec![s.clone()],
                    1 => vec!["echo".to_string(), s.clone()],
                    _ => vec!["sleep".to_string(), "600".to_string()],
                };
                let mut req = tonic::Request::new(cri::ExecSyncRequest {
                    container_id: good.clone(),
                    cmd,
                    timeout: *rng.pick(&[0, 1, 18_446_744_073_709_552, i64::MAX]),
                });
                req.set_timeout(deadline.min(Duration::from_secs(3)));
                let r = rt.exec_sync(req).await;
                (format!("ExecSync {}", shown(&s)), r.map(drop))
            }
            _ => {
                let id = hostile_string(&mut rng);
                let r = match rng.below(6) {
                    0 => rt
                        .container_status(cri::ContainerStatusRequest {
                            container_id: id.clone(),
                            verbose: true,
                        })
                        .await
                        .map(drop),
                    1 => rt
                        .stop_pod_sandbox(cri::StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await
                        .map(drop),
                    2 => rt
                        .remove_container(cri::RemoveContainerRequest {
                            container_id: id.clone(),
                        })
                        .await
                        .map(drop),
                    // Pod checkpoints: a hostile ID, directory or option key (never an empty
                    // directory, so nothing is dumped), and a restore from a hostile path.
                    3 => {
                        let key = hostile_string(&mut rng);
                        let options = if rng.below(2) == 0 {
                            [(key, "x".to_string())].into()
                        } else {
                            Default::default()
                        };
                        rt.checkpoint_pod(cri::CheckpointPodRequest {
                            pod_sandbox_id: if rng.below(2) == 0 {
                                good_pod.clone()
                            } else {
                                id.clone()
                            },
                            output_path: hostile_string(&mut rng),
                            container_ids: vec![good.clone(), id.clone()],
                            options,
                        })
                        .await
                        .map(drop)
                    }
                    4 => {
                        let mut sb = env.sandbox_config(&format!("fuzzrestore{n}"));
                        sb.log_directory.clear();
                        rt.restore_pod(cri::RestorePodRequest {
                            checkpoint_path: id.clone(),
                            config: Some(sb),
                            runtime_handler: String::new(),
                            options: Default::default(),
                            container_configs: vec![env.container_config("fuzzrestore", LONG)],
                        })
                        .await
                        .map(drop)
                    }
                    _ => rt
                        .update_container_resources(cri::UpdateContainerResourcesRequest {
                            container_id: id.clone(),
                            linux: Some(cri::LinuxContainerResources {
                                memory_limit_in_bytes: hostile_i64(&mut rng),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .await
                        .map(drop),
                };
                (format!("lookup of {}", shown(&id)), r)
            }
        };
        let code = result.as_ref().err().map_or(Code::Ok, |e| e.code());
        *counts.entry(format!("{code:?}")).or_default() += 1;
        if let Err(e) = &result
            && runtime_failed(e.code())
        {
            failures.push(format!("case {n} (seed {seed}): {what}: {e:?}"));
        }
        // Alive and answering after every case.
        let probe = tokio::time::timeout(
            Duration::from_secs(10),
            env.d.runtime().version(cri::VersionRequest::default()),
        )
        .await;
        assert!(
            matches!(probe, Ok(Ok(_))),
            "case {n} (seed {seed}): {what}: the daemon stopped answering: {probe:?}"
        );
    }
    // Everything the cases made goes with its pod.
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    for p in pods.iter().filter(|p| p.id != good_pod) {
        let _ = env
            .d
            .runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: p.id.clone(),
            })
            .await;
        env.remove_pod(&p.id).await;
    }
    let containers = env
        .d
        .runtime()
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    for c in containers.iter().filter(|c| c.id != good) {
        let _ = env
            .d
            .runtime()
            .remove_container(cri::RemoveContainerRequest {
                container_id: c.id.clone(),
            })
            .await;
    }
    let grown = rss_kib(pid) - rss_before;
    let mounts = mounts_under(env.d.dir.path());
    println!(
        "fuzz: {cases} cases (seed {seed}), answers {counts:?}; memory grew {grown} KiB; mounts {mounts_before} -> {mounts}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(grown < 64 * 1024, "the daemon grew by {grown} KiB");
    assert_eq!(
        mounts, mounts_before,
        "mounts left under the daemon's directory"
    );
    env.remove_pod(&good_pod).await;
    let start = std::time::Instant::now();
    loop {
        let left = processes_under(env.d.dir.path(), pid);
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = env.d.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
}
