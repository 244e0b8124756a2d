//! The Secrets and ConfigMaps a pod names: what in-use protection counts as a use.
//!
//! They are enumerated as Kubernetes' own `VisitPodSecretNames` and
//! `VisitPodConfigmapNames` (`pkg/api/v1/pod/util.go`) do: imagePullSecrets; `env`
//! `valueFrom` and `envFrom` in init, regular and ephemeral containers; secret, configMap
//! and projected volumes; CSI inline `nodePublishSecretRef`; the in-tree volume plugins'
//! secret references. Like them, a pod's PVC → PV → secret chain is not followed, and
//! empty names are skipped.

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, EphemeralContainer, PodSpec, Volume};

/// The kind of object a pod names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A core/v1 Secret.
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

impl Kind {
    /// The kind as the API names it: `Secret`, `ConfigMap`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
        }
    }

    /// The kind the API calls `kind`, if it is one of these.
    pub fn of(kind: &str) -> Option<Self> {
        match kind {
            "Secret" => Some(Self::Secret),
            "ConfigMap" => Some(Self::ConfigMap),
            _ => None,
        }
    }
}

/// One name a pod's spec gives to a Secret or ConfigMap of its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference<'a> {
    /// What it names.
    pub kind: Kind,
    /// The object's name.
    pub name: &'a str,
    /// `optional: true`: the kubelet starts the pod without the object.
    pub optional: bool,
}

/// Calls `visit` with every Secret and ConfigMap `spec` names, each kind in Kubernetes'
/// order: imagePullSecrets, then the containers (init, regular, ephemeral; `envFrom`
/// before `env`), then the volumes.
pub fn visit<'a>(spec: &'a PodSpec, mut visit: impl FnMut(Reference<'a>)) {
    let mut named = |kind, name: &'a str, optional: Option<bool>| {
        if !name.is_empty() {
            visit(Reference {
                kind,
                name,
                optional: optional.unwrap_or(false),
            });
        }
    };
    for pull in spec.image_pull_secrets.iter().flatten() {
        named(Kind::Secret, &pull.name, None);
    }
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers);
    let environments = containers.map(|Container { env, env_from, .. }| (env, env_from)).chain(
        spec.ephemeral_containers
            .iter()
            .flatten()
            .map(|EphemeralContainer { env, env_from, .. }| (env, env_from)),
    );
    for (env, env_from) in environments {
        for EnvFromSource {
            config_map_ref,
            secret_ref,
            ..
        } in env_from.iter().flatten()
        {
            if let Some(source) = secret_ref {
                named(Kind::Secret, &source.name, source.optional);
            }
            if let Some(source) = config_map_ref {
                named(Kind::ConfigMap, &source.name, source.optional);
            }
        }
        for EnvVar { value_from, .. } in env.iter().flatten() {
            let Some(source) = value_from else { continue };
            if let Some(selector) = &source.secret_key_ref {
                named(Kind::Secret, &selector.name, selector.optional);
            }
            if let Some(selector) = &source.config_map_key_ref {
                named(Kind::ConfigMap, &selector.name, selector.optional);
            }
        }
    }
    for volume in spec.volumes.iter().flatten() {
        volume_references(volume, &mut named);
    }
}

