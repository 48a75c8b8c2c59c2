//! What the agent knows of each pod and keeps on disk (`<state>/pods/<namespace>_<name>.json`,
//! written atomically): the pod's phase and conditions, each container's state, restarts and
//! back-off, probe results, and its events. `crius get pods` and `crius describe pod` read these
//! files; a restarted agent starts from them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Unix time in seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Waiting {
        reason: String,
        #[serde(default)]
        message: String,
    },
    Running {
        started_at: i64,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        #[serde(default)]
        message: String,
        started_at: i64,
        finished_at: i64,
    },
}

impl State {
    pub fn waiting(reason: &str, message: impl Into<String>) -> State {
        State::Waiting {
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self, State::Running { .. })
    }

    /// The short form `kubectl get pods` shows for it.
    pub fn reason(&self) -> String {
        match self {
            State::Waiting { reason, .. } => reason.clone(),
            State::Running { .. } => "Running".into(),
            State::Terminated { reason, .. } => reason.clone(),
        }
    }
}

/// A probe's current verdict on a container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ProbeState {
    /// The last result: "Success", "Failure" or "Unknown".
    pub result: String,
    pub message: String,
    /// Since when the result (and message) has been this: a record that only changes when
    /// something does is not rewritten on every probe.
    pub at: i64,
}

/// Exponential back-off of one container (or image): 10 s doubling to 300 s, forgotten after
/// ten quiet minutes, as kubelet does.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Backoff {
    /// Seconds of the current back-off; 0 when none.
    pub delay: i64,
    /// When the delay was last raised.
    pub updated: i64,
}

pub const BACKOFF_INITIAL: i64 = 10;
pub const BACKOFF_MAX: i64 = 300;

impl Backoff {
    /// Whether a restart after something ended at `since` must still wait, and until when.
    pub fn wait_until(&self, since: i64, now: i64) -> Option<i64> {
        if self.delay == 0 || now - self.updated > 2 * BACKOFF_MAX {
            return None;
        }
        let until = since + self.delay;
        (now < until).then_some(until)
    }

