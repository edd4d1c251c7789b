//! The API, called through the router (no socket): every route, every error,
//! and the atomicity of insert_if_new under concurrent requests.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use neardup_core::FingerprintConfig;
use neardup_core::index::plan;
use neardup_server::{App, Options, Protect, Settings};
use serde_json::{Value, json};
use tower::ServiceExt;

fn settings(bits: u32, max_k: u32) -> Settings {
    let config = FingerprintConfig {
        bits: neardup_core::Width::from_bits(bits).unwrap(),
        ..FingerprintConfig::default()
    };
    let p = plan(bits, max_k, 1e6, None).unwrap();
    Settings {
        config,
        max_k,
        design: neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone()),
        version: neardup_server::store::STORE_VERSION,
        verify: None,
        centring: None,
        planned_for: None,
    }
}

fn open(dir: &Path, options: Options) -> App {
    App::open(dir, || Ok(settings(64, 3)), options).unwrap()
}

async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call_with(router, method, uri, body.map(|b| b.to_string()), &[]).await
}

async fn call_with(
    router: &Router,
    method: &str,
    uri: &str,
    body: Option<String>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = router
        .clone()
        .oneshot(req.body(body.map_or_else(Body::empty, Body::from)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

const PAGE: &str = "The harbour master opened the gates at dawn, and the fishing boats went out one by one into the grey morning sea.";
const OTHER: &str = "A recipe for bread: flour, water, salt and yeast, kneaded for ten minutes and left to rise overnight in a cool place.";

#[tokio::test]
async fn documents_insert_check_query_get_delete() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path(), Options::default());
    let r = &app.router;
    let (s, b) = call(r, "POST", "/v1/documents", Some(json!({
        "documents": [
            {"id": "p1", "text": PAGE, "meta": {"url": "https://a.example/1", "title": "Harbour"}},
            {"id": "p2", "text": OTHER},
        ],
        "mode": "insert"
    }))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let res = b["results"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    assert_eq!(res[0]["id"], "p1");
    assert_eq!(res[0]["stored"], true);
    assert_eq!(res[0]["simhash"].as_str().unwrap().len(), 16);
    assert_eq!(res[1]["stored"], true);
    let p1_hex = res[0]["simhash"].as_str().unwrap().to_owned();

    // The same page again: insert_if_new refuses it and names p1, with its meta.
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({
            "documents": [{"id": "p1-copy", "text": PAGE}], "mode": "insert_if_new"
        })),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let res = &b["results"][0];
    assert_eq!(res["stored"], false);
    assert_eq!(
        res["duplicates"],
        json!([{"id": "p1", "distance": 0, "meta": {"url": "https://a.example/1", "title": "Harbour"}}])
    );

    // check stores nothing, and accepts fingerprints.
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({
            "documents": [{"id": "q", "simhash": p1_hex}], "mode": "check", "k": 0
        })),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["results"][0]["stored"], false);
    assert_eq!(b["results"][0]["duplicates"][0]["id"], "p1");
    let (s, _) = call(r, "GET", "/v1/documents/q", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Query by text and by fingerprint, with a limit.
    let (s, b) = call(r, "POST", "/v1/query", Some(json!({"text": PAGE}))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["matches"][0]["id"], "p1");
    assert_eq!(b["matches"].as_array().unwrap().len(), 1);
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"simhash": p1_hex, "k": 3, "limit": 0})),
    )
    .await;
    assert_eq!(b["matches"], json!([]));

    // GET returns the fingerprint and meta; DELETE removes it from search.
    let (s, b) = call(r, "GET", "/v1/documents/p1", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        b,
        json!({"id": "p1", "simhash": p1_hex, "meta": {"url": "https://a.example/1", "title": "Harbour"}})
    );
    let (s, b) = call(r, "DELETE", "/v1/documents/p1", None).await;
    assert_eq!(
        (s, b),
        (StatusCode::OK, json!({"id": "p1", "deleted": true}))
    );
    let (s, b) = call(r, "DELETE", "/v1/documents/p1", None).await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");
    let (_, b) = call(r, "POST", "/v1/query", Some(json!({"text": PAGE}))).await;
    assert_eq!(b["matches"], json!([]));
    // Now it is new again.
    let (_, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({
            "documents": [{"id": "p1-copy", "text": PAGE}], "mode": "insert_if_new"
        })),
    )
    .await;
    assert_eq!(b["results"][0]["stored"], true);

    let (s, b) = call(r, "GET", "/v1/stats", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["documents"], 2);
    assert_eq!(b["design"]["max_k"], 3);
    assert_eq!(b["design"]["kind"], "tables");
    assert_eq!(b["verification"], json!({"mode": "hamming"}));
    assert!(b["disk_bytes"].as_u64().unwrap() > 0);
    assert!(b["memory_bytes"].as_u64().unwrap() > 0);
    let (s, b) = call(r, "GET", "/healthz", None).await;
    assert_eq!(
        (s, b),
        (
            StatusCode::OK,
            json!({"status": "ok", "writes": "ok", "verification": {"mode": "hamming"}})
        )
    );
    let (s, b) = call(r, "GET", "/metrics", None).await;
    assert_eq!(s, StatusCode::OK);
    let text = b.as_str().unwrap();
    assert!(
        text.contains(
            "neardup_http_requests_total{route=\"/v1/documents\",method=\"POST\",status=\"200\"} 4"
        ),
        "{text}"
    );
    assert!(
        text.contains("neardup_http_request_duration_seconds_count{route=\"/v1/query\"} 3"),
        "{text}"
    );
    assert!(text.contains("neardup_documents 2"), "{text}");
}

