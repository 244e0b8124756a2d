//! The handlers: extract the request, record the span fields, call one service, answer.

use std::sync::{Arc, atomic::Ordering};

use axum::{
    extract::{Extension, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::core::{
    PartialObjectMeta,
    admission::{AdmissionRequest, AdmissionResponse, Operation},
};
use tracing::{Instrument, Span, instrument};

use super::{AppState, service};
use crate::admission::{RequestDeadline, Review, is_for, reply};

/// `/readyz`: 200 while serving, 503 before and while draining.
pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.ready.load(Ordering::SeqCst) {
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
#[instrument(skip_all, fields(uid, operation, namespace, object, allowed, reason))]
pub async fn validate(
    State(state): State<Arc<AppState>>,
    Extension(RequestDeadline(deadline)): Extension<RequestDeadline>,
    Review(request): Review<PartialObjectMeta<Secret>>,
) -> Response {
    let _timer = state.metrics.time_admission("validate");
    record_request(&request);
    let response = if is_for(&request, "Secret", Operation::Delete) {
        service::validate_delete(&state, &request, deadline)
            .in_current_span()
            .await
    } else {
        tracing::debug!(kind = %request.kind.kind, "not a secret delete, allowed untouched");
        AdmissionResponse::from(&request)
    };
    Span::current().record("allowed", response.allowed);
    reply(response)
}

/// Pod creates. Never denies: on any internal problem the pod is allowed unpatched.
#[instrument(skip_all, fields(uid, operation, namespace, object, allowed, reason))]
pub async fn mutate(
    State(state): State<Arc<AppState>>,
    Extension(RequestDeadline(deadline)): Extension<RequestDeadline>,
    Review(request): Review<Pod>,
) -> Response {
    let _timer = state.metrics.time_admission("mutate");
    record_request(&request);
    let allow = AdmissionResponse::from(&request);
    if !is_for(&request, "Pod", Operation::Create) {
        tracing::debug!(kind = %request.kind.kind, "not a pod create, allowed untouched");
        return reply(allow);
    }
    let response = match service::mutate_pod(&state, &request, deadline).in_current_span().await {
        Some(patch) => match allow.clone().with_patch(patch) {
            Ok(response) => response,
            Err(error) => {
                tracing::error!(%error, "cannot serialise the patch, pod allowed unpatched");
                allow
            }
        },
        None => allow,
    };
    reply(response)
}

fn record_request<T: kube::Resource>(request: &AdmissionRequest<T>) {
    let span = Span::current();
    span.record("uid", request.uid.as_str());
    span.record("operation", tracing::field::debug(&request.operation));
    span.record("namespace", request.namespace.as_deref());
    span.record("object", request.name.as_str());
}
