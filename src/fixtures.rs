//! Builders for unit tests: `worker_pod("w1").env_secret("cds-worker-config-w1").build()`.

use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, EnvVar, EnvVarSource, EphemeralContainer, LocalObjectReference, Pod, PodSpec,
    ProjectedVolumeSource, SecretEnvSource, SecretKeySelector, SecretProjection, SecretVolumeSource, Volume,
    VolumeProjection,
};

use crate::rules::{
    self,
    worker::{Settings, pod::WorkerPod},
};

/// The configuration of `serve`, as its default flags make it.
fn serve_defaults() -> crate::Config {
    use clap::Parser;
    let cli = crate::cli::Cli::parse_from(["cds-secret-guard", "serve"]);
    let crate::cli::Command::Serve(args) = cli.command else {
        unreachable!("parsed serve")
    };
    args.into_config()
}

/// The worker rules' settings of `serve` by default.
pub fn policy() -> Settings {
    serve_defaults().worker
}

/// The shared settings of `serve` by default.
pub fn shared() -> rules::Settings {
    serve_defaults().rules
}

/// A pod under construction.
pub struct PodBuilder(Pod);

/// A worker pod named `name` with one container and no labels.
pub fn worker_pod(name: &str) -> PodBuilder {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.namespace = Some("cds".to_owned());
    pod.spec = Some(PodSpec {
        containers: vec![Container {
            name: "worker".to_owned(),
            image: Some("worker".to_owned()),
            ..Default::default()
        }],
        ..Default::default()
    });
    PodBuilder(pod)
}

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status.get_or_insert_with(Default::default).phase = Some(phase.to_owned());
        self
    }

    pub fn without_labels(mut self) -> Self {
        self.0.metadata.labels = None;
        self
    }

    pub fn env_secret(mut self, secret: &str) -> Self {
        let var = secret_env_var(secret);
        self.spec().containers[0].env.get_or_insert_with(Vec::new).push(var);
        self
    }

    pub fn init_env_secret(mut self, secret: &str) -> Self {
        let container = Container {
            name: "init".to_owned(),
            env: Some(vec![secret_env_var(secret)]),
            ..Default::default()
        };
        self.spec().init_containers.get_or_insert_with(Vec::new).push(container);
        self
    }

    pub fn ephemeral_env_secret(mut self, secret: &str) -> Self {
        let container = EphemeralContainer {
            name: "debug".to_owned(),
            env: Some(vec![secret_env_var(secret)]),
            ..Default::default()
        };
        self.spec()
            .ephemeral_containers
            .get_or_insert_with(Vec::new)
            .push(container);
        self
    }

    pub fn env_from_secret(mut self, secret: &str) -> Self {
        let source = EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: secret.to_owned(),
                optional: None,
            }),
            ..Default::default()
        };
        self.spec().containers[0]
            .env_from
            .get_or_insert_with(Vec::new)
            .push(source);
        self
    }

    pub fn secret_volume(mut self, secret: &str) -> Self {
        let volume = Volume {
            name: "config".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.spec().volumes.get_or_insert_with(Vec::new).push(volume);
        self
    }

    pub fn projected_secret(mut self, secret: &str) -> Self {
        let projection = VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let volume = Volume {
            name: "projected".to_owned(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![projection]),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.spec().volumes.get_or_insert_with(Vec::new).push(volume);
        self
    }

    pub fn image_pull_secret(mut self, secret: &str) -> Self {
        self.spec()
            .image_pull_secrets
            .get_or_insert_with(Vec::new)
            .push(LocalObjectReference {
                name: secret.to_owned(),
            });
        self
    }

    /// The pod as the guard reads it from the apiserver's JSON.
    pub fn build(self) -> WorkerPod {
        let json = serde_json::to_value(&self.0).expect("a pod serialises");
        serde_json::from_value(json).expect("a pod reads as a worker pod")
    }
}

fn secret_env_var(secret: &str) -> EnvVar {
    EnvVar {
        name: "CDS_CONFIG".to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: "config".to_owned(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
