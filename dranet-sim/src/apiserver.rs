//! An in-memory Kubernetes API server for end-to-end tests: plain HTTP/1.1 on 127.0.0.1, served
//! by hyper (keep-alive, pipelining, chunked bodies), objects kept as JSON keyed by their
//! resource path. It serves what `dranet run`
//! uses in kube mode (Node GET; ResourceSlice apply / list by field selector / delete;
//! ResourceClaim GET, list (in a namespace or cluster-wide: adoption) and server-side apply of its
//! `status`; Event create and patch), answers anything else with a `NotFound` Status, and
//! records every request. Faults (hang, error code) can be switched on per path prefix.
//!
//! [`ApiServer::enforcing`] also does what a real API server enforces on these requests: RBAC
//! with the ClusterRole the shipped manifests bind to dranet's ServiceAccount
//! ([`crate::authz`]: a refusal is a 403 `Forbidden` `Status`), and the resource.k8s.io/v1
//! validation of slices and claim status ([`crate::limits`]: a 422 `Invalid` `Status`). The
//! kubeconfig's token is the ServiceAccount `kube-system/dranet`, bound to the node
//! [`SA_NODE`]. Test support only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Largest request head (request line + headers) accepted (hyper's read buffer).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Requests as the handlers see them
// ---------------------------------------------------------------------------------------------

/// One request, its body read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    /// The request target as sent (origin form: path and query).
    pub target: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// The first header of that (case-insensitive) name in `headers` (names stored lower-case).
fn header_in<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

impl HttpRequest {
    /// The first header of that (case-insensitive) name.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        header_in(&self.headers, name)
    }

    /// Path (percent-encoded, as sent) and raw query.
    #[must_use]
    pub fn path_and_query(&self) -> (&str, &str) {
        self.target.split_once('?').unwrap_or((&self.target, ""))
    }

    /// The head of a hyper request, with `body`.
    fn from_parts(parts: &hyper::http::request::Parts, body: Vec<u8>) -> Self {
        Self {
            method: parts.method.as_str().to_owned(),
            target: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
                    )
                })
                .collect(),
            body,
        }
    }
}

/// Decodes `%XX` escapes (and `+` as a space when `plus` is set: form-encoded queries).
#[must_use]
pub fn percent_decode(s: &str, plus: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw query as decoded pairs (empty pairs, as in `?&force=true`, are skipped).
#[must_use]
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Which TCP connection carried it (1, 2, ...): keep-alive shows as several per connection.
    pub conn: u64,
    pub method: String,
    /// Path, percent-decoded.
    pub path: String,
    /// Query, as sent.
    pub raw_query: String,
    /// Query, decoded.
    pub query: Vec<(String, String)>,
    pub content_type: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The answer's status code; `None` for a request left hanging.
    pub status: Option<u16>,
    /// Whether a route served it (false: the catch-all 404, or a malformed request).
    pub handled: bool,
    /// Since the server started.
    pub at: Duration,
    /// What the authorizer checked for it and whether it allowed it (empty when authorization
    /// is off or nothing was checked).
    pub checks: Vec<(crate::authz::Attributes, bool)>,
}

impl Recorded {
    /// The body as JSON (`Value::Null` when there is none or it is not JSON).
    #[must_use]
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The first query parameter of that name, decoded.
    #[must_use]
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        header_in(&self.headers, name)
    }
}

/// What the server does with requests under a path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Read the request, never answer (the connection stays open until the fault is cleared or
    /// the server stops, then it is closed without an answer).
    Hang,
    /// Answer with this code and a `Status` body.
    Code(u16),
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    log: Vec<Recorded>,
    /// Newest first.
    faults: Vec<(String, Fault)>,
    /// RBAC in force (`None`: everything allowed).
    authz: Option<crate::authz::Authorizer>,
    /// Validate written slices and claim status (422 when invalid).
    validate: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Held while a request is served (authorized, routed, recorded) and while tests read
    /// objects or the log: an object is never seen before the request that wrote it is logged,
    /// as with the real server, which answers a write before anyone can read it back.
    serving: Mutex<()>,
    started: Instant,
    seq: AtomicU64,
    conns: AtomicU64,
    /// Bumped whenever the faults change (hung connections look again).
    faults_changed: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn serving(&self) -> MutexGuard<'_, ()> {
        self.serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A running in-memory API server; stops when dropped.
pub struct ApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.inner.shutdown.send(true);
        self.accept.abort();
    }
}

/// The token of the user in [`ApiServer::write_kubeconfig`]: dranet's ServiceAccount.
pub const TOKEN: &str = "dranet-sim-token";
/// The user [`TOKEN`] authenticates as.
pub const SA_USER: &str = "system:serviceaccount:kube-system:dranet";
/// The node [`TOKEN`] is bound to (a service-account token of a pod on that node), for the
/// node-aware verbs.
pub const SA_NODE: &str = "sim-node";

impl ApiServer {
    /// Binds 127.0.0.1 on a free port and serves.
    pub async fn start() -> Result<Self> {
        Self::start_at("127.0.0.1:0".parse()?).await
    }

