//! `cds-secret-guard webhooks`: the webhook configurations, for a guard reachable at a
//! URL (outside the cluster, such as on the local control plane) or through a Service
//! (in the cluster: `manifests/base/webhooks.yaml` is this command's output). With
//! `--in-use-protection`, the validating configuration holds in-use protection's three
//! webhooks as well: one for opted-in namespaces, one for opted-in objects elsewhere
//! (both fail closed), and one for the objects held for a deferred delete, which carry
//! the guard's finalizer. That one ignores a guard that does not answer: the finalizer
//! keeps the object until the guard is back, so the delete need not fail.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::admissionregistration::v1::{
        MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
        ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
};

use crate::{
    Error, Result,
    cli::{WebhooksArgs, non_empty},
    rules::in_use::{FINALIZER, OPT_IN_LABEL, OPT_IN_VALUES, ROOT_CA},
};

/// Name of both configurations.
pub const CONFIGURATION_NAME: &str = "cds-secret-guard";

/// The two configurations, as a YAML stream for `kubectl apply -f -`.
pub fn render(args: &WebhooksArgs) -> Result<String> {
    let ca = match &args.ca_bundle {
        Some(path) => Some(std::fs::read(path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?),
        None => None,
    };
    let (validating, mutating) = configurations(args, ca)?;
    Ok(format!("{}---\n{}", to_yaml(&validating)?, to_yaml(&mutating)?))
}

/// The validating (secret DELETE) and mutating (pod CREATE) configurations.
pub fn configurations(
    args: &WebhooksArgs,
    ca_bundle: Option<Vec<u8>>,
) -> Result<(ValidatingWebhookConfiguration, MutatingWebhookConfiguration)> {
    let service = match &args.service {
        Some(service) => {
            let (namespace, name) = service
                .split_once('/')
                .filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty())
                .ok_or_else(|| Error::Usage(format!("--service {service:?} is not NAMESPACE/NAME")))?;
            Some((namespace.to_owned(), name.to_owned()))
        }
        None => None,
    };
    let base = args.url.as_deref().unwrap_or_default().trim_end_matches('/');
    let client = |path: &str| WebhookClientConfig {
        url: service.is_none().then(|| format!("{base}{path}")),
        service: service.as_ref().map(|(namespace, name)| ServiceReference {
            namespace: namespace.clone(),
            name: name.clone(),
            path: Some(path.to_owned()),
            port: Some(443),
        }),
        ca_bundle: ca_bundle.clone().map(ByteString),
    };
    let metadata = ObjectMeta {
        name: Some(CONFIGURATION_NAME.to_owned()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "cds-secret-guard".to_owned(),
        )])),
        ..Default::default()
    };
    let namespaces = namespace_selector(&args.guard_namespace, &non_empty(args.scope.namespaces.clone()));
    let mut secret_conditions = vec![MatchCondition {
        name: "protected-secret".to_owned(),
        expression: protected_secret_expression(&args.secrets.secret_prefixes, &args.secrets.worker_label),
    }];
    // Exempt requests never reach the guard: namespace deletion works while it is down.
    let (users, groups) = (
        non_empty(args.scope.exempt_users.clone()),
        non_empty(args.scope.exempt_groups.clone()),
    );
    let not_exempt = not_exempt_expression(&users, &groups).map(|expression| MatchCondition {
        name: "not-exempt".to_owned(),
        expression,
    });
    secret_conditions.extend(not_exempt.clone());

    let mut validating_webhooks = vec![ValidatingWebhook {
        name: "secret-deletes.cds-secret-guard.io".to_owned(),
        client_config: client("/validate"),
        rules: Some(vec![rule("DELETE", "secrets")]),
        failure_policy: Some("Fail".to_owned()),
        // A denial records an Event on the secret; a dry run records nothing.
        side_effects: "NoneOnDryRun".to_owned(),
        timeout_seconds: Some(args.timeout_seconds),
        admission_review_versions: vec!["v1".to_owned()],
        match_policy: Some("Equivalent".to_owned()),
        namespace_selector: Some(namespaces.clone()),
        match_conditions: Some(secret_conditions),
        ..Default::default()
    }];
    if args.in_use_protection {
        let condition = |name: &str, expression: String| MatchCondition {
            name: name.to_owned(),
            expression,
        };
        let mut not_held = vec![
            condition("not-root-ca", not_root_ca_expression()),
            condition("not-held", format!("!({})", held_expression())),
        ];
        not_held.extend(not_exempt.clone());
        let mut held = vec![condition("held", held_expression())];
        held.extend(not_exempt);
        let webhook =
            |name: &str, failure_policy: &str, namespace_selector, object_selector, conditions| ValidatingWebhook {
                name: name.to_owned(),
                client_config: client("/validate-in-use"),
                rules: Some(vec![rule("DELETE", "secrets"), rule("DELETE", "configmaps")]),
                failure_policy: Some(failure_policy.to_owned()),
                side_effects: "NoneOnDryRun".to_owned(),
                timeout_seconds: Some(args.timeout_seconds),
                admission_review_versions: vec!["v1".to_owned()],
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector),
                object_selector,
                match_conditions: Some(conditions),
            };
        let (namespaces_opted_in, objects_opted_in) = in_use_selectors(&namespaces);
        validating_webhooks.push(webhook(
            "in-use-namespaces.cds-secret-guard.io",
            "Fail",
            namespaces_opted_in,
            None,
            not_held.clone(),
        ));
        validating_webhooks.push(webhook(
            "in-use-objects.cds-secret-guard.io",
            "Fail",
            objects_opted_in,
            Some(opted_in()),
            not_held,
        ));
        // The finalizer holds the object while the guard is away: nothing fails.
        validating_webhooks.push(webhook(
            "in-use-deferred.cds-secret-guard.io",
            "Ignore",
            namespaces.clone(),
            None,
            held,
        ));
    }

    let validating = ValidatingWebhookConfiguration {
        metadata: metadata.clone(),
        webhooks: Some(validating_webhooks),
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
            // The mutation never blocks a pod; a slow answer must not slow pod creation.
            timeout_seconds: Some(MUTATION_TIMEOUT_SECONDS),
            admission_review_versions: vec!["v1".to_owned()],
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(namespaces),
            match_conditions: Some(vec![MatchCondition {
                name: "worker-pod".to_owned(),
                expression: worker_pod_expression(&args.secrets.secret_prefixes, &args.secrets.worker_label),
            }]),
            ..Default::default()
        }]),
    };
    Ok((validating, mutating))
}

