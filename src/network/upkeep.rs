//! CNI 1.1's verbs about a network as a whole: STATUS, whose answers decide `NetworkReady`, and
//! GC, which hands the plugins every attachment crius still holds so they can drop the rest
//! (host-local's addresses after a reboot emptied `/run`, where the records live, while
//! `/var/lib/cni` kept them), their IPAM plugins too. Lists of earlier CNI versions get neither: their plugins do not
//! know the verbs (Debian 12's 1.1.1 plugins among them).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::plugin::{self, Call, Op};
use super::{Error, NOT_READY, NetworkList, NetworkService, PLUGIN_TIMEOUT, Readiness};

/// STATUS is asked again after this (kubelet asks Status every 5 s; `crius check` too).
const STATUS_FOR: Duration = Duration::from_secs(2);
/// How long a plugin may take to answer STATUS: kubelet's Status call waits for it.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// The spec's key for the attachments GC keeps.
const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// One attachment a network's GC must keep.
pub struct Live {
    pub container_id: String,
    pub ifname: String,
}

impl NetworkService {
    /// `NetworkReady` as kubelet reads it: a network list, and, for a CNI 1.1 list, every
    /// plugin answering STATUS without an error.
    pub async fn readiness(&self) -> Readiness {
        let configured = self.configured();
        let Ok(list) = self.current() else {
            return configured;
        };
        if !list.has_status_and_gc() {
            return configured;
        }
        // Asked again when the list changed, too.
        let key = format!("{}\0{:?}", list.file.display(), list.modified);
        let mut last = self.status.lock().await;
        if let Some((at, k, r)) = last.as_ref()
            && at.elapsed() < STATUS_FOR
            && *k == key
        {
            return r.clone();
        }
        let answer = match self.each_plugin(&list, Op::Status, None).await {
            Ok(()) => configured,
            Err(e) => Readiness {
                ready: false,
                reason: NOT_READY.into(),
                message: format!("Network plugin returns error: {e}"),
            },
        };
        *last = Some((Instant::now(), key, answer.clone()));
        answer
    }

    /// GC of the node's network list, keeping `live` (the attachments of this list's network
    /// that crius holds); false when the list's CNI version has no GC.
    pub async fn gc(&self, live: &[Live]) -> Result<bool, Error> {
        let list = self.current()?;
        if !list.has_status_and_gc() {
            return Ok(false);
        }
        let valid: Vec<Value> = live
            .iter()
            .map(|a| serde_json::json!({"containerID": a.container_id, "ifname": a.ifname}))
            .collect();
        self.each_plugin(&list, Op::Gc, Some(Value::Array(valid)))
            .await?;
        Ok(true)
    }

    /// `op` for each plugin of `list` in order (with `valid` as the attachments to keep);
    /// the first error ends it.
    async fn each_plugin(
        &self,
        list: &NetworkList,
        op: Op,
        valid: Option<Value>,
    ) -> Result<(), Error> {
        let call = Call {
            op,
            container_id: "",
            netns: Path::new(""),
            ifname: "",
            args: "",
            bin_dirs: &self.bin_dirs,
            timeout: if op == Op::Status {
                STATUS_TIMEOUT
            } else {
                PLUGIN_TIMEOUT
            },
        };
        for p in &list.plugins {
            let mut conf =
                plugin::stdin_config(p, &list.name, &list.cni_version, None, &Map::new());
            if let (Some(v), Some(o)) = (&valid, conf.as_object_mut()) {
                o.insert(VALID_ATTACHMENTS.into(), v.clone());
            }
            plugin::run(&call, &conf).await?;
            // A plugin with an IPAM plugin should pass GC on to it; the bridge plugin of
            // v1.10 does not yet (its source says FIXME), so it is sent here, with the same
            // configuration, as the delegation would: the addresses are the IPAM plugin's.
            let ipam = p
                .get("ipam")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str);
            if let (Op::Gc, Some(ipam)) = (op, ipam) {
                plugin::run_kind(&call, ipam, &conf).await?;
            }
        }
        Ok(())
    }
}
