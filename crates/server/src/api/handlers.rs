//! The routes' handlers: documents in (insert, check, insert_if_new, with
//! verification), queries, get and delete, statistics, health, metrics and
//! the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use neardup_core::index::Bits;
use neardup_core::index::bits::word_of;
use neardup_core::{Fingerprint, Input, InputKind};

use crate::collection::Found;
use crate::error::{ApiError, ServiceError};
use crate::store::Signatures;
use crate::writer::{
    Evidence, Job, JobSender, Mode, NewDoc, Outcome, candidates, predecide, verify_found,
};
use neardup_core::jaccard::shingles_for;
use neardup_core::sketch::Signature;

use super::*;

impl<B: Bits> Service<B> {
    pub(super) fn check_k(&self, k: Option<u32>) -> Result<u32, ApiError> {
        let max = self.settings.max_k;
        match k {
            None => Ok(max),
            Some(k) if k <= max => Ok(k),
            Some(k) => Err(ApiError::bad_request(
                "k_too_large",
                format!("k = {k} is larger than this collection's maximum k = {max}"),
            )),
        }
    }

    pub(super) fn parse_simhash(&self, hex: &str) -> Result<B, ApiError> {
        let width = self.settings.config.bits;
        let digits = width.bits() as usize / 4;
        if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ApiError::bad_request(
                "invalid_simhash",
                format!(
                    "simhash {:?} is not {digits} hex digits (0-9, a-f, no prefix or sign): \
                     this collection holds {}-bit fingerprints",
                    hex.chars().take(40).collect::<String>(),
                    width.bits()
                ),
            ));
        }
        Fingerprint::parse_hex_width(hex, width)
            .and_then(word_of::<B>)
            .map_err(|e| {
                ApiError::bad_request(
                    "invalid_simhash",
                    format!(
                        "{e}: this collection holds {}-bit fingerprints ({} hex digits)",
                        width.bits(),
                        width.bits() / 4
                    ),
                )
            })
    }

    pub(super) fn hex(&self, fp: B) -> String {
        Fingerprint::new(fp.to_u128(), self.settings.config.bits).to_string()
    }

    /// Matches with their stored metadata, as many as fit in `budget` bytes
    /// of reply (taken from it); `true` when some were left out. A reply is
    /// bounded in bytes as well as in matches, whatever `meta` is stored.
    pub(super) fn with_meta(
        &self,
        found: Vec<Found>,
        budget: &mut usize,
    ) -> Result<(Vec<MatchOut>, bool), ApiError> {
        if found.is_empty() {
            return Ok((Vec::new(), false));
        }
        let ids: Vec<&str> = found.iter().map(|f| &*f.id).collect();
        let metas = self.store.metas(&ids)?;
        let mut out = Vec::with_capacity(found.len());
        for (f, m) in found.into_iter().zip(metas) {
            // The id (escaped, at worst 6 bytes a byte), the meta as stored
            // (compact JSON) and the fields around them.
            let bytes = 6 * f.id.len() + m.as_ref().map_or(0, Vec::len) + 96;
            if bytes > *budget {
                return Ok((out, true));
            }
            *budget -= bytes;
            out.push(MatchOut {
                id: f.id,
                distance: f.distance,
                similarity: f.similarity.map(|j| (j * 1e4).round() / 1e4),
                meta: m.and_then(|bytes| serde_json::from_slice(&bytes).ok()),
            });
        }
        Ok((out, false))
    }

    /// Whether the collection keeps its documents' vectors: a verified
    /// collection of vectors.
    pub(super) fn keeps_vectors(&self) -> bool {
        self.settings.similarity() == "cosine" && self.settings.verify.is_some()
    }

    /// The verification threshold of a request: its own (`jaccard` for
    /// texts, `cosine` for vectors), else the collection's default, else
    /// none.
    pub(super) fn threshold(&self, asked: Option<VerifyIn>) -> Result<Option<f64>, ApiError> {
        let vectors = self.settings.similarity() == "cosine";
        let (name, t) = match asked {
            None => return Ok(self.settings.verify),
            Some(VerifyIn {
                jaccard: Some(t),
                cosine: None,
            }) if !vectors => ("jaccard", t),
            Some(VerifyIn {
                jaccard: None,
                cosine: Some(t),
            }) if vectors => ("cosine", t),
            Some(_) if vectors => {
                return Err(ApiError::bad_request(
                    "invalid_verify",
                    "this collection holds vectors: verify by their cosine, \
                     \"verify\": {\"cosine\": S}",
                ));
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "invalid_verify",
                    "verify texts by their Jaccard similarity: \"verify\": {\"jaccard\": T}",
                ));
            }
        };
        if !(t > 0.0 && t <= 1.0) {
            return Err(ApiError::bad_request(
                "invalid_verify",
                format!("verify.{name} {t} is out of range: use a similarity in (0, 1], e.g. 0.8"),
            ));
        }
        if vectors && !self.keeps_vectors() {
            return Err(ApiError::bad_request(
                "invalid_verify",
                "this collection keeps no vectors (created with --no-verify): its matches \
                 are decided by Hamming distance alone; drop \"verify\"",
            ));
        }
        Ok(Some(t))
    }

    pub(super) fn sender(&self) -> Result<JobSender<B>, ApiError> {
        if self.control.dead.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.gone().into());
        }
        self.jobs
            .read()
            .expect("jobs lock")
            .clone()
            .ok_or_else(|| ServiceError::ShuttingDown.into())
    }

    /// Why the writer did not answer: it stopped, or the service is closing.
    pub(super) fn gone(&self) -> ServiceError {
        if self.control.dead.load(std::sync::atomic::Ordering::SeqCst) {
            ServiceError::WriterStopped
        } else {
            ServiceError::ShuttingDown
        }
    }
}

