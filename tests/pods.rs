//! RuntimeService through the CRI socket: pods and containers on real namespaces and mounts.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

#[tokio::test]
async fn pod_lifecycle_basics() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("web");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "hello",
                &["sh", "-c", "echo hello; echo oops >&2; hostname; exit 3"],
            ),
        )
        .await;
    let st = env.wait_exit(&c, Duration::from_secs(20)).await;
    assert_eq!(st.exit_code, 3, "{st:?}");
    assert_eq!(st.reason, "Error");
    assert!(st.finished_at >= st.started_at && st.started_at >= st.created_at);
    let log = env.log(&sb, "hello");
    assert_eq!(log_lines(&log, "stdout"), vec!["hello", "web"], "{log}");
    assert_eq!(log_lines(&log, "stderr"), vec!["oops"], "{log}");
    // every line is "<RFC3339Nano> <stream> <F|P> <content>"
    for line in log.lines() {
        let ts = line.split(' ').next().unwrap();
        assert!(humantime::parse_rfc3339(ts).is_ok(), "{line}");
        assert_eq!(line.split(' ').nth(2), Some("F"), "{line}");
    }
    let ok = env
        .run(&pod, &sb, env.container_config("ok", &["true"]))
        .await;
    let st = env.wait_exit(&ok, Duration::from_secs(20)).await;
    assert_eq!((st.exit_code, st.reason.as_str()), (0, "Completed"));
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

fn readlink_host(p: &str) -> String {
    std::fs::read_link(p).unwrap().display().to_string()
}

#[tokio::test]
async fn two_containers_share_the_pods_namespaces() {
    let env = PodEnv::start().await;
    let mut sb = env.sandbox_config("shared");
    sb.dns_config = Some(cri::DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["default.svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let pod = env.run_pod(&sb).await.unwrap();
    let a = env.run(&pod, &sb, env.container_config("a", LONG)).await;
    let b = env.run(&pod, &sb, env.container_config("b", LONG)).await;
    let ns = |id: String, kind: &'static str| {
        let env = &env;
        async move {
            env.exec(&id, &["readlink", &format!("/proc/self/ns/{kind}")], 10)
                .await
                .unwrap()
                .0
        }
    };
    for kind in ["net", "ipc", "uts"] {
        let (na, nb) = (ns(a.clone(), kind).await, ns(b.clone(), kind).await);
        assert_eq!(na, nb, "{kind} namespace is shared");
        assert_ne!(
            na.trim(),
            readlink_host(&format!("/proc/self/ns/{kind}")),
            "{kind} namespace is the pod's own"
        );
    }
    for kind in ["mnt", "pid"] {
        assert_ne!(
            ns(a.clone(), kind).await,
            ns(b.clone(), kind).await,
            "each container has its own {kind} namespace"
        );
    }
    // the same hostname, files and /dev/shm
    for id in [&a, &b] {
        assert_eq!(env.exec(id, &["hostname"], 10).await.unwrap().0, "shared\n");
        assert_eq!(
            env.exec(id, &["cat", "/etc/hostname"], 10).await.unwrap().0,
            "shared\n"
        );
        let resolv = env
            .exec(id, &["cat", "/etc/resolv.conf"], 10)
            .await
            .unwrap()
            .0;
        assert!(
            resolv.contains("nameserver 10.96.0.10")
                && resolv.contains("search default.svc.cluster.local"),
            "{resolv}"
        );
        assert!(
            env.exec(id, &["cat", "/etc/hosts"], 10)
                .await
                .unwrap()
                .0
                .contains("localhost")
        );
        // PID 1 of the container is its own command
        assert_eq!(
            env.exec(id, &["cat", "/proc/1/comm"], 10).await.unwrap().0,
            "sleep\n"
        );
    }
    env.exec(&a, &["sh", "-c", "echo from-a > /dev/shm/note"], 10)
        .await
        .unwrap();
    assert_eq!(
        env.exec(&b, &["cat", "/dev/shm/note"], 10).await.unwrap().0,
        "from-a\n"
    );
    // only loopback, and it is up
    let dev = env.exec(&a, &["cat", "/proc/net/dev"], 10).await.unwrap().0;
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, vec!["lo"], "{dev}");
    let flags = env
        .exec(&a, &["cat", "/sys/class/net/lo/flags"], 10)
        .await
        .unwrap()
        .0;
    assert_eq!(
        u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap() & 1,
        1,
        "lo is up"
    );
    // a minimal /dev
    let devs = env.exec(&a, &["ls", "/dev"], 10).await.unwrap().0;
    for d in [
        "null", "zero", "random", "urandom", "tty", "full", "pts", "shm", "mqueue", "ptmx",
    ] {
        assert!(
            devs.split_whitespace().any(|x| x == d),
            "/dev/{d} missing: {devs}"
        );
    }
    assert!(
        !devs.split_whitespace().any(|x| x == "sda" || x == "vda"),
        "no host disks: {devs}"
    );
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn exec_sync_output_exit_codes_and_timeout() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("exec");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", LONG);
    cfg.envs = vec![
        cri::KeyValue {
            key: "GREETING".into(),
            value: "hej".into(),
        },
        // CRI's values are bytes: one that is not UTF-8 reaches the process unchanged.
        cri::KeyValue {
            key: "RAW".into(),
            value: vec![b'a', 0xff, 0xfe],
        },
    ];
    cfg.working_dir = "/tmp".into();
    let c = env.run(&pod, &sb, cfg).await;
    let hex = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
    for (what, script) in [
        ("an exec'd command", r#"printf %s "$RAW" | od -An -tx1"#),
        (
            "the container's process",
            r#"tr '\0' '\n' < /proc/1/environ | grep '^RAW=' | od -An -tx1"#,
        ),
    ] {
        let out = env.exec(&c, &["sh", "-c", script], 10).await.unwrap().0;
        let want = if what == "an exec'd command" {
            "61 ff fe"
        } else {
            "52 41 57 3d 61 ff fe 0a"
        };
        assert_eq!(hex(out), want, "{what}: RAW's bytes");
    }
    assert_eq!(
        env.exec(&c, &["sh", "-c", "echo out; echo err >&2; exit 7"], 10)
            .await
            .unwrap(),
        ("out\n".into(), "err\n".into(), 7)
    );
    // the container's environment and working directory
    assert_eq!(
        env.exec(&c, &["sh", "-c", "echo $GREETING $PWD"], 10)
            .await
            .unwrap()
            .0,
        "hej /tmp\n"
    );
    let err = env.exec(&c, &["no-such-binary"], 10).await.unwrap_err();
    assert!(err.message().contains("not found"), "{err:?}");
    // Output past the cap is cut, both streams at once, and the answer still fits a message
    // (16 MiB each made one too large to send).
    let (out, err, code) = env
        .exec(
            &c,
            &[
                "sh",
                "-c",
                "head -c 17000000 /dev/zero; head -c 17000000 /dev/zero >&2",
            ],
            30,
        )
        .await
        .unwrap();
    assert_eq!((out.len(), err.len(), code), (4 << 20, 4 << 20, 0));
    // the timeout kills the command and is reported
    let start = Instant::now();
    let err = env.exec(&c, &["sleep", "30"], 1).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // It came back long before the command would have ended on its own.
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
    let ps = env
        .exec(&c, &["ps", "-o", "pid,stat,args"], 10)
        .await
        .unwrap()
        .0;
    assert!(
        !ps.contains("sleep 30"),
        "the timed-out command is gone: {ps}"
    );
    assert!(
        !ps.lines().any(|l| l
            .split_whitespace()
            .nth(1)
            .is_some_and(|s| s.starts_with('Z'))),
        "no zombies: {ps}"
    );
    // no zombie children of the daemon either
    let daemon = env.d.pid().unwrap() as i32;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 1 && f[1].parse::<i32>().ok() == Some(daemon) {
            assert_ne!(f[0], "Z", "zombie child of the daemon: {stat}");
        }
    }
    // a stopped container cannot be exec'd into
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: c.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let err = env.exec(&c, &["true"], 10).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    env.remove_pod(&pod).await;
}

