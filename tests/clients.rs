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
        println!("skipped: no grpcio Python at {python} (run hack/install-test-deps.sh)");
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