#[tokio::test]
async fn every_bad_request_is_a_json_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(
        dir.path(),
        Options {
            max_body: 4096,
            ..Options::default()
        },
    );
    let r = &app.router;
    let post = |body: &str| call_with(r, "POST", "/v1/documents", Some(body.to_owned()), &[]);
    let (s, b) = post("{\"documents\": [").await;
    assert_error(s, &b, StatusCode::BAD_REQUEST, "malformed_json");
    let (s, b) = post("{\"documents\": [], \"extra\": 1}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    let (s, b) = post("{\"documents\": [{\"id\": \"a\", \"text\": \"x\", \"colour\": 1}]}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    let (s, b) = post("{\"documents\": [], \"mode\": \"upsert\"}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    let (s, b) = post("{\"documents\": [{\"id\": \"a\", \"simhash\": \"00ff\"}]}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_simhash");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("documents[0]")
    );
    let (s, b) =
        post(&json!({"documents": [{"id": "a", "simhash": "0".repeat(32)}]}).to_string()).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_simhash");
    let (s, b) =
        post("{\"documents\": [{\"id\": \"a\", \"simhash\": \"zzzzzzzzzzzzzzzz\"}]}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_simhash");
    // A prefix or a sign of the right length is not the schema's hex either.
    for bad in [
        "0x00000000000000ff",
        "+00000000000000ff",
        "+0x00000000000ff",
    ] {
        let (s, b) = post(&json!({"documents": [{"id": "a", "simhash": bad}]}).to_string()).await;
        assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_simhash");
    }
    let (s, b) = post("{\"documents\": [{\"id\": \"a\"}]}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_document");
    let (s, b) = post(
        "{\"documents\": [{\"id\": \"a\", \"text\": \"x\", \"simhash\": \"0000000000000000\"}]}",
    )
    .await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_document");
    let (s, b) = post("{\"documents\": [{\"id\": \"\", \"text\": \"x\"}]}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_id");
    let (s, b) = post("{\"documents\": [], \"k\": 4}").await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "k_too_large");
    let (s, b) =
        post(&json!({"documents": [{"id": "a", "text": "x".repeat(5000)}]}).to_string()).await;
    assert_error(s, &b, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    let (s, b) = call_with(r, "POST", "/v1/query", Some("[1, 2]".into()), &[]).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    let (s, b) = call(r, "POST", "/v1/query", Some(json!({}))).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_query");
    let (s, b) = call(r, "POST", "/v1/query", Some(json!({"text": "x", "k": 99}))).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "k_too_large");
    let (s, b) = call(r, "POST", "/v1/query", Some(json!({"text": "x", "k": -1}))).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_request");
    // No content type.
    let (s, b) = call_with(r, "POST", "/v1/query", None, &[]).await;
    assert_error(
        s,
        &b,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let (s, b) = call(r, "GET", "/v1/documents/nobody", None).await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");
    // An id whose percent-encoding is not UTF-8: JSON, like every error.
    for method in ["GET", "DELETE"] {
        let (s, b) = call(r, method, "/v1/documents/%FF%FE", None).await;
        assert_error(s, &b, StatusCode::BAD_REQUEST, "invalid_id");
    }
    // "mode": null is the default mode, insert_if_new.
    let doc = json!({"id": "m", "text": "a text sent twice with a null mode"});
    for stored in [true, false] {
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(json!({"documents": [doc], "mode": null})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["results"][0]["stored"], stored, "{b}");
    }
    let (s, b) = call(r, "GET", "/v2/anything", None).await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");
    let (s, b) = call(r, "PUT", "/v1/query", None).await;
    assert_error(s, &b, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    // Invalid UTF-8 in the body.
    let req = Request::builder()
        .method("POST")
        .uri("/v1/query")
        .header("content-type", "application/json")
        .body(Body::from(vec![b'{', b'"', b't', 0xff, b'"', b'}']))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    assert!(resp.status().is_client_error());
}

/// A collection of single-token fingerprints, where a text and the same words
/// in another order are one fingerprint: only verification tells them apart.
fn token_settings(verify: Option<f64>) -> Settings {
    let config = FingerprintConfig {
        features: "tokens".parse().unwrap(),
        ..FingerprintConfig::default()
    };
    let p = plan(64, 6, 1e5, None).unwrap();
    Settings {
        config,
        max_k: 6,
        design: neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone()),
        version: neardup_server::store::STORE_VERSION,
        verify,
        centring: None,
        planned_for: None,
    }
}

const LONG: &str = "The harbour master opened the gates at dawn, and the fishing boats went out one by \
    one into the grey morning sea, past the old lighthouse where the keeper was already painting \
    the railings white again, as he did every spring before the summer visitors arrived on the \
    ferry from the mainland with their bicycles, their dogs and their enormous picnic baskets.";

fn reversed(text: &str) -> String {
    text.split_whitespace().rev().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn verification_tells_reordered_words_from_near_copies() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path(), || Ok(token_settings(None)), Options::default()).unwrap();
    let r = &app.router;
    let post = |body: Value| call(r, "POST", "/v1/documents", Some(body));
    let (s, b) = post(json!({"documents": [{"id": "page", "text": LONG}], "mode": "insert"})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let verify = json!({"jaccard": 0.8});
    // The same words reversed: distance 0, but few shingles in common.
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": reversed(LONG)})),
    )
    .await;
    assert_eq!(b["matches"][0]["distance"], 0, "{b}");
    assert!(b["matches"][0].get("similarity").is_none(), "{b}");
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": reversed(LONG), "verify": verify})),
    )
    .await;
    assert_eq!(b["matches"], json!([]), "{b}");
    // A near copy (one word changed) is kept, with its estimated similarity.
    let near = LONG.replace("painting", "repainting");
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": near, "verify": verify})),
    )
    .await;
    let j = b["matches"][0]["similarity"].as_f64().unwrap();
    assert!(
        b["matches"][0]["id"] == "page" && (0.8..1.0).contains(&j),
        "{b}"
    );
    // insert_if_new and check decide by the verified matches.
    let (_, b) = post(json!({"documents": [{"id": "rev", "text": reversed(LONG)}],
        "mode": "insert_if_new", "verify": verify}))
    .await;
    assert_eq!(b["results"][0]["stored"], true, "{b}");
    let (_, b) = post(json!({"documents": [{"id": "near", "text": near}],
        "mode": "insert_if_new", "verify": verify}))
    .await;
    assert_eq!(b["results"][0]["stored"], false, "{b}");
    assert_eq!(b["results"][0]["duplicates"][0]["id"], "page", "{b}");
    // Within one request, a later document is checked against an earlier one.
    let (_, b) = post(json!({"documents": [{"id": "x1", "text": OTHER},
        {"id": "x2", "text": OTHER}], "mode": "insert_if_new", "verify": verify}))
    .await;
    assert_eq!(b["results"][0]["stored"], true, "{b}");
    assert_eq!(b["results"][1]["stored"], false, "{b}");
    assert_eq!(b["results"][1]["duplicates"][0]["similarity"], 1.0, "{b}");
    // A fingerprint cannot be verified; a threshold must be a similarity.
    let (s, b) = post(
        json!({"documents": [{"id": "h", "simhash": "0000000000000000"}],
        "verify": verify}),
    )
    .await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_document");
    let (s, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": LONG, "verify": {"jaccard": 1.5}})),
    )
    .await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_verify");
}