/// One content's fingerprint (plain), what it is verified by (a text's
/// signature; a vector, in a verified collection of vectors) and, in a
/// collection that centres texts, its shares (a text's).
pub(super) type Fingerprinted<B> = (usize, B, Option<Evidence>, Option<Box<[u8]>>);

/// Fingerprints of documents' contents, with a text's verification sketch,
/// off the async threads when there is real work; a content the collection
/// cannot fingerprint (a vector of another dimension, a text for a collection
/// of vectors, a NaN) is a 422 (`invalid_document`) naming it.
pub(super) async fn fingerprint_contents<B: Bits>(
    s: &Arc<Service<B>>,
    contents: Vec<(usize, Content)>,
    place: fn(usize) -> String,
) -> Result<Vec<Fingerprinted<B>>, ApiError> {
    // Vectors are checked against the collection's dimension before any
    // work that scales with them (the hyperplanes are dimension x bits).
    let fixed = s.control.dim.load(std::sync::atomic::Ordering::SeqCst);
    let mut first: Option<usize> = None;
    for (i, c) in &contents {
        if let Content::Vector(v) = c {
            let want = match (fixed, first) {
                (0, None) if v.len() > MAX_DIMENSION => {
                    return Err(ApiError::bad_request(
                        "invalid_document",
                        format!(
                            "{}: a vector of {} dimensions: at most {MAX_DIMENSION} are taken",
                            place(*i),
                            v.len()
                        ),
                    ));
                }
                (0, None) => {
                    first = Some(v.len());
                    continue;
                }
                (0, Some(f)) => f,
                (f, _) => f,
            };
            if v.len() != want {
                let whose = if fixed == 0 {
                    "this request's first vector has"
                } else {
                    "this collection's vectors have"
                };
                return Err(ApiError::bad_request(
                    "invalid_document",
                    format!(
                        "{}: a vector of {} dimensions, but {whose} {want}",
                        place(*i),
                        v.len()
                    ),
                ));
            }
        }
    }
    let work: usize = contents
        .iter()
        .map(|(_, c)| match c {
            Content::Text(t) => t.len(),
            Content::Vector(v) => v.len() * 64,
            Content::Features(f) => f.len() * 64,
        })
        .sum();
    let s2 = Arc::clone(s);
    let centres = s.settings.centring.is_some();
    let keeps_vectors = s.keeps_vectors();
    let words = s.store.signatures() == Signatures::CompactOfWords;
    let job = move || {
        contents
            .into_iter()
            .map(|(i, c)| {
                let input = match &c {
                    Content::Text(t) => Input::Text(t),
                    Content::Vector(v) => Input::Vector(v),
                    Content::Features(f) => Input::Features(f),
                };
                // A text's signature, when the collection's are of the
                // shingles its fingerprints read: from the same reading.
                let mut read_once = None;
                let (fp, shares) = match input {
                    Input::Text(t)
                        if (centres || words) && s2.hasher.config().input == InputKind::Text =>
                    {
                        let (fp, shares) = if words {
                            let mut shingles = Vec::new();
                            let both = s2.hasher.fingerprint_shares_and_shingles(t, &mut shingles);
                            read_once = Some(Signature::of(&shingles));
                            both
                        } else {
                            s2.hasher.fingerprint_and_shares(t)
                        };
                        (
                            Ok(fp),
                            centres.then(|| Box::<[u8]>::from(shares.as_bytes())),
                        )
                    }
                    input => (s2.hasher.fingerprint_input(input), None),
                };
                let fp = fp.map_err(|e| {
                    ApiError::bad_request("invalid_document", format!("{}: {e}", place(i)))
                })?;
                let evidence = match c {
                    Content::Text(t) => {
                        Some(Evidence::Text(Box::new(read_once.unwrap_or_else(|| {
                            let normalize = &s2.hasher.config().normalize;
                            Signature::of(&shingles_for(&t, normalize))
                        }))))
                    }
                    Content::Vector(v) if keeps_vectors => Some(Evidence::Vector(v.into())),
                    _ => None,
                };
                Ok((
                    i,
                    word_of::<B>(fp).expect("the hasher's width is the collection's"),
                    evidence,
                    shares,
                ))
            })
            .collect::<Result<Vec<_>, ApiError>>()
    };
    if work < 64 * 1024 {
        job()
    } else {
        tokio::task::spawn_blocking(job).await.map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "fingerprinting was interrupted",
            )
        })?
    }
}