/// Seconds the apiserver waits for the pod mutation (`serve --mutation-timeout` is below).
pub const MUTATION_TIMEOUT_SECONDS: i32 = 2;

/// The watched namespaces when given, else every namespace but kube-system and the
/// guard's own.
fn namespace_selector(guard_namespace: &str, namespaces: &[String]) -> LabelSelector {
    let (operator, values) = if namespaces.is_empty() {
        ("NotIn", vec!["kube-system".to_owned(), guard_namespace.to_owned()])
    } else {
        ("In", namespaces.to_vec())
    };
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".to_owned(),
            operator: operator.to_owned(),
            values: Some(values),
        }]),
        match_labels: None,
    }
}

/// The opt-in label's requirement: one of its values (`operator` In), or none (NotIn).
fn opt_in(operator: &str) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: OPT_IN_LABEL.to_owned(),
        operator: operator.to_owned(),
        values: Some(OPT_IN_VALUES.map(str::to_owned).to_vec()),
    }
}

/// The selector of what carries the opt-in label.
fn opted_in() -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![opt_in("In")]),
    }
}

/// The namespace selectors of in-use protection's two webhooks, within `namespaces` (the
/// guard's own selector): the opted-in namespaces, and the others, whose opted-in
/// objects alone are sent. No delete matches both.
fn in_use_selectors(namespaces: &LabelSelector) -> (LabelSelector, LabelSelector) {
    let within = namespaces.match_expressions.clone().unwrap_or_default();
    let mut opted_in = vec![opt_in("In")];
    opted_in.extend(within.clone());
    let opted_in_namespaces = LabelSelector {
        match_labels: None,
        match_expressions: Some(opted_in),
    };
    let mut others = vec![opt_in("NotIn")];
    others.extend(within);
    let other_namespaces = LabelSelector {
        match_labels: None,
        match_expressions: Some(others),
    };
    (opted_in_namespaces, other_namespaces)
}

