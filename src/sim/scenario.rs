//! A scenario folder (formats.md section 2): `sites.toml`, `signals.csv`, optional
//! `forecasts.csv`, `jobs.csv`, loaded into a checked, indexed form.
//!
//! Owns reading and cross-checking the files: every site has exactly one actual per slot on one
//! regular grid, every job names a known site and models, and forecasts cover each slot with a
//! value issued no later than the slot's start. It must not look at policies or run anything.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use windfall_forecasts::SignalRow;
use windfall_solver::{GpuModel, Params};

use super::forecast::Signal;
pub use crate::model::SiteConfig;

/// Why a scenario was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file could not be parsed.
    #[error("{0}")]
    Parse(#[from] windfall_forecasts::ParseError),
    /// `sites.toml` is malformed.
    #[error("{path}: {message}")]
    Sites {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The files disagree with each other.
    #[error("{file}: {message}")]
    Inconsistent {
        /// The file the problem was found in.
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// `sites.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SitesFile {
    /// GPU models by name.
    pub gpu_models: BTreeMap<String, GpuModel>,
    /// The sites.
    pub sites: Vec<SiteConfig>,
    /// Link bandwidth overrides, Gbit/s.
    #[serde(default)]
    pub links_gbps: BTreeMap<String, BTreeMap<String, f64>>,
    /// Model parameters (alpha, transfer energy, penalties).
    #[serde(default)]
    pub params: Params,
}

/// The static part of a scenario: what every policy may know in advance.
#[derive(Clone, Debug)]
pub struct Fleet {
    /// Model names, in index order.
    pub model_names: Vec<String>,
    /// Models, in index order.
    pub models: Vec<GpuModel>,
    /// Sites, in file order.
    pub sites: Vec<SiteConfig>,
    /// Link overrides as given.
    pub links_gbps: BTreeMap<String, BTreeMap<String, f64>>,
    link_matrix_gbps: Vec<Vec<f64>>,
    /// Model parameters.
    pub params: Params,
    /// Start of slot 0.
    pub start_utc: DateTime<Utc>,
    /// Slot length, minutes.
    pub slot_minutes: u32,
    /// Number of slots.
    pub slots: usize,
}

impl Fleet {
    /// Slot length, hours.
    pub fn slot_hours(&self) -> f64 {
        f64::from(self.slot_minutes) / 60.0
    }

    /// Start time of a slot.
    pub fn slot_start(&self, slot: usize) -> DateTime<Utc> {
        self.start_utc + chrono::Duration::minutes(i64::from(self.slot_minutes) * slot as i64)
    }

    /// Link bandwidth between two sites, Gbit/s (an override, else the smaller WAN).
    pub fn link_gbps(&self, from: usize, to: usize) -> f64 {
        self.link_matrix_gbps[from][to]
    }

    /// The GPU models by name, as the solver's instance takes them.
    pub fn gpu_models(&self) -> BTreeMap<String, GpuModel> {
        self.model_names
            .iter()
            .cloned()
            .zip(self.models.iter().cloned())
            .collect()
    }

    /// Index of a site id.
    pub fn site_index(&self, id: &str) -> Option<usize> {
        self.sites.iter().position(|s| s.id == id)
    }
}

/// A job of `jobs.csv`, indexed.
#[derive(Clone, Debug)]
pub struct SimJob {
    /// Job id.
    pub id: String,
    /// Submission time.
    pub submit_utc: DateTime<Utc>,
    /// Submission, hours after the scenario start.
    pub submit_h: f64,
    /// First slot that starts at or after submission.
    pub release_slot: usize,
    /// GPUs used together.
    pub gpus: u32,
    /// Allowed model indexes (all models when the file leaves it empty).
    pub models: Vec<usize>,
    /// Work, hours at full power on a speed-1.0 GPU.
    pub work_hours: f64,
    /// Deadline.
    pub deadline_utc: DateTime<Utc>,
    /// Deadline, hours after the scenario start.
    pub deadline_h: f64,
    /// Slots that lie wholly before the deadline end before this one.
    pub deadline_slot: usize,
    /// Checkpoint size, GB.
    pub checkpoint_gb: f64,
    /// Seconds to write a checkpoint.
    pub save_s: f64,
    /// Seconds to restore one.
    pub restore_s: f64,
    /// Whether it may move between sites.
    pub migratable: bool,
    /// Home site index.
    pub home_site: usize,
}

impl SimJob {
    /// Whether the job may run on model index `model`.
    pub fn allows(&self, model: usize) -> bool {
        self.models.contains(&model)
    }
}

/// Forecast values by site and target slot: (issue time, value), oldest issue first.
pub(crate) type ForecastTable = Vec<Vec<Vec<(DateTime<Utc>, Signal)>>>;

/// A loaded scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Folder name, for reports.
    pub name: String,
    /// Sites, models, grid of slots.
    pub fleet: Fleet,
    /// Jobs in file order.
    pub jobs: Vec<SimJob>,
    actual: Vec<Vec<Signal>>,
    /// Forecast rows by site, target slot: (issued, value), sorted by issue time.
    pub(crate) forecast_rows: Option<ForecastTable>,
}

impl Scenario {
    /// The actual signal at a site and slot (the engine's accounting; policies never see it).
    pub(crate) fn actual(&self, site: usize, slot: usize) -> Signal {
        self.actual[site][slot]
    }

    /// Loads and checks a scenario folder.
    pub fn load(dir: &Path) -> Result<Scenario, ScenarioError> {
        let read = |name: &str| -> Result<String, ScenarioError> {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| ScenarioError::Io { path, source })
        };
        let sites_path = dir.join("sites.toml");
        let sites_text = read("sites.toml")?;
        let file: SitesFile = toml::from_str(&sites_text).map_err(|e| ScenarioError::Sites {
            path: sites_path.clone(),
            message: e.to_string(),
        })?;
        let signals = windfall_forecasts::parse_signals_csv(
            &read("signals.csv")?,
            &dir.join("signals.csv").display().to_string(),
        )?;
        let forecasts_path = dir.join("forecasts.csv");
        let forecasts = if forecasts_path.exists() {
            Some(windfall_forecasts::parse_scenario_forecasts_csv(
                &read("forecasts.csv")?,
                &forecasts_path.display().to_string(),
            )?)
        } else {
            None
        };
        let jobs = windfall_forecasts::parse_jobs_csv(
            &read("jobs.csv")?,
            &dir.join("jobs.csv").display().to_string(),
        )?;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        Scenario::from_parts(
            name,
            file,
            &signals,
            forecasts.as_deref(),
            &jobs,
            &sites_path,
        )
    }

    /// Builds a scenario from parsed parts (`sites_path` labels errors about `sites.toml`).
    pub fn from_parts(
        name: String,
        file: SitesFile,
        signals: &[SignalRow],
        forecasts: Option<&[SignalRow]>,
        jobs: &[windfall_forecasts::JobRow],
        sites_path: &Path,
    ) -> Result<Scenario, ScenarioError> {
        let sites_err = |message: String| ScenarioError::Sites {
            path: sites_path.to_path_buf(),
            message,
        };
        let inconsistent = |file: &str, message: String| ScenarioError::Inconsistent {
            file: file.to_string(),
            message,
        };
        if file.sites.is_empty() {
            return Err(sites_err("no sites".into()));
        }
        for (name, model) in &file.gpu_models {
            let levels = &model.power_levels_w;
            if levels.is_empty()
                || levels.len() != model.throughput.len()
                || levels.windows(2).any(|w| w[1] >= w[0])
                || levels.iter().any(|w| !(w.is_finite() && *w > 0.0))
                || model
                    .throughput
                    .iter()
                    .any(|t| !(t.is_finite() && *t > 0.0))
                || !(model.speed.is_finite() && model.speed > 0.0)
                || !(model.idle_w.is_finite() && model.idle_w >= 0.0)
            {
                return Err(sites_err(format!(
                    "gpu model `{name}`: power_levels_w must be positive and strictly decreasing, with one positive throughput each, speed > 0 and idle_w >= 0"
                )));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for site in &file.sites {
            if !ids.insert(site.id.as_str()) {
                return Err(sites_err(format!("site `{}` is listed twice", site.id)));
            }
            if let Some(model) = site.gpus.keys().find(|m| !file.gpu_models.contains_key(*m)) {
                return Err(sites_err(format!(
                    "site `{}`: unknown gpu model `{model}`",
                    site.id
                )));
            }
            if !(site.pue.is_finite() && site.pue >= 1.0) {
                return Err(sites_err(format!(
                    "site `{}`: pue must be >= 1, not {}",
                    site.id, site.pue
                )));
            }
            if !(site.wan_gbps.is_finite() && site.wan_gbps > 0.0) {
                return Err(sites_err(format!(
                    "site `{}`: wan_gbps must be > 0, not {}",
                    site.id, site.wan_gbps
                )));
            }
            if site
                .grid_limit_kw
                .is_some_and(|l| !(l.is_finite() && l >= 0.0))
            {
                return Err(sites_err(format!(
                    "site `{}`: grid_limit_kw must be >= 0",
                    site.id
                )));
            }
        }
        let site_index: HashMap<&str, usize> = file
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect();
        let n_sites = file.sites.len();
        let mut link_matrix_gbps: Vec<Vec<f64>> = file
            .sites
            .iter()
            .map(|a| {
                file.sites
                    .iter()
                    .map(|b| a.wan_gbps.min(b.wan_gbps))
                    .collect()
            })
            .collect();
        for (from, row) in &file.links_gbps {
            for (to, &gbps) in row {
                let (Some(&a), Some(&b)) =
                    (site_index.get(from.as_str()), site_index.get(to.as_str()))
                else {
                    return Err(sites_err(format!(
                        "links_gbps names an unknown site: `{from}` -> `{to}`"
                    )));
                };
                if !(gbps.is_finite() && gbps > 0.0) {
                    return Err(sites_err(format!(
                        "links_gbps `{from}` -> `{to}` must be > 0"
                    )));
                }
                link_matrix_gbps[a][b] = gbps;
                if !file
                    .links_gbps
                    .get(to)
                    .is_some_and(|r| r.contains_key(from))
                {
                    link_matrix_gbps[b][a] = gbps;
                }
            }
        }

        // The slot grid comes from the actuals.
        let mut times: Vec<DateTime<Utc>> = signals.iter().map(|r| r.time_utc).collect();
        times.sort();
        times.dedup();
        if times.len() < 2 {
            return Err(inconsistent(
                "signals.csv",
                "needs at least two slots to tell the slot length".into(),
            ));
        }
        // The slot length is the smallest step; any other step is a gap.
        let step = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .min()
            .expect("at least two times");
        let slot_minutes = step.num_minutes();
        if slot_minutes <= 0 || step.num_seconds() % 60 != 0 {
            return Err(inconsistent(
                "signals.csv",
                format!("slot length {step} is not a whole number of minutes"),
            ));
        }
        if let Some(w) = times.windows(2).find(|w| w[1] - w[0] != step) {
            return Err(inconsistent(
                "signals.csv",
                format!(
                    "times are not on a regular {slot_minutes}-minute grid: {} is followed by {} (a missing slot?)",
                    w[0].to_rfc3339(),
                    w[1].to_rfc3339()
                ),
            ));
        }
        let start_utc = times[0];
        let n_slots = times.len();
        let slot_of = |t: DateTime<Utc>| -> Option<usize> {
            let minutes = (t - start_utc).num_minutes();
            ((t - start_utc).num_seconds() % 60 == 0 && minutes % slot_minutes == 0)
                .then_some((minutes / slot_minutes) as usize)
                .filter(|&s| s < n_slots)
        };
        let mut actual: Vec<Vec<Option<Signal>>> = vec![vec![None; n_slots]; n_sites];
        for row in signals {
            let Some(&s) = site_index.get(row.site.as_str()) else {
                return Err(inconsistent(
                    "signals.csv",
                    format!("unknown site `{}` (not in sites.toml)", row.site),
                ));
            };
            let slot = slot_of(row.time_utc).expect("every time is on the grid");
            if actual[s][slot].is_some() {
                return Err(inconsistent(
                    "signals.csv",
                    format!(
                        "site `{}` has two rows for {}",
                        row.site,
                        row.time_utc.to_rfc3339()
                    ),
                ));
            }
            actual[s][slot] = Some(Signal::from(row));
        }
        let mut actual_full = Vec::with_capacity(n_sites);
        for (s, series) in actual.into_iter().enumerate() {
            let mut full = Vec::with_capacity(n_slots);
            for (slot, value) in series.into_iter().enumerate() {
                let Some(value) = value else {
                    return Err(inconsistent(
                        "signals.csv",
                        format!(
                            "site `{}` has no row for {}",
                            file.sites[s].id,
                            (start_utc + step * slot as i32).to_rfc3339()
                        ),
                    ));
                };
                full.push(value);
            }
            actual_full.push(full);
        }

        let forecast_rows = match forecasts {
            None => None,
            Some(rows) => {
                let mut table: ForecastTable = vec![vec![Vec::new(); n_slots]; n_sites];
                for row in rows {
                    let Some(&s) = site_index.get(row.site.as_str()) else {
                        return Err(inconsistent(
                            "forecasts.csv",
                            format!("unknown site `{}` (not in sites.toml)", row.site),
                        ));
                    };
                    let Some(slot) = slot_of(row.time_utc) else {
                        continue; // outside the replay: harmless
                    };
                    let issued = row.issued_utc.expect("forecast rows carry an issue time");
                    table[s][slot].push((issued, Signal::from(row)));
                }
                for (s, site) in table.iter_mut().enumerate() {
                    for (slot, values) in site.iter_mut().enumerate() {
                        values.sort_by_key(|(issued, _)| *issued);
                        let slot_start = start_utc + step * slot as i32;
                        if values
                            .first()
                            .is_none_or(|(issued, _)| *issued > slot_start)
                        {
                            return Err(inconsistent(
                                "forecasts.csv",
                                format!(
                                    "site `{}` has no forecast for {} issued at or before that time",
                                    file.sites[s].id,
                                    slot_start.to_rfc3339()
                                ),
                            ));
                        }
                    }
                }
                Some(table)
            }
        };

        let model_names: Vec<String> = file.gpu_models.keys().cloned().collect();
        let models: Vec<GpuModel> = file.gpu_models.values().cloned().collect();
        let slot_h = slot_minutes as f64 / 60.0;
        let hours_of = |t: DateTime<Utc>| (t - start_utc).num_seconds() as f64 / 3600.0;
        let mut seen = std::collections::BTreeSet::new();
        let mut sim_jobs = Vec::with_capacity(jobs.len());
        for row in jobs {
            let bad =
                |message: String| inconsistent("jobs.csv", format!("job `{}`: {message}", row.id));
            if !seen.insert(row.id.as_str()) {
                return Err(bad("the id is used twice".into()));
            }
            let Some(&home_site) = site_index.get(row.home_site.as_str()) else {
                return Err(bad(format!("unknown home_site `{}`", row.home_site)));
            };
            let models: Vec<usize> = if row.gpu_models.is_empty() {
                (0..model_names.len()).collect()
            } else {
                let mut indexes = Vec::new();
                for m in &row.gpu_models {
                    let Some(i) = model_names.iter().position(|n| n == m) else {
                        return Err(bad(format!("unknown gpu model `{m}`")));
                    };
                    indexes.push(i);
                }
                indexes
            };
            let fits = file.sites.iter().any(|s| {
                models
                    .iter()
                    .any(|&m| s.gpus_of(&model_names[m]) >= row.gpus)
            });
            if !fits {
                return Err(bad(format!(
                    "no site has {} GPUs of an allowed model",
                    row.gpus
                )));
            }
            let submit_h = hours_of(row.submit_utc);
            let deadline_h = hours_of(row.deadline_utc);
            sim_jobs.push(SimJob {
                id: row.id.clone(),
                submit_utc: row.submit_utc,
                submit_h,
                release_slot: (submit_h / slot_h - 1e-9).ceil().max(0.0) as usize,
                gpus: row.gpus,
                models,
                work_hours: row.work_hours,
                deadline_utc: row.deadline_utc,
                deadline_h,
                deadline_slot: (deadline_h / slot_h + 1e-9).floor().max(0.0) as usize,
                checkpoint_gb: row.checkpoint_gb,
                save_s: row.save_s.unwrap_or(0.0),
                restore_s: row.restore_s.unwrap_or(0.0),
                migratable: row.migratable,
                home_site,
            });
        }
        Ok(Scenario {
            name,
            fleet: Fleet {
                model_names,
                models,
                sites: file.sites,
                links_gbps: file.links_gbps,
                link_matrix_gbps,
                params: file.params,
                start_utc,
                slot_minutes: slot_minutes as u32,
                slots: n_slots,
            },
            jobs: sim_jobs,
            actual: actual_full,
            forecast_rows,
        })
    }
}
