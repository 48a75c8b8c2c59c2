//! What the runtime says of the pod's containers: exits seen on the relist (or asked about
//! directly), with their termination messages, recorded; and the pod's phase and conditions
//! derived from the containers' states.

use crate::cri::v1 as cri;

use super::Worker;
use crate::frontend::status::{Phase, State, now};

impl Worker {
    /// Brings the container records up to date with the runtime.
    pub(super) async fn observe(&mut self) {
        self.observe_with(false).await
    }

    /// After stopping containers: the last relist predates their exits, so every container
    /// recorded as running is asked about directly.
    pub(super) async fn observe_stopped(&mut self) {
        self.observe_with(true).await
    }

    async fn observe_with(&mut self, ask_running: bool) {
        let snapshot = self.sh.relist.borrow().clone();
        let names: Vec<String> = self.rec.all().map(|c| c.name.clone()).collect();
        for name in names {
            let Some(rec) = self.rec.container(&name) else {
                continue;
            };
            let Some(id) = rec.id.clone() else {
                continue;
            };
            if rec.exited.as_deref() == Some(id.as_str()) {
                continue;
            }
            let seen = snapshot.containers.get(&id).map(|c| c.state);
            let exited = seen == Some(cri::ContainerState::ContainerExited as i32)
                || ((seen.is_none() || ask_running) && rec.state.is_running());
            if !exited || matches!(rec.state, State::Terminated { .. }) {
                continue;
            }
            let st = self
                .sh
                .rt
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().status);
            let term = match st {
                Some(s) if s.state == cri::ContainerState::ContainerExited as i32 => {
                    let mut message = s.message.clone();
                    if message.is_empty() {
                        message = self.termination_message(&name, s.exit_code);
                    }
                    State::Terminated {
                        exit_code: s.exit_code,
                        reason: if s.reason.is_empty() {
                            if s.exit_code == 0 {
                                "Completed".into()
                            } else {
                                "Error".into()
                            }
                        } else {
                            s.reason
                        },
                        message,
                        started_at: s.started_at / 1_000_000_000,
                        finished_at: s.finished_at / 1_000_000_000,
                    }
                }
                Some(_) => continue,
                None => State::Terminated {
                    exit_code: 137,
                    reason: "ContainerStatusUnknown".into(),
                    message: "The container could not be located when the pod was terminated"
                        .into(),
                    started_at: 0,
                    finished_at: now(),
                },
            };
            self.stop_probes(&name);
            if let Some(rec) = self.rec.container(&name) {
                rec.state = term;
                rec.exited = Some(id);
                rec.ready = false;
            }
        }
    }

    /// The termination message a container left in its file (or its log's tail, by policy).
    fn termination_message(&self, name: &str, exit_code: i32) -> String {
        let path = self.pod_dir().join("termination").join(name);
        let msg = std::fs::read(&path)
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
            .unwrap_or_default();
        if !msg.is_empty() {
            return msg;
        }
        let fallback = self
            .spec()
            .containers
            .iter()
            .chain(self.spec().init_containers.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| c.termination_message_policy.clone())
            .is_some_and(|p| p == "FallbackToLogsOnError");
        if fallback && exit_code != 0 {
            let restarts = self
                .rec
                .all()
                .find(|c| c.name == name)
                .map(|c| c.restart_count)
                .unwrap_or(0);
            let log = self.log_dir().join(name).join(format!("{restarts}.log"));
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3))
                .collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            return tail
                .chars()
                .rev()
                .take(2048)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
        }
        String::new()
    }

    /// Phase and conditions from the containers' states.
    pub(super) fn update_phase(&mut self) {
        let policy = self.restart_policy();
        let r = &mut self.rec;
        if r.phase == Phase::Failed
            && matches!(
                r.reason.as_str(),
                "Init:Error" | "DeadlineExceeded" | "Evicted"
            )
        {
            r.set_condition("Ready", false);
            r.set_condition("ContainersReady", false);
            return;
        }
        let (mut running, mut restarting, mut not_started) = (false, false, false);
        let mut codes = Vec::new();
        for c in &r.containers {
            match &c.state {
                State::Running { .. } => running = true,
                State::Terminated { exit_code, .. } => {
                    if policy == "Always" || (policy == "OnFailure" && *exit_code != 0) {
                        restarting = true;
                    } else {
                        codes.push(*exit_code);
                    }
                }
                State::Waiting { .. } => {
                    if c.id.is_some() || c.last_state.is_some() {
                        restarting = true;
                    } else {
                        not_started = true;
                    }
                }
            }
        }
        r.phase = if !r.condition("Initialized") || not_started {
            Phase::Pending
        } else if running || restarting {
            Phase::Running
        } else if codes.iter().all(|c| *c == 0) {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
        r.reason.clear();
        let ready = r.phase == Phase::Running
            && r.containers.iter().all(|c| c.ready)
            && r.init_containers
                .iter()
                .filter(|c| c.sidecar)
                .all(|c| c.ready);
        r.set_condition("ContainersReady", ready);
        r.set_condition("Ready", ready);
        if !r.conditions.iter().any(|c| c.kind == "Initialized") {
            r.set_condition("Initialized", false);
        }
    }
}