/// The names one volume gives (the apiserver admits one source per volume).
fn volume_references<'a>(volume: &'a Volume, named: &mut impl FnMut(Kind, &'a str, Option<bool>)) {
    let secret_ref = |reference: Option<&'a k8s_openapi::api::core::v1::LocalObjectReference>| {
        reference.map(|reference| reference.name.as_str())
    };
    // The in-tree plugins' secrets, then the kinds with an `optional`.
    let plugin_secret = if let Some(source) = &volume.azure_file {
        Some(source.secret_name.as_str())
    } else if let Some(source) = &volume.cephfs {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.cinder {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.flex_volume {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.rbd {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.scale_io {
        Some(source.secret_ref.name.as_str())
    } else if let Some(source) = &volume.iscsi {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.storageos {
        secret_ref(source.secret_ref.as_ref())
    } else if let Some(source) = &volume.csi {
        secret_ref(source.node_publish_secret_ref.as_ref())
    } else {
        None
    };
    if let Some(name) = plugin_secret {
        named(Kind::Secret, name, None);
    }
    if let Some(source) = &volume.secret {
        named(
            Kind::Secret,
            source.secret_name.as_deref().unwrap_or_default(),
            source.optional,
        );
    }
    if let Some(source) = &volume.config_map {
        named(Kind::ConfigMap, &source.name, source.optional);
    }
    for projection in volume
        .projected
        .iter()
        .flat_map(|projected| projected.sources.iter().flatten())
    {
        if let Some(source) = &projection.secret {
            named(Kind::Secret, &source.name, source.optional);
        }
        if let Some(source) = &projection.config_map {
            named(Kind::ConfigMap, &source.name, source.optional);
        }
    }
}

/// Whether `spec` cannot start without the `kind` named `name`: a reference to it that is
/// not optional.
pub fn needs(spec: &PodSpec, kind: Kind, name: &str) -> bool {
    let mut needed = false;
    visit(spec, |reference| {
        needed |= reference.kind == kind && reference.name == name && !reference.optional;
    });
    needed
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A spec naming objects in every way Kubernetes counts, and a few it does not.
    fn spec() -> PodSpec {
        serde_json::from_value(json!({
            "imagePullSecrets": [{"name": "pull"}, {"name": ""}],
            "initContainers": [{
                "name": "init",
                "envFrom": [{"configMapRef": {"name": "init-env"}}],
            }],
            "containers": [{
                "name": "main",
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "env-config", "key": "k", "optional": true}}},
                    {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "D", "value": "not-a-reference"},
                ],
                "envFrom": [{"secretRef": {"name": "env-from-secret"}, "prefix": "X_"}],
            }],
            "ephemeralContainers": [{
                "name": "debug",
                "envFrom": [{"secretRef": {"name": "debug-secret"}}],
            }],
            "volumes": [
                {"name": "s", "secret": {"secretName": "volume-secret"}},
                {"name": "c", "configMap": {"name": "volume-config", "optional": false}},
                {"name": "p", "projected": {"sources": [
                    {"secret": {"name": "projected-secret", "optional": true}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"serviceAccountToken": {"path": "token"}},
                ]}},
                {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}},
                {"name": "rbd", "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "rbd-secret"}}},
                {"name": "azure", "azureFile": {"secretName": "azure-secret", "shareName": "share"}},
                {"name": "empty", "emptyDir": {}},
                {"name": "pvc", "persistentVolumeClaim": {"claimName": "claim"}},
            ],
        }))
        .unwrap()
    }

    fn all(spec: &PodSpec) -> Vec<(Kind, &str, bool)> {
        let mut found = Vec::new();
        visit(spec, |reference| {
            found.push((reference.kind, reference.name, reference.optional))
        });
        found
    }

    #[test]
    fn every_reference_kubernetes_counts_is_visited_in_its_order() {
        use Kind::{ConfigMap, Secret};
        let spec = spec();
        assert_eq!(
            all(&spec),
            vec![
                (Secret, "pull", false),
                (ConfigMap, "init-env", false),
                (Secret, "env-from-secret", false),
                (Secret, "env-secret", false),
                (ConfigMap, "env-config", true),
                (Secret, "debug-secret", false),
                (Secret, "volume-secret", false),
                (ConfigMap, "volume-config", false),
                (Secret, "projected-secret", true),
                (ConfigMap, "kube-root-ca.crt", false),
                (Secret, "csi-secret", false),
                (Secret, "rbd-secret", false),
                (Secret, "azure-secret", false),
            ]
        );
    }

    #[test]
    fn a_pod_needs_what_it_names_without_optional() {
        let spec = spec();
        assert!(needs(&spec, Kind::Secret, "env-secret"));
        assert!(needs(&spec, Kind::Secret, "debug-secret"), "ephemeral containers count");
        assert!(needs(&spec, Kind::Secret, "csi-secret"));
        assert!(needs(&spec, Kind::ConfigMap, "init-env"), "init containers count");
        assert!(!needs(&spec, Kind::ConfigMap, "env-config"), "optional");
        assert!(!needs(&spec, Kind::Secret, "projected-secret"), "optional");
        assert!(!needs(&spec, Kind::ConfigMap, "env-secret"), "another kind");
        assert!(
            !needs(&spec, Kind::Secret, "claim"),
            "PVC → PV → secret is not followed"
        );
        assert!(!needs(&spec, Kind::Secret, ""), "empty names are skipped");
    }

    #[test]
    fn an_empty_spec_names_nothing() {
        assert!(all(&PodSpec::default()).is_empty());
    }
}