pub(super) async fn post_documents<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    ApiJson(req): ApiJson<DocumentsRequest>,
) -> Result<Json<Value>, ApiError> {
    let k = s.check_k(req.k)?;
    let limit = match_limit(req.limit, DEFAULT_DOCUMENT_MATCHES)?;
    let verify = s.threshold(req.verify)?;
    if req.documents.len() > MAX_DOCUMENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_documents",
            format!(
                "{} documents in one request: send at most {MAX_DOCUMENTS}",
                req.documents.len()
            ),
        ));
    }
    let mut seen: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(req.documents.len());
    for (i, d) in req.documents.iter().enumerate() {
        if req.mode == Mode::Check {
            break;
        }
        if let Some(first) = seen.insert(&d.id, i) {
            return Err(ApiError::bad_request(
                "duplicate_id",
                format!(
                    "documents[{i}]: id {:?} is also documents[{first}]: send each id once a request",
                    d.id.chars().take(80).collect::<String>()
                ),
            ));
        }
    }
    drop(seen);
    let mut fps: Vec<Option<B>> = vec![None; req.documents.len()];
    let mut texts = Vec::new();
    let mut dims: Vec<Option<usize>> = vec![None; req.documents.len()];
    let mut metas = Vec::with_capacity(req.documents.len());
    let mut ids = Vec::with_capacity(req.documents.len());
    for (i, d) in req.documents.into_iter().enumerate() {
        let place = format!("documents[{i}]");
        if d.id.is_empty() || d.id.len() > MAX_ID_BYTES {
            return Err(ApiError::bad_request(
                "invalid_id",
                format!("{place}: an id is 1 to {MAX_ID_BYTES} bytes of text"),
            ));
        }
        let body = BodyIn {
            text: d.text,
            simhash: d.simhash,
            vector: d.vector,
            features: d.features,
        };
        match body.split() {
            Ok(Err(content)) => {
                if let Content::Vector(v) = &content {
                    dims[i] = Some(v.len());
                }
                texts.push((i, content))
            }
            Ok(Ok(_)) if req.verify.is_some() => {
                return Err(ApiError::bad_request(
                    "invalid_document",
                    format!("{place}: \"verify\" compares texts; send the document's \"text\""),
                ));
            }
            Ok(Ok(h)) => {
                fps[i] = Some(s.parse_simhash(&h).map_err(|mut e| {
                    e.message = format!("{place}: {}", e.message);
                    e
                })?)
            }
            Err(msg) => {
                return Err(ApiError::bad_request(
                    "invalid_document",
                    format!("{place}: {msg}"),
                ));
            }
        }
        metas.push(
            d.meta
                .map(|m| serde_json::to_vec(&m).expect("JSON serialises")),
        );
        ids.push(d.id);
    }
    let mut evidence: Vec<Option<Evidence>> = vec![None; fps.len()];
    let mut shares: Vec<Option<Box<[u8]>>> = vec![None; fps.len()];
    for (i, fp, ev, sh) in fingerprint_contents(&s, texts, |i| format!("documents[{i}]")).await? {
        fps[i] = Some(fp);
        evidence[i] = ev;
        shares[i] = sh;
    }
    let fps: Vec<B> = fps
        .into_iter()
        .map(|f| f.expect("every document has one"))
        .collect();
    let outcomes: Vec<Outcome<B>> = if req.mode == Mode::Check {
        // Verification reads stored evidence (possibly from disk): off the
        // async threads. Index look-ups alone take microseconds: in place.
        let reads_store = verify.is_some() && evidence.iter().any(Option::is_some);
        let s2 = Arc::clone(&s);
        let fps2 = fps.clone();
        let run = move || {
            fps2.iter()
                .zip(&evidence)
                .zip(&shares)
                .map(|((&plain, evidence), shares)| {
                    let verified = verify.is_some() && evidence.is_some();
                    let cap = candidates(limit, verified);
                    let (fp, found, more, _) =
                        s2.collection
                            .nearest_text(plain, shares.as_deref(), k, cap, |_| false);
                    let duplicates = match (verify, evidence) {
                        (Some(t), Some(e)) => verify_found(&s2.store, found, e, t, |_| None)?,
                        _ => found,
                    };
                    Ok(Outcome {
                        fp,
                        stored: false,
                        duplicates,
                        truncated: more,
                    })
                })
                .collect::<Result<Vec<_>, ServiceError>>()
        };
        if fps.len() > 64 || reads_store {
            tokio::task::spawn_blocking(run).await.map_err(|_| {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "interrupted")
            })??
        } else {
            run()?
        }
    } else {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut docs: Vec<NewDoc<B>> = ids
            .iter()
            .zip(&fps)
            .zip(metas)
            .zip(evidence)
            .zip(dims)
            .zip(shares)
            .map(|(((((id, &fp), meta), evidence), dim), shares)| NewDoc {
                id: id.clone(),
                fp,
                meta,
                evidence,
                dim,
                shares,
                pre: None,
            })
            .collect();
        let sender = s.sender()?;
        // Each document searched by the search threads, and read against
        // what the writer applied since: the writer's one thread is left the
        // writes.
        let (searched, done) = tokio::sync::oneshot::channel();
        let s2 = Arc::clone(&s);
        s.searchers.spawn(move || {
            predecide(&s2.store, &s2.collection, &mut docs, k, verify);
            let _ = searched.send(docs);
        });
        let docs = done
            .await
            .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "interrupted"))?;
        let job = Job::Upsert {
            docs,
            mode: req.mode,
            k,
            verify,
            limit,
            reply: tx,
        };
        // The queue is bounded: wait for room off the async threads.
        tokio::task::spawn_blocking(move || sender.send(job))
            .await
            .map_err(|_| s.gone())?
            .map_err(|_| s.gone())?;
        rx.await.map_err(|_| s.gone())??
    };
    let mut results = Vec::with_capacity(ids.len());
    // Every document's result is answered; matches fill what is left of
    // --max-body after the results themselves.
    let mut budget = s
        .max_body
        .saturating_sub(ids.iter().map(|i| 6 * i.len() + 128).sum());
    for (id, mut o) in ids.into_iter().zip(outcomes) {
        let fp = o.fp;
        let mut truncated = o.truncated || o.duplicates.len() > limit;
        o.duplicates.truncate(limit);
        let (duplicates, cut) = s.with_meta(o.duplicates, &mut budget)?;
        truncated |= cut;
        results.push(DocResult {
            id,
            simhash: s.hex(fp),
            stored: o.stored,
            duplicates,
            truncated,
        });
    }
    Ok(Json(serde_json::json!({ "results": results })))
}

