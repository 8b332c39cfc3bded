//! `windfall agent`: the site agent that makes a plan real at one site.
//!
//! Owns the loop: heartbeat with inventory and the agent's address, pull directives ahead of
//! time, and at each slot boundary start, pause (checkpoint and stop) or migrate (checkpoint,
//! stream, confirm) the site's jobs, with every GPU's power cap clamped to the device and to the
//! site's GPU power budget. It keeps what it must remember across restarts in
//! `<work_dir>/state.json` and the jobs' folders, and reconciles with the executor on start.
//!
//! Safety rules it must not break: no new work once the directives' lease has passed without
//! reaching the planner (running jobs keep running under their last caps); never more GPU power
//! than the site budget allows; a source deletes its checkpoint only after the destination
//! confirmed the whole archive; a job reported finished is never started again.

pub mod executor;
pub mod gpu;
pub mod planner_link;
pub mod transfer;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use executor::{CHECKPOINT_MARKER, Executor, JobSpec, JobStatus, LocalExecutor, SlurmExecutor};
use gpu::{DryRun, GpuInfo, Gpus, NvmlGpus, SimulatedGpus, SimulatedModel};
use planner_link::{Directives, PlannerLink, Run};
use transfer::{RECEIVED_MARKER, Receiver};

/// `site.toml`: one agent's configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The site this agent runs (as the planner knows it).
    pub site: String,
    /// Base URL of `windfall serve`.
    pub planner_url: String,
    /// The site's agent token; `WINDFALL_AGENT_TOKEN` overrides it. Never logged.
    #[serde(default)]
    pub token: Option<String>,
    /// Address for the checkpoint endpoint (port 0 picks one).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How other agents reach this one (default: `http://` + the bound address).
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// Folder for job folders, checkpoints and the agent's state.
    pub work_dir: PathBuf,
    /// Seconds between directive pulls (and job checks).
    #[serde(default = "default_poll")]
    pub poll_seconds: f64,
    /// Seconds between heartbeats.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_seconds: f64,
    /// How far ahead directives are pulled, minutes.
    #[serde(default = "default_lookahead")]
    pub lookahead_minutes: i64,
    /// Seconds a job has to confirm its checkpoint before it is stopped anyway.
    #[serde(default = "default_checkpoint_timeout")]
    pub checkpoint_timeout_seconds: f64,
    /// Signal that asks a job to checkpoint.
    #[serde(default = "default_signal")]
    pub checkpoint_signal: String,
    /// The site's budget for the sum of GPU power limits, W (no budget when absent).
    #[serde(default)]
    pub gpu_power_budget_w: Option<u32>,
    /// Log the power caps it would set and change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Checkpoint upload chunk size, bytes.
    #[serde(default = "default_chunk")]
    pub chunk_bytes: usize,
    /// `local` (default) or `slurm`.
    #[serde(default)]
    pub executor: ExecutorConfig,
    /// GPU backend.
    pub gpus: GpuConfig,
    /// HTTPS for the checkpoint endpoint and trust for other agents' certificates.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Replay clock for demos and tests: plan time runs `speedup` times faster than wall time
    /// from `plan_start_utc` at `wall_start_utc`. Absent in production: plan time is wall time.
    #[serde(default)]
    pub clock: Option<ClockConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}
fn default_poll() -> f64 {
    10.0
}
fn default_heartbeat() -> f64 {
    30.0
}
fn default_lookahead() -> i64 {
    120
}
fn default_checkpoint_timeout() -> f64 {
    300.0
}
fn default_signal() -> String {
    "USR1".into()
}
fn default_chunk() -> usize {
    4 * 1024 * 1024
}

/// `[executor]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorConfig {
    /// `local` or `slurm`.
    #[serde(default)]
    pub kind: ExecutorKind,
    /// Slurm partition.
    #[serde(default)]
    pub partition: Option<String>,
}

/// Which executor.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// Child processes.
    #[default]
    Local,
    /// sbatch and friends.
    Slurm,
}

/// `[gpus]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// `nvml` or `simulated` (chosen explicitly; never a fall-back).
    pub backend: GpuBackend,
    /// Path of `libnvidia-ml.so.1` when it is not on the loader's path.
    #[serde(default)]
    pub nvml_library: Option<String>,
    /// NVML device name -> planner model name, where the default rule (first word after
    /// `NVIDIA `) does not fit.
    #[serde(default)]
    pub model_names: BTreeMap<String, String>,
    /// The simulated devices.
    #[serde(default)]
    pub simulated: Vec<SimulatedModel>,
}

