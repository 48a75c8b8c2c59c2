//! The fan-out against scripted plugins on a real socket (upstream's plugins, in
//! `tests/nri.rs`, neither reject, hang nor update): a validator that rejects, a plugin whose
//! handler fails, one that never answers, and one that updates and evicts containers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::net::UnixStream;

use super::plugin::RUNTIME_SERVICE;
use super::ttrpc::{Serve, Status, Trunk};
use super::{Answer, Error, Inventory, Nri, Settings, api};

/// What a scripted plugin does with a call: answer with this payload, fail with this
/// message, or never answer.
enum Reply {
    With(Vec<u8>),
    Fail(&'static str),
    Hang,
}

type Script = fn(&str, &Bytes) -> Reply;

/// Lists nothing; keeps the updates and evictions it is asked for and fails the updates of
/// containers named "missing".
#[derive(Default)]
struct Recording {
    applied: Mutex<Vec<(Vec<api::ContainerUpdate>, Vec<api::ContainerEviction>)>>,
}

impl Inventory for Recording {
    fn snapshot(&self) -> Answer<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        Box::pin(async { (Vec::new(), Vec::new()) })
    }
    fn apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Answer<Vec<api::ContainerUpdate>> {
        let failed = updates
            .iter()
            .filter(|u| u.container_id == "missing")
            .cloned()
            .collect();
        self.applied.lock().unwrap().push((updates, evictions));
        Box::pin(async move { failed })
    }
}

async fn started(dir: &std::path::Path, inventory: Arc<Recording>) -> Nri {
    let nri = Nri::new(Settings {
        socket: Some(dir.join("nri.sock")),
        plugin_dir: dir.join("none"),
        plugin_config_dir: dir.join("none"),
        registration_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_millis(500),
    });
    nri.serve(inventory).await;
    nri
}

/// A plugin's side of the protocol: subscribes to `events` and answers per `script`.
struct Scripted {
    events: i32,
    script: Script,
}

impl Serve for Scripted {
    fn serve(
        &self,
        _service: String,
        method: String,
        payload: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>> {
        let reply = match method.as_str() {
            "Configure" => Reply::With(
                api::ConfigureResponse {
                    events: self.events,
                }
                .encode_to_vec(),
            ),
            "Synchronize" => Reply::With(Vec::new()),
            m => (self.script)(m, &payload),
        };
        Box::pin(async move {
            match reply {
                Reply::With(p) => Ok(p),
                Reply::Fail(message) => Err(Status {
                    code: 2,
                    message: message.into(),
                }),
                Reply::Hang => std::future::pending().await,
            }
        })
    }
}

/// Connects a plugin named `name` at `idx` that subscribes to `events` and answers per
/// `script`; returns its trunk once it is listed.
async fn plugin(
    nri: &Nri,
    dir: &std::path::Path,
    idx: &str,
    name: &str,
    events: i32,
    script: Script,
) -> Trunk {
    let stream = UnixStream::connect(dir.join("nri.sock")).await.unwrap();
    let trunk = Trunk::plugin_side(stream, Arc::new(Scripted { events, script }));
    let before = nri.plugins().len();
    let register = api::RegisterPluginRequest {
        plugin_name: name.into(),
        plugin_idx: idx.into(),
        nri_version: String::new(),
    };
    let _: api::Empty = trunk
        .call(RUNTIME_SERVICE, "RegisterPlugin", &register, LONG)
        .await
        .unwrap();
    let t = Instant::now();
    while nri.plugins().len() == before {
        assert!(t.elapsed() < LONG, "plugin not taken on");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    trunk
}

const LONG: Duration = Duration::from_secs(10);

fn bit(e: api::Event) -> i32 {
    1 << (e as i32 - 1)
}

fn pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "p1".into(),
        ..Default::default()
    }
}

fn container() -> api::Container {
    api::Container {
        id: "c1".into(),
        env: vec!["A=1".into()],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_validator_sees_the_merged_adjustment_and_can_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let nri = started(dir.path(), Arc::default()).await;
    let _adjuster = plugin(
        &nri,
        dir.path(),
        "10",
        "adjuster",
        bit(api::Event::CreateContainer),
        |_, _| {
            let adjust = api::ContainerAdjustment {
                env: vec![api::KeyValue {
                    key: "FROM_PLUGIN".into(),
                    value: "1".into(),
                }],
                ..Default::default()
            };
            Reply::With(
                api::CreateContainerResponse {
                    adjust: Some(adjust),
                    ..Default::default()
                }
                .encode_to_vec(),
            )
        },
    )
    .await;
    // Rejects any adjustment of the environment, naming who made it.
    let _validator = plugin(
        &nri,
        dir.path(),
        "90",
        "validator",
        bit(api::Event::ValidateContainerAdjustment),
        |_, payload| {
            let req = api::ValidateContainerAdjustmentRequest::decode(payload.clone()).unwrap();
            let adjust = req.adjust.unwrap_or_default();
            let owners = &req.owners.unwrap_or_default().owners["c1"];
            let owner = &owners.compound[&(api::Field::Env as i32)].owners["FROM_PLUGIN"];
            let pristine = req.container.unwrap_or_default().env;
            Reply::With(
                api::ValidateContainerAdjustmentResponse {
                    reject: !adjust.env.is_empty(),
                    reason: format!("{owner} set the environment; pristine {pristine:?}"),
                }
                .encode_to_vec(),
            )
        },
    )
    .await;
    let e = nri
        .create_container(&pod(), &container())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "NRI validator 90-validator rejected container adjustment, reason: 10-adjuster set the environment; pristine [\"A=1\"]"
    );
}

