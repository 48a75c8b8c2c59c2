//! The pod agent end to end: manifests in a directory, a `crius agent` process driving a crius
//! daemon through CRI, images from the test registry; checked through the agent's records (what
//! `crius get pods` shows), container logs and files.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::agent::*;
use common::net::*;
use common::*;
use crius::frontend::status::{self, Phase, PodRecord, State};

fn container<'a>(r: &'a PodRecord, name: &str) -> &'a status::ContainerRecord {
    r.all().find(|c| c.name == name).expect("container")
}

fn pod(name: &str, image: &str, restart: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 2\n  containers:\n{}",
        containers.replace("IMAGE", image)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn active_deadline_and_emptydir_eviction_fail_pods() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let img = &env.image;
    let with_deadline = |name: &str, body: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 1\n{}",
            body.replace("IMAGE", img)
        )
    };
    a.put(
        "running.yaml",
        &with_deadline(
            "running",
            "  containers:\n  - {name: main, image: IMAGE, command: [sleep, '100000']}\n",
        ),
    );
    // The deadline covers init containers too.
    a.put(
        "initialising.yaml",
        &with_deadline(
            "initialising",
            "  initContainers:\n  - {name: setup, image: IMAGE, command: [sleep, '100000']}\n  containers:\n  - {name: main, image: IMAGE, command: ['true']}\n",
        ),
    );
    // A disk-backed emptyDir filled past its sizeLimit gets the pod evicted.
    a.put(
        "filler.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: filler}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: cache, emptyDir: {{sizeLimit: 1Mi}}}}]\n  containers:\n  - {{name: main, image: {img}, command: [sh, -c, 'dd if=/dev/zero of=/cache/f bs=1024 count=3072 && sleep 100000'], volumeMounts: [{{name: cache, mountPath: /cache}}]}}\n"
        ),
    );
    a.wait("running", "Running", 30, |r| r.phase == Phase::Running);
    let r = a.wait("filler", "Evicted", 40, |r| r.phase == Phase::Failed);
    assert_eq!(r.reason, "Evicted", "{r:?}");
    assert_eq!(
        r.message,
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"1Mi\"."
    );
    assert!(r.all().all(|c| !c.state.is_running()), "{r:?}");
    for name in ["running", "initialising"] {
        let r = a.wait(name, "DeadlineExceeded", 30, |r| r.phase == Phase::Failed);
        assert_eq!(r.reason, "DeadlineExceeded", "{r:?}");
        assert_eq!(r.display_status(), "DeadlineExceeded");
        assert!(r.all().all(|c| !c.state.is_running()), "{r:?}");
        assert!(r.events.iter().any(|e| e.reason == "DeadlineExceeded"));
    }
    // Failed for good: nothing is restarted.
    std::thread::sleep(Duration::from_secs(3));
    let r = a.record("running").unwrap();
    assert_eq!(container(&r, "main").restart_count, 0);
    assert!(r.all().all(|c| !c.state.is_running()), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_secret_holds_the_pod_until_it_appears() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    a.put(
        "waiting.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: waiting}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: s, secret: {{secretName: later}}}}\n  - {{name: o, secret: {{secretName: never, optional: true}}}}\n  containers:\n  - {{name: main, image: {}, command: [sh, -c, 'cat /s/key; echo; ls /o | wc -l; exec sleep 100000'], volumeMounts: [{{name: s, mountPath: /s}}, {{name: o, mountPath: /o}}]}}\n",
            env.image
        ),
    );
    // A missing Secret that is not optional: FailedMount, and nothing starts.
    let r = a.wait("waiting", "FailedMount", 30, |r| {
        r.events.iter().any(|e| e.reason == "FailedMount")
    });
    assert_eq!(r.phase, Phase::Pending);
    assert!(r.sandbox.is_none(), "{r:?}");
    assert!(container(&r, "main").id.is_none(), "{r:?}");
    // It arrives: the pod runs, the optional one missing for good is an empty volume.
    a.put(
        "later.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: later}\nstringData: {key: hello}\n",
    );
    let r = a.wait("waiting", "Running", 30, |r| r.phase == Phase::Running);
    let start = Instant::now();
    while a.log(&r, "main", 0).len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(a.log(&r, "main", 0), vec!["hello", "0"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_policies_statuses_and_events() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let img = &env.image;
    a.put(
        "done.yaml",
        &pod(
            "done",
            img,
            "Never",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'echo hello; exit 0']\n",
        ),
    );
    a.put(
        "fail.yaml",
        &pod(
            "fail",
            img,
            "Never",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'exit 3']\n",
        ),
    );
    a.put(
        "crash.yaml",
        &pod(
            "crash",
            img,
            "OnFailure",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'echo try; exit 1']\n",
        ),
    );
    a.put(
        "run.yaml",
        &pod(
            "run",
            img,
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '100000']\n",
        ),
    );
    let done = a.wait("done", "Succeeded", 30, |r| r.phase == Phase::Succeeded);
    assert_eq!(done.display_status(), "Completed");
    assert_eq!(a.log(&done, "main", 0), vec!["hello"]);
    let reasons: Vec<&str> = done.events.iter().map(|e| e.reason.as_str()).collect();
    for want in ["Pulled", "Created", "Started"] {
        assert!(reasons.contains(&want), "{reasons:?}");
    }
    let fail = a.wait("fail", "Failed", 30, |r| r.phase == Phase::Failed);
    assert!(matches!(
        container(&fail, "main").state,
        State::Terminated { exit_code: 3, .. }
    ));
    assert_eq!(fail.display_status(), "Error");
    let run = a.wait("run", "Ready", 30, |r| r.condition("Ready"));
    assert_eq!(run.phase, Phase::Running);
    assert_eq!(run.ready_count(), (1, 1));
    // The agent follows the runtime's container events (relisting at once on each).
    assert!(
        env.d.log_text().contains("rpc=\"GetContainerEvents\""),
        "the agent never subscribed to container events"
    );
    // OnFailure: restarted at once, then after a 10 s back-off, in CrashLoopBackOff between.
    let crash = a.wait("crash", "a back-off", 40, |r| {
        matches!(&container(r, "main").state, State::Waiting { reason, .. } if reason == "CrashLoopBackOff")
    });
    assert!(container(&crash, "main").restart_count >= 1);
    assert_eq!(crash.display_status(), "CrashLoopBackOff");
    let crash = a.wait("crash", "the second restart", 40, |r| {
        container(r, "main").restart_count >= 2
    });
    assert!(crash.events.iter().any(|e| e.reason == "BackOff"));
    assert_eq!(a.log(&crash, "main", 1), vec!["try"]);
    // The client's view.
    let out = a.cli(&["get", "pods", "--state", a.state.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, status) in [("done", "Completed"), ("fail", "Error"), ("run", "Running")] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(status), "{line}");
    }
    assert!(
        text.lines().any(|l| l.contains("run") && l.contains("1/1")),
        "{text}"
    );
    let out = a.cli(&[
        "describe",
        "pod",
        "crash",
        "--state",
        a.state.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Restart Count:") && text.contains("BackOff"),
        "{text}"
    );
    // Removing a manifest stops and forgets its pod.
    let sandbox = run.sandbox.clone().unwrap();
    a.remove("run.yaml");
    let start = Instant::now();
    while a.record("run").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "run not removed:\n{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(crius::cri::v1::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(
        !pods.iter().any(|p| p.id == sandbox),
        "the sandbox is removed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn init_containers_sidecars_hooks_and_termination_order() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let out = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: ordered}}
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - {{name: shared, emptyDir: {{}}}}
  - {{name: out, hostPath: {{path: {out}, type: Directory}}}}
  initContainers:
  - name: first
    image: {img}
    command: [sh, -c, 'echo first >> /shared/order']
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  - name: side
    image: {img}
    restartPolicy: Always
    command: [sh, -c, 'echo side >> /shared/order; trap "echo side-stop >> /out/stops; exit 0" TERM; while true; do sleep 0.1; done']
    startupProbe: {{exec: {{command: [grep, -q, side, /shared/order]}}, periodSeconds: 1}}
    volumeMounts: [{{name: shared, mountPath: /shared}}, {{name: out, mountPath: /out}}]
  - name: second
    image: {img}
    command: [sh, -c, 'echo second >> /shared/order']
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  containers:
  - name: app
    image: {img}
    command: [sh, -c, 'cat /shared/order; trap "echo app-stop >> /out/stops; exit 0" TERM; while true; do sleep 0.1; done']
    volumeMounts: [{{name: shared, mountPath: /shared}}, {{name: out, mountPath: /out}}]
    lifecycle:
      postStart: {{exec: {{command: [sh, -c, 'echo poststart > /shared/hooked']}}}}
      preStop: {{exec: {{command: [sh, -c, 'echo app-prestop >> /out/stops']}}}}
"#,
        out = out.path().display(),
        img = env.image
    );
    a.put("ordered.yaml", &yaml);
    let r = a.wait("ordered", "Ready", 60, |r| r.condition("Ready"));
    assert!(r.condition("Initialized"));
    assert_eq!(r.ready_count(), (2, 2), "the sidecar counts");
    assert_eq!(a.log(&r, "app", 0), vec!["first", "side", "second"]);
    assert!(matches!(
        container(&r, "first").state,
        State::Terminated { exit_code: 0, .. }
    ));
    assert!(container(&r, "side").state.is_running());
    // The postStart hook ran in the container.
    let app_id = container(&r, "app").id.clone().unwrap();
    let (hooked, _, _) = env
        .exec(&app_id, &["cat", "/shared/hooked"], 10)
        .await
        .unwrap();
    assert_eq!(hooked, "poststart\n");
    // Going away: preStop, the app, then the sidecar.
    a.remove("ordered.yaml");
    let start = Instant::now();
    while a.record("ordered").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stops = std::fs::read_to_string(out.path().join("stops")).unwrap();
    assert_eq!(stops, "app-prestop\napp-stop\nside-stop\n");

    // A failing init container with restartPolicy Never fails the pod.
    a.put(
        "initfail.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: initfail}}\nspec:\n  restartPolicy: Never\n  initContainers:\n  - {{name: setup, image: {img}, command: [sh, -c, 'exit 2']}}\n  containers:\n  - {{name: app, image: {img}, command: [sleep, '1000']}}\n",
            img = env.image
        ),
    );
    let r = a.wait("initfail", "Failed", 30, |r| r.phase == Phase::Failed);
    assert_eq!(r.display_status(), "Init:Error");
    assert!(container(&r, "app").id.is_none(), "the app never started");
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_exec_http_tcp_grpc_and_startup_gating() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: probed}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {img}
    command: [sh, -c, 'mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe: {{httpGet: {{port: http, path: /index.html}}, periodSeconds: 1, failureThreshold: 1}}
  - name: tcp
    image: {img}
    command: [httpd, -f, -p, '9000']
    readinessProbe: {{tcpSocket: {{port: 9000}}, periodSeconds: 1}}
  - name: live
    image: {img}
    command: [sh, -c, 'touch /tmp/alive; exec sleep 100000']
    livenessProbe: {{exec: {{command: [test, -f, /tmp/alive]}}, periodSeconds: 1, failureThreshold: 2}}
  - name: slow
    image: {img}
    command: [sleep, '100000']
    startupProbe: {{exec: {{command: [test, -f, /tmp/started]}}, periodSeconds: 1, failureThreshold: 600}}
    readinessProbe: {{exec: {{command: ['true']}}, periodSeconds: 1}}
  - name: grpc
    image: {img}
    command: [sleep, '100000']
    readinessProbe: {{grpc: {{port: 7000}}, periodSeconds: 1, failureThreshold: 1}}
"#,
        img = env.image
    );
    a.put("probed.yaml", &yaml);
    let r = a.wait("probed", "running", 30, |r| {
        r.phase == Phase::Running && r.sandbox.is_some()
    });
    // The gRPC server in the pod's network namespace (the pod has no IP: loopback).
    let info = env.d.pod_info(&r.sandbox.clone().unwrap()).await;
    let reporter = grpc_health_in(
        info["netNamespacePath"].as_str().unwrap(),
        "127.0.0.1",
        7000,
    )
    .await;
    let r = a.wait("probed", "web, tcp, live and grpc ready", 30, |r| {
        ["web", "tcp", "live", "grpc"]
            .iter()
            .all(|c| container(r, c).ready)
    });
    // The startup probe holds readiness back.
    let slow = container(&r, "slow");
    assert!(!slow.started && !slow.ready, "{slow:?}");
    assert!(!r.condition("Ready"));
    env.exec(slow.id.as_ref().unwrap(), &["touch", "/tmp/started"], 10)
        .await
        .unwrap();
    let r = a.wait("probed", "Ready", 30, |r| r.condition("Ready"));
    assert!(container(&r, "slow").started);
    // HTTP readiness follows the page.
    let web = container(&r, "web").id.clone().unwrap();
    env.exec(&web, &["rm", "/www/index.html"], 10)
        .await
        .unwrap();
    let r = a.wait("probed", "web unready", 20, |r| !container(r, "web").ready);
    assert!(!r.condition("Ready"));
    assert!(
        container(&r, "web").probes["Readiness"]
            .message
            .contains("404"),
        "{:?}",
        container(&r, "web").probes
    );
    env.exec(&web, &["sh", "-c", "echo ok > /www/index.html"], 10)
        .await
        .unwrap();
    a.wait("probed", "web ready again", 20, |r| {
        container(r, "web").ready
    });
    // gRPC readiness follows the serving status.
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    a.wait("probed", "grpc unready", 20, |r| {
        !container(r, "grpc").ready
    });
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    a.wait("probed", "grpc ready again", 20, |r| {
        container(r, "grpc").ready
    });
    // A failing liveness probe restarts the container.
    let live = container(&r, "live").id.clone().unwrap();
    env.exec(&live, &["rm", "/tmp/alive"], 10).await.unwrap();
    let r = a.wait("probed", "live restarted", 40, |r| {
        let c = container(r, "live");
        c.restart_count == 1 && c.state.is_running()
    });
    assert!(
        r.events
            .iter()
            .any(|e| e.reason == "Killing" && e.message.contains("failed liveness probe")),
        "{:?}",
        r.events
    );
    assert!(r.events.iter().any(|e| e.reason == "Unhealthy"));
    a.wait("probed", "live ready again", 20, |r| {
        container(r, "live").ready
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_env_and_live_updates() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let host = tempfile::tempdir().unwrap();
    let created = host.path().join("made/here");
    let yaml = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: creds}}