#[tokio::test]
async fn a_collection_default_verifies_and_fingerprints_match_by_distance() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(
        dir.path(),
        || Ok(token_settings(Some(0.8))),
        Options::default(),
    )
    .unwrap();
    let r = &app.router;
    let (_, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": [{"id": "page", "text": LONG}], "mode": "insert"})),
    )
    .await;
    let fp = b["results"][0]["simhash"].as_str().unwrap().to_owned();
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": reversed(LONG)})),
    )
    .await;
    assert_eq!(b["matches"], json!([]), "{b}");
    // Stored by fingerprint: no sketch, so matched by distance alone.
    call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": [{"id": "bare", "simhash": fp}], "mode": "insert"})),
    )
    .await;
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": reversed(LONG)})),
    )
    .await;
    assert_eq!(b["matches"].as_array().unwrap().len(), 1, "{b}");
    assert_eq!(b["matches"][0]["id"], "bare", "{b}");
    assert!(b["matches"][0].get("similarity").is_none(), "{b}");
    // The sketches survive a restart.
    drop(app);
    let app = App::open(dir.path(), || unreachable!(), Options::default()).unwrap();
    assert_eq!(app.settings.verify, Some(0.8));
    let (_, b) = call(
        &app.router,
        "POST",
        "/v1/query",
        Some(json!({"text": LONG, "limit": 5})),
    )
    .await;
    assert_eq!(b["matches"][0]["id"], "bare", "{b}");
    assert_eq!(b["matches"][1]["id"], "page", "{b}");
    assert_eq!(b["matches"][1]["similarity"], 1.0, "{b}");
}

