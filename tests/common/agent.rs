//! The pod agent as the tests run it: a `crius agent` process with its own manifest, state and
//! log directories, driving a test daemon through its socket, and ways to wait on its records.

#![allow(clippy::unwrap_used)] // test scaffolding: a failure here is the test's failure

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crius::frontend::status::{self, PodRecord};

use super::{Daemon, unmount_under};

pub struct Agent {
    pub manifests: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

pub fn bin() -> String {
    std::env::var("CRIUS_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_crius").to_string())
}

impl Agent {
    pub fn start(d: &Daemon) -> Agent {
        Agent::start_with(d, "")
    }

    /// With `config` as the agent's config file.
    pub fn start_with(d: &Daemon, config: &str) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("crius-agent")
            .tempdir()
            .unwrap();
        let mut a = Agent {
            manifests: dir.path().join("manifests"),
            state: dir.path().join("state"),
            logs: dir.path().join("logs"),
            socket: d.socket.clone(),
            log: dir.path().join("agent.log"),
            config: dir.path().join("config.toml"),
            child: None,
            _dir: dir,
        };
        std::fs::create_dir_all(&a.manifests).unwrap();
        std::fs::write(&a.config, config).unwrap();
        a.spawn();
        a
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(bin())
            .args(["agent", "--config"])
            .arg(&self.config)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--state")
            .arg(&self.state)
            .arg("--log-dir")
            .arg(&self.logs)
            .args(["--log-level", "info,crius=debug"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the agent");
        self.child = Some(child);
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn put(&self, name: &str, yaml: &str) {
        // Written aside and renamed in, as an editor or `crius run` would.
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests.join(name)).unwrap();
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).unwrap();
    }

    pub fn record(&self, name: &str) -> Option<PodRecord> {
        status::load_all(&self.state)
            .into_iter()
            .find(|r| r.name == name)
    }

    /// Waits until the pod's record satisfies `ok`; returns it.
    pub fn wait(
        &self,
        name: &str,
        what: &str,
        secs: u64,
        ok: impl Fn(&PodRecord) -> bool,
    ) -> PodRecord {
        let start = Instant::now();
        loop {
            if let Some(r) = self.record(name)
                && ok(&r)
            {
                return r;
            }
            if start.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "pod {name}: {what} not within {secs}s\nrecord: {:#?}\nagent log:\n{}",
                    self.record(name),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin())
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .unwrap()
    }

    /// A container's log lines (content only) of its `attempt`th run.
    pub fn log(&self, r: &PodRecord, container: &str, attempt: u32) -> Vec<String> {
        let p = self
            .logs
            .join(format!("{}_{}_{}", r.namespace, r.name, r.uid))
            .join(container)
            .join(format!("{attempt}.log"));
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(String::from))
            .collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
        // The volumes of pods the test left (secrets and memory-backed emptyDirs are tmpfs):
        // the killed agent cannot unmount them, and the directory cannot go while they stay.
        unmount_under(&[&self.state]);
    }
}