/// Which GPU backend.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    /// NVIDIA's management library.
    Nvml,
    /// Devices from the configuration.
    Simulated,
}

/// `[tls]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain (PEM) the checkpoint endpoint presents; with `key_pem` it serves HTTPS.
    #[serde(default)]
    pub cert_pem: Option<PathBuf>,
    /// Private key (PEM) of `cert_pem`.
    #[serde(default)]
    pub key_pem: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted for other agents and the planner.
    #[serde(default)]
    pub ca_pem: Option<PathBuf>,
}

/// A reqwest client that also trusts `ca_pem`'s certificates.
pub fn http_client(ca_pem: Option<&Path>, timeout: StdDuration) -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(StdDuration::from_secs(10))
        .timeout(timeout);
    if let Some(path) = ca_pem {
        let pem = fs::read(path)
            .with_context(|| format!("reading CA certificates {}", path.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{}: not PEM certificates", path.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().context("building the HTTP client")
}

/// Serves `app` over TLS on `listener` with the certificate and key of `tls`.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cert: &Path,
    key: &Path,
) -> Result<()> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .with_context(|| format!("reading the certificate chain {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("the certificate and key do not form a usable pair")?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("TLS handshake with {peer} failed: {e}");
                        return;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(())
}

/// `[clock]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockConfig {
    /// Plan time at `wall_start_utc`.
    pub plan_start_utc: DateTime<Utc>,
    /// Wall time at which plan time is `plan_start_utc`.
    pub wall_start_utc: DateTime<Utc>,
    /// Plan seconds per wall second.
    pub speedup: f64,
}

impl AgentConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<AgentConfig> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut config: AgentConfig = toml::from_str(&text)
            .with_context(|| format!("{}: invalid agent configuration", path.display()))?;
        if let Ok(token) = std::env::var("WINDFALL_AGENT_TOKEN")
            && !token.is_empty()
        {
            config.token = Some(token);
        }
        config
            .check()
            .with_context(|| format!("{}", path.display()))?;
        Ok(config)
    }

    fn check(&self) -> Result<()> {
        if self.token.as_deref().unwrap_or("").is_empty() {
            bail!(
                "no agent token: set `token` or WINDFALL_AGENT_TOKEN (windfall token create --role agent --site {})",
                self.site
            );
        }
        if !(self.poll_seconds > 0.0 && self.heartbeat_seconds > 0.0) {
            bail!("poll_seconds and heartbeat_seconds must be > 0");
        }
        if executor::signal_number(&self.checkpoint_signal).is_none() {
            bail!(
                "checkpoint_signal `{}`: use USR1, USR2, TERM, INT or HUP",
                self.checkpoint_signal
            );
        }
        if self.gpus.backend == GpuBackend::Simulated && self.gpus.simulated.is_empty() {
            bail!("gpus.backend = \"simulated\" needs at least one [[gpus.simulated]] entry");
        }
        if let Some(t) = &self.tls
            && t.cert_pem.is_some() != t.key_pem.is_some()
        {
            bail!("tls: give both cert_pem and key_pem to serve HTTPS, or neither");
        }
        if let Some(c) = &self.clock
            && !(c.speedup.is_finite() && c.speedup > 0.0)
        {
            bail!("clock.speedup must be a number > 0");
        }
        Ok(())
    }

    fn now(&self) -> DateTime<Utc> {
        let wall = Utc::now();
        match &self.clock {
            None => wall,
            Some(c) => {
                let elapsed_ms = (wall - c.wall_start_utc).num_milliseconds() as f64;
                c.plan_start_utc + Duration::milliseconds((elapsed_ms * c.speedup) as i64)
            }
        }
    }
}

/// What a job is doing at this site.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
pub enum Phase {
    /// Running under the executor.
    Running,
    /// Asked to checkpoint; then pause here or migrate.
    Checkpointing {
        /// Wall-clock deadline for the confirmation.
        deadline_utc: DateTime<Utc>,
        /// Migrate (true) or pause here (false).
        migrate: bool,
    },
    /// Checkpoint packed, being streamed to the destination.
    Sending,
}

/// A job this agent is responsible for.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct LocalJob {
    /// Its phase.
    #[serde(flatten)]
    pub phase: Phase,
    /// GPUs it holds.
    pub gpus: Vec<u32>,
    /// Per-GPU cap the plan asked for, W.
    pub cap_w: u32,
    /// Per-GPU limit in force after clamping, W (what counts against the site budget).
    #[serde(default)]
    pub applied_w: u32,
}

