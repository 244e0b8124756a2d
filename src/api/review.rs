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
mod tests {
    use super::*;
    use std::borrow::Cow;

    use crate::rules::worker::pod::WorkerPod;
    use crate::rules::{in_use::InUseObject, worker::SecretObject};
    use rstest::rstest;
    use serde_json::{Value, json};

    fn secret_delete() -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "uid-1",
                "kind": {"group": "", "version": "v1", "kind": "Secret"},
                "resource": {"group": "", "version": "v1", "resource": "secrets"},
                "requestKind": {"group": "", "version": "v1", "kind": "Secret"},
                "name": "cds-worker-config-w1",
                "namespace": "cds",
                "operation": "DELETE",
                "userInfo": {
                    "username": "system:serviceaccount:cds:hatchery",
                    "uid": "user-uid",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": ["hatchery-0"]}
                },
                "oldObject": {
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {
                        "name": "cds-worker-config-w1", "namespace": "cds", "uid": "secret-uid",
                        "creationTimestamp": "2026-01-01T10:00:00Z",
                        "labels": {"CDS_WORKER_NAME": "w1"},
                        "annotations": {"note": "a user's text"},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "w1", "uid": "pod-uid"}],
                        "managedFields": [{"manager": "hatchery", "fieldsV1": {"f:data": {}}}]
                    },
                    "data": {"CDS_CONFIG": "dG9wLXNlY3JldA=="},
                    "type": "Opaque"
                },
                "dryRun": true,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
            }
        })
    }

    fn set(mut review: Value, pointer: &str, value: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let parent = review.pointer_mut(parent).unwrap().as_object_mut().unwrap();
        parent.insert(key.to_owned(), value);
        review
    }

    fn remove(mut review: Value, pointer: &str) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        review.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(key);
        review
    }

    fn bytes(review: &Value) -> Vec<u8> {
        serde_json::to_vec(review).unwrap()
    }

    #[test]
    fn a_secret_delete_keeps_what_the_rules_read_borrowed_from_the_body() {
        let body = bytes(&secret_delete());
        let request = decode::<SecretObject>(&body).unwrap();

        assert!(matches!(request.uid.0, Cow::Borrowed("uid-1")), "{:?}", request.uid);
        assert_eq!(
            (&*request.kind.group, &*request.kind.version, &*request.kind.kind),
            ("", "v1", "Secret")
        );
        assert_eq!(&*request.name, "cds-worker-config-w1");
        assert_eq!(request.namespace.as_deref(), Some("cds"));
        assert_eq!(request.operation, Operation::Delete);
        assert!(matches!(
            request.user_info.username.as_ref().map(|user| &user.0),
            Some(Cow::Borrowed("system:serviceaccount:cds:hatchery"))
        ));
        assert_eq!(
            request.user_info.groups.as_deref(),
            Some(&["system:serviceaccounts".to_owned(), "system:authenticated".to_owned()][..])
        );
        assert!(request.dry_run);
        assert!(request.object.is_none());

        let secret = &request.old_object.as_ref().unwrap().metadata;
        assert_eq!(secret.name.as_deref(), Some("cds-worker-config-w1"));
        assert_eq!(secret.uid.as_deref(), Some("secret-uid"));
        assert_eq!(
            secret.labels.as_ref().and_then(|labels| labels.get("CDS_WORKER_NAME")),
            Some(&"w1".to_owned())
        );
        let owner = &secret.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "w1", "pod-uid")
        );
        assert_eq!(
            secret.creation_timestamp.as_ref().map(|time| time.0.to_string()),
            Some("2026-01-01T10:00:00Z".to_owned())
        );
        let kept = format!("{request:?}");
        for skipped in [
            "dG9wLXNlY3JldA==",
            "a user's text",
            "hatchery-0",
            "f:data",
            "Background",
        ] {
            assert!(!kept.contains(skipped), "{skipped} was kept: {kept}");
        }
    }

    #[test]
    fn an_in_use_delete_keeps_the_force_annotation_the_opt_in_label_and_the_finalizers_alone() {
        let force = crate::rules::in_use::FORCE_ANNOTATION;
        let opt_in = crate::rules::in_use::OPT_IN_LABEL;
        let review = set(
            secret_delete(),
            "/request/oldObject/metadata/annotations",
            json!({
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"CDS_CONFIG\":\"dG9wLXNlY3JldA==\"}}",
                force: "INC-42",
                "note": {"not": "a string"},
            }),
        );
        let review = set(
            review,
            "/request/oldObject/metadata/labels",
            json!({"CDS_WORKER_NAME": "w1", opt_in: "defer"}),
        );
        let review = set(
            review,
            "/request/oldObject/metadata/finalizers",
            json!([crate::rules::in_use::FINALIZER]),
        );
        let body = bytes(&review);
        let request = decode::<InUseObject>(&body).unwrap();
        let object = &request.old_object.as_ref().unwrap().metadata;
        assert_eq!(
            (object.name.as_deref(), object.uid.as_deref()),
            (Some("cds-worker-config-w1"), Some("secret-uid"))
        );
        assert_eq!(
            object.annotations,
            Some([(force.to_owned(), "INC-42".to_owned())].into())
        );
        assert_eq!(object.labels, Some([(opt_in.to_owned(), "defer".to_owned())].into()));
        assert!(crate::rules::in_use::is_held(object));
        let kept = format!("{request:?}");
        for skipped in ["dG9wLXNlY3JldA==", "last-applied", "CDS_WORKER_NAME", "f:data"] {
            assert!(!kept.contains(skipped), "{skipped} was kept: {kept}");
        }

        let body = bytes(&remove(secret_delete(), "/request/oldObject/metadata/annotations"));
        let request = decode::<InUseObject>(&body).unwrap();
        assert_eq!(request.old_object.unwrap().metadata.annotations, None);
    }

    #[test]
    fn an_escaped_string_is_unescaped_into_a_copy() {
        let body = br#"{"apiVersion": "admission.k8s.io\/v1", "kind": "AdmissionReview", "request": {
            "uid": "a\u0062c", "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "operation": "DELETE", "userInfo": {"username": "jane\"doe"}}}"#;
        let request = decode::<SecretObject>(body).unwrap();
        assert!(matches!(request.uid.0, Cow::Owned(ref uid) if uid == "abc"));
        assert_eq!(request.user_info.username.as_deref(), Some("jane\"doe"));
    }

    #[test]
    fn fields_the_rules_read_may_be_missing() {
        let review = remove(secret_delete(), "/request/name");
        let review = remove(review, "/request/namespace");
        let review = remove(review, "/request/userInfo/username");
        let review = remove(review, "/request/userInfo/groups");
        let review = remove(review, "/request/dryRun");
        let review = remove(review, "/request/oldObject/metadata/labels");
        let review = remove(review, "/request/oldObject/metadata/creationTimestamp");
        let body = bytes(&review);
        let request = decode::<SecretObject>(&body).unwrap();

        assert_eq!(&*request.name, "");
        assert_eq!(request.namespace, None);
        assert_eq!(request.user_info.username, None);
        assert_eq!(request.user_info.groups, None);
        assert!(!request.dry_run);
        let secret = &request.old_object.as_ref().unwrap().metadata;
        assert_eq!(
            (secret.labels.as_ref(), secret.creation_timestamp.as_ref()),
            (None, None)
        );

        let body = bytes(&remove(secret_delete(), "/request/oldObject"));
        assert!(decode::<SecretObject>(&body).unwrap().old_object.is_none());
    }

    #[rstest]
    #[case::labels_not_a_map("/request/oldObject/metadata/labels", json!(["w1"]))]
    #[case::label_not_a_string("/request/oldObject/metadata/labels/CDS_WORKER_NAME", json!(1))]
    #[case::creation_time_not_a_time("/request/oldObject/metadata/creationTimestamp", json!("yesterday"))]
    #[case::owner_uid_not_a_string("/request/oldObject/metadata/ownerReferences", json!([{"apiVersion": "v1", "kind": "Pod", "name": "w1", "uid": 7}]))]
    #[case::object_not_an_object("/request/oldObject", json!("a secret"))]
    fn an_object_of_the_wrong_shape_is_left_out_of_a_review_still_answered(
        #[case] pointer: &str,
        #[case] value: Value,
    ) {
        let body = bytes(&set(secret_delete(), pointer, value));
        let request = decode::<SecretObject>(&body).unwrap();
        assert!(request.old_object.is_none());
        assert_eq!(&*request.uid, "uid-1");
        assert_eq!(&*request.name, "cds-worker-config-w1");
        // The pod endpoint reads the same body as the same review.
        let pod = decode::<WorkerPod>(&body).unwrap();
        assert_eq!((pod.uid, pod.operation), (request.uid, request.operation));
    }

    #[rstest]
    #[case::no_uid(remove(secret_delete(), "/request/uid"), "missing field `uid`")]
    #[case::no_user(remove(secret_delete(), "/request/userInfo"), "missing field `userInfo`")]
    #[case::no_resource(remove(secret_delete(), "/request/resource"), "missing field `resource`")]
    #[case::uid_not_a_string(set(secret_delete(), "/request/uid", json!(42)), "invalid type: integer `42`, expected a string")]
    #[case::username_not_a_string(set(secret_delete(), "/request/userInfo/username", json!(["jane"])), "expected a string")]
    #[case::groups_not_a_list(set(secret_delete(), "/request/userInfo/groups", json!("admins")), "expected a sequence")]
    #[case::namespace_not_a_string(set(secret_delete(), "/request/namespace", json!({})), "expected a string")]
    #[case::dry_run_not_a_boolean(set(secret_delete(), "/request/dryRun", json!("yes")), "expected a boolean")]
    #[case::unknown_operation(set(secret_delete(), "/request/operation", json!("DESTROY")), "unknown variant `DESTROY`")]
    #[case::kind_without_version(remove(secret_delete(), "/request/kind/version"), "missing field `version`")]
    fn a_request_the_rules_cannot_read_is_not_a_review(#[case] review: Value, #[case] message: &str) {
        for error in [
            decode::<SecretObject>(&bytes(&review)).unwrap_err(),
            decode::<WorkerPod>(&bytes(&review)).unwrap_err(),
        ] {
            assert!(matches!(error, ApiError::NotAReview(_)), "{error:?}");
            let text = error.to_string();
            assert!(text.starts_with("request body is not an AdmissionReview: "), "{text}");
            assert!(text.contains(message), "{text} lacks {message}");
            assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        }
    }

    #[rstest]
    #[case::truncated(&b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\""[..], "request body is not JSON: EOF")]
    #[case::garbage(&b"hello"[..], "request body is not JSON: expected value")]
    #[case::not_utf8(&b"{\"apiVersion\": \"\xff\"}"[..], "request body is not JSON: invalid utf-8")]
    #[case::wrong_version(
        &br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}"#[..],
        "unsupported AdmissionReview version \"admission.k8s.io/v1beta1\""
    )]
    #[case::wrong_kind(
        &br#"{"apiVersion": "admission.k8s.io/v1", "kind": "Review"}"#[..],
        "unsupported AdmissionReview version \"admission.k8s.io/v1/Review\""
    )]
    #[case::no_request(&br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#[..], "AdmissionReview has no request")]
    fn a_body_that_is_not_a_review_gets_a_clear_error(#[case] body: &[u8], #[case] message: &str) {
        let error = decode::<SecretObject>(body).unwrap_err();
        assert!(error.to_string().starts_with(message), "{error} is not {message}");
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
    }

    #[rstest]
    #[case::secret_delete(secret_delete(), true)]
    #[case::other_kind(set(secret_delete(), "/request/kind/kind", json!("ConfigMap")), false)]
    #[case::other_group(set(secret_delete(), "/request/kind/group", json!("apps")), false)]
    #[case::other_version(set(secret_delete(), "/request/kind/version", json!("v2")), false)]
    #[case::other_operation(set(secret_delete(), "/request/operation", json!("UPDATE")), false)]
    #[case::subresource(set(secret_delete(), "/request/subResource", json!("status")), false)]
    #[case::empty_subresource(set(secret_delete(), "/request/subResource", json!("")), true)]
    fn only_the_handled_kind_and_operation_are_for_the_endpoint(#[case] review: Value, #[case] handled: bool) {
        let body = bytes(&review);
        let request = decode::<SecretObject>(&body).unwrap();
        assert_eq!(is_for(&request, "Secret", Operation::Delete), handled);
    }

    #[test]
    fn an_answer_is_an_admission_review_that_echoes_the_uid() {
        let allow: Value = serde_json::from_slice(&encode(&Answer::allow("uid-1")).unwrap()).unwrap();
        assert_eq!(
            allow,
            json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": {"uid": "uid-1", "allowed": true}})
        );

        let deny = Answer {
            allowed: false,
            status: Some(Status {
                code: 403,
                message: "pod w1 still uses it".to_owned(),
                reason: "Forbidden".to_owned(),
                ..Status::default()
            }),
            audit_annotations: vec![("decision", "deny".to_owned()), ("reason", "pod-live".to_owned())],
            ..Answer::allow("uid-2")
        };
        let deny: Value = serde_json::from_slice(&encode(&deny).unwrap()).unwrap();
        assert_eq!(
            deny["response"],
            json!({
                "uid": "uid-2", "allowed": false,
                "status": {"code": 403, "message": "pod w1 still uses it", "reason": "Forbidden"},
                "auditAnnotations": {"decision": "deny", "reason": "pod-live"}
            })
        );

        let patched = Answer {
            patch: Some(br#"[{"op":"add"}]"#.to_vec()),
            warnings: vec!["careful".to_owned()],
            ..Answer::allow("uid-3")
        };
        let patched: Value = serde_json::from_slice(&encode(&patched).unwrap()).unwrap();
        assert_eq!(
            patched["response"],
            json!({
                "uid": "uid-3", "allowed": true, "patch": "W3sib3AiOiJhZGQifV0=", "patchType": "JSONPatch",
                "warnings": ["careful"]
            })
        );
    }
}
