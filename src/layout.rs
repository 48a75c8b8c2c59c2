//! Checks of the source tree's layout that the compiler does not make: CRI's generated types
//! stay at the edge (`cri`, and the CRI clients `cli` and `frontend`); everything below works
//! with crius's own types.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn cri_types_stay_at_the_edge() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edge = ["cri", "cli", "frontend", "main.rs", "layout.rs"];
    let mut found = Vec::new();
    for f in sources(&src) {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        if edge.contains(&top.as_ref()) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        if text.contains("k8s_cri") {
            found.push(rel.display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "CRI's generated types used below cri/ (convert them at the edge): {found:?}"
    );
}