pub(super) async fn post_query<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    ApiJson(req): ApiJson<QueryRequest>,
) -> Result<Json<Value>, ApiError> {
    let k = s.check_k(req.k)?;
    let limit = match_limit(req.limit, MAX_MATCHES)?;
    let verify = s.threshold(req.verify)?;
    let body = BodyIn {
        text: req.text,
        simhash: req.simhash,
        vector: req.vector,
        features: req.features,
    };
    let (fp, evidence, shares) = match body.split() {
        Ok(Err(content)) => {
            let (_, fp, evidence, shares) =
                fingerprint_contents(&s, vec![(0, content)], |_| "the query".into())
                    .await?
                    .remove(0);
            (fp, evidence, shares)
        }
        Ok(Ok(_)) if req.verify.is_some() => {
            return Err(ApiError::bad_request(
                "invalid_query",
                "\"verify\" compares texts; query with \"text\"",
            ));
        }
        Ok(Ok(h)) => (s.parse_simhash(&h)?, None, None),
        Err(msg) => return Err(ApiError::bad_request("invalid_query", msg)),
    };
    let cap = candidates(limit, verify.is_some() && evidence.is_some());
    let (_, mut found, mut truncated, _) =
        s.collection
            .nearest_text(fp, shares.as_deref(), k, cap, |_| false);
    if let (Some(t), Some(e)) = (verify, evidence) {
        let s2 = Arc::clone(&s);
        found =
            tokio::task::spawn_blocking(move || verify_found(&s2.store, found, &e, t, |_| None))
                .await
                .map_err(|_| {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "interrupted")
                })??;
    }
    truncated |= found.len() > limit;
    found.truncate(limit);
    let mut budget = s.max_body;
    let (matches, cut) = s.with_meta(found, &mut budget)?;
    truncated |= cut;
    let mut out = serde_json::json!({ "matches": matches });
    if truncated {
        out["truncated"] = Value::Bool(true);
    }
    Ok(Json(out))
}

