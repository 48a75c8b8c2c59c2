//! `cargo xtask bench --table`: a finished run's `results.json` as the Markdown table
//! docs/performance.md carries, a column of medians per runtime and crius's ratio to each peer,
//! so the page's numbers come from one run and one command. Reads only the JSON.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// A median with its unit, in as many digits as the size calls for.
fn shown(median: f64, unit: &str) -> String {
    let digits = match median.abs() {
        m if m >= 100.0 => 0,
        m if m >= 10.0 => 1,
        _ => 2,
    };
    format!("{median:.digits$} {unit}")
}

/// The table for the JSON text `json`: each peer's column is named by its part and the version
/// the run recorded.
pub fn markdown(json: &str) -> Result<String> {
    let doc: Value = serde_json::from_str(json).context("results.json is not JSON")?;
    let peers: Vec<&str> = doc["peers"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let results = doc["results"]
        .as_object()
        .context("results.json has no \"results\" object")?;
    let names = |role: &str| {
        let part = if role.starts_with("containerd") {
            "containerd"
        } else {
            role
        };
        match doc["peer_versions"][role].as_str() {
            Some(v) if !v.is_empty() => format!("{part} {v}"),
            _ => role.to_string(),
        }
    };
    let mut head = vec!["operation".to_string(), "crius".to_string()];
    head.extend(peers.iter().map(|p| names(p)));
    head.extend(peers.iter().map(|p| format!("ratio to {}", names(p))));
    let mut rows = vec![head];
    for (op, r) in results {
        let unit = r["unit"].as_str().unwrap_or("ms");
        let median = |rt: &str| r[rt]["median"].as_f64().map(|m| shown(m, unit));
        let mut row = vec![op.clone(), median("crius").unwrap_or_else(|| "-".into())];
        row.extend(peers.iter().map(|p| median(p).unwrap_or_default()));
        row.extend(peers.iter().map(|p| {
            r[format!("ratio_{p}")]
                .as_f64()
                .map(|x| format!("{x:.3}"))
                .unwrap_or_default()
        }));
        rows.push(row);
    }
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        let _ = writeln!(out, "| {} |", row.join(" | "));
        if n == 0 {
            let _ = writeln!(out, "|{}|", vec!["---"; row.len()].join("|"));
        }
    }
    let text = |k: &str| doc[k].as_str().unwrap_or("?").to_string();
    let _ = writeln!(
        out,
        "\n{}, commit {}: {} rounds{}, {} busy loop(s) beside; medians, and crius's median over \
         each peer's.",
        text("date"),
        text("commit"),
        doc["rounds"].as_u64().unwrap_or(0),
        if doc["smoke"].as_bool() == Some(true) {
            ", smoke run"
        } else {
            ""
        },
        doc["load"].as_u64().unwrap_or(0),
    );
    Ok(out)
}

/// The table for the run at `results`.
pub fn table(results: &Path) -> Result<String> {
    let json = std::fs::read_to_string(results)
        .with_context(|| format!("reading {} (run the bench first)", results.display()))?;
    markdown(&json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_becomes_one_row_an_operation() {
        let json = serde_json::json!({
            "rounds": 3,
            "smoke": false,
            "date": "2026-12-03T18:00:00Z",
            "commit": "abc",
            "load": 1,
            "peers": ["containerd", "crio"],
            "peer_versions": {"containerd": "2.4.2"},
            "results": {
                "ExecSync `true`": {
                    "unit": "ms",
                    "crius": {"median": 1.234},
                    "containerd": {"median": 20.5},
                    "ratio_containerd": 0.0602,
                    "crio": null,
                    "ratio_crio": null
                },
                "daemon RSS idle": {"unit": "MiB", "crius": {"median": 123.4}}
            }
        });
        let t = markdown(&json.to_string()).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| operation | crius | containerd 2.4.2 | crio | ratio to containerd 2.4.2 | ratio to crio |"
        );
        assert_eq!(lines[1], "|---|---|---|---|---|---|");
        assert_eq!(
            lines[2],
            "| ExecSync `true` | 1.23 ms | 20.5 ms |  | 0.060 |  |"
        );
        assert_eq!(lines[3], "| daemon RSS idle | 123 MiB |  |  |  |  |");
        assert!(t.contains("2026-12-03T18:00:00Z, commit abc: 3 rounds, 1 busy loop(s) beside"));
        assert!(markdown("{}").is_err());
    }
}
