//! Manifests: Pods, Secrets and ConfigMaps from YAML (or JSON) files, `---`-separated, checked
//! the way the API server would before anything runs. Every error names the file, the line and
//! the field. Fields the Pod type does not have are errors (as with strict decoding); fields it
//! has but crius does not implement are errors too, except scheduling and API-server fields,
//! which mean nothing on one node and are named in warnings.
//!
//! `load` reads and decodes the documents, `schema` has the table of the fields crius implements
//! (and those it ignores), `validate` checks the values; this file has what they share.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

use super::yaml::Doc;

mod load;
mod schema;
mod validate;

pub use load::{load_file, load_str};
pub use validate::env_field_path;

/// A bad manifest: where and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.lines())]
pub struct ManifestError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: usize,
    pub field: String,
    pub reason: String,
}

impl ManifestError {
    fn lines(&self) -> String {
        self.problems
            .iter()
            .map(|p| {
                if p.field.is_empty() {
                    format!("{}:{}: {}", self.file.display(), p.line, p.reason)
                } else {
                    format!(
                        "{}:{}: {}: {}",
                        self.file.display(),
                        p.line,
                        p.field,
                        p.reason
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn one(file: &Path, line: usize, field: &str, reason: impl Into<String>) -> ManifestError {
        ManifestError {
            file: file.to_path_buf(),
            problems: vec![Problem {
                line,
                field: field.to_string(),
                reason: reason.into(),
            }],
        }
    }
}

/// One object of a manifest file.
#[derive(Debug, Clone)]
pub enum Object {
    Pod(Box<Pod>),
    Secret(Box<Secret>),
    ConfigMap(Box<ConfigMap>),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Pod(_) => "Pod",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
        }
    }

    /// `namespace/name`, the namespace defaulting to `default`.
    pub fn key(&self) -> String {
        let m = match self {
            Object::Pod(p) => &p.metadata,
            Object::Secret(s) => &s.metadata,
            Object::ConfigMap(c) => &c.metadata,
        };
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or("default"),
            m.name.as_deref().unwrap_or("")
        )
    }
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub object: Object,
    pub file: PathBuf,
    pub line: usize,
    /// Fields accepted but without meaning here, named.
    pub warnings: Vec<String>,
    /// A digest of the object as written, to tell a changed manifest.
    pub hash: String,
}

struct Check<'a> {
    doc: &'a Doc,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Check<'_> {
    fn err(&mut self, field: &str, reason: impl Into<String>) {
        self.problems.push(Problem {
            line: self.doc.line_of(field),
            field: field.to_string(),
            reason: reason.into(),
        });
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// For the submodules' tests: a manifest loaded, and its problems as `line:field:reason`.
#[cfg(test)]
mod testing {
    use super::*;

    pub(super) fn load(text: &str) -> Result<Vec<Loaded>, ManifestError> {
        load_str(text, Path::new("m.yaml"))
    }

    pub(super) fn problems(text: &str) -> Vec<String> {
        load(text)
            .unwrap_err()
            .problems
            .iter()
            .map(|p| format!("{}:{}:{}", p.line, p.field, p.reason))
            .collect()
    }
}
