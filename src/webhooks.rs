//! `cds-secret-guard webhooks`: the webhook configurations for a guard reachable at a
//! URL (a guard outside the cluster, such as on the local control plane). The in-cluster
//! install in `manifests/` registers the same webhooks through a Service.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
        ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
};

use crate::{Error, Result, cli::WebhooksArgs};

/// Name of both configurations.
pub const CONFIGURATION_NAME: &str = "cds-secret-guard";

/// The two configurations, as a YAML stream for `kubectl apply -f -`.
pub fn render(args: &WebhooksArgs) -> Result<String> {
    let ca = std::fs::read(&args.ca_bundle).map_err(|source| Error::Io {
        path: args.ca_bundle.clone(),
        source,
    })?;
    let (validating, mutating) = configurations(args, ca);
    Ok(format!("{}---\n{}", to_yaml(&validating)?, to_yaml(&mutating)?))
}

/// The validating (secret DELETE) and mutating (pod CREATE) configurations.
pub fn configurations(
    args: &WebhooksArgs,
    ca_bundle: Vec<u8>,
) -> (ValidatingWebhookConfiguration, MutatingWebhookConfiguration) {
    let base = args.url.trim_end_matches('/');
    let client = |path: &str| WebhookClientConfig {
        url: Some(format!("{base}{path}")),
        ca_bundle: Some(ByteString(ca_bundle.clone())),
        service: None,
    };
    let metadata = ObjectMeta {
        name: Some(CONFIGURATION_NAME.to_owned()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "cds-secret-guard".to_owned(),
        )])),
        ..Default::default()
    };
    let namespaces = namespace_selector(&args.guard_namespace);

    let validating = ValidatingWebhookConfiguration {
        metadata: metadata.clone(),
        webhooks: Some(vec![ValidatingWebhook {
            name: "secret-deletes.cds-secret-guard.io".to_owned(),
            client_config: client("/validate"),
            rules: Some(vec![rule("DELETE", "secrets")]),
            failure_policy: Some("Fail".to_owned()),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(args.timeout_seconds),
            admission_review_versions: vec!["v1".to_owned()],
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(namespaces.clone()),
            match_conditions: Some(vec![MatchCondition {
                name: "protected-secret".to_owned(),
                expression: protected_secret_expression(&args.secret_prefixes, &args.worker_label),
            }]),
            ..Default::default()
        }]),
    };
    let mutating = MutatingWebhookConfiguration {
        metadata,
        webhooks: Some(vec![MutatingWebhook {
            name: "worker-pods.cds-secret-guard.io".to_owned(),
            client_config: client("/mutate"),
            rules: Some(vec![rule("CREATE", "pods")]),
            failure_policy: Some("Ignore".to_owned()),
            reinvocation_policy: Some("IfNeeded".to_owned()),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(args.timeout_seconds),
            admission_review_versions: vec!["v1".to_owned()],
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(namespaces),
            ..Default::default()
        }]),
    };
    (validating, mutating)
}

/// Leaves out kube-system and the guard's own namespace.
fn namespace_selector(guard_namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(vec!["kube-system".to_owned(), guard_namespace.to_owned()]),
        }]),
        match_labels: None,
    }
}

fn rule(operation: &str, resource: &str) -> RuleWithOperations {
    RuleWithOperations {
        operations: Some(vec![operation.to_owned()]),
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        scope: Some("Namespaced".to_owned()),
    }
}

/// CEL that sends only protected secrets to the guard: a protected name prefix or the
/// worker label. A delete without `oldObject` is sent too, and the guard reads the secret.
pub fn protected_secret_expression(prefixes: &[String], worker_label: &str) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut terms = vec!["oldObject == null".to_owned()];
    terms.extend(
        prefixes
            .iter()
            .map(|prefix| format!("oldObject.metadata.name.startsWith({})", quote(prefix))),
    );
    terms.push(format!(
        "(has(oldObject.metadata.labels) && {} in oldObject.metadata.labels)",
        quote(worker_label)
    ));
    terms.join(" || ")
}

fn to_yaml(value: &impl serde::Serialize) -> Result<String> {
    // k8s-openapi writes apiVersion and kind itself when it serialises a resource.
    serde_saphyr::to_string(value).map_err(|error| Error::Serialize(error.to_string()))
}
