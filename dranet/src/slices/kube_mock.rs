//! A scripted API server for unit tests: a tower service behind `kube::Client::new` that records
//! every request and answers from a routing function.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;

/// One request the client made.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub body: serde_json::Value,
    /// The request's `content-type` (patches name their kind here).
    pub content_type: String,
}

type Route = dyn Fn(&Seen) -> (u16, serde_json::Value) + Send + Sync;

/// Builds a client whose requests go to `route`; returns it with the request log.
pub fn client(
    route: impl Fn(&Seen) -> (u16, serde_json::Value) + Send + Sync + 'static,
) -> (kube::Client, Arc<Mutex<Vec<Seen>>>) {
    let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let route: Arc<Route> = Arc::new(route);
    let log2 = log.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let log = log2.clone();
        let route = route.clone();
        async move {
            let method = req.method().to_string();
            let content_type = req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let uri = req
                .uri()
                .path_and_query()
                .map(ToString::to_string)
                .unwrap_or_default();
            let bytes = req.into_body().collect_bytes().await?;
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let seen = Seen {
                method,
                uri,
                body,
                content_type,
            };
            let (code, answer) = route(&seen);
            log.lock().unwrap().push(seen);
            let resp = Response::builder()
                .status(StatusCode::from_u16(code).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap();
            Ok::<_, kube::Error>(resp)
        }
    });
    (kube::Client::new(svc, "default"), log)
}

/// A `Status` body for an error code.
pub fn status(code: u16, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code
    })
}
