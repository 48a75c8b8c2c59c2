//! Reading manifests: the YAML stream split into documents, each decoded strictly into its
//! Kubernetes type (numbers where quantities go taken as strings; any field the type drops is
//! unknown), then checked against the schema and validated; duplicates across a file refused.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::Value;

use super::schema::supported;
use super::validate::{validate_meta, validate_pod};
use super::{Check, Loaded, ManifestError, Object, Problem, join};
use crate::frontend::yaml::{self, Doc};

/// Loads every object of a file.
pub fn load_file(path: &Path) -> Result<Vec<Loaded>, ManifestError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ManifestError::one(path, 0, "", format!("reading: {e}")))?;
    load_str(&text, path)
}

/// Loads every object of a YAML stream; `file` names it in errors.
pub fn load_str(text: &str, file: &Path) -> Result<Vec<Loaded>, ManifestError> {
    let docs = yaml::parse(text)
        .map_err(|e| ManifestError::one(file, e.line, "", format!("bad YAML: {}", e.message)))?;
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for doc in docs {
        if doc.value.is_null() {
            continue;
        }
        match load_doc(&doc, file) {
            Ok(l) => out.push(l),
            Err(mut p) => problems.append(&mut p),
        }
    }
    if !problems.is_empty() {
        return Err(ManifestError {
            file: file.to_path_buf(),
            problems,
        });
    }
    let mut seen = HashMap::new();
    for l in &out {
        let id = format!("{} {}", l.object.kind(), l.object.key());
        if let Some(line) = seen.insert(id.clone(), l.line) {
            return Err(ManifestError::one(
                file,
                l.line,
                "metadata.name",
                format!("{id} is defined twice (first at line {line})"),
            ));
        }
    }
    Ok(out)
}

fn load_doc(doc: &Doc, file: &Path) -> Result<Loaded, Vec<Problem>> {
    let mut c = Check {
        doc,
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let Value::Object(top) = &doc.value else {
        c.err("", "a manifest document must be a mapping");
        return Err(c.problems);
    };
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api.is_empty() {
        c.err("apiVersion", "is required");
    } else if api != "v1" {
        c.err(
            "apiVersion",
            format!("{api:?}: only v1 objects are supported"),
        );
    }
    if !matches!(kind, "Pod" | "Secret" | "ConfigMap") {
        c.err(
            "kind",
            if kind.is_empty() {
                "is required".to_string()
            } else {
                format!("{kind:?}: only Pod, Secret and ConfigMap are supported")
            },
        );
    }
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let mut value = doc.value.clone();
    quantities_as_strings(&mut value);
    let object = match kind {
        "Pod" => typed::<Pod>(&mut c, &value).map(|p| Object::Pod(Box::new(p))),
        "Secret" => typed::<Secret>(&mut c, &value).map(|s| Object::Secret(Box::new(s))),
        _ => typed::<ConfigMap>(&mut c, &value).map(|m| Object::ConfigMap(Box::new(m))),
    };
    let Some(object) = object else {
        return Err(c.problems);
    };
    supported(&mut c, &value, kind);
    match &object {
        Object::Pod(p) => validate_pod(&mut c, p),
        Object::Secret(s) => validate_meta(&mut c, &s.metadata, "Secret"),
        Object::ConfigMap(m) => validate_meta(&mut c, &m.metadata, "ConfigMap"),
    }
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        serde_json::to_vec(&doc.value).unwrap_or_default(),
    ));
    Ok(Loaded {
        object,
        file: file.to_path_buf(),
        line: doc.line,
        warnings: c.warnings,
        hash,
    })
}

/// Quantities written as numbers (`cpu: 1`) are strings to the typed API.
fn quantities_as_strings(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if matches!(
                    k.as_str(),
                    "limits" | "requests" | "overhead" | "sizeLimit" | "divisor"
                ) {
                    stringify_numbers(x);
                } else {
                    quantities_as_strings(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

fn stringify_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => *v = Value::String(n.to_string()),
        Value::Object(m) => m.values_mut().for_each(stringify_numbers),
        _ => {}
    }
}

/// Decodes into the Kubernetes type; then every field of the input the type dropped is unknown.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    c: &mut Check,
    value: &Value,
) -> Option<T> {
    let t: T = match serde_path_to_error::deserialize(value.clone()) {
        Ok(t) => t,
        Err(e) => {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            c.err(&path, e.inner().to_string());
            return None;
        }
    };
    let back = serde_json::to_value(&t).unwrap_or(Value::Null);
    unknown_fields(c, value, &back, "");
    c.problems.is_empty().then_some(t)
}

