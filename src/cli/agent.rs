//! The pod agent's commands: `run` checks manifests and hands them to the agent's directory,
//! `get pods` and `describe pod` read the agent's records, `delete` takes manifests away.

use std::path::{Path, PathBuf};

use super::{Doing, OrRefuse, Result, refuse};

use super::{Output, print_table};
use crate::frontend::manifest::{self, Object};
use crate::frontend::status::{self, PodRecord, State, age, now};

/// Checks every file and copies it into the manifest directory, where the agent picks it up.
pub fn run(manifests: &Path, files: &[PathBuf]) -> Result<()> {
    let mut loaded = Vec::new();
    for f in files {
        let objs = manifest::load_file(f)?;
        if objs.is_empty() {
            refuse!("{}: no objects in it", f.display());
        }
        loaded.push((f, objs));
    }
    std::fs::create_dir_all(manifests).doing(|| format!("creating {}", manifests.display()))?;
    for (f, objs) in loaded {
        for o in &objs {
            for w in &o.warnings {
                eprintln!("warning: {}: {w}", f.display());
            }
        }
        let target = crate::frontend::agent::manifest_target(manifests, f);
        let existed = target.exists();
        let text = std::fs::read(f).doing(|| format!("reading {}", f.display()))?;
        crate::atomic::write(&target, &text, 0o600)
            .doing(|| format!("writing {}", target.display()))?;
        for o in &objs {
            let verb = if existed { "configured" } else { "created" };
            println!(
                "{}/{} {verb}",
                o.object.kind().to_lowercase(),
                o.object.key()
            );
        }
    }
    Ok(())
}

/// Removes manifests: the given files' copies, or the file holding a pod.
pub fn delete(manifests: &Path, files: &[PathBuf], pod: Option<(&str, &str)>) -> Result<()> {
    for f in files {
        let target = crate::frontend::agent::manifest_target(manifests, f);
        std::fs::remove_file(&target)
            .doing(|| format!("{} is not in {}", f.display(), manifests.display()))?;
        println!("{} deleted", target.display());
    }
    if let Some((ns, name)) = pod {
        let key = format!("{ns}/{name}");
        let mut found = false;
        for e in std::fs::read_dir(manifests)
            .doing(|| format!("reading {}", manifests.display()))?
            .flatten()
        {
            let Ok(objs) = manifest::load_file(&e.path()) else {
                continue;
            };
            let holds = objs
                .iter()
                .any(|o| matches!(o.object, Object::Pod(_)) && o.object.key() == key);
            if !holds {
                continue;
            }
            if objs.len() > 1 {
                refuse!(
                    "pod {key} is in {} with other objects: edit the file, or delete it with -f",
                    e.path().display()
                );
            }
            std::fs::remove_file(e.path()).doing(|| format!("removing {}", e.path().display()))?;
            println!("pod/{key} deleted");
            found = true;
        }
        if !found {
            refuse!("pod {key} is in no manifest of {}", manifests.display());
        }
    }
    Ok(())
}

fn find<'a>(records: &'a [PodRecord], namespace: &str, name: &str) -> Result<&'a PodRecord> {
    records
        .iter()
        .find(|r| r.namespace == namespace && r.name == name)
        .or_refuse(|| format!("pod {namespace}/{name} not found"))
}

/// `kubectl get pods`: name, ready, status, restarts, age.
pub fn get_pods(state: &Path, namespace: Option<&str>, output: Output) -> Result<()> {
    let records: Vec<PodRecord> = status::load_all(state)
        .into_iter()
        .filter(|r| namespace.is_none_or(|n| n == r.namespace))
        .collect();
    if super::print_structured(&records, output)? {
        return Ok(());
    }
    let t = now();
    let mut rows = vec![vec![
        "NAMESPACE".to_string(),
        "NAME".into(),
        "READY".into(),
        "STATUS".into(),
        "RESTARTS".into(),
        "AGE".into(),
    ]];
    let wide = output == Output::Wide;
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    if wide {
        rows[0].extend(["IP".to_string(), "NODE".into()]);
    }
    for r in &records {
        let (ready, total) = r.ready_count();
        let restarts = r.restarts();
        let last_restart = r
            .all()
            .filter_map(|c| match &c.last_state {
                Some(State::Terminated { finished_at, .. }) => Some(*finished_at),
                _ => None,
            })
            .max();
        let restarts = match last_restart {
            Some(t0) if restarts > 0 => format!("{restarts} ({} ago)", age(t0, t)),
            _ => restarts.to_string(),
        };
        rows.push(vec![
            r.namespace.clone(),
            r.name.clone(),
            format!("{ready}/{total}"),
            r.display_status(),
            restarts,
            age(r.created_at, t),
        ]);
        if wide {
            let ip = if r.pod_ip.is_empty() {
                "<none>"
            } else {
                &r.pod_ip
            };
            if let Some(row) = rows.last_mut() {
                row.extend([ip.to_string(), node.clone()]);
            }
        }
    }
    print_table(&rows);
    Ok(())
}

