//! `windfall serve`: the versioned HTTP API (axum) that batch users, site agents, viewers and the
//! planning trigger talk to.
//!
//! Owns routing, authentication (bearer tokens, see `auth`), per-role scopes, input validation
//! with errors that name the field, body size limits, the OpenAPI description and the
//! Prometheus metrics. All state lives in the store; handlers must not keep any between requests
//! beyond counters for `/metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::auth::{Principal, Role, hash_token};
use crate::db::{Store, StoreError};
use crate::model::{JobRecord, JobState, SiteConfig};
use crate::planning::{CycleConfig, run_cycle};

/// Largest request body accepted, bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Shared state of the service.
pub struct AppState {
    pub store: Store,
    /// Planning settings for `POST /v1/plans`.
    pub cycle: CycleConfig,
    /// Serialises planning triggers inside this process (the store lock covers other processes).
    planning: Mutex<()>,
    metrics: Counters,
    /// Token hash -> holder, for `TOKEN_CACHE_TTL`: a request then costs no token query.
    tokens: std::sync::Mutex<std::collections::HashMap<String, (Principal, Instant)>>,
    /// The latest plan as last read, with its jobs' commands; reused while no newer plan exists.
    plan_cache: Mutex<Option<Arc<CachedPlan>>>,
    /// Seconds a directive response stays valid (the agent's lease).
    lease_s: i64,
}

/// How long a verified token is trusted without asking the store again.
const TOKEN_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

pub(crate) struct CachedPlan {
    pub(crate) plan: crate::model::PlanRecord,
    /// Per job: its command and GPU count.
    commands: BTreeMap<String, (Option<String>, u32)>,
    /// Per site, the directives over the whole horizon as sent (the usual poll, without a range).
    whole_horizon: std::sync::Mutex<BTreeMap<String, Arc<String>>>,
    /// The instance the plan solved, parsed on first use.
    instance: std::sync::OnceLock<Option<windfall_solver::Instance>>,
    /// The validator's recomputation of the plan, on first use.
    validation: std::sync::OnceLock<Option<windfall_solver::Validation>>,
    /// Per job, emissions attributed under the plan and under the run-now baseline, computed on
    /// first use.
    attribution: std::sync::OnceLock<Option<Attribution>>,
}

/// Per job, (slot, g CO2e) under the plan and under the run-now baseline of the same instance.
pub(crate) struct Attribution {
    pub(crate) planned: BTreeMap<String, Vec<(usize, f64)>>,
    pub(crate) baseline: BTreeMap<String, Vec<(usize, f64)>>,
}

impl CachedPlan {
    /// The stored instance (`None` if it no longer parses).
    pub(crate) fn instance(&self) -> Option<&windfall_solver::Instance> {
        self.instance
            .get_or_init(|| windfall_solver::Instance::from_json(&self.plan.instance_json).ok())
            .as_ref()
    }

    /// The validator's figures for the plan.
    pub(crate) fn validation(&self) -> Option<&windfall_solver::Validation> {
        self.validation
            .get_or_init(|| {
                self.instance()
                    .map(|i| windfall_solver::validate(i, &self.plan.plan))
            })
            .as_ref()
    }

    pub(crate) fn attribution(&self) -> Option<&Attribution> {
        self.attribution
            .get_or_init(|| {
                let instance = self.instance()?;
                let baseline = windfall_solver::baseline_plan(instance);
                Some(Attribution {
                    planned: windfall_solver::job_emissions_g(instance, &self.plan.plan),
                    baseline: windfall_solver::job_emissions_g(instance, &baseline),
                })
            })
            .as_ref()
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    /// Sum of request durations, microseconds.
    latency_us_sum: AtomicU64,
    /// Requests at or under each bucket bound (ms), cumulative as Prometheus expects.
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_MS.len()],
}

const LATENCY_BUCKETS_MS: [f64; 8] = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 500.0, 2500.0];

impl AppState {
    pub fn new(store: Store, cycle: CycleConfig) -> AppState {
        AppState {
            store,
            cycle,
            planning: Mutex::new(()),
            metrics: Counters::default(),
            tokens: std::sync::Mutex::new(std::collections::HashMap::new()),
            plan_cache: Mutex::new(None),
            lease_s: DEFAULT_LEASE_S,
        }
    }

    /// Sets how long directives stay valid for an agent that cannot reach the planner.
    pub fn with_lease_s(mut self, lease_s: i64) -> AppState {
        self.lease_s = lease_s.max(1);
        self
    }

    /// The latest plan and its jobs' commands, read again only when a newer plan exists.
    pub(crate) async fn latest_plan_cached(&self) -> ApiResult<Option<Arc<CachedPlan>>> {
        let Some(id) = self.store.latest_plan_id().await? else {
            return Ok(None);
        };
        let mut cache = self.plan_cache.lock().await;
        if let Some(cached) = cache.as_ref()
            && cached.plan.id == id
        {
            return Ok(Some(cached.clone()));
        }
        let Some(plan) = self.store.plan(id).await? else {
            return Ok(None);
        };
        let mut commands = BTreeMap::new();
        for a in &plan.plan.assignments {
            if !commands.contains_key(&a.job) {
                let job = self.store.job(&a.job).await?;
                let gpus = job.as_ref().map_or(0, |j| j.gpus);
                commands.insert(a.job.clone(), (job.and_then(|j| j.command), gpus));
            }
        }
        let fresh = Arc::new(CachedPlan {
            plan,
            commands,
            whole_horizon: std::sync::Mutex::new(BTreeMap::new()),
            instance: std::sync::OnceLock::new(),
            validation: std::sync::OnceLock::new(),
            attribution: std::sync::OnceLock::new(),
        });
        *cache = Some(fresh.clone());
        Ok(Some(fresh))
    }
}