/// CEL that leaves out `kube-root-ca.crt`, which every pod projects and
/// kube-controller-manager replaces. A deletecollection's per-item deletes name the
/// object only in `oldObject`.
pub fn not_root_ca_expression() -> String {
    let root_ca = quote(ROOT_CA);
    format!(
        "!(request.resource.resource == 'configmaps' && (request.name == {root_ca} \
         || (oldObject != null && oldObject.metadata.name == {root_ca})))"
    )
}

/// CEL true for an object that carries the guard's finalizer: its delete is deferred.
pub fn held_expression() -> String {
    format!(
        "oldObject != null && has(oldObject.metadata.finalizers) && {} in oldObject.metadata.finalizers",
        quote(FINALIZER)
    )
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

/// CEL that leaves out the exempt users and groups; `None` when nobody is exempt.
pub fn not_exempt_expression(users: &[String], groups: &[String]) -> Option<String> {
    let list = |items: &[String]| format!("[{}]", items.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", "));
    let mut terms = Vec::new();
    if !users.is_empty() {
        terms.push(format!("!(request.userInfo.username in {})", list(users)));
    }
    if !groups.is_empty() {
        terms.push(format!(
            "!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {}))",
            list(groups)
        ));
    }
    (!terms.is_empty()).then(|| terms.join(" && "))
}

/// CEL that sends the guard only the pods it may patch: those carrying the worker label
/// or referencing a protected secret by name, wherever the mutation looks.
pub fn worker_pod_expression(prefixes: &[String], worker_label: &str) -> String {
    let protected = |name: &str| {
        let tests: Vec<String> = prefixes
            .iter()
            .map(|prefix| format!("{name}.startsWith({})", quote(prefix)))
            .collect();
        format!("({})", tests.join(" || "))
    };
    let containers = |list: &str| {
        format!(
            "{list}.exists(c, (has(c.env) && c.env.exists(e, has(e.valueFrom) && has(e.valueFrom.secretKeyRef) \
             && has(e.valueFrom.secretKeyRef.name) && {})) || (has(c.envFrom) && c.envFrom.exists(f, \
             has(f.secretRef) && has(f.secretRef.name) && {})))",
            protected("e.valueFrom.secretKeyRef.name"),
            protected("f.secretRef.name"),
        )
    };
    [
        format!(
            "(has(object.metadata.labels) && {} in object.metadata.labels)",
            quote(worker_label)
        ),
        format!(
            "(has(object.spec.imagePullSecrets) && object.spec.imagePullSecrets.exists(s, has(s.name) && {}))",
            protected("s.name")
        ),
        format!(
            "(has(object.spec.volumes) && object.spec.volumes.exists(v, (has(v.secret) && has(v.secret.secretName) \
             && {}) || (has(v.projected) && has(v.projected.sources) && v.projected.sources.exists(p, \
             has(p.secret) && has(p.secret.name) && {}))))",
            protected("v.secret.secretName"),
            protected("p.secret.name"),
        ),
        containers("object.spec.containers"),
        format!(
            "(has(object.spec.initContainers) && {})",
            containers("object.spec.initContainers")
        ),
        format!(
            "(has(object.spec.ephemeralContainers) && {})",
            containers("object.spec.ephemeralContainers")
        ),
    ]
    .join(" || ")
}

