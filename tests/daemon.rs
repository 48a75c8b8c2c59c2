//! The daemon's own start: a second daemon on the same root is refused by the root's lock; a
//! socket that another runtime serves is refused after a grace (a killed crius's listener may
//! linger for a moment in a helper it was starting); a dead daemon's socket file is taken over.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Runs `crius daemon` on `d`'s directories with `socket`; returns how it ended and its output,
/// or None if it was still running after `limit` (it is killed then).
fn run_daemon(
    d: &Daemon,
    root: &std::path::Path,
    socket: &std::path::Path,
    limit: Duration,
) -> Option<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crius"))
        .arg("daemon")
        .arg("--config")
        .arg(&d.config)
        .arg("--root")
        .arg(root)
        .arg("--state")
        .arg(d.dir.path().join("state2"))
        .arg("--socket")
        .arg(socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Some(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test]
async fn a_second_daemon_and_a_foreign_socket_are_refused() {
    let d = Daemon::start("");
    // The same root: refused at once by its lock.
    let other_socket = d.dir.path().join("other.sock");
    let out = run_daemon(&d, &d.root, &other_socket, Duration::from_secs(10))
        .expect("a second daemon on the same root ran on");
    assert!(out.contains("crius.lock"), "{out}");
    // Another root, but the first daemon's socket: refused, after the grace.
    let root2 = d.dir.path().join("root2");
    let t = Instant::now();
    let out = run_daemon(&d, &root2, &d.socket, Duration::from_secs(20))
        .expect("a daemon on a served socket ran on");
    assert!(out.contains("already serving"), "{out}");
    assert!(
        t.elapsed() >= Duration::from_secs(4),
        "refused before the grace: {:?}",
        t.elapsed()
    );
    // The first daemon still answers.
    d.runtime()
        .version(crius::cri::v1::VersionRequest::default())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(d.dir.path().join("state2"));
}
