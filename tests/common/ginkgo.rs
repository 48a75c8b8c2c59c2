//! ginkgo's JSON report (`--ginkgo.json-report`, or the CLI's `--json-report`), as the upstream
//! suites built on ginkgo write it: critest and the node e2e suite.

use std::path::Path;

/// One spec's outcome from ginkgo's JSON report.
#[derive(Clone)]
pub struct Spec {
    /// Containers and leaf text joined by spaces, as ginkgo's full text.
    pub name: String,
    pub state: String,
    pub message: String,
    pub location: String,
    pub seconds: f64,
}

impl Spec {
    pub fn first_line(&self) -> &str {
        self.message
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
    }
}

pub fn parse_report(path: &Path) -> Vec<Spec> {
    let data = std::fs::read(path).expect("ginkgo's JSON report");
    let suites: serde_json::Value = serde_json::from_slice(&data).expect("JSON report");
    let mut specs = Vec::new();
    for suite in suites.as_array().expect("an array of suites") {
        for r in suite["SpecReports"].as_array().into_iter().flatten() {
            let mut parts: Vec<&str> = r["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .collect();
            let leaf = r["LeafNodeText"].as_str().unwrap_or("");
            let kind = r["LeafNodeType"].as_str().unwrap_or("");
            if leaf.is_empty() {
                parts.push(kind);
            } else {
                parts.push(leaf);
            }
            let failure = &r["Failure"];
            let loc = &failure["Location"];
            specs.push(Spec {
                name: parts.join(" "),
                state: r["State"].as_str().unwrap_or("unknown").to_string(),
                message: failure["Message"].as_str().unwrap_or("").to_string(),
                location: match (loc["FileName"].as_str(), loc["LineNumber"].as_i64()) {
                    (Some(f), Some(l)) => format!("{f}:{l}"),
                    _ => String::new(),
                },
                seconds: r["RunTime"].as_f64().unwrap_or(0.0) / 1e9,
            });
        }
    }
    specs
}
