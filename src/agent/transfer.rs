//! Checkpoint transfer between site agents: packing a checkpoint folder into one archive, the
//! receiving endpoint, and the sender.
//!
//! Protocol (all requests carry `Authorization: Bearer <transfer token>`, checked with the
//! planner, valid for one job and one destination; anything else gets 403 and writes nothing):
//! - `GET  /v1/transfers/{job}` -> `{ "received_bytes": N }`: where to resume;
//! - `PUT  /v1/transfers/{job}/chunks?offset=N` with `x-windfall-chunk-sha256`: appends one
//!   chunk if its hash matches and `N` is the bytes received so far (422 on a hash mismatch,
//!   409 with the right offset otherwise);
//! - `POST /v1/transfers/{job}/complete` `{ "size_bytes", "sha256" }`: the destination hashes
//!   the whole archive; on a match it unpacks it into the job's `resume/` folder and confirms,
//!   on a mismatch it discards the upload (422) and the sender starts again.
//!
//! The sender keeps its copy until the destination confirms. Must not resume a job (the agent
//! does) and must never unpack an archive whose hash did not match.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::planner_link::{PlannerLink, TransferScope};

/// Marker written in a job's `resume/` folder once a verified checkpoint is unpacked there.
pub const RECEIVED_MARKER: &str = ".windfall-received";

/// Largest chunk the endpoint accepts.
pub const MAX_CHUNK_BYTES: usize = 16 * 1024 * 1024;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Packs the files of `dir` (recursively) into a tar archive at `archive`.
pub fn pack(dir: &Path, archive: &Path) -> std::io::Result<()> {
    let tmp = archive.with_extension("tmp");
    {
        let file = fs::File::create(&tmp)?;
        let mut builder = tar::Builder::new(file);
        builder.follow_symlinks(false);
        builder.append_dir_all(".", dir)?;
        builder.into_inner()?.sync_all()?;
    }
    fs::rename(tmp, archive)
}

/// Unpacks `archive` into `dest` (replaced whole: a half-unpacked folder never stays).
pub fn unpack(archive: &Path, dest: &Path) -> std::io::Result<()> {
    let tmp = dest.with_extension("unpacking");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    tar::Archive::new(fs::File::open(archive)?).unpack(&tmp)?;
    let _ = fs::remove_dir_all(dest);
    fs::rename(tmp, dest)
}

/// The receiving side's state.
pub struct Receiver {
    /// This agent's site.
    pub site: String,
    /// The agent's work folder (`incoming/` and `jobs/` live in it).
    pub work_dir: PathBuf,
    /// Checks tokens.
    pub planner: PlannerLink,
    verified: Mutex<HashMap<String, TransferScope>>,
    /// One chunk write or completion at a time (they append to and hash the same files).
    uploads: Mutex<()>,
}

impl Receiver {
    /// A receiver for `site` storing under `work_dir`.
    pub fn new(site: &str, work_dir: &Path, planner: PlannerLink) -> Receiver {
        Receiver {
            site: site.to_string(),
            work_dir: work_dir.to_path_buf(),
            planner,
            verified: Mutex::new(HashMap::new()),
            uploads: Mutex::new(()),
        }
    }

    fn part_path(&self, job: &str) -> PathBuf {
        self.work_dir
            .join("incoming")
            .join(format!("{job}.tar.part"))
    }

    /// The folder a received checkpoint is unpacked into.
    pub fn resume_dir(work_dir: &Path, job: &str) -> PathBuf {
        work_dir.join("jobs").join(job).join("resume")
    }
}

struct TransferError(StatusCode, String, Option<u64>);

impl IntoResponse for TransferError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.1 });
        if let Some(n) = self.2 {
            body["received_bytes"] = json!(n);
        }
        (self.0, Json(body)).into_response()
    }
}

type Shared = Arc<Receiver>;

/// The agent's HTTP routes for checkpoint transfers.
pub fn router(receiver: Arc<Receiver>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/transfers/{job}", get(status))
        .route("/v1/transfers/{job}/chunks", put(chunk))
        .route("/v1/transfers/{job}/complete", post(complete))
        .layer(DefaultBodyLimit::max(MAX_CHUNK_BYTES + 1024))
        .with_state(receiver)
}

fn valid_job_id(job: &str) -> bool {
    !job.is_empty()
        && job.len() <= 128
        && job
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !job.starts_with('.')
}

