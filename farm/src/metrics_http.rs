//! `GET /metrics` over HTTP: the engine's Prometheus metrics ([`engine::metrics`]) for
//! `farm run --metrics-listen` and `farm serve`.

/// Serves `GET /metrics` on `addr` until the process ends (`farm run --metrics-listen`);
/// returns the address it listens on.
pub async fn serve(addr: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen {addr}: cannot listen"))?;
    let bound = listener.local_addr()?;
    // The run's own endpoint: no guest's egress reaches it.
    egress::protect(bound);
    let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { metrics_response() }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}

/// The `/metrics` response.
pub fn metrics_response() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        engine::metrics::get().render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::metrics::{get, Role, VmGauge};

    #[tokio::test]
    async fn metrics_listen_serves_the_prometheus_text() {
        let addr = serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let before = get().rollouts.with_label_values(&["timeout"]).get();
        get().rollouts.with_label_values(&["timeout"]).inc();
        let _vm = VmGauge::new(Role::Scoring);
        let response = reqwest::get(format!("http://{addr}/metrics")).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"));
        let text = response.text().await.unwrap();
        assert!(
            text.contains(&format!("farm_rollouts_total{{status=\"timeout\"}} {}", before + 1)),
            "{text}"
        );
        assert!(text.contains("farm_vms{role=\"scoring\"}"), "{text}");
        assert!(
            text.contains("farm_rollouts_total{status=\"env_error\"} "),
            "every status shows from the start: {text}"
        );
        assert!(serve("192.0.2.1:0".parse().unwrap())
            .await
            .unwrap_err()
            .to_string()
            .contains("--metrics-listen"));
    }
}
