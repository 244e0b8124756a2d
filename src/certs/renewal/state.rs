//! Where the renewer keeps its state and what it writes: one Secret, and the caBundle of
//! every webhook of the two configurations. Every write replaces the object read, with
//! its resourceVersion: a concurrent writer (another replica) makes it fail with 409,
//! and the renewer reads again.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::{ByteString, api::core::v1::Secret, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};

use super::{
    pki::{self, KeyPem},
    plan::{self, Cert},
};
use crate::Result;

/// The annotation recording since when the webhooks have held the next CA.
pub const NEXT_PUBLISHED: &str = "cds-secret-guard.io/next-ca-published";

/// Keys of the state Secret's data.
const BUNDLE: &str = "ca.crt";
const SIGNING: (&str, &str) = ("signing-ca.crt", "signing-ca.key");
const NEXT: (&str, &str) = ("next-ca.crt", "next-ca.key");
const LEAF: (&str, &str) = ("tls.crt", "tls.key");

/// The renewer's state, as read from its Secret.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The CAs the webhooks should trust.
    pub bundle: Vec<Cert>,
    /// The CA signing leaves.
    pub signing: Option<KeyPem>,
    /// The CA waiting to sign.
    pub next: Option<KeyPem>,
    /// Since when the webhooks have held `next` (Unix seconds).
    pub next_published: Option<i64>,
    /// The serving certificate.
    pub leaf: Option<KeyPem>,
}

/// The two webhook configurations, read as they are (unknown fields included, so a
/// replace keeps what a newer apiserver added).
#[derive(Debug, Clone, Default)]
pub struct Webhooks {
    /// The configurations that exist.
    pub configurations: Vec<(Api<DynamicObject>, DynamicObject)>,
}

// === impl State ===

impl State {
    /// The state in `secret`; an entry that does not parse is treated as absent.
    pub fn from_secret(secret: &Secret) -> Self {
        let empty = BTreeMap::new();
        let data = secret.data.as_ref().unwrap_or(&empty);
        let text = |key: &str| {
            data.get(key)
                .and_then(|value| String::from_utf8(value.0.clone()).ok())
                .filter(|text| !text.trim().is_empty())
        };
        let pair = |(cert, key): (&str, &str)| {
            let pair = KeyPem {
                cert: text(cert)?,
                key: text(key)?,
            };
            pki::first_cert(&pair.cert).is_ok().then_some(pair)
        };
        let next_published = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(NEXT_PUBLISHED))
            .and_then(|time| time.parse::<Timestamp>().ok())
            .map(|time| time.as_second());
        let mut state = Self {
            bundle: text(BUNDLE).map(|pem| pki::bundle(pem.as_bytes())).unwrap_or_default(),
            signing: pair(SIGNING),
            next: pair(NEXT),
            next_published,
            leaf: pair(LEAF),
        };
        // The bundle always holds the CAs the state keeps.
        let kept = [&state.signing, &state.next].into_iter().flatten();
        plan::add_to_bundle(&mut state.bundle, kept.filter_map(|ca| pki::first_cert(&ca.cert).ok()));
        state
    }

    /// `secret` with this state as its data, keeping its metadata (resourceVersion
    /// included: the replace is conditional).
    pub fn into_secret(self, mut secret: Secret) -> Secret {
        let mut data = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            data.insert(key.to_owned(), ByteString(value.into_bytes()));
        };
        put(BUNDLE, pki::bundle_pem(&self.bundle));
        for (pair, (cert, key)) in [(self.signing, SIGNING), (self.next, NEXT), (self.leaf, LEAF)] {
            if let Some(pair) = pair {
                put(cert, pair.cert);
                put(key, pair.key);
            }
        }
        secret.data = Some(data);
        secret.string_data = None;
        let annotations = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
        match self.next_published.and_then(|time| Timestamp::from_second(time).ok()) {
            Some(time) => annotations.insert(NEXT_PUBLISHED.to_owned(), time.to_string()),
            None => annotations.remove(NEXT_PUBLISHED),
        };
        secret
    }
}

// === impl Webhooks ===

impl Webhooks {
    /// Reads both configurations named `name`; one that does not exist is left out.
    pub async fn read(client: &Client, name: &str) -> Result<Self> {
        let mut configurations = Vec::new();
        for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
            let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
            if let Some(object) = api.get_opt(name).await? {
                configurations.push((api, object));
            }
        }
        Ok(Self { configurations })
    }

    /// The CAs each webhook trusts.
    pub fn held(&self) -> Vec<Vec<Cert>> {
        self.configurations
            .iter()
            .flat_map(|(_, object)| webhooks(object))
            .map(|webhook| {
                let bundle = webhook
                    .pointer("/clientConfig/caBundle")
                    .and_then(|value| value.as_str())
                    .and_then(|encoded| base64::engine::general_purpose::STANDARD.decode(encoded).ok())
                    .unwrap_or_default();
                pki::bundle(&bundle)
            })
            .collect()
    }

    /// Writes `bundle` into every webhook whose caBundle differs, each configuration
    /// replaced with the resourceVersion it was read at.
    pub async fn publish(self, bundle: &[Cert]) -> Result<()> {
        let encoded = base64::engine::general_purpose::STANDARD.encode(pki::bundle_pem(bundle));
        for (api, mut object) in self.configurations {
            let Some(entries) = object.data.get_mut("webhooks").and_then(|value| value.as_array_mut()) else {
                continue;
            };
            for webhook in entries.iter_mut() {
                if let Some(client_config) = webhook.get_mut("clientConfig").and_then(|value| value.as_object_mut()) {
                    client_config.insert("caBundle".to_owned(), encoded.clone().into());
                }
            }
            let name = object.metadata.name.clone().unwrap_or_default();
            let params = PostParams {
                field_manager: Some(crate::FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            };
            api.replace(&name, &params, &object).await?;
        }
        Ok(())
    }
}

fn webhooks(object: &DynamicObject) -> impl Iterator<Item = &serde_json::Value> {
    object
        .data
        .get("webhooks")
        .and_then(|value| value.as_array())
        .into_iter()
        .flatten()
}