/// A CEL string literal.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn to_yaml(value: &impl serde::Serialize) -> Result<String> {
    // k8s-openapi writes apiVersion and kind itself when it serialises a resource.
    serde_saphyr::to_string(value).map_err(|error| Error::Serialize(error.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(flags: &[&str]) -> WebhooksArgs {
        let cli = Cli::try_parse_from(["cds-secret-guard", "webhooks"].iter().chain(flags)).unwrap();
        let Command::Webhooks(args) = cli.command else {
            panic!("not webhooks")
        };
        args
    }

    /// A selector's matchExpressions.
    fn requirements(selector: &Option<LabelSelector>) -> &[LabelSelectorRequirement] {
        selector.as_ref().unwrap().match_expressions.as_deref().unwrap()
    }

    #[test]
    fn committed_manifest_is_the_generated_one() {
        let generated = render(&args(&["--service", "cds-secret-guard/cds-secret-guard"])).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base/webhooks.yaml");
        let committed = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            committed, generated,
            "regenerate it: cds-secret-guard webhooks --service cds-secret-guard/cds-secret-guard > {path}"
        );
    }

    #[test]
    fn secret_webhook_fails_closed_and_pod_webhook_never_blocks() {
        let (validating, mutating) =
            configurations(&args(&["--url", "https://127.0.0.1:8443/"]), Some(b"ca".to_vec())).unwrap();
        let secret = &validating.webhooks.unwrap()[0];
        assert_eq!(
            secret.client_config.url.as_deref(),
            Some("https://127.0.0.1:8443/validate")
        );
        assert_eq!(secret.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(secret.side_effects, "NoneOnDryRun");
        assert!(secret.timeout_seconds.is_some_and(|t| t <= 5));
        assert_eq!(secret.admission_review_versions, ["v1"]);
        let excluded = &requirements(&secret.namespace_selector)[0].values;
        assert_eq!(excluded.as_deref().unwrap(), ["kube-system", "cds-secret-guard"]);
        let pod = &mutating.webhooks.unwrap()[0];
        assert_eq!(pod.client_config.url.as_deref(), Some("https://127.0.0.1:8443/mutate"));
        assert_eq!(pod.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(pod.reinvocation_policy.as_deref(), Some("IfNeeded"));
    }

    #[test]
    fn exempt_requesters_and_other_pods_never_reach_the_guard() {
        let (validating, mutating) =
            configurations(&args(&["--url", "https://g", "--exempt-group", "ops"]), None).unwrap();
        let conditions = validating.webhooks.unwrap()[0].match_conditions.clone().unwrap();
        let exempt = conditions.iter().find(|c| c.name == "not-exempt").unwrap();
        assert_eq!(
            exempt.expression,
            "!(request.userInfo.username in ['system:serviceaccount:kube-system:namespace-controller']) \
             && !(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in ['ops']))"
        );
        let pod = &mutating.webhooks.unwrap()[0];
        assert!(pod.timeout_seconds.is_some_and(|t| t <= 2));
        let worker_pod = &pod.match_conditions.as_ref().unwrap()[0].expression;
        assert!(worker_pod.starts_with("(has(object.metadata.labels) && 'CDS_WORKER_NAME' in object.metadata.labels)"));
        for place in [
            "imagePullSecrets",
            "v.secret.secretName",
            "p.secret.name",
            "e.valueFrom.secretKeyRef.name",
            "f.secretRef.name",
            "initContainers",
            "ephemeralContainers",
        ] {
            assert!(worker_pod.contains(place), "{place} missing from {worker_pod}");
        }
    }

    #[test]
    fn in_use_protection_is_registered_only_when_asked_and_never_twice_for_one_delete() {
        let (validating, _) = configurations(&args(&["--url", "https://g"]), None).unwrap();
        assert_eq!(validating.webhooks.unwrap().len(), 1);

        let (validating, _) = configurations(&args(&["--url", "https://g", "--in-use-protection"]), None).unwrap();
        let webhooks = validating.webhooks.unwrap();
        let names: Vec<&str> = webhooks.iter().map(|webhook| webhook.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "secret-deletes.cds-secret-guard.io",
                "in-use-namespaces.cds-secret-guard.io",
                "in-use-objects.cds-secret-guard.io",
                "in-use-deferred.cds-secret-guard.io"
            ]
        );
        let (namespaces, objects, deferred) = (&webhooks[1], &webhooks[2], &webhooks[3]);
        for webhook in [namespaces, objects, deferred] {
            assert_eq!(webhook.client_config.url.as_deref(), Some("https://g/validate-in-use"));
            let failure_policy = if webhook == deferred { "Ignore" } else { "Fail" };
            assert_eq!(webhook.failure_policy.as_deref(), Some(failure_policy));
            assert_eq!(webhook.side_effects, "NoneOnDryRun");
            let resources: Vec<String> = webhook
                .rules
                .iter()
                .flatten()
                .flat_map(|rule| rule.resources.clone().unwrap_or_default())
                .collect();
            assert_eq!(resources, ["secrets", "configmaps"]);
            let conditions: Vec<&str> = webhook
                .match_conditions
                .iter()
                .flatten()
                .map(|condition| condition.name.as_str())
                .collect();
            let expected: &[&str] = if webhook == deferred {
                &["held", "not-exempt"]
            } else {
                &["not-root-ca", "not-held", "not-exempt"]
            };
            assert_eq!(conditions, expected);
            let name = requirements(&webhook.namespace_selector)
                .iter()
                .find(|requirement| requirement.key == "kubernetes.io/metadata.name")
                .unwrap();
            assert_eq!(name.operator, "NotIn");
            assert_eq!(name.values.as_deref().unwrap(), ["kube-system", "cds-secret-guard"]);
        }
        let values: Vec<String> = ["enabled", "defer", "refuse"].map(str::to_owned).to_vec();
        let opt_in = |operator: &str| LabelSelectorRequirement {
            key: OPT_IN_LABEL.to_owned(),
            operator: operator.to_owned(),
            values: Some(values.clone()),
        };
        // Opted-in namespaces, whatever their objects say...
        assert_eq!(requirements(&namespaces.namespace_selector)[0], opt_in("In"));
        assert_eq!(namespaces.object_selector, None);
        // ...and elsewhere, opted-in objects: a namespace NotIn the opt-in, never both.
        assert_eq!(requirements(&objects.namespace_selector)[0], opt_in("NotIn"));
        assert_eq!(requirements(&objects.object_selector), [opt_in("In")]);
        // Held objects, whichever webhook refused them before: the finalizer says it, and
        // no other webhook sees them.
        assert_eq!(deferred.object_selector, None);
        assert_eq!(
            requirements(&deferred.namespace_selector).len(),
            1,
            "the guard's scope only"
        );
        let held = &deferred.match_conditions.as_ref().unwrap()[0].expression;
        assert!(
            held.contains("'cds-secret-guard.io/in-use' in oldObject.metadata.finalizers"),
            "{held}"
        );
        for webhook in [namespaces, objects] {
            let not_held = &webhook.match_conditions.as_ref().unwrap()[1].expression;
            assert_eq!(*not_held, format!("!({held})"));
        }
    }

    #[test]
    fn in_use_protection_keeps_to_the_watched_namespaces() {
        let (validating, _) = configurations(
            &args(&["--url", "https://g", "--in-use-protection", "--namespace", "cds"]),
            None,
        )
        .unwrap();
        for webhook in &validating.webhooks.unwrap()[1..] {
            let name = requirements(&webhook.namespace_selector).last().unwrap();
            assert_eq!(
                (name.operator.as_str(), name.values.as_deref()),
                ("In", Some(&["cds".to_owned()][..]))
            );
        }
    }

    #[test]
    fn nobody_exempt_means_no_condition() {
        assert_eq!(not_exempt_expression(&[], &[]), None);
    }

    #[test]
    fn watched_namespaces_select_the_webhooks() {
        let (validating, mutating) = configurations(
            &args(&["--url", "https://g", "--namespace", "cds", "--namespace", "ci"]),
            None,
        )
        .unwrap();
        for selector in [
            validating.webhooks.unwrap()[0].namespace_selector.clone(),
            mutating.webhooks.unwrap()[0].namespace_selector.clone(),
        ] {
            let requirement = &requirements(&selector)[0];
            assert_eq!(requirement.operator, "In");
            assert_eq!(
                requirement.values.as_deref(),
                Some(&["cds".to_owned(), "ci".to_owned()][..])
            );
        }
    }

    #[test]
    fn match_condition_quotes_its_strings() {
        let expression = protected_secret_expression(&["it's-".to_owned()], "a\\b");
        assert!(expression.contains(r"startsWith('it\'s-')"), "{expression}");
        assert!(
            expression.contains(r"'a\\b' in oldObject.metadata.labels"),
            "{expression}"
        );
    }

    #[test]
    fn service_must_be_namespace_slash_name() {
        let error = configurations(&args(&["--service", "guard"]), None).unwrap_err();
        assert!(error.to_string().contains("NAMESPACE/NAME"), "{error}");
    }
}
