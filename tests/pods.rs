//! RuntimeService through the CRI socket: pods and containers on real namespaces and mounts.

mod common;

use std::time::Duration;

use common::*;

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
    let log = env.log(&sb, "hello");
    assert_eq!(log_lines(&log, "stdout"), vec!["hello", "web"], "{log}");
    assert_eq!(log_lines(&log, "stderr"), vec!["oops"], "{log}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}
