//! The instance format of formats.md section 1: everything one planning run needs.
//!
//! Owns parsing (JSON text in, typed [`Instance`] out) and semantic checks that name the offending
//! field. It must not read files or consult the clock: callers hand it text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A UTC instant that must be written in RFC 3339 with an explicit offset.
///
/// Rationale: a time without an offset is ambiguous across the regions windfall plans over, so it
/// is rejected instead of guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UtcTime(pub DateTime<Utc>);

impl UtcTime {
    /// Parses RFC 3339 text with an offset, converting it to UTC.
    pub fn parse(text: &str) -> Result<Self, String> {
        DateTime::parse_from_rfc3339(text)
            .map(|t| UtcTime(t.with_timezone(&Utc)))
            .map_err(|_| {
                format!(
                    "`{text}` is not an RFC 3339 time with a UTC offset (write e.g. 2023-06-01T00:00:00Z)"
                )
            })
    }
}

impl fmt::Display for UtcTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%dT%H:%M:%SZ"))
    }
}

impl Serialize for UtcTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for UtcTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        UtcTime::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Whether a carbon series is an average (attributional) or marginal signal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CarbonSignal {
    /// Average intensity of the grid mix.
    #[default]
    Average,
    /// Intensity of the marginal generator.
    Marginal,
}

/// One planning problem.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// Start of slot 0.
    pub start_utc: UtcTime,
    /// Slot length in minutes.
    pub slot_minutes: u32,
    /// Number of slots in the horizon.
    pub slots: usize,
    /// GPU models by name.
    pub gpu_models: BTreeMap<String, GpuModel>,
    /// Sites with their inventory and per-slot signals.
    pub sites: Vec<Site>,
    /// Site-to-site bandwidth overrides in Gbit/s.
    #[serde(default)]
    pub links_gbps: BTreeMap<String, BTreeMap<String, f64>>,
    /// Jobs to place.
    pub jobs: Vec<Job>,
    /// Model parameters.
    #[serde(default)]
    pub params: Params,
    /// The previous plan's assignments, for plan stability: for each job they run, each job-slot
    /// run added or dropped against them costs `params.change_penalty_g` (a slot moved to another site, GPU model or
    /// power cap counts twice). Entries that no longer match the instance (a job or site gone, a
    /// cap that is not a level) are ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_assignments: Vec<crate::plan::Assignment>,
}

/// Power levels and throughput of one GPU model.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    /// Allowed power caps in W, first = full power, strictly decreasing.
    pub power_levels_w: Vec<f64>,
    /// Relative throughput at each level, first = 1.0.
    pub throughput: Vec<f64>,
    /// Speed against the reference GPU (work hours per hour at full power).
    #[serde(default = "one")]
    pub speed: f64,
    /// Power drawn by a powered GPU that runs no job, in W.
    #[serde(default)]
    pub idle_w: f64,
}

fn one() -> f64 {
    1.0
}

/// A site: inventory, limits and signals.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Site {
    /// Unique site id.
    pub id: String,
    /// Grid zone (informative).
    #[serde(default)]
    pub zone: Option<String>,
    /// Usable GPUs per model.
    pub gpus: BTreeMap<String, u32>,
    /// Power usage effectiveness (>= 1).
    #[serde(default = "one")]
    pub pue: f64,
    /// Grid import limit in kW; absent = unlimited.
    #[serde(default)]
    pub grid_limit_kw: Option<f64>,
    /// WAN bandwidth in Gbit/s.
    #[serde(default = "default_wan")]
    pub wan_gbps: f64,
    /// Zero-carbon surplus power available per slot, kW.
    pub surplus_kw: Vec<f64>,
    /// Grid carbon intensity per slot, g CO2e/kWh.
    pub carbon_g_per_kwh: Vec<f64>,
    /// Whether the carbon series is average or marginal.
    #[serde(default)]
    pub carbon_signal: CarbonSignal,
    /// Wholesale price per slot, USD/MWh (optional).
    #[serde(default)]
    pub price_usd_per_mwh: Option<Vec<f64>>,
}

