//! AdmissionReview in and out: decoding a request body, telling a request we handle from
//! one we let through, and encoding the response the apiserver expects.

use std::collections::HashMap;

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequest, Request},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::core::{
    DynamicObject, GroupVersionKind, Resource, Status, TypeMeta,
    admission::{AdmissionRequest, AdmissionResponse, Operation},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The only AdmissionReview version the guard speaks (the webhooks ask for it).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// A request body that is not a usable AdmissionReview, answered with a 4xx; or a fault
/// of ours, answered with a 500 that says nothing more.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON.
    #[error("request body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The body is not UTF-8, hence not JSON.
    #[error("request body is not JSON: {0}")]
    NotUtf8(#[source] std::str::Utf8Error),
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
    /// The body did not arrive before the request's deadline.
    #[error("request body not received within the request deadline")]
    Timeout,
    /// Every request slot stayed taken until the request's deadline.
    #[error("too many requests in flight; try again")]
    Busy,
    /// A bug on our side; details are logged, not sent.
    #[error("internal error")]
    Internal,
}

/// When the request must be answered by: set on arrival, before the body is read.
#[derive(Debug, Clone, Copy)]
pub struct RequestDeadline(pub tokio::time::Instant);

/// An AdmissionReview's request, extracted from the body with [`ApiError`] as rejection.
#[derive(Debug)]
pub struct Review<T: Resource>(pub AdmissionRequest<T>);

/// The AdmissionReview envelope as it arrives. kube's `AdmissionReview` flattens its
/// `TypeMeta`, which makes serde buffer the whole request, objects included, before
/// decoding it again; this one reads each field once.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound = "T: DeserializeOwned")]
struct ReviewIn<T: Resource> {
    api_version: String,
    kind: String,
    request: Option<AdmissionRequest<T>>,
}

/// Decodes an AdmissionReview body. A review whose objects do not decode as `T` (another
/// kind sent to this endpoint, or a malformed object) is still a review: it is returned
/// without its objects, so that it can be answered.
pub fn decode<T: Resource + DeserializeOwned>(body: &[u8]) -> Result<AdmissionRequest<T>, ApiError> {
    // JSON is UTF-8. serde_json checks only the strings it keeps, not those of the fields a
    // type skips: without this, a body with invalid UTF-8 in a skipped field would be a
    // review for one endpoint and "not JSON" for the other.
    let body = std::str::from_utf8(body).map_err(ApiError::NotUtf8)?;
    match serde_json::from_str::<ReviewIn<T>>(body) {
        Ok(review) => review.into_request(),
        Err(error) if error.is_syntax() || error.is_eof() => Err(ApiError::NotJson(error)),
        Err(typed) => {
            // The slow path, taken only for objects of another shape.
            let review: ReviewIn<DynamicObject> =
                serde_json::from_str(body).map_err(|_| ApiError::NotAReview(typed))?;
            review.into_request().map(without_objects)
        }
    }
}

impl<T: Resource> ReviewIn<T> {
    fn into_request(self) -> Result<AdmissionRequest<T>, ApiError> {
        let types = TypeMeta {
            api_version: self.api_version,
            kind: self.kind,
        };
        check_version(&types)?;
        let mut request = self.request.ok_or(ApiError::NoRequest)?;
        request.types = types;
        Ok(request)
    }
}

fn check_version(types: &TypeMeta) -> Result<(), ApiError> {
    if types.kind != "AdmissionReview" {
        return Err(ApiError::WrongVersion(format!("{}/{}", types.api_version, types.kind)));
    }
    if types.api_version != API_VERSION {
        return Err(ApiError::WrongVersion(types.api_version.clone()));
    }
    Ok(())
}

/// The request with its objects left out: the same review, for an endpoint that cannot
/// read them.
fn without_objects<T: Resource>(request: AdmissionRequest<DynamicObject>) -> AdmissionRequest<T> {
    tracing::debug!(kind = %request.kind.kind, "the review's object is not of the endpoint's kind");
    AdmissionRequest {
        types: request.types,
        uid: request.uid,
        kind: request.kind,
        resource: request.resource,
        sub_resource: request.sub_resource,
        request_kind: request.request_kind,
        request_resource: request.request_resource,
        request_sub_resource: request.request_sub_resource,
        name: request.name,
        namespace: request.namespace,
        operation: request.operation,
        user_info: request.user_info,
        object: None,
        old_object: None,
        dry_run: request.dry_run,
        options: request.options,
    }
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

/// The AdmissionReview answer as it leaves, borrowed from kube's `AdmissionResponse`
/// and written in one pass. kube serialises the patch as an array of numbers
/// (kube-rs#1781); the apiserver wants base64, written here straight into the output.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    /// Read only when the request is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<Base64<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    audit_annotations: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a Vec<String>>,
}

/// Bytes written as a base64 string, without an intermediate copy.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&base64::display::Base64Display::new(self.0, &BASE64))
    }
}

/// Encodes a response as the AdmissionReview the apiserver expects.
pub fn encode(response: &AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    let review = ReviewOut {
        api_version: API_VERSION,
        kind: "AdmissionReview",
        response: ResponseOut {
            uid: &response.uid,
            allowed: response.allowed,
            status: (!response.allowed).then_some(&response.result),
            patch: response.patch.as_deref().map(Base64),
            // kube sets the patch only through `with_patch`, always a JSON Patch.
            patch_type: response.patch.as_ref().map(|_| "JSONPatch"),
            audit_annotations: &response.audit_annotations,
            warnings: response.warnings.as_ref(),
        },
    };
    serde_json::to_vec(&review)
}

/// The HTTP response for an admission response.
pub fn reply(response: AdmissionResponse) -> Response {
    match encode(&response) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
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
            Self::NotJson(_) | Self::NotUtf8(_) | Self::NotAReview(_) | Self::WrongVersion(_) | Self::NoRequest => {
                StatusCode::BAD_REQUEST
            }
            Self::Body { status, .. } => *status,
            Self::Timeout => StatusCode::REQUEST_TIMEOUT,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
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
        let deadline = request.extensions().get::<RequestDeadline>().copied();
        let read = Bytes::from_request(request, state);
        let body = match deadline {
            Some(RequestDeadline(deadline)) => tokio::time::timeout_at(deadline, read)
                .await
                .map_err(|_| ApiError::Timeout)?,
            None => read.await,
        }
        .map_err(|rejection| ApiError::Body {
            status: rejection.status(),
            message: rejection.body_text(),
        })?;
        decode(&body).map(Review)
    }
}
