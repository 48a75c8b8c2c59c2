mod common;
use common::*;
use std::time::Instant;
#[tokio::test]
async fn debug_exec() {
    let env = PodEnv::start().await;
    let sb = env.sandbox_config("dbg");
    let pod = env.run_pod(&sb).await.unwrap();
    let a = env.run(&pod, &sb, env.container_config("a", &["sleep", "100000"])).await;
    for _ in 0..20 { env.exec(&a, &["true"], 10).await.unwrap(); }
    let t = Instant::now();
    for _ in 0..50 { env.exec(&a, &["true"], 10).await.unwrap(); }
    println!("exec avg {:.3} ms", t.elapsed().as_secs_f64() * 1000.0 / 50.0);
    let pid = env.d.pid().unwrap();
    let c = env.create(&pod, &sb, env.container_config("traced", &["sleep", "100000"])).await.unwrap();
    let mut st = std::process::Command::new("strace").args(["-f", "-tt", "-T", "-o", "/tmp/start.strace", "-p", &pid.to_string()]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    env.start_container(&c).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    st.kill().unwrap();
    // create+start timing
    let t = Instant::now();
    for i in 0..10 { env.run(&pod, &sb, env.container_config(&format!("c{i}"), &["sleep", "100000"])).await; }
    println!("create+start avg {:.3} ms", t.elapsed().as_secs_f64() * 1000.0 / 10.0);
    for rpc in ["CreateContainer", "StartContainer", "ExecSync", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"] {
        let mut t = env.d.rpc_times(rpc);
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if !t.is_empty() { println!("{rpc}: n={} median {:.3} ms", t.len(), t[t.len() / 2]); }
    }
    env.remove_pod(&pod).await;
}