/// What survives an agent restart.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AgentState {
    /// Jobs running, checkpointing or sending.
    pub jobs: BTreeMap<String, LocalJob>,
    /// Jobs reported finished or failed here: never started again.
    pub finished: BTreeSet<String>,
    /// Events not yet accepted by the planner, oldest first; sent before any newer one.
    #[serde(default)]
    pub outbox: Vec<PendingEvent>,
}

/// An event waiting for the planner.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct PendingEvent {
    /// Event kind.
    pub kind: String,
    /// The job.
    pub job: Option<String>,
    /// Details, with the agent's time of the event.
    pub detail: Value,
}

impl AgentState {
    fn load(work_dir: &Path) -> Result<AgentState> {
        let path = work_dir.join("state.json");
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} is not a valid agent state", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AgentState::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    fn save(&self, work_dir: &Path) -> Result<()> {
        let path = work_dir.join("state.json");
        let tmp = work_dir.join("state.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
    }
}

/// Whether `dir` holds a complete checkpoint.
fn has_checkpoint(dir: &Path) -> bool {
    dir.join(CHECKPOINT_MARKER).exists() || dir.join(RECEIVED_MARKER).exists()
}

/// Result of a finished background transfer.
struct Sent {
    job: String,
    outcome: Result<transfer::TransferReport>,
}

/// A running agent.
pub struct Agent {
    config: AgentConfig,
    planner: PlannerLink,
    gpus: Box<dyn Gpus>,
    executor: Box<dyn Executor>,
    state: AgentState,
    directives: Option<Directives>,
    agent_url: String,
    http: reqwest::Client,
    sent_tx: mpsc::UnboundedSender<Sent>,
    sent_rx: mpsc::UnboundedReceiver<Sent>,
    /// Jobs whose transfer failed, with the wall time to try again.
    retry_after: BTreeMap<String, DateTime<Utc>>,
    /// Jobs whose checkpoint is being streamed right now.
    in_flight: BTreeSet<String>,
    /// The last progress line reported per job.
    progress: BTreeMap<String, String>,
    /// Messages already logged once (waiting for a checkpoint, budget refusals).
    said: BTreeSet<String>,
}

fn gpu_backend(config: &GpuConfig, dry_run: bool) -> Result<Box<dyn Gpus>> {
    let backend: Box<dyn Gpus> = match config.backend {
        GpuBackend::Nvml => Box::new(NvmlGpus::open(
            config.nvml_library.as_deref(),
            config.model_names.clone(),
        )?),
        GpuBackend::Simulated => Box::new(SimulatedGpus::new(&config.simulated)),
    };
    Ok(if dry_run {
        Box::new(DryRun(backend))
    } else {
        backend
    })
}

impl Agent {
    /// Opens the GPU backend, the executor and the saved state; binds nothing yet.
    pub fn new(config: AgentConfig) -> Result<Agent> {
        fs::create_dir_all(config.work_dir.join("jobs"))
            .with_context(|| format!("creating {}", config.work_dir.display()))?;
        let token = config.token.clone().unwrap_or_default();
        let ca = config.tls.as_ref().and_then(|t| t.ca_pem.as_deref());
        let planner = PlannerLink::new(&config.planner_url, &token, &config.site, ca)?;
        let gpus = gpu_backend(&config.gpus, config.dry_run)?;
        let signal = executor::signal_number(&config.checkpoint_signal)
            .context("unknown checkpoint signal")?;
        let executor: Box<dyn Executor> = match config.executor.kind {
            ExecutorKind::Local => Box::new(LocalExecutor::new(signal)),
            ExecutorKind::Slurm => Box::new(SlurmExecutor::new(
                &config.checkpoint_signal,
                config.executor.partition.clone(),
            )),
        };
        let state = AgentState::load(&config.work_dir)?;
        let (sent_tx, sent_rx) = mpsc::unbounded_channel();
        let http = http_client(ca, StdDuration::from_secs(120))?;
        Ok(Agent {
            config,
            planner,
            gpus,
            executor,
            state,
            directives: None,
            agent_url: String::new(),
            http,
            sent_tx,
            sent_rx,
            retry_after: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            progress: BTreeMap::new(),
            said: BTreeSet::new(),
        })
    }

    fn job_dir(&self, job: &str) -> PathBuf {
        self.config.work_dir.join("jobs").join(job)
    }