fn default_wan() -> f64 {
    10.0
}

/// A deferrable job.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique job id.
    pub id: String,
    /// Gang size: GPUs used together at one site.
    pub gpus: u32,
    /// Allowed GPU models; empty = any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Remaining work in hours at full power on a speed-1.0 GPU.
    pub work_hours: f64,
    /// Earliest start.
    pub release_utc: UtcTime,
    /// Hard deadline.
    pub deadline_utc: UtcTime,
    /// Checkpoint size in GB.
    #[serde(default)]
    pub checkpoint_gb: f64,
    /// Seconds to write a checkpoint.
    #[serde(default)]
    pub save_s: f64,
    /// Seconds to restore from a checkpoint.
    #[serde(default)]
    pub restore_s: f64,
    /// Whether the job may move between sites.
    #[serde(default)]
    pub migratable: bool,
    /// The site the job was submitted to (baseline site).
    pub home_site: String,
    /// Where the job's checkpoint or process is now, if anywhere.
    #[serde(default)]
    pub current_site: Option<String>,
}

/// Model parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Feasibility-domain factor: a migration needs `transfer_s <= alpha * window`.
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Energy to move one GB of checkpoint, charged to both ends.
    #[serde(default = "default_transfer_kwh_per_gb")]
    pub transfer_kwh_per_gb: f64,
    /// Grams of CO2e one USD of energy cost is worth in the objective.
    #[serde(default)]
    pub lambda_cost_g_per_usd: f64,
    /// Objective penalty per migration, g CO2e.
    #[serde(default)]
    pub migration_penalty_g: f64,
    /// Objective penalty per job-slot run added or dropped against `previous_assignments`, g
    /// CO2e. Rationale: a rerun with unchanged inputs returns the same plan, and a job moves only
    /// for a real gain.
    #[serde(default = "default_change_penalty_g")]
    pub change_penalty_g: f64,
}

fn default_alpha() -> f64 {
    0.1
}
fn default_transfer_kwh_per_gb() -> f64 {
    0.005
}
fn default_change_penalty_g() -> f64 {
    1.0
}

impl Default for Params {
    fn default() -> Self {
        Params {
            alpha: default_alpha(),
            transfer_kwh_per_gb: default_transfer_kwh_per_gb(),
            lambda_cost_g_per_usd: 0.0,
            migration_penalty_g: 0.0,
            change_penalty_g: default_change_penalty_g(),
        }
    }
}

