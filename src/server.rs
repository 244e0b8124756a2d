//! The servers: admission over TLS (`/validate`, `/mutate`) and plain-HTTP probes and
//! metrics (`/healthz`, `/readyz`, `/metrics`). Handlers stay thin: they decode, call
//! the policy or the mutation, audit and count.

use std::{
    future::IntoFuture,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{DefaultBodyLimit, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use k8s_openapi::{
    api::core::v1::{Pod, Secret},
    jiff::Timestamp,
};
use kube::core::{
    DynamicObject, PartialObjectMeta,
    admission::{AdmissionRequest, AdmissionResponse, Operation},
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, instrument};

use crate::{
    Config, Error, Result,
    admission::{Review, is_for, reply},
    audit::{self, Requester},
    config::{Mode, PolicyConfig},
    lookup::{ClusterLookup, KubeLookup, Metered, Unavailable},
    metrics::Metrics,
    mutation,
    owner_refs::Reconciler,
    policy::{self, SecretDelete, Verdict},
    tls::CertStore,
};

/// Largest request body accepted: an UPDATE review of a 1 MiB secret holds it twice, in
/// base64, plus managedFields; 8 MiB leaves room. Larger bodies get a 413.
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every handler shares; cheap handles only.
pub struct AppState {
    policy: PolicyConfig,
    lookup: Arc<dyn ClusterLookup>,
    metrics: Arc<Metrics>,
    request_timeout: Duration,
}

/// The guard's server.
pub struct Server {
    config: Config,
    state: Arc<AppState>,
    ready: Arc<AtomicBool>,
    reconciler: Option<Arc<Reconciler>>,
}

/// A server whose sockets are bound, ready to serve.
pub struct Bound {
    server: Server,
    admission: TcpListener,
    probes: TcpListener,
    certs: Arc<CertStore>,
}

// === impl Server ===

impl Server {
    /// Builds the server with a Kubernetes client from the standard places (`KUBECONFIG`,
    /// in-cluster). Without any configuration it still starts, and fails closed.
    pub async fn from_config(config: Config) -> Self {
        match kube::Client::try_default().await {
            Ok(client) => Self::new(config, Arc::new(KubeLookup::new(client.clone()))).with_reconciler(client),
            Err(error) => {
                tracing::error!(%error, "no Kubernetes client: every worker-secret delete will be denied");
                Self::new(config, Arc::new(Unavailable(error.to_string())))
            }
        }
    }

    /// Also runs the ownerReference reconciler, through `client`.
    pub fn with_reconciler(mut self, client: kube::Client) -> Self {
        self.reconciler = Some(Reconciler::new(
            client,
            self.config.policy.clone(),
            self.state.metrics.clone(),
        ));
        self
    }

    /// Builds the server with the given cluster reads (tests pass a fake).
    pub fn new(config: Config, lookup: Arc<dyn ClusterLookup>) -> Self {
        let metrics = Arc::new(Metrics::default());
        let state = Arc::new(AppState {
            policy: config.policy.clone(),
            lookup: Arc::new(Metered::new(lookup, metrics.clone())),
            metrics,
            request_timeout: config.request_timeout,
        });
        Self {
            config,
            state,
            ready: Arc::new(AtomicBool::new(false)),
            reconciler: None,
        }
    }

    /// The admission routes, without TLS.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/validate", post(validate))
            .route("/mutate", post(mutate))
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(self.state.clone())
    }

    /// The probe and metrics routes.
    pub fn probe_router(&self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self.ready.clone())
            .merge(
                Router::new()
                    .route("/metrics", get(metrics))
                    .with_state(self.state.metrics.clone()),
            )
    }

    /// Loads the certificate (a bad pair fails here) and binds both sockets.
    pub async fn bind(self) -> Result<Bound> {
        let certs = CertStore::load(&self.config.tls_cert, &self.config.tls_key)?;
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })
        };
        let admission = bind(self.config.listen).await?;
        let probes = bind(self.config.probe_listen).await?;
        Ok(Bound {
            server: self,
            admission,
            probes,
            certs,
        })
    }
}

// === impl Bound ===

impl Bound {
    /// The admission (TLS) address.
    pub fn admission_addr(&self) -> SocketAddr {
        self.admission.local_addr().unwrap_or(self.server.config.listen)
    }