pub(crate) type Shared = Arc<AppState>;

/// An API error: status, message, and the request field at fault when there is one.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            field: None,
        }
    }
    fn field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("{field}: {}", message.into()),
            field: Some(field.to_string()),
        }
    }
    fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }
    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(field) = self.field {
            body["field"] = json!(field);
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match &e {
            StoreError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            StoreError::UnknownSite { .. } => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
            _ => {
                tracing::error!("store: {e}");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal storage error")
            }
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body after the caller's scope is checked; errors name the field at fault.
fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body: {inner}"),
            )
        } else {
            ApiError::field(&path, inner.to_string())
        }
    })
}

impl FromRequestParts<Shared> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing bearer token (Authorization: Bearer ...)"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
        principal_for_token(state, token).await
    }
}

/// The holder of `token`, from the cache (30 s) or the store.
pub(crate) async fn principal_for_token(state: &Shared, token: &str) -> ApiResult<Principal> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    {
        let hash = hash_token(token.trim());
        if let Ok(cache) = state.tokens.lock()
            && let Some((principal, at)) = cache.get(&hash)
            && at.elapsed() < TOKEN_CACHE_TTL
        {
            return Ok(principal.clone());
        }
        let record = state
            .store
            .token_by_hash(&hash)
            .await?
            .ok_or_else(|| unauthorized("unknown or revoked token"))?;
        let role: Role = record
            .role
            .parse()
            .map_err(|e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
        let principal = Principal {
            name: record.name,
            role,
            site: record.site,
        };
        if let Ok(mut cache) = state.tokens.lock() {
            cache.insert(hash, (principal.clone(), Instant::now()));
        }
        Ok(principal)
    }
}

/// Roles that may read plans, jobs lists, sites and forecasts.
const READERS: &[Role] = &[Role::Admin, Role::Viewer, Role::User];

fn require(principal: &Principal, roles: &[Role], what: &str) -> ApiResult<()> {
    if roles.contains(&principal.role) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "a {} token may not {what}",
            principal.role
        )))
    }
}

/// Builds the router.
pub fn router(state: Shared) -> Router {
    Router::new()
        .merge(crate::dashboard::routes())
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/jobs", post(submit_job).get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/v1/jobs/{id}/events", get(job_events))
        .route("/v1/gpu-models/{name}", put(put_gpu_model))
        .route("/v1/sites", get(list_sites))
        .route("/v1/sites/{id}", put(put_site))
        .route("/v1/sites/{id}/heartbeat", post(heartbeat))
        .route("/v1/sites/{id}/directives", get(directives))
        .route("/v1/sites/{id}/events", post(post_event))
        .route(
            "/v1/sites/{id}/migrations/{job}/token",
            post(issue_transfer_token),
        )
        .route("/v1/transfers/verify", post(verify_transfer_token))
        .route("/v1/forecasts", post(upload_forecasts).get(query_forecasts))
        .route("/v1/plans", post(trigger_plan))
        .route("/v1/plans/latest", get(latest_plan))
        .route("/v1/plans/{id}", get(plan_by_id))
        .route("/v1/plans/{id}/diff", get(plan_diff))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

async fn count(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let response = next.run(request).await;
    let m = &state.metrics;
    m.requests.fetch_add(1, Ordering::Relaxed);
    if response.status().is_server_error() {
        m.errors.fetch_add(1, Ordering::Relaxed);
    }
    let elapsed = started.elapsed();
    m.latency_us_sum
        .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    let ms = elapsed.as_secs_f64() * 1000.0;
    for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
        if ms <= *bound {
            m.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    response
}

/// Serves until SIGTERM or Ctrl-C, then lets in-flight requests finish.
pub async fn serve(state: AppState, listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr()?;
    // The first line on standard output names the address, so scripts can use port 0.
    println!("windfall serve: listening on http://{local}");
    let app = router(Arc::new(state));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    eprintln!("windfall serve: stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

async fn healthz(State(state): State<Shared>) -> ApiResult<Json<Value>> {
    state.store.sites().await?;
    Ok(Json(json!({ "status": "ok" })))
}

/// Appends one Prometheus metric family with a single unlabelled sample.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
    ));
}

