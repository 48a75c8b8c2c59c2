//! One NRI plugin: its registration, configuration and synchronization over its trunk, and
//! the calls made to it afterwards. A plugin is either external (it connected to the socket)
//! or launched here from the plugin directory (it is killed when it is dropped).

use std::sync::Arc;
use std::time::Duration;

use super::api;
use super::ttrpc::{CallError, Serve, Status, Trunk, UNIMPLEMENTED};

pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// Every event a plugin can subscribe to (bits 1..=14); `1 << (event - 1)` is an event's bit.
pub const VALID_EVENTS: i32 = (1 << 14) - 1;

/// Why a plugin was not taken on.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("no registration within {0:?}")]
    NoRegistration(Duration),
    #[error("plugin name {name:?} is not made of letters, digits and _.+-")]
    BadName { name: String },
    #[error("plugin index {idx:?} is not two digits")]
    BadIndex { idx: String },
    #[error("plugin subscribed to unknown events ({events:#x})")]
    BadEvents { events: i32 },
    #[error("{0}")]
    Call(#[from] CallError),
    #[error("plugin answered a chunk of Synchronize with updates or without more")]
    BadChunk,
}

/// A plugin taken on: its name, index, the events it wants and its trunk.
pub struct Plugin {
    pub name: String,
    pub idx: String,
    pub events: i32,
    pub trunk: Trunk,
    /// The process of a launched plugin (killed on drop).
    child: std::sync::Mutex<Option<tokio::process::Child>>,
}

impl Plugin {
    /// `idx-name`, as logs and errors name it.
    pub fn id(&self) -> String {
        format!("{}-{}", self.idx, self.name)
    }

    pub fn wants(&self, event: api::Event) -> bool {
        self.events & (1 << (event as i32 - 1)) != 0
    }

    /// One call on the plugin's service.
    pub async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        self.trunk.call(PLUGIN_SERVICE, method, req, timeout).await
    }

    /// Ends the plugin: its trunk closes and a launched one is killed (tokio reaps it).
    pub fn close(&self) {
        self.trunk.close();
        if let Some(c) = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            let _ = c.start_kill();
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.close();
    }
}

/// What a plugin may call on the runtime's side of its trunk.
pub trait RuntimeCalls: Send + Sync + 'static {
    /// UpdateContainers: the updates and evictions that failed.
    fn update_containers(
        &self,
        plugin: String,
        req: api::UpdateContainersRequest,
    ) -> std::pin::Pin<Box<dyn Future<Output = api::UpdateContainersResponse> + Send>>;
}

/// The runtime service on one plugin's trunk: the registration (told once) and updates.
struct RuntimeServer {
    registered: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<api::RegisterPluginRequest>>>,
    name: std::sync::Mutex<String>,
    calls: Arc<dyn RuntimeCalls>,
}

impl Serve for RuntimeServer {
    fn serve(
        &self,
        service: String,
        method: String,
        payload: bytes::Bytes,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>> {
        use prost::Message;
        let unimplemented = Status {
            code: UNIMPLEMENTED,
            message: format!("{service}/{method} is not served"),
        };
        let bad = |e: prost::DecodeError| Status {
            code: 3,
            message: format!("{method}: {e}"),
        };
        if service != RUNTIME_SERVICE {
            return Box::pin(async move { Err(unimplemented) });
        }
        match method.as_str() {
            "RegisterPlugin" => {
                let r = api::RegisterPluginRequest::decode(payload).map_err(bad);
                if let Ok(req) = &r {
                    *self.name.lock().unwrap_or_else(|p| p.into_inner()) =
                        format!("{}-{}", req.plugin_idx, req.plugin_name);
                }
                let tx = self
                    .registered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                Box::pin(async move {
                    let req = r?;
                    match tx {
                        Some(tx) => {
                            let _ = tx.send(req);
                            Ok(api::Empty {}.encode_to_vec())
                        }
                        None => Err(Status {
                            code: 9,
                            message: "plugin already registered".into(),
                        }),
                    }
                })
            }
            "UpdateContainers" => {
                let calls = self.calls.clone();
                let name = self.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let r = api::UpdateContainersRequest::decode(payload).map_err(bad);
                Box::pin(async move { Ok(calls.update_containers(name, r?).await.encode_to_vec()) })
            }
            _ => Box::pin(async move { Err(unimplemented) }),
        }
    }
}

/// Timeouts of a plugin's setup.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub registration: Duration,
    pub request: Duration,
    /// Synchronize may take longer than an event: a plugin catching up on a full node.
    pub sync: Duration,
}