    /// Binds `addr` and serves (an API server that comes back on the address a kubeconfig
    /// names).
    pub async fn start_at(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the API server on {addr}"))?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            state: Mutex::default(),
            serving: Mutex::default(),
            started: Instant::now(),
            seq: AtomicU64::new(0),
            conns: AtomicU64::new(0),
            faults_changed: watch::channel(0).0,
            shutdown: watch::channel(false).0,
        });
        let i = inner.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let conn = i.conns.fetch_add(1, Ordering::Relaxed) + 1;
                tokio::spawn(serve_conn(i.clone(), sock, conn));
            }
        });
        Ok(Self { inner, addr, accept })
    }

    /// [`ApiServer::start`] with what a real API server enforces: RBAC with the ClusterRole of
    /// `deploy/rbac.yaml` bound to dranet's ServiceAccount, and the validation of slices and
    /// claim status.
    pub async fn enforcing() -> Result<Self> {
        Self::enforcing_at("127.0.0.1:0".parse()?).await
    }

    /// [`ApiServer::enforcing`] on `addr`.
    pub async fn enforcing_at(addr: SocketAddr) -> Result<Self> {
        let api = Self::start_at(addr).await?;
        api.set_authorizer(Some(crate::authz::Authorizer::shipped()?));
        api.set_validation(true);
        Ok(api)
    }

    /// RBAC from now on (`None`: everything allowed).
    pub fn set_authorizer(&self, authz: Option<crate::authz::Authorizer>) {
        self.inner.lock().authz = authz;
    }

    /// Validation of written slices and claim status from now on.
    pub fn set_validation(&self, on: bool) {
        self.inner.lock().validate = on;
    }

    /// Requests the authorizer refused.
    #[must_use]
    pub fn forbidden(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.status == Some(403))
            .collect()
    }

    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this server (cluster `sim`, user `sim` with [`TOKEN`], context
    /// `sim`, namespace `default`).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n\
             users:\n- name: sim\n  user:\n    token: {TOKEN}\ncontexts:\n- name: sim\n  context:\n    \
             cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\n",
            self.url()
        );
        std::fs::write(path, kc).with_context(|| format!("writing {}", path.display()))
    }

    /// Stores `value` at `path` (e.g. `/api/v1/nodes/node-a`), filling in `metadata.uid`,
    /// `resourceVersion` and `creationTimestamp` when missing.
    pub fn put(&self, path: &str, mut value: Value) {
        let rv = self.inner.next();
        stamp_new(&mut value, rv);
        self.inner.lock().objects.insert(normalize(path), value);
    }

    /// The object stored at `path`.
    #[must_use]
    pub fn get(&self, path: &str) -> Option<Value> {
        let _serving = self.inner.serving();
        self.inner.lock().objects.get(&normalize(path)).cloned()
    }

    /// Removes the object at `path`, returning it.
    pub fn remove(&self, path: &str) -> Option<Value> {
        self.inner.lock().objects.remove(&normalize(path))
    }

    /// Objects whose path starts with `prefix`, by path.
    #[must_use]
    pub fn objects_under(&self, prefix: &str) -> Vec<(String, Value)> {
        let _serving = self.inner.serving();
        self.inner
            .lock()
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every request so far, in arrival order.
    #[must_use]
    pub fn requests(&self) -> Vec<Recorded> {
        let _serving = self.inner.serving();
        self.inner.lock().log.clone()
    }

    /// Requests no route served (the catch-all 404 and malformed ones).
    #[must_use]
    pub fn unhandled(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| !r.handled).collect()
    }

    /// Requests under `path` (a prefix) with `method`.
    #[must_use]
    pub fn requests_to(&self, method: &str, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.starts_with(path))
            .collect()
    }

    /// Requests under `prefix` hang from now on.
    pub fn hang(&self, prefix: &str) {
        self.set_fault(prefix, Fault::Hang);
    }

    /// Requests under `prefix` are answered with `code` from now on.
    pub fn fail(&self, prefix: &str, code: u16) {
        self.set_fault(prefix, Fault::Code(code));
    }

    fn set_fault(&self, prefix: &str, fault: Fault) {
        {
            let mut st = self.inner.lock();
            st.faults.retain(|(p, _)| p != prefix);
            st.faults.insert(0, (prefix.to_owned(), fault));
        }
        self.inner.faults_changed.send_modify(|v| *v += 1);
    }

    /// Clears the fault of `prefix`.
    pub fn heal(&self, prefix: &str) {
        self.inner.lock().faults.retain(|(p, _)| p != prefix);
        self.inner.faults_changed.send_modify(|v| *v += 1);
    }

    /// Clears every fault.
    pub fn heal_all(&self) {
        self.inner.lock().faults.clear();
        self.inner.faults_changed.send_modify(|v| *v += 1);
    }

    /// Polls `check` every 10 ms until it returns `Some`, for at most `timeout`.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Option<T>,
    ) -> Result<T> {
        crate::fixtures::wait_for_some_every(what, timeout, Duration::from_millis(10), || check(self)).await
    }
}

/// The error that makes hyper close a connection without an answer (a hung request, healed or
/// shut down).
#[derive(Debug, thiserror::Error)]
#[error("closed without an answer")]
struct NoAnswer;

async fn serve_conn(inner: Arc<Inner>, sock: TcpStream, conn: u64) {
    let mut shutdown = inner.shutdown.subscribe();
    let svc = {
        let inner = inner.clone();
        hyper::service::service_fn(move |req| respond(inner.clone(), conn, req))
    };
    let served = hyper::server::conn::http1::Builder::new()
        // `Content-Length`, as a real API server (Go's net/http) spells it.
        .title_case_headers(true)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(sock), svc);
    tokio::select! {
        _ = served => {}
        _ = shutdown.changed() => {}
    }
}