fn unknown_fields(c: &mut Check, input: &Value, typed: &Value, path: &str) {
    match (input, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = join(path, k);
                match b.get(k) {
                    Some(t) => unknown_fields(c, v, t, &p),
                    None if v.is_null() => {}
                    None => c.err(&p, "unknown field"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(c, x, y, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::manifest::testing::{load, problems};

    const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  restartPolicy: OnFailure
  nodeSelector:
    disk: ssd
  containers:
  - name: app
    image: busybox
    command: [sh, -c, 'echo hi']
    resources:
      limits: {cpu: 1, memory: 64Mi}
    ports:
    - {name: http, containerPort: 80}
    readinessProbe:
      httpGet: {port: http, path: /}
  volumes:
  - name: data
    emptyDir: {medium: Memory, sizeLimit: 1Mi}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: hunter2}
";

    #[test]
    fn a_good_pod_and_secret() {
        let objs = load(POD).unwrap();
        assert_eq!(objs.len(), 2);
        let Object::Pod(p) = &objs[0].object else {
            panic!("a pod first")
        };
        assert_eq!(objs[0].object.key(), "default/web");
        let limits = p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap();
        assert_eq!(limits["cpu"].0, "1");
        assert_eq!(objs[0].warnings.len(), 1, "{:?}", objs[0].warnings);
        assert!(objs[0].warnings[0].contains("spec.nodeSelector"));
        // What crius cannot honour is named too.
        let odd = POD
            .replace("memory: 64Mi}", "memory: 64Mi, ephemeral-storage: 1Gi}")
            .replace("containerPort: 80}", "containerPort: 80, hostPort: 8080}");
        let objs = load(&odd).unwrap();
        let w = &objs[0].warnings;
        assert!(
            w.iter()
                .any(|x| x.contains("resources.limits.ephemeral-storage: ignored")),
            "{w:?}"
        );
        // hostPort is honoured (through the node's CNI network's portmap): no warning.
        assert!(!w.iter().any(|x| x.contains("hostPort")), "{w:?}");
        assert_eq!(objs[1].line, 24, "the --- line");
        assert!(matches!(objs[1].object, Object::Secret(_)));
    }

    #[test]
    fn unknown_unsupported_and_invalid_fields_are_named() {
        let bad = POD
            .replace(
                "    image: busybox\n",
                "    image: busybox\n    imagee: x\n",
            )
            .replace(
                "  restartPolicy: OnFailure\n",
                "  restartPolicy: Sometimes\n",
            );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.starts_with("14:spec.containers[0].imagee:unknown field")),
            "{p:?}"
        );
        let bad = POD.replace(
            "  restartPolicy: OnFailure\n",
            "  restartPolicy: Sometimes\n",
        );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.starts_with("8:spec.restartPolicy:\"Sometimes\"")),
            "{p:?}"
        );
        let bad = POD.replace(
            "  restartPolicy: OnFailure\n",
            "  activeDeadlineSeconds: 0\n",
        );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("spec.activeDeadlineSeconds:must be greater than 0")),
            "{p:?}"
        );
        let bad = POD.replace("memory: 64Mi", "memory: lots");
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("resources.limits.memory") && x.contains("quantity")),
            "{p:?}"
        );
        let bad = POD.replace("port: http", "port: https");
        let p = problems(&bad);
        assert!(
            p.iter().any(|x| x.contains("readinessProbe.httpGet.port")),
            "{p:?}"
        );
        let bad = POD.replace("containerPort: 80", "containerPort: \"eighty\"");
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("containerPort") && x.contains("invalid type")),
            "{p:?}"
        );
        let bad = POD.replace("name: web\n  labels", "name: Web_1\n  labels");
        let p = problems(&bad);
        assert!(p.iter().any(|x| x.starts_with("4:metadata.name:")), "{p:?}");
        let e = load("kind: Pod\napiVersion: v1\nmetadata: {name: a\n").unwrap_err();
        assert!(e.to_string().starts_with("m.yaml:"), "{e}");
        assert!(e.to_string().contains("bad YAML"), "{e}");
        let e = load("apiVersion: apps/v1\nkind: Deployment\n").unwrap_err();
        assert_eq!(e.problems.len(), 2);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        /// Whatever is in a manifest file, loading it gives pods or errors, never a panic.
        #[test]
        fn any_text_never_panics(s in "[a-zA-Z0-9:{}\\[\\],\"' \n-]{0,400}") {
            let _ = super::load_str(&s, std::path::Path::new("pod.yaml"));
        }

        /// A pod manifest with arbitrary scalar values in its fields loads or is refused.
        #[test]
        fn odd_values_never_panic(name in "[ -~]{0,30}", image in "[ -~]{0,30}", cpu in "[ -~]{0,12}") {
            let text = format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name:?}\nspec:\n  containers:\n  - name: c\n    image: {image:?}\n    resources:\n      limits:\n        cpu: {cpu:?}\n"
            );
            let _ = super::load_str(&text, std::path::Path::new("pod.yaml"));
        }
    }
}
