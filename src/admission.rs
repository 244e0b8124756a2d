//! AdmissionReview in and out: decoding a request body, telling a request we handle from
//! one we let through, and encoding the response the apiserver expects.

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequest, Request},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use kube::core::{
    GroupVersionKind, Resource,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The only AdmissionReview version the guard speaks (the webhooks ask for it).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// A request body that is not a usable AdmissionReview, answered with a 4xx; or a fault
/// of ours, answered with a 500 that says nothing more.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON.
    #[error("request body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The body is JSON but not an AdmissionReview.
    #[error("request body is not an AdmissionReview: {0}")]
    NotAReview(#[source] serde_json::Error),
    /// An AdmissionReview of another version.
    #[error("unsupported AdmissionReview version {0:?}: only {API_VERSION} is served")]
    WrongVersion(String),
    /// An AdmissionReview without a request.
    #[error("AdmissionReview has no request")]
    NoRequest,
    /// The body could not be read (too large, broken connection).
    #[error("cannot read request body: {message}")]
    Body {
        /// Status to answer with (413 for an oversize body).
        status: StatusCode,
        /// What went wrong.
        message: String,
    },
    /// A bug on our side; details are logged, not sent.
    #[error("internal error")]
    Internal,
}

/// An AdmissionReview's request, extracted from the body with [`ApiError`] as rejection.
#[derive(Debug)]
pub struct Review<T: Resource>(pub AdmissionRequest<T>);

/// Decodes an AdmissionReview body.
pub fn decode<T: Resource + DeserializeOwned>(body: &[u8]) -> Result<AdmissionRequest<T>, ApiError> {
    let review: AdmissionReview<T> = serde_json::from_slice(body).map_err(|error| {
        if error.is_syntax() || error.is_eof() {
            ApiError::NotJson(error)
        } else {
            ApiError::NotAReview(error)
        }
    })?;
    if review.types.kind != "AdmissionReview" {
        return Err(ApiError::WrongVersion(format!(
            "{}/{}",
            review.types.api_version, review.types.kind
        )));
    }
    if review.types.api_version != API_VERSION {
        return Err(ApiError::WrongVersion(review.types.api_version));
    }
    review.try_into().map_err(|_| ApiError::NoRequest)
}

/// Whether a request is for `kind` (core group, v1) with `operation`, on the object
/// itself rather than a subresource. Everything else is let through untouched.
pub fn is_for<T: Resource>(request: &AdmissionRequest<T>, kind: &str, operation: Operation) -> bool {
    let GroupVersionKind {
        group,
        version,
        kind: request_kind,
    } = &request.kind;
    group.is_empty()
        && version == "v1"
        && request_kind == kind
        && request.operation == operation
        && request.sub_resource.as_deref().unwrap_or_default().is_empty()
}

/// Encodes a response as the AdmissionReview the apiserver expects.
///
/// kube's `AdmissionResponse::with_patch` keeps the patch as bytes, which serde writes as
/// an array of numbers (kube-rs#1781); the apiserver wants base64, so the patch is
/// re-encoded here.
pub fn encode(response: AdmissionResponse) -> Result<Value, serde_json::Error> {
    let mut review = serde_json::to_value(response.into_review())?;
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(patch.take())?;
        *patch = Value::String(BASE64.encode(bytes));
    }
    Ok(review)
}

/// The HTTP response for an admission response.
pub fn reply(response: AdmissionResponse) -> Response {
    match encode(response) {
        Ok(review) => Json(review).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode AdmissionReview response");
            ApiError::Internal.into_response()
        }
    }
}

// === impl ApiError ===

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotJson(_) | Self::NotAReview(_) | Self::WrongVersion(_) | Self::NoRequest => StatusCode::BAD_REQUEST,
            Self::Body { status, .. } => *status,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_client_error() {
            tracing::warn!(error = %self, "rejected a malformed admission request");
        }
        (status, Json(serde_json::json!({ "error": self.to_string() }))).into_response()
    }
}

// === impl Review ===

impl<S, T> FromRequest<S> for Review<T>
where
    S: Send + Sync,
    T: Resource + DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::Body {
                status: rejection.status(),
                message: rejection.body_text(),
            })?;
        decode(&body).map(Review)
    }
}
