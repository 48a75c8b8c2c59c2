//! The fan-out against scripted plugins on a real socket (upstream's plugins, in
//! `tests/nri.rs`, neither reject nor hang): a validator that rejects, a plugin whose handler
//! fails, and one that never answers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::mux::{self, Demux, Header, PLUGIN_CONN, RUNTIME_CONN};
use super::ttrpc::{FLAG_REMOTE_CLOSED, TYPE_REQUEST, TYPE_RESPONSE, response, wire};
use super::{Answer, Error, Inventory, Nri, Settings, api};

/// What a scripted plugin does with a call: answer with this payload, fail with this
/// message, or never answer.
enum Reply {
    With(Vec<u8>),
    Fail(&'static str),
    Hang,
}

type Script = fn(&str, &Bytes) -> Reply;

struct Empty;

impl Inventory for Empty {
    fn snapshot(&self) -> Answer<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        Box::pin(async { (Vec::new(), Vec::new()) })
    }
    fn apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        _: Vec<api::ContainerEviction>,
    ) -> Answer<Vec<api::ContainerUpdate>> {
        Box::pin(async move { updates })
    }
}

async fn started(dir: &std::path::Path) -> Nri {
    let nri = Nri::new(Settings {
        socket: Some(dir.join("nri.sock")),
        plugin_dir: dir.join("none"),
        plugin_config_dir: dir.join("none"),
        registration_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_millis(500),
    });
    nri.serve(Arc::new(Empty)).await;
    nri
}

/// Connects a plugin named `name` at `idx` that subscribes to `events` and answers per
/// `script`; returns once it is listed.
async fn plugin(
    nri: &Nri,
    dir: &std::path::Path,
    idx: &str,
    name: &str,
    events: i32,
    script: Script,
) {
    let mut stream = UnixStream::connect(dir.join("nri.sock")).await.unwrap();
    let register = api::RegisterPluginRequest {
        plugin_name: name.into(),
        plugin_idx: idx.into(),
        nri_version: String::new(),
    };
    let req = wire::Request {
        service: super::plugin::RUNTIME_SERVICE.into(),
        method: "RegisterPlugin".into(),
        payload: register.encode_to_vec().into(),
        ..Default::default()
    };
    let header = Header::new(1, TYPE_REQUEST, FLAG_REMOTE_CLOSED);
    let frames = mux::encode(RUNTIME_CONN, header, &req.encode_to_vec());
    stream.write_all(&frames).await.unwrap();
    let before = nri.plugins().len();
    tokio::spawn(async move {
        let mut demux = Demux::new(&[PLUGIN_CONN, RUNTIME_CONN]);
        let mut ready = VecDeque::new();
        loop {
            while ready.is_empty() {
                let Ok(Some((conn, payload))) = mux::read_frame(&mut stream).await else {
                    return;
                };
                let msgs = demux.push(conn, &payload).unwrap();
                ready.extend(msgs.into_iter().map(|(h, p)| (conn, h, p)));
            }
            let (conn, header, payload) = ready.pop_front().unwrap();
            if conn != PLUGIN_CONN {
                continue;
            }
            let call = wire::Request::decode(payload).unwrap();
            let reply = match call.method.as_str() {
                "Configure" => Reply::With(api::ConfigureResponse { events }.encode_to_vec()),
                "Synchronize" => Reply::With(Vec::new()),
                m => script(m, &call.payload),
            };
            let body = match reply {
                Reply::With(p) => response(0, String::new(), p),
                Reply::Fail(m) => response(2, m.to_string(), Vec::new()),
                Reply::Hang => continue,
            };
            let h = Header::new(header.stream_id, TYPE_RESPONSE, 0);
            if stream
                .write_all(&mux::encode(PLUGIN_CONN, h, &body))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let t = Instant::now();
    while nri.plugins().len() == before {
        assert!(t.elapsed() < Duration::from_secs(10), "plugin not taken on");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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
    let nri = started(dir.path()).await;
    plugin(
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
    plugin(
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
    let nri = started(dir.path()).await;
    plugin(
        &nri,
        dir.path(),
        "10",
        "failing",
        bit(api::Event::RunPodSandbox),
        |_, _| Reply::Fail("no room for this pod"),
    )
    .await;
    plugin(
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

/// The vendored file is the release its README names.
#[test]
fn generated_from_the_vendored_release() {
    use sha2::Digest as _;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = std::fs::read(path.join("proto/nri/api.proto")).unwrap();
    let readme = std::fs::read_to_string(path.join("proto/nri/README.md")).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(&proto));
    assert!(
        readme.contains(&digest),
        "proto/nri/api.proto is not the release its README names ({digest})"
    );
}