/// A collection keeps the signatures it was made with: a text stored as
/// version 7 stored it (its signature of the stored key's shingles, read
/// apart from the fingerprint) is found as one stored now (of the words its
/// fingerprint reads), each with the texts' exact Jaccard similarity.
#[tokio::test]
async fn signatures_of_either_key_give_the_exact_similarity() {
    use neardup_core::jaccard::{jaccard, shingles_for};
    let near = LONG.replace("white", "blue").replace("dogs", "cats");
    let normalize = token_settings(None).config.normalize;
    let sorted = |t: &str| {
        let mut s = shingles_for(t, &normalize);
        s.sort_unstable();
        s.dedup();
        s
    };
    let want = jaccard(&sorted(LONG), &sorted(&near));
    assert!(want > 0.5 && want < 0.95, "{want}");
    for version_7 in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let create = || Ok(token_settings(Some(0.5)));
        if version_7 {
            drop(App::open(dir.path(), create, Options::default()).unwrap());
            let db =
                redb::Database::create(dir.path().join(neardup_server::store::DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(redb::TableDefinition::<&str, &str>::new("meta"))
                .unwrap()
                .insert("signatures", "compact")
                .unwrap();
            tx.commit().unwrap();
            drop(db);
            // Stored as version 7 stored a text.
            use neardup_server::store::{Store, Write};
            let (store, settings) = Store::open_or_create(dir.path(), create).unwrap();
            let fp = neardup_core::SimHasher::new(settings.config)
                .unwrap()
                .fingerprint(LONG);
            let sketch = neardup_core::sketch::Signature::of(&shingles_for(LONG, &normalize));
            store
                .commit(&[Write::Put {
                    id: "page",
                    fingerprint: &fp.value().to_le_bytes()[..8],
                    meta: None,
                    sketch: Some(&sketch),
                    shares: None,
                    vector: None,
                }])
                .unwrap();
        }
        let app = App::open(dir.path(), create, Options::default()).unwrap();
        let r = &app.router;
        if !version_7 {
            let (status, b) = call(
                r,
                "POST",
                "/v1/documents",
                Some(json!({"documents": [{"id": "page", "text": LONG}], "mode": "insert"})),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{b}");
        }
        let (_, b) = call(r, "POST", "/v1/query", Some(json!({"text": near}))).await;
        assert_eq!(b["matches"][0]["id"], "page", "version 7: {version_7}: {b}");
        let got = b["matches"][0]["similarity"].as_f64().unwrap();
        // (The API gives four decimals.)
        assert!(
            (got - want).abs() <= 5e-5,
            "version 7: {version_7}: {got} against {want}"
        );
    }
}

/// Against a large cluster of copies, answers are bounded: the nearest
/// matches up to the limit, and a flag saying there were more.
#[tokio::test]
async fn matches_are_bounded_per_document_and_query() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path(), Options::default());
    let r = &app.router;
    let copies: Vec<Value> = (0..150)
        .map(|i| json!({"id": format!("c{i:03}"), "text": PAGE}))
        .collect();
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": copies, "mode": "insert"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let check = |limit: Option<usize>| {
        let mut req = json!({"documents": [{"id": "q", "text": PAGE}], "mode": "check"});
        if let Some(l) = limit {
            req["limit"] = json!(l);
        }
        call(r, "POST", "/v1/documents", Some(req))
    };
    // Default: 100 of the 150, nearest first, ties by id.
    let (s, b) = check(None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let dups = b["results"][0]["duplicates"].as_array().unwrap();
    assert_eq!(dups.len(), 100);
    assert_eq!(dups[0]["id"], "c000");
    assert_eq!(dups[99]["id"], "c099");
    assert_eq!(b["results"][0]["truncated"], true);
    let (_, b) = check(Some(1000)).await;
    assert_eq!(b["results"][0]["duplicates"].as_array().unwrap().len(), 150);
    assert!(b["results"][0].get("truncated").is_none(), "{b}");
    let (s, b) = check(Some(1001)).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "limit_too_large");
    // Queries: every match up to 1000 by default, fewer when asked.
    let (_, b) = call(r, "POST", "/v1/query", Some(json!({"text": PAGE}))).await;
    assert_eq!(b["matches"].as_array().unwrap().len(), 150);
    assert!(b.get("truncated").is_none(), "{b}");
    let (_, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": PAGE, "limit": 7})),
    )
    .await;
    assert_eq!(b["matches"].as_array().unwrap().len(), 7);
    assert_eq!(b["truncated"], true);
    let (s, b) = call(
        r,
        "POST",
        "/v1/query",
        Some(json!({"text": PAGE, "limit": 5000})),
    )
    .await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "limit_too_large");
}

#[tokio::test]
async fn too_many_documents_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path(), Options::default());
    let docs: Vec<Value> = (0..neardup_server::api::MAX_DOCUMENTS + 1)
        .map(|i| json!({"id": i.to_string(), "simhash": "0000000000000000"}))
        .collect();
    let (s, b) = call(
        &app.router,
        "POST",
        "/v1/documents",
        Some(json!({"documents": docs})),
    )
    .await;
    assert_error(s, &b, StatusCode::PAYLOAD_TOO_LARGE, "too_many_documents");
}

#[tokio::test]
async fn the_token_protects_writes_or_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = open(
        dir.path(),
        Options {
            token: Some("s3cret".into()),
            ..Options::default()
        },
    );
    let write = json!({"documents": [{"id": "a", "text": PAGE}], "mode": "insert"}).to_string();
    let r = app.router.clone();
    let (s, b) = call_with(&r, "POST", "/v1/documents", Some(write.clone()), &[]).await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, b) = call_with(
        &r,
        "POST",
        "/v1/documents",
        Some(write.clone()),
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, _) = call_with(
        &r,
        "POST",
        "/v1/documents",
        Some(write.clone()),
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, b) = call(&r, "DELETE", "/v1/documents/a", None).await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    // Reads are open under --protect writes.
    let (s, _) = call(&r, "POST", "/v1/query", Some(json!({"text": PAGE}))).await;
    assert_eq!(s, StatusCode::OK);
    app.close();
    drop((app, r));

    let app = open(
        dir.path(),
        Options {
            token: Some("s3cret".into()),
            protect: Protect::All,
            ..Options::default()
        },
    );
    let (s, b) = call(&app.router, "GET", "/v1/documents/a", None).await;
    assert_error(s, &b, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, _) = call_with(
        &app.router,
        "GET",
        "/v1/documents/a",
        None,
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(&app.router, "GET", "/healthz", None).await;
    assert_eq!(s, StatusCode::OK);
}

