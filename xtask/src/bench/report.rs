//! The benchmark's samples and what is made of them: median, p90 and spread per operation and
//! runtime, the ratio of crius's median to each peer's, printed as a table and written as JSON.

use std::collections::BTreeMap;

use anyhow::Result;

use super::Options;

/// Samples per operation and runtime, in milliseconds (or KiB, or CPU seconds).
#[derive(Default)]
pub struct Results {
    pub samples: BTreeMap<String, BTreeMap<&'static str, Vec<f64>>>,
    units: BTreeMap<String, &'static str>,
}

impl Results {
    pub fn add(&mut self, op: &str, unit: &'static str, rt: &'static str, v: f64) {
        self.samples
            .entry(op.to_string())
            .or_default()
            .entry(rt)
            .or_default()
            .push(v);
        self.units.insert(op.to_string(), unit);
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

pub struct Stats {
    pub median: f64,
    pub p90: f64,
    pub spread: f64,
    pub n: usize,
}

pub fn stats(v: &[f64]) -> Stats {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let median = quantile(&s, 0.5);
    let spread = if median > 0.0 {
        (s[s.len() - 1] - s[0]) / median * 100.0
    } else {
        0.0
    };
    Stats {
        median,
        p90: quantile(&s, 0.9),
        spread,
        n: s.len(),
    }
}

/// Which release each peer is, from its directory's name (`containerd-v2.4.2`, `crio-v1.36.3`);
/// a peer's name is its role.
/// The version of the peer `role` installed (from its directory's name).
fn peer_version(role: &str) -> String {
    let dir = crate::upstream::dir(role).unwrap_or_default();
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    name.rsplit_once("-v")
        .map_or(&*name, |(_, v)| v)
        .to_string()
}

fn peer_versions(peers: &[&'static str]) -> String {
    let said: Vec<String> = peers
        .iter()
        .map(|role| format!("{role} is {}", peer_version(role)))
        .collect();
    said.join(", ")
}

/// Prints the table (crius, then each peer in `peers` with crius's ratio to it) and writes the
/// JSON.
pub fn report(res: &Results, o: &Options, peers: &[&'static str]) -> Result<()> {
    let mut head = vec![
        "operation".to_string(),
        "crius median".into(),
        "p90".into(),
        "spread".into(),
    ];
    for p in peers {
        head.extend([format!("{p} median"), "p90".into(), "spread".into()]);
        head.push(format!("ratio to {p}"));
    }
    let mut rows = vec![head];
    let mut json = serde_json::Map::new();
    for (op, per) in &res.samples {
        let unit = res.units.get(op).copied().unwrap_or("ms");
        let fmt = |s: &Option<Stats>| match s {
            Some(s) => [
                format!("{:.2} {unit}", s.median),
                format!("{:.2}", s.p90),
                format!("{:.0}%", s.spread),
            ],
            None => ["-".into(), "-".into(), "-".into()],
        };
        let entry = |s: &Option<Stats>, raw: Option<&Vec<f64>>| {
            s.as_ref().map(|s| serde_json::json!({"median": s.median, "p90": s.p90, "spread_pct": s.spread, "n": s.n, "samples": raw}))
        };
        let c = per.get("crius").map(|v| stats(v));
        let mut row = vec![op.clone()];
        row.extend(fmt(&c));
        let mut doc = serde_json::json!({"unit": unit, "crius": entry(&c, per.get("crius"))});
        for p in peers {
            let d = per.get(p).map(|v| stats(v));
            let ratio = match (&c, &d) {
                (Some(c), Some(d)) if d.median > 0.0 => Some(c.median / d.median),
                _ => None,
            };
            row.extend(fmt(&d));
            row.push(ratio.map_or("-".into(), |r| format!("{r:.3}")));
            doc[*p] = serde_json::json!(entry(&d, per.get(p)));
            doc[format!("ratio_{p}")] = serde_json::json!(ratio);
        }
        rows.push(row);
        json.insert(op.clone(), doc);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    println!();
    for (n, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("| {} |", line.join(" | "));
        if n == 0 {
            println!(
                "|{}|",
                widths
                    .iter()
                    .map(|w| "-".repeat(w + 2))
                    .collect::<Vec<_>>()
                    .join("|")
            );
        }
    }
    let unpigz = std::process::Command::new("sh")
        .arg("-c")
        .arg("command -v unpigz")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    println!(
        "\nrounds: {}, busy loops beside: {}, peers: {} ({}; all on Debian's runc, crio with \
         conmon), unpigz on PATH: {unpigz}",
        o.rounds,
        o.load,
        peers.join(", "),
        peer_versions(peers)
    );
    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let commit = commit();
    let doc = serde_json::json!({
        "date": date,
        "commit": commit,
        "load": o.load,
        "rounds": o.rounds,
        "smoke": o.smoke,
        "unpigz": unpigz,
        "peers": peers,
        "peer_versions": peers
            .iter()
            .map(|p| (p.to_string(), serde_json::json!(peer_version(p))))
            .collect::<serde_json::Map<_, _>>(),
        "results": json,
    });
    std::fs::write(&o.out, serde_json::to_vec_pretty(&doc)?)?;
    println!("results written to {}", o.out.display());
    // Every run's medians and ratios, a line each, so a row's course over runs can be shown.
    let trend = o.out.with_file_name("trend.jsonl");
    let rows: serde_json::Map<String, serde_json::Value> = doc["results"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(op, r)| {
            let mut row = serde_json::json!({"crius": r["crius"]["median"]});
            for p in peers {
                row[format!("ratio_{p}")] = r[format!("ratio_{p}")].clone();
            }
            (op.clone(), row)
        })
        .collect();
    let line = serde_json::json!({
        "date": doc["date"], "commit": doc["commit"], "load": o.load, "rounds": o.rounds,
        "smoke": o.smoke, "peers": peers, "rows": rows,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&trend)?;
    std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())?;
    println!("and appended to {}", trend.display());
    Ok(())
}

/// The checkout's commit, with `-dirty` when it has uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default();
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}