pub(super) async fn get_document<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    DocId(id): DocId,
) -> Result<Json<Value>, ApiError> {
    let Some(r) = s.store.get(&id)? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no document with id {id:?}"),
        ));
    };
    let fp = B::read_le(&r.fingerprint);
    let mut out = serde_json::json!({"id": id, "simhash": s.hex(fp)});
    if let Some(m) = r
        .meta
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    {
        out["meta"] = m;
    }
    Ok(Json(out))
}

pub(super) async fn delete_document<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    DocId(id): DocId,
) -> Result<Json<Value>, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sender = s.sender()?;
    let job = Job::Delete {
        id: id.clone(),
        reply: tx,
    };
    tokio::task::spawn_blocking(move || sender.send(job))
        .await
        .map_err(|_| s.gone())?
        .map_err(|_| s.gone())?;
    let existed = rx.await.map_err(|_| s.gone())??;
    if !existed {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no document with id {id:?}"),
        ));
    }
    Ok(Json(serde_json::json!({"id": id, "deleted": true})))
}

pub(super) async fn stats<B: Bits>(State(s): State<Arc<Service<B>>>) -> Json<Value> {
    let l = s.collection.levels();
    Json(serde_json::json!({
        "documents": l.documents,
        "fingerprints": l.main + l.mid + l.recent - l.tombstones.min(l.main + l.mid + l.recent),
        "design": design(&s.settings, &s.collection.design()),
        "verification": verification(&s.settings),
        "centring": centring(&s),
        "config": s.settings.config,
        "index": {"main": l.main, "mid": l.mid, "recent": l.recent, "tombstones": l.tombstones},
        "memory_bytes": l.index_bytes,
        "disk_bytes": s.store.disk_bytes(),
        "uptime_seconds": s.started.elapsed().as_secs_f64(),
    }))
}