/// Why an instance was refused.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The text is not valid JSON or does not match the schema.
    #[error("{path}: {message} (line {line}, column {column})")]
    Syntax {
        /// Path of the field, e.g. `jobs[2].gpus`, or `.` for the document.
        path: String,
        /// What is wrong.
        message: String,
        /// 1-based line in the text.
        line: usize,
        /// 1-based column in the text.
        column: usize,
    },
    /// The document parses but a value is out of its domain.
    #[error("{field}: {message}")]
    Invalid {
        /// Path of the field, e.g. `sites[1].surplus_kw`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> InstanceError {
    InstanceError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

impl Instance {
    /// Parses and checks an instance from JSON text.
    pub fn from_json(text: &str) -> Result<Instance, InstanceError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let instance: Instance =
            serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner();
                InstanceError::Syntax {
                    path,
                    message: strip_position(&inner.to_string()),
                    line: inner.line(),
                    column: inner.column(),
                }
            })?;
        instance.check()?;
        Ok(instance)
    }

    /// Serialises the instance as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("instance serialises")
    }

    /// Slot length in hours.
    pub fn slot_hours(&self) -> f64 {
        f64::from(self.slot_minutes) / 60.0
    }

    /// Checks every value against its domain; the first problem found is returned.
    pub fn check(&self) -> Result<(), InstanceError> {
        if self.slot_minutes == 0 {
            return Err(invalid("slot_minutes", "must be at least 1"));
        }
        if self.slots == 0 {
            return Err(invalid("slots", "must be at least 1"));
        }
        if self.gpu_models.is_empty() {
            return Err(invalid("gpu_models", "at least one GPU model is needed"));
        }
        for (name, model) in &self.gpu_models {
            let field = format!("gpu_models.{name}");
            if model.power_levels_w.is_empty() {
                return Err(invalid(
                    format!("{field}.power_levels_w"),
                    "needs at least one level",
                ));
            }
            if model.power_levels_w.len() != model.throughput.len() {
                return Err(invalid(
                    format!("{field}.throughput"),
                    format!(
                        "has {} values but power_levels_w has {}",
                        model.throughput.len(),
                        model.power_levels_w.len()
                    ),
                ));
            }
            for (i, &p) in model.power_levels_w.iter().enumerate() {
                if !(p.is_finite() && p > 0.0) {
                    return Err(invalid(
                        format!("{field}.power_levels_w[{i}]"),
                        format!("must be a positive number of watts, got {p}"),
                    ));
                }
                if i > 0 && p >= model.power_levels_w[i - 1] {
                    return Err(invalid(
                        format!("{field}.power_levels_w[{i}]"),
                        "levels must be strictly decreasing (first = full power)",
                    ));
                }
            }
            for (i, &f) in model.throughput.iter().enumerate() {
                if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                    return Err(invalid(
                        format!("{field}.throughput[{i}]"),
                        format!("must be in (0, 1], got {f}"),
                    ));
                }
            }
            if (model.throughput[0] - 1.0).abs() > 1e-9 {
                return Err(invalid(
                    format!("{field}.throughput[0]"),
                    "the first level is full power and must have throughput 1.0",
                ));
            }
            if !(model.speed.is_finite() && model.speed > 0.0) {
                return Err(invalid(format!("{field}.speed"), "must be positive"));
            }
            if !(model.idle_w.is_finite() && model.idle_w >= 0.0) {
                return Err(invalid(format!("{field}.idle_w"), "must be >= 0"));
            }
        }
        if self.sites.is_empty() {
            return Err(invalid("sites", "at least one site is needed"));
        }
        let mut site_ids = BTreeSet::new();
        for (i, site) in self.sites.iter().enumerate() {
            let field = format!("sites[{i}]");
            if site.id.is_empty() {
                return Err(invalid(format!("{field}.id"), "must not be empty"));
            }
            if !site_ids.insert(site.id.as_str()) {
                return Err(invalid(
                    format!("{field}.id"),
                    format!("duplicate site id `{}`", site.id),
                ));
            }
            for model in site.gpus.keys() {
                if !self.gpu_models.contains_key(model) {
                    return Err(invalid(
                        format!("{field}.gpus.{model}"),
                        format!("unknown GPU model `{model}` (not in gpu_models)"),
                    ));
                }
            }
            if !(site.pue.is_finite() && site.pue >= 1.0) {
                return Err(invalid(
                    format!("{field}.pue"),
                    format!("must be >= 1, got {}", site.pue),
                ));
            }
            if let Some(limit) = site.grid_limit_kw
                && !(limit.is_finite() && limit >= 0.0)
            {
                return Err(invalid(format!("{field}.grid_limit_kw"), "must be >= 0"));
            }
            if !(site.wan_gbps.is_finite() && site.wan_gbps > 0.0) {
                return Err(invalid(format!("{field}.wan_gbps"), "must be positive"));
            }
            check_series(&field, "surplus_kw", &site.surplus_kw, self.slots, 0.0)?;
            check_series(
                &field,
                "carbon_g_per_kwh",
                &site.carbon_g_per_kwh,
                self.slots,
                0.0,
            )?;
            if let Some(prices) = &site.price_usd_per_mwh {
                check_series(
                    &field,
                    "price_usd_per_mwh",
                    prices,
                    self.slots,
                    f64::NEG_INFINITY,
                )?;
            }
        }
        for (from, row) in &self.links_gbps {
            if !site_ids.contains(from.as_str()) {
                return Err(invalid(
                    format!("links_gbps.{from}"),
                    format!("unknown site `{from}`"),
                ));
            }
            for (to, &gbps) in row {
                if !site_ids.contains(to.as_str()) {
                    return Err(invalid(
                        format!("links_gbps.{from}.{to}"),
                        format!("unknown site `{to}`"),
                    ));
                }
                if !(gbps.is_finite() && gbps > 0.0) {
                    return Err(invalid(
                        format!("links_gbps.{from}.{to}"),
                        "must be positive",
                    ));
                }
            }
        }
        let mut job_ids = BTreeSet::new();
        for (i, job) in self.jobs.iter().enumerate() {
            let field = format!("jobs[{i}]");
            if job.id.is_empty() {
                return Err(invalid(format!("{field}.id"), "must not be empty"));
            }
            if !job_ids.insert(job.id.as_str()) {
                return Err(invalid(
                    format!("{field}.id"),
                    format!("duplicate job id `{}`", job.id),
                ));
            }
            let field = format!("jobs[{i}] ({})", job.id);
            if job.gpus == 0 {
                return Err(invalid(format!("{field}.gpus"), "must be at least 1"));
            }
            for model in &job.gpu_models {
                if !self.gpu_models.contains_key(model) {
                    return Err(invalid(
                        format!("{field}.gpu_models"),
                        format!("unknown GPU model `{model}`"),
                    ));
                }
            }
            if !(job.work_hours.is_finite() && job.work_hours > 0.0) {
                return Err(invalid(
                    format!("{field}.work_hours"),
                    format!("must be positive, got {}", job.work_hours),
                ));
            }
            if job.deadline_utc <= job.release_utc {
                return Err(invalid(
                    format!("{field}.deadline_utc"),
                    format!(
                        "deadline {} is not after release {}",
                        job.deadline_utc, job.release_utc
                    ),
                ));
            }
            for (name, value) in [
                ("checkpoint_gb", job.checkpoint_gb),
                ("save_s", job.save_s),
                ("restore_s", job.restore_s),
            ] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(invalid(
                        format!("{field}.{name}"),
                        format!("must be >= 0, got {value}"),
                    ));
                }
            }
            if !site_ids.contains(job.home_site.as_str()) {
                return Err(invalid(
                    format!("{field}.home_site"),
                    format!("unknown site `{}`", job.home_site),
                ));
            }
            if let Some(current) = &job.current_site
                && !site_ids.contains(current.as_str())
            {
                return Err(invalid(
                    format!("{field}.current_site"),
                    format!("unknown site `{current}`"),
                ));
            }
        }
        let p = &self.params;
        if !(p.alpha.is_finite() && p.alpha > 0.0 && p.alpha <= 1.0) {
            return Err(invalid("params.alpha", "must be in (0, 1]"));
        }
        for (name, value) in [
            ("transfer_kwh_per_gb", p.transfer_kwh_per_gb),
            ("lambda_cost_g_per_usd", p.lambda_cost_g_per_usd),
            ("migration_penalty_g", p.migration_penalty_g),
            ("change_penalty_g", p.change_penalty_g),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(format!("params.{name}"), "must be >= 0"));
            }
        }
        Ok(())
    }
}

fn check_series(
    site_field: &str,
    name: &str,
    values: &[f64],
    slots: usize,
    min: f64,
) -> Result<(), InstanceError> {
    if values.len() != slots {
        return Err(invalid(
            format!("{site_field}.{name}"),
            format!(
                "has {} values but the horizon has {slots} slots",
                values.len()
            ),
        ));
    }
    for (t, &v) in values.iter().enumerate() {
        if !v.is_finite() || v < min {
            return Err(invalid(
                format!("{site_field}.{name}[{t}]"),
                format!("must be a finite number >= {min}, got {v}"),
            ));
        }
    }
    Ok(())
}

/// serde_json appends " at line L column C"; the error carries those separately.
pub(crate) fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(idx) => message[..idx].to_string(),
        None => message.to_string(),
    }
}