    /// Steps the back-off for a restart happening now.
    pub fn step(&mut self, now: i64) {
        self.delay = if self.delay == 0 || now - self.updated > 2 * BACKOFF_MAX {
            BACKOFF_INITIAL
        } else {
            (self.delay * 2).min(BACKOFF_MAX)
        };
        self.updated = now;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContainerRecord {
    pub name: String,
    /// The runtime's ID of its current (or last) container.
    #[serde(default)]
    pub id: Option<String>,
    pub image: String,
    #[serde(default)]
    pub image_id: String,
    pub state: State,
    #[serde(default)]
    pub last_state: Option<State>,
    pub restart_count: u32,
    pub ready: bool,
    pub started: bool,
    #[serde(default)]
    pub backoff: Backoff,
    #[serde(default)]
    pub pull_backoff: Backoff,
    #[serde(default)]
    pub probes: BTreeMap<String, ProbeState>,
    /// A sidecar: an init container with restartPolicy Always.
    #[serde(default)]
    pub sidecar: bool,
    /// The container whose exit is already recorded in `state`.
    #[serde(default)]
    pub exited: Option<String>,
}

impl ContainerRecord {
    pub fn new(name: &str, image: &str, sidecar: bool) -> ContainerRecord {
        ContainerRecord {
            name: name.to_string(),
            id: None,
            image: image.to_string(),
            image_id: String::new(),
            state: State::waiting("ContainerCreating", ""),
            last_state: None,
            restart_count: 0,
            ready: false,
            started: false,
            backoff: Backoff::default(),
            pull_backoff: Backoff::default(),
            probes: BTreeMap::new(),
            sidecar,
            exited: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// Which container it is about, if one.
    #[serde(default)]
    pub object: String,
    pub first: i64,
    pub last: i64,
    pub count: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Condition {
    pub kind: String,
    pub status: bool,
    pub since: i64,
}

/// How many events a pod keeps.
const MAX_EVENTS: usize = 100;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The manifest it runs and where it came from.
    pub hash: String,
    pub file: PathBuf,
    pub created_at: i64,
    pub phase: Phase,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub qos: String,
    #[serde(default)]
    pub sandbox: Option<String>,
    #[serde(default)]
    pub sandbox_attempt: u32,
    #[serde(default)]
    pub pod_ip: String,
    /// Every IP, the primary first (`pod_ip`); records written before it have only `pod_ip`.
    #[serde(default)]
    pub pod_ips: Vec<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    pub init_containers: Vec<ContainerRecord>,
    pub containers: Vec<ContainerRecord>,
    #[serde(default)]
    pub events: Vec<Event>,
}

impl PodRecord {
    /// The pod's IPs, the primary first.
    pub fn ips(&self) -> Vec<String> {
        if self.pod_ips.is_empty() && !self.pod_ip.is_empty() {
            return vec![self.pod_ip.clone()];
        }
        self.pod_ips.clone()
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn event(&mut self, kind: &str, reason: &str, object: &str, message: impl Into<String>) {
        let message = message.into();
        let t = now();
        if let Some(e) = self
            .events
            .iter_mut()
            .rev()
            .take(10)
            .find(|e| e.reason == reason && e.object == object && e.message == message)
        {
            e.count += 1;
            e.last = t;
            return;
        }
        tracing::info!(pod = %self.key(), container = object, reason, %message, "event");
        self.events.push(Event {
            kind: kind.into(),
            reason: reason.into(),
            message,
            object: object.into(),
            first: t,
            last: t,
            count: 1,
        });
        if self.events.len() > MAX_EVENTS {
            let extra = self.events.len() - MAX_EVENTS;
            self.events.drain(..extra);
        }
    }

    pub fn set_condition(&mut self, kind: &str, status: bool) {
        match self.conditions.iter_mut().find(|c| c.kind == kind) {
            Some(c) if c.status == status => {}
            Some(c) => {
                c.status = status;
                c.since = now();
            }
            None => self.conditions.push(Condition {
                kind: kind.into(),
                status,
                since: now(),
            }),
        }
    }

    pub fn condition(&self, kind: &str) -> bool {
        self.conditions.iter().any(|c| c.kind == kind && c.status)
    }

    pub fn container(&mut self, name: &str) -> Option<&mut ContainerRecord> {
        self.init_containers
            .iter_mut()
            .chain(self.containers.iter_mut())
            .find(|c| c.name == name)
    }

    pub fn all(&self) -> impl Iterator<Item = &ContainerRecord> {
        self.init_containers.iter().chain(self.containers.iter())
    }

    /// `kubectl get pods` STATUS: a waiting or failed container's reason, or the phase.
    pub fn display_status(&self) -> String {
        if !self.reason.is_empty() && matches!(self.phase, Phase::Failed | Phase::Pending) {
            return self.reason.clone();
        }
        let init_done = self.condition("Initialized");
        if !init_done {
            let total = self.init_containers.iter().filter(|c| !c.sidecar).count();
            for (i, c) in self.init_containers.iter().enumerate() {
                match &c.state {
                    State::Terminated { exit_code, .. } if *exit_code != 0 => {
                        return format!("Init:{}", c.state.reason());
                    }
                    State::Waiting { reason, .. }
                        if !reason.is_empty() && reason != "PodInitializing" =>
                    {
                        if matches!(
                            reason.as_str(),
                            "CrashLoopBackOff" | "ImagePullBackOff" | "ErrImagePull"
                        ) {
                            return format!("Init:{reason}");
                        }
                    }
                    _ => {}
                }
                if !c.sidecar && !matches!(c.state, State::Terminated { exit_code: 0, .. }) {
                    let done = self.init_containers[..i]
                        .iter()
                        .filter(|c| !c.sidecar)
                        .count();
                    return format!("Init:{done}/{total}");
                }
            }
        }
        for c in &self.containers {
            match &c.state {
                State::Waiting { reason, .. }
                    if !reason.is_empty() && reason != "ContainerCreating" =>
                {
                    return reason.clone();
                }
                State::Terminated { reason, .. }
                    if self.phase != Phase::Succeeded
                        && (self.phase == Phase::Failed || !c.ready) =>
                {
                    return reason.clone();
                }
                _ => {}
            }
        }
        if self.containers.iter().any(
            |c| matches!(&c.state, State::Waiting { reason, .. } if reason == "ContainerCreating"),
        ) {
            return "ContainerCreating".into();
        }
        match self.phase {
            Phase::Succeeded => "Completed".into(),
            p => format!("{p:?}"),
        }
    }

    /// `ready/total` of the app containers and sidecars.
    pub fn ready_count(&self) -> (usize, usize) {
        let shown: Vec<&ContainerRecord> = self
            .containers
            .iter()
            .chain(self.init_containers.iter().filter(|c| c.sidecar))
            .collect();
        (shown.iter().filter(|c| c.ready).count(), shown.len())
    }

    pub fn restarts(&self) -> u32 {
        self.all().map(|c| c.restart_count).sum()
    }
}

/// Where a pod's record lives.
pub fn record_path(state: &Path, namespace: &str, name: &str) -> PathBuf {
    state.join("pods").join(format!("{namespace}_{name}.json"))
}

pub fn save(state: &Path, r: &PodRecord) -> std::io::Result<()> {
    let path = record_path(state, &r.namespace, &r.name);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::atomic::write_json(&path, r)
}

pub fn remove(state: &Path, namespace: &str, name: &str) {
    let _ = std::fs::remove_file(record_path(state, namespace, name));
}

/// Every pod record under the state directory.
pub fn load_all(state: &Path) -> Vec<PodRecord> {
    let Ok(entries) = std::fs::read_dir(state.join("pods")) else {
        return Vec::new();
    };
    let mut out: Vec<PodRecord> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            crate::atomic::read_json::<PodRecord>(&e.path())
                .ok()
                .flatten()
        })
        .collect();
    out.sort_by_key(|r| r.key());
    out
}

/// "5s", "3m", "2h", "4d" as kubectl prints ages.
pub fn age(since: i64, now: i64) -> String {
    let s = (now - since).max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m", s / 60)
    } else if s < 172_800 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86400)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::default();
        assert_eq!(b.wait_until(100, 101), None, "the first restart is at once");
        b.step(101);
        assert_eq!(b.delay, 10);
        assert_eq!(b.wait_until(105, 106), Some(115));
        assert_eq!(b.wait_until(105, 116), None);
        for _ in 0..10 {
            b.step(120);
        }
        assert_eq!(b.delay, BACKOFF_MAX);
        // Ten quiet minutes and more: forgotten.
        assert_eq!(b.wait_until(800, 801), None);
        b.step(801);
        assert_eq!(b.delay, BACKOFF_INITIAL);
    }

    #[test]
    fn ages() {
        assert_eq!(age(0, 5), "5s");
        assert_eq!(age(0, 600), "10m");
        assert_eq!(age(0, 7300), "2h");
        assert_eq!(age(0, 200_000), "2d");
    }
}
