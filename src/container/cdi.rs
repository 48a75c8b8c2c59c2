//! The CDI devices a container asks for (`cdi_devices`, then the `cdi.k8s.io/` annotations by
//! key, each value a comma-separated list), injected into its OCI spec through `crate::cdi`.
//! Every failure is InvalidArgument naming the request's field, the device and, where there is
//! one, the spec file.

use oci_spec::runtime::Spec;

use super::config::ContainerConfig;
use super::{Error, invalid};
use crate::cdi::Registry;

const ANNOTATION: &str = "cdi.k8s.io/";

/// Each requested device with the request field that named it, in request order.
pub fn requested(config: &ContainerConfig) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = config
        .cdi_devices
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("config.cdi_devices[{i}].name"), d.name.clone()))
        .collect();
    let mut keys: Vec<&String> = config
        .annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION))
        .collect();
    keys.sort();
    for k in keys {
        for name in config.annotations[k].split(',') {
            out.push((format!("config.annotations[{k}]"), name.to_string()));
        }
    }
    out
}

/// Applies the requested devices' edits to the spec; nothing when none is asked for.
pub fn inject(
    registry: Option<&Registry>,
    config: &ContainerConfig,
    oci: &mut Spec,
) -> Result<(), Error> {
    let wanted = requested(config);
    let Some((first_field, _)) = wanted.first() else {
        return Ok(());
    };
    let Some(registry) = registry else {
        return Err(invalid(
            first_field.clone(),
            "CDI is turned off on this node ([cdi] enable = false)",
        ));
    };
    let names: Vec<String> = wanted.iter().map(|(_, n)| n.clone()).collect();
    registry.inject(oci, &names).map_err(|e| {
        let field = wanted
            .iter()
            .find(|(_, n)| n == e.device())
            .map_or(first_field.clone(), |(f, _)| f.clone());
        invalid(field, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::config::CdiDevice;

    #[test]
    fn requests_in_order_with_their_fields() {
        let c = ContainerConfig {
            cdi_devices: vec![CdiDevice {
                name: "v.com/gpu=0".into(),
            }],
            annotations: [
                (
                    "cdi.k8s.io/b".to_string(),
                    "v.com/nic=1,v.com/nic=2".to_string(),
                ),
                ("cdi.k8s.io/a".to_string(), "v.com/fpga=0".to_string()),
                ("other".to_string(), "v.com/x=0".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let got = requested(&c);
        let names: Vec<&str> = got.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            ["v.com/gpu=0", "v.com/fpga=0", "v.com/nic=1", "v.com/nic=2"]
        );
        assert_eq!(got[3].0, "config.annotations[cdi.k8s.io/b]");
        let mut oci = Spec::default();
        let e = inject(None, &c, &mut oci).unwrap_err();
        assert!(e.to_string().contains("cdi_devices[0]"), "{e}");
        let r = Registry::new(vec!["/nonexistent-cdi".into()]);
        let e = inject(Some(&r), &c, &mut oci).unwrap_err().to_string();
        assert!(
            e.starts_with("config.cdi_devices[0].name: unknown CDI device"),
            "{e}"
        );
        inject(Some(&r), &ContainerConfig::default(), &mut oci).unwrap();
    }
}