async fn metrics(State(state): State<Shared>) -> ApiResult<Response> {
    let m = &state.metrics;
    let mut out = String::new();
    let total = m.requests.load(Ordering::Relaxed);
    metric(
        &mut out,
        "windfall_http_requests_total",
        "counter",
        "API requests served.",
        total,
    );
    metric(
        &mut out,
        "windfall_http_server_errors_total",
        "counter",
        "API requests answered with 5xx.",
        m.errors.load(Ordering::Relaxed),
    );
    out.push_str("# HELP windfall_http_request_duration_seconds API request latency.\n");
    out.push_str("# TYPE windfall_http_request_duration_seconds histogram\n");
    for (i, bound) in LATENCY_BUCKETS_MS.iter().enumerate() {
        out.push_str(&format!(
            "windfall_http_request_duration_seconds_bucket{{le=\"{}\"}} {}\n",
            bound / 1000.0,
            m.latency_buckets[i].load(Ordering::Relaxed)
        ));
    }
    out.push_str(&format!(
        "windfall_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {total}\n\
         windfall_http_request_duration_seconds_sum {}\n\
         windfall_http_request_duration_seconds_count {total}\n",
        m.latency_us_sum.load(Ordering::Relaxed) as f64 / 1e6
    ));
    if let Some(cached) = state.latest_plan_cached().await? {
        let plan = &cached.plan;
        let pm = &plan.metrics;
        let filled: usize = plan.provenance.iter().map(|p| p.filled_slots).sum();
        for (name, help, value) in [
            (
                "windfall_plan_id",
                "Id of the current plan.",
                plan.id as f64,
            ),
            (
                "windfall_plan_solve_seconds",
                "Solve time of the current plan.",
                pm.solve_seconds,
            ),
            (
                "windfall_plan_gap",
                "Relative gap of the current plan to its lower bound.",
                pm.gap,
            ),
            (
                "windfall_plan_emissions_grams",
                "Planned grid emissions, g CO2e.",
                pm.emissions_g,
            ),
            (
                "windfall_plan_baseline_emissions_grams",
                "Run-now baseline emissions, g CO2e.",
                pm.baseline_emissions_g,
            ),
            (
                "windfall_plan_filled_forecast_slots",
                "Site-slots the current plan filled from older data.",
                filled as f64,
            ),
        ] {
            metric(&mut out, name, "gauge", help, value);
        }
    }
    let now = Utc::now();
    out.push_str("# HELP windfall_agent_heartbeat_age_seconds Age of each site agent's newest heartbeat.\n# TYPE windfall_agent_heartbeat_age_seconds gauge\n");
    for hb in state.store.heartbeats().await? {
        out.push_str(&format!(
            "windfall_agent_heartbeat_age_seconds{{site=\"{}\"}} {}\n",
            hb.site,
            (now - hb.time_utc).num_milliseconds() as f64 / 1000.0
        ));
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

/// A job submission.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    /// Job id; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
    pub gpus: u32,
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Work in hours at full power on a speed-1.0 GPU.
    #[serde(default)]
    pub work_hours: Option<f64>,
    /// Alias of `work_hours` for users who think in run time.
    #[serde(default)]
    pub duration_hours: Option<f64>,
    /// Earliest start; now when absent.
    #[serde(default)]
    pub release_utc: Option<DateTime<Utc>>,
    pub deadline_utc: DateTime<Utc>,
    #[serde(default)]
    pub checkpoint_gb: f64,
    #[serde(default)]
    pub save_s: Option<f64>,
    #[serde(default)]
    pub restore_s: Option<f64>,
    #[serde(default)]
    pub migratable: bool,
    pub home_site: String,
    #[serde(default)]
    pub command: Option<String>,
}

fn check_id(field: &str, id: &str) -> ApiResult<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "must be 1-128 characters of letters, digits, '-', '_', '.' or ':'",
        ))
    }
}

fn check_non_negative(field: &str, value: f64) -> ApiResult<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ApiError::field(field, "must be a finite number >= 0"))
    }
}

fn job_json(job: &JobRecord, planned: Option<Value>) -> Value {
    let mut v = json!({
        "id": job.id, "state": job.state.as_str(), "state_reason": job.state_reason,
        "gpus": job.gpus, "gpu_models": job.gpu_models, "work_hours": job.work_hours,
        "release_utc": job.release_utc, "deadline_utc": job.deadline_utc,
        "checkpoint_gb": job.checkpoint_gb, "save_s": job.save_s, "restore_s": job.restore_s,
        "migratable": job.migratable, "home_site": job.home_site,
        "current_site": job.current_site, "owner": job.owner, "command": job.command,
        "submitted_utc": job.submitted_utc,
    });
    if let Some(p) = planned {
        v["plan"] = p;
    }
    v
}

async fn submit_job(
    State(state): State<Shared>,
    principal: Principal,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    require(&principal, &[Role::User, Role::Admin], "submit jobs")?;
    let sub: JobSubmission = parse_body(&bytes)?;
    let now = Utc::now();
    let id = match &sub.id {
        Some(id) => {
            check_id("id", id)?;
            id.clone()
        }
        None => format!(
            "job-{}",
            crate::auth::new_token()
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .id
        ),
    };
    if sub.gpus == 0 {
        return Err(ApiError::field("gpus", "must be at least 1"));
    }
    let work_hours = match (sub.work_hours, sub.duration_hours) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "duration_hours",
                "give work_hours or duration_hours, not both",
            ));
        }
        (Some(w), None) => ("work_hours", w),
        (None, Some(d)) => ("duration_hours", d),
        (None, None) => return Err(ApiError::field("work_hours", "is required")),
    };
    if !(work_hours.1.is_finite() && work_hours.1 > 0.0) {
        return Err(ApiError::field(work_hours.0, "must be a number > 0"));
    }
    let work_hours = work_hours.1;
    check_non_negative("checkpoint_gb", sub.checkpoint_gb)?;
    let save_s = sub.save_s.unwrap_or(crate::fleet::DEFAULT_SAVE_S);
    let restore_s = sub.restore_s.unwrap_or(crate::fleet::DEFAULT_RESTORE_S);
    check_non_negative("save_s", save_s)?;
    check_non_negative("restore_s", restore_s)?;
    let release_utc = sub.release_utc.unwrap_or(now);
    if sub.deadline_utc <= release_utc {
        return Err(ApiError::field(
            "deadline_utc",
            "must be after release_utc (or after now when release_utc is absent)",
        ));
    }
    if let Some(command) = &sub.command
        && command.len() > 16 * 1024
    {
        return Err(ApiError::field("command", "must be at most 16 KiB"));
    }
    let sites = state.store.sites().await?;
    if !sites.iter().any(|s| s.id == sub.home_site) {
        return Err(ApiError::field(
            "home_site",
            format!("unknown site `{}`", sub.home_site),
        ));
    }
    let models = state.store.gpu_models().await?;
    for (i, m) in sub.gpu_models.iter().enumerate() {
        if !models.contains_key(m) {
            return Err(ApiError::field(
                &format!("gpu_models[{i}]"),
                format!("unknown GPU model `{m}`"),
            ));
        }
    }
    // Documented choice: a job whose deadline cannot be met is accepted as `infeasible` with the
    // reason, so the user sees why; it is never planned late.
    let allowed = |m: &str| sub.gpu_models.is_empty() || sub.gpu_models.iter().any(|x| x == m);
    let fastest = sites
        .iter()
        .flat_map(|s| s.gpus.iter())
        .filter(|(m, n)| allowed(m) && **n >= sub.gpus)
        .filter_map(|(m, _)| models.get(m).map(|spec| spec.speed))
        .fold(0.0, f64::max);
    let start = release_utc.max(now);
    let hours_left = (sub.deadline_utc - start).num_seconds() as f64 / 3600.0;
    let infeasible = if fastest <= 0.0 {
        Some(format!(
            "no site has {} GPUs of an allowed model together",
            sub.gpus
        ))
    } else if work_hours / fastest > hours_left {
        Some(format!(
            "not enough time: needs {:.2} h on the fastest allowed GPU, {:.2} h remain before the deadline",
            work_hours / fastest,
            hours_left.max(0.0)
        ))
    } else {
        None
    };
    let job = JobRecord {
        id,
        state: if infeasible.is_some() {
            JobState::Infeasible
        } else {
            JobState::Queued
        },
        gpus: sub.gpus,
        gpu_models: sub.gpu_models,
        work_hours,
        release_utc,
        deadline_utc: sub.deadline_utc,
        checkpoint_gb: sub.checkpoint_gb,
        save_s,
        restore_s,
        migratable: sub.migratable,
        home_site: sub.home_site,
        current_site: None,
        state_reason: infeasible,
        submitted_utc: now,
        owner: Some(principal.name.clone()),
        command: sub.command,
    };
    state.store.insert_job(&job).await?;
    Ok((StatusCode::CREATED, Json(job_json(&job, None))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFilter {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    owner: Option<String>,
}

async fn list_jobs(
    State(state): State<Shared>,
    principal: Principal,
    Query(filter): Query<JobFilter>,
) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "list jobs")?;
    let wanted_state = match &filter.state {
        Some(s) => Some(
            s.parse::<JobState>()
                .map_err(|e| ApiError::field("state", e))?,
        ),
        None => None,
    };
    let jobs = state.store.jobs(wanted_state).await?;
    let owner = if principal.role == Role::User {
        Some(principal.name.clone())
    } else {
        filter.owner.clone()
    };
    let list: Vec<Value> = jobs
        .iter()
        .filter(|j| owner.is_none() || j.owner == owner)
        .map(|j| job_json(j, None))
        .collect();
    Ok(Json(json!({ "jobs": list })))
}

