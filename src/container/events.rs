//! Container lifecycle events for kubelet's evented PLEG (GetContainerEvents): a notice per
//! creation, start, stop and removal, broadcast to every subscriber. The daemon never waits for
//! a subscriber: each has a bounded buffer, and one that falls behind is told so and dropped
//! (kubelet then relists and subscribes again). Exits that monitors recorded while no daemon
//! ran are found at start-up and kept for a while, so the subscriber that connects after a
//! restart hears of them too.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

/// Notices a subscriber may fall behind by before it is dropped.
pub const SUBSCRIBER_BUFFER: usize = 1024;
/// How long the exits found at start-up are replayed to new subscribers.
const REPLAY_FOR: Duration = Duration::from_secs(300);

/// What happened to a container, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub container_id: String,
    pub sandbox_id: String,
    pub kind: EventKind,
    pub at: i64,
    /// The container's status when it happened (a start right after a creation must not show
    /// in the creation's event); none for a removal.
    pub status: Option<Box<super::ContainerStatus>>,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

pub struct Events {
    tx: broadcast::Sender<Notice>,
    /// Exits found while reading the records back, with when the daemon started.
    recovered: Mutex<(Instant, Vec<Notice>)>,
}

impl Events {
    pub fn new(buffer: usize) -> Events {
        Events {
            tx: broadcast::channel(buffer).0,
            recovered: Mutex::new((Instant::now(), Vec::new())),
        }
    }

    /// Tells every subscriber; never blocks.
    pub fn emit(&self, notice: Notice) {
        let _ = self.tx.send(notice);
    }

    /// Keeps an exit found at start-up for the first subscribers.
    pub fn recovered(&self, notice: Notice) {
        self.recovered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .push(notice);
    }

    /// A new subscription: the start-up exits still worth telling, then every notice.
    pub fn subscribe(&self) -> Subscription {
        let rx = self.tx.subscribe();
        let (since, found) = &mut *self.recovered.lock().unwrap_or_else(|p| p.into_inner());
        let replay = if since.elapsed() < REPLAY_FOR {
            found.clone()
        } else {
            // Past telling: let them go.
            *found = Vec::new();
            Vec::new()
        };
        Subscription { replay, rx }
    }
}

/// One subscriber's view.
pub struct Subscription {
    replay: Vec<Notice>,
    rx: broadcast::Receiver<Notice>,
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    #[error("the subscriber fell {0} events behind and was dropped; relist and subscribe again")]
    TooSlow(u64),
    #[error("the daemon is shutting down")]
    Closed,
}

impl Subscription {
    /// The next notice.
    pub async fn next(&mut self) -> Result<Notice, Ended> {
        if !self.replay.is_empty() {
            return Ok(self.replay.remove(0));
        }
        match self.rx.recv().await {
            Ok(n) => Ok(n),
            Err(broadcast::error::RecvError::Lagged(n)) => Err(Ended::TooSlow(n)),
            Err(broadcast::error::RecvError::Closed) => Err(Ended::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(id: &str, kind: EventKind) -> Notice {
        Notice {
            container_id: id.into(),
            sandbox_id: "pod".into(),
            kind,
            at: 1,
            status: None,
        }
    }

    #[tokio::test]
    async fn every_subscriber_hears_and_a_slow_one_is_dropped() {
        let events = Events::new(4);
        events.recovered(notice("exited-while-down", EventKind::Stopped));
        let mut fast = events.subscribe();
        let mut slow = events.subscribe();
        assert_eq!(fast.next().await.unwrap().container_id, "exited-while-down");
        for i in 0..10 {
            events.emit(notice(&format!("c{i}"), EventKind::Created));
            // The fast one keeps up; the slow one never reads.
            assert_eq!(fast.next().await.unwrap().container_id, format!("c{i}"));
        }
        assert_eq!(slow.next().await.unwrap().container_id, "exited-while-down");
        assert!(matches!(slow.next().await, Err(Ended::TooSlow(_))));
    }
}