async fn authorise(state: &Receiver, headers: &HeaderMap, job: &str) -> Result<(), TransferError> {
    if !valid_job_id(job) {
        return Err(TransferError(
            StatusCode::BAD_REQUEST,
            format!("`{job}` is not a job id"),
            None,
        ));
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            TransferError(
                StatusCode::FORBIDDEN,
                "a transfer token for this migration is required (Authorization: Bearer ...)"
                    .into(),
                None,
            )
        })?;
    let key = crate::auth::hash_token(token);
    let cached = state.verified.lock().await.get(&key).cloned();
    let scope = match cached {
        Some(scope) if scope.expires_utc > Utc::now() => scope,
        _ => {
            let scope = state
                .planner
                .verify_transfer(token)
                .await
                .map_err(|e| TransferError(StatusCode::FORBIDDEN, format!("{e:#}"), None))?;
            state.verified.lock().await.insert(key, scope.clone());
            scope
        }
    };
    if scope.job != job || scope.to != state.site {
        return Err(TransferError(
            StatusCode::FORBIDDEN,
            format!(
                "this token moves job `{}` to `{}`, not job `{job}` to `{}`",
                scope.job, scope.to, state.site
            ),
            None,
        ));
    }
    Ok(())
}

fn internal(e: impl std::fmt::Display) -> TransferError {
    TransferError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), None)
}

fn received(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

async fn status(
    State(state): State<Shared>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, TransferError> {
    authorise(&state, &headers, &job).await?;
    Ok(Json(
        json!({ "job": job, "received_bytes": received(&state.part_path(&job)) }),
    ))
}

#[derive(Deserialize)]
struct Offset {
    offset: u64,
}

async fn chunk(
    State(state): State<Shared>,
    UrlPath(job): UrlPath<String>,
    Query(at): Query<Offset>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, TransferError> {
    authorise(&state, &headers, &job).await?;
    let _one = state.uploads.lock().await;
    let path = state.part_path(&job);
    let have = received(&path);
    if at.offset != have {
        return Err(TransferError(
            StatusCode::CONFLICT,
            format!("offset {} but {have} bytes are here", at.offset),
            Some(have),
        ));
    }
    let expected = headers
        .get("x-windfall-chunk-sha256")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            TransferError(
                StatusCode::BAD_REQUEST,
                "the x-windfall-chunk-sha256 header is required".into(),
                None,
            )
        })?;
    let actual = hex(&Sha256::digest(&body));
    if actual != expected {
        tracing::warn!(
            job,
            offset = at.offset,
            "chunk hash mismatch; asking for it again"
        );
        return Err(TransferError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "chunk at offset {} has sha256 {actual}, expected {expected}",
                at.offset
            ),
            Some(have),
        ));
    }
    fs::create_dir_all(path.parent().expect("incoming/ has a parent")).map_err(internal)?;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(internal)?;
    file.write_all(&body).map_err(internal)?;
    file.sync_data().map_err(internal)?;
    Ok(Json(json!({ "received_bytes": have + body.len() as u64 })))
}

#[derive(Deserialize)]
struct Completion {
    size_bytes: u64,
    sha256: String,
}

async fn complete(
    State(state): State<Shared>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
    Json(done): Json<Completion>,
) -> Result<Json<Value>, TransferError> {
    authorise(&state, &headers, &job).await?;
    let _one = state.uploads.lock().await;
    let path = state.part_path(&job);
    let size = received(&path);
    let actual = sha256_file(&path).map_err(internal)?;
    if size != done.size_bytes || actual != done.sha256 {
        let _ = fs::remove_file(&path);
        return Err(TransferError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the checkpoint has {size} bytes with sha256 {actual}, expected {} bytes with \
                 {}; discarded, send it again",
                done.size_bytes, done.sha256
            ),
            Some(0),
        ));
    }
    let dest = Receiver::resume_dir(&state.work_dir, &job);
    fs::create_dir_all(dest.parent().expect("jobs/<id> has a parent")).map_err(internal)?;
    unpack(&path, &dest).map_err(internal)?;
    fs::write(dest.join(RECEIVED_MARKER), &done.sha256).map_err(internal)?;
    let _ = fs::remove_file(&path);
    let detail = json!({ "bytes": size, "sha256": actual });
    if let Err(e) = state
        .planner
        .event("migration_received", Some(&job), detail)
        .await
    {
        tracing::warn!("could not report the received checkpoint of {job}: {e:#}");
    }
    tracing::info!(job, bytes = size, "checkpoint received and verified");
    Ok(Json(json!({ "job": job, "verified": true, "bytes": size })))
}