stringData: {{user: admin, password: hunter2}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings}}
data: {{mode: fast, "app.conf": "a=1\n"}}
---
apiVersion: v1
kind: Pod
metadata:
  name: vols
  labels: {{tier: back}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {{name: secret, secret: {{secretName: creds, defaultMode: 0400}}}}
  - name: conf
    configMap:
      name: settings
      items: [{{key: app.conf, path: etc/app.conf, mode: 0600}}]
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: ram, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}
  - {{name: host, hostPath: {{path: {created}, type: DirectoryOrCreate}}}}
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
  - name: all
    projected:
      sources:
      - secret: {{name: creds, items: [{{key: user, path: user}}]}}
      - configMap: {{name: settings, items: [{{key: mode, path: mode}}]}}
  containers:
  - name: app
    image: {img}
    command: [sleep, '100000']
    env:
    - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
    - {{name: MODE, valueFrom: {{configMapKeyRef: {{name: settings, key: mode}}}}}}
    - {{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: GREETING, value: 'hello $(POD)'}}
    envFrom:
    - {{prefix: CFG_, configMapRef: {{name: settings}}}}
    volumeMounts:
    - {{name: secret, mountPath: /secret}}
    - {{name: conf, mountPath: /conf}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: scratch, mountPath: /sub, subPath: deep/dir}}
    - {{name: ram, mountPath: /ram}}
    - {{name: host, mountPath: /host}}
    - {{name: info, mountPath: /info}}
    - {{name: all, mountPath: /all}}
