//! AdmissionReview in and out: decoding a request body, telling a request we handle from
//! one we let through, and encoding the response the apiserver expects.
//!
//! A review is decoded into the types of this module, which keep what the endpoints and
//! the rules read and borrow its strings from the body ([`Text`]); the rest is checked
//! for shape where kube's `AdmissionRequest` checks it, and skipped without being built:
//! the request's `options`, the user's `extra`, an object's managed fields, a secret's
//! data. Decoding through kube's owned types (every string copied, `options` built as a
//! JSON value, a secret buffered whole by `PartialObjectMeta`'s flattened type fields) was
//! most of a review's time in-process ([benchmarks](../docs/design/benchmarks.md)).

use axum::{
    Json,
    body::Bytes,
    extract::{FromRequest, Request as HttpRequest},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::core::{Status, admission::Operation};

pub use crate::cluster::Text;
use serde::{Deserialize, Serialize, de::IgnoredAny, ser::SerializeMap};

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

/// The body of an admission request, read within the request's deadline, with
/// [`ApiError`] as rejection. [`decode`] reads the review from it, borrowing.
#[derive(Debug)]
pub struct ReviewBody(pub Bytes);

/// An AdmissionReview's request as the endpoints read it. `O` is the endpoint's object
/// type; an object of another shape is left out ([`decode`]).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest<'a, O> {
    /// Echoed in the answer.
    #[serde(borrow)]
    pub uid: Text<'a>,
    /// The kind of the object.
    #[serde(borrow)]
    pub kind: Kind<'a>,
    /// Checked, not kept.
    #[serde(borrow, rename = "resource")]
    _resource: Resource<'a>,
    /// The subresource, if the request is for one.
    #[serde(default, borrow)]
    pub sub_resource: Option<Text<'a>>,
    #[serde(default, borrow, rename = "requestKind")]
    _request_kind: Option<Kind<'a>>,
    #[serde(default, borrow, rename = "requestResource")]
    _request_resource: Option<Resource<'a>>,
    #[serde(default, borrow, rename = "requestSubResource")]
    _request_sub_resource: Option<Text<'a>>,
    /// The object's name; empty for the per-item deletes of a deletecollection.
    #[serde(default, borrow)]
    pub name: Text<'a>,
    /// The object's namespace.
    #[serde(default, borrow)]
    pub namespace: Option<Text<'a>>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: Operation,
    /// Who asked.
    #[serde(borrow)]
    pub user_info: UserInfo<'a>,
    /// The object after the operation (a pod create's pod).
    pub object: Option<O>,
    /// The object before the operation (a secret delete's secret).
    pub old_object: Option<O>,
    /// Whether the request is a dry run.
    #[serde(default)]
    pub dry_run: bool,
    /// Any JSON (kube reads it as a `RawExtension`); skipped.
    #[serde(default, rename = "options")]
    _options: Option<IgnoredAny>,
}

/// A group, version and kind.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct Kind<'a> {
    #[serde(borrow)]
    pub group: Text<'a>,
    #[serde(borrow)]
    pub version: Text<'a>,
    #[serde(borrow)]
    pub kind: Text<'a>,
}

/// A group, version and resource: checked, not kept.
#[derive(Debug, Deserialize)]
struct Resource<'a> {
    #[serde(borrow, rename = "group")]
    _group: Text<'a>,
    #[serde(borrow, rename = "version")]
    _version: Text<'a>,
    #[serde(borrow, rename = "resource")]
    _resource: Text<'a>,
    #[serde(default, borrow, rename = "api_version")]
    _api_version: Text<'a>,
}

/// The requesting user: the name and groups the exemptions read.
#[derive(Debug, Default, Deserialize)]
pub struct UserInfo<'a> {
    /// The user name.
    #[serde(default, borrow)]
    pub username: Option<Text<'a>>,
    /// The user's groups.
    #[serde(default)]
    pub groups: Option<Vec<String>>,
    #[serde(default, borrow, rename = "uid")]
    _uid: Option<Text<'a>>,
    /// A map of string lists; skipped.
    #[serde(default, rename = "extra")]
    _extra: Option<IgnoredAny>,
}

/// The AdmissionReview envelope as it arrives, each field read once.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a, O> {
    #[serde(borrow)]
    api_version: Text<'a>,
    #[serde(borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    request: Option<ReviewRequest<'a, O>>,
}

/// Decodes an AdmissionReview body, borrowing from it. A review whose objects do not
/// decode as `O` (another kind sent to this endpoint, or a malformed object) is still a
/// review: it is returned without its objects, so that it can be answered.
pub fn decode<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Result<ReviewRequest<'a, O>, ApiError> {
    // JSON is UTF-8. serde_json checks only the strings it reads, not those of the fields
    // a type skips: without this, a body with invalid UTF-8 in a skipped field would be a
    // review for one endpoint and "not JSON" for the other.
    let body = std::str::from_utf8(body).map_err(ApiError::NotUtf8)?;
    match serde_json::from_str::<Envelope<'a, O>>(body) {
        Ok(review) => review.into_request(),
        Err(error) if error.is_syntax() || error.is_eof() => Err(ApiError::NotJson(error)),
        Err(typed) => {
            // The slow path, taken only for objects of another shape: any JSON value is
            // an object here, so whether a body is a review does not depend on the
            // endpoint, and the error says what is wrong with the review itself.
            let review: Envelope<'a, IgnoredAny> = serde_json::from_str(body).map_err(ApiError::NotAReview)?;
            tracing::debug!(error = %typed, "the review's objects are not of the endpoint's kind");
            review.into_request().map(ReviewRequest::without_objects)
        }
    }
}