/// Many clients submit the same page under different ids at once: exactly one
/// is stored, and every other answer names a stored duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn insert_if_new_is_atomic_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path(), Options::default());
    let router = Arc::new(app.router.clone());
    for round in 0..5 {
        let text = format!("{PAGE} Round {round} of the concurrency test, with its own words.");
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (r, text) = (Arc::clone(&router), text.clone());
                tokio::spawn(async move {
                    // Each is a near-identical copy: a word differs per client.
                    let body = json!({"documents": [{"id": format!("r{round}-c{i}"), "text": text}], "mode": "insert_if_new"});
                    call(&r, "POST", "/v1/documents", Some(body)).await
                })
            })
            .collect();
        let mut stored = 0;
        for t in tasks {
            let (s, b) = t.await.unwrap();
            assert_eq!(s, StatusCode::OK);
            let res = &b["results"][0];
            if res["stored"] == true {
                stored += 1;
                assert_eq!(res["duplicates"], json!([]));
            } else {
                assert!(!res["duplicates"].as_array().unwrap().is_empty());
            }
        }
        assert_eq!(stored, 1, "round {round}");
    }
    let (_, b) = call(&router, "GET", "/v1/stats", None).await;
    assert_eq!(b["documents"], 5);
}

/// Writes survive closing and reopening; the in-memory levels (recent, mid,
/// main, tombstones) answer exactly what a brute-force scan of the live
/// documents answers, across merges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_and_merges_keep_answers_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = neardup_core::rng::SplitMix64(7);
    let mut live: std::collections::BTreeMap<String, u64> = Default::default();
    {
        let app = open(dir.path(), Options::default());
        for batch in 0..6 {
            let mut docs = Vec::new();
            for i in 0..5000 {
                let fp = if i % 10 == 0 && !live.is_empty() {
                    // A near copy of an earlier document.
                    let base = *live.values().nth(rng.next() as usize % live.len()).unwrap();
                    base ^ (1 << (rng.next() % 64))
                } else {
                    rng.next()
                };
                let id = format!("d{batch}-{i}");
                live.insert(id.clone(), fp);
                docs.push(json!({"id": id, "simhash": format!("{fp:016x}")}));
            }
            let (s, _) = call(
                &app.router,
                "POST",
                "/v1/documents",
                Some(json!({"documents": docs, "mode": "insert"})),
            )
            .await;
            assert_eq!(s, StatusCode::OK);
            // Delete a few.
            for i in (0..5000).step_by(997) {
                let id = format!("d{batch}-{i}");
                let (s, _) =
                    call(&app.router, "DELETE", &format!("/v1/documents/{id}"), None).await;
                assert_eq!(s, StatusCode::OK);
                live.remove(&id);
            }
        }
        // Give the merger a moment, then compare.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        check_exact(&app.router, &live, &mut rng).await;
    }
    let app = open(dir.path(), Options::default());
    assert_eq!(app.loaded as usize, live.len());
    check_exact(&app.router, &live, &mut rng).await;
}

async fn check_exact(
    router: &Router,
    live: &std::collections::BTreeMap<String, u64>,
    rng: &mut neardup_core::rng::SplitMix64,
) {
    let fps: Vec<(&String, u64)> = live.iter().map(|(k, v)| (k, *v)).collect();
    for _ in 0..60 {
        let q = fps[rng.next() as usize % fps.len()].1 ^ (1 << (rng.next() % 64));
        let (_, b) = call(
            router,
            "POST",
            "/v1/query",
            Some(json!({"simhash": format!("{q:016x}")})),
        )
        .await;
        let mut got: Vec<(String, u64)> = b["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap().to_owned(),
                    m["distance"].as_u64().unwrap(),
                )
            })
            .collect();
        got.sort();
        let mut want: Vec<(String, u64)> = fps
            .iter()
            .filter_map(|(id, fp)| {
                let d = (fp ^ q).count_ones() as u64;
                (d <= 3).then(|| ((*id).clone(), d))
            })
            .collect();
        want.sort();
        assert_eq!(got, want);
    }
}

#[tokio::test]
async fn openapi_describes_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let app = open(dir.path(), Options::default());
    let (s, doc) = call(&app.router, "GET", "/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for (path, method) in [
        ("/v1/documents", "post"),
        ("/v1/documents/{id}", "get"),
        ("/v1/documents/{id}", "delete"),
        ("/v1/query", "post"),
        ("/v1/stats", "get"),
        ("/healthz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ] {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    // Every request example, sent as documented, gets the documented status.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(examples) =
                op["requestBody"]["content"]["application/json"]["examples"].as_object()
            else {
                continue;
            };
            for (name, ex) in examples {
                let (s, b) = call(
                    &app.router,
                    &method.to_uppercase(),
                    path,
                    Some(ex["value"].clone()),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{method} {path} example {name}: {b}");
            }
        }
    }
}

/// A disk that fills up on demand: while `full` is set, every write, growth
/// and sync of the database file fails with ENOSPC.
#[derive(Debug)]
struct FillingDisk {
    inner: redb::backends::FileBackend,
    full: Arc<std::sync::atomic::AtomicBool>,
}

impl FillingDisk {
    fn check(&self) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            Err(std::io::Error::from_raw_os_error(28)) // ENOSPC
        } else {
            Ok(())
        }
    }
}

impl redb::StorageBackend for FillingDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
}

