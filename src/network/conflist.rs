//! CNI network lists as operators write them: the first `.conflist`, `.conf` or `.json` file of
//! the configuration directory in lexical order (as containerd and CRI-O pick it), a single
//! plugin's `.conf` taken as a list of one. Checked before use: a name, a version, plugins each
//! with a `type`; errors name the file.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A loaded network list: its file, name and version, and each plugin's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    pub file: PathBuf,
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
    /// The list asks runtimes not to run CHECK (`disableCheck`).
    pub disable_check: bool,
    /// When the file was last changed, to tell whether it must be read again.
    pub modified: Option<std::time::SystemTime>,
}

/// Why the configuration directory gives no usable network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("no network configuration in {dir} (a .conflist, .conf or .json file)")]
    None { dir: PathBuf },
    #[error("network configuration {file}: {reason}")]
    Invalid { file: PathBuf, reason: String },
}

fn invalid(file: &Path, reason: impl Into<String>) -> ConfError {
    ConfError::Invalid {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// The files that may hold a network, in the order they are considered.
pub fn candidates(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("conflist" | "conf" | "json")
                    ) && p.is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Loads the network of `dir`: its first file.
pub fn load(dir: &Path) -> Result<NetworkList, ConfError> {
    let file = candidates(dir)
        .into_iter()
        .next()
        .ok_or_else(|| ConfError::None {
            dir: dir.to_path_buf(),
        })?;
    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
    let text = std::fs::read(&file).map_err(|e| invalid(&file, e.to_string()))?;
    let mut list = parse(&file, &text)?;
    list.modified = modified;
    Ok(list)
}

/// Parses a `.conflist` (or a `.conf`, as a list of its one plugin).
pub fn parse(file: &Path, text: &[u8]) -> Result<NetworkList, ConfError> {
    if text.len() > 1 << 20 {
        return Err(invalid(file, "larger than 1 MiB"));
    }
    let v: Value =
        serde_json::from_slice(text).map_err(|e| invalid(file, format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| invalid(file, "not a JSON object"))?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid(file, "\"name\" is missing"))?
        .to_string();
    let cni_version = obj
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("0.2.0")
        .to_string();
    let plugins: Vec<Value> = match obj.get("plugins") {
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(invalid(file, "\"plugins\" is not a list")),
        // A single plugin's configuration.
        None if obj.contains_key("type") => vec![v.clone()],
        None => return Err(invalid(file, "neither \"plugins\" nor \"type\"")),
    };
    if plugins.is_empty() {
        return Err(invalid(file, "\"plugins\" is empty"));
    }
    for (i, p) in plugins.iter().enumerate() {
        let t = p.get("type").and_then(Value::as_str).unwrap_or("");
        // A type names a file in the plugin directories: no paths.
        if t.is_empty() || t.contains('/') || t == "." || t == ".." {
            return Err(invalid(
                file,
                format!("plugins[{i}].type {t:?} is not a plugin name"),
            ));
        }
    }
    Ok(NetworkList {
        file: file.to_path_buf(),
        name,
        cni_version,
        plugins,
        disable_check: obj.get("disableCheck").and_then(Value::as_bool) == Some(true),
        modified: None,
    })
}

impl NetworkList {
    /// The plugin types, in order.
    pub fn types(&self) -> Vec<String> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The list as stored with an attachment: exactly what ADD used, for the DEL that follows.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": self.plugins,
        })
    }

    /// Whether the list's version is at least `min` (major, minor, patch).
    /// Whether the list's plugins take CNI 1.1's STATUS and GC.
    pub fn has_status_and_gc(&self) -> bool {
        self.version_at_least((1, 1, 0))
    }

    pub fn version_at_least(&self, min: (u64, u64, u64)) -> bool {
        let mut parts = self
            .cni_version
            .split('.')
            .map(|p| p.parse::<u64>().unwrap_or(0));
        let v = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        v >= min
    }

    /// CHECK exists from CNI 0.4.0 on, and a list may turn it off.
    pub fn checks(&self) -> bool {
        self.version_at_least((0, 4, 0)) && !self.disable_check
    }

    /// DEL is given the ADD result from CNI 0.4.0 on (as libcni does).
    pub fn del_takes_result(&self) -> bool {
        self.version_at_least((0, 4, 0))
    }

    /// A stored list (see `to_json`) read back.
    pub fn from_json(v: &Value) -> Option<NetworkList> {
        Some(NetworkList {
            file: PathBuf::new(),
            name: v.get("name")?.as_str()?.to_string(),
            cni_version: v.get("cniVersion")?.as_str()?.to_string(),
            plugins: v.get("plugins")?.as_array()?.clone(),
            disable_check: v.get("disableCheck").and_then(Value::as_bool) == Some(true),
            modified: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default network hack/run.sh and the package install.
    #[test]
    fn default_network_list() {
        let text = include_str!("../../dist/cni/10-crius-bridge.conflist");
        let l = parse(Path::new("10-crius-bridge.conflist"), text.as_bytes()).unwrap();
        assert_eq!(l.types(), vec!["bridge", "portmap", "firewall"]);
        assert_eq!(l.cni_version, "1.0.0");
    }

    #[test]
    fn lists_confs_and_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        assert!(matches!(load(d), Err(ConfError::None { .. })));
        std::fs::write(
            d.join("20-single.conf"),
            r#"{"cniVersion":"0.4.0","name":"one","type":"bridge","bridge":"cni0"}"#,
        )
        .unwrap();
        let l = load(d).unwrap();
        assert_eq!(
            (l.name.as_str(), l.types()),
            ("one", vec!["bridge".to_string()])
        );
        std::fs::write(
            d.join("10-list.conflist"),
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .unwrap();
        std::fs::write(d.join("05-notes.txt"), "ignored").unwrap();
        let l = load(d).unwrap();
        assert_eq!(l.cni_version, "1.0.0");
        assert_eq!(l.types(), vec!["bridge", "portmap"]);
        assert_eq!(
            NetworkList::from_json(&l.to_json()).unwrap().types(),
            l.types()
        );
        for (text, want) in [
            ("{", "not valid JSON"),
            (r#"{"plugins":[]}"#, "\"name\""),
            (r#"{"name":"x","plugins":[]}"#, "empty"),
            (
                r#"{"name":"x","plugins":[{"type":"../../bin/sh"}]}"#,
                "not a plugin name",
            ),
            (r#"{"name":"x"}"#, "neither"),
        ] {
            let e = parse(Path::new("f.conflist"), text.as_bytes()).unwrap_err();
            assert!(e.to_string().contains(want), "{e} / {want}");
            assert!(e.to_string().contains("f.conflist"), "{e}");
        }
    }

    #[test]
    fn versions_decide_check_and_del_results() {
        let list = |v: &str, extra: &str| {
            parse(
                Path::new("x.conflist"),
                format!(
                    r#"{{"cniVersion":"{v}","name":"n"{extra},"plugins":[{{"type":"bridge"}}]}}"#
                )
                .as_bytes(),
            )
            .unwrap()
        };
        assert!(list("1.0.0", "").checks());
        assert!(list("0.4.0", "").checks());
        assert!(!list("0.3.1", "").checks());
        assert!(!list("1.0.0", r#","disableCheck":true"#).checks());
        assert!(!list("0.3.1", "").del_takes_result());
        assert!(list("1.1.0", "").del_takes_result());
        // The stored form keeps disableCheck.
        let stored = NetworkList::from_json(&list("1.0.0", r#","disableCheck":true"#).to_json());
        assert!(!stored.unwrap().checks());
    }
}