    fn save(&self) {
        if let Err(e) = self.state.save(&self.config.work_dir) {
            tracing::error!("{e:#}");
        }
    }

    /// Reports an event. Progress is best effort; every other event is kept in the persisted
    /// outbox until the planner accepts it, so a planner outage loses no job state change.
    async fn event(&mut self, kind: &str, job: Option<&str>, mut detail: Value) {
        if kind == "progress" {
            if let Err(e) = self.planner.event(kind, job, detail).await {
                tracing::debug!("{e:#}");
            }
            return;
        }
        if let Value::Object(map) = &mut detail {
            map.insert("agent_time_utc".into(), json!(Utc::now()));
        }
        self.state.outbox.push(PendingEvent {
            kind: kind.to_string(),
            job: job.map(str::to_string),
            detail,
        });
        self.save();
        self.flush_events().await;
    }

    /// Sends queued events in order until one fails.
    async fn flush_events(&mut self) {
        let mut sent = 0;
        for pending in &self.state.outbox {
            match self
                .planner
                .event(
                    &pending.kind,
                    pending.job.as_deref(),
                    pending.detail.clone(),
                )
                .await
            {
                Ok(()) => sent += 1,
                Err(e) => {
                    let message = format!(
                        "{e:#}; {} event(s) kept for later",
                        self.state.outbox.len() - sent
                    );
                    if self.said.insert("outbox".into()) {
                        tracing::warn!("{message}");
                    } else {
                        tracing::debug!("{message}");
                    }
                    break;
                }
            }
        }
        if sent > 0 {
            self.state.outbox.drain(..sent);
            if self.state.outbox.is_empty() {
                self.said.remove("outbox");
            }
            self.save();
        }
    }

    fn say_once(&mut self, key: String, message: &str) {
        if self.said.insert(key) {
            tracing::info!("{message}");
        }
    }