/// A full disk fails the writes of that moment (503) and says so in
/// /healthz and /readyz; once it has room again the next write reopens the
/// store and succeeds, without a restart, and nothing acknowledged is lost.
#[tokio::test]
async fn a_full_disk_fails_writes_until_it_has_room_again() {
    use neardup_server::store::Opener;
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&full);
    let opener = Opener(Arc::new(move |path: &Path| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        redb::Builder::new().create_with_backend(FillingDisk {
            inner: redb::backends::FileBackend::new(file)?,
            full: Arc::clone(&f),
        })
    }));
    let app = open(
        dir.path(),
        Options {
            opener,
            ..Options::default()
        },
    );
    let r = &app.router;
    let insert =
        |id: &str, text: &str| json!({"documents": [{"id": id, "text": text}], "mode": "insert"});
    let (s, _) = call(r, "POST", "/v1/documents", Some(insert("a", PAGE))).await;
    assert_eq!(s, StatusCode::OK);

    full.store(true, Ordering::SeqCst);
    for i in 0..3 {
        let (s, b) = call(
            r,
            "POST",
            "/v1/documents",
            Some(insert(&format!("b{i}"), "other words entirely")),
        )
        .await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
        assert_eq!(b["error"]["code"], "storage_unavailable", "{b}");
    }
    let (s, b) = call(r, "GET", "/healthz", None).await;
    assert_eq!(
        (s, &b["writes"]),
        (StatusCode::OK, &json!("failing")),
        "{b}"
    );
    let (s, _) = call(r, "GET", "/readyz", None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);

    // Room again: the next write reopens the store and is committed.
    full.store(false, Ordering::SeqCst);
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(insert("c", "yet another text here")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call(r, "GET", "/readyz", None).await;
    assert_eq!(
        (s, b),
        (
            StatusCode::OK,
            json!({"status": "ok", "writes": "ok", "verification": {"mode": "hamming"}})
        )
    );
    for (id, want) in [
        ("a", StatusCode::OK),
        ("c", StatusCode::OK),
        ("b0", StatusCode::NOT_FOUND),
    ] {
        let (s, _) = call(r, "GET", &format!("/v1/documents/{id}"), None).await;
        assert_eq!(s, want, "{id}");
    }
    let (_, b) = call(r, "POST", "/v1/query", Some(json!({"text": PAGE}))).await;
    assert_eq!(b["matches"][0]["id"], "a", "{b}");
    drop(app);
    // Opened again from disk: the acknowledged documents, checksums sound.
    let app = open(dir.path(), Options::default());
    assert_eq!(app.loaded, 2);
}