async fn load_job(state: &AppState, principal: &Principal, id: &str) -> ApiResult<JobRecord> {
    let job = state
        .store
        .job(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no job `{id}`")))?;
    let readable = principal.role == Role::Viewer || principal.may_touch_job(job.owner.as_deref());
    if !readable {
        return Err(ApiError::forbidden(format!(
            "job `{id}` belongs to another user"
        )));
    }
    Ok(job)
}

/// A job's history as its sites' agents reported it, oldest first.
async fn job_events(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    load_job(&state, &principal, &id).await?;
    let events = state.store.job_events(&id).await?;
    Ok(Json(json!({ "job": id, "events": events })))
}

async fn get_job(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let job = load_job(&state, &principal, &id).await?;
    let planned = match state.latest_plan_cached().await? {
        Some(cached) => {
            let plan = &cached.plan;
            let slot = Duration::minutes(i64::from(plan.slot_minutes));
            let runs: Vec<Value> = plan
                .plan
                .assignments
                .iter()
                .filter(|a| a.job == id)
                .map(|a| {
                    let start = plan.horizon_start_utc + slot * a.slot as i32;
                    json!({ "site": a.site, "start_utc": start, "end_utc": start + slot,
                            "power_w": a.power_w, "gpu_model": a.gpu_model })
                })
                .collect();
            // Emissions in this plan's horizon: expected, already past, and under run-now.
            let now = Utc::now();
            let emissions = cached.attribution().map(|a| {
                let planned = a.planned.get(&id).map(Vec::as_slice).unwrap_or_default();
                let past = |slot_index: usize| {
                    plan.horizon_start_utc + slot * (slot_index as i32 + 1) <= now
                };
                json!({
                    "expected_g": planned.iter().map(|(_, g)| g).sum::<f64>(),
                    "so_far_g": planned.iter().filter(|(s, _)| past(*s)).map(|(_, g)| g).sum::<f64>(),
                    "run_now_baseline_g": a.baseline.get(&id).map_or(0.0, |v| v.iter().map(|(_, g)| g).sum::<f64>()),
                })
            });
            Some(json!({ "plan_id": plan.id, "runs": runs, "emissions": emissions }))
        }
        None => None,
    };
    Ok(Json(job_json(&job, planned)))
}

async fn cancel_job(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    require(&principal, &[Role::User, Role::Admin], "cancel jobs")?;
    let mut job = load_job(&state, &principal, &id).await?;
    if matches!(
        job.state,
        JobState::Done | JobState::Failed | JobState::Cancelled
    ) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job `{id}` is already {}", job.state),
        ));
    }
    const REASON: &str = "cancelled by its owner";
    state
        .store
        .set_job_state(&id, JobState::Cancelled, Some(REASON))
        .await?;
    job.state = JobState::Cancelled;
    job.state_reason = Some(REASON.to_string());
    Ok(Json(job_json(&job, None)))
}