#[tokio::test]
async fn a_failing_handler_fails_the_call_and_a_silent_plugin_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let nri = started(dir.path(), Arc::default()).await;
    let _failing = plugin(
        &nri,
        dir.path(),
        "10",
        "failing",
        bit(api::Event::RunPodSandbox),
        |_, _| Reply::Fail("no room for this pod"),
    )
    .await;
    let _silent = plugin(
        &nri,
        dir.path(),
        "20",
        "silent",
        bit(api::Event::CreateContainer),
        |_, _| Reply::Hang,
    )
    .await;
    let e = nri.run_pod(&pod()).await.unwrap_err();
    assert!(matches!(e, Error::Plugin { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "NRI plugin 10-failing failed RunPodSandbox: no room for this pod"
    );
    // The silent plugin costs one request timeout, then is gone; the create goes on.
    let t = Instant::now();
    let adjusted = nri.create_container(&pod(), &container()).await.unwrap();
    assert!(adjusted.adjust.env.is_empty());
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(nri.plugins().len(), 1);
    let t = Instant::now();
    nri.create_container(&pod(), &container()).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    nri.shutdown();
    assert!(!dir.path().join("nri.sock").exists());
}

#[tokio::test]
async fn a_plugins_updates_and_evictions_reach_the_inventory_and_failures_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = Arc::new(Recording::default());
    let nri = started(dir.path(), inventory.clone()).await;
    // Answers CreateContainer with an update of another container and an eviction.
    let trunk = plugin(
        &nri,
        dir.path(),
        "10",
        "balancer",
        bit(api::Event::CreateContainer),
        |_, _| {
            Reply::With(
                api::CreateContainerResponse {
                    update: vec![update("c0", 1 << 20)],
                    evict: vec![api::ContainerEviction {
                        container_id: "c9".into(),
                        reason: "room for c1".into(),
                    }],
                    ..Default::default()
                }
                .encode_to_vec(),
            )
        },
    )
    .await;
    let adjusted = nri.create_container(&pod(), &container()).await.unwrap();
    assert_eq!(adjusted.updates, vec![update("c0", 1 << 20)]);
    assert_eq!(adjusted.evictions[0].container_id, "c9");

    // Unsolicited, on the runtime service: applied at once, the failed ones answered.
    let req = api::UpdateContainersRequest {
        update: vec![update("c1", 2 << 20), update("missing", 3 << 20)],
        evict: vec![api::ContainerEviction {
            container_id: "c2".into(),
            reason: "too hungry".into(),
        }],
    };
    let answer: api::UpdateContainersResponse = trunk
        .call(RUNTIME_SERVICE, "UpdateContainers", &req, LONG)
        .await
        .unwrap();
    assert_eq!(answer.failed, vec![update("missing", 3 << 20)]);
    let applied = inventory.applied.lock().unwrap().clone();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].0, req.update);
    assert_eq!(applied[0].1, req.evict);
}

fn update(id: &str, memory: i64) -> api::ContainerUpdate {
    let memory = api::LinuxMemory {
        limit: Some(api::OptionalInt64 { value: memory }),
        ..Default::default()
    };
    api::ContainerUpdate {
        container_id: id.into(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(api::LinuxResources {
                memory: Some(memory),
                ..Default::default()
            }),
        }),
        ignore_failure: false,
    }
}

/// Every message the module's file defines was generated.
#[test]
fn every_message_generated() {
    let text = std::fs::read_to_string(env!("CRIUS_NRI_PROTO")).unwrap();
    let messages = text
        .lines()
        .filter(|l| l.starts_with("message ") && l.trim_end().ends_with('{'))
        .count();
    let generated = include_str!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
    let structs = generated.matches("pub struct ").count();
    assert!(
        structs >= messages,
        "{structs} structs for {messages} messages"
    );
}
