//! Fleet configuration and instance assembly: loads a fleet file (sites, GPU models, links) and
//! the bundled samples into the store, and builds a solver instance from what the store knows.
//!
//! Owns the rule that turns stored forecasts into per-slot series (newest issue at or before the
//! planning time; a slot without a value takes the value of the same slot one day earlier, else
//! the nearest earlier slot, and is counted in the provenance). It writes no SQL itself.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use windfall_forecasts::samples;
use windfall_solver::{CarbonSignal, Instance, Job, Params, Site, UtcTime};

use crate::db::Store;
use crate::model::{GpuModel, JobRecord, JobState, SignalProvenance, SiteConfig};

/// A fleet file: GPU models, sites and link overrides (TOML).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// GPU models by name.
    pub gpu_models: BTreeMap<String, GpuModel>,
    /// Sites.
    pub sites: Vec<SiteConfig>,
    /// from -> to -> Gbit/s.
    #[serde(default)]
    pub links_gbps: BTreeMap<String, BTreeMap<String, f64>>,
}

impl FleetFile {
    /// Parses fleet TOML; `source_name` labels errors.
    pub fn parse(text: &str, source_name: &str) -> Result<FleetFile> {
        toml::from_str(text).with_context(|| format!("reading fleet file {source_name}"))
    }
}

/// Seconds to save and restore a checkpoint when a job file gives none.
pub const DEFAULT_SAVE_S: f64 = 60.0;
/// See [`DEFAULT_SAVE_S`].
pub const DEFAULT_RESTORE_S: f64 = 120.0;

/// Loads the bundled sample fleet, signals and jobs into an empty store.
pub async fn load_samples(store: &Store, now: DateTime<Utc>) -> Result<SampleCounts> {
    let fleet = FleetFile::parse(samples::SITES_TOML, "bundled sample_sites.toml")?;
    for (name, model) in &fleet.gpu_models {
        store.upsert_gpu_model(name, model).await?;
    }
    for site in &fleet.sites {
        store.upsert_site(site, now).await?;
    }
    for (from, row) in &fleet.links_gbps {
        for (to, gbps) in row {
            store.upsert_link(from, to, *gbps).await?;
        }
    }
    let points = windfall_forecasts::parse_canonical_csv(
        samples::SIGNALS_CSV,
        "bundled sample_signals.csv",
    )?;
    let n_points = store
        .insert_forecasts("sample:electricitymaps+iso-prices", &points)
        .await?;
    let rows = windfall_forecasts::parse_jobs_csv(samples::JOBS_CSV, "bundled sample_jobs.csv")?;
    for row in &rows {
        store
            .insert_job(&JobRecord {
                id: row.id.clone(),
                state: JobState::Queued,
                gpus: row.gpus,
                gpu_models: row.gpu_models.clone(),
                work_hours: row.work_hours,
                release_utc: row.submit_utc,
                deadline_utc: row.deadline_utc,
                checkpoint_gb: row.checkpoint_gb,
                save_s: DEFAULT_SAVE_S,
                restore_s: DEFAULT_RESTORE_S,
                migratable: row.migratable,
                home_site: row.home_site.clone(),
                current_site: None,
                state_reason: None,
                submitted_utc: row.submit_utc,
                owner: None,
                command: None,
            })
            .await?;
    }
    Ok(SampleCounts {
        sites: fleet.sites.len(),
        forecast_points: n_points,
        jobs: rows.len(),
    })
}

/// What [`load_samples`] loaded.
#[derive(Clone, Copy, Debug)]
pub struct SampleCounts {
    /// Sites.
    pub sites: usize,
    /// Forecast rows.
    pub forecast_points: usize,
    /// Jobs.
    pub jobs: usize,
}

/// The horizon to plan.
#[derive(Clone, Copy, Debug)]
pub struct Horizon {
    /// Start of slot 0 (the planning time).
    pub start_utc: DateTime<Utc>,
    /// Slot length.
    pub slot_minutes: u32,
    /// Number of slots.
    pub slots: usize,
}

