//! `windfall demo`: the main job end to end on the embedded default.
//!
//! Creates a fresh SQLite database in a data directory, loads the bundled samples, plans a
//! 48-hour horizon, stores the plan, prints the summary and writes the HTML report. Owns only the
//! sequence; each step lives in its own module.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use windfall_solver::{Instance, SolveOptions, solve, validate};

use crate::db::Store;
use crate::fleet::{self, Horizon};
use crate::model::NewPlan;
use crate::report::PlanFigures;

/// What the demo runs with.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Folder for the database and the report.
    pub data_dir: PathBuf,
    /// Planning start (start of slot 0).
    pub start_utc: DateTime<Utc>,
    /// Number of hourly slots.
    pub slots: usize,
    /// MILP time limit, seconds.
    pub time_limit_s: f64,
}

/// What the demo produced.
pub struct DemoOutcome {
    /// Path of the HTML report.
    pub report_path: PathBuf,
    /// The terminal summary.
    pub summary: String,
    /// Stored plan id.
    pub plan_id: i64,
}

/// Runs the demo; progress goes to standard error.
pub async fn run(config: &DemoConfig, now: DateTime<Utc>) -> Result<DemoOutcome> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    let db_path = config.data_dir.join("windfall-demo.db");
    remove_if_present(&db_path)?;
    let url = format!("sqlite://{}", db_path.display());
    eprintln!(
        "[1/4] creating a fresh SQLite database at {}",
        db_path.display()
    );
    let store = Store::connect(&url)
        .await
        .with_context(|| format!("opening {url}"))?;
    let counts = fleet::load_samples(&store, now).await?;
    eprintln!(
        "[2/4] loaded the bundled samples: {} sites, {} forecast rows, {} jobs",
        counts.sites, counts.forecast_points, counts.jobs
    );
    let horizon = Horizon {
        start_utc: config.start_utc,
        slot_minutes: 60,
        slots: config.slots,
    };
    let (first, last) = windfall_forecasts::samples::SIGNALS_RANGE_UTC;
    let (instance, provenance) = fleet::build_instance(&store, horizon)
        .await
        .with_context(|| {
            format!("the bundled samples cover {first} to {last}; choose --start and --slots inside that range")
        })?;
    eprintln!(
        "[3/4] planning {} jobs over {} sites x {} slots (MILP time limit {} s)",
        instance.jobs.len(),
        instance.sites.len(),
        instance.slots,
        config.time_limit_s
    );
    let started = Instant::now();
    let options = SolveOptions {
        time_limit_s: config.time_limit_s,
        ..SolveOptions::default()
    };
    let mut solution = solve(&instance, &options);
    solution.metrics.solve_seconds = started.elapsed().as_secs_f64();
    let plan_id = store
        .save_plan(&NewPlan {
            created_utc: now,
            horizon_start_utc: horizon.start_utc,
            slot_minutes: horizon.slot_minutes,
            slots: horizon.slots,
            metrics: solution.metrics.clone(),
            provenance,
            instance_json: instance.to_json(),
            plan: solution.plan.clone(),
        })
        .await?;
    let record = store
        .plan(plan_id)
        .await?
        .context("the plan just stored cannot be read back")?;
    store.close().await;
    let stored_instance = Instance::from_json(&record.instance_json)?;
    let validation = validate(&stored_instance, &record.plan);
    let figures = PlanFigures {
        record: &record,
        instance: &stored_instance,
        validation: &validation,
    };
    let report_dir = config.data_dir.join("report");
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("creating {}", report_dir.display()))?;
    let report_path = report_dir.join(format!("plan-{plan_id}.html"));
    std::fs::write(&report_path, figures.html())
        .with_context(|| format!("writing {}", report_path.display()))?;
    eprintln!("[4/4] stored plan #{plan_id} and wrote the report");
    let report_path = report_path.canonicalize().unwrap_or(report_path);
    Ok(DemoOutcome {
        summary: figures.summary(),
        report_path,
        plan_id,
    })
}

fn remove_if_present(path: &Path) -> Result<()> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing old {}", p.display()))?;
        }
    }
    Ok(())
}