/// Reads the body (at most [`MAX_BODY_BYTES`]), serves the request, or leaves it hanging.
async fn respond(
    inner: Arc<Inner>,
    conn: u64,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, NoAnswer> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(e) => {
            let req = HttpRequest::from_parts(&parts, Vec::new());
            record(&inner, conn, &req, Some(400), false);
            let body = status_body(400, "BadRequest", &format!("reading the request body: {e}"));
            let mut resp = json_response(400, &body);
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            return Ok(resp);
        }
    };
    let req = HttpRequest::from_parts(&parts, body);
    match handle(&inner, conn, &req) {
        Some((code, body)) => Ok(json_response(code, &body)),
        None => {
            let mut shutdown = inner.shutdown.subscribe();
            hang_until_healed(&inner, &req, &mut shutdown).await;
            Err(NoAnswer)
        }
    }
}

/// A JSON response with `code`.
fn json_response(code: u16, body: &Value) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::from(
        serde_json::to_vec(body).unwrap_or_default(),
    )));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn hang_until_healed(inner: &Inner, req: &HttpRequest, shutdown: &mut watch::Receiver<bool>) {
    let mut changed = inner.faults_changed.subscribe();
    let path = percent_decode(req.path_and_query().0, false);
    loop {
        if fault_for(&inner.lock(), &path) != Some(Fault::Hang) {
            return;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

fn fault_for(st: &State, path: &str) -> Option<Fault> {
    st.faults
        .iter()
        .find(|(p, _)| path.starts_with(p.as_str()))
        .map(|(_, f)| f.clone())
}

fn record(inner: &Inner, conn: u64, req: &HttpRequest, status: Option<u16>, handled: bool) {
    record_checked(inner, conn, req, status, handled, Vec::new());
}

fn record_checked(
    inner: &Inner,
    conn: u64,
    req: &HttpRequest,
    status: Option<u16>,
    handled: bool,
    checks: Vec<(crate::authz::Attributes, bool)>,
) {
    let (path, raw_query) = req.path_and_query();
    let rec = Recorded {
        conn,
        method: req.method.clone(),
        path: percent_decode(path, false),
        raw_query: raw_query.to_owned(),
        query: parse_query(raw_query),
        content_type: req.header("content-type").unwrap_or_default().to_owned(),
        headers: req.headers.clone(),
        body: req.body.clone(),
        status,
        handled,
        at: inner.started.elapsed(),
        checks,
    };
    inner.lock().log.push(rec);
}

/// Serves one request: `None` to leave it hanging.
fn handle(inner: &Inner, conn: u64, req: &HttpRequest) -> Option<(u16, Value)> {
    let _serving = inner.serving();
    let (raw_path, raw_query) = req.path_and_query();
    let path = percent_decode(raw_path, false);
    let fault = fault_for(&inner.lock(), &path);
    match fault {
        Some(Fault::Hang) => {
            record(inner, conn, req, None, true);
            return None;
        }
        Some(Fault::Code(code)) => {
            record(inner, conn, req, Some(code), true);
            return Some((code, status_body(code, "InternalError", "injected fault")));
        }
        None => {}
    }
    let query = parse_query(raw_query);
    let content_type = req.header("content-type").unwrap_or_default();
    let (checks, refusal) = authorize(inner, req, &path, &query, content_type);
    if let Some(body) = refusal {
        record_checked(inner, conn, req, Some(403), true, checks);
        return Some((403, body));
    }
    let (code, body, handled) = route(inner, &req.method, &path, &query, content_type, &req.body);
    record_checked(inner, conn, req, Some(code), handled, checks);
    Some((code, body))
}

/// RBAC, as the API server applies it to this request: the checks made (with their outcome)
/// and the 403 body of the first refusal.
fn authorize(
    inner: &Inner,
    req: &HttpRequest,
    path: &str,
    query: &[(String, String)],
    content_type: &str,
) -> (Vec<(crate::authz::Attributes, bool)>, Option<Value>) {
    use crate::authz::{Attributes, allocated_on, attributes, device_entries, drivers_in, forbidden};
    let st = inner.lock();
    let Some(authz) = &st.authz else {
        return (Vec::new(), None);
    };
    let Some(a) = attributes(&req.method, path, query) else {
        return (Vec::new(), None);
    };
    let bearer = req
        .header("authorization")
        .and_then(|h| h.strip_prefix("Bearer "));
    let (user, node) = if bearer == Some(TOKEN) {
        (SA_USER, Some(SA_NODE))
    } else {
        ("system:anonymous", None)
    };
    let mut checks = Vec::new();
    let mut check = |attrs: Attributes, message_attrs: &Attributes, extra: &str| {
        let ok = user == SA_USER && authz.allowing(&attrs).is_some();
        checks.push((attrs, ok));
        (!ok).then(|| forbidden(user, message_attrs, extra))
    };
    if let Some(r) = check(a.clone(), &a, "") {
        return (checks, Some(r));
    }
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let key = parse_target(path).map(|t| t.key());
    let existing = key.as_ref().and_then(|k| st.objects.get(k));
    // Server-side apply of an object that does not exist yet creates it: `create` too.
    if a.verb == "patch"
        && a.subresource.is_empty()
        && media == "application/apply-patch+yaml"
        && existing.is_none()
    {
        let c = Attributes {
            verb: "create".into(),
            ..a.clone()
        };
        if let Some(r) = check(c.clone(), &c, "") {
            return (checks, Some(r));
        }
    }
    // A claim status write that changes a driver's status.devices entries: the 1.36 granular
    // authorization of `resourceclaims/driver`, per driver, node-aware.
    if a.group == "resource.k8s.io"
        && a.resource == "resourceclaims"
        && a.subresource == "status"
        && matches!(a.verb.as_str(), "patch" | "update")
        && let Some(old) = existing
    {
        let new: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        for driver in drivers_in(old, &new) {
            if device_entries(old, &driver) == device_entries(&new, &driver) {
                continue;
            }
            let mode = if node.is_some_and(|n| allocated_on(old, n)) {
                "associated-node"
            } else {
                "arbitrary-node"
            };
            let verb = format!("{mode}:{}", a.verb);
            let g = Attributes {
                verb: verb.clone(),
                subresource: "driver".into(),
                name: driver.clone(),
                ..a.clone()
            };
            let shown = Attributes {
                verb: verb.clone(),
                subresource: "driver".into(),
                ..a.clone()
            };
            let extra = format!(
                "changing the status.devices entries of driver {driver:?} requires resource=\"resourceclaims/driver\" verb={verb:?} name={driver:?}"
            );
            if let Some(r) = check(g, &shown, &extra) {
                return (checks, Some(r));
            }
        }
    }
    (checks, None)
}

// ---------------------------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------------------------

/// A resource type the server knows.
struct Kind {
    api_version: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// Field selector labels supported besides `metadata.name` / `metadata.namespace`.
    fields: &'static [&'static str],
}

const KINDS: &[Kind] = &[
    Kind {
        api_version: "v1",
        resource: "nodes",
        kind: "Node",
        namespaced: false,
        fields: &["spec.unschedulable"],
    },
    Kind {
        api_version: "v1",
        resource: "events",
        kind: "Event",
        namespaced: true,
        fields: &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.uid",
            "reason",
            "type",
        ],
    },
    Kind {
        api_version: "resource.k8s.io/v1",
        resource: "resourceslices",
        kind: "ResourceSlice",
        namespaced: false,
        fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
    },
    Kind {
        api_version: "resource.k8s.io/v1",
        resource: "resourceclaims",
        kind: "ResourceClaim",
        namespaced: true,
        fields: &[],
    },
];

/// A request path taken apart.
struct Target<'a> {
    kind: &'a Kind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target<'_> {
    fn prefix(&self) -> String {
        if self.kind.api_version == "v1" {
            "/api/v1".to_owned()
        } else {
            format!("/apis/{}", self.kind.api_version)
        }
    }

    /// The key of the object (its path, without subresource).
    fn key(&self) -> String {
        let mut k = self.prefix();
        if let Some(ns) = &self.namespace {
            k.push_str(&format!("/namespaces/{ns}"));
        }
        k.push_str(&format!("/{}", self.kind.resource));
        if let Some(n) = &self.name {
            k.push_str(&format!("/{n}"));
        }
        k
    }

    fn group(&self) -> &str {
        self.kind.api_version.split_once('/').map_or("", |(g, _)| g)
    }
}

fn parse_target(path: &str) -> Option<Target<'static>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some((*n).to_owned()), None),
        [r, n, s] => (*r, Some((*n).to_owned()), Some((*s).to_owned())),
        _ => return None,
    };
    let kind = KINDS
        .iter()
        .find(|k| k.api_version == api_version && k.resource == resource)?;
    if kind.namespaced != namespace.is_some() && name.is_some() {
        return None;
    }
    if !kind.namespaced && namespace.is_some() {
        return None;
    }
    if name.as_deref().is_some_and(str::is_empty) {
        return None;
    }
    Some(Target {
        kind,
        namespace,
        name,
        subresource: sub,
    })
}