    /// The probe address.
    pub fn probe_addr(&self) -> SocketAddr {
        self.probes.local_addr().unwrap_or(self.server.config.probe_listen)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting and lets the requests
    /// in flight finish (up to the shutdown timeout).
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let Self {
            server,
            admission,
            probes,
            certs,
        } = self;
        let acceptor = TlsAcceptor::from(Arc::new(certs.server_config()?));
        tokio::spawn(certs.watch(
            server.config.tls_reload_interval,
            server.state.metrics.clone(),
            shutdown.clone(),
        ));

        if let Some(reconciler) = server.reconciler.clone() {
            tokio::spawn(reconciler.run(shutdown.clone()));
        }
        // The probes outlive the admission server: /readyz says 503 while requests drain.
        let probes_done = CancellationToken::new();
        let probe_router = server.probe_router();
        let probe_task = tokio::spawn(
            axum::serve(probes, probe_router)
                .with_graceful_shutdown(probes_done.clone().cancelled_owned())
                .into_future(),
        );

        if let Ok(addr) = admission.local_addr() {
            tracing::info!(%addr, "serving admission");
        }
        server.ready.store(true, Ordering::SeqCst);
        let graceful = GracefulShutdown::new();
        let router = server.router();
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = admission.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        continue;
                    }
                },
                () = shutdown.cancelled() => break,
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                };
                let builder = auto::Builder::new(TokioExecutor::new());
                let connection = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(error) = watcher.watch(connection).await {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
            });
        }

        // Stop accepting, tell the probes we are going, and finish what is in flight.
        server.ready.store(false, Ordering::SeqCst);
        drop(admission);
        tracing::info!("shutting down: finishing requests in flight");
        if tokio::time::timeout(server.config.shutdown_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after the shutdown timeout");
        }
        probes_done.cancel();
        match probe_task.await {
            Ok(result) => result.map_err(|source| Error::Bind {
                addr: server.config.probe_listen,
                source,
            }),
            Err(error) => Err(Error::Tls(format!("probe server task: {error}"))),
        }
    }
}

// === handlers ===

