//! `cargo xtask bench --plot`: SVG charts of a run's `results.json` (what `report` writes), drawn
//! with plotters: crius's ratio to each peer per operation, with the spread of crius's samples,
//! and cold pull time against image size. Reads only the JSON; needs no root and runs nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use serde_json::Value;

/// One bar: an operation against one peer.
struct Ratio {
    label: String,
    /// A rate (MB/s), where above 1 is crius faster.
    rate: bool,
    ratio: f64,
    /// The lowest and highest crius sample over the peer's median.
    low: f64,
    high: f64,
}

/// One point of the pull chart: a runtime's median pull of an image of `mb` megabytes.
struct Pull {
    runtime: String,
    mb: f64,
    ms: f64,
}

fn median_of(entry: &Value) -> Option<f64> {
    entry.get("median").and_then(Value::as_f64)
}

fn samples_of(entry: &Value) -> Vec<f64> {
    entry
        .get("samples")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// Every operation that has a ratio to a peer, in the file's order, peers in theirs.
fn ratios(doc: &Value) -> Vec<Ratio> {
    let peers: Vec<&str> = doc["peers"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    let Some(results) = doc["results"].as_object() else {
        return out;
    };
    for (op, r) in results {
        let crius = &r["crius"];
        let samples = samples_of(crius);
        let rate = r["unit"].as_str().is_some_and(|u| u.ends_with("/s"));
        for p in &peers {
            let (Some(ratio), Some(peer)) = (r[format!("ratio_{p}")].as_f64(), median_of(&r[*p]))
            else {
                continue;
            };
            // A difference of medians can be negative: no bar says that.
            if peer <= 0.0 || ratio <= 0.0 {
                continue;
            }
            let low = samples.iter().copied().fold(f64::INFINITY, f64::min) / peer;
            let high = samples.iter().copied().fold(0.0, f64::max) / peer;
            let (low, high) = if samples.is_empty() {
                (ratio, ratio)
            } else {
                (low, high)
            };
            out.push(Ratio {
                label: if rate {
                    format!("{op} / {p} (a rate: above 1 is faster)")
                } else {
                    format!("{op} / {p}")
                },
                rate,
                ratio,
                low,
                high,
            });
        }
    }
    out
}

/// The image size an operation's name gives, `(1 MB)`, `(250 MB, ...)`, `(1024 MiB weights ...)`.
fn size_mb(op: &str) -> Option<f64> {
    let inner = &op[op.find('(')? + 1..];
    let number: String = inner
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let unit = inner[number.len()..].trim_start();
    let n: f64 = number.parse().ok()?;
    if unit.starts_with("MiB") {
        Some(n * 1.048_576)
    } else if unit.starts_with("MB") {
        Some(n)
    } else {
        None
    }
}

/// The cold pulls of the run with a size in their names, one point per runtime.
fn pulls(doc: &Value) -> Vec<Pull> {
    let mut out = Vec::new();
    let Some(results) = doc["results"].as_object() else {
        return out;
    };
    for (op, r) in results {
        if !op.starts_with("cold pull") || r["unit"].as_str() != Some("ms") {
            continue;
        }
        let Some(mb) = size_mb(op) else { continue };
        for (runtime, entry) in r.as_object().into_iter().flatten() {
            if runtime == "unit" || runtime.starts_with("ratio_") {
                continue;
            }
            if let Some(ms) = median_of(entry) {
                out.push(Pull {
                    runtime: runtime.clone(),
                    mb,
                    ms,
                });
            }
        }
    }
    out
}

fn drawing<E: std::fmt::Debug>(path: &Path) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow!("drawing {}: {e:?}", path.display())
}

fn ratio_chart(rows: &[Ratio], path: &Path) -> Result<()> {
    let height = 80 + 26 * rows.len().max(1) as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(drawing(path))?;
    let max = rows
        .iter()
        .map(|r| r.high.max(r.ratio))
        .fold(1.0_f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "crius's median over each peer's (below 1: crius faster or smaller)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(520)
        .build_cartesian_2d(0.0..max, (0..rows.len()).into_segmented())
        .map_err(drawing(path))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len().max(1))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => rows.get(*i).map(|r| r.label.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("ratio")
        .draw()
        .map_err(drawing(path))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let better = if r.rate {
                r.ratio >= 1.0
            } else {
                r.ratio <= 1.0
            };
            let color = if better { BLUE } else { RED };
            Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (r.ratio, SegmentValue::Exact(i + 1)),
                ],
                color.mix(0.6).filled(),
            )
        }))
        .map_err(drawing(path))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            PathElement::new(
                vec![
                    (r.low, SegmentValue::CenterOf(i)),
                    (r.high, SegmentValue::CenterOf(i)),
                ],
                BLACK.stroke_width(2),
            )
        }))
        .map_err(drawing(path))?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![
                (1.0, SegmentValue::Exact(0)),
                (1.0, SegmentValue::Exact(rows.len())),
            ],
            BLACK.stroke_width(1),
        )))
        .map_err(drawing(path))?;
    root.present().map_err(drawing(path))?;
    Ok(())
}

