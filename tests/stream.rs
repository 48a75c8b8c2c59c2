//! CRI Exec and PortForward through crius's streaming server, driven by upstream clients:
//! kubestream (client-go's SPDY and WebSocket executors and port-forwarder, the code kubectl
//! uses) and crictl, both transports; plus the protocol's edges (single-use and expiring
//! tokens).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use k8s_cri::v1 as cri;

const LONG: &[&str] = &["sleep", "100000"];

fn client(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/bin")
        .join(name);
    if p.exists() {
        Some(p)
    } else {
        println!("skipped: no {name} in ../shared/bin");
        None
    }
}

async fn exec_url(env: &PodEnv, c: &str, cmd: &[&str], stdin: bool, tty: bool) -> String {
    env.d
        .runtime()
        .exec(cri::ExecRequest {
            container_id: c.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        })
        .await
        .unwrap()
        .into_inner()
        .url
}

/// Runs kubestream with `input` on its stdin; its exit code and output.
fn kubestream(bin: &Path, args: &[&str], input: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn exec_with_kubestream_both_transports() {
    let Some(ks) = client("kubestream") else {
        return;
    };
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("streams");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c", LONG)).await;
    for transport in ["spdy", "websocket"] {
        // Output and the exit code.
        let url = exec_url(
            &env,
            &c,
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            false,
            false,
        )
        .await;
        let (code, out, err) = kubestream(&ks, &["exec", "-transport", transport, &url], b"");
        assert_eq!((code, out.trim()), (3, "out"), "{transport}: {err}");
        assert!(err.contains("err"), "{transport}: {err}");
        // stdin piped through cat, with EOF.
        let url = exec_url(&env, &c, &["cat"], true, false).await;
        let (code, out, err) = kubestream(
            &ks,
            &["exec", "-transport", transport, "-stdin", &url],
            b"piped\n",
        );
        assert_eq!((code, out.as_str()), (0, "piped\n"), "{transport}: {err}");
        // A terminal: the command sees one.
        let url = exec_url(&env, &c, &["sh", "-c", "tty && stty size"], false, true).await;
        let (code, out, err) =
            kubestream(&ks, &["exec", "-transport", transport, "-tty", &url], b"");
        assert_eq!(code, 0, "{transport}: {out} {err}");
        assert!(out.contains("/dev/pts/"), "{transport}: {out}");
        // A token is good once.
        let (code, _, err) = kubestream(&ks, &["exec", "-transport", transport, &url], b"");
        assert_ne!(code, 0, "{transport}: a used token worked: {err}");
    }
    env.remove_pod(&pod).await;
}
