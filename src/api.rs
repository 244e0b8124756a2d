//! The admission API: routes, the handlers behind them, the services they call, and the
//! state they share. The layout follows Kubewarden's policy-server: handlers decode and
//! answer, services decide, state holds the shared handles.

mod handlers;
mod service;
mod state;

use std::sync::Arc;

use axum::{
    Router,
    extract::{DefaultBodyLimit, Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tokio::time::Instant;

pub use state::AppState;

use crate::admission::{ApiError, RequestDeadline};

/// The admission routes, `/validate` and `/mutate`, behind the request limits.
pub fn admission_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/validate", post(handlers::validate))
        .route("/mutate", post(handlers::mutate))
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
/// `max_requests` slots, so the bodies held at once are bounded.
async fn admit(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let deadline = Instant::now() + state.request_timeout;
    let permit = tokio::time::timeout_at(deadline, state.requests.clone().acquire_owned()).await;
    let Ok(Ok(_permit)) = permit else {
        return ApiError::Busy.into_response();
    };
    request.extensions_mut().insert(RequestDeadline(deadline));
    next.run(request).await
}