fn time(t: i64) -> String {
    if t <= 0 {
        return "-".into();
    }
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(t as u64),
    )
    .to_string()
}

fn state_lines(s: &State, indent: &str) -> Vec<String> {
    match s {
        State::Waiting { reason, message } => {
            let mut v = vec![
                format!("{indent}State:          Waiting"),
                format!("{indent}  Reason:       {reason}"),
            ];
            if !message.is_empty() {
                v.push(format!("{indent}  Message:      {message}"));
            }
            v
        }
        State::Running { started_at } => vec![
            format!("{indent}State:          Running"),
            format!("{indent}  Started:      {}", time(*started_at)),
        ],
        State::Terminated {
            exit_code,
            reason,
            message,
            started_at,
            finished_at,
        } => {
            let mut v = vec![
                format!("{indent}State:          Terminated"),
                format!("{indent}  Reason:       {reason}"),
                format!("{indent}  Exit Code:    {exit_code}"),
                format!("{indent}  Started:      {}", time(*started_at)),
                format!("{indent}  Finished:     {}", time(*finished_at)),
            ];
            if !message.is_empty() {
                v.push(format!("{indent}  Message:      {message}"));
            }
            v
        }
    }
}

/// `kubectl describe pod`: the pod, its containers (state, last state, probes) and events.
pub fn describe_pod(state: &Path, namespace: &str, name: &str) -> Result<()> {
    let records = status::load_all(state);
    let r = find(&records, namespace, name)?;
    let t = now();
    let mut out = vec![
        format!("Name:             {}", r.name),
        format!("Namespace:        {}", r.namespace),
        format!("UID:              {}", r.uid),
        format!("Manifest:         {}", r.file.display()),
        format!("Start Time:       {}", time(r.created_at)),
        format!("Status:           {:?}", r.phase),
        format!(
            "IP:               {}",
            if r.pod_ip.is_empty() {
                "<none>"
            } else {
                &r.pod_ip
            }
        ),
        format!("QoS Class:        {}", r.qos),
        format!(
            "Sandbox:          {}",
            r.sandbox.as_deref().unwrap_or("<none>")
        ),
    ];
    if !r.message.is_empty() {
        out.push(format!("Message:          {}", r.message));
    }
    for (title, list) in [
        ("Init Containers:", &r.init_containers),
        ("Containers:", &r.containers),
    ] {
        if list.is_empty() {
            continue;
        }
        out.push(title.into());
        for c in list {
            out.push(format!("  {}:", c.name));
            out.push(format!(
                "    Container ID:   {}",
                c.id.as_deref().unwrap_or("")
            ));
            out.push(format!("    Image:          {}", c.image));
            if c.sidecar {
                out.push("    Restart Policy: Always (sidecar)".into());
            }
            out.extend(state_lines(&c.state, "    "));
            if let Some(last) = &c.last_state {
                out.extend(
                    state_lines(last, "    ")
                        .into_iter()
                        .map(|l| l.replacen("State:     ", "Last State:", 1)),
                );
            }
            out.push(format!("    Ready:          {}", c.ready));
            out.push(format!("    Started:        {}", c.started));
            out.push(format!("    Restart Count:  {}", c.restart_count));
            for (kind, p) in &c.probes {
                out.push(format!(
                    "    {kind} probe:  {} {} (for {})",
                    p.result,
                    p.message,
                    age(p.at, t)
                ));
            }
        }
    }
    out.push("Conditions:".into());
    out.push("  Type                        Status".into());
    for c in &r.conditions {
        out.push(format!(
            "  {:<27} {}",
            c.kind,
            if c.status { "True" } else { "False" }
        ));
    }
    out.push("Events:".into());
    if r.events.is_empty() {
        out.push("  <none>".into());
    } else {
        let mut rows = vec![vec![
            "  Type".to_string(),
            "Reason".into(),
            "Age".into(),
            "From".into(),
            "Message".into(),
        ]];
        for e in &r.events {
            let when = if e.count > 1 {
                format!("{} (x{} over {})", age(e.last, t), e.count, age(e.first, t))
            } else {
                age(e.last, t)
            };
            let from = if e.object.is_empty() {
                "agent".to_string()
            } else {
                format!("agent/{}", e.object)
            };
            rows.push(vec![
                format!("  {}", e.kind),
                e.reason.clone(),
                when,
                from,
                e.message.clone(),
            ]);
        }
        for l in out {
            println!("{l}");
        }
        print_table(&rows);
        return Ok(());
    }
    for l in out {
        println!("{l}");
    }
    Ok(())
}