fn pull_chart(points: &[Pull], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(drawing(path))?;
    let max_mb = points.iter().map(|p| p.mb).fold(1.0_f64, f64::max) * 1.1;
    let max_s = points.iter().map(|p| p.ms / 1000.0).fold(0.1_f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("cold pull time against image size", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_mb, 0.0..max_s)
        .map_err(drawing(path))?;
    chart
        .configure_mesh()
        .x_desc("image size (MB)")
        .y_desc("pull time (s)")
        .draw()
        .map_err(drawing(path))?;
    let mut runtimes: Vec<&str> = points.iter().map(|p| p.runtime.as_str()).collect();
    runtimes.sort();
    runtimes.dedup();
    for (n, runtime) in runtimes.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        let mut line: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.runtime == *runtime)
            .map(|p| (p.mb, p.ms / 1000.0))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(drawing(path))?
            .label(*runtime)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(line.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(drawing(path))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(drawing(path))?;
    root.present().map_err(drawing(path))?;
    Ok(())
}

/// Draws `ratios.svg` and `pulls.svg` beside `results` and says where they are.
pub fn plot(results: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(results).with_context(|| {
        format!(
            "reading {} (run cargo xtask bench first)",
            results.display()
        )
    })?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", results.display()))?;
    let dir = results.parent().unwrap_or(Path::new("."));
    let mut written = Vec::new();
    let rows = ratios(&doc);
    if !rows.is_empty() {
        let path = dir.join("ratios.svg");
        ratio_chart(&rows, &path)?;
        written.push(path);
    }
    let points = pulls(&doc);
    if !points.is_empty() {
        let path = dir.join("pulls.svg");
        pull_chart(&points, &path)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(samples: &[f64]) -> Value {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        serde_json::json!({"median": s[s.len() / 2], "samples": samples})
    }

    #[test]
    fn charts_from_a_small_results_file() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results.json");
        let doc = serde_json::json!({
            "rounds": 3,
            "peers": ["containerd", "containerd-lts", "crio"],
            "results": {
                "container create+start": {
                    "unit": "ms", "crius": entry(&[6.0, 7.0, 8.0]),
                    "containerd": entry(&[60.0, 62.0, 64.0]), "ratio_containerd": 7.0 / 62.0,
                    "containerd-lts": entry(&[58.0, 59.0, 61.0]), "ratio_containerd-lts": 7.0 / 59.0,
                    "crio": entry(&[90.0, 95.0, 99.0]), "ratio_crio": 7.0 / 95.0,
                },
                "cold pull small (1 MB)": {
                    "unit": "ms", "crius": entry(&[30.0, 32.0, 35.0]),
                    "containerd": entry(&[70.0, 71.0, 72.0]), "ratio_containerd": 32.0 / 71.0,
                    "containerd-lts": null, "ratio_containerd-lts": null,
                    "crio": entry(&[80.0, 84.0, 88.0]), "ratio_crio": 32.0 / 84.0,
                },
                "cold pull AI-shaped image (1024 MiB weights + 20000 files)": {
                    "unit": "ms", "crius": entry(&[3700.0, 3720.0, 3800.0]),
                    "containerd": entry(&[12000.0, 12400.0, 13000.0]), "ratio_containerd": 0.3,
                },
            },
        });
        std::fs::write(&results, serde_json::to_vec(&doc).unwrap()).unwrap();
        let written = plot(&results).unwrap();
        assert_eq!(
            written,
            [dir.path().join("ratios.svg"), dir.path().join("pulls.svg")]
        );
        let bars = std::fs::read_to_string(&written[0]).unwrap();
        assert!(bars.starts_with("<svg"), "{}", &bars[..100.min(bars.len())]);
        assert!(
            bars.contains("container create+start / containerd"),
            "{bars}"
        );
        let pulls_svg = std::fs::read_to_string(&written[1]).unwrap();
        assert!(pulls_svg.contains("crius") && pulls_svg.contains("containerd"));
        assert!(pulls_svg.contains("crio"), "{pulls_svg}");
        assert!(bars.contains("container create+start / crio"), "{bars}");

        let rows = ratios(&doc);
        // create+start against the three peers, the small pull against two, the large against one.
        assert_eq!(rows.len(), 6);
        let create = rows
            .iter()
            .find(|r| r.label == "container create+start / containerd")
            .unwrap();
        assert!((create.low - 6.0 / 62.0).abs() < 1e-9, "{}", create.low);
        assert!((create.high - 8.0 / 62.0).abs() < 1e-9, "{}", create.high);
        let crio = rows
            .iter()
            .find(|r| r.label == "cold pull small (1 MB) / crio")
            .unwrap();
        assert!((crio.ratio - 32.0 / 84.0).abs() < 1e-9, "{}", crio.ratio);
        assert!((crio.low - 30.0 / 84.0).abs() < 1e-9, "{}", crio.low);
        let points = pulls(&doc);
        assert_eq!(
            points.len(),
            5,
            "crius and containerd at two sizes, crio at one"
        );
        assert!(
            points
                .iter()
                .any(|p| (p.mb - 1024.0 * 1.048_576).abs() < 1e-6)
        );
        assert_eq!(
            size_mb("cold pull large (250 MB, 5 gzip layers)"),
            Some(250.0)
        );
        assert_eq!(size_mb("ExecSync `true`"), None);
    }

    #[test]
    fn a_missing_results_file_says_what_to_run() {
        let e = plot(Path::new("/nonexistent/results.json")).unwrap_err();
        assert!(
            format!("{e:#}").contains("run cargo xtask bench first"),
            "{e:#}"
        );
    }
}
