//! Certificates that renew themselves (`--certificate-secret`): a CA and serving
//! certificates made by the guard, kept in one Secret, the CA published into the
//! webhooks' caBundle, rotated in the order that never breaks a call ([`plan`]).
//!
//! Every replica runs the renewer and serves from its reads: the newest leaf it has seen
//! that chains to the bundle every webhook holds, checked by rustls' verifier as the
//! apiserver will check it. Only the holder of the Lease (`--lease`) writes, as it alone
//! adopts: replicas of two chart versions during an upgrade (two validities) then never
//! take turns undoing each other's steps. Without a Lease every replica writes; each step
//! is a conditional write computed from what was just read, so they converge at the cost
//! of a 409 per step and replica. Renewal acts a few times per leaf lifetime, and a Lease
//! left by a dead holder passes on within its 15 s, far inside the settle times.

pub mod pki;
pub mod plan;
pub mod state;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream};
use k8s_openapi::{
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::PostParams,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use rustls::{crypto::CryptoProvider, sign::CertifiedKey};
use tokio_util::sync::CancellationToken;

use self::{
    pki::KeyPem,
    plan::{Cert, Facts, Leaf, Step, Timing},
    state::{State, Webhooks},
};
use crate::{Error, Result, certs::reload::CertStore, cluster::lease::Leadership, observe::metrics::Metrics};

/// The longest the renewer sleeps between two reads when nothing changes.
const IDLE: Duration = Duration::from_secs(60);

/// Leaves a replica remembers, to fall back on one the webhooks still trust.
const REMEMBERED: usize = 3;

/// What renewal needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Secret holding the state.
    pub secret: String,
    /// Its namespace; `None`: the client's default namespace (the pod's own).
    pub namespace: Option<String>,
    /// The name of both webhook configurations.
    pub webhook_configuration: String,
    /// DNS names and IP addresses of serving certificates; the first is the one checked.
    pub hosts: Vec<String>,
    /// Validity of a CA.
    pub ca_validity: Duration,
    /// Validity of a serving certificate.
    pub leaf_validity: Duration,
}

/// The renewer of one replica, and the certificate it serves.
pub struct Renewer {
    client: Client,
    settings: Settings,
    namespace: String,
    timing: Timing,
    certs: Arc<CertStore>,
    /// What `/readyz` requires: the served leaf chains to every webhook's bundle.
    trusted: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    provider: Arc<CryptoProvider>,
    /// Leaves seen in the state, newest last.
    remembered: Vec<Remembered>,
}

/// A leaf seen in the state, ready to serve.
struct Remembered {
    der: Vec<u8>,
    not_before: i64,
    not_after: i64,
    key: Arc<CertifiedKey>,
}

// === impl Settings ===

impl Settings {
    /// Checks the durations: a leaf renewed with a third of its life left must fit, with
    /// its successor, in the third of its CA's life left when the CA is replaced.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() {
            return Err(Error::Tls(
                "--certificate-host is required with --certificate-secret".to_owned(),
            ));
        }
        if self.leaf_validity.is_zero() || self.leaf_validity > self.ca_validity / 3 {
            return Err(Error::Tls(format!(
                "--leaf-validity ({}) must be positive and at most a third of --ca-validity ({})",
                humantime::format_duration(self.leaf_validity),
                humantime::format_duration(self.ca_validity)
            )));
        }
        Ok(())
    }

    /// The plan's timing.
    pub fn timing(&self) -> Timing {
        let seconds = |duration: Duration| i64::try_from(duration.as_secs()).unwrap_or(i64::MAX / 4);
        Timing::new(seconds(self.ca_validity), seconds(self.leaf_validity))
    }
}

// === impl Renewer ===

impl Renewer {
    /// A renewer writing through `client`, serving through `certs`.
    pub fn new(
        client: Client,
        settings: Settings,
        certs: Arc<CertStore>,
        trusted: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let namespace = settings
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        Self {
            client,
            timing: settings.timing(),
            settings,
            namespace,
            provider: certs.provider(),
            certs,
            trusted,
            metrics,
            remembered: Vec::new(),
        }
    }