/// A heartbeat older than this no longer says what a site has.
pub const HEARTBEAT_FRESH_FOR: Duration = Duration::minutes(30);

/// Per site, the GPU counts its agent reported in a fresh heartbeat (see [`HEARTBEAT_FRESH_FOR`]).
async fn reported_inventory(
    store: &Store,
    now: DateTime<Utc>,
) -> Result<BTreeMap<String, BTreeMap<String, u32>>> {
    let mut out = BTreeMap::new();
    for hb in store.heartbeats().await? {
        if now - hb.time_utc > HEARTBEAT_FRESH_FOR {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&hb.inventory_json)
            .with_context(|| format!("site {}: stored heartbeat is not JSON", hb.site))?;
        let inventory: BTreeMap<String, u32> = value
            .get("inventory")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .with_context(|| format!("site {}: stored heartbeat inventory", hb.site))?
            .unwrap_or_default();
        out.insert(hb.site, inventory);
    }
    Ok(out)
}

/// What the planner may use at a site: the configured GPUs, capped per model by what the agent
/// reports as usable (GPUs down or reserved drop out); models the agent does not report keep the
/// configured count.
fn usable_gpus(
    configured: &BTreeMap<String, u32>,
    reported: Option<&BTreeMap<String, u32>>,
) -> BTreeMap<String, u32> {
    configured
        .iter()
        .map(|(model, &n)| {
            let usable = reported.and_then(|r| r.get(model)).map_or(n, |&r| r.min(n));
            (model.clone(), usable)
        })
        .collect()
}

/// The latest stored plan's assignments moved onto `horizon`'s slots, for plan stability; empty
/// when there is no plan or its slots do not line up with the horizon's.
async fn previous_assignments(
    store: &Store,
    horizon: Horizon,
) -> Result<Vec<windfall_solver::Assignment>> {
    let Some(previous) = store.latest_plan().await? else {
        return Ok(Vec::new());
    };
    let slot_min = i64::from(horizon.slot_minutes);
    let offset_min = (previous.horizon_start_utc - horizon.start_utc).num_minutes();
    if previous.slot_minutes != horizon.slot_minutes || offset_min % slot_min != 0 {
        return Ok(Vec::new());
    }
    let shift = offset_min / slot_min;
    Ok(previous
        .plan
        .assignments
        .into_iter()
        .filter_map(|mut a| {
            let slot = usize::try_from(a.slot as i64 + shift).ok()?;
            (slot < horizon.slots).then(|| {
                a.slot = slot;
                a
            })
        })
        .collect())
}

/// Longest gap, in slots, filled by linear interpolation between the known values on both sides.
pub const MAX_INTERPOLATED_SLOTS: usize = 3;

/// Fills the `None` slots of `raw`: a run of at most [`MAX_INTERPOLATED_SLOTS`] slots with known
/// values on both sides is interpolated linearly; longer runs, or runs at an end, take
/// `day_ago(i)` (the same slot a day earlier), else the nearest earlier value. Returns the
/// series (still `None` where nothing was known) and the slots interpolated and fallen back.
fn fill_gaps(
    raw: &[Option<f64>],
    day_ago: impl Fn(usize) -> Option<f64>,
) -> (Vec<Option<f64>>, usize, usize) {
    let mut out = raw.to_vec();
    let (mut interpolated, mut fallback) = (0, 0);
    let mut i = 0;
    while i < raw.len() {
        if raw[i].is_some() {
            i += 1;
            continue;
        }
        let start = i;
        while i < raw.len() && raw[i].is_none() {
            i += 1;
        }
        let left = start.checked_sub(1).and_then(|j| raw[j]);
        let right = raw.get(i).copied().flatten();
        let len = i - start;
        match (left, right) {
            (Some(a), Some(b)) if len <= MAX_INTERPOLATED_SLOTS => {
                for (k, slot) in out[start..i].iter_mut().enumerate() {
                    let w = (k + 1) as f64 / (len + 1) as f64;
                    *slot = Some(a + (b - a) * w);
                }
                interpolated += len;
            }
            _ => {
                for j in start..i {
                    out[j] = day_ago(j).or_else(|| j.checked_sub(1).and_then(|k| out[k]));
                    fallback += 1;
                }
            }
        }
    }
    (out, interpolated, fallback)
}