/// Execs racing a container's end (its PID 1 exits on its own while they keep coming): each
/// one runs or is refused for the container's state, FailedPrecondition as kubelet's prober
/// expects, never as the daemon's internal error (a fork in a PID namespace whose PID 1 is
/// gone, or a monitor going with its container, were answered Internal). A start in a stopped
/// pod is refused the same way, and a start racing the container's removal finds it gone
/// (it was Internal: the removal took the container's directory under the start).
#[tokio::test]
async fn execs_racing_the_containers_end_are_refused_for_its_state() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("race");
    let pod = env.run_pod(&sb).await.unwrap();
    for i in 0..12 {
        let c = env
            .run(
                &pod,
                &sb,
                env.container_config(&format!("c{i}"), &["sleep", "0.3"]),
            )
            .await;
        let start = Instant::now();
        let refused = loop {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "execs kept running after the container ended"
            );
            match env.exec(&c, &["true"], 10).await {
                Ok((_, _, code)) => assert!(code == 0 || code == 137, "exit {code}"),
                Err(e) => break e,
            }
        };
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    // A start racing the container's removal (another client) starts it or finds it gone.
    for i in 0..10 {
        let c = env
            .create(&pod, &sb, env.container_config(&format!("r{i}"), LONG))
            .await
            .unwrap();
        let mut rt = env.d.runtime();
        let remove = rt.remove_container(cri::RemoveContainerRequest {
            container_id: c.clone(),
        });
        let (removed, started) = tokio::join!(remove, env.start_container(&c));
        removed.unwrap();
        if let Err(e) = started {
            assert!(
                matches!(e.code(), Code::NotFound | Code::FailedPrecondition),
                "{e:?}"
            );
        }
    }
    // Nor does a container start in a pod that was stopped after it was created.
    let late = env
        .create(&pod, &sb, env.container_config("late", LONG))
        .await
        .unwrap();
    env.stop_pod(&pod).await;
    let err = env.start_container(&late).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("not ready"), "{err:?}");
    env.remove_pod(&pod).await;
}

async fn stop(env: &PodEnv, id: &str, timeout: i64) -> Duration {
    let start = Instant::now();
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.into(),
            timeout,
        })
        .await
        .unwrap();
    start.elapsed()
}

