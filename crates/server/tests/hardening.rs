//! Bounds and failure modes of the service: replies bounded in bytes, a
//! vector collection's dimension fixed, a dead writer reported, damaged
//! settings refused, requests answered while the collection opens, and
//! connections over the limit answered. Sockets bind 127.0.0.1 only; every
//! loop is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use neardup_core::FingerprintConfig;
use neardup_core::index::plan;
use neardup_server::{App, Limits, Options, Settings};
use serde_json::{Value, json};
use tower::ServiceExt;

fn settings(config: FingerprintConfig) -> Settings {
    let bits = config.bits.bits();
    let p = plan(bits, 3, 1e6, None).unwrap();
    Settings {
        config,
        max_k: 3,
        design: neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone()),
        version: neardup_server::store::STORE_VERSION,
        verify: None,
        centring: None,
        planned_for: None,
    }
}

fn texts() -> Settings {
    settings(FingerprintConfig::default())
}

async fn call_raw(
    router: &Router,
    method: &str,
    uri: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    call_raw(router, method, uri, body, &[]).await
}

/// Matches carry their stored `meta`: a reply stops adding them at
/// --max-body bytes, and says it was cut short.
#[tokio::test]
async fn replies_are_bounded_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let max_body = 128 << 10;
    let app = App::open(
        dir.path(),
        || Ok(texts()),
        Options {
            max_body,
            ..Options::default()
        },
    )
    .unwrap();
    let r = &app.router;
    let big = "m".repeat(5000);
    for part in 0..2 {
        let docs: Vec<Value> = (0..20)
            .map(|i| {
                json!({"id": format!("d{part}-{i:02}"), "simhash": "00000000000000ff", "meta": {"blob": big}})
            })
            .collect();
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(json!({"documents": docs, "mode": "insert"})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        // Each document matches those stored before it: the second request's
        // 20 documents match 20 to 39 metas of 5 KB (3 MB); the reply stays
        // within the limit.
        assert!(b.to_string().len() <= max_body, "{}", b.to_string().len());
        let res = b["results"].as_array().unwrap();
        assert_eq!(res.len(), 20);
        if part == 1 {
            assert!(res.iter().all(|r| r["stored"] == true));
            assert!(res.iter().any(|r| r["truncated"] == true), "{b}");
        }
    }
    let (s, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"simhash": "00000000000000ff", "limit": 1000})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let n = b["matches"].as_array().unwrap().len();
    assert!(n > 0 && n < 40, "{n} matches");
    assert_eq!(b["truncated"], true);
    assert!(b.to_string().len() <= max_body, "{}", b.to_string().len());
}

