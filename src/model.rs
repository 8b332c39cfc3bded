//! The domain model of the planner service: sites, jobs and their states, plans with provenance.
//!
//! GPU models, assignments, migrations and metrics are the solver's public types
//! (`windfall_solver`), reused here so a stored plan is exactly what the solver produced. This
//! module owns the types that exist only around the solver: lifecycle states and stored records.
//! It holds no SQL and no I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use windfall_solver::{Assignment, GpuModel, Metrics, Migration};

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Submitted, not yet in a plan.
    Queued,
    /// In the current plan.
    Planned,
    /// Running at a site.
    Running,
    /// Checkpointed and waiting for its next slot.
    Paused,
    /// Checkpoint moving between sites.
    Migrating,
    /// Finished its work.
    Done,
    /// Failed at run time.
    Failed,
    /// Cancelled by its owner.
    Cancelled,
    /// Its deadline cannot be met; the reason is stored with it.
    Infeasible,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 9] = [
        JobState::Queued,
        JobState::Planned,
        JobState::Running,
        JobState::Paused,
        JobState::Migrating,
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Infeasible,
    ];

    /// The name used in the database and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Planned => "planned",
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::Migrating => "migrating",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Infeasible => "infeasible",
        }
    }

    /// Whether the planner still has to place this job.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            JobState::Queued
                | JobState::Planned
                | JobState::Running
                | JobState::Paused
                | JobState::Migrating
                | JobState::Infeasible
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown job state `{s}`"))
    }
}

/// A site's configuration and inventory (signals are stored as forecasts).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    /// Unique id.
    pub id: String,
    /// Grid zone, e.g. `DE-LU`.
    #[serde(default)]
    pub zone: Option<String>,
    /// Usable GPUs per model.
    pub gpus: BTreeMap<String, u32>,
    /// Power usage effectiveness.
    #[serde(default = "one")]
    pub pue: f64,
    /// Grid import limit, kW (absent = unlimited).
    #[serde(default)]
    pub grid_limit_kw: Option<f64>,
    /// WAN bandwidth, Gbit/s (10 when absent, as in the instance format).
    #[serde(default = "default_wan_gbps")]
    pub wan_gbps: f64,
}

impl SiteConfig {
    /// GPUs of `model` at the site.
    pub fn gpus_of(&self, model: &str) -> u32 {
        self.gpus.get(model).copied().unwrap_or(0)
    }
}

fn one() -> f64 {
    1.0
}

fn default_wan_gbps() -> f64 {
    10.0
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Unique id.
    pub id: String,
    /// Lifecycle state.
    pub state: JobState,
    /// Gang size.
    pub gpus: u32,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
    /// Remaining work, hours at full power on a speed-1.0 GPU.
    pub work_hours: f64,
    /// Earliest start.
    pub release_utc: DateTime<Utc>,
    /// Hard deadline.
    pub deadline_utc: DateTime<Utc>,
    /// Checkpoint size, GB.
    pub checkpoint_gb: f64,
    /// Seconds to write a checkpoint.
    pub save_s: f64,
    /// Seconds to restore one.
    pub restore_s: f64,
    /// Whether the job may move between sites.
    pub migratable: bool,
    /// Site it was submitted to.
    pub home_site: String,
    /// Where its checkpoint or process is now.
    pub current_site: Option<String>,
    /// Why the job is in its state (e.g. infeasibility reason).
    pub state_reason: Option<String>,
    /// When it was submitted.
    pub submitted_utc: DateTime<Utc>,
    /// Who submitted it (the token's name); `None` for jobs loaded from files.
    pub owner: Option<String>,
    /// The command or Slurm script the site agent runs.
    pub command: Option<String>,
}

/// Which forecast issue a plan used for one site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignalProvenance {
    /// Site id.
    pub site: String,
    /// Forecast sources used.
    pub sources: Vec<String>,
    /// Oldest and newest issue time among the values used.
    pub issued_utc_min: Option<DateTime<Utc>>,
    /// Newest issue time among the values used.
    pub issued_utc_max: Option<DateTime<Utc>>,
    /// Carbon signal type of the values used.
    pub carbon_signal: String,
    /// Slots with no forecast, filled by the documented fallback.
    pub filled_slots: usize,
    /// Why this site's signals make the plan degraded (stale, gaps filled, signals mixed);
    /// empty when they are sound.
    #[serde(default)]
    pub degraded: Vec<String>,
}

/// Every degraded-signal reason of a plan, as `site ID: reason` lines.
pub fn degraded_reasons(provenance: &[SignalProvenance]) -> Vec<String> {
    provenance
        .iter()
        .flat_map(|p| {
            p.degraded
                .iter()
                .map(move |r| format!("site {}: {r}", p.site))
        })
        .collect()
}

/// A plan to store: the solver's output plus context.
#[derive(Clone, Debug)]
pub struct NewPlan {
    /// When it was made.
    pub created_utc: DateTime<Utc>,
    /// Start of slot 0.
    pub horizon_start_utc: DateTime<Utc>,
    /// Slot length.
    pub slot_minutes: u32,
    /// Number of slots.
    pub slots: usize,
    /// Solver metrics.
    pub metrics: Metrics,
    /// Inputs' provenance per site.
    pub provenance: Vec<SignalProvenance>,
    /// The exact instance solved (JSON), for audit and re-validation.
    pub instance_json: String,
    /// The plan.
    pub plan: windfall_solver::Plan,
}

/// A stored plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlanRecord {
    /// Version: plans are numbered in creation order.
    pub id: i64,
    /// When it was made.
    pub created_utc: DateTime<Utc>,
    /// Start of slot 0.
    pub horizon_start_utc: DateTime<Utc>,
    /// Slot length.
    pub slot_minutes: u32,
    /// Number of slots.
    pub slots: usize,
    /// Solver metrics.
    pub metrics: Metrics,
    /// Inputs' provenance per site.
    pub provenance: Vec<SignalProvenance>,
    /// The instance solved (JSON).
    pub instance_json: String,
    /// The plan.
    pub plan: windfall_solver::Plan,
}