async fn readyz(State(ready): State<Arc<AtomicBool>>) -> Response {
    if ready.load(Ordering::SeqCst) {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.encode() {
        Ok(text) => (
            [(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Secret deletes. The request is decoded as metadata only: secret data is never parsed.
#[instrument(skip_all, fields(uid, operation, namespace, object, allowed, reason))]
async fn validate(State(state): State<Arc<AppState>>, Review(request): Review<PartialObjectMeta<Secret>>) -> Response {
    let _timer = state.metrics.time_admission("validate");
    record_request(&request);
    let response = if is_for(&request, "Secret", Operation::Delete) {
        let decision = tokio::time::timeout(state.request_timeout, validate_delete(&state, &request));
        match decision.in_current_span().await {
            Ok(response) => response,
            Err(_) => deadline_passed(&state, &request),
        }
    } else {
        tracing::debug!(kind = %request.kind.kind, "not a secret delete, allowed untouched");
        AdmissionResponse::from(&request)
    };
    Span::current().record("allowed", response.allowed);
    reply(response)
}

async fn validate_delete(state: &AppState, request: &AdmissionRequest<PartialObjectMeta<Secret>>) -> AdmissionResponse {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let delete = SecretDelete {
        namespace,
        name: secret_name(request),
        secret: request.old_object.as_ref().map(|secret| &secret.metadata),
        username: request.user_info.username.as_deref(),
        groups: request.user_info.groups.as_deref().unwrap_or_default(),
    };
    let verdict = policy::decide(&state.policy, &delete, state.lookup.as_ref(), Timestamp::now()).await;
    let enforced = state.policy.mode == Mode::Enforce;
    Span::current().record("reason", verdict.reason.code());
    audit::record(
        &delete,
        Requester {
            uid: &request.uid,
            dry_run: request.dry_run,
        },
        &verdict,
        enforced,
    );
    state
        .metrics
        .decision("DELETE", audit::outcome(&verdict, enforced), verdict.reason.code());
    respond(request, &verdict, enforced)
}

fn respond<T: kube::Resource>(request: &AdmissionRequest<T>, verdict: &Verdict, enforced: bool) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    if verdict.allowed {
        return response;
    }
    response.audit_annotations = audit::annotations(verdict);
    if enforced {
        let mut response = response.deny(&verdict.message);
        // Forbidden, not kube's default Bad Request: the request was fine, the delete is not allowed.
        response.result.code = 403;
        response.result.reason = "Forbidden".to_owned();
        response
    } else {
        response.warnings = Some(vec![format!("cds-secret-guard would deny: {}", verdict.message)]);
        response
    }
}

/// The whole request ran past its deadline: deny, as for a failed lookup.
fn deadline_passed(state: &AppState, request: &AdmissionRequest<PartialObjectMeta<Secret>>) -> AdmissionResponse {
    let name = secret_name(request);
    let worker = state.policy.worker_of_secret_name(name);
    let verdict = Verdict {
        allowed: false,
        reason: policy::Reason::LookupFailed,
        message: format!(
            "cannot decide on secret {} within {:?}; refusing to delete it",
            name, state.request_timeout
        ),
        worker,
        pod: None,
        age: None,
    };
    let enforced = state.policy.mode == Mode::Enforce;
    state
        .metrics
        .decision("DELETE", audit::outcome(&verdict, enforced), verdict.reason.code());
    tracing::warn!(secret = %name, "admission deadline passed");
    respond(request, &verdict, enforced)
}

/// Pod creates. Never denies: on any internal problem the pod is allowed unpatched.
#[instrument(skip_all, fields(uid, operation, namespace, object, allowed, reason))]
async fn mutate(State(state): State<Arc<AppState>>, Review(request): Review<DynamicObject>) -> Response {
    let _timer = state.metrics.time_admission("mutate");
    record_request(&request);
    let allow = AdmissionResponse::from(&request);
    if !is_for(&request, "Pod", Operation::Create) {
        tracing::debug!(kind = %request.kind.kind, "not a pod create, allowed untouched");
        return reply(allow);
    }
    let patched = tokio::time::timeout(state.request_timeout, mutate_pod(&state, &request))
        .in_current_span()
        .await;
    let response = match patched {
        Ok(Some(patch)) => match allow.clone().with_patch(patch) {
            Ok(response) => response,
            Err(error) => {
                tracing::error!(%error, "cannot serialise the patch, pod allowed unpatched");
                allow
            }
        },
        Ok(None) => allow,
        Err(_) => {
            tracing::warn!("mutation deadline passed, pod allowed unpatched");
            allow
        }
    };
    reply(response)
}

async fn mutate_pod(state: &AppState, request: &AdmissionRequest<DynamicObject>) -> Option<json_patch::Patch> {
    let pod: Pod = match request.object.as_ref().map(|object| object.clone().try_parse()) {
        Some(Ok(pod)) => pod,
        Some(Err(error)) => {
            tracing::warn!(%error, "pod does not parse, allowed unpatched");
            return None;
        }
        None => {
            tracing::warn!("pod create without an object, allowed unpatched");
            return None;
        }
    };
    let policy = &state.policy;
    let (secrets, worker) = mutation::protected_secrets(policy, pod.spec.as_ref());
    if secrets.is_empty() {
        state.metrics.decision("CREATE", "skip", "no-protected-secret");
        return None;
    }
    let hatchery = match &worker {
        Some(_) if !has_label(&pod, &policy.hatchery_label) => hatchery_of(state, request, &secrets).await,
        _ => None,
    };
    let mutation = mutation::mutate(policy, &pod, hatchery.as_deref());
    let changed = !mutation.patch.0.is_empty();
    let decision = if changed { "patch" } else { "unchanged" };
    Span::current().record("reason", decision);
    state.metrics.decision("CREATE", decision, "protected-secret");
    tracing::info!(
        worker = mutation.worker.as_deref(),
        secrets = %mutation.secrets.iter().cloned().collect::<Vec<_>>().join(","),
        hatchery = hatchery.as_deref(),
        operations = mutation.patch.0.len(),
        "worker pod {decision}"
    );
    changed.then_some(mutation.patch)
}

/// The hatchery label of the pod's protected secrets, by quorum read of their metadata.
/// The pod may come before its secret: then it is simply not known.
async fn hatchery_of(
    state: &AppState,
    request: &AdmissionRequest<DynamicObject>,
    secrets: &std::collections::BTreeSet<String>,
) -> Option<String> {
    let namespace = request.namespace.as_deref()?;
    for name in secrets {
        let read = tokio::time::timeout(
            state.policy.lookup_timeout,
            state.lookup.secret_metadata(namespace, name),
        );
        match read.await {
            Ok(Ok(Some(meta))) => {
                if let Some(hatchery) = meta
                    .labels
                    .and_then(|mut labels| labels.remove(&state.policy.hatchery_label))
                {
                    return Some(hatchery);
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::debug!(%error, secret = %name, "cannot read the secret's hatchery label"),
            Err(_) => tracing::debug!(secret = %name, "reading the secret's hatchery label timed out"),
        }
    }
    None
}

/// The secret's name. The per-item DELETEs of a deletecollection carry an empty
/// `request.name`: the name is then only in `oldObject`.
fn secret_name(request: &AdmissionRequest<PartialObjectMeta<Secret>>) -> &str {
    match request
        .old_object
        .as_ref()
        .and_then(|secret| secret.metadata.name.as_deref())
    {
        Some(name) if request.name.is_empty() => name,
        _ => &request.name,
    }
}

fn has_label(pod: &Pod, label: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(label))
}

fn record_request<T: kube::Resource>(request: &AdmissionRequest<T>) {
    let span = Span::current();
    span.record("uid", request.uid.as_str());
    span.record("operation", tracing::field::debug(&request.operation));
    span.record("namespace", request.namespace.as_deref());
    span.record("object", request.name.as_str());
}