#[tokio::test]
async fn stop_honours_signal_and_grace_period() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("stop");
    let pod = env.run_pod(&sb).await.unwrap();
    let polite = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "polite",
                &[
                    "sh",
                    "-c",
                    "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
                ],
            ),
        )
        .await;
    let stubborn = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "stubborn",
                &[
                    "sh",
                    "-c",
                    "trap '' TERM; echo ready; while :; do sleep 0.05; done",
                ],
            ),
        )
        .await;
    // wait until both have installed their traps
    for name in ["polite", "stubborn"] {
        let t = Instant::now();
        while !env.log(&sb, name).contains("ready") {
            assert!(t.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Bounds for a slow VM's sake: the exit codes tell SIGTERM from SIGKILL.
    let took = stop(&env, &polite, 10).await;
    assert!(
        took < Duration::from_secs(10),
        "ended before its grace period: {took:?}"
    );
    let st = env.status(&polite).await;
    assert_eq!(
        (st.state, st.exit_code),
        (cri::ContainerState::ContainerExited as i32, 0),
        "{st:?}"
    );
    assert!(env.log(&sb, "polite").contains("got-term"));

    let took = stop(&env, &stubborn, 2).await;
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(17),
        "grace period then SIGKILL: {took:?}"
    );
    assert_eq!(env.status(&stubborn).await.exit_code, 137);
    // stopping again is fine
    stop(&env, &stubborn, 2).await;

    // timeout 0 kills at once
    let now = env.run(&pod, &sb, env.container_config("now", LONG)).await;
    let took = stop(&env, &now, 0).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(env.status(&now).await.exit_code, 137);
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn image_stop_signal_is_used() {
    let env = PodEnv::start().await;
    let img = image(
        vec![busybox_layer(Compress::Gzip)],
        &ImageOpts {
            stop_signal: "SIGUSR1",
            ..Default::default()
        },
    );
    env.reg.push_image("usr1", "1", &img).await.unwrap();
    let name = format!("{}/usr1:1", env.reg.host());
    env.d.pull(&name).await.unwrap();
    let sb = env.sandbox_config("sig");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config(
        "usr1",
        &[
            "sh",
            "-c",
            "trap 'echo got-usr1; exit 0' USR1; echo ready; while :; do sleep 0.05; done",
        ],
    );
    cfg.image = Some(spec(&name));
    let c = env.run(&pod, &sb, cfg).await;
    let t = Instant::now();
    while !env.log(&sb, "usr1").contains("ready") {
        assert!(t.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(&env, &c, 10).await;
    assert_eq!(env.status(&c).await.exit_code, 0);
    assert!(env.log(&sb, "usr1").contains("got-usr1"));
    env.remove_pod(&pod).await;
}

fn mount_shared(dir: &Path) {
    use nix::mount::{MsFlags, mount};
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();
}

fn umount(dir: &Path) {
    let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
}

#[tokio::test]
async fn bind_mounts_and_propagation() {
    let env = PodEnv::start().await;
    let host = tempfile::tempdir().unwrap();
    let dir = |n: &str| {
        let p = host.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (ro, rw, private, slave, bidi) = (
        dir("ro"),
        dir("rw"),
        dir("private"),
        dir("slave"),
        dir("bidi"),
    );
    std::fs::write(ro.join("file"), "read me").unwrap();
    for d in [&private, &slave, &bidi] {
        mount_shared(d);
    }
    let m = |c: &str, h: &Path, readonly: bool, p: cri::MountPropagation| cri::Mount {
        container_path: c.into(),
        host_path: h.display().to_string(),
        readonly,
        propagation: p as i32,
        ..Default::default()
    };
    let mut sb = env.sandbox_config("mounts");
    sb.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            privileged: true,
            namespace_options: Some(container_pid()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", LONG);
    cfg.mounts = vec![
        m(
            "/data",
            &ro,
            true,
            cri::MountPropagation::PropagationPrivate,
        ),
        m("/rw", &rw, false, cri::MountPropagation::PropagationPrivate),
        m(
            "/private",
            &private,
            false,
            cri::MountPropagation::PropagationPrivate,
        ),
        m(
            "/slave",
            &slave,
            false,
            cri::MountPropagation::PropagationHostToContainer,
        ),
        m(
            "/bidi",
            &bidi,
            false,
            cri::MountPropagation::PropagationBidirectional,
        ),
    ];
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            privileged: true,
            namespace_options: Some(container_pid()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;

    assert_eq!(
        env.exec(&c, &["cat", "/data/file"], 10).await.unwrap().0,
        "read me"
    );
    let (_, err, code) = env.exec(&c, &["touch", "/data/new"], 10).await.unwrap();
    assert_ne!(code, 0, "a read-only mount refuses writes");
    assert!(err.contains("Read-only"), "{err}");
    assert_eq!(env.exec(&c, &["touch", "/rw/new"], 10).await.unwrap().2, 0);
    assert!(rw.join("new").exists(), "writes reach the host");

    // host mounts after start: seen through rslave, not through rprivate
    for d in [&private, &slave] {
        let sub = d.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &sub,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        std::fs::write(sub.join("f"), "hostmount").unwrap();
    }
    assert_eq!(
        env.exec(&c, &["cat", "/slave/sub/f"], 10).await.unwrap().0,
        "hostmount"
    );
    assert_ne!(
        env.exec(&c, &["cat", "/private/sub/f"], 10)
            .await
            .unwrap()
            .2,
        0
    );
    // a mount made in the container reaches the host through rshared
    let (_, err, code) = env
        .exec(
            &c,
            &[
                "sh",
                "-c",
                "mkdir -p /bidi/in && mount -t tmpfs none /bidi/in && echo inside > /bidi/in/f",
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(bidi.join("in/f")).unwrap_or_default(),
        "inside\n"
    );

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    for d in [
        bidi.join("in"),
        private.join("sub"),
        slave.join("sub"),
        private.clone(),
        slave.clone(),
        bidi.clone(),
    ] {
        umount(&d);
    }
}

/// Everything the daemon mounted under its directories.
fn mounts_under(prefixes: &[&Path]) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| {
            prefixes
                .iter()
                // below the directories, not the directories (the state dir is a tmpfs)
                .any(|p| m.starts_with(&format!("{}/", p.display())))
        })
        .collect()
}

/// Live (not zombie) processes whose command line mentions `needle`.
fn live_processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let state = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim().chars().next().unwrap_or('?'))
            });
        if cmd.contains(needle) && state != Some('Z') {
            out.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
        }
    }
    out
}

#[tokio::test]
async fn daemon_killed_while_pods_run_then_restarted() {
    let mut env = PodEnv::start().await;
    let sb = env.sandbox_config("survivor");
    let pod = env.run_pod(&sb).await.unwrap();
    let long = env.run(&pod, &sb, env.container_config("long", LONG)).await;
    let short = env
        .run(
            &pod,
            &sb,
            env.container_config("short", &["sh", "-c", "sleep 2; echo bye; exit 5"]),
        )
        .await;
    let pause_pid = env.pause_pid(&pod).await;
    env.d.kill9();
    // the short container ends while no daemon runs: its monitor records the exit
    let exit_file = env
        .d
        .state
        .join("containers")
        .join(&short)
        .join("exit.json");
    let t0 = Instant::now();
    while !exit_file.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no exit recorded at {}",
            exit_file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.d.spawn();

    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, cri::PodSandboxState::SandboxReady as i32);
    let st = env.status(&long).await;
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    let st = env.status(&short).await;
    assert_eq!(
        (st.state, st.exit_code),
        (cri::ContainerState::ContainerExited as i32, 5),
        "exit recorded while the daemon was down: {st:?}"
    );
    assert!(env.log(&sb, "short").contains("bye"));
    // still fully operable
    assert_eq!(
        env.exec(&long, &["echo", "alive"], 10).await.unwrap().0,
        "alive\n"
    );
    stop(&env, &long, 1).await;
    assert_eq!(
        env.status(&long).await.state,
        cri::ContainerState::ContainerExited as i32
    );

    // a later exit is noticed by the restarted daemon too
    let again = env
        .run(
            &pod,
            &sb,
            env.container_config("again", &["sh", "-c", "exit 9"]),
        )
        .await;
    assert_eq!(
        env.wait_exit(&again, Duration::from_secs(10))
            .await
            .exit_code,
        9
    );

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let state = env.d.state.clone();
    let root = env.d.root.clone();
    assert!(
        mounts_under(&[&state, &root]).is_empty(),
        "mounts left: {:?}",
        mounts_under(&[&state, &root])
    );
    let daemon = format!("{}: ", env.d.pid().unwrap());
    let left: Vec<String> = live_processes_mentioning(&state.display().to_string())
        .into_iter()
        .filter(|p| !p.starts_with(&daemon))
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    let pause = format!("/proc/{pause_pid}/stat");
    let alive = std::fs::read_to_string(&pause)
        .ok()
        .is_some_and(|s| !s.contains(") Z "));
    assert!(!alive, "the pause process is gone");
    assert!(common::list_names(&state.join("sandboxes")).is_empty());
    assert!(common::list_names(&state.join("containers")).is_empty());
    assert!(common::list_names(&root.join("containers")).is_empty());
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let env = PodEnv::start().await;
    let rt = || env.d.runtime();
    let sb = env.sandbox_config("bad");
    let pod = env.run_pod(&sb).await.unwrap();

    // unknown IDs
    let err = env
        .create("nope", &sb, env.container_config("x", LONG))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = env.start_container("nope").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = rt()
        .container_status(cri::ContainerStatusRequest {
            container_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = rt()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // stop and remove of unknown things are fine
    rt().stop_container(cri::StopContainerRequest {
        container_id: "nope".into(),
        timeout: 0,
    })
    .await
    .unwrap();
    rt().remove_container(cri::RemoveContainerRequest {
        container_id: "nope".into(),
    })
    .await
    .unwrap();
    rt().stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: "nope".into(),
    })
    .await
    .unwrap();
    rt().remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: "nope".into(),
    })
    .await
    .unwrap();

    let bad = |f: &dyn Fn(&mut cri::ContainerConfig)| {
        let mut c = env.container_config("bad", LONG);
        f(&mut c);
        c
    };
    let cases: Vec<(cri::ContainerConfig, &str)> = vec![
        (
            bad(&|c| {
                c.mounts = vec![cri::Mount {
                    container_path: "relative/x".into(),
                    host_path: "/tmp".into(),
                    ..Default::default()
                }]
            }),
            "mounts[0].container_path",
        ),
        (
            bad(&|c| {
                c.mounts = vec![cri::Mount {
                    container_path: "/x".into(),
                    host_path: "tmp".into(),
                    ..Default::default()
                }]
            }),
            "mounts[0].host_path",
        ),
        (
            bad(&|c| {
                c.mounts = vec![cri::Mount {
                    container_path: "/../../x".into(),
                    host_path: "/tmp".into(),
                    ..Default::default()
                }]
            }),
            "escapes",
        ),
        (bad(&|c| c.log_path = "../escape.log".into()), "log_path"),
        (bad(&|c| c.log_path = "/var/log/abs.log".into()), "log_path"),
        (
            bad(&|c| {
                c.metadata = Some(cri::ContainerMetadata {
                    name: String::new(),
                    attempt: 0,
                })
            }),
            "metadata.name",
        ),
        (
            bad(&|c| c.image = Some(spec("127.0.0.1:1/not-pulled:1"))),
            "pull it first",
        ),
        (bad(&|c| c.working_dir = "relative".into()), "working_dir"),
    ];
    for (cfg, want) in cases {
        let err = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert!(
            matches!(err.code(), Code::InvalidArgument | Code::NotFound),
            "{want}: {err:?}"
        );
        assert!(err.message().contains(want), "{want}: {}", err.message());
    }
    // duplicate names
    env.create(&pod, &sb, env.container_config("dup", LONG))
        .await
        .unwrap();
    let err = env
        .create(&pod, &sb, env.container_config("dup", LONG))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let err = env.run_pod(&sb).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    // runtime handlers
    let err = rt()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(env.sandbox_config("h")),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("kata"), "{err:?}");
    // sysctls that are not namespaced
    let mut s = env.sandbox_config("sysctl");
    s.linux.as_mut().unwrap().sysctls = [("vm.swappiness".to_string(), "1".to_string())].into();
    let err = env.run_pod(&s).await.unwrap_err();
    assert!(err.message().contains("vm.swappiness"), "{err:?}");
    // a start that cannot exec is reported, and the container shows why
    let c = env
        .create(
            &pod,
            &sb,
            env.container_config("noexec", &["/no/such/binary"]),
        )
        .await
        .unwrap();
    let err = env.start_container(&c).await.unwrap_err();
    assert!(err.message().contains("/no/such/binary"), "{err:?}");
    let st = env.status(&c).await;
    assert_eq!(
        (st.state, st.reason.as_str()),
        (cri::ContainerState::ContainerExited as i32, "StartError")
    );
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn list_filters_and_status_fields() {
    let env = PodEnv::start().await;
    let sa = env.sandbox_config("alpha");
    let sbeta = env.sandbox_config("beta");
    let pa = env.run_pod(&sa).await.unwrap();
    let pb = env.run_pod(&sbeta).await.unwrap();
    let mut cfg = env.container_config("one", LONG);
    cfg.labels = [("role".to_string(), "main".to_string())].into();
    cfg.annotations = [("note".to_string(), "x".to_string())].into();
    let c1 = env.run(&pa, &sa, cfg).await;
    let c2 = env
        .create(&pb, &sbeta, env.container_config("two", LONG))
        .await
        .unwrap();
    env.stop_pod(&pb).await;

    let list = |f: Option<cri::PodSandboxFilter>| {
        let env = &env;
        async move {
            env.d
                .runtime()
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter: f })
                .await
                .unwrap()
                .into_inner()
                .items
        }
    };
    assert_eq!(list(None).await.len(), 2);
    let ready = cri::PodSandboxStateValue {
        state: cri::PodSandboxState::SandboxReady as i32,
    };
    let only = list(Some(cri::PodSandboxFilter {
        state: Some(ready),
        ..Default::default()
    }))
    .await;
    assert_eq!(
        only.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        vec![pa.clone()]
    );
    let by_id = list(Some(cri::PodSandboxFilter {
        id: pb[..12].to_string(),
        ..Default::default()
    }))
    .await;
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0].state, cri::PodSandboxState::SandboxNotready as i32);
    let by_label = list(Some(cri::PodSandboxFilter {
        label_selector: [("app".to_string(), "beta".to_string())].into(),
        ..Default::default()
    }))
    .await;
    assert_eq!(by_label.len(), 1);
    assert_eq!(by_label[0].metadata.as_ref().unwrap().name, "beta");

    let containers = |f: cri::ContainerFilter| {
        let env = &env;
        async move {
            env.d
                .runtime()
                .list_containers(cri::ListContainersRequest { filter: Some(f) })
                .await
                .unwrap()
                .into_inner()
                .containers
        }
    };
    assert_eq!(containers(cri::ContainerFilter::default()).await.len(), 2);
    let by_pod = containers(cri::ContainerFilter {
        pod_sandbox_id: pa.clone(),
        ..Default::default()
    })
    .await;
    assert_eq!(
        by_pod.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        vec![c1.clone()]
    );
    let created = containers(cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerCreated as i32,
        }),
        ..Default::default()
    })
    .await;
    assert_eq!(
        created.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        vec![c2.clone()]
    );
    let labelled = containers(cri::ContainerFilter {
        label_selector: [("role".to_string(), "main".to_string())].into(),
        ..Default::default()
    })
    .await;
    assert_eq!(labelled.len(), 1);

    let st = env
        .d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pa.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let s = st.status.unwrap();
    assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
    assert!(s.created_at > 0);
    assert_eq!(s.labels["app"], "alpha");
    assert_eq!(st.containers_statuses.len(), 1);
    let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
    let netns = info["netNamespacePath"].as_str().unwrap();
    assert!(Path::new(netns).exists(), "{netns}");

    let cs = env.status(&c1).await;
    assert_eq!(cs.metadata.as_ref().unwrap().name, "one");
    assert_eq!(cs.state, cri::ContainerState::ContainerRunning as i32);
    assert!(cs.image_ref.contains("busybox@sha256:"), "{}", cs.image_ref);
    assert_eq!(cs.annotations["note"], "x");
    assert!(cs.log_path.ends_with("one.log"));
    assert!(cs.started_at > 0);
    env.remove_pod(&pa).await;
    env.remove_pod(&pb).await;
}