impl<'a, O> Envelope<'a, O> {
    fn into_request(self) -> Result<ReviewRequest<'a, O>, ApiError> {
        if *self.kind != *"AdmissionReview" {
            return Err(ApiError::WrongVersion(format!("{}/{}", self.api_version, self.kind)));
        }
        if *self.api_version != *API_VERSION {
            return Err(ApiError::WrongVersion(self.api_version.0.into_owned()));
        }
        self.request.ok_or(ApiError::NoRequest)
    }
}

/// Whether a request is for `kind` (core group, v1) with `operation`, on the object
/// itself rather than a subresource. Everything else is let through untouched.
pub fn is_for<O>(request: &ReviewRequest<'_, O>, kind: &str, operation: Operation) -> bool {
    let Kind {
        group,
        version,
        kind: request_kind,
    } = &request.kind;
    group.is_empty()
        && **version == *"v1"
        && **request_kind == *kind
        && request.operation == operation
        && request.sub_resource.as_deref().unwrap_or_default().is_empty()
}

/// The answer to one review: allowed or refused, with what the apiserver records and
/// shows. [`encode`] writes it as the AdmissionReview the apiserver expects.
#[derive(Debug, Default)]
pub struct Answer<'a> {
    /// The request's uid, echoed.
    pub uid: &'a str,
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Why not: written only when the request is refused.
    pub status: Option<Status>,
    /// A JSON Patch, sent base64-encoded with `patchType: JSONPatch`.
    pub patch: Option<Vec<u8>>,
    /// What the apiserver writes to its audit log, each key prefixed with the webhook's
    /// name.
    pub audit_annotations: Vec<(&'static str, String)>,
    /// What the requesting client is warned of.
    pub warnings: Vec<String>,
}

/// The AdmissionReview answer as it leaves, written in one pass. kube serialises a patch
/// as an array of numbers (kube-rs#1781); the apiserver wants base64, written here
/// straight into the output.
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
    #[serde(skip_serializing_if = "Annotations::is_empty")]
    audit_annotations: Annotations<'a>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

/// Bytes written as a base64 string, without an intermediate copy.
struct Base64<'a>(&'a [u8]);

/// Audit annotations written as a JSON object.
struct Annotations<'a>(&'a [(&'static str, String)]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&base64::display::Base64Display::new(self.0, &BASE64))
    }
}

impl Annotations<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Annotations<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// Encodes an answer as the AdmissionReview the apiserver expects.
pub fn encode(answer: &Answer<'_>) -> Result<Vec<u8>, serde_json::Error> {
    let review = ReviewOut {
        api_version: API_VERSION,
        kind: "AdmissionReview",
        response: ResponseOut {
            uid: answer.uid,
            allowed: answer.allowed,
            status: answer.status.as_ref().filter(|_| !answer.allowed),
            patch: answer.patch.as_deref().map(Base64),
            patch_type: answer.patch.as_ref().map(|_| "JSONPatch"),
            audit_annotations: Annotations(&answer.audit_annotations),
            warnings: &answer.warnings,
        },
    };
    // One allocation for most answers: the envelope, a denial's message twice (status
    // and annotations), or a patch in base64.
    let patch = answer.patch.as_ref().map_or(0, Vec::len);
    let annotations: usize = answer.audit_annotations.iter().map(|(_, value)| value.len() + 24).sum();
    let mut out = Vec::with_capacity(256 + patch * 4 / 3 + 2 * annotations);
    serde_json::to_writer(&mut out, &review)?;
    Ok(out)
}

/// The HTTP response for an answer.
pub fn reply(answer: &Answer<'_>) -> Response {
    match encode(answer) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode AdmissionReview response");
            ApiError::Internal.into_response()
        }
    }
}

// === impl ReviewRequest ===

impl<'a> ReviewRequest<'a, IgnoredAny> {
    /// The request with its objects left out: the same review, for an endpoint that
    /// cannot read them.
    fn without_objects<O>(self) -> ReviewRequest<'a, O> {
        ReviewRequest {
            uid: self.uid,
            kind: self.kind,
            _resource: self._resource,
            sub_resource: self.sub_resource,
            _request_kind: self._request_kind,
            _request_resource: self._request_resource,
            _request_sub_resource: self._request_sub_resource,
            name: self.name,
            namespace: self.namespace,
            operation: self.operation,
            user_info: self.user_info,
            object: None,
            old_object: None,
            dry_run: self.dry_run,
            _options: self._options,
        }
    }
}

// === impl Answer ===

impl<'a> Answer<'a> {
    /// Lets the request with this uid through, untouched.
    pub fn allow(uid: &'a str) -> Self {
        Self {
            uid,
            allowed: true,
            ..Self::default()
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

// === impl ReviewBody ===

impl<S: Send + Sync> FromRequest<S> for ReviewBody {
    type Rejection = ApiError;

    async fn from_request(request: HttpRequest, state: &S) -> Result<Self, Self::Rejection> {
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
        Ok(Self(body))
    }
}

#[cfg(test)]
mod tests;
