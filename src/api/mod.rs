//! The admission API: routes, the handlers behind them, the services they call, and the
//! state they share. The layout follows Kubewarden's policy-server: handlers decode and
//! answer, services decide, state holds the shared handles.

pub mod audit;
mod handlers;
pub mod review;
mod service;
mod state;

use std::sync::Arc;

use axum::{
    Router,
    body::HttpBody,
    extract::{DefaultBodyLimit, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tokio::time::Instant;

pub use state::AppState;

use crate::api::review::{ApiError, RequestDeadline};

/// The admission routes, `/validate`, `/mutate` and `/validate-in-use`, behind the
/// request limits.
pub fn admission_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/validate", post(handlers::validate))
        .route("/mutate", post(handlers::mutate))
        .route("/validate-in-use", post(handlers::validate_in_use))
        .layer(DefaultBodyLimit::max(state.limits.body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), admit))
        .with_state(state)
}

/// The probe and metrics routes: `/healthz`, `/readyz`, `/metrics`.
pub fn probe_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(handlers::readyz))
        .route("/metrics", get(handlers::metrics))
        .with_state(state)
}

/// Every request gets one deadline, from its arrival to its answer, that covers waiting
/// for a slot, reading the body and deciding; and it waits for one of the
/// `max_requests` slots, so the bodies held at once are bounded. At most
/// `max_connections` requests are admitted at once, waiting or served; past that, and for
/// a body announced larger than the limit, the answer comes at once.
async fn admit(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    // The body limit alone would only notice once the limit is read, or at the deadline
    // if the client never sends the body it announced.
    let announced = request.body().size_hint().lower();
    if announced > state.limits.body_limit as u64 {
        return ApiError::Body {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!(
                "{announced} bytes announced, over the limit of {} bytes",
                state.limits.body_limit
            ),
        }
        .into_response();
    }
    // HTTP/2 lets each connection carry `max_streams` requests: no more may wait, headers
    // in memory, than HTTP/1.1 connections could carry.
    let Ok(_admitted) = state.admitted.try_acquire() else {
        return ApiError::Busy.into_response();
    };
    let deadline = Instant::now() + state.request_timeout;
    let permit = tokio::time::timeout_at(deadline, state.requests.clone().acquire_owned()).await;
    let Ok(Ok(_permit)) = permit else {
        return ApiError::Busy.into_response();
    };
    request.extensions_mut().insert(RequestDeadline(deadline));
    next.run(request).await
}
