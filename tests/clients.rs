//! CRI clients that are not crius's own, against a crius daemon: they must work unchanged.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Where hack/install-test-deps.sh puts a Python with a current `grpcio` (gRPC's C core).
const GRPCIO_PYTHON: &str = "/opt/crius-test/grpcio/bin/python3";

#[tokio::test]
async fn grpc_c_core_client_is_served() {
    let python = std::env::var("CRIUS_GRPCIO_PYTHON").unwrap_or_else(|_| GRPCIO_PYTHON.into());
    if !Path::new(&python).exists() {
        missing(&format!(
            "the grpcio Python at {python} (hack/install-test-deps.sh installs it)"
        ));
        return;
    }
    let d = Daemon::start("");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc_c_core.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&d.socket)
        .output()
        .expect("running the grpcio client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "grpcio client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 13, "{stdout}");
    assert!(stdout.contains(" ok"), "{stdout}");
}

/// `crius check` reads the node and prints every item with its level, exiting with the worst;
/// `crius info` shows the running daemon's conditions, features and configuration.
#[tokio::test]
async fn check_and_info() {
    let d = Daemon::start("[metrics]\naddress = \"127.0.0.1:0\"\n");
    let out = Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["check", "--config"])
        .arg(&d.config)
        .args(["-o", "json"])
        .output()
        .unwrap();
    let items: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = items.iter().map(|i| i["item"].as_str().unwrap()).collect();
    for want in [
        "kernel",
        "cgroup v2",
        "device control",
        "overlayfs",
        "idmapped mounts",
        "seccomp",
        "LSM",
        "CNI",
        "capabilities",
        "free space",
        "signature policy",
        "checkpoint",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    let worst = items
        .iter()
        .map(|i| match i["level"].as_str().unwrap() {
            "ok" => 0,
            "warn" => 1,
            _ => 2,
        })
        .max()
        .unwrap();
    assert_eq!(out.status.code(), Some(worst));
    assert!(
        items
            .iter()
            .all(|i| i["level"] == "ok" || !i["fix"].as_str().unwrap().is_empty())
    );

    let out = d.cli(&["info"]);
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["info"]["runtime"], "crius");
    assert_eq!(info["config"]["metrics"]["address"], "127.0.0.1:0");
    assert!(info["features"]["cgroupDriver"].is_string(), "{info}");
    assert!(
        info["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "RuntimeReady" && c["status"] == true),
        "{info}"
    );
}

/// `log_format = "json"`: every line the daemon logs is one JSON object, with its fields.
#[tokio::test]
async fn json_logs() {
    let d = Daemon::start("log_format = \"json\"\n");
    let out = d.cli(&["version"]);
    assert!(out.status.success(), "{out:?}");
    d.cli(&["inspectp", "no-such-pod"]);
    let text = d.log_text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string())
    );
    assert!(lines.iter().any(|l| l["message"].is_string()), "{text}");
}