"#,
        created = created.display(),
        img = env.image
    );
    a.put("vols.yaml", &yaml);
    let r = a.wait("vols", "running", 30, |r| {
        container(r, "app").state.is_running()
    });
    let id = container(&r, "app").id.clone().unwrap();
    let sh = |script: &'static str| {
        let id = id.clone();
        let env = &env;
        async move { env.exec(&id, &["sh", "-c", script], 10).await.unwrap() }
    };
    let (out, err, code) = sh(
        "cat /secret/password; echo; stat -c %a /secret/..data/user; cat /conf/etc/app.conf; \
         stat -c %a /conf/..data/etc/app.conf; cat /info/name; echo; grep tier /info/labels; \
         cat /all/user; echo; cat /all/mode; echo; \
         echo $PASSWORD $MODE $GREETING $CFG_mode",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "hunter2",
            "400",
            "a=1",
            "600",
            "vols",
            "tier=\"back\"",
            "admin",
            "fast",
            "hunter2 fast hello vols fast"
        ],
        "{out}"
    );
    // Secrets are read-only, on a tmpfs kept out of swap.
    let (_, err, code) = sh("touch /secret/x").await;
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");
    let (mounts, _, _) = sh("grep ' /secret ' /proc/mounts").await;
    assert!(mounts.contains("tmpfs"), "{mounts}");
    let pod_dir = a
        .state
        .join("pods")
        .join(&r.uid)
        .join("volumes")
        .join("secret");
    assert!(
        crius::frontend::node::is_noswap(&pod_dir),
        "the secret tmpfs is noswap"
    );
    // emptyDir: shared, with subPath; the memory one holds its size limit.
    sh("echo x > /sub/f").await;
    let (out, _, _) = sh("cat /scratch/deep/dir/f").await;
    assert_eq!(out, "x\n");
    let (_, err, code) = sh("dd if=/dev/zero of=/ram/big bs=1024 count=2048").await;
    assert_ne!(code, 0, "1Mi limit");
    assert!(err.contains("No space left"), "{err}");
    // hostPath DirectoryOrCreate made the directory.
    assert!(created.is_dir());
    sh("touch /host/from-pod").await;
    assert!(created.join("from-pod").exists());
    // An edited Secret reaches the running pod's volume in place (the pod itself is unchanged,
    // so it keeps running; its environment keeps the old value, as with kubelet).
    a.put(
        "vols.yaml",
        &yaml.replace("password: hunter2", "password: swordfish"),
    );
    let start = Instant::now();
    loop {
        let (out, _, _) = sh("cat /secret/password").await;
        if out == "swordfish" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not updated: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (out, _, _) = sh("echo $PASSWORD").await;
    assert_eq!(out, "hunter2\n");
    let r2 = a.record("vols").unwrap();
    assert_eq!(r2.uid, r.uid);
    // A Secret in a file of its own updates the volume in place.
    a.put(
        "extra.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: extra}\nstringData: {token: one}\n",
    );
    a.put(
        "reader.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: reader}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: s, secret: {{secretName: extra}}}}]\n  containers:\n  - {{name: app, image: {img}, command: [sleep, '100000'], volumeMounts: [{{name: s, mountPath: /s}}]}}\n",
            img = env.image
        ),
    );
    let r3 = a.wait("reader", "running", 30, |r| {
        container(r, "app").state.is_running()
    });
    let id3 = container(&r3, "app").id.clone().unwrap();
    let (out, _, _) = env.exec(&id3, &["cat", "/s/token"], 10).await.unwrap();
    assert_eq!(out, "one");
    a.put(
        "extra.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: extra}\nstringData: {token: two}\n",
    );
    let start = Instant::now();
    loop {
        let (out, _, _) = env.exec(&id3, &["cat", "/s/token"], 10).await.unwrap();
        if out == "two" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not updated: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let same = a.record("reader").unwrap();
    assert_eq!(same.uid, r3.uid, "the pod kept running");
    // Everything the pods mounted goes with them.
    a.remove("vols.yaml");
    a.remove("reader.yaml");
    let start = Instant::now();
    while a.record("vols").is_some() || a.record("reader").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(a.state.to_str().unwrap()), "{info}");
    assert!(!a.state.join("pods").join(&r2.uid).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_period_prestop_and_kill() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let out = tempfile::tempdir().unwrap();
    // The app ignores SIGTERM: it is killed when the grace period ends. Its preStop sleeps.
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: stubborn}}
spec:
  terminationGracePeriodSeconds: 3
  volumes: [{{name: out, hostPath: {{path: {out}}}}}]
  containers:
  - name: app
    image: {img}
    command: [sh, -c, 'trap "echo term >> /out/log" TERM; while true; do sleep 0.1; done']
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      preStop: {{sleep: {{seconds: 1}}}}
"#,
        out = out.path().display(),
        img = env.image
    );
    a.put("stubborn.yaml", &yaml);
    let r = a.wait("stubborn", "running", 30, |r| {
        container(r, "app").state.is_running()
    });
    let id = container(&r, "app").id.clone().unwrap();
    let start = Instant::now();
    a.remove("stubborn.yaml");
    while a.record("stubborn").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = start.elapsed();
    // preStop (1 s), then TERM, then KILL at the end of the 3 s grace period.
    assert!(took >= Duration::from_secs(3), "{took:?}");
    assert!(took < Duration::from_secs(9), "{took:?}");
    let log = std::fs::read_to_string(out.path().join("log")).unwrap_or_default();
    assert!(
        log.starts_with("term"),
        "SIGTERM came after preStop: {log:?}"
    );
    let gone = env
        .d
        .runtime()
        .container_status(crius::cri::v1::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await;
    assert!(gone.is_err(), "the container was removed");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_restart_adopts_running_pods() {
    let env = PodEnv::start().await;
    let mut a = Agent::start(&env.d);
    let img = &env.image;
    a.put(
        "keep.yaml",
        &pod(
            "keep",
            img,
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '100000']\n",
        ),
    );
    a.put(
        "drop.yaml",
        &pod(
            "drop",
            img,
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '100000']\n",
        ),
    );
    let keep = a.wait("keep", "Ready", 30, |r| r.condition("Ready"));
    let drop = a.wait("drop", "Ready", 30, |r| r.condition("Ready"));
    a.kill9();
    // While the agent is away: one pod's manifest goes.
    a.remove("drop.yaml");
    a.spawn();
    let again = a.wait("keep", "adopted", 30, |r| {
        r.condition("Ready") && r.events.len() >= keep.events.len()
    });
    assert_eq!(again.sandbox, keep.sandbox, "same sandbox");
    assert_eq!(
        container(&again, "main").id,
        container(&keep, "main").id,
        "same container"
    );
    assert_eq!(container(&again, "main").restart_count, 0);
    let start = Instant::now();
    while a.record("drop").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(crius::cri::v1::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(!pods.iter().any(|p| Some(&p.id) == drop.sandbox.as_ref()));
    assert!(pods.iter().any(|p| Some(&p.id) == keep.sandbox.as_ref()));
}

