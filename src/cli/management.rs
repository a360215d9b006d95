//! The management endpoints of the long-running commands without a webhook: /healthz and /metrics.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::registry::Registry;

/// `/healthz` (always `ok` while the process serves) and `/metrics` (`registry` in the text format); a command
/// adds its own routes, such as `/readyz`.
pub(crate) fn router(registry: Arc<Registry>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/metrics",
            axum::routing::get(move || {
                let mut text = String::new();
                let result = prometheus_client::encoding::text::encode(&mut text, &registry);
                async move {
                    match result {
                        Ok(()) => (
                            [(header::CONTENT_TYPE, pdp_webhook::metrics::CONTENT_TYPE)],
                            text,
                        )
                            .into_response(),
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    }
                }
            }),
        )
}