/// Texts of unrelated words: `n` documents of about 150 words each, drawn
/// from a vocabulary of made-up words.
fn unrelated_texts(n: usize) -> Vec<String> {
    let mut r = neardup_core::rng::SplitMix64(0x5eed);
    let syllables = [
        "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "vu", "de", "zo", "ha",
    ];
    let vocabulary: Vec<String> = (0..600)
        .map(|_| {
            (0..2 + r.next() % 3)
                .map(|_| syllables[(r.next() % 12) as usize])
                .collect()
        })
        .collect();
    (0..n)
        .map(|_| {
            (0..150)
                .map(|_| vocabulary[(r.next() % 600) as usize].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// A verified 128-bit collection of texts that learns its centre from its
/// first `from` documents, on the uniform plan for `n` documents at k = 19,
/// planned again for `planned_for` (if any) once the centre is learned.
fn learning_settings(n: f64, from: usize, planned_for: Option<f64>) -> Settings {
    use neardup_core::index::{ONLINE_BYTES_PER_DOCUMENT, plan_online};
    Settings {
        config: FingerprintConfig::candidates(),
        max_k: 19,
        design: plan_online::<u128>(19, n, &[], ONLINE_BYTES_PER_DOCUMENT)
            .unwrap()
            .design()
            .clone(),
        version: neardup_server::store::STORE_VERSION,
        verify: Some(0.8),
        centring: Some(neardup_server::store::Centring::Learning { from: from as u64 }),
        planned_for,
    }
}

/// The mean of `texts`' shares: the centre a collection learns from them.
fn centre_of(hasher: &neardup_core::SimHasher, texts: &[String]) -> neardup_core::centre::Centre {
    let mut centre = neardup_core::centre::Centre::new(neardup_core::Width::W128);
    for t in texts {
        centre.add(hasher.shares(t).as_bytes());
    }
    centre
}

/// `/v1/stats` once the collection says its centre is learned (bounded wait).
async fn stats_once_centred(r: &Router) -> Value {
    let mut stats = Value::Null;
    for _ in 0..500 {
        stats = call(r, "GET", "/v1/stats", None).await.1;
        if stats["centring"]["mode"] == "centred" {
            return stats;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the centre was not learned: {stats}");
}

/// A verified collection that centres its texts' fingerprints keeps them
/// plain until `from` documents are stored by text; then the centre is the
/// mean of exactly those documents' shares, every one of them is stored
/// under its centred fingerprint, later documents too, near copies are
/// found before and after, and a restart keeps the centre.
#[tokio::test]
async fn a_collection_learns_its_centre_from_its_first_documents() {
    use neardup_core::{Fingerprint, SimHasher};
    const FROM: usize = 40;
    let settings = learning_settings(1e5, FROM, None);
    let hasher = SimHasher::new(settings.config.clone()).unwrap();
    let texts = unrelated_texts(60);
    let near = |i: usize| texts[i].replacen(' ', " extra ", 1);
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path(), || Ok(settings), Options::default()).unwrap();
    let r = &app.router;
    let stored_fp =
        |body: &Value| Fingerprint::parse_hex(body["simhash"].as_str().unwrap()).unwrap();
    let insert = |i: usize| {
        let body = json!({"documents": [{"id": format!("d{i}"), "text": &texts[i]}],
            "mode": "insert_if_new"});
        call(r, "POST", "/v1/documents", Some(body))
    };
    for i in 0..FROM - 1 {
        let (s, b) = insert(i).await;
        assert_eq!(
            (s, &b["results"][0]["stored"]),
            (StatusCode::OK, &json!(true)),
            "{b}"
        );
    }
    let (_, stats) = call(r, "GET", "/v1/stats", None).await;
    assert_eq!(
        stats["centring"],
        json!({"mode": "learning", "from": FROM}),
        "{stats}"
    );
    let (_, b) = call(r, "GET", "/v1/documents/d0", None).await;
    assert_eq!(
        stored_fp(&b),
        hasher.fingerprint(&texts[0]),
        "plain while learning"
    );
    let check = |i: usize| json!({"documents": [{"id": "q", "text": near(i)}], "mode": "check"});
    let (_, b) = call(r, "POST", "/v1/documents", Some(check(3))).await;
    assert_eq!(b["results"][0]["duplicates"][0]["id"], "d3", "{b}");
    // The document that completes the sample: the centre is learned after
    // its batch is committed (bounded wait).
    let (_, b) = insert(FROM - 1).await;
    assert_eq!(b["results"][0]["stored"], true, "{b}");
    let stats = stats_once_centred(r).await;
    assert_eq!(stats["centring"]["documents"], FROM, "{stats}");
    let centre = centre_of(&hasher, &texts[..FROM]);
    let want = |i: usize| centre.fingerprint(hasher.shares(&texts[i]).as_bytes());
    for i in 0..FROM {
        let (_, b) = call(r, "GET", &format!("/v1/documents/d{i}"), None).await;
        assert_eq!(stored_fp(&b), want(i), "d{i} rewritten centred");
    }
    // Centred fingerprints differ from plain ones: the rewrite is visible.
    assert!((0..FROM).any(|i| want(i) != hasher.fingerprint(&texts[i])));
    for i in FROM..texts.len() {
        let (_, b) = insert(i).await;
        assert_eq!(b["results"][0]["stored"], true, "{b}");
        assert_eq!(stored_fp(&b["results"][0]), want(i), "{b}");
    }
    for i in [3, 50] {
        let (_, b) = call(r, "POST", "/v1/documents", Some(check(i))).await;
        assert_eq!(
            b["results"][0]["duplicates"][0]["id"],
            format!("d{i}"),
            "{b}"
        );
        assert!(
            b["results"][0]["duplicates"][0]["similarity"]
                .as_f64()
                .unwrap()
                >= 0.8,
            "{b}"
        );
        assert_eq!(
            b["results"][0]["duplicates"].as_array().unwrap().len(),
            1,
            "{b}"
        );
    }
    drop(app);
    let app = App::open(
        dir.path(),
        || panic!("the collection exists"),
        Options::default(),
    )
    .unwrap();
    let r = &app.router;
    let (_, stats) = call(r, "GET", "/v1/stats", None).await;
    assert_eq!(
        stats["centring"],
        json!({"mode": "centred", "documents": FROM}),
        "{stats}"
    );
    let (_, b) = call(r, "POST", "/v1/documents", Some(check(50))).await;
    assert_eq!(b["results"][0]["duplicates"][0]["id"], "d50", "{b}");
    assert_eq!(
        stored_fp(&b["results"][0]),
        centre.fingerprint(hasher.shares(&near(50)).as_bytes())
    );
}

/// A collection that learns its centre plans its design again from the
/// centred fingerprints it learned from (for the size its settings were
/// planned for), serves on that design at once, and keeps it over a
/// restart.
#[tokio::test]
async fn a_learned_centre_plans_the_design_again() {
    use neardup_core::{Fingerprint, SimHasher};
    const FROM: usize = 1000;
    // Created on the uniform plan for a million, planned again for ten.
    let settings = learning_settings(1e6, FROM, Some(1e7));
    let created = settings.design.clone();
    let hasher = SimHasher::new(settings.config.clone()).unwrap();
    let texts = unrelated_texts(FROM + 1);
    let centre = centre_of(&hasher, &texts[..FROM]);
    let centred: Vec<[u8; 16]> = texts[..FROM]
        .iter()
        .map(|t| {
            let fp: Fingerprint = centre.fingerprint(hasher.shares(t).as_bytes());
            fp.value().to_le_bytes()
        })
        .collect();
    let want = settings.replanned(centred.iter().map(|b| b.as_slice()));
    assert_ne!(want, created, "the test needs a design that changes");
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path(), || Ok(settings), Options::default()).unwrap();
    let r = &app.router;
    for chunk in (0..FROM).collect::<Vec<_>>().chunks(100) {
        let docs: Vec<Value> = chunk
            .iter()
            .map(|&i| json!({"id": format!("d{i}"), "text": &texts[i]}))
            .collect();
        let body = json!({"documents": docs, "mode": "insert_if_new"});
        let (s, b) = call(r, "POST", "/v1/documents", Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let stats = stats_once_centred(r).await;
    assert_eq!(stats["design"]["description"], want.describe(), "{stats}");
    // Served on it: a near copy of a learned document is found.
    let near = texts[7].replacen(' ', " extra ", 1);
    let check = json!({"documents": [{"id": "q", "text": near}], "mode": "check"});
    let (_, b) = call(r, "POST", "/v1/documents", Some(check)).await;
    assert_eq!(b["results"][0]["duplicates"][0]["id"], "d7", "{b}");
    drop(app);
    let app = App::open(
        dir.path(),
        || panic!("the collection exists"),
        Options::default(),
    )
    .unwrap();
    let (_, stats) = call(&app.router, "GET", "/v1/stats", None).await;
    assert_eq!(stats["design"]["description"], want.describe(), "{stats}");
}

/// A verified collection of vectors keeps its vectors and answers by their
/// exact cosine: a stored vector's near copy (cosine 0.99) is found with its
/// cosine, one at cosine about 0.94 within the same Hamming reach is not, a
/// request may ask for its own threshold, and insert_if_new decides by it,
/// against stored documents and earlier ones of its own request alike.
#[tokio::test]
async fn a_collection_of_vectors_verifies_by_exact_cosine() {
    use neardup_core::index::{ONLINE_BYTES_PER_DOCUMENT, plan_online};
    use neardup_core::vector::cosine;
    const DIM: usize = 64;
    let design = plan_online::<u128>(16, 1e5, &[], ONLINE_BYTES_PER_DOCUMENT)
        .unwrap()
        .design()
        .clone();
    let settings = Settings {
        config: FingerprintConfig::vectors(neardup_core::Width::W128, Some(DIM), 7),
        max_k: 16,
        design,
        version: neardup_server::store::STORE_VERSION,
        verify: Some(0.95),
        centring: None,
        planned_for: None,
    };
    let mut r = neardup_core::rng::SplitMix64(17);
    let mut gauss = move || {
        // The sum of twelve uniforms, centred: close enough to normal.
        (0..12).map(|_| r.unit()).sum::<f64>() - 6.0
    };
    let base: Vec<f32> = (0..DIM).map(|_| gauss() as f32).collect();
    let noise: Vec<f32> = (0..DIM).map(|_| gauss() as f32).collect();
    // base + e * noise, of a chosen cosine with base (noise nearly orthogonal).
    let mix = |e: f32| -> Vec<f32> { base.iter().zip(&noise).map(|(b, n)| b + e * n).collect() };
    // The mix whose cosine with base is `c` (it falls as e grows), by bisection.
    let of_cosine = |c: f64| {
        let (mut lo, mut hi) = (0f32, 4f32);
        for _ in 0..60 {
            let e = (lo + hi) / 2.0;
            if cosine(&base, &mix(e)) > c {
                lo = e
            } else {
                hi = e
            }
        }
        mix(lo)
    };
    let near = of_cosine(0.99);
    let far = of_cosine(0.94);
    let (c_near, c_far) = (cosine(&base, &near), cosine(&base, &far));
    assert!(
        (c_near - 0.99).abs() < 1e-4 && (c_far - 0.94).abs() < 1e-4,
        "{c_near} {c_far}"
    );
    let dir = tempfile::tempdir().unwrap();
    let app = App::open(dir.path(), || Ok(settings), Options::default()).unwrap();
    let r = &app.router;
    let (_, stats) = call(r, "GET", "/v1/stats", None).await;
    assert_eq!(
        stats["verification"],
        json!({"mode": "verified", "cosine": 0.95}),
        "{stats}"
    );
    let (s, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": [{"id": "base", "vector": base}], "mode": "insert"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let query = |v: &Vec<f32>, verify: Option<Value>| {
        let mut body = json!({"vector": v, "k": 16});
        if let Some(t) = verify {
            body["verify"] = t;
        }
        call(r, "POST", "/v1/query", Some(body))
    };
    let (_, b) = query(&near, None).await;
    assert_eq!(b["matches"][0]["id"], "base", "{b}");
    let got = b["matches"][0]["similarity"].as_f64().unwrap();
    assert!((got - c_near).abs() < 1e-3, "{got} against {c_near}");
    // Not kept by its cosine, whatever its distance.
    let (_, b) = query(&far, None).await;
    assert_eq!(b["matches"], json!([]), "{b}");
    let (_, b) = query(&far, Some(json!({"cosine": 0.9}))).await;
    assert_eq!(b["matches"][0]["id"], "base", "{b}");
    let got = b["matches"][0]["similarity"].as_f64().unwrap();
    assert!((got - c_far).abs() < 1e-3, "{got} against {c_far}");
    // A text's measure is refused for vectors.
    let (s, b) = query(&far, Some(json!({"jaccard": 0.8}))).await;
    assert_error(s, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_verify");
    // insert_if_new: the near copy is refused, the far one stored; within
    // one request, a second near copy of a new vector is refused by the
    // first.
    let other: Vec<f32> = noise.iter().map(|x| -x).collect();
    let other_near: Vec<f32> = other.iter().zip(&base).map(|(o, b)| o + 0.1 * b).collect();
    let (_, b) = call(
        r,
        "POST",
        "/v1/documents",
        Some(json!({"documents": [
        {"id": "near", "vector": near}, {"id": "far", "vector": far},
        {"id": "other", "vector": other}, {"id": "other-near", "vector": other_near}],
        "mode": "insert_if_new"})),
    )
    .await;
    let stored: Vec<bool> = b["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["stored"] == true)
        .collect();
    assert_eq!(stored, [false, true, true, false], "{b}");
    assert_eq!(b["results"][3]["duplicates"][0]["id"], "other", "{b}");
    // The vectors survive a restart.
    drop(app);
    let app = App::open(
        dir.path(),
        || panic!("the collection exists"),
        Options::default(),
    )
    .unwrap();
    let (_, b) = call(
        &app.router,
        "POST",
        "/v1/query",
        Some(json!({"vector": near})),
    )
    .await;
    let base_match = b["matches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "base");
    assert!(
        base_match.unwrap()["similarity"].as_f64().unwrap() > 0.98,
        "{b}"
    );
}