#[tokio::test(flavor = "multi_thread")]
async fn run_checks_manifests_and_reports_file_line_field() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let m = a.manifests.to_str().unwrap().to_string();
    let bad = write(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:\n  containers:\n  - name: app\n    image: busybox\n    imagePullPolicy: Sometimes\n",
    );
    let o = a.cli(&["run", "--manifests", &m, &bad]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.yaml:9: spec.containers[0].imagePullPolicy: \"Sometimes\""),
        "{err}"
    );
    let typo = write(
        "typo.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: t}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    comand: [sh]\n",
    );
    let o = a.cli(&["run", "--manifests", &m, &typo]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("typo.yaml:8: spec.containers[0].comand: unknown field"),
        "{err}"
    );
    let unsupported = write(
        "eph.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: e}\nspec:\n  containers:\n  - {name: app, image: busybox}\n  ephemeralContainers:\n  - {name: dbg, image: busybox}\n",
    );
    let o = a.cli(&["run", "--manifests", &m, &unsupported]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("eph.yaml:7: spec.ephemeralContainers: not supported by crius"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(&a.manifests).unwrap().next().is_none(),
        "nothing was handed over"
    );
    // A good one runs; its scheduling fields are named in a warning.
    let good = write(
        "good.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: good}}\nspec:\n  nodeSelector: {{disk: ssd}}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {}, command: [sleep, '1000']}}\n",
            env.image
        ),
    );
    let o = a.cli(&["run", "--manifests", &m, &good]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("pod/default/good created"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("spec.nodeSelector: ignored"));
    a.wait("good", "running", 30, |r| r.phase == Phase::Running);
    let o = a.cli(&["delete", "pod", "good", "--manifests", &m]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let start = Instant::now();
    while a.record("good").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A bad edit of a running pod's file keeps the pod as it was.
    a.put(
        "steady.yaml",
        &std::fs::read_to_string(&good)
            .unwrap()
            .replace("good", "steady"),
    );
    let r = a.wait("steady", "running", 30, |r| r.phase == Phase::Running);
    a.put(
        "steady.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: steady}\nspec: {containers: []}\n",
    );
    // The agent has read the bad manifest once it says why it refuses it.
    let t0 = Instant::now();
    while !a.log_text().contains("at least one container is required") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", a.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let still = a.record("steady").unwrap();
    assert_eq!(still.uid, r.uid);
    assert!(
        a.log_text().contains("at least one container is required"),
        "{}",
        a.log_text()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn image_pulls_back_off_and_use_pull_secrets() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    // A private registry: basic auth.
    let private = Registry::start(Some(("puller", "s3cret")));
    let img = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    private.push_image("private/app", "v1", &img).await.unwrap();
    let missing = format!("{}/nothing/here:v1", env.reg.host());
    a.put(
        "missing.yaml",
        &pod(
            "missing",
            &missing,
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '1000']\n",
        ),
    );
    let r = a.wait("missing", "ImagePullBackOff", 40, |r| {
        matches!(&container(r, "main").state, State::Waiting { reason, .. } if reason == "ImagePullBackOff")
    });
    assert!(
        r.events
            .iter()
            .any(|e| e.reason == "Failed" && e.message.contains("Failed to pull image"))
    );
    assert_eq!(r.display_status(), "ImagePullBackOff");
    let auth = base64_encode(b"puller:s3cret");
    let config = format!(
        r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#,
        private.host()
    );
    let yaml = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: regcred}}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{config}'\n---\n{}  imagePullSecrets: [{{name: regcred}}]\n",
        pod(
            "private",
            &format!("{}/private/app:v1", private.host()),
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '1000']\n"
        )
    );
    a.put("private.yaml", &yaml);
    let r = a.wait("private", "running", 40, |r| {
        container(r, "main").state.is_running()
    });
    assert!(
        r.events
            .iter()
            .any(|e| e.reason == "Pulled" && e.message.contains("Successfully pulled"))
    );
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