/// Takes a plugin on from its first bytes to configured: it must register within the
/// registration timeout and accept the configuration. `launched` carries the name and index
/// from a launched plugin's file name, which win over what it says.
pub async fn register(
    stream: tokio::net::UnixStream,
    launched: Option<(String, String, tokio::process::Child)>,
    config: String,
    timeouts: Timeouts,
    calls: Arc<dyn RuntimeCalls>,
) -> Result<Plugin, SetupError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = Arc::new(RuntimeServer {
        registered: std::sync::Mutex::new(Some(tx)),
        name: std::sync::Mutex::new(String::new()),
        calls,
    });
    let trunk = Trunk::start(stream, server);
    let (name, idx, child) = match launched {
        Some((name, idx, child)) => (name, idx, Some(child)),
        None => (String::new(), String::new(), None),
    };
    let launched = child.is_some();
    let mut plugin = Plugin {
        name,
        idx,
        events: 0,
        trunk,
        child: std::sync::Mutex::new(child),
    };
    let req = match tokio::time::timeout(timeouts.registration, rx).await {
        Ok(Ok(req)) => req,
        Ok(Err(_)) => return Err(SetupError::Call(CallError::Closed)),
        Err(_) => return Err(SetupError::NoRegistration(timeouts.registration)),
    };
    if !launched {
        check_name(&req.plugin_name, &req.plugin_idx)?;
        plugin.name = req.plugin_name;
        plugin.idx = req.plugin_idx;
    }
    let reply: api::ConfigureResponse = plugin
        .call(
            "Configure",
            &api::ConfigureRequest {
                config,
                runtime_name: "crius".into(),
                runtime_version: env!("CARGO_PKG_VERSION").into(),
                registration_timeout: timeouts.registration.as_millis() as i64,
                request_timeout: timeouts.request.as_millis() as i64,
                nri_version: super::NRI_VERSION.into(),
            },
            timeouts.request,
        )
        .await?;
    plugin.events = match reply.events {
        0 => VALID_EVENTS,
        e if e & !VALID_EVENTS != 0 => return Err(SetupError::BadEvents { events: e }),
        e => e,
    };
    Ok(plugin)
}

/// Names as the NRI library accepts them from plugins that connect on their own.
pub fn check_name(name: &str, idx: &str) -> Result<(), SetupError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
    {
        return Err(SetupError::BadName { name: name.into() });
    }
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SetupError::BadIndex { idx: idx.into() });
    }
    Ok(())
}

/// Hands the plugin every pod and container there is; the updates it asks for in answer.
pub async fn synchronize(
    plugin: &Plugin,
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    timeout: Duration,
) -> Result<Vec<api::ContainerUpdate>, SetupError> {
    let reply: api::SynchronizeResponse = plugin
        .call(
            "Synchronize",
            &api::SynchronizeRequest {
                pods,
                containers,
                more: false,
            },
            timeout,
        )
        .await?;
    if reply.more {
        return Err(SetupError::BadChunk);
    }
    Ok(reply.update)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indexes() {
        assert!(check_name("logger", "10").is_ok());
        assert!(check_name("ulimit-adjuster.v2+x_y", "00").is_ok());
        assert!(matches!(
            check_name("", "10"),
            Err(SetupError::BadName { .. })
        ));
        assert!(matches!(
            check_name("a/b", "10"),
            Err(SetupError::BadName { .. })
        ));
        assert!(matches!(
            check_name("a", "1"),
            Err(SetupError::BadIndex { .. })
        ));
        assert!(matches!(
            check_name("a", "1x"),
            Err(SetupError::BadIndex { .. })
        ));
    }

    #[test]
    fn event_bits() {
        assert_eq!(VALID_EVENTS, 0x3fff);
        assert_eq!(1 << (api::Event::StopContainer as i32 - 1), 0x200);
    }
}