/// Liveness: 200 while the process answers and its writer runs (`"writes":
/// "failing"`, status `degraded`, from a failed commit until one succeeds);
/// 503 once the writer thread has stopped: writes can no longer succeed, and
/// the process needs a restart.
pub(super) async fn healthz<B: Bits>(State(s): State<Arc<Service<B>>>) -> Response {
    let body = health(&s);
    let status = if body["writes"] == "stopped" {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}

/// Readiness: 503 while writes are failing (the disk full, say; the next
/// write reopens the store and, if the disk has room again, clears it) or
/// the writer has stopped.
pub(super) async fn readyz<B: Bits>(State(s): State<Arc<Service<B>>>) -> Response {
    let body = health(&s);
    let status = if body["writes"] == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

pub(super) fn health<B: Bits>(s: &Service<B>) -> Value {
    let mut body = if s.control.dead.load(std::sync::atomic::Ordering::SeqCst) {
        serde_json::json!({
            "status": "failing",
            "writes": "stopped",
            "message": "the writer thread failed (the server's log says why): restart the service",
        })
    } else {
        match s.store.write_failure() {
            None => serde_json::json!({"status": "ok", "writes": "ok"}),
            Some(_) => serde_json::json!({
                "status": "degraded",
                "writes": "failing",
                "message": "the last commit failed (the server's log says why); the next write retries",
            }),
        }
    };
    body["verification"] = verification(&s.settings);
    body
}

/// The index design (planned again once a centre is learned), for `/v1/stats`.
fn design(settings: &crate::Settings, d: &neardup_core::index::OnlineDesign) -> Value {
    use neardup_core::index::OnlineDesign;
    let mut v = serde_json::json!({
        "bits": d.bits(),
        "max_k": settings.max_k,
        "description": d.describe(),
    });
    match d {
        OnlineDesign::Tables(t) => {
            v["kind"] = "tables".into();
            v["tables"] = t.tables.len().into();
            v["levels"] = serde_json::json!(t.levels);
        }
        OnlineDesign::Blocks(b) => {
            v["kind"] = "blocks".into();
            v["blocks"] = b.blocks.len().into();
        }
    }
    v
}

/// Whether texts' fingerprints are centred, for `/v1/stats`: `"plain"`,
/// `"learning"` (plain until `from` documents are stored by text) or
/// `"centred"` (on the mean of `documents`).
fn centring<B: Bits>(s: &Service<B>) -> Value {
    use crate::store::Centring;
    match (&s.settings.centring, s.collection.centre()) {
        (None, _) => serde_json::json!({"mode": "plain"}),
        (Some(_), Some(c)) => serde_json::json!({"mode": "centred", "documents": c.documents()}),
        (Some(Centring::Learning { from }), None) => {
            serde_json::json!({"mode": "learning", "from": from})
        }
        (Some(Centring::Learned { .. }), None) => serde_json::json!({"mode": "centred"}),
    }
}

/// What the collection decides by: `"verified"` (with the default
/// threshold) or `"hamming"` (distance alone), for `/v1/stats` and `/healthz`.
fn verification(settings: &crate::Settings) -> Value {
    match settings.verify {
        Some(t) => {
            let mut v = serde_json::json!({"mode": "verified"});
            v[settings.similarity()] = t.into();
            v
        }
        None => serde_json::json!({"mode": "hamming"}),
    }
}

pub(super) async fn metrics<B: Bits>(State(s): State<Arc<Service<B>>>) -> Response {
    let l = s.collection.levels();
    let body = s.metrics.render(&[
        ("neardup_documents", "Documents stored.", l.documents as f64),
        (
            "neardup_index_memory_bytes",
            "Memory held by the in-memory index.",
            l.index_bytes as f64,
        ),
        (
            "neardup_disk_bytes",
            "Size of the database file.",
            s.store.disk_bytes() as f64,
        ),
    ]);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