/// The destination's refusal (a 403: no valid token for this move), as an error.
async fn refused(job: &str, response: reqwest::Response) -> anyhow::Error {
    let text = response.text().await.unwrap_or_default();
    anyhow::anyhow!("the destination refused the transfer of job {job}: {text}")
}

/// How a transfer went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TransferReport {
    /// Archive size.
    pub bytes: u64,
    /// Connections or requests that failed and were resumed.
    pub resumed_after_errors: u32,
    /// Chunks the destination rejected for a hash mismatch and that were sent again.
    pub chunks_resent: u32,
    /// Whole-archive mismatches that restarted the upload.
    pub restarts: u32,
}

/// Streams `archive` to the agent at `base_url` for `job`, resuming after broken connections
/// and resending rejected chunks, until the destination confirms the whole archive's hash.
pub async fn send(
    http: &reqwest::Client,
    base_url: &str,
    token: &str,
    job: &str,
    archive: &Path,
    chunk_bytes: usize,
    max_attempts: u32,
) -> Result<TransferReport> {
    let base = base_url.trim_end_matches('/');
    let size = fs::metadata(archive)
        .with_context(|| format!("reading {}", archive.display()))?
        .len();
    let sha256 = sha256_file(archive).with_context(|| format!("hashing {}", archive.display()))?;
    let chunk_bytes = chunk_bytes.clamp(1, MAX_CHUNK_BYTES);
    let mut report = TransferReport {
        bytes: size,
        ..TransferReport::default()
    };
    let mut failures = 0u32;
    let mut backoff = StdDuration::from_millis(200);
    let mut file = fs::File::open(archive)?;
    'attempt: loop {
        if failures > max_attempts {
            bail!("giving up on job {job}'s checkpoint after {failures} failed attempts");
        }
        if failures > 0 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(StdDuration::from_secs(10));
        }
        let status = http
            .get(format!("{base}/v1/transfers/{job}"))
            .bearer_auth(token)
            .send()
            .await;
        let mut offset = match status {
            Ok(r) if r.status().is_success() => match r.json::<Value>().await {
                Ok(v) => v["received_bytes"].as_u64().unwrap_or(0),
                Err(_) => {
                    failures += 1;
                    report.resumed_after_errors += 1;
                    continue;
                }
            },
            Ok(r) if r.status() == StatusCode::FORBIDDEN => return Err(refused(job, r).await),
            _ => {
                failures += 1;
                report.resumed_after_errors += 1;
                continue;
            }
        };
        if offset > size {
            offset = 0;
        }
        let mut buf = vec![0u8; chunk_bytes];
        let mut chunk_failures = 0u32;
        while offset < size {
            let len = ((size - offset) as usize).min(chunk_bytes);
            file.seek(SeekFrom::Start(offset))?;
            file.read_exact(&mut buf[..len])?;
            let data = buf[..len].to_vec();
            let response = http
                .put(format!("{base}/v1/transfers/{job}/chunks"))
                .query(&[("offset", offset)])
                .bearer_auth(token)
                .header("x-windfall-chunk-sha256", hex(&Sha256::digest(&data)))
                .body(data)
                .send()
                .await;
            match response {
                Ok(r) if r.status().is_success() => {
                    offset += len as u64;
                    chunk_failures = 0;
                }
                Ok(r) if r.status() == StatusCode::UNPROCESSABLE_ENTITY => {
                    report.chunks_resent += 1;
                    chunk_failures += 1;
                    if chunk_failures > max_attempts {
                        bail!(
                            "job {job}: the chunk at offset {offset} was rejected {chunk_failures} times"
                        );
                    }
                }
                Ok(r) if r.status() == StatusCode::CONFLICT => {
                    let v: Value = r.json().await.unwrap_or(Value::Null);
                    offset = v["received_bytes"].as_u64().unwrap_or(0).min(size);
                }
                Ok(r) if r.status() == StatusCode::FORBIDDEN => return Err(refused(job, r).await),
                _ => {
                    failures += 1;
                    report.resumed_after_errors += 1;
                    continue 'attempt;
                }
            }
        }
        let response = http
            .post(format!("{base}/v1/transfers/{job}/complete"))
            .bearer_auth(token)
            .json(&json!({ "size_bytes": size, "sha256": sha256 }))
            .send()
            .await;
        match response {
            Ok(r) if r.status().is_success() => return Ok(report),
            Ok(r) if r.status() == StatusCode::UNPROCESSABLE_ENTITY => {
                report.restarts += 1;
                failures += 1;
            }
            _ => {
                failures += 1;
                report.resumed_after_errors += 1;
            }
        }
    }
}