#[tokio::test]
async fn users_from_image_and_security_context() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("users");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("root", LONG)).await;
    assert_eq!(
        env.exec(&c, &["id"], 10)
            .await
            .unwrap()
            .0
            .split_whitespace()
            .next(),
        Some("uid=0(root)")
    );
    let mut cfg = env.container_config("app", LONG);
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            run_as_username: "app".into(),
            namespace_options: Some(container_pid()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;
    let id = env.exec(&c, &["id"], 10).await.unwrap().0;
    assert!(
        id.starts_with("uid=1000(app) gid=1000(app)") && id.contains("2000(extra)"),
        "{id}"
    );
    assert_eq!(
        env.exec(&c, &["sh", "-c", "echo $HOME"], 10)
            .await
            .unwrap()
            .0,
        "/home/app\n"
    );
    let st = env.status(&c).await;
    let user = st.user.unwrap().linux.unwrap();
    assert_eq!(
        (user.uid, user.gid, user.supplemental_groups),
        (1000, 1000, vec![1000, 2000])
    );
    let mut cfg = env.container_config("numeric", LONG);
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            run_as_user: Some(cri::Int64Value { value: 4321 }),
            run_as_group: Some(cri::Int64Value { value: 8765 }),
            supplemental_groups: vec![55],
            namespace_options: Some(container_pid()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;
    let id = env.exec(&c, &["id"], 10).await.unwrap().0;
    assert!(id.starts_with("uid=4321 gid=8765 groups=55,8765"), "{id}");
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn shared_pid_and_host_network_pods() {
    let env = PodEnv::start().await;
    let mut sb = env.sandbox_config("pidshare");
    sb.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                pid: cri::NamespaceMode::Pod as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let pod = env.run_pod(&sb).await.unwrap();
    let with_pod_pid = |name: &str, cmd: &[&str]| {
        let mut c = env.container_config(name, cmd);
        c.linux = Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    };
    let a = env
        .run(&pod, &sb, with_pod_pid("a", &["sleep", "4242"]))
        .await;
    let b = env.run(&pod, &sb, with_pod_pid("b", LONG)).await;
    let ps = env.exec(&b, &["ps", "-o", "pid,args"], 10).await.unwrap().0;
    assert!(ps.contains("sleep 4242"), "b sees a's processes: {ps}");
    let one = env.exec(&a, &["cat", "/proc/1/comm"], 10).await.unwrap().0;
    assert_eq!(one, "pause\n", "PID 1 is the pod's pause process");
    // stopping a container in a shared PID namespace kills all of its processes
    env.exec(&a, &["sh", "-c", "sleep 5151 & true"], 10)
        .await
        .unwrap();
    stop(&env, &a, 0).await;
    let ps = env.exec(&b, &["ps", "-o", "pid,args"], 10).await.unwrap().0;
    assert!(!ps.contains("sleep 4242"), "{ps}");
    env.remove_pod(&pod).await;

    let mut host = env.sandbox_config("hostnet");
    host.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                ..container_pid()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let pod = env.run_pod(&host).await.unwrap();
    let c = env.run(&pod, &host, env.container_config("c", LONG)).await;
    let net = env
        .exec(&c, &["readlink", "/proc/self/ns/net"], 10)
        .await
        .unwrap()
        .0;
    assert_eq!(
        net.trim(),
        readlink_host("/proc/self/ns/net"),
        "host network"
    );
    let name = env.exec(&c, &["hostname"], 10).await.unwrap().0;
    assert_eq!(
        name.trim(),
        nix::unistd::gethostname().unwrap().to_string_lossy(),
        "host name on the host network"
    );
    env.remove_pod(&pod).await;

    // No hostname (critest sends none, with metadata names longer than a hostname may be): the
    // pod takes the node's, as containerd does. One too long is refused naming the field.
    let long = "create-PodSandbox-for-container-with-a-name-longer-than-sixty-four-bytes";
    let mut nameless = env.sandbox_config(long);
    nameless.hostname.clear();
    let pod = env.run_pod(&nameless).await.unwrap();
    let c = env
        .run(&pod, &nameless, env.container_config("c", LONG))
        .await;
    let name = env.exec(&c, &["hostname"], 10).await.unwrap().0;
    assert_eq!(
        name.trim(),
        nix::unistd::gethostname().unwrap().to_string_lossy(),
        "the node's name when none is given"
    );
    env.remove_pod(&pod).await;
    let mut too_long = env.sandbox_config("too-long");
    too_long.hostname = long.into();
    let err = env.run_pod(&too_long).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("config.hostname"), "{err:?}");
}

#[tokio::test]
async fn sysctls_oom_score_adj_tty_and_log_reopen() {
    let env = PodEnv::start().await;
    let mut sb = env.sandbox_config("misc");
    sb.linux.as_mut().unwrap().sysctls = [
        (
            "net.ipv4.ip_unprivileged_port_start".to_string(),
            "81".to_string(),
        ),
        ("kernel.shmmni".to_string(), "1234".to_string()),
    ]
    .into();
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", LONG);
    cfg.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
        oom_score_adj: -998,
        ..Default::default()
    });
    cfg.devices = vec![cri::Device {
        container_path: "/dev/mynull".into(),
        host_path: "/dev/null".into(),
        permissions: "rwm".into(),
    }];
    let c = env.run(&pod, &sb, cfg).await;
    let ls = env
        .exec(&c, &["ls", "-l", "/dev/mynull"], 10)
        .await
        .unwrap()
        .0;
    assert!(
        ls.starts_with('c') && ls.contains("1,   3"),
        "the device node is the host's /dev/null: {ls}"
    );
    assert_eq!(
        env.exec(&c, &["sh", "-c", "echo x > /dev/mynull"], 10)
            .await
            .unwrap()
            .2,
        0
    );
    assert_eq!(
        env.exec(
            &c,
            &["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"],
            10
        )
        .await
        .unwrap()
        .0,
        "81\n"
    );
    assert_eq!(
        env.exec(&c, &["cat", "/proc/sys/kernel/shmmni"], 10)
            .await
            .unwrap()
            .0,
        "1234\n"
    );
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/shmmni").unwrap(),
        "1234\n",
        "the host is untouched"
    );
    // -998 is below what this node lets the daemon set: clamped, not fatal
    let adj: i32 = env
        .exec(&c, &["cat", "/proc/self/oom_score_adj"], 10)
        .await
        .unwrap()
        .0
        .trim()
        .parse()
        .unwrap();
    assert!(adj >= -998);

    let mut tty = env.container_config("tty", &["sh", "-c", "test -t 1 && echo on-a-tty"]);
    tty.tty = true;
    let t = env.run(&pod, &sb, tty).await;
    env.wait_exit(&t, Duration::from_secs(10)).await;
    assert!(
        env.log(&sb, "tty").contains("on-a-tty"),
        "{}",
        env.log(&sb, "tty")
    );

    // kubelet's rotation: rename, reopen, and new lines go to the new file
    let chatty = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "chatty",
                &["sh", "-c", "while :; do echo tick; sleep 0.05; done"],
            ),
        )
        .await;
    let log = Path::new(&sb.log_directory).join("chatty.log");
    let t0 = Instant::now();
    while !env.log(&sb, "chatty").contains("tick") {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::rename(&log, log.with_extension("log.1")).unwrap();
    env.d
        .runtime()
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: chatty.clone(),
        })
        .await
        .unwrap();
    // New lines land in the reopened file.
    let t0 = Instant::now();
    while !env.log(&sb, "chatty").contains("tick") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "nothing reached the reopened file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        std::fs::read_to_string(log.with_extension("log.1"))
            .unwrap()
            .contains("tick")
    );
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn status_and_runtime_config() {
    let env = PodEnv::start_with("[runtime.handlers.fast]\n").await;
    let st = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let conds = st.status.unwrap().conditions;
    let ready = conds.iter().find(|c| c.r#type == "RuntimeReady").unwrap();
    assert!(ready.status);
    let net = conds.iter().find(|c| c.r#type == "NetworkReady").unwrap();
    // No network list in the daemon's (empty) configuration directory: pods keep loopback.
    assert!(
        !net.status && net.reason == "NetworkPluginNotReady" && net.message.contains("net.d"),
        "{net:?}"
    );
    let handlers: Vec<String> = st.runtime_handlers.iter().map(|h| h.name.clone()).collect();
    assert_eq!(handlers, vec!["".to_string(), "fast".to_string()]);
    let cfg = env
        .d
        .runtime()
        .runtime_config(cri::RuntimeConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cfg.linux.unwrap().cgroup_driver,
        cri::CgroupDriver::Cgroupfs as i32
    );
    // the named handler runs pods
    let sb = env.sandbox_config("fast");
    std::fs::create_dir_all(&sb.log_directory).unwrap();
    let pod = env
        .d
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb.clone()),
            runtime_handler: "fast".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    env.remove_pod(&pod).await;
    let err = env
        .d
        .runtime()
        .exec(cri::ExecRequest::default())
        .await
        .unwrap_err();
    // Exec is served (through the streaming server); an empty request names what is missing.
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("cmd"), "{err:?}");
    env.d
        .runtime()
        .update_runtime_config(cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: "10.244.0.0/24".into(),
                }),
            }),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn cli_pods_ps_exec_logs_stop_rm() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("clipod");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            env.container_config(
                "talker",
                &["sh", "-c", "echo line-one; echo line-two >&2; sleep 100000"],
            ),
        )
        .await;
    let out = |args: &[&str]| {
        let o = env.d.cli(args);
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            o.status.code(),
        )
    };
    let (pods, _, _) = out(&["pods"]);
    assert!(
        pods.starts_with("POD ID") && pods.contains("clipod") && pods.contains("Ready"),
        "{pods}"
    );
    let (json, _, _) = out(&["pods", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["items"][0]["id"], pod.as_str());
    let (ps, _, _) = out(&["ps"]);
    assert!(ps.contains("talker") && ps.contains("Running"), "{ps}");
    let (quiet, _, _) = out(&["ps", "-q"]);
    assert_eq!(quiet.trim(), c);
    // exec passes output and the exit code through; short IDs work
    let (o, e, code) = out(&[
        "exec",
        &c[..12],
        "--",
        "sh",
        "-c",
        "echo hi; echo err >&2; exit 4",
    ]);
    assert_eq!((o.as_str(), e.as_str(), code), ("hi\n", "err\n", Some(4)));
    let t = std::time::Instant::now();
    while !env.log(&sb, "talker").contains("line-two") {
        assert!(t.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (o, e, _) = out(&["logs", &c]);
    assert_eq!((o.as_str(), e.as_str()), ("line-one\n", "line-two\n"));
    let (o, _, _) = out(&["logs", "--tail", "1", &c]);
    assert_eq!(o, "");
    let (_, e, code) = out(&["rm", &c]);
    assert_ne!(code, Some(0));
    assert!(e.contains("running"), "{e}");
    let (_, _, code) = out(&["stop", "-t", "0", &c]);
    assert_eq!(code, Some(0));
    let (ps, _, _) = out(&["ps", "-a"]);
    assert!(ps.contains("Exited"), "{ps}");
    let (o, _, code) = out(&["inspect", &c]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    assert_eq!(v["info"]["runtimeSpec"]["process"]["args"][0], "sh");
    let (_, _, code) = out(&["rm", &c]);
    assert_eq!(code, Some(0));
    let (o, _, _) = out(&["inspectp", &pod]);
    assert!(o.contains("netNamespacePath"));
    out(&["stopp", &pod]);
    let (_, _, code) = out(&["rmp", &pod]);
    assert_eq!(code, Some(0));
    let (pods, _, _) = out(&["pods", "-q"]);
    assert!(pods.trim().is_empty());
}

#[tokio::test]
async fn limits_without_cgroup_v2_are_refused_unless_allowed() {
    let v2 = crius::runtime::cgroup::Hierarchy::detect().is_some();
    let limited = |env: &PodEnv, name: &str| {
        let mut c = env.container_config(name, LONG);
        c.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 512,
            ..Default::default()
        });
        c
    };
    let condition = |st: cri::StatusResponse| {
        st.status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.r#type == "ResourceLimitsEnforced")
            .unwrap()
    };
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("limits");
    let pod = env.run_pod(&sb).await.unwrap();
    let st = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let enforced = condition(st);
    if v2 {
        // In the VM tier: the limit is applied.
        assert!(enforced.status);
        env.run(&pod, &sb, limited(&env, "c")).await;
    } else {
        assert!(
            !enforced.status && enforced.reason == "NoCgroupV2",
            "{enforced:?}"
        );
        let err = env.create(&pod, &sb, limited(&env, "c")).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains("cgroup v2") && err.message().contains("allow_unenforced"),
            "{}",
            err.message()
        );
        // shares alone only weigh a container: not refused
        let mut shares = env.container_config("shares", LONG);
        shares.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
            cpu_shares: 2,
            ..Default::default()
        });
        env.run(&pod, &sb, shares).await;
    }
    env.remove_pod(&pod).await;
    if v2 {
        return;
    }
    // The operator's choice: run without enforcing, and say so.
    let env = PodEnv::start_with("[cgroup]\nallow_unenforced = true\n").await;
    let st = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(condition(st).message.contains("WITHOUT resource limits"));
    assert!(
        env.d.log_text().contains("WITHOUT resource limits"),
        "warned at start"
    );
    let pod = env.run_pod(&sb).await.unwrap();
    env.run(&pod, &sb, limited(&env, "c")).await;
    env.remove_pod(&pod).await;
}