    /// Reads, serves, and renews while `leadership` says so, until `shutdown`. It wakes
    /// on a change of the Secret or of either configuration (metadata watches of the one
    /// name each), of leadership, at the next deadline, or every minute.
    pub async fn run(mut self, mut leadership: Leadership, shutdown: CancellationToken) {
        let named =
            watcher::Config::default().fields(&format!("metadata.name={}", self.settings.webhook_configuration));
        let secret = watcher::Config::default().fields(&format!("metadata.name={}", self.settings.secret));
        let changes = stream::select_all([
            watcher(
                Api::<PartialObjectMeta<Secret>>::namespaced(self.client.clone(), &self.namespace),
                secret,
            )
            .default_backoff()
            .map(|_| ())
            .boxed(),
            watcher(
                Api::<PartialObjectMeta<ValidatingWebhookConfiguration>>::all(self.client.clone()),
                named.clone(),
            )
            .default_backoff()
            .map(|_| ())
            .boxed(),
            watcher(
                Api::<PartialObjectMeta<MutatingWebhookConfiguration>>::all(self.client.clone()),
                named,
            )
            .default_backoff()
            .map(|_| ())
            .boxed(),
        ]);
        tokio::pin!(changes);
        let mut failures = 0u32;
        loop {
            let wait = match self.round(leadership.is_leading()).await {
                Ok(None) => {
                    failures = 0;
                    continue;
                }
                Ok(Some(until)) => {
                    failures = 0;
                    Duration::from_secs(u64::try_from(until - now()).unwrap_or(0)).min(IDLE)
                }
                Err(error) => {
                    failures += 1;
                    let backoff = Duration::from_secs(1 << failures.min(5));
                    tracing::warn!(%error, ?backoff, "certificate renewal failed, retrying");
                    backoff
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                Some(()) = changes.next() => {}
                () = leadership.changed() => {}
            }
        }
    }

    /// One read and, when `acting`, at most one step: `Some(deadline)` when there is
    /// nothing to do before it, `None` when a step was taken (read again at once).
    async fn round(&mut self, acting: bool) -> Result<Option<i64>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets.get(&self.settings.secret).await?;
        let webhooks = Webhooks::read(&self.client, &self.settings.webhook_configuration).await?;
        let state = State::from_secret(&secret);
        let held = webhooks.held();
        self.serve(&state, &held);
        if !acting {
            return Ok(Some(i64::MAX));
        }

        let now = now();
        let facts = self.facts(&state, &held, now);
        let step = plan::plan(&facts, &self.timing);
        let mut state = state;
        match step {
            Step::Wait(until) => return Ok(Some(until)),
            Step::Publish => {
                tracing::info!(cas = state.bundle.len(), "publishing the CA bundle into the webhooks");
                webhooks.publish(&state.bundle).await?;
                return Ok(None);
            }
            Step::NewCa { signing, keep } => {
                let not_after = now + self.timing.ca_validity;
                let ca = pki::new_ca(&self.settings.webhook_configuration, now, not_after)?;
                tracing::info!(signing, kept = keep.len(), "new CA");
                plan::add_to_bundle(&mut state.bundle, keep.into_iter().chain([pki::first_cert(&ca.cert)?]));
                if signing {
                    state.signing = Some(ca);
                } else {
                    state.next = Some(ca);
                    state.next_published = None;
                }
            }
            Step::Prune(expired) => {
                tracing::info!(count = expired.len(), "expired CAs leave the bundle");
                state.bundle.retain(|cert| !expired.contains(cert));
            }
            Step::SignLeaf { not_after } => {
                let ca = state
                    .signing
                    .as_ref()
                    .ok_or_else(|| Error::Tls("no signing CA".to_owned()))?;
                state.leaf = Some(pki::sign_leaf(ca, &self.settings.hosts, now, not_after)?);
                tracing::info!(not_after = %timestamp(not_after), "new serving certificate");
            }
            Step::MarkPublished(since) => state.next_published = since,
            Step::Activate { not_after } => {
                let ca = state.next.take().ok_or_else(|| Error::Tls("no next CA".to_owned()))?;
                state.leaf = Some(pki::sign_leaf(&ca, &self.settings.hosts, now, not_after)?);
                state.signing = Some(ca);
                state.next_published = None;
                tracing::info!(leaf_not_after = %timestamp(not_after), "the next CA signs from now on");
            }
        }
        match secrets
            .replace(
                &self.settings.secret,
                &PostParams {
                    field_manager: Some(crate::FIELD_MANAGER.to_owned()),
                    ..PostParams::default()
                },
                &state.into_secret(secret),
            )
            .await
        {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!("certificate state changed under us, reading it again");
                Ok(None)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The plan's view of what was read.
    fn facts(&self, state: &State, held: &[Vec<Cert>], now: i64) -> Facts {
        let signing = state.signing.as_ref().and_then(|ca| pki::first_cert(&ca.cert).ok());
        let leaf = state.leaf.as_ref().and_then(|leaf| {
            let cert = pki::first_cert(&leaf.cert).ok()?;
            let sound = signing.as_ref().is_some_and(|ca| {
                pki::chains_to(
                    &cert.der,
                    std::slice::from_ref(ca),
                    &self.settings.hosts[0],
                    &self.provider,
                ) && pki::names_exactly(&cert.der, &self.settings.hosts)
                    && pki::certified_key(leaf, &self.provider).is_ok()
            });
            Some(Leaf {
                not_after: cert.not_after,
                sound,
            })
        });
        if let Some(ca) = &signing {
            self.metrics.ca_expiry(ca.not_after);
        }
        Facts {
            now,
            bundle: state.bundle.clone(),
            signing,
            next: state.next.as_ref().and_then(|ca| pki::first_cert(&ca.cert).ok()),
            next_published: state.next_published,
            leaf,
            held: held.to_vec(),
        }
    }

    /// Serves the newest leaf seen that chains to what every webhook holds (to the
    /// state's own bundle when no configuration exists). When none does, the one in
    /// service stays, and `/readyz` says so.
    fn serve(&mut self, state: &State, held: &[Vec<Cert>]) {
        if let Some(leaf) = &state.leaf {
            self.remember(leaf);
        }
        let own = [state.bundle.clone()];
        let bundles = if held.is_empty() { &own[..] } else { held };
        let host = &self.settings.hosts[0];
        let chains = |der: &[u8]| {
            bundles
                .iter()
                .all(|bundle| pki::chains_to(der, bundle, host, &self.provider))
        };
        let best = self
            .remembered
            .iter()
            .filter(|leaf| chains(&leaf.der))
            .max_by_key(|leaf| leaf.not_before);
        match best {
            Some(leaf) => {
                if self.certs.serve(leaf.key.clone(), leaf.not_after) {
                    self.metrics.certificate_expiry(leaf.not_after);
                    self.metrics.certificate_reload(true);
                    tracing::info!(not_after = %timestamp(leaf.not_after), "serving a new certificate");
                }
                self.trusted.store(true, Ordering::SeqCst);
            }
            None => {
                if self.trusted.swap(false, Ordering::SeqCst) || self.remembered.is_empty() {
                    tracing::warn!("no certificate that the webhooks trust; not ready");
                }
            }
        }
    }

    /// Keeps `leaf` among the remembered ones if it is new and its key matches.
    fn remember(&mut self, leaf: &KeyPem) {
        let Ok(cert) = pki::first_cert(&leaf.cert) else {
            return;
        };
        if self.remembered.iter().any(|known| known.der == cert.der) {
            return;
        }
        match (pki::certified_key(leaf, &self.provider), pki::not_before(&cert.der)) {
            (Ok(key), Ok(not_before)) => {
                self.remembered.push(Remembered {
                    der: cert.der,
                    not_before,
                    not_after: cert.not_after,
                    key: Arc::new(key),
                });
                if self.remembered.len() > REMEMBERED {
                    self.remembered.remove(0);
                }
            }
            (Err(error), _) | (_, Err(error)) => {
                self.metrics.certificate_reload(false);
                tracing::warn!(%error, "the state's serving certificate does not load, keeping the current one");
            }
        }
    }
}

fn now() -> i64 {
    Timestamp::now().as_second()
}

fn timestamp(unix: i64) -> String {
    Timestamp::from_second(unix).map_or_else(|_| unix.to_string(), |time| time.to_string())
}