/// Builds the instance for `horizon` from the store's sites, forecasts known at the horizon
/// start, open jobs whose window overlaps the horizon, and the latest plan's assignments (plan
/// stability).
pub async fn build_instance(
    store: &Store,
    horizon: Horizon,
) -> Result<(Instance, Vec<SignalProvenance>)> {
    let gpu_models = store.gpu_models().await?;
    let sites = store.sites().await?;
    if sites.is_empty() {
        bail!("the database has no sites: load a fleet first");
    }
    let slot = Duration::minutes(i64::from(horizon.slot_minutes));
    let end = horizon.start_utc + slot * horizon.slots as i32;
    let reported = reported_inventory(store, horizon.start_utc).await?;
    let mut instance_sites = Vec::with_capacity(sites.len());
    let mut provenance = Vec::with_capacity(sites.len());
    for site in &sites {
        // One day of history before the horizon feeds the fallback for missing slots.
        let rows = store
            .forecast_window(
                &site.id,
                horizon.start_utc - Duration::days(1),
                end,
                horizon.start_utc,
            )
            .await?;
        if rows.is_empty() {
            bail!(
                "site {}: no forecasts issued by {} cover {} .. {}",
                site.id,
                horizon.start_utc,
                horizon.start_utc,
                end
            );
        }
        let value_at = |t: DateTime<Utc>, pick: &dyn Fn(&crate::db::ForecastRow) -> Option<f64>| {
            // The row whose interval holds t: the newest row starting at or before t.
            rows.iter()
                .rev()
                .find(|r| r.time_utc <= t && t < r.time_utc + slot.max(Duration::hours(1)))
                .and_then(pick)
        };
        let slot_time = |i: usize| horizon.start_utc + slot * i as i32;
        let raw_surplus: Vec<Option<f64>> = (0..horizon.slots)
            .map(|i| value_at(slot_time(i), &|r| r.surplus_kw))
            .collect();
        let raw_carbon: Vec<Option<f64>> = (0..horizon.slots)
            .map(|i| value_at(slot_time(i), &|r| r.carbon_g_per_kwh))
            .collect();
        let filled = raw_surplus
            .iter()
            .zip(&raw_carbon)
            .filter(|(s, c)| s.is_none() || c.is_none())
            .count();
        let (surplus_filled, surplus_interp, _) = fill_gaps(&raw_surplus, |i| {
            value_at(slot_time(i) - Duration::days(1), &|r| r.surplus_kw)
        });
        let (carbon_filled, carbon_interp, carbon_fallback) = fill_gaps(&raw_carbon, |i| {
            value_at(slot_time(i) - Duration::days(1), &|r| r.carbon_g_per_kwh)
        });
        let mut degraded = Vec::new();
        let interpolated = carbon_interp.max(surplus_interp);
        if interpolated > 0 {
            degraded.push(format!(
                "{interpolated} slot(s) interpolated across short gaps (up to \
                 {MAX_INTERPOLATED_SLOTS} slots)"
            ));
        }
        if carbon_fallback > 0 {
            degraded.push(format!(
                "{carbon_fallback} of {} slots had no carbon forecast: the same hour a day \
                 earlier was used, else the nearest earlier value",
                horizon.slots
            ));
        }
        let mut surplus_kw = Vec::with_capacity(horizon.slots);
        let mut carbon = Vec::with_capacity(horizon.slots);
        let mut price = Vec::with_capacity(horizon.slots);
        let mut any_price = false;
        for i in 0..horizon.slots {
            let t = slot_time(i);
            let s = surplus_filled[i].unwrap_or(0.0);
            let Some(c) = carbon_filled[i] else {
                bail!(
                    "site {}: no carbon intensity known for {t} or the day before",
                    site.id
                );
            };
            let p = value_at(t, &|r| r.price_usd_per_mwh);
            any_price |= p.is_some();
            surplus_kw.push(s);
            carbon.push(c);
            price.push(p.unwrap_or(0.0));
        }
        let used: Vec<&crate::db::ForecastRow> = rows
            .iter()
            .filter(|r| r.time_utc + slot > horizon.start_utc && r.time_utc < end)
            .collect();
        let mut sources: Vec<String> = used.iter().map(|r| r.source.clone()).collect();
        sources.sort();
        sources.dedup();
        let signal = used
            .iter()
            .find(|r| r.carbon_g_per_kwh.is_some())
            .map_or("average".to_string(), |r| r.carbon_signal.clone());
        let other = used
            .iter()
            .filter(|r| r.carbon_g_per_kwh.is_some() && r.carbon_signal != signal)
            .count();
        if other > 0 {
            degraded.push(format!(
                "{other} carbon value(s) are not {signal} but were read as {signal}: average and \
                 marginal signals mixed"
            ));
        }
        provenance.push(SignalProvenance {
            site: site.id.clone(),
            sources,
            issued_utc_min: used.iter().map(|r| r.issued_utc).min(),
            issued_utc_max: used.iter().map(|r| r.issued_utc).max(),
            carbon_signal: signal.clone(),
            filled_slots: filled,
            degraded,
        });
        instance_sites.push(Site {
            id: site.id.clone(),
            zone: site.zone.clone(),
            gpus: usable_gpus(&site.gpus, reported.get(&site.id)),
            pue: site.pue,
            grid_limit_kw: site.grid_limit_kw,
            wan_gbps: site.wan_gbps,
            surplus_kw,
            carbon_g_per_kwh: carbon,
            carbon_signal: if signal == "marginal" {
                CarbonSignal::Marginal
            } else {
                CarbonSignal::Average
            },
            price_usd_per_mwh: any_price.then_some(price),
        });
    }
    // Sites on different signal types: their emissions do not add up to one figure.
    let marginal = provenance
        .iter()
        .filter(|p| p.carbon_signal == "marginal")
        .count();
    let average = provenance.len() - marginal;
    if marginal > 0 && average > 0 {
        for p in &mut provenance {
            p.degraded.push(format!(
                "this plan mixes signal types ({marginal} site(s) marginal, {average} average); \
                 this site's values are {}",
                p.carbon_signal
            ));
        }
    }
    let mut jobs = Vec::new();
    for job in store.jobs(None).await? {
        if !job.state.is_open() || job.release_utc >= end || job.deadline_utc <= horizon.start_utc {
            continue;
        }
        jobs.push(Job {
            id: job.id,
            gpus: job.gpus,
            gpu_models: job.gpu_models,
            work_hours: job.work_hours,
            release_utc: UtcTime(job.release_utc),
            deadline_utc: UtcTime(job.deadline_utc),
            checkpoint_gb: job.checkpoint_gb,
            save_s: job.save_s,
            restore_s: job.restore_s,
            migratable: job.migratable,
            home_site: job.home_site,
            current_site: job.current_site,
        });
    }
    let previous_assignments = previous_assignments(store, horizon).await?;
    let instance = Instance {
        start_utc: UtcTime(horizon.start_utc),
        slot_minutes: horizon.slot_minutes,
        slots: horizon.slots,
        gpu_models,
        sites: instance_sites,
        links_gbps: store.links().await?,
        jobs,
        params: Params::default(),
        previous_assignments,
    };
    instance
        .check()
        .context("the stored fleet and jobs do not form a valid instance")?;
    Ok((instance, provenance))
}
