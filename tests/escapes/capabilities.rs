//! CVE-2022-29162: inheritable capabilities. A runtime that leaves capabilities in the
//! inheritable set lets a process that is not root gain them by executing a file with
//! inheritable file capabilities. Covered: the init and an exec'd command, as root and as user
//! 1000, with the default set and with capabilities added, hold no inheritable capability
//! (ambient capabilities, which need the inheritable set, are asked for nowhere here).

use crate::common::*;
use crate::*;

/// The `CapInh` mask in a /proc status text.
fn inheritable(status: &str) -> u64 {
    let v = status
        .lines()
        .find_map(|l| l.strip_prefix("CapInh:"))
        .unwrap_or_else(|| panic!("no CapInh in {status}"));
    u64::from_str_radix(v.trim(), 16).unwrap()
}

#[tokio::test]
async fn cve_2022_29162_no_inheritable_capabilities() {
    // The detector: a host process given an inheritable capability shows it.
    let mut holder = std::process::Command::new("setpriv")
        .args(["--inh-caps", "+net_raw", "sleep", "30"])
        .spawn()
        .unwrap();
    let mut shown = 0;
    for _ in 0..100 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", holder.id())).unwrap();
        shown = inheritable(&s);
        if shown != 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = holder.kill();
    let _ = holder.wait();
    assert_ne!(shown, 0, "the detector must see an inheritable capability");

    let env = PodEnv::start().await;
    let sb = env.sandbox_config("inh");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut found = Vec::new();
    for (name, user, add) in [
        ("root", None, vec![]),
        ("rootadd", None, vec!["NET_ADMIN", "SYS_PTRACE"]),
        ("user", Some(1000), vec![]),
        ("useradd", Some(1000), vec!["NET_ADMIN", "NET_RAW"]),
    ] {
        let mut cfg = container(&env, name, "sleep 100000");
        let sc = security(&mut cfg);
        if let Some(uid) = user {
            sc.run_as_user = Some(cri::Int64Value { value: uid });
        }
        sc.capabilities = Some(cri::Capability {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        let c = env.run(&pod, &sb, cfg).await;
        let (out, _, _) = env
            .exec(&c, &["cat", "/proc/1/status", "/proc/self/status"], 10)
            .await
            .unwrap();
        for (who, part) in ["init", "exec"].iter().zip(out.split("Name:").skip(1)) {
            let inh = inheritable(part);
            if inh != 0 {
                found.push(format!("{name} {who}: CapInh {inh:x}"));
            }
        }
    }
    env.remove_pod(&pod).await;
    assert!(found.is_empty(), "inheritable capabilities: {found:?}");
}
