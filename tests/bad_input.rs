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
