//! Kubernetes 1.34-1.36's runtime contract, from the CRI of cri-api v0.36: image volumes, stop
//! signals, list streaming, pod-level resources, pressure stall figures and the runtime's
//! features. What needs cgroup v2 runs where it is (the VM tier).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::time::Duration;

use common::*;
use crius::cri::v1 as cri;
use futures_util::StreamExt;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

/// A read-only image volume of `image` at `at`.
fn image_volume(image: &str, at: &str, sub: &str) -> cri::Mount {
    cri::Mount {
        container_path: at.into(),
        readonly: true,
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        image_sub_path: sub.into(),
        ..Default::default()
    }
}

async fn sh(env: &PodEnv, id: &str, script: &str) -> (String, String, i32) {
    env.exec(id, &["sh", "-c", script], 20).await.unwrap()
}

#[tokio::test]
async fn image_volumes() {
    let mut env = PodEnv::start().await;
    // The volume's image: busybox plus a file of its own, by the ID PullImage answers.
    let vol_img = image(
        vec![
            busybox_layer(Compress::Gzip),
            layer(
                &[
                    Entry::Dir("data".into()),
                    Entry::File("data/model".into(), b"weights".to_vec(), 0o644),
                    Entry::Symlink("data/out".into(), "/etc".into()),
                ],
                Compress::Gzip,
            ),
        ],
        &ImageOpts::default(),
    );
    env.reg.push_image("model", "v1", &vol_img).await.unwrap();
    let reference = format!("{}/model:v1", env.reg.host());
    let image_ref = env.d.pull(&reference).await.unwrap();

    let sb = env.sandbox_config("vols");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("reader", LONG);
    cfg.mounts.push(image_volume(&image_ref, "/mnt/model", ""));
    cfg.mounts
        .push(image_volume(&image_ref, "/mnt/data", "data"));
    let c = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = sh(
        &env,
        &c,
        "cat /mnt/model/data/model; echo; cat /mnt/data/model; echo; /mnt/model/bin/busybox true && echo exec",
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        ("weights\nweights\nexec\n", 0),
        "{err}"
    );
    let (_, _, code) = sh(&env, &c, "touch /mnt/model/x").await;
    assert_ne!(code, 0, "an image volume is read-only");
    // ContainerStatus names the image each volume mounts by its digest.
    let status = env.status(&c).await;
    for path in ["/mnt/model", "/mnt/data"] {
        let m = status
            .mounts
            .iter()
            .find(|m| m.container_path == path)
            .unwrap();
        assert_eq!(m.image.as_ref().unwrap().image_ref, image_ref, "{path}");
    }
    // The image cannot be removed while mounted, and the refusal names the container.
    let e = env.d.remove_image(&reference).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(&c), "{}", e.message());

    // Refused by field: writable, a sub path out of the image or not in it, a host path too.
    let cases: Vec<(cri::Mount, &str)> = vec![
        (
            cri::Mount {
                readonly: false,
                ..image_volume(&image_ref, "/m", "")
            },
            "mounts[0].readonly",
        ),
        (
            image_volume(&image_ref, "/m", "../etc"),
            "mounts[0].image_sub_path",
        ),
        (
            image_volume(&image_ref, "/m", "nowhere"),
            "mounts[0].image_sub_path",
        ),
        (
            cri::Mount {
                host_path: "/tmp".into(),
                ..image_volume(&image_ref, "/m", "")
            },
            "mounts[0].host_path",
        ),
    ];
    for (i, (m, field)) in cases.into_iter().enumerate() {
        let mut cfg = env.container_config(&format!("bad{i}"), LONG);
        cfg.mounts = vec![m];
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    // A link in the image leads inside the image, never to the host.
    let mut cfg = env.container_config("link", LONG);
    cfg.mounts = vec![image_volume(&image_ref, "/mnt/out", "data/out")];
    let l = env.run(&pod, &sb, cfg).await;
    let (out, _, _) = sh(&env, &l, "cat /mnt/out/passwd | head -1").await;
    assert!(
        out.starts_with("root:x:0:0:root"),
        "the image's /etc: {out}"
    );

    // Across a daemon restart the volume stays, held.
    env.d.restart();
    let (out, _, _) = sh(&env, &c, "cat /mnt/data/model").await;
    assert_eq!(out, "weights");
    let e = env.d.remove_image(&reference).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    env.remove_pod(&pod).await;
    env.d.remove_image(&reference).await.unwrap();
    assert!(env.d.image_status(&reference).await.is_none());
}