fn normalize(path: &str) -> String {
    let p = path.split('?').next().unwrap_or_default().trim_end_matches('/');
    if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("/{p}")
    }
}

/// A Kubernetes `Status` error body.
#[must_use]
pub fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn not_found(t: &Target) -> Value {
    let what = if t.group().is_empty() {
        t.kind.resource.to_owned()
    } else {
        format!("{}.{}", t.kind.resource, t.group())
    };
    let name = t.name.clone().unwrap_or_default();
    let mut s = status_body(404, "NotFound", &format!("{what} \"{name}\" not found"));
    s["details"] = json!({"name": name, "group": t.group(), "kind": t.kind.resource});
    s
}

/// RFC 3339 UTC, seconds.
fn now_rfc3339() -> String {
    dranet::report::rfc3339(SystemTime::now())
}

/// Fills in server-set metadata of a new object.
fn stamp_new(obj: &mut Value, rv: u64) {
    if !obj.is_object() {
        return;
    }
    let meta = obj
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    let Some(Value::Object(meta)) = meta else {
        return;
    };
    meta.entry("uid")
        .or_insert_with(|| json!(format!("00000000-0000-4000-8000-{rv:012x}")));
    meta.entry("creationTimestamp")
        .or_insert_with(|| json!(now_rfc3339()));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    if obj.get("spec").is_some() {
        obj["metadata"]
            .as_object_mut()
            .map(|m| m.entry("generation").or_insert(json!(1)));
    }
}

