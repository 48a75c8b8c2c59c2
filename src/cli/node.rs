//! `crius check` (the node's preflight, read off this machine) and `crius info` (what the
//! running runtime says of itself through CRI Status, verbose).

use std::path::Path;

use super::Result;

use super::{Output, connect, print_table, rpc_error};
use crate::config::Config;
use crate::preflight::{self, Level};

/// Prints every preflight item; the exit code says the worst level (0 ok, 1 warn, 2 fail).
pub fn check(cfg: &Config, output: Output) -> i32 {
    let findings = preflight::run(cfg);
    match output {
        Output::Json | Output::Yaml => {
            let items: Vec<serde_json::Value> = findings
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "item": f.item, "level": f.level.word(), "detail": f.detail, "fix": f.fix,
                    })
                })
                .collect();
            if output == Output::Json {
                println!("{}", serde_json::Value::Array(items));
            } else if let Ok(text) = serde_saphyr::to_string(&items) {
                print!("{text}");
            }
        }
        Output::Table | Output::Wide => {
            let mut rows = vec![vec!["".to_string(), "ITEM".into(), "DETAIL".into()]];
            for f in &findings {
                rows.push(vec![
                    f.level.word().to_uppercase(),
                    f.item.to_string(),
                    f.detail.clone(),
                ]);
                if f.level != Level::Ok {
                    rows.push(vec![String::new(), String::new(), format!("-> {}", f.fix)]);
                }
            }
            print_table(&rows);
        }
    }
    preflight::exit_code(&findings)
}

/// The runtime's conditions, handlers with their features, and its verbose info (config and
/// versions) as JSON.
pub async fn info(socket: &Path) -> Result<()> {
    let ch = connect(socket)?;
    let st = crate::cri::client::runtime(ch)
        .status(crate::cri::v1::StatusRequest { verbose: true })
        .await
        .map_err(|s| rpc_error("asking the runtime's status", socket, s))?
        .into_inner();
    let conditions: Vec<serde_json::Value> = st
        .status
        .map(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            serde_json::json!({
                "type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message,
            })
        })
        .collect();
    let handlers: Vec<serde_json::Value> = st
        .runtime_handlers
        .into_iter()
        .map(|h| {
            let f = h.features.unwrap_or_default();
            serde_json::json!({
                "name": h.name,
                "recursiveReadOnlyMounts": f.recursive_read_only_mounts,
                "userNamespaces": f.user_namespaces,
            })
        })
        .collect();
    let mut out = serde_json::json!({
        "conditions": conditions,
        "runtimeHandlers": handlers,
        "features": {
            "supplementalGroupsPolicy": st.features.is_some_and(|f| f.supplemental_groups_policy),
        },
    });
    for (k, v) in st.info {
        out[k] = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
    }
    println!("{}", super::json_text(&out)?);
    Ok(())
}