#[tokio::test]
async fn stop_signals() {
    let env = PodEnv::start().await;
    let trap = "trap 'exit 42' USR1; trap 'exit 43' INT; trap 'exit 44' TERM; \
                while :; do sleep 0.1; done";
    // The image asks for SIGINT.
    let img = image(
        vec![busybox_layer(Compress::Gzip)],
        &ImageOpts {
            stop_signal: "SIGINT",
            ..Default::default()
        },
    );
    env.reg.push_image("stopint", "v1", &img).await.unwrap();
    let int_image = format!("{}/stopint:v1", env.reg.host());
    env.d.pull(&int_image).await.unwrap();
    let sb = env.sandbox_config("signals");
    let pod = env.run_pod(&sb).await.unwrap();
    let cases = [
        ("own", cri::Signal::Sigusr1, None, 42),
        ("image", cri::Signal::RuntimeDefault, Some(&int_image), 43),
        ("both", cri::Signal::Sigusr1, Some(&int_image), 42),
        ("default", cri::Signal::RuntimeDefault, None, 44),
    ];
    for (name, signal, img, code) in cases {
        let mut cfg = env.container_config(name, &["sh", "-c", trap]);
        cfg.stop_signal = signal as i32;
        if let Some(i) = img {
            cfg.image = Some(spec(i));
        }
        let c = env.run(&pod, &sb, cfg).await;
        let want = match code {
            42 => cri::Signal::Sigusr1,
            43 => cri::Signal::Sigint,
            _ => cri::Signal::Sigterm,
        };
        assert_eq!(env.status(&c).await.stop_signal, want as i32, "{name}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.d
            .runtime()
            .stop_container(cri::StopContainerRequest {
                container_id: c.clone(),
                timeout: 10,
            })
            .await
            .unwrap();
        let s = env.wait_exit(&c, Duration::from_secs(20)).await;
        assert_eq!(s.exit_code, code, "{name}");
    }
    let mut cfg = env.container_config("bad", LONG);
    cfg.stop_signal = 999;
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("config.stop_signal"),
        "{}",
        e.message()
    );
    env.remove_pod(&pod).await;
}

/// 3,000 containers whose ListContainers answer passes gRPC's 16 MiB: the stream delivers each
/// of them once, in messages of at least one.
#[tokio::test]
async fn listings_stream_past_the_message_limit() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("many");
    let pod = env.run_pod(&sb).await.unwrap();
    let label = "x".repeat(6 << 10);
    let started = std::time::Instant::now();
    let creates = (0..3000).map(|i| {
        let mut cfg = env.container_config(&format!("c{i}"), LONG);
        cfg.labels.insert("big".into(), label.clone());
        let (env, pod, sb) = (&env, &pod, &sb);
        async move { env.create(pod, sb, cfg).await.unwrap() }
    });
    let mut made: Vec<String> = futures_util::stream::iter(creates)
        .buffer_unordered(8)
        .collect()
        .await;
    eprintln!("3000 containers made in {:?}", started.elapsed());
    let unary = env
        .d
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await;
    assert!(
        unary.is_err(),
        "the unary answer is over the limit: {:?}",
        unary.as_ref().map(|r| r.get_ref().containers.len())
    );
    let mut stream = env
        .d
        .runtime()
        .max_decoding_message_size(usize::MAX)
        .stream_containers(cri::StreamContainersRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    let mut messages = 0;
    while let Some(m) = stream.next().await {
        let m = m.unwrap();
        assert!(!m.containers.is_empty());
        messages += 1;
        seen.extend(m.containers.into_iter().map(|c| c.id));
    }
    seen.sort();
    made.sort();
    assert_eq!(seen, made);
    assert!(messages > 4, "{messages} messages");
    let started = std::time::Instant::now();
    // The other listings stream too, filters and all.
    let mut pods = env
        .d
        .runtime()
        .stream_pod_sandboxes(cri::StreamPodSandboxesRequest {
            filter: Some(cri::PodSandboxFilter {
                id: pod.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let first = pods.next().await.unwrap().unwrap();
    assert_eq!(first.pod_sandboxes.len(), 1);
    assert!(pods.next().await.is_none());
    let mut images = env
        .d
        .images()
        .stream_images(cri::StreamImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(images.next().await.unwrap().unwrap().images.len(), 1);
    env.remove_pod(&pod).await;
    eprintln!("listed and removed in {:?}", started.elapsed());
}

#[tokio::test]
async fn runtime_features() {
    let env = PodEnv::start().await;
    let s = env
        .d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let f = s.features.unwrap();
    assert!(f.supplemental_groups_policy);
    // A pod with its own user namespace on the host's network (KEP-5607) is served.
    assert!(f.user_namespaces_host_network);
    let h = &s.runtime_handlers[0].features.unwrap();
    assert_eq!(
        h.recursive_read_only_mounts,
        crius::container::recursive_read_only_mounts()
    );
}