async fn put_gpu_model(
    State(state): State<Shared>,
    principal: Principal,
    Path(name): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<Value>> {
    require(&principal, &[Role::Admin], "change GPU models")?;
    let model: windfall_solver::GpuModel = parse_body(&bytes)?;
    check_id("name", &name)?;
    if model.power_levels_w.is_empty() || model.power_levels_w.len() != model.throughput.len() {
        return Err(ApiError::field(
            "throughput",
            "needs one value per power level, and at least one level",
        ));
    }
    for (i, w) in model.power_levels_w.iter().enumerate() {
        if !(w.is_finite() && *w > 0.0) {
            return Err(ApiError::field(
                &format!("power_levels_w[{i}]"),
                "must be > 0",
            ));
        }
    }
    state.store.upsert_gpu_model(&name, &model).await?;
    Ok(Json(json!({ "name": name })))
}

async fn list_sites(State(state): State<Shared>, principal: Principal) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "list sites")?;
    let sites = state.store.sites().await?;
    Ok(Json(json!({ "sites": sites })))
}

/// A site's configuration as `PUT /v1/sites/{id}` takes it (the id comes from the path).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SiteBody {
    #[serde(default)]
    zone: Option<String>,
    gpus: BTreeMap<String, u32>,
    #[serde(default = "one")]
    pue: f64,
    #[serde(default)]
    grid_limit_kw: Option<f64>,
    wan_gbps: f64,
}

fn one() -> f64 {
    1.0
}