async fn cgroup_of(env: &PodEnv, id: &str) -> PathBuf {
    let info = env.d.container_info(id).await;
    PathBuf::from(info["cgroup"].as_str().expect("a cgroup"))
}

/// QoS classes as cgroup limits, oom_score_adj and swap: only under cgroup v2, so in the VM tier
/// (`cargo xtask test-vm` runs the tests named `cgroup_v2`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs cgroup v2 (this host has none): cargo xtask test-vm runs it"]
async fn resources_qos_and_limited_swap_cgroup_v2() {
    if crius::runtime::cgroup::Hierarchy::detect().is_none() {
        not_here("no cgroup v2 here; cargo xtask test-vm runs this in a VM");
        return;
    }
    let env = PodEnv::start().await;
    let a = Agent::start_with(&env.d, "[agent]\nswap_behavior = \"LimitedSwap\"\n");
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: burst}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {img}
    command: [sleep, '100000']
    resources:
      requests: {{cpu: 250m, memory: 64Mi}}
      limits: {{cpu: 500m, memory: 128Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: guaranteed}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {img}
    command: [sleep, '100000']
    resources:
      limits: {{cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: besteffort}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {img}, command: [sleep, '100000']}}
"#,
        img = env.image
    );
    a.put("qos.yaml", &yaml);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    let (mem, swap) = (field("MemTotal:"), field("SwapTotal:"));
    for (name, qos, max, cpu, swap_max, adj) in [
        (
            "burst",
            "Burstable",
            (128u64 << 20).to_string(),
            "50000 100000",
            (((64u64 << 20) as f64 / mem as f64) * swap as f64) as u64,
            (1000 - (1000 * (64i64 << 20) / mem as i64)).clamp(2, 999),
        ),
        (
            "guaranteed",
            "Guaranteed",
            (64u64 << 20).to_string(),
            "10000 100000",
            0,
            -997,
        ),
        (
            "besteffort",
            "BestEffort",
            "max".to_string(),
            "max 100000",
            0,
            1000,
        ),
    ] {
        let r = a.wait(name, "running", 60, |r| {
            container(r, "app").state.is_running()
        });
        assert_eq!(r.qos, qos);
        let id = container(&r, "app").id.clone().unwrap();
        let cg = cgroup_of(&env, &id).await;
        let read = |f: &str| {
            std::fs::read_to_string(cg.join(f))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("memory.max"), max, "{name}");
        assert_eq!(read("cpu.max"), cpu, "{name}");
        // The kernel keeps whole pages.
        assert_eq!(
            read("memory.swap.max"),
            (swap_max / 4096 * 4096).to_string(),
            "{name}"
        );
        let st = env
            .d
            .runtime()
            .container_status(crius::cri::v1::ContainerStatusRequest {
                container_id: id,
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
        let pid = info["pid"].as_u64().unwrap();
        let got: i64 = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(got, adj, "{name}");
    }
}

/// On a CNI network the agent's pods get an IP: it is in the record (`status.podIP`, `crius get
/// pods` and `describe`) and in the downward API, HTTP probes reach the pod by it, and a
/// hostPort maps a port of the node to the container.
#[tokio::test(flavor = "multi_thread")]
async fn pod_ip_host_port_and_probes_by_ip() {
    if !plugins_present() {
        return;
    }
    let net = TestNet::new();
    let env = PodEnv::start_with(&net.tables()).await;
    std::fs::write(
        env.d.net_dir().join("10-agent.conflist"),
        net.conflist(TestNet::portmap()),
    )
    .unwrap();
    let a = Agent::start(&env.d);
    let host_port = free_port();
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: netpod}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {img}
    command: [sh, -c, 'mkdir -p /www && echo "ip $MY_IP" > /www/index.html && exec httpd -f -p 80 -h /www']
    env:
    - name: MY_IP
      valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
    ports: [{{containerPort: 80, hostPort: {host_port}}}]
    readinessProbe: {{httpGet: {{port: 80, path: /index.html}}, periodSeconds: 1}}
"#,
        img = env.image
    );
    a.put("netpod.yaml", &yaml);
    let r = a.wait("netpod", "ready with an IP", 60, |r| {
        !r.pod_ip.is_empty() && container(r, "web").ready
    });
    assert!(r.pod_ip.starts_with(&net.prefix), "{}", r.pod_ip);
    // The probe went to the pod's IP: httpd logs nothing, so ask the page itself, by IP.
    let page = |addr: String| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        std::io::Write::write_all(&mut s, b"GET /index.html HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut s, &mut body).unwrap();
        body
    };
    let by_ip = page(format!("{}:80", r.pod_ip));
    assert!(by_ip.contains(&format!("ip {}", r.pod_ip)), "{by_ip}");
    let by_host_port = page(format!("127.0.0.1:{host_port}"));
    assert!(
        by_host_port.contains(&format!("ip {}", r.pod_ip)),
        "{by_host_port}"
    );
    let state = a.state.to_str().unwrap();
    let out = a.cli(&["get", "pods", "-o", "json", "--state", state]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&r.pod_ip),
        "{out:?}"
    );
    let out = a.cli(&["get", "pods", "-o", "wide", "--state", state]);
    let wide = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(wide.lines().next().unwrap_or("").contains("IP"), "{wide}");
    assert!(
        wide.lines()
            .any(|l| l.contains("netpod") && l.contains(&r.pod_ip)),
        "{wide}"
    );
    let out = a.cli(&["describe", "pod", "netpod", "--state", state]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("IP:               {}", r.pod_ip)),
        "{out:?}"
    );
    // The manifest's check no longer calls hostPort ignored.
    assert!(!a.log_text().contains("hostPort: ignored"));
    a.remove("netpod.yaml");
    let start = Instant::now();
    while a.record("netpod").is_some() {
        assert!(start.elapsed() < Duration::from_secs(30), "the pod stayed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing of the pod's network is left.
    assert_eq!(net.veths(), 0);
    assert!(net.allocations().is_empty(), "{:?}", net.allocations());
}
