//! Bad input and cancelled calls, as a CRI fuzzer found them: each answer names the field, and
//! nothing runs on after its client has gone.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

#[tokio::test]
async fn exec_arguments_past_one_socket_read_arrive_whole() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("args");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("args", LONG)).await;
    // About 60 KB of request: more than the monitor's first read takes.
    let mut cmd = vec!["echo"];
    cmd.extend(std::iter::repeat_n("xx", 20_000));
    let (out, err, code) = env.exec(&c, &cmd, 20).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.len(), 60_000);
    assert_eq!(out.split_whitespace().count(), 20_000);
    // A command that names nothing runnable is the caller's error, named: missing, a
    // directory, a device.
    for cmd in ["no-such-program", "/", "/dev/null"] {
        let e = env.exec(&c, &[cmd], 10).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{cmd}: {e:?}");
        assert!(e.message().contains("cmd"), "{cmd}: {e:?}");
    }
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn numbers_that_do_not_fit_are_refused_by_name() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("numbers");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(&pod, &sb, env.container_config("numbers", LONG))
        .await;
    // Seconds whose milliseconds wrap around a u64.
    let t = Instant::now();
    let e = env
        .exec(&c, &["true"], 18_446_744_073_709_552)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("timeout"), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // oom_score_adj past the kernel's range, and past 32 bits (4294967301 would wrap to 5).
    for adj in [1001i64, -1001, 4_294_967_301] {
        let mut cfg = env.container_config(&format!("adj{}", adj.abs()), LONG);
        cfg.linux.as_mut().unwrap().resources = Some(cri::LinuxContainerResources {
            oom_score_adj: adj,
            ..Default::default()
        });
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{adj}: {e:?}");
        assert!(e.message().contains("oom_score_adj"), "{adj}: {e:?}");
    }
    env.remove_pod(&pod).await;
}

/// A working directory that is a file in the image is refused by name, before anything runs;
/// a missing one is made.
#[tokio::test]
async fn a_working_dir_that_is_a_file_is_named() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("workdir");
    let pod = env.run_pod(&sb).await.unwrap();
    for dir in ["/etc/passwd", "/etc/passwd/x"] {
        let mut cfg = env.container_config("workdir", LONG);
        cfg.working_dir = dir.into();
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{dir}: {e:?}");
        assert!(e.message().contains("working_dir"), "{dir}: {e:?}");
    }
    let mut cfg = env.container_config("workdir", &["pwd"]);
    cfg.working_dir = "/made/here".into();
    let c = env.create(&pod, &sb, cfg).await.unwrap();
    env.d
        .runtime()
        .start_container(cri::StartContainerRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap();
    env.remove_pod(&pod).await;
}

/// Sysctl values the kernel refuses are the caller's error, named by sysctl, and the pod they
/// were for leaves nothing behind: the same pod runs with good values after.
#[tokio::test]
async fn sysctl_values_the_kernel_refuses_are_named() {
    let env = PodEnv::start().await;
    for (key, value) in [
        ("net.core.somaxconn", "-1"),
        ("net.ipv4.ip_local_port_range", "1 0"),
    ] {
        let mut sb = env.sandbox_config("sysctls");
        sb.linux.as_mut().unwrap().sysctls = [(key.to_string(), value.to_string())].into();
        let e = env.run_pod(&sb).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{key}: {e:?}");
        assert!(
            e.message().contains(&format!("sysctls[{key}]")),
            "{key}: {e:?}"
        );
    }
    let mut sb = env.sandbox_config("sysctls");
    sb.linux.as_mut().unwrap().sysctls =
        [("net.core.somaxconn".to_string(), "1024".to_string())].into();
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(&pod, &sb, env.container_config("sysctls", LONG))
        .await;
    let (out, _, _) = env
        .exec(&c, &["cat", "/proc/sys/net/core/somaxconn"], 10)
        .await
        .unwrap();
    assert_eq!(out.trim(), "1024");
    env.remove_pod(&pod).await;
}

/// The container's processes whose command line is `args`, from its own `ps`.
async fn running(env: &PodEnv, c: &str, args: &str) -> usize {
    let (out, _, _) = env.exec(c, &["ps", "-o", "args"], 10).await.unwrap();
    out.lines().filter(|l| l.trim() == args).count()
}

#[tokio::test]
async fn a_cancelled_exec_sync_ends_its_command() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("cancel");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(&pod, &sb, env.container_config("cancel", LONG))
        .await;
    let mut req = tonic::Request::new(cri::ExecSyncRequest {
        container_id: c.clone(),
        cmd: vec!["sleep".into(), "600".into()],
        timeout: 0,
    });
    req.set_timeout(Duration::from_millis(500));
    let e = env.d.runtime().exec_sync(req).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{e:?}"
    );
    // containerd kills the command when its call ends; so does crius.
    let t = Instant::now();
    while running(&env, &c, "sleep 600").await > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "sleep 600 still runs after its ExecSync was cancelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A command whose client stays runs to its end.
    let (out, _, code) = env
        .exec(&c, &["sh", "-c", "sleep 1; echo done"], 10)
        .await
        .unwrap();
    assert_eq!((out.as_str(), code), ("done\n", 0));
    env.remove_pod(&pod).await;
}

/// An HTTP/2 frame: its header (length, type, flags, stream) and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Unfinished connections hold little: 64 connections that each send a MiB of one header block
/// and never end it add a few MiB to the daemon at most (each held a MiB before), and it still
/// answers. Past 1024 open connections a new one waits until another leaves.
#[tokio::test]
async fn unfinished_connections_hold_little() {
    let d = Daemon::start("");
    let pid = d.pid().unwrap();
    let version = || async {
        tokio::time::timeout(
            Duration::from_secs(2),
            d.runtime().version(cri::VersionRequest::default()),
        )
        .await
    };
    version().await.unwrap().unwrap();
    let before = rss_kib(pid);
    // A header as HPACK writes it without indexing: name `x-a`, a 100-byte value; 10,000 of them.
    let mut field = vec![0x00, 0x03];
    field.extend_from_slice(b"x-a");
    field.push(100);
    field.extend(std::iter::repeat_n(b'v', 100));
    let block = field.repeat(10_000);
    let socket = d.socket.clone();
    let held = tokio::task::spawn_blocking(move || {
        (0..64)
            .map(|_| {
                let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                out.extend(frame(0x4, 0, 0, &[]));
                for (i, chunk) in block.chunks(16_384).enumerate() {
                    // HEADERS, then CONTINUATION frames, none with END_HEADERS.
                    out.extend(frame(if i == 0 { 0x1 } else { 0x9 }, 0, 1, chunk));
                }
                // The server may stop reading, or close, once it has had enough.
                let _ = std::io::Write::write_all(&mut s, &out);
                s
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss_kib(pid) - before;
    println!("64 unfinished header blocks of a MiB: the daemon grew by {grown} KiB");
    assert!(
        grown < 16 * 1024,
        "64 unfinished header blocks added {grown} KiB"
    );
    version().await.unwrap().unwrap();
    drop(held);

    // 1024 connections that say nothing hold every place; a call waits until one leaves.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let socket = d.socket.clone();
    let mut idle: Vec<_> = (0..1024)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut client = d.runtime();
    let waiting = tokio::spawn(async move { client.version(cri::VersionRequest::default()).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "a call past 256 connections was served"
    );
    idle.truncate(200);
    let answered = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(
        matches!(answered, Ok(Ok(Ok(_)))),
        "the waiting call was not served: {answered:?}"
    );
    drop(idle);
}
