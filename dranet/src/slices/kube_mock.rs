//! A scripted exchange for unit tests: a tower service behind `kube::Client::new` that records
//! every request and answers from a routing function or a fixed script of steps (this reply to
//! the n-th request, then a hang). It is not a second API server: it holds no objects and
//! enforces nothing. The stateful simulator with RBAC, object limits and faults is
//! `dranet-sim`'s `apiserver` (on hyper), which every integration test uses; dranet's own unit
//! tests cannot reach it (`dranet-sim` depends on `dranet`), and they need exact request orders
//! and per-request faults, which a script states directly.

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
            let seen = seen_of(req).await?;
            let (code, answer) = route(&seen);
            log.lock().unwrap().push(seen);
            Ok::<_, kube::Error>(json_response(code, &answer))
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

/// What the scripted server does with the request of a [`Step`].
enum Reply {
    /// Answer with this code and body.
    Json(u16, serde_json::Value),
    /// Answer with this code and the request's own body (server-side apply returns the object).
    Echo(u16),
    /// Never answer (the connection stays open): a hung API server.
    Hang,
}

type Check = Box<dyn Fn(&Seen) + Send + Sync>;

/// One request a [`scenario`] expects, in order, and the answer it gets.
pub struct Step {
    method: &'static str,
    path: String,
    query: Vec<String>,
    check: Option<Check>,
    reply: Reply,
}

impl Step {
    fn new(method: &'static str, path: &str) -> Self {
        Self {
            method,
            path: path.to_owned(),
            query: Vec::new(),
            check: None,
            reply: Reply::Json(500, status(500, "step without a reply")),
        }
    }
    pub fn get(path: &str) -> Self {
        Self::new("GET", path)
    }
    pub fn patch(path: &str) -> Self {
        Self::new("PATCH", path)
    }
    pub fn delete(path: &str) -> Self {
        Self::new("DELETE", path)
    }
    /// The query string must contain `part` (as sent, percent-encoded).
    pub fn query(mut self, part: &str) -> Self {
        self.query.push(part.to_owned());
        self
    }
    /// Further assertions on the request (they run in the server; a failed one fails the scenario).
    pub fn check(mut self, f: impl Fn(&Seen) + Send + Sync + 'static) -> Self {
        self.check = Some(Box::new(f));
        self
    }
    pub fn reply(mut self, code: u16, body: serde_json::Value) -> Self {
        self.reply = Reply::Json(code, body);
        self
    }
    pub fn echo(mut self, code: u16) -> Self {
        self.reply = Reply::Echo(code);
        self
    }
    pub fn hang(mut self) -> Self {
        self.reply = Reply::Hang;
        self
    }
    fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

type ReplyTx = tokio::sync::oneshot::Sender<Response<Body>>;
type Pending = (Seen, ReplyTx);

/// Drives a [`scenario`]: every step must arrive in order, each within the step timeout, and
/// nothing may arrive after the last one.
pub struct Verifier {
    task: tokio::task::JoinHandle<(Vec<Seen>, Vec<ReplyTx>)>,
    extra: Arc<Mutex<Vec<Seen>>>,
}

impl Verifier {
    /// Waits for the scenario to end (at most the step timeout per step) and returns what was
    /// seen; panics with the step that failed.
    pub async fn done(self) -> Vec<Seen> {
        // The replies of hanging steps are dropped (answered 500) only when this returns, so
        // the code under test meets the hang for as long as it waits.
        let (seen, _hung) = match self.task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("scenario task: {e}"),
        };
        // Give a request that would follow the last step a moment to show up.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let extra = self.extra.lock().unwrap();
        assert!(
            extra.is_empty(),
            "requests after the scenario's last step: {:?}",
            extra
                .iter()
                .map(|s| format!("{} {}", s.method, s.uri))
                .collect::<Vec<_>>()
        );
        seen
    }
}

/// A client whose requests must follow `steps` in order, each within `step_timeout` of the
/// previous one; see [`Verifier::done`].
pub fn scenario(steps: Vec<Step>, step_timeout: std::time::Duration) -> (kube::Client, Verifier) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Pending>();
    let extra: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let extra2 = extra.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let tx = tx.clone();
        let extra = extra2.clone();
        async move {
            let seen = seen_of(req).await?;
            let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
            if let Err(e) = tx.send((seen, reply_tx)) {
                let (seen, _) = e.0;
                extra.lock().unwrap().push(seen);
                return Ok(json_response(
                    500,
                    &status(500, "request after the scenario ended"),
                ));
            }
            match reply_rx.await {
                Ok(resp) => Ok(resp),
                // The verifier failed (its panic says why) or ended while a step hung.
                Err(_) => Ok::<_, kube::Error>(json_response(500, &status(500, "scenario aborted"))),
            }
        }
    });
    let task = tokio::spawn(async move {
        let mut seen_all = Vec::new();
        // Replies of hanging steps, kept so their requests never get an answer.
        let mut hung = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            let Ok(next) = tokio::time::timeout(step_timeout, rx.recv()).await else {
                panic!(
                    "scenario step {i} ({}): no request within {step_timeout:?}",
                    step.describe()
                );
            };
            let Some((seen, reply)) = next else {
                panic!("scenario step {i} ({}): the client went away", step.describe());
            };
            let (path, query) = seen.uri.split_once('?').unwrap_or((seen.uri.as_str(), ""));
            assert!(
                seen.method == step.method && path == step.path,
                "scenario step {i}: expected {}, got {} {}",
                step.describe(),
                seen.method,
                seen.uri
            );
            for q in &step.query {
                assert!(
                    query.contains(q.as_str()),
                    "scenario step {i} ({}): query {query:?} lacks {q:?}",
                    step.describe()
                );
            }
            if let Some(check) = &step.check {
                check(&seen);
            }
            match step.reply {
                Reply::Json(code, body) => {
                    let _ = reply.send(json_response(code, &body));
                }
                Reply::Echo(code) => {
                    let _ = reply.send(json_response(code, &seen.body));
                }
                Reply::Hang => hung.push(reply),
            }
            seen_all.push(seen);
        }
        (seen_all, hung)
    });
    (kube::Client::new(svc, "default"), Verifier { task, extra })
}

async fn seen_of(req: Request<Body>) -> Result<Seen, kube::Error> {
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
    Ok(Seen {
        method,
        uri,
        body,
        content_type,
    })
}

fn json_response(code: u16, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}