    /// Binds the checkpoint endpoint, prints its address, and runs until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let receiver = Arc::new(Receiver::new(
            &self.config.site,
            &self.config.work_dir,
            self.planner.clone(),
        ));
        let listener = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .with_context(|| format!("binding {}", self.config.listen))?;
        let bound = listener.local_addr()?;
        let tls = self
            .config
            .tls
            .as_ref()
            .and_then(|t| t.cert_pem.clone().zip(t.key_pem.clone()));
        let scheme = if tls.is_some() { "https" } else { "http" };
        self.agent_url = self
            .config
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{bound}"));
        let app = transfer::router(receiver);
        match &tls {
            Some((cert, key)) => serve_tls(listener, app, cert, key).await?,
            None => {
                tokio::spawn(async move {
                    if let Err(e) = axum::serve(listener, app).await {
                        tracing::error!("checkpoint endpoint stopped: {e}");
                    }
                });
            }
        }
        println!(
            "windfall agent for site {} listening on {scheme}://{bound}",
            self.config.site
        );
        tracing::info!(
            site = self.config.site,
            gpus = self.gpus.name(),
            executor = self.executor.name(),
            "agent started"
        );
        self.reconcile().await;
        let mut last_heartbeat: Option<Instant> = None;
        let mut last_pull: Option<Instant> = None;
        let heartbeat_every = StdDuration::from_secs_f64(self.config.heartbeat_seconds);
        let poll_every = StdDuration::from_secs_f64(self.config.poll_seconds);
        let tick = poll_every.min(StdDuration::from_millis(500));
        tokio::pin!(shutdown);
        loop {
            if last_heartbeat.is_none_or(|t| t.elapsed() >= heartbeat_every) {
                self.heartbeat().await;
                last_heartbeat = Some(Instant::now());
            }
            if last_pull.is_none_or(|t| t.elapsed() >= poll_every) {
                self.pull().await;
                last_pull = Some(Instant::now());
            }
            while let Ok(sent) = self.sent_rx.try_recv() {
                self.transfer_finished(sent).await;
            }
            self.step().await;
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = &mut shutdown => {
                    tracing::info!("agent stopping; running jobs keep running and are adopted on restart");
                    self.save();
                    return Ok(());
                }
            }
        }
    }

    async fn heartbeat(&mut self) {
        let devices = match self.gpus.inventory() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("reading GPUs: {e}");
                Vec::new()
            }
        };
        let mut inventory: BTreeMap<String, u32> = BTreeMap::new();
        for d in &devices {
            *inventory.entry(d.model.clone()).or_default() += 1;
        }
        let detail = json!({
            "gpus": devices, "gpu_backend": self.gpus.name(), "executor": self.executor.name(),
            "jobs": self.state.jobs, "version": env!("CARGO_PKG_VERSION"),
        });
        if let Err(e) = self
            .planner
            .heartbeat(&json!(inventory), &self.agent_url, detail)
            .await
        {
            if self.said.contains("planner down") {
                tracing::debug!("{e:#}");
            } else {
                tracing::warn!("{e:#}");
            }
        }
    }

    async fn pull(&mut self) {
        let now = self.config.now();
        let lookahead = Duration::minutes(self.config.lookahead_minutes.max(1));
        match self
            .planner
            .directives(now - lookahead, now + lookahead)
            .await
        {
            Ok(d) => {
                if self.said.remove("planner down") {
                    tracing::info!("the planner answers again");
                }
                self.directives = Some(d);
                if !self.state.outbox.is_empty() {
                    self.flush_events().await;
                }
            }
            Err(e) => {
                let lease = self.directives.as_ref().map(|d| d.lease_until_utc);
                let message = format!(
                    "{e:#}; acting on the last directives (lease until {lease:?}) and retrying"
                );
                if self.said.insert("planner down".into()) {
                    tracing::warn!("{message}");
                } else {
                    tracing::debug!("{message}");
                }
            }
        }
    }

    fn lease_valid(&self) -> bool {
        self.directives
            .as_ref()
            .is_some_and(|d| d.lease_until_utc > Utc::now())
    }

    /// After a restart: adopt jobs still running, settle those that ended while it was away.
    async fn reconcile(&mut self) {
        let jobs: Vec<(String, LocalJob)> = self.state.jobs.clone().into_iter().collect();
        for (job, local) in jobs {
            let dir = self.job_dir(&job);
            if local.phase == Phase::Sending {
                tracing::info!(job, "resuming the checkpoint transfer after a restart");
                continue;
            }
            match self.executor.status(&job, &dir) {
                Ok(JobStatus::Running) => tracing::info!(job, "adopted a running job"),
                Ok(status) => self.settle(&job, status).await,
                Err(e) => tracing::warn!("{e}"),
            }
        }
        self.save();
    }

    /// A job's process ended (outside a checkpoint request).
    async fn settle(&mut self, job: &str, status: JobStatus) {
        self.progress.remove(job);
        let dir = self.job_dir(job);
        if has_checkpoint(&dir.join("checkpoint")) {
            // It confirmed a checkpoint before ending: paused, not finished.
            self.pause_done(job).await;
            return;
        }
        self.state.jobs.remove(job);
        self.state.finished.insert(job.to_string());
        match status {
            JobStatus::Exited(0) => {
                tracing::info!(job, "job finished");
                self.event("job_finished", Some(job), json!({ "exit_code": 0 }))
                    .await;
            }
            JobStatus::Exited(code) => {
                tracing::warn!(job, code, "job failed");
                self.event(
                    "job_failed",
                    Some(job),
                    json!({ "exit_code": code, "reason": format!("exited with code {code}") }),
                )
                .await;
            }
            JobStatus::Lost | JobStatus::Running => {
                self.event(
                    "job_failed",
                    Some(job),
                    json!({ "reason": "the process disappeared without an exit code" }),
                )
                .await;
            }
        }
        self.save();
    }

    /// The job stopped after its checkpoint: keep the checkpoint for a later resume here.
    async fn pause_done(&mut self, job: &str) {
        let dir = self.job_dir(job);
        let _ = self.executor.stop(job, &dir);
        if let Err(e) = promote_checkpoint(&dir) {
            tracing::error!(job, "keeping the checkpoint: {e}");
        }
        self.state.jobs.remove(job);
        self.save();
        self.event("paused", Some(job), json!({})).await;
    }

    fn current_runs(&self, now: DateTime<Utc>) -> BTreeMap<String, Run> {
        self.directives
            .iter()
            .flat_map(|d| d.runs.iter())
            .filter(|r| r.start_utc <= now && now < r.end_utc)
            .map(|r| (r.job.clone(), r.clone()))
            .collect()
    }

    async fn step(&mut self) {
        let now = self.config.now();
        let runs = self.current_runs(now);
        let lease = self.lease_valid();
        // 1. Jobs under way: ended, checkpoint confirmed, or due to stop here.
        let jobs: Vec<(String, LocalJob)> = self.state.jobs.clone().into_iter().collect();
        for (job, local) in jobs {
            let dir = self.job_dir(&job);
            match local.phase {
                Phase::Running => {
                    match self.executor.status(&job, &dir) {
                        Ok(JobStatus::Running) => {}
                        Ok(status) => {
                            self.settle(&job, status).await;
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!("{e}");
                            continue;
                        }
                    }
                    self.report_progress(&job).await;
                    if runs.contains_key(&job) || !lease {
                        if let Some(run) = runs.get(&job) {
                            self.recap(&job, run).await;
                        }
                        continue;
                    }
                    let migrate = self.migration_out(&job, now);
                    match self.executor.request_checkpoint(&job, &dir) {
                        Ok(()) => {
                            tracing::info!(job, migrate, "asked for a checkpoint");
                            let deadline = Utc::now()
                                + Duration::milliseconds(
                                    (self.config.checkpoint_timeout_seconds * 1000.0) as i64,
                                );
                            if let Some(l) = self.state.jobs.get_mut(&job) {
                                l.phase = Phase::Checkpointing {
                                    deadline_utc: deadline,
                                    migrate,
                                };
                            }
                            self.save();
                        }
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
                Phase::Checkpointing {
                    deadline_utc,
                    migrate,
                } => {
                    let confirmed = has_checkpoint(&dir.join("checkpoint"));
                    let status = self.executor.status(&job, &dir);
                    if !confirmed {
                        match status {
                            Ok(JobStatus::Running) if Utc::now() < deadline_utc => continue,
                            Ok(JobStatus::Running) => {
                                tracing::warn!(job, "no checkpoint confirmed in time; stopping it");
                                let _ = self.executor.stop(&job, &dir);
                                self.event(
                                    "job_failed",
                                    Some(&job),
                                    json!({ "reason": format!(
                                        "did not confirm a checkpoint within {} s; stopped, \
                                         it resumes from its previous checkpoint if it has one",
                                        self.config.checkpoint_timeout_seconds) }),
                                )
                                .await;
                                self.state.jobs.remove(&job);
                                self.save();
                                continue;
                            }
                            Ok(s) => {
                                // Ended without a checkpoint: it finished or failed meanwhile.
                                self.settle(&job, s).await;
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!("{e}");
                                continue;
                            }
                        }
                    }
                    // Confirmed: wait for the process to leave, then go on.
                    if matches!(status, Ok(JobStatus::Running)) && Utc::now() < deadline_utc {
                        continue;
                    }
                    let _ = self.executor.stop(&job, &dir);
                    self.event(
                        "checkpoint_written",
                        Some(&job),
                        json!({ "migrate": migrate }),
                    )
                    .await;
                    if migrate {
                        self.begin_send(&job).await;
                    } else {
                        self.pause_done(&job).await;
                    }
                }
                Phase::Sending => {
                    let due = self.retry_after.get(&job).is_none_or(|t| *t <= Utc::now());
                    if due && !self.in_flight.contains(&job) {
                        self.begin_send(&job).await;
                    }
                }
            }
        }
        // 2. Runs due now that are not running here.
        if !lease {
            if !runs.is_empty() {
                self.say_once(
                    "lease".into(),
                    "the directives' lease has passed without reaching the planner: starting no new work",
                );
            }
            return;
        }
        self.said.remove("lease");
        for (job, run) in runs {
            if self.state.jobs.contains_key(&job) || self.state.finished.contains(&job) {
                continue;
            }
            self.start(&job, &run, now).await;
        }
    }

    /// Reports the job's own progress line (`$WINDFALL_JOB_DIR/progress`) when it changed.
    async fn report_progress(&mut self, job: &str) {
        let path = self.job_dir(job).join("progress");
        let Ok(text) = fs::read_to_string(&path) else {
            return;
        };
        let text = text.trim().to_string();
        if text.is_empty() || self.progress.get(job) == Some(&text) {
            return;
        }
        self.progress.insert(job.to_string(), text.clone());
        self.event("progress", Some(job), json!({ "progress": text }))
            .await;
    }

    fn migration_out(&self, job: &str, now: DateTime<Utc>) -> bool {
        self.directives
            .iter()
            .flat_map(|d| d.migrations.iter())
            .any(|m| m.job == job && m.from == self.config.site && m.start_utc <= now)
    }

    fn migration_in(&self, job: &str) -> Option<String> {
        self.directives
            .iter()
            .flat_map(|d| d.migrations.iter())
            .find(|m| m.job == job && m.to == self.config.site)
            .map(|m| m.from.clone())
    }

    fn free_gpus(&mut self, model: &str, count: u32) -> Result<Vec<(u32, GpuInfo)>> {
        let busy: BTreeSet<u32> = self
            .state
            .jobs
            .values()
            .flat_map(|j| j.gpus.iter().copied())
            .collect();
        let devices = self.gpus.inventory()?;
        let free: Vec<(u32, GpuInfo)> = devices
            .into_iter()
            .filter(|d| d.model == model && !busy.contains(&d.index))
            .map(|d| (d.index, d))
            .take(count as usize)
            .collect();
        if free.len() < count as usize {
            bail!("needs {count} free {model} GPUs, {} are free", free.len());
        }
        Ok(free)
    }

    /// Per-GPU watts left in the site budget for `gpus` more devices, excluding `job`'s own.
    fn budget_per_gpu(&self, job: &str, gpus: usize) -> u32 {
        let Some(budget) = self.config.gpu_power_budget_w else {
            return u32::MAX;
        };
        let used: u64 = self
            .state
            .jobs
            .iter()
            .filter(|(id, _)| id.as_str() != job)
            .map(|(_, j)| u64::from(j.applied_w) * j.gpus.len() as u64)
            .sum();
        let left = u64::from(budget).saturating_sub(used);
        (left / gpus.max(1) as u64).min(u64::from(u32::MAX)) as u32
    }

    async fn start(&mut self, job: &str, run: &Run, now: DateTime<Utc>) {
        let dir = self.job_dir(job);
        let resume = dir.join("resume");
        if let Some(from) = self.migration_in(job)
            && !has_checkpoint(&resume)
        {
            self.say_once(
                format!("wait {job}"),
                &format!("job {job}: waiting for its checkpoint from {from}"),
            );
            return;
        }
        let Some(command) = run.command.clone() else {
            self.say_once(
                format!("nocmd {job}"),
                &format!("job {job} has no command; nothing to run"),
            );
            return;
        };
        let count = run.gpus.max(1);
        let devices = match self.free_gpus(&run.gpu_model, count) {
            Ok(d) => d,
            Err(e) => {
                self.say_once(format!("gpus {job}"), &format!("job {job}: {e:#}"));
                return;
            }
        };
        let requested = run.power_cap_w.round().max(0.0) as u32;
        let per_gpu = self.budget_per_gpu(job, devices.len());
        let floor = devices
            .iter()
            .map(|(_, d)| d.min_limit_w)
            .max()
            .unwrap_or(0);
        if per_gpu < floor {
            self.say_once(
                format!("budget {job}"),
                &format!(
                    "job {job}: the site's GPU power budget leaves {per_gpu} W per GPU, below the \
                     devices' minimum of {floor} W; not starting it"
                ),
            );
            return;
        }
        let indices: Vec<u32> = devices.iter().map(|(i, _)| *i).collect();
        let caps = match gpu::apply_caps(self.gpus.as_mut(), &indices, requested, per_gpu) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(job, "power caps: {e}");
                return;
            }
        };
        let applied = caps.iter().map(|c| c.applied_w).max().unwrap_or(requested);
        let resume_from = has_checkpoint(&resume).then(|| resume.clone());
        let spec = JobSpec {
            job: job.to_string(),
            command,
            gpus: indices.clone(),
            dir: dir.clone(),
            resume_from: resume_from.clone(),
        };
        if let Err(e) = fs::create_dir_all(&dir) {
            tracing::error!(job, "creating {}: {e}", dir.display());
            return;
        }
        // A stale checkpoint folder from an earlier run must not be taken for a new one.
        let _ = fs::remove_dir_all(dir.join("checkpoint"));
        if let Err(e) = self.executor.start(&spec) {
            tracing::error!("{e}");
            self.event("job_failed", Some(job), json!({ "reason": e.to_string() }))
                .await;
            self.state.finished.insert(job.to_string());
            self.save();
            return;
        }
        self.state.jobs.insert(
            job.to_string(),
            LocalJob {
                phase: Phase::Running,
                gpus: indices.clone(),
                cap_w: requested,
                applied_w: applied,
            },
        );
        self.save();
        tracing::info!(job, gpus = ?indices, cap_w = applied, resumed = resume_from.is_some(), "job started");
        self.event(
            "job_started",
            Some(job),
            json!({ "gpus": indices, "resumed_from_checkpoint": resume_from.is_some(),
                    "plan_time_utc": now }),
        )
        .await;
        self.event("power_caps", Some(job), json!({ "caps": caps }))
            .await;
    }

    /// Applies a new cap when the plan changes it between slots.
    async fn recap(&mut self, job: &str, run: &Run) {
        let requested = run.power_cap_w.round().max(0.0) as u32;
        let Some(local) = self.state.jobs.get(job).cloned() else {
            return;
        };
        if local.cap_w == requested {
            return;
        }
        let per_gpu = self.budget_per_gpu(job, local.gpus.len());
        match gpu::apply_caps(self.gpus.as_mut(), &local.gpus, requested, per_gpu) {
            Ok(caps) => {
                let applied = caps.iter().map(|c| c.applied_w).max().unwrap_or(requested);
                if let Some(l) = self.state.jobs.get_mut(job) {
                    l.cap_w = requested;
                    l.applied_w = applied;
                }
                self.save();
                self.event("power_caps", Some(job), json!({ "caps": caps }))
                    .await;
            }
            Err(e) => tracing::error!(job, "power caps: {e}"),
        }
    }

    fn outgoing(&self, job: &str) -> PathBuf {
        self.config
            .work_dir
            .join("outgoing")
            .join(format!("{job}.tar"))
    }

    /// Packs the confirmed checkpoint (once) and streams it in the background.
    async fn begin_send(&mut self, job: &str) {
        let dir = self.job_dir(job);
        let archive = self.outgoing(job);
        if !archive.exists() {
            let source = if has_checkpoint(&dir.join("checkpoint")) {
                dir.join("checkpoint")
            } else {
                dir.join("resume")
            };
            let packed = fs::create_dir_all(archive.parent().expect("outgoing/ has a parent"))
                .and_then(|()| transfer::pack(&source, &archive));
            if let Err(e) = packed {
                tracing::error!(job, "packing the checkpoint: {e}");
                return;
            }
        }
        if let Some(l) = self.state.jobs.get_mut(job) {
            l.phase = Phase::Sending;
            l.gpus.clear();
        }
        self.save();
        let grant = match self.planner.transfer_grant(job).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!("{e:#}; trying again shortly");
                self.retry_after
                    .insert(job.to_string(), Utc::now() + Duration::seconds(2));
                return;
            }
        };
        self.event(
            "migration_sent",
            Some(job),
            json!({ "to": grant.to, "bytes": fs::metadata(&archive).map(|m| m.len()).unwrap_or(0) }),
        )
        .await;
        self.in_flight.insert(job.to_string());
        let http = self.http.clone();
        let tx = self.sent_tx.clone();
        let chunk = self.config.chunk_bytes;
        let job = job.to_string();
        tokio::spawn(async move {
            let outcome = transfer::send(
                &http,
                &grant.destination_url,
                &grant.token,
                &job,
                &archive,
                chunk,
                20,
            )
            .await;
            let _ = tx.send(Sent { job, outcome });
        });
    }

    async fn transfer_finished(&mut self, sent: Sent) {
        let job = sent.job;
        self.in_flight.remove(&job);
        match sent.outcome {
            Ok(report) => {
                // The destination confirmed the whole archive: only now drop the local copy.
                let _ = fs::remove_file(self.outgoing(&job));
                let _ = fs::remove_dir_all(self.job_dir(&job));
                self.state.jobs.remove(&job);
                self.save();
                tracing::info!(job, bytes = report.bytes, "checkpoint moved and confirmed");
                self.event(
                    "migration_done",
                    Some(&job),
                    json!({ "bytes": report.bytes, "resumed_after_errors": report.resumed_after_errors,
                            "chunks_resent": report.chunks_resent, "restarts": report.restarts }),
                )
                .await;
            }
            Err(e) => {
                tracing::warn!(
                    job,
                    "checkpoint transfer failed: {e:#}; the local copy is kept"
                );
                self.retry_after
                    .insert(job, Utc::now() + Duration::seconds(5));
            }
        }
    }
}

/// Moves a confirmed `checkpoint/` over `resume/`, where the next start finds it.
fn promote_checkpoint(dir: &Path) -> std::io::Result<()> {
    let checkpoint = dir.join("checkpoint");
    if !has_checkpoint(&checkpoint) {
        return Ok(());
    }
    let resume = dir.join("resume");
    let _ = fs::remove_dir_all(&resume);
    fs::rename(checkpoint, resume)
}

/// `windfall agent --config FILE`: runs until SIGINT or SIGTERM.
pub async fn run_from_file(path: &Path, dry_run: bool) -> Result<()> {
    let mut config = AgentConfig::load(path)?;
    config.dry_run |= dry_run;
    let agent = Agent::new(config)?;
    agent
        .run(async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return std::future::pending().await,
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await
}