async fn put_site(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<Value>> {
    require(&principal, &[Role::Admin], "change sites")?;
    let body: SiteBody = parse_body(&bytes)?;
    check_id("id", &id)?;
    let site = SiteConfig {
        id,
        zone: body.zone,
        gpus: body.gpus,
        pue: body.pue,
        grid_limit_kw: body.grid_limit_kw,
        wan_gbps: body.wan_gbps,
    };
    if !(site.pue.is_finite() && site.pue >= 1.0) {
        return Err(ApiError::field("pue", "must be >= 1"));
    }
    if !(site.wan_gbps.is_finite() && site.wan_gbps > 0.0) {
        return Err(ApiError::field("wan_gbps", "must be > 0"));
    }
    if let Some(limit) = site.grid_limit_kw {
        check_non_negative("grid_limit_kw", limit)?;
    }
    let models = state.store.gpu_models().await?;
    for model in site.gpus.keys() {
        if !models.contains_key(model) {
            return Err(ApiError::field(
                &format!("gpus.{model}"),
                "unknown GPU model (PUT /v1/gpu-models/{name} first)",
            ));
        }
    }
    state.store.upsert_site(&site, Utc::now()).await?;
    Ok(Json(json!({ "site": site })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    /// Usable GPUs per model as the agent sees them.
    inventory: BTreeMap<String, u32>,
    /// Anything else the agent reports (NVML readings, versions).
    #[serde(default)]
    detail: Option<Value>,
    /// Where other agents reach this agent's checkpoint endpoint.
    #[serde(default)]
    agent_url: Option<String>,
}

async fn heartbeat(
    State(state): State<Shared>,
    principal: Principal,
    Path(site): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<Value>> {
    if !principal.may_act_for_site(&site) {
        return Err(ApiError::forbidden(format!(
            "this token may not report for site `{site}`"
        )));
    }
    let body: HeartbeatBody = parse_body(&bytes)?;
    if !state.store.sites().await?.iter().any(|s| s.id == site) {
        return Err(ApiError::not_found(format!("no site `{site}`")));
    }
    if let Some(url) = &body.agent_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(ApiError::field(
            "agent_url",
            "must start with http:// or https://",
        ));
    }
    let payload = json!({
        "inventory": body.inventory, "detail": body.detail, "agent_url": body.agent_url,
    });
    let now = Utc::now();
    state
        .store
        .record_heartbeat(&site, now, &payload.to_string())
        .await?;
    Ok(Json(json!({ "site": site, "time_utc": now })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Range {
    #[serde(default)]
    from: Option<DateTime<Utc>>,
    #[serde(default)]
    to: Option<DateTime<Utc>>,
}

async fn directives(
    State(state): State<Shared>,
    principal: Principal,
    Path(site): Path<String>,
    Query(range): Query<Range>,
) -> ApiResult<Response> {
    let allowed = principal.role == Role::Viewer || principal.may_act_for_site(&site);
    if !allowed {
        return Err(ApiError::forbidden(format!(
            "this token may not read the directives of site `{site}`"
        )));
    }
    let lease_until = Utc::now() + Duration::seconds(state.lease_s);
    let Some(cached) = state.latest_plan_cached().await? else {
        return Ok(Json(json!({
            "site": site, "plan_id": null, "lease_until_utc": lease_until,
            "runs": [], "migrations": [],
        }))
        .into_response());
    };
    let whole = range.from.is_none() && range.to.is_none();
    // The cached body is the plan's part; the lease is added per response in front of it.
    let lease = json!(lease_until).to_string();
    let as_json = |text: Arc<String>| {
        let body = format!("{{\"lease_until_utc\":{lease},{}", &text[1..]);
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    };
    if whole
        && let Some(text) = cached
            .whole_horizon
            .lock()
            .ok()
            .and_then(|m| m.get(&site).cloned())
    {
        return Ok(as_json(text));
    }
    let plan = &cached.plan;
    let slot = Duration::minutes(i64::from(plan.slot_minutes));
    let from = range.from.unwrap_or(plan.horizon_start_utc);
    let to = range
        .to
        .unwrap_or(plan.horizon_start_utc + slot * plan.slots as i32);
    if to <= from {
        return Err(ApiError::field("to", "must be after `from`"));
    }
    let in_range = |slot_index: usize| {
        let start = plan.horizon_start_utc + slot * slot_index as i32;
        (start < to && start + slot > from).then_some(start)
    };
    let mut runs = Vec::new();
    for a in plan.plan.assignments.iter().filter(|a| a.site == site) {
        let Some(start) = in_range(a.slot) else {
            continue;
        };
        let (command, gpus) = cached.commands.get(&a.job).cloned().unwrap_or_default();
        runs.push(json!({
            "job": a.job, "start_utc": start, "end_utc": start + slot, "gpus": gpus,
            "power_cap_w": a.power_w, "gpu_model": a.gpu_model, "command": command,
        }));
    }
    let migrations: Vec<Value> = plan
        .plan
        .migrations
        .iter()
        .filter(|m| m.from == site || m.to == site)
        .filter_map(|m| {
            in_range(m.slot).map(|start| {
                json!({ "job": m.job, "from": m.from, "to": m.to, "start_utc": start,
                        "transfer_s": m.transfer_s })
            })
        })
        .collect();
    let text = Arc::new(
        json!({
            "site": site, "plan_id": plan.id, "from_utc": from, "to_utc": to,
            "runs": runs, "migrations": migrations,
        })
        .to_string(),
    );
    if whole && let Ok(mut m) = cached.whole_horizon.lock() {
        m.insert(site, text.clone());
    }
    Ok(as_json(text))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventBody {
    kind: String,
    #[serde(default)]
    job: Option<String>,
    #[serde(default)]
    detail: Option<Value>,
}

/// Event kinds and the job state each implies.
const EVENT_KINDS: [(&str, Option<JobState>); 10] = [
    ("job_started", Some(JobState::Running)),
    ("progress", None),
    ("checkpoint_written", None),
    ("paused", Some(JobState::Paused)),
    ("migration_sent", Some(JobState::Migrating)),
    ("migration_received", Some(JobState::Paused)),
    ("migration_done", None),
    ("power_caps", None),
    ("job_finished", Some(JobState::Done)),
    ("job_failed", Some(JobState::Failed)),
];

async fn post_event(
    State(state): State<Shared>,
    principal: Principal,
    Path(site): Path<String>,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    if !principal.may_act_for_site(&site) {
        return Err(ApiError::forbidden(format!(
            "this token may not post events for site `{site}`"
        )));
    }
    let event: EventBody = parse_body(&bytes)?;
    let Some((_, new_state)) = EVENT_KINDS.iter().find(|(k, _)| *k == event.kind) else {
        let kinds: Vec<&str> = EVENT_KINDS.iter().map(|(k, _)| *k).collect();
        return Err(ApiError::field(
            "kind",
            format!("unknown event kind; use one of {}", kinds.join(", ")),
        ));
    };
    if new_state.is_some() && event.job.is_none() {
        return Err(ApiError::field(
            "job",
            format!("is required for {}", event.kind),
        ));
    }
    if let Some(job) = &event.job
        && state.store.job(job).await?.is_none()
    {
        return Err(ApiError::field("job", format!("unknown job `{job}`")));
    }
    if !state.store.sites().await?.iter().any(|s| s.id == site) {
        return Err(ApiError::not_found(format!("no site `{site}`")));
    }
    let detail = event.detail.unwrap_or(Value::Null).to_string();
    state
        .store
        .record_event(
            &site,
            event.job.as_deref(),
            &event.kind,
            &detail,
            *new_state,
            Utc::now(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "recorded": event.kind }))))
}

/// Transfer tokens live this long: enough for a slow link, short enough to be useless later.
const TRANSFER_TOKEN_TTL_S: i64 = 6 * 3600;

/// Default seconds an agent may act on its last directives without reaching the planner.
pub const DEFAULT_LEASE_S: i64 = 900;

/// Issues the source agent a token for one migration of the latest plan, with the destination
/// agent's address.
async fn issue_transfer_token(
    State(state): State<Shared>,
    principal: Principal,
    Path((site, job)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    if !principal.may_act_for_site(&site) {
        return Err(ApiError::forbidden(format!(
            "this token may not move jobs out of site `{site}`"
        )));
    }
    let cached = state
        .latest_plan_cached()
        .await?
        .ok_or_else(|| ApiError::not_found("no plan yet"))?;
    let plan = &cached.plan;
    let Some(migration) = plan
        .plan
        .migrations
        .iter()
        .find(|m| m.job == job && m.from == site)
    else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "plan #{} has no migration of job `{job}` out of `{site}`",
                plan.id
            ),
        ));
    };
    let heartbeats = state.store.heartbeats().await?;
    let destination_url = heartbeats
        .iter()
        .find(|h| h.site == migration.to)
        .and_then(|h| serde_json::from_str::<Value>(&h.inventory_json).ok())
        .and_then(|v| v["agent_url"].as_str().map(str::to_string))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "the agent of destination site `{}` has not reported its address yet",
                    migration.to
                ),
            )
        })?;
    let new = crate::auth::new_token()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let now = Utc::now();
    let record = crate::db::TransferToken {
        hash: new.hash,
        job: job.clone(),
        from_site: site.clone(),
        to_site: migration.to.clone(),
        plan_id: plan.id,
        created_utc: now,
        expires_utc: now + Duration::seconds(TRANSFER_TOKEN_TTL_S),
    };
    state.store.insert_transfer_token(&record).await?;
    Ok(Json(json!({
        "token": new.token, "job": job, "from": site, "to": migration.to,
        "destination_url": destination_url, "plan_id": plan.id,
        "expires_utc": record.expires_utc,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyBody {
    token: String,
}

/// Tells an agent whether a transfer token is valid and what it allows; only the two agents of
/// the migration may ask.
async fn verify_transfer_token(
    State(state): State<Shared>,
    principal: Principal,
    bytes: Bytes,
) -> ApiResult<Json<Value>> {
    require(
        &principal,
        &[Role::Agent, Role::Admin],
        "verify transfer tokens",
    )?;
    let body: VerifyBody = parse_body(&bytes)?;
    let hash = crate::auth::hash_token(&body.token);
    let Some(token) = state.store.transfer_token(&hash).await? else {
        return Err(ApiError::forbidden("unknown transfer token"));
    };
    if !(principal.may_act_for_site(&token.to_site) || principal.may_act_for_site(&token.from_site))
    {
        return Err(ApiError::forbidden(format!(
            "this transfer token is for sites `{}` and `{}`",
            token.from_site, token.to_site
        )));
    }
    if token.expires_utc <= Utc::now() {
        return Err(ApiError::forbidden(format!(
            "the transfer token for job `{}` expired at {}",
            token.job, token.expires_utc
        )));
    }
    Ok(Json(json!({
        "job": token.job, "from": token.from_site, "to": token.to_site,
        "plan_id": token.plan_id, "expires_utc": token.expires_utc,
    })))
}

async fn upload_forecasts(
    State(state): State<Shared>,
    principal: Principal,
    headers: HeaderMap,
    body: String,
) -> ApiResult<Json<Value>> {
    require(&principal, &[Role::Admin], "upload forecasts")?;
    let source = headers
        .get("x-windfall-source")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("api upload")
        .to_string();
    let points = windfall_forecasts::parse_canonical_csv(&body, "request body")
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let stored = state.store.insert_forecasts(&source, &points).await?;
    Ok(Json(json!({ "rows": stored, "source": source })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForecastQuery {
    site: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    /// Only values issued at or before this time (what was known then); now when absent.
    #[serde(default)]
    as_of: Option<DateTime<Utc>>,
}

/// Longest forecast window one query returns.
const MAX_FORECAST_QUERY_DAYS: i64 = 31;

async fn query_forecasts(
    State(state): State<Shared>,
    principal: Principal,
    Query(q): Query<ForecastQuery>,
) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "read forecasts")?;
    if q.to <= q.from {
        return Err(ApiError::field("to", "must be after `from`"));
    }
    if q.to - q.from > Duration::days(MAX_FORECAST_QUERY_DAYS) {
        return Err(ApiError::field(
            "to",
            format!("at most {MAX_FORECAST_QUERY_DAYS} days per query"),
        ));
    }
    if !state.store.sites().await?.iter().any(|s| s.id == q.site) {
        return Err(ApiError::field(
            "site",
            format!("unknown site `{}`", q.site),
        ));
    }
    let as_of = q.as_of.unwrap_or_else(Utc::now);
    let rows = state
        .store
        .forecast_window(&q.site, q.from, q.to, as_of)
        .await?;
    let values: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({ "time_utc": r.time_utc, "issued_utc": r.issued_utc, "source": r.source,
                    "surplus_kw": r.surplus_kw, "carbon_g_per_kwh": r.carbon_g_per_kwh,
                    "carbon_signal": r.carbon_signal, "price_usd_per_mwh": r.price_usd_per_mwh })
        })
        .collect();
    Ok(Json(
        json!({ "site": q.site, "as_of_utc": as_of, "values": values }),
    ))
}

async fn trigger_plan(State(state): State<Shared>, principal: Principal) -> ApiResult<Json<Value>> {
    require(&principal, &[Role::Admin], "trigger planning")?;
    let _guard = state.planning.lock().await;
    let outcome = run_cycle(&state.store, &state.cycle, Utc::now())
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))?;
    Ok(Json(json!({
        "plan_id": outcome.plan_id, "summary": outcome.summary(), "metrics": outcome.metrics,
    })))
}

fn plan_json(plan: &crate::model::PlanRecord) -> Value {
    json!({
        "id": plan.id, "created_utc": plan.created_utc,
        "horizon_start_utc": plan.horizon_start_utc, "slot_minutes": plan.slot_minutes,
        "slots": plan.slots, "metrics": plan.metrics, "provenance": plan.provenance,
        "plan": plan.plan,
    })
}

async fn latest_plan(State(state): State<Shared>, principal: Principal) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "read plans")?;
    let cached = state
        .latest_plan_cached()
        .await?
        .ok_or_else(|| ApiError::not_found("no plan yet"))?;
    Ok(Json(plan_json(&cached.plan)))
}

