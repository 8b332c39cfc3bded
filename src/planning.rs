//! One planning cycle, as `windfall plan` (cron) and `POST /v1/plans` run it.
//!
//! Owns the sequence: take the planning lock, assemble the instance from the store for the
//! horizon that starts at the current slot, solve, write the plan in one transaction, release the
//! lock. A crash or kill at any point leaves the previous plan current (the write is one
//! transaction) and frees the lock (it dies with the process). Must not write anything outside
//! the store's plan transaction.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Duration, DurationRound, Utc};
use windfall_solver::solve;

use crate::db::Store;
use crate::fleet::{self, Horizon};
use crate::model::{Metrics, NewPlan};

/// What one cycle plans.
#[derive(Clone, Debug)]
pub struct CycleConfig {
    /// Horizon length in slots.
    pub slots: usize,
    /// Slot length in minutes.
    pub slot_minutes: u32,
    /// Solver time limit, seconds.
    pub time_limit_s: f64,
    /// Lock file for SQLite databases (PostgreSQL uses an advisory lock).
    pub lock_path: Option<PathBuf>,
    /// Objective penalty per job-slot changed against the previous plan, g CO2e.
    pub change_penalty_g: f64,
    /// A site whose newest forecast was issued longer ago than this (hours) makes the plan
    /// degraded.
    pub max_forecast_age_h: f64,
}

/// What one cycle produced.
#[derive(Clone, Debug)]
pub struct CycleOutcome {
    /// The new plan's id.
    pub plan_id: i64,
    /// Start of its horizon.
    pub horizon_start_utc: DateTime<Utc>,
    /// Its metrics.
    pub metrics: Metrics,
    /// Jobs it covered.
    pub jobs: usize,
    /// Why the plan is degraded (`site: reason`), empty when its signals are sound.
    pub degraded: Vec<String>,
}

impl CycleOutcome {
    /// A few lines for the terminal or a cron mail.
    pub fn summary(&self) -> String {
        let m = &self.metrics;
        let change = if m.baseline_emissions_g > 0.0 {
            format!(
                " ({:+.1} % vs run-now)",
                100.0 * (m.emissions_g - m.baseline_emissions_g) / m.baseline_emissions_g
            )
        } else {
            String::new()
        };
        format!(
            "plan #{} from {} UTC: {} jobs, {} left out; emissions {:.2} kg CO2e{change}; \
             gap {:.2} % ({}); {} migrations; solved in {:.1} s",
            self.plan_id,
            self.horizon_start_utc.format("%Y-%m-%d %H:%M"),
            self.jobs,
            m.infeasible_jobs.len(),
            m.emissions_g / 1000.0,
            100.0 * m.gap,
            m.status,
            m.migrations,
            m.solve_seconds,
        ) + &self
            .degraded
            .iter()
            .map(|r| format!("\nDEGRADED: {r}"))
            .collect::<String>()
    }
}

/// The lock file next to a SQLite database, `None` for other URLs.
pub fn sqlite_lock_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let path = rest.trim_start_matches("//");
    let path = path.split('?').next().unwrap_or(path);
    Some(PathBuf::from(format!("{path}.plan-lock")))
}

/// Runs one cycle at `now`. Fails with a clear message when another cycle holds the lock.
pub async fn run_cycle(
    store: &Store,
    config: &CycleConfig,
    now: DateTime<Utc>,
) -> Result<CycleOutcome> {
    if config.slots == 0 || config.slot_minutes == 0 {
        bail!("the horizon needs at least one slot of at least one minute");
    }
    if !(config.change_penalty_g.is_finite() && config.change_penalty_g >= 0.0) {
        bail!("the change penalty must be a finite number >= 0");
    }
    let Some(lock) = store.try_planning_lock(config.lock_path.as_deref()).await? else {
        bail!(
            "another planning run holds the planning lock; this run stops without writing \
             (the running one will store its plan)"
        );
    };
    let slot = Duration::minutes(i64::from(config.slot_minutes));
    let start_utc = now
        .duration_trunc(slot)
        .context("cannot align the planning time to the slot length")?;
    let horizon = Horizon {
        start_utc,
        slot_minutes: config.slot_minutes,
        slots: config.slots,
    };
    let (mut instance, mut provenance) = fleet::build_instance(store, horizon).await?;
    let max_age = Duration::milliseconds((config.max_forecast_age_h * 3_600_000.0) as i64);
    for p in &mut provenance {
        match p.issued_utc_max {
            Some(newest) if start_utc - newest > max_age => p.degraded.insert(
                0,
                format!(
                    "stale forecast: the newest was issued {}, more than {} h before the horizon",
                    newest.format("%Y-%m-%d %H:%M UTC"),
                    config.max_forecast_age_h
                ),
            ),
            None => p
                .degraded
                .insert(0, "no forecast covers the horizon".into()),
            _ => {}
        }
    }
    let degraded = crate::model::degraded_reasons(&provenance);
    instance.params.change_penalty_g = config.change_penalty_g;
    let jobs = instance.jobs.len();
    let time_limit_s = config.time_limit_s;
    let to_solve = instance.clone();
    let (mut solution, seconds) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        // The limit holds for the solver's own loops too (the Lagrangian rounds of a large
        // fleet), not only for HiGHS.
        let solution = solve(&to_solve, &crate::solver_bench::timed_options(time_limit_s));
        (solution, started.elapsed().as_secs_f64())
    })
    .await
    .context("the solver thread failed")?;
    solution.metrics.solve_seconds = seconds;
    let plan_id = store
        .save_plan(&NewPlan {
            created_utc: now,
            horizon_start_utc: start_utc,
            slot_minutes: config.slot_minutes,
            slots: config.slots,
            metrics: solution.metrics.clone(),
            provenance,
            instance_json: instance.to_json(),
            plan: solution.plan,
        })
        .await?;
    lock.release().await;
    Ok(CycleOutcome {
        plan_id,
        horizon_start_utc: start_utc,
        metrics: solution.metrics,
        jobs,
        degraded,
    })
}
