//! The handlers: extract the request, record the span fields, call one service, answer.

use std::sync::{Arc, atomic::Ordering};

use axum::{
    body::Bytes,
    extract::{FromRequest, Request as HttpRequest, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use kube::core::admission::Operation;
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::{AppState, service};
use crate::{
    api::review::{self, Answer, ApiError, RequestDeadline, ReviewBody, ReviewRequest, is_for, reply},
    cluster::references::Kind,
    observe::metrics::AdmissionTimer,
    rules::worker::pod::PodObject,
    rules::{in_use::InUseObject, worker::SecretObject},
};

/// `/readyz`: 200 while serving a certificate the webhooks trust, 503 before, without
/// one, and while draining.
pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.ready.load(Ordering::SeqCst) && state.certificate_trusted.load(Ordering::SeqCst) {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

/// `/metrics`, in the OpenMetrics text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.encode() {
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
pub async fn validate(Review { state, deadline, body }: Review) -> Result<Response, ApiError> {
    let (request, span, _timer) = open::<SecretObject>(&state, "validate", &body)?;
    let answer = if is_for(&request, "Secret", Operation::Delete) {
        service::validate_delete(&state, &request, deadline)
            .instrument(span)
            .await
    } else {
        span.in_scope(|| tracing::debug!(kind = %request.kind.kind, "not a secret delete, allowed untouched"));
        Answer::allow(&request.uid)
    };
    Ok(reply(&answer))
}

/// Deletes of opted-in Secrets and ConfigMaps (in-use protection). The object is decoded
/// as its name, uid and force annotation only: its data is never parsed.
pub async fn validate_in_use(Review { state, deadline, body }: Review) -> Result<Response, ApiError> {
    let (request, span, _timer) = open::<InUseObject>(&state, "validate-in-use", &body)?;
    let kind = [Kind::Secret, Kind::ConfigMap]
        .into_iter()
        .find(|kind| is_for(&request, kind.as_str(), Operation::Delete));
    let answer = match kind {
        Some(kind) => {
            service::validate_in_use_delete(&state, kind, &request, deadline)
                .instrument(span)
                .await
        }
        None => {
            span.in_scope(
                || tracing::debug!(kind = %request.kind.kind, "not a secret or configmap delete, allowed untouched"),
            );
            Answer::allow(&request.uid)
        }
    };
    Ok(reply(&answer))
}

/// Pod creates. Never denies: on any internal problem the pod is allowed unpatched.
pub async fn mutate(Review { state, deadline, body }: Review) -> Result<Response, ApiError> {
    let (request, span, _timer) = open::<PodObject>(&state, "mutate", &body)?;
    let mut answer = Answer::allow(&request.uid);
    if !is_for(&request, "Pod", Operation::Create) {
        span.in_scope(|| tracing::debug!(kind = %request.kind.kind, "not a pod create, allowed untouched"));
        return Ok(reply(&answer));
    }
    let patch = service::mutate_pod(&state, &request, deadline)
        .instrument(span.clone())
        .await;
    if let Some(patch) = patch {
        match serde_json::to_vec(&patch) {
            Ok(patch) => answer.patch = Some(patch),
            Err(error) => {
                span.in_scope(|| tracing::error!(%error, "cannot serialise the patch, pod allowed unpatched"));
            }
        }
    }
    Ok(reply(&answer))
}

/// What every review endpoint starts from: the guard's state, the request's deadline (set
/// by the admission middleware; a request that skipped it gets as long), and the body,
/// read within that deadline.
pub struct Review {
    state: Arc<AppState>,
    deadline: Instant,
    body: Bytes,
}

impl FromRequest<Arc<AppState>> for Review {
    type Rejection = ApiError;

    async fn from_request(request: HttpRequest, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let deadline = match request.extensions().get::<RequestDeadline>() {
            Some(RequestDeadline(deadline)) => *deadline,
            None => Instant::now() + state.request_timeout,
        };
        let ReviewBody(body) = ReviewBody::from_request(request, state).await?;
        Ok(Self {
            state: state.clone(),
            deadline,
            body,
        })
    }
}

/// The review in `body`, decoded for `endpoint`, with its span and the timer of its
/// answer; or why the body is no review.
fn open<'a, O: Deserialize<'a>>(
    state: &'a AppState,
    endpoint: &'static str,
    body: &'a [u8],
) -> Result<(ReviewRequest<'a, O>, Span, AdmissionTimer<'a>), ApiError> {
    let request = review::decode::<O>(body)?;
    let timer = state.metrics.time_admission(endpoint);
    let span = review_span(endpoint, &request);
    Ok((request, span, timer))
}

/// The span of one review, every field set at its creation: each later `record` makes
/// the JSON formatter encode the span's fields again (15 % of a `/validate`'s CPU when
/// six fields were recorded one by one, measured with perf).
fn review_span<O>(endpoint: &'static str, request: &ReviewRequest<'_, O>) -> Span {
    tracing::info_span!(
        "review",
        endpoint,
        uid = %request.uid,
        operation = ?request.operation,
        namespace = request.namespace.as_deref(),
        object = %request.name,
    )
}