fn proc_status_field(pid: i64, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// Waits until the pod's holder has exec'd the pause image's command: RunPodSandbox answers once
/// the holder is ready in the image's root, as the image's user; the exec follows at once.
async fn exec_of_image(pid: impl std::fmt::Display, command: &str) {
    let t = Instant::now();
    loop {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains(command) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{cmdline:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn configured_pause_image_holds_the_pods_namespaces() {
    let reg = shared_registry().await;
    // Shaped like registry.k8s.io/pause: a non-root user, and a command that sleeps, reaps and
    // leaves on SIGTERM.
    const PAUSE_CMD: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";
    let pause = image(
        vec![busybox_layer(Compress::Gzip)],
        &ImageOpts {
            entrypoint: &["sh", "-c", PAUSE_CMD],
            cmd: &[],
            user: "65535:65535",
            ..Default::default()
        },
    );
    reg.push_image("pause", "3.10", &pause).await.unwrap();
    let host = reg.host();
    let pause_ref = format!("{host}/pause:3.10");
    // Not pulled beforehand: the first pod pulls it.
    let d = Daemon::start(&format!("[runtime]\nsandbox_image = \"{pause_ref}\"\n"));
    let env = PodEnv {
        image: format!("{host}/busybox:test"),
        reg,
        d,
        logs: tempfile::tempdir().unwrap(),
    };
    env.d.pull(&env.image).await.unwrap();

    // A pod with its own PID namespace per container: the holder is the image's process, as the
    // image's user, with no capabilities, in the image's root.
    let sb = env.sandbox_config("imaged");
    let pod = env.run_pod(&sb).await.unwrap();
    let pid = env.pause_pid(&pod).await;
    exec_of_image(pid, PAUSE_CMD).await;
    assert!(proc_status_field(pid, "Uid").starts_with("65535\t"));
    assert!(proc_status_field(pid, "Gid").starts_with("65535\t"));
    assert_eq!(proc_status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status_field(pid, "CapBnd"), "0000000000000000");
    assert_eq!(proc_status_field(pid, "NoNewPrivs"), "1");
    assert!(Path::new(&format!("/proc/{pid}/root/bin/busybox")).exists());
    // Its containers are in the namespaces it holds.
    let c = env
        .run(&pod, &sb, env.container_config("app", &["hostname"]))
        .await;
    env.wait_exit(&c, Duration::from_secs(20)).await;
    assert_eq!(log_lines(&env.log(&sb, "app"), "stdout"), vec!["imaged"]);
    // The image is pinned, so kubelet's image GC keeps it; others are not.
    let images = env.d.list_images().await;
    let pinned: Vec<bool> = ["pause:3.10", "busybox:test"]
        .iter()
        .map(|t| {
            images
                .iter()
                .find(|i| i.repo_tags.iter().any(|r| r.ends_with(t)))
                .unwrap()
                .pinned
        })
        .collect();
    assert_eq!(pinned, vec![true, false]);

    // A pod sharing one PID namespace: the image's process is its PID 1.
    let mut shared = env.sandbox_config("shared-pid");
    let pod_ns = cri::NamespaceOption {
        pid: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    shared
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options = Some(pod_ns.clone());
    let pod2 = env.run_pod(&shared).await.unwrap();
    let mut cfg = env.container_config("ps", &["cat", "/proc/1/cmdline"]);
    cfg.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options = Some(pod_ns);
    let c2 = env.run(&pod2, &shared, cfg).await;
    env.wait_exit(&c2, Duration::from_secs(20)).await;
    let log = env.log(&shared, "ps");
    assert!(log.contains("trap 'exit 0' TERM"), "{log}");

    // A pod with its own user namespace (crius picks the IDs): the image's process runs as the
    // image's user inside it, which is no user of the host's.
    let mut userns = env.sandbox_config("userns");
    namespace_options(&mut userns).userns_options = Some(cri::UserNamespace {
        mode: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    });
    let pod3 = env.run_pod(&userns).await.unwrap();
    let pid3 = env.pause_pid(&pod3).await;
    let uid_map = std::fs::read_to_string(format!("/proc/{pid3}/uid_map")).unwrap();
    let first: Vec<u64> = uid_map
        .split_whitespace()
        .take(3)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(first[0], 0, "{uid_map}");
    assert!(first[1] > 0 && first[2] == 65536, "{uid_map}");
    let host_uid: u64 = proc_status_field(pid3, "Uid")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(host_uid, first[1] + 65535, "the image's uid 65535, mapped");
    exec_of_image(pid3, PAUSE_CMD).await;

    // Stop ends the image's process; remove leaves no mount behind.
    for p in [&pod, &pod2, &pod3] {
        let pid = env.pause_pid(p).await;
        env.stop_pod(p).await;
        // Gone, or a zombie about to be reaped, or dead while being reaped (it may be reaped
        // between two reads).
        let state = proc_status_field(pid, "State");
        assert!(
            state.is_empty() || state.starts_with('Z') || state.starts_with('X'),
            "{state}"
        );
        env.remove_pod(p).await;
    }
    let (state, root) = (env.d.state.clone(), env.d.root.clone());
    assert!(
        mounts_under(&[&state, &root]).is_empty(),
        "mounts left: {:?}",
        mounts_under(&[&state, &root])
    );

    // A pause image that cannot be pulled fails the pod with the image named, leaving nothing.
    let bad = Daemon::start(&format!("[runtime]\nsandbox_image = \"{host}/nope:1\"\n"));
    let bad_env = PodEnv {
        image: env.image.clone(),
        reg: env.reg,
        d: bad,
        logs: tempfile::tempdir().unwrap(),
    };
    let err = bad_env
        .run_pod(&bad_env.sandbox_config("orphan"))
        .await
        .unwrap_err();
    assert!(err.message().contains("nope"), "{err:?}");
    let pods = bad_env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(pods.is_empty());
    assert!(mounts_under(&[&bad_env.d.state, &bad_env.d.root]).is_empty());
    assert!(list_names(&bad_env.d.state.join("sandboxes")).is_empty());
}

/// Reads the next event (or fails after 20 s).
async fn next_event(
    events: &mut tonic::Streaming<cri::ContainerEventResponse>,
) -> cri::ContainerEventResponse {
    tokio::time::timeout(Duration::from_secs(20), events.message())
        .await
        .expect("an event within 20 s")
        .expect("the event stream")
        .expect("the stream still open")
}

/// GetContainerEvents, as kubelet's evented PLEG uses it: created, started, stopped and deleted,
/// each with the pod's status and its containers' statuses; exits that happened while no daemon
/// ran are told to the subscriber that comes after the restart.
#[tokio::test]
async fn container_events_for_the_evented_pleg() {
    let mut env = PodEnv::start().await;
    let mut events = env
        .d
        .runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let sb = env.sandbox_config("evented");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            env.container_config("once", &["sh", "-c", "exit 3"]),
        )
        .await;
    // Read only once it has ended: each event still shows the container as it was then.
    env.wait_exit(&c, Duration::from_secs(30)).await;
    use cri::ContainerEventType as T;
    let mut seen = Vec::new();
    for want in [
        T::ContainerCreatedEvent,
        T::ContainerStartedEvent,
        T::ContainerStoppedEvent,
    ] {
        let e = next_event(&mut events).await;
        assert_eq!(
            (e.container_id.as_str(), e.container_event_type),
            (c.as_str(), want as i32)
        );
        let status = e.pod_sandbox_status.expect("the pod's status");
        assert_eq!(status.id, pod);
        let mine = e
            .containers_statuses
            .iter()
            .find(|s| s.id == c)
            .expect("the container's status");
        assert!(e.created_at > 0);
        seen.push((mine.state, mine.exit_code));
    }
    use cri::ContainerState as S;
    assert_eq!(
        seen,
        [
            (S::ContainerCreated as i32, 0),
            (S::ContainerRunning as i32, 0),
            (S::ContainerExited as i32, 3)
        ]
    );
    env.d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap();
    let e = next_event(&mut events).await;
    assert_eq!(
        (e.container_id.as_str(), e.container_event_type),
        (c.as_str(), T::ContainerDeletedEvent as i32)
    );
    assert!(e.containers_statuses.iter().all(|s| s.id != c));

    // An exit while the daemon is down reaches the next subscriber.
    // It ends only once the daemon is gone: the test makes the file it waits for.
    let gate = tempfile::tempdir().unwrap();
    let mut cfg = env.container_config(
        "later",
        &[
            "sh",
            "-c",
            "until [ -e /gate/go ]; do sleep 0.05; done; exit 4",
        ],
    );
    cfg.mounts.push(cri::Mount {
        container_path: "/gate".into(),
        host_path: gate.path().display().to_string(),
        ..Default::default()
    });
    let later = env.run(&pod, &sb, cfg).await;
    env.d.kill9();
    std::fs::write(gate.path().join("go"), b"").unwrap();
    let exit = env
        .d
        .state
        .join("containers")
        .join(&later)
        .join("exit.json");
    let start = std::time::Instant::now();
    while !exit.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no exit record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.d.spawn();
    let mut events = env
        .d
        .runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let e = next_event(&mut events).await;
    assert_eq!(
        (e.container_id.as_str(), e.container_event_type),
        (later.as_str(), T::ContainerStoppedEvent as i32)
    );
    let st = e
        .containers_statuses
        .iter()
        .find(|s| s.id == later)
        .unwrap();
    assert_eq!(st.exit_code, 4);
    env.remove_pod(&pod).await;
}

/// GET on loopback with a plain HTTP/1.0 request; the body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// `[metrics] address`: the Prometheus text format on /metrics, parsed by a Prometheus parser,
/// with CRI calls, pulls, pods and containers by state and the helpers' memory.
#[tokio::test]
async fn prometheus_metrics() {
    let port = free_port();
    let env = PodEnv::start_with(&format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n")).await;
    let sb = env.sandbox_config("metered");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c", LONG)).await;
    env.exec(&c, &["true"], 10).await.unwrap();
    let (status, text) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str, label: (&str, &str)| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.get(label.0) == Some(label.1))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert!(
        value(
            "grpc_server_handled_total",
            ("grpc_method", "RunPodSandbox")
        ) >= 1.0,
        "{text}"
    );
    assert!(
        value("grpc_server_handled_total", ("grpc_code", "OK")) >= 4.0,
        "{text}"
    );
    assert!(
        value("crius_image_pulls_total", ("result", "success")) >= 1.0,
        "{text}"
    );
    assert_eq!(value("crius_pods", ("state", "ready")), 1.0, "{text}");
    assert_eq!(
        value("crius_containers", ("state", "running")),
        1.0,
        "{text}"
    );
    assert!(
        value("crius_resident_memory_bytes", ("process", "daemon")) > 0.0,
        "{text}"
    );
    assert!(
        value("crius_helper_processes", ("process", "monitor")) >= 1.0,
        "{text}"
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "grpc_server_handling_seconds_bucket"
                || s.metric == "grpc_server_handling_seconds"),
        "{text}"
    );
    assert_eq!(http_get(port, "/other").0, 404);
    env.remove_pod(&pod).await;
}

/// Every running container has CPU and memory in its stats, cgroup or not: on a host without
/// cgroup v2 they come from the container's processes (critest's "listing container stats"
/// reads both timestamps and panicked on the missing fields).
#[tokio::test]
async fn stats_of_running_containers_have_cpu_and_memory() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("stats");
    let pod = env.run_pod(&sb).await.unwrap();
    let cmd = [
        "sh",
        "-c",
        "head -c 8000000 /dev/zero | tail -c 1; while :; do :; done",
    ];
    let busy = env.run(&pod, &sb, env.container_config("busy", &cmd)).await;
    let created = env
        .create(&pod, &sb, env.container_config("created", LONG))
        .await
        .unwrap();
    let stats = |id: &str| {
        let id = id.to_string();
        let rt = env.d.runtime();
        async move {
            let mut rt = rt;
            rt.container_stats(cri::ContainerStatsRequest { container_id: id })
                .await
                .unwrap()
                .into_inner()
                .stats
                .unwrap()
        }
    };
    // A CPU rate needs two samples: ask until the runtime has them.
    let t0 = Instant::now();
    let s = loop {
        let s = stats(&busy).await;
        if s.cpu
            .as_ref()
            .and_then(|c| c.usage_nano_cores.as_ref())
            .is_some_and(|n| n.value > 0)
        {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no CPU rate: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cpu = s.cpu.expect("cpu of a running container");
    assert!(cpu.timestamp > 0);
    assert!(cpu.usage_core_nano_seconds.unwrap().value > 0, "{cpu:?}");
    assert!(
        cpu.usage_nano_cores.unwrap().value > 0,
        "a busy loop: {cpu:?}"
    );
    let mem = s.memory.expect("memory of a running container");
    assert!(mem.timestamp > 0);
    assert!(mem.working_set_bytes.unwrap().value > 0, "{mem:?}");
    // A created container has nothing running to measure, with or without a cgroup.
    let c = stats(&created).await;
    assert_eq!(c.attributes.unwrap().id, created);
    let list = env
        .d
        .runtime()
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(list.len(), 1, "running containers only");
    assert!(list[0].cpu.is_some() && list[0].memory.is_some());
    env.remove_pod(&pod).await;
}

/// crictl's way from files: runp, create (YAML and JSON configs), start; stats, statsp and
/// imagefsinfo in each output format; a broken file is named with its line.
#[tokio::test]
async fn cli_runp_create_start_and_stats() {
    let env = PodEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let logs = env.logs.path().join("filepod");
    std::fs::create_dir_all(&logs).unwrap();
    let pod_yaml = dir.path().join("pod.yaml");
    std::fs::write(
        &pod_yaml,
        format!(
            "metadata:\n  name: filepod\n  namespace: default\n  uid: filepod-uid\nlog_directory: {}\nlabels:\n  from: file\n",
            logs.display()
        ),
    )
    .unwrap();
    let ctr_json = dir.path().join("ctr.json");
    std::fs::write(
        &ctr_json,
        serde_json::json!({
            "metadata": {"name": "sleeper"},
            "image": {"image": env.image},
            "command": ["sleep", "100000"],
            "log_path": "sleeper.log"
        })
        .to_string(),
    )
    .unwrap();
    let out = |args: &[&str]| {
        let o = env.d.cli(args);
        (
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            o.status.code(),
        )
    };
    let (pod, err, code) = out(&["runp", pod_yaml.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(pod.len(), 64, "{pod}");
    let (c, err, code) = out(&[
        "create",
        &pod[..12],
        ctr_json.to_str().unwrap(),
        pod_yaml.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (_, err, code) = out(&["start", &c]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        env.status(&c).await.state,
        cri::ContainerState::ContainerRunning as i32
    );

    let (table, err, _) = out(&["stats"]);
    assert!(
        table.starts_with("CONTAINER") && table.contains("sleeper"),
        "{table} {err}"
    );
    let (json, _, _) = out(&["stats", "-o", "json", &c]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["stats"][0]["attributes"]["id"], c.as_str(), "{v}");
    let (yaml, _, _) = out(&["statsp", "-o", "yaml"]);
    assert!(yaml.contains(&pod) && yaml.contains("filepod"), "{yaml}");
    let (json, _, _) = out(&["imagefsinfo"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        v["image_filesystems"][0]["used_bytes"]["value"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );
    let (yaml, _, _) = out(&["pods", "-o", "yaml"]);
    assert!(yaml.contains(&format!("id: {pod}")), "{yaml}");

    // Broken files are named with the line, or the field.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\n  \"metadata\": {\"name\": \"x\",}\n}\n").unwrap();
    let (_, err, code) = out(&["runp", bad.to_str().unwrap()]);
    assert_ne!(code, Some(0));
    assert!(err.contains(&format!("{}:2:", bad.display())), "{err}");
    std::fs::write(&bad, r#"{"metadata": {"name": "x", "attempt": "first"}}"#).unwrap();
    let (_, err, _) = out(&["runp", bad.to_str().unwrap()]);
    assert!(err.contains("metadata.attempt"), "{err}");
    env.remove_pod(&pod).await;
}

/// Gone, or a zombie waiting for its reaper.
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// A started container outlives its monitor (the daemon may restart; a monitor may be killed):
/// the record then says exited, its end unknown, while the process still runs. Removing the
/// container ends that process before the record goes, so nothing runs that no record owns.
#[tokio::test]
async fn removing_a_container_whose_monitor_died_ends_its_process() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("orphan");
    let pod = env.run_pod(&sb).await.unwrap();
    let id = env.run(&pod, &sb, env.container_config("c", LONG)).await;
    let info = env.d.container_info(&id).await;
    let init = info["pid"].as_i64().unwrap() as i32;
    let monitor = info["monitorPid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let t = Instant::now();
    loop {
        let st = env.status(&id).await;
        if st.state == cri::ContainerState::ContainerExited as i32 {
            assert_eq!(st.reason, "Unknown", "{st:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "still {st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !ended(init),
        "the container's process ended with its monitor"
    );
    env.d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    assert!(
        ended(init),
        "process {init} outlived its container's removal"
    );
    env.remove_pod(&pod).await;
}

/// kubelet creates a container from its image's ID and names the pod's own reference in
/// `user_specified_image`: status and listing show that reference, which kubelet copies into
/// the pod's status (node e2e's image-update specs compare it with the pod's spec).
#[tokio::test]
async fn status_shows_the_image_the_user_named() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("named-image");
    let pod = env.run_pod(&sb).await.unwrap();
    let id = env
        .d
        .image_status(&env.image)
        .await
        .expect("the test image")
        .id;
    let mut cfg = env.container_config("c", LONG);
    cfg.image = Some(cri::ImageSpec {
        image: id.clone(),
        user_specified_image: env.image.clone(),
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;
    let status = env.status(&c).await;
    assert_eq!(
        status.image.as_ref().map(|i| i.image.as_str()),
        Some(env.image.as_str())
    );
    assert_eq!(
        status
            .image
            .as_ref()
            .map(|i| i.user_specified_image.as_str()),
        Some(env.image.as_str())
    );
    assert!(
        status.image_id == id || status.image_ref.contains('@'),
        "{status:?}"
    );
    let listed = env
        .d
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .containers;
    let mine = listed.iter().find(|x| x.id == c).expect("listed");
    assert_eq!(
        mine.image.as_ref().map(|i| i.image.as_str()),
        Some(env.image.as_str())
    );
    // Without a name given, the image as created.
    let plain = env
        .run(&pod, &sb, env.container_config("plain", LONG))
        .await;
    let status = env.status(&plain).await;
    assert_eq!(status.image.map(|i| i.image), Some(env.image.clone()));
    env.remove_pod(&pod).await;
}