/// A collection of vectors without --dim takes its dimension from its first
/// vector stored, keeps it over a restart, and refuses other dimensions (and
/// over-long vectors before any dimension is fixed) with a 422 naming them.
#[tokio::test]
async fn the_first_vector_fixes_the_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let vectors = || {
        Ok(settings(FingerprintConfig::vectors(
            neardup_core::Width::W64,
            None,
            0,
        )))
    };
    let insert =
        |id: &str, v: Vec<f32>| json!({"documents": [{"id": id, "vector": v}], "mode": "insert"});
    {
        let app = App::open(dir.path(), vectors, Options::default()).unwrap();
        let r = &app.router;
        let (s, b) = call(
            r,
            "POST",
            "/v1/query",
            Some(json!({"vector": vec![1.0f32; 70_000]})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(
            b["error"]["message"].as_str().unwrap().contains("70000"),
            "{b}"
        );
        // Two dimensions in one request: refused whole.
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(json!({"documents": [
                {"id": "a", "vector": [1.0, 2.0, 3.0, 4.0]},
                {"id": "b", "vector": [1.0, 2.0, 3.0]},
            ], "mode": "insert"})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(insert("a", vec![1.0, 2.0, 3.0, 4.0])),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        for v in [vec![1.0, 2.0, 3.0], vec![1.0, 2.0, 3.0, 4.0, 5.0]] {
            let (s, b) = call(r, "POST", "/v1/documents", Some(insert("b", v.clone()))).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
            assert!(
                b["error"]["message"].as_str().unwrap().contains("have 4"),
                "{b}"
            );
            let (s, b) = call(r, "POST", "/v1/query", Some(json!({"vector": v}))).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        }
    }
    let app = App::open(dir.path(), || unreachable!(), Options::default()).unwrap();
    let r = &app.router;
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(insert("c", vec![1.0, 2.0, 3.0])),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"vector": [1.0, 2.0, 3.0, 4.5]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["matches"][0]["id"], "a", "{b}");
    let (_, b) = call(r, "GET", "/v1/stats", None).await;
    assert_eq!(b["documents"], 1, "{b}");
}

fn boom(id: &str) {
    if id == "boom" {
        panic!("an injected failure of the writer");
    }
}

/// A writer thread that dies takes /healthz and /readyz to 503; writes are
/// refused as `writer_stopped`, not as a shutdown.
#[tokio::test]
async fn a_dead_writer_fails_the_health_checks() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(
        dir.path(),
        || Ok(texts()),
        Options {
            writer_fault: Some(boom),
            ..Options::default()
        },
    )
    .unwrap();
    let r = &app.router;
    let write = |id: &str| json!({"documents": [{"id": id, "simhash": "0000000000000001"}]});
    let (s, b) = call(r, "POST", "/v1/documents", Some(write("fine"))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    for route in ["/healthz", "/readyz"] {
        assert_eq!(call(r, "GET", route, None).await.0, StatusCode::OK);
    }
    let (s, b) = call(r, "POST", "/v1/documents", Some(write("boom"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    for route in ["/healthz", "/readyz"] {
        let (s, b) = call(r, "GET", route, None).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{route}: {b}");
        assert_eq!(b["writes"], "stopped", "{b}");
    }
    let (s, b) = call(r, "POST", "/v1/documents", Some(write("later"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_eq!(b["error"]["code"], "writer_stopped", "{b}");
    // Reads still work.
    let (s, _) = call(r, "GET", "/v1/documents/fine", None).await;
    assert_eq!(s, StatusCode::OK);
}

/// One changed byte in the settings record (the seed, the verification
/// threshold) is refused at open, naming the fix.
#[test]
fn damaged_settings_are_refused() {
    use redb::{Database, ReadableTable, TableDefinition};
    const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
    for (from, to) in [("\"seed\":0", "\"seed\":1"), ("0.8", "0.9")] {
        let dir = tempfile::tempdir().unwrap();
        let mut s = texts();
        s.verify = Some(0.8);
        drop(App::open(dir.path(), || Ok(s), Options::default()).unwrap());
        {
            let db = Database::create(dir.path().join(neardup_server::store::DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(META).unwrap();
                let text = t.get("settings").unwrap().unwrap().value().to_owned();
                assert!(text.contains(from), "{text}");
                t.insert("settings", text.replacen(from, to, 1).as_str())
                    .unwrap();
            }
            tx.commit().unwrap();
        }
        let e = App::open(dir.path(), || unreachable!(), Options::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("settings are damaged") && e.contains("restore"),
            "{e}"
        );
    }
}

/// Duplicate ids in one request are refused; a body starting with a
/// byte-order mark is read; a declared length over the limit is refused
/// before the body is asked for.
#[tokio::test]
async fn small_request_rules() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path(), || Ok(texts()), Options::default()).unwrap();
    let r = &app.router;
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": [
            {"id": "x", "simhash": "0000000000000001"},
            {"id": "x", "simhash": "0000000000000002"},
        ]})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(b["error"]["code"], "duplicate_id", "{b}");
    let mut body = b"\xef\xbb\xbf".to_vec();
    body.extend_from_slice(br#"{"simhash": "0000000000000001"}"#);
    let (s, b) = call_raw(r, "POST", "/v1/query", body, &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call_raw(
        r,
        "POST",
        "/v1/query",
        Vec::new(),
        &[("content-length", "1000000000"), ("expect", "100-continue")],
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{b}");
}

/// One raw HTTP/1.1 exchange: the whole answer as text (empty if the
/// connection was closed without one).
fn exchange(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(request.as_bytes());
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

const READYZ: &str = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// While the collection opens, every request is answered 503 with
/// Retry-After (`"status": "loading"` from /readyz), then served.
#[test]
fn readyz_answers_503_while_loading() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let path = dir.path().to_owned();
    let server = runtime.spawn(neardup_server::serve_opening(
        listener,
        Limits::default(),
        move || {
            wait.recv().unwrap();
            App::open(&path, || Ok(texts()), Options::default()).map_err(std::io::Error::other)
        },
        async {
            let _ = stopped.await;
        },
        |_| {},
    ));
    let answer = exchange(addr, READYZ);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("\"loading\""), "{answer}");
    go.send(()).unwrap();
    // Bounded: the collection is empty and opens at once.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = exchange(addr, READYZ);
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(answer.contains("loading"), "{answer}");
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
}

/// A connection over the limit is answered 503 with Retry-After, not closed
/// without a word.
#[test]
fn connections_over_the_limit_are_answered_503() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let app = App::open(dir.path(), || Ok(texts()), Options::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let server = runtime.spawn(neardup_server::serve(
        app,
        listener,
        limits,
        async {
            let _ = stopped.await;
        },
        |_| {},
    ));
    // The one slot, held by a keep-alive connection that has been served.
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    held.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    held.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let answer = exchange(addr, READYZ);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
}

/// Replies waiting for their clients are bounded in memory as a whole:
/// while eight replies of the largest size are held unread, the next large
/// one is answered 503 `busy` with Retry-After; once they are read (or
/// dropped), it is served.
#[tokio::test]
async fn unread_replies_are_bounded_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let max_body = 256 << 10;
    let app = App::open(
        dir.path(),
        || Ok(texts()),
        Options {
            max_body,
            ..Options::default()
        },
    )
    .unwrap();
    let r = &app.router;
    let big = "m".repeat(20_000);
    for part in 0..3 {
        let docs: Vec<Value> = (0..10)
            .map(|i| json!({"id": format!("d{part}-{i}"), "simhash": "00000000000000ff", "meta": {"blob": big}}))
            .collect();
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(json!({"documents": docs, "mode": "insert"})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let query = || {
        Request::builder()
            .method("POST")
            .uri("/v1/query")
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"simhash": "00000000000000ff", "limit": 1000}"#,
            ))
            .unwrap()
    };
    // Each answer is cut at --max-body (30 metas of 20 KB would be 600 KB):
    // the 2 MiB of reply memory (8 x 256 KiB) holds eight.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..12 {
        let resp = r.clone().oneshot(query()).await.unwrap();
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            refused = Some(resp);
            break;
        }
        assert_eq!(resp.status(), StatusCode::OK);
        held.push(resp);
    }
    assert_eq!(
        held.len(),
        8,
        "{} replies held before a refusal",
        held.len()
    );
    let refused = refused.expect("a ninth large reply was refused");
    assert_eq!(refused.headers()["retry-after"], "1");
    let bytes = refused.into_body().collect().await.unwrap().to_bytes();
    let b: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(b["error"]["code"], "busy", "{b}");
    // One is read (and let go): its memory is back.
    let first = held
        .remove(0)
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert!(first.len() > 200_000, "{}", first.len());
    drop(first);
    let resp = r.clone().oneshot(query()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    drop(held);
    drop(resp);
    let resp = r.clone().oneshot(query()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}