/// JSON merge patch (RFC 7386): objects merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            // Strategic-merge directives ($patch, $setElementOrder...) are not modelled.
            continue;
        }
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A patch of the `status` subresource: only the body's `status` counts.
fn merge_status(obj: &mut Value, patch: &Value) {
    if let (Some(s), Some(o)) = (patch.get("status"), obj.as_object_mut()) {
        merge(o.entry("status").or_insert(json!({})), s);
    }
}

fn field_value<'a>(obj: &'a Value, label: &str) -> Option<&'a Value> {
    label.split('.').try_fold(obj, |v, k| v.get(k))
}

fn value_str(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// `a=b,c!=d`: the requirements, or an error message.
fn field_selector(kind: &Kind, sel: &str) -> Result<Vec<(String, bool, String)>, String> {
    let mut out = Vec::new();
    for term in sel.split(',').filter(|t| !t.is_empty()) {
        let (label, eq, value) = if let Some((l, v)) = term.split_once("!=") {
            (l, false, v)
        } else if let Some((l, v)) = term.split_once("==") {
            (l, true, v)
        } else if let Some((l, v)) = term.split_once('=') {
            (l, true, v)
        } else {
            return Err(format!("invalid selector: '{sel}'; can't understand '{term}'"));
        };
        let label = label.trim();
        let known = label == "metadata.name"
            || (label == "metadata.namespace" && kind.namespaced)
            || kind.fields.contains(&label);
        if !known {
            return Err(format!("field label not supported: {label}"));
        }
        out.push((label.to_owned(), eq, value.trim().to_owned()));
    }
    Ok(out)
}

/// `k=v`, `k==v`, `k!=v`, `k`, `!k` (set-based selectors are not modelled).
fn label_matches(obj: &Value, sel: &str) -> Result<bool, String> {
    let labels = obj.pointer("/metadata/labels");
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    for term in sel.split(',').filter(|t| !t.is_empty()) {
        let term = term.trim();
        let ok = if let Some((k, v)) = term.split_once("!=") {
            get(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            get(k.trim()) == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            get(k.trim()).is_none()
        } else if term.contains(' ') || term.contains('(') {
            return Err(format!("unsupported label selector term {term:?}"));
        } else {
            get(term).is_some()
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn bad_request(msg: &str) -> (u16, Value, bool) {
    (400, status_body(400, "BadRequest", msg), true)
}

/// Checks `apiVersion`, `kind`, `metadata.name` and `metadata.namespace` of a body against the
/// URL, as the API server does.
fn check_body(t: &Target, body: &Value, name_required: bool) -> Result<(), (u16, Value, bool)> {
    if !body.is_object() {
        return Err(bad_request("the body is not a JSON object"));
    }
    let av = body.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    if av != t.kind.api_version || kind != t.kind.kind {
        return Err(bad_request(&format!(
            "the body is {av}/{kind}, the URL is for {}/{}",
            t.kind.api_version, t.kind.kind
        )));
    }
    let name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match &t.name {
        Some(url) if !name.is_empty() && name != url => {
            return Err(bad_request(&format!(
                "the name of the object ({name}) does not match the name on the URL ({url})"
            )));
        }
        _ => {}
    }
    if name_required && name.is_empty() && body.pointer("/metadata/generateName").is_none() {
        return Err(bad_request("name or generateName is required"));
    }
    let ns = body
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if let Some(url) = &t.namespace
        && !ns.is_empty()
        && ns != url
    {
        return Err(bad_request(&format!(
            "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({url})"
        )));
    }
    if t.namespace.is_none() && !ns.is_empty() {
        return Err(bad_request("a cluster-scoped object has no namespace"));
    }
    Ok(())
}

fn parse_body(body: &[u8]) -> Result<Value, (u16, Value, bool)> {
    serde_json::from_slice(body).map_err(|e| bad_request(&format!("the body is not JSON: {e}")))
}

/// Routes one request: status code, body, whether a route served it.
fn route(
    inner: &Inner,
    method: &str,
    path: &str,
    query: &[(String, String)],
    content_type: &str,
    body: &[u8],
) -> (u16, Value, bool) {
    let no_route = || {
        let msg = format!("the server could not find the requested resource ({method} {path})");
        (404, status_body(404, "NotFound", &msg), false)
    };
    let Some(t) = parse_target(path) else {
        return no_route();
    };
    let result = match (method, &t.name, t.subresource.as_deref()) {
        ("GET", Some(_), None) => Ok(get(inner, &t)),
        ("GET", None, None) if param(query, "watch").is_none_or(|w| w == "false" || w == "0") => {
            Ok(list(inner, &t, query))
        }
        ("POST", None, None) => Ok(create(inner, &t, body)),
        ("PATCH", Some(_), None | Some("status")) => Ok(patch(inner, &t, query, content_type, body)),
        ("DELETE", Some(_), None) => Ok(delete(inner, &t)),
        _ => Err(()),
    };
    result.unwrap_or_else(|()| no_route())
}

fn get(inner: &Inner, t: &Target) -> (u16, Value, bool) {
    match inner.lock().objects.get(&t.key()) {
        Some(o) => (200, o.clone(), true),
        None => (404, not_found(t), true),
    }
}

fn list(inner: &Inner, t: &Target, query: &[(String, String)]) -> (u16, Value, bool) {
    let fields = match field_selector(t.kind, param(query, "fieldSelector").unwrap_or_default()) {
        Ok(f) => f,
        Err(e) => return bad_request(&e),
    };
    let labels = param(query, "labelSelector").unwrap_or_default();
    let st = inner.lock();
    let mut items = Vec::new();
    for (key, obj) in &st.objects {
        let Some(kt) = parse_target(key) else { continue };
        if !std::ptr::eq(kt.kind, t.kind) || kt.name.is_none() {
            continue;
        }
        if t.namespace.is_some() && kt.namespace != t.namespace {
            continue;
        }
        if !fields
            .iter()
            .all(|(l, eq, v)| (value_str(field_value(obj, l)) == *v) == *eq)
        {
            continue;
        }
        match label_matches(obj, labels) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return bad_request(&e),
        }
        // As the API server encodes lists: items without their type meta.
        let mut item = obj.clone();
        if let Some(o) = item.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
        }
        items.push(item);
    }
    let rv = inner.seq.load(Ordering::Relaxed).to_string();
    (
        200,
        json!({
            "kind": format!("{}List", t.kind.kind),
            "apiVersion": t.kind.api_version,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }),
        true,
    )
}

fn create(inner: &Inner, t: &Target, body: &[u8]) -> (u16, Value, bool) {
    let mut obj = match parse_body(body) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if let Err(e) = check_body(t, &obj, true) {
        return e;
    }
    let ns = t.namespace.clone().unwrap_or_default();
    let rv = inner.next();
    let name = match obj.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_owned(),
        _ => {
            let base = value_str(obj.pointer("/metadata/generateName"));
            format!("{base}{rv:05x}")
        }
    };
    obj["metadata"]["name"] = json!(name);
    if t.kind.namespaced {
        obj["metadata"]["namespace"] = json!(ns);
    }
    let item = Target {
        kind: t.kind,
        namespace: t.namespace.clone(),
        name: Some(name.clone()),
        subresource: None,
    };
    let mut st = inner.lock();
    if let Some(r) = invalid_object(&st, t, &name, &obj) {
        return r;
    }
    if st.objects.contains_key(&item.key()) {
        let mut s = status_body(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", t.kind.resource),
        );
        s["details"] = json!({"name": name, "group": t.group(), "kind": t.kind.resource});
        return (409, s, true);
    }
    stamp_new(&mut obj, rv);
    st.objects.insert(item.key(), obj.clone());
    (201, obj, true)
}

fn patch(
    inner: &Inner,
    t: &Target,
    query: &[(String, String)],
    content_type: &str,
    body: &[u8],
) -> (u16, Value, bool) {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let status_only = t.subresource.as_deref() == Some("status");
    let patch = match parse_body(body) {
        Ok(v) => v,
        Err(e) => return e,
    };
    let key = t.key();
    match media {
        // Server-side apply. The body is YAML; a JSON body is YAML too (and all a client here
        // sends): anything else is refused rather than half-understood.
        "application/apply-patch+yaml" => {
            if param(query, "fieldManager").is_none_or(str::is_empty) {
                return bad_request(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                );
            }
            if let Err(e) = check_body(t, &patch, false) {
                return e;
            }
            let rv = inner.next();
            let mut st = inner.lock();
            let existing = st.objects.get(&key).cloned();
            if status_only {
                let Some(mut obj) = existing else {
                    return (404, not_found(t), true);
                };
                merge_status(&mut obj, &patch);
                if let Some(r) = invalid_status(&st, t, &obj) {
                    return r;
                }
                obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                st.objects.insert(key, obj.clone());
                return (200, obj, true);
            }
            let mut obj = patch;
            obj["metadata"]["name"] = json!(t.name.clone().unwrap_or_default());
            if let Some(ns) = &t.namespace {
                obj["metadata"]["namespace"] = json!(ns);
            }
            if let Some(r) = invalid_object(&st, t, &t.name.clone().unwrap_or_default(), &obj) {
                return r;
            }
            match existing {
                Some(old) => {
                    // Server-managed metadata survives the apply.
                    for k in ["uid", "creationTimestamp", "generation"] {
                        if let Some(v) = old.pointer(&format!("/metadata/{k}")) {
                            obj["metadata"][k] = v.clone();
                        }
                    }
                    if old.get("spec") != obj.get("spec") {
                        let g = old
                            .pointer("/metadata/generation")
                            .and_then(Value::as_i64)
                            .unwrap_or(0);
                        obj["metadata"]["generation"] = json!(g + 1);
                    }
                    if obj.get("status").is_none()
                        && let Some(s) = old.get("status")
                    {
                        obj["status"] = s.clone();
                    }
                    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                    st.objects.insert(key, obj.clone());
                    (200, obj, true)
                }
                None => {
                    stamp_new(&mut obj, rv);
                    st.objects.insert(key, obj.clone());
                    (201, obj, true)
                }
            }
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let rv = inner.next();
            let mut st = inner.lock();
            let Some(mut obj) = st.objects.get(&key).cloned() else {
                return (404, not_found(t), true);
            };
            if status_only {
                merge_status(&mut obj, &patch);
                if let Some(r) = invalid_status(&st, t, &obj) {
                    return r;
                }
            } else {
                merge(&mut obj, &patch);
            }
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            st.objects.insert(key, obj.clone());
            (200, obj, true)
        }
        other => (
            415,
            status_body(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: application/apply-patch+yaml, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                ),
            ),
            false,
        ),
    }
}

/// A 422 for a slice the real API server would refuse (validation on).
fn invalid_object(st: &State, t: &Target, name: &str, obj: &Value) -> Option<(u16, Value, bool)> {
    if !st.validate || t.kind.resource != "resourceslices" {
        return None;
    }
    let causes = crate::limits::resource_slice(obj);
    (!causes.is_empty()).then(|| {
        (
            422,
            crate::limits::invalid(t.kind.kind, t.group(), name, &causes),
            true,
        )
    })
}

/// A 422 for a claim status the real API server would refuse (validation on).
fn invalid_status(st: &State, t: &Target, obj: &Value) -> Option<(u16, Value, bool)> {
    if !st.validate || t.kind.resource != "resourceclaims" {
        return None;
    }
    let causes = crate::limits::claim_status(obj);
    (!causes.is_empty()).then(|| {
        (
            422,
            crate::limits::invalid(
                t.kind.kind,
                t.group(),
                t.name.as_deref().unwrap_or_default(),
                &causes,
            ),
            true,
        )
    })
}

fn delete(inner: &Inner, t: &Target) -> (u16, Value, bool) {
    match inner.lock().objects.remove(&t.key()) {
        Some(o) => (200, o, true),
        None => (404, not_found(t), true),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(
            parse_query("fieldSelector=spec.nodeName%3Dn%2Cspec.driver%3Ddra.net&a=b+c&&z"),
            vec![
                (
                    "fieldSelector".into(),
                    "spec.nodeName=n,spec.driver=dra.net".into()
                ),
                ("a".into(), "b c".into()),
                ("z".into(), String::new()),
            ]
        );
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%zz%41", false), "%zzA");
    }

    #[test]
    fn merge_patch_semantics() {
        let mut t = json!({"a": {"b": 1, "c": [1, 2]}, "d": 1});
        merge(&mut t, &json!({"a": {"c": [3], "e": 2}, "d": null}));
        assert_eq!(t, json!({"a": {"b": 1, "c": [3], "e": 2}}));
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let s = now_rfc3339();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }

    fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
        hay.get(from..)?
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    }

    async fn roundtrip(addr: SocketAddr, raw: &[u8], responses: usize) -> Vec<(u16, Value)> {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // Dribbled out in small writes: the server must reassemble.
        for c in raw.chunks(7) {
            s.write_all(c).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        while out.len() < responses {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed after {} responses", out.len());
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = find(&buf, b"\r\n\r\n", 0) {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                if buf.len() < end + 4 + len {
                    break;
                }
                let code: u16 = head[9..12].parse().unwrap();
                out.push((
                    code,
                    serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap(),
                ));
                buf.drain(..end + 4 + len);
            }
        }
        out
    }

    /// The real API server has answered a write before its client (or anyone) can read the
    /// object back, and tests read this log as "what was asked of the server". So an object is
    /// never visible before the request that made it is in the log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_object_is_never_visible_before_its_request_is_recorded() {
        let api = Arc::new(ApiServer::start().await.unwrap());
        let path = "/api/v1/namespaces/ns/events";
        let n = 100;
        let mut raw = Vec::new();
        for i in 0..n {
            let body = format!(
                r#"{{"apiVersion":"v1","kind":"Event","metadata":{{"name":"e{i}","namespace":"ns"}},"reason":"R","type":"Normal","involvedObject":{{"kind":"Pod","name":"p","namespace":"ns"}}}}"#
            );
            raw.extend_from_slice(
                format!(
                    "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, st) = (api.clone(), stop.clone());
        let poller = std::thread::spawn(move || {
            let mut early = Vec::new();
            while !st.load(Ordering::Relaxed) {
                let seen = a.objects_under(&format!("{path}/")).len();
                let logged = a.requests_to("POST", path).len();
                if seen > logged {
                    early.push((seen, logged));
                }
            }
            early
        });
        let got = roundtrip(api.addr(), &raw, n).await;
        stop.store(true, Ordering::Relaxed);
        let early = poller.join().unwrap();
        assert!(
            got.iter().all(|(c, _)| *c == 201),
            "{:?}",
            got.iter().map(|g| g.0).collect::<Vec<_>>()
        );
        assert_eq!(api.requests_to("POST", path).len(), n);
        assert!(
            early.is_empty(),
            "objects visible before their request was logged: {early:?}"
        );
    }

    #[tokio::test]
    async fn serves_pipelined_requests_on_one_connection() {
        let api = ApiServer::start().await.unwrap();
        api.put(
            "/api/v1/nodes/n",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "uid": "u"}}),
        );
        let slice = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},"spec":{"nodeName":"n","driver":"d","pool":{"name":"n"}}}"#;
        let mut raw = b"GET /api/v1/nodes/n HTTP/1.1\r\nhost: x\r\n\r\n".to_vec();
        raw.extend_from_slice(
            format!(
                "PATCH /apis/resource.k8s.io/v1/resourceslices/s?fieldManager=d&force=true HTTP/1.1\r\n\
                 content-type: application/apply-patch+yaml\r\ntransfer-encoding: chunked\r\n\r\n\
                 {:x}\r\n{slice}\r\n0\r\n\r\n",
                slice.len()
            )
            .as_bytes(),
        );
        raw.extend_from_slice(
            b"GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dn%2Cspec.driver%3Dd HTTP/1.1\r\n\r\n",
        );
        raw.extend_from_slice(
            b"GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dother HTTP/1.1\r\n\r\n",
        );
        raw.extend_from_slice(
            b"GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.bogus%3Dx HTTP/1.1\r\n\r\n",
        );
        raw.extend_from_slice(b"DELETE /apis/resource.k8s.io/v1/resourceslices/s HTTP/1.1\r\n\r\n");
        raw.extend_from_slice(b"GET /api/v1/pods HTTP/1.1\r\n\r\n");
        let got = roundtrip(api.addr(), &raw, 7).await;
        assert_eq!(got[0].0, 200);
        assert_eq!(got[0].1["metadata"]["uid"], "u");
        assert_eq!(got[1].0, 201);
        assert_eq!(got[1].1["metadata"]["generation"], 1);
        assert_eq!(got[2].0, 200);
        assert_eq!(got[2].1["kind"], "ResourceSliceList");
        assert_eq!(got[2].1["items"].as_array().unwrap().len(), 1);
        assert_eq!(got[3].1["items"].as_array().unwrap().len(), 0);
        assert_eq!(got[4].0, 400);
        assert_eq!(got[5].0, 200);
        assert_eq!(got[6].0, 404);
        assert_eq!(got[6].1["kind"], "Status");
        let reqs = api.requests();
        assert_eq!(reqs.len(), 7);
        assert!(reqs.iter().all(|r| r.conn == reqs[0].conn));
        assert_eq!(api.unhandled().len(), 1);
        assert!(api.get("/apis/resource.k8s.io/v1/resourceslices/s").is_none());
    }

    #[tokio::test]
    async fn claim_status_apply_merges_and_events_patch() {
        let api = ApiServer::start().await.unwrap();
        let path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c";
        api.put(
            path,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "c", "namespace": "ns"}, "spec": {},
                   "status": {"allocation": {"x": 1}}}),
        );
        let apply = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c","namespace":"ns"},"status":{"devices":[{"device":"d"}]}}"#;
        let ev = r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e1","namespace":"ns"},"reason":"R","count":1}"#;
        let evp = r#"{"count":2}"#;
        let raw = format!(
            "PATCH {path}/status?fieldManager=dra.net&force=true HTTP/1.1\r\ncontent-type: application/apply-patch+yaml\r\ncontent-length: {}\r\n\r\n{apply}\
             PATCH {path}/status HTTP/1.1\r\ncontent-type: application/apply-patch+yaml\r\ncontent-length: {}\r\n\r\n{apply}\
             POST /api/v1/namespaces/ns/events HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ev}\
             POST /api/v1/namespaces/ns/events HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ev}\
             PATCH /api/v1/namespaces/ns/events/e1 HTTP/1.1\r\ncontent-type: application/strategic-merge-patch+json\r\ncontent-length: {}\r\n\r\n{evp}\
             PATCH /api/v1/namespaces/ns/events/gone HTTP/1.1\r\ncontent-type: application/strategic-merge-patch+json\r\ncontent-length: {}\r\n\r\n{evp}",
            apply.len(),
            apply.len(),
            ev.len(),
            ev.len(),
            evp.len(),
            evp.len()
        );
        let got = roundtrip(api.addr(), raw.as_bytes(), 6).await;
        let codes: Vec<u16> = got.iter().map(|(c, _)| *c).collect();
        assert_eq!(codes, [200, 400, 201, 409, 200, 404]);
        assert_eq!(got[0].1["status"]["allocation"]["x"], 1);
        assert_eq!(got[0].1["status"]["devices"][0]["device"], "d");
        assert_eq!(got[3].1["reason"], "AlreadyExists");
        assert_eq!(api.get("/api/v1/namespaces/ns/events/e1").unwrap()["count"], 2);
    }

    #[tokio::test]
    async fn faults_hang_and_fail_by_prefix() {
        let api = ApiServer::start().await.unwrap();
        api.fail("/api/v1/nodes", 500);
        let got = roundtrip(api.addr(), b"GET /api/v1/nodes/n HTTP/1.1\r\n\r\n", 1).await;
        assert_eq!(got[0].0, 500);
        api.hang("/api/v1/nodes");
        let mut s = TcpStream::connect(api.addr()).await.unwrap();
        s.write_all(b"GET /api/v1/nodes/n HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut b = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await;
        assert!(r.is_err(), "a hung request got an answer");
        api.wait_for("the hung request recorded", Duration::from_secs(2), |a| {
            a.requests().iter().find(|r| r.status.is_none()).map(|_| ())
        })
        .await
        .unwrap();
        api.heal_all();
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "healed: the hung connection closes without an answer");
        let got = roundtrip(api.addr(), b"GET /api/v1/nodes/n HTTP/1.1\r\n\r\n", 1).await;
        assert_eq!(got[0].0, 404);
    }
}