async fn plan_by_id(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<i64>,
) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "read plans")?;
    let plan = state
        .store
        .plan(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plan {id}")))?;
    Ok(Json(plan_json(&plan)))
}

/// Per job, how plan `id` differs from the plan before it: jobs added or dropped, and for jobs
/// in both, the slots that start, stop or change site, GPU model or power cap.
async fn plan_diff(
    State(state): State<Shared>,
    principal: Principal,
    Path(id): Path<i64>,
) -> ApiResult<Json<Value>> {
    require(&principal, READERS, "read plans")?;
    let plan = state
        .store
        .plan(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no plan {id}")))?;
    let previous = match state.store.plan_id_before(id).await? {
        Some(before) => state.store.plan(before).await?,
        None => None,
    };
    let Some(previous) = previous else {
        return Ok(Json(
            json!({ "plan_id": id, "previous_plan_id": null, "jobs": [] }),
        ));
    };
    Ok(Json(diff_plans(&plan, &previous)))
}

/// What changed from `previous` to `plan` over the overlap of their horizons: per job, whether it
/// was added, dropped or kept, and each slot whose site, power or model changed.
pub(crate) fn diff_plans(
    plan: &crate::model::PlanRecord,
    previous: &crate::model::PlanRecord,
) -> Value {
    // Compare in UTC slot start times: the two plans' horizons may start at different slots.
    type Runs = BTreeMap<String, BTreeMap<DateTime<Utc>, (String, f64, Option<String>)>>;
    let runs = |p: &crate::model::PlanRecord| -> Runs {
        let slot = Duration::minutes(i64::from(p.slot_minutes));
        let mut out: Runs = BTreeMap::new();
        for a in &p.plan.assignments {
            out.entry(a.job.clone()).or_default().insert(
                p.horizon_start_utc + slot * a.slot as i32,
                (a.site.clone(), a.power_w, a.gpu_model.clone()),
            );
        }
        out
    };
    let (new, old) = (runs(plan), runs(previous));
    // Only the overlap of the two horizons is comparable.
    let horizon_end = |p: &crate::model::PlanRecord| {
        p.horizon_start_utc + Duration::minutes(i64::from(p.slot_minutes)) * p.slots as i32
    };
    let from = plan.horizon_start_utc.max(previous.horizon_start_utc);
    let to = horizon_end(plan).min(horizon_end(previous));
    let mut jobs: Vec<Value> = Vec::new();
    let ids: std::collections::BTreeSet<&String> = new.keys().chain(old.keys()).collect();
    let empty = BTreeMap::new();
    for job in ids {
        let (n, o) = (
            new.get(job).unwrap_or(&empty),
            old.get(job).unwrap_or(&empty),
        );
        let status = match (new.contains_key(job), old.contains_key(job)) {
            (true, false) => "added",
            (false, true) => "dropped",
            _ => "kept",
        };
        let mut changes = Vec::new();
        let times: std::collections::BTreeSet<&DateTime<Utc>> = n.keys().chain(o.keys()).collect();
        for t in times.into_iter().filter(|t| **t >= from && **t < to) {
            match (n.get(t), o.get(t)) {
                (Some(a), Some(b)) if a == b => {}
                (a, b) => changes.push(json!({
                    "start_utc": t,
                    "now": a.map(|(site, w, m)| json!({ "site": site, "power_w": w, "gpu_model": m })),
                    "before": b.map(|(site, w, m)| json!({ "site": site, "power_w": w, "gpu_model": m })),
                })),
            }
        }
        if status != "kept" || !changes.is_empty() {
            jobs.push(json!({ "job": job, "status": status, "changed_slots": changes }));
        }
    }
    json!({
        "plan_id": plan.id, "previous_plan_id": previous.id, "compared_from_utc": from,
        "compared_to_utc": to, "jobs": jobs,
        "emissions_change_g": plan.metrics.emissions_g - previous.metrics.emissions_g,
    })
}

async fn openapi() -> Json<Value> {
    let bearer = json!([{ "bearer": [] }]);
    let op = |summary: &str| {
        json!({ "summary": summary, "security": bearer, "responses": {
        "200": { "description": "OK" }, "400": { "description": "invalid input; `field` names it" },
        "401": { "description": "missing or unknown token" },
        "403": { "description": "valid token outside its scope" } } })
    };
    Json(json!({
        "openapi": "3.1.0",
        "info": { "title": "windfall planner API", "version": "1" },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": { "type": "object", "required": ["error"], "properties": {
                    "error": { "type": "string" }, "field": { "type": "string" } } },
                "JobSubmission": { "type": "object", "required": ["gpus", "deadline_utc", "home_site"],
                    "properties": {
                        "id": { "type": "string" }, "gpus": { "type": "integer", "minimum": 1 },
                        "gpu_models": { "type": "array", "items": { "type": "string" } },
                        "work_hours": { "type": "number" }, "duration_hours": { "type": "number" },
                        "release_utc": { "type": "string", "format": "date-time" },
                        "deadline_utc": { "type": "string", "format": "date-time" },
                        "checkpoint_gb": { "type": "number" }, "save_s": { "type": "number" },
                        "restore_s": { "type": "number" }, "migratable": { "type": "boolean" },
                        "home_site": { "type": "string" }, "command": { "type": "string" } } }
            }
        },
        "paths": {
            "/healthz": { "get": { "summary": "liveness and database reachability", "responses": { "200": { "description": "OK" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "responses": { "200": { "description": "OK" } } } },
            "/v1/jobs": { "post": op("submit a job (user, admin); an unmeetable deadline is accepted as `infeasible` with the reason"),
                          "get": op("list jobs (a user sees its own); filters: state, owner") },
            "/v1/jobs/{id}": { "get": op("a job with its planned runs") },
            "/v1/jobs/{id}/cancel": { "post": op("cancel a job (its owner, admin)") },
            "/v1/gpu-models/{name}": { "put": op("create or update a GPU model (admin)") },
            "/v1/sites": { "get": op("list sites") },
            "/v1/sites/{id}": { "put": op("create or update a site (admin)") },
            "/v1/sites/{id}/heartbeat": { "post": op("agent heartbeat with inventory and the agent's address (the site's agent)") },
            "/v1/sites/{id}/directives": { "get": op("what the site's agent must run, from the current plan, with the lease until which it may act on them; query from, to") },
            "/v1/sites/{id}/events": { "post": op("agent events: job_started, progress, checkpoint_written, paused, migration_sent, migration_received, migration_done, power_caps, job_finished, job_failed") },
            "/v1/sites/{id}/migrations/{job}/token": { "post": op("a short-lived token for one checkpoint transfer of the latest plan, with the destination agent's address (the source site's agent)") },
            "/v1/jobs/{id}/events": { "get": op("the job's history as agents reported it: started, checkpoints, migrations, power caps, finished") },
            "/v1/transfers/verify": { "post": op("whether a transfer token is valid, and for which job and sites (the two agents of the migration)") },
            "/v1/forecasts": { "post": op("upload canonical forecast CSV (admin); header X-Windfall-Source labels it"),
                               "get": op("forecast values for a site: query site, from, to, as_of (what was known then)") },
            "/v1/plans": { "post": op("run one planning cycle now (admin)") },
            "/v1/plans/latest": { "get": op("the current plan") },
            "/v1/plans/{id}": { "get": op("a plan by id") },
            "/v1/plans/{id}/diff": { "get": op("per job, what changed against the plan before it (added, dropped, slots that start, stop or move)") }
        }
    }))
}
