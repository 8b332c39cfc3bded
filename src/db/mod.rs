//! Persistence: one [`Store`] over sqlx's Any driver, serving SQLite (the embedded default) and
//! PostgreSQL (production) with the same queries.
//!
//! Owns all SQL, schema migrations (`migrations/sqlite`, `migrations/postgres`, applied on
//! connect) and the mapping between rows and model types. Nothing outside this module writes SQL.
//! **Invariant:** a plan and the job states it implies are written in one transaction, so a crash
//! leaves the previous plan current.
//!
//! Rationale for the column types: the Any driver decodes neither timestamps nor booleans on both
//! backends, so times are RFC 3339 text and flags are 0/1 integers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use windfall_forecasts::ForecastPoint;

use crate::model::{
    GpuModel, JobRecord, JobState, Metrics, NewPlan, PlanRecord, SignalProvenance, SiteConfig,
};
use windfall_solver::{Assignment, Migration, Plan};

/// Which database a store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// SQLite file (embedded default).
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names no supported database.
    #[error("unsupported database URL `{0}`: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    /// The database refused or failed an operation.
    #[error("database error while {action}: {source}")]
    Database {
        /// What the store was doing.
        action: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying schema migrations failed.
    #[error("applying schema migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A record with this key exists already.
    #[error("{0} already exists")]
    Conflict(String),
    /// The planning lock file cannot be opened or locked.
    #[error("planning lock file {path}: {message}")]
    LockFile {
        /// The lock file.
        path: String,
        /// The system's message.
        message: String,
    },
    /// A record refers to a site that does not exist.
    #[error("{context}: unknown site `{site}` (create the site first)")]
    UnknownSite {
        /// The site id.
        site: String,
        /// What referred to it.
        context: String,
    },
    /// A stored value cannot be read back.
    #[error("stored {what} is unreadable: {message}")]
    Corrupt {
        /// Which value.
        what: String,
        /// Why.
        message: String,
    },
}

type Result<T> = std::result::Result<T, StoreError>;

fn db(action: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
    let action = action.into();
    move |source| StoreError::Database { action, source }
}

fn corrupt(what: &str, message: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_string(),
        message: message.to_string(),
    }
}

fn time_text(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn parse_time(what: &str, text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| corrupt(what, e))
}

/// The planner's database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Serialises this process's writes on SQLite, which has one writer at a time: waiting here
    /// is cheaper than SQLite's busy-retry sleeps.
    write_gate: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// One stored forecast value set.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastRow {
    /// Start of the interval.
    pub time_utc: DateTime<Utc>,
    /// Issue time.
    pub issued_utc: DateTime<Utc>,
    /// Source label (file name or provider).
    pub source: String,
    /// Surplus power, kW.
    pub surplus_kw: Option<f64>,
    /// Carbon intensity, g/kWh.
    pub carbon_g_per_kwh: Option<f64>,
    /// `average` or `marginal`.
    pub carbon_signal: String,
    /// Price, USD/MWh.
    pub price_usd_per_mwh: Option<f64>,
}

impl Store {
    /// Connects to `url` (`sqlite://PATH` creates the file; `postgres://...`) and applies the
    /// schema migrations.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if let Some(rest) = url.strip_prefix("sqlite:") {
            let url = if rest.contains("mode=") {
                url.to_string()
            } else if rest.contains('?') {
                format!("{url}&mode=rwc")
            } else {
                format!("{url}?mode=rwc")
            };
            (Backend::Sqlite, url)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_string())
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        // SQLite runs in WAL mode with `synchronous = NORMAL`: readers do not wait for the
        // writer, and a commit needs no fsync of the main file. A killed process loses nothing
        // committed; a power cut may lose the last commits but never corrupts the database.
        let sqlite = backend == Backend::Sqlite;
        let pool = AnyPoolOptions::new()
            .max_connections(if sqlite { 4 } else { 8 })
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if sqlite {
                        use sqlx::Executor;
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                        conn.execute("PRAGMA busy_timeout = 10000").await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .map_err(db(format!("connecting to {}", redact(&url))))?;
        let store = Store {
            pool,
            backend,
            write_gate: std::sync::Arc::new(tokio::sync::Mutex::new(())),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<()> {
        match self.backend {
            Backend::Sqlite => {
                sqlx::query("PRAGMA foreign_keys = ON")
                    .execute(&self.pool)
                    .await
                    .map_err(db("enabling foreign keys"))?;
                sqlx::migrate!("./migrations/sqlite")
                    .run(&self.pool)
                    .await?
            }
            Backend::Postgres => {
                sqlx::migrate!("./migrations/postgres")
                    .run(&self.pool)
                    .await?
            }
        }
        Ok(())
    }

    /// Held for one write on SQLite; free on PostgreSQL.
    async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite => Some(self.write_gate.lock().await),
            Backend::Postgres => None,
        }
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes the pool, waiting for connections to finish.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Inserts or replaces a GPU model.
    pub async fn upsert_gpu_model(&self, name: &str, model: &GpuModel) -> Result<()> {
        let spec = serde_json::to_string(model).map_err(|e| corrupt("gpu model", e))?;
        sqlx::query(
            "INSERT INTO gpu_models (name, spec_json) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET spec_json = excluded.spec_json",
        )
        .bind(name)
        .bind(spec)
        .execute(&self.pool)
        .await
        .map_err(db(format!("saving GPU model {name}")))?;
        Ok(())
    }

    /// All GPU models by name.
    pub async fn gpu_models(&self) -> Result<BTreeMap<String, GpuModel>> {
        let rows = sqlx::query("SELECT name, spec_json FROM gpu_models ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(db("reading GPU models"))?;
        rows.iter()
            .map(|row| {
                let name: String = row.get(0);
                let spec: String = row.get(1);
                let model = serde_json::from_str(&spec)
                    .map_err(|e| corrupt(&format!("GPU model {name}"), e))?;
                Ok((name, model))
            })
            .collect()
    }

    /// Inserts or updates a site.
    pub async fn upsert_site(&self, site: &SiteConfig, now: DateTime<Utc>) -> Result<()> {
        let gpus = serde_json::to_string(&site.gpus).map_err(|e| corrupt("site gpus", e))?;
        sqlx::query(
            "INSERT INTO sites (id, zone, gpus_json, pue, grid_limit_kw, wan_gbps, updated_utc)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET zone = excluded.zone, gpus_json = excluded.gpus_json,
               pue = excluded.pue, grid_limit_kw = excluded.grid_limit_kw,
               wan_gbps = excluded.wan_gbps, updated_utc = excluded.updated_utc",
        )
        .bind(&site.id)
        .bind(site.zone.clone())
        .bind(gpus)
        .bind(site.pue)
        .bind(site.grid_limit_kw)
        .bind(site.wan_gbps)
        .bind(time_text(now))
        .execute(&self.pool)
        .await
        .map_err(db(format!("saving site {}", site.id)))?;
        Ok(())
    }

    /// All sites, by id.
    pub async fn sites(&self) -> Result<Vec<SiteConfig>> {
        let rows = sqlx::query(
            "SELECT id, zone, gpus_json, pue, grid_limit_kw, wan_gbps FROM sites ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("reading sites"))?;
        rows.iter()
            .map(|row| {
                let id: String = row.get(0);
                let gpus: String = row.get(2);
                Ok(SiteConfig {
                    gpus: serde_json::from_str(&gpus)
                        .map_err(|e| corrupt(&format!("site {id} gpus"), e))?,
                    zone: row.get(1),
                    pue: row.get(3),
                    grid_limit_kw: row.get(4),
                    wan_gbps: row.get(5),
                    id,
                })
            })
            .collect()
    }

    /// Inserts or replaces a bandwidth override.
    pub async fn upsert_link(&self, from: &str, to: &str, gbps: f64) -> Result<()> {
        sqlx::query(
            "INSERT INTO links (from_site, to_site, gbps) VALUES ($1, $2, $3)
             ON CONFLICT (from_site, to_site) DO UPDATE SET gbps = excluded.gbps",
        )
        .bind(from)
        .bind(to)
        .bind(gbps)
        .execute(&self.pool)
        .await
        .map_err(db(format!("saving link {from} -> {to}")))?;
        Ok(())
    }

    /// All bandwidth overrides: from -> to -> Gbit/s.
    pub async fn links(&self) -> Result<BTreeMap<String, BTreeMap<String, f64>>> {
        let rows =
            sqlx::query("SELECT from_site, to_site, gbps FROM links ORDER BY from_site, to_site")
                .fetch_all(&self.pool)
                .await
                .map_err(db("reading links"))?;
        let mut links: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
        for row in rows {
            links
                .entry(row.get(0))
                .or_default()
                .insert(row.get(1), row.get(2));
        }
        Ok(links)
    }

    /// Stores forecast points from one source in one transaction; returns how many were written.
    /// A point for an unknown site fails the whole batch, naming the site.
    pub async fn insert_forecasts(&self, source: &str, points: &[ForecastPoint]) -> Result<usize> {
        let _turn = self.write_turn().await;
        let known: Vec<String> = self.sites().await?.into_iter().map(|s| s.id).collect();
        if let Some(p) = points.iter().find(|p| !known.contains(&p.site)) {
            return Err(StoreError::UnknownSite {
                site: p.site.clone(),
                context: format!("forecast from {source} for {}", time_text(p.time_utc)),
            });
        }
        // A key given twice keeps its last value (one statement may not update a row twice).
        let mut last: std::collections::HashMap<(&str, DateTime<Utc>, DateTime<Utc>), usize> =
            std::collections::HashMap::with_capacity(points.len());
        for (i, p) in points.iter().enumerate() {
            last.insert((p.site.as_str(), p.time_utc, p.issued_utc), i);
        }
        let unique: Vec<&ForecastPoint> = points
            .iter()
            .enumerate()
            .filter(|(i, p)| last[&(p.site.as_str(), p.time_utc, p.issued_utc)] == *i)
            .map(|(_, p)| p)
            .collect();
        if self.backend == Backend::Sqlite {
            return self
                .insert_forecasts_sqlite(source, &unique)
                .await
                .map(|_| points.len());
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting a transaction"))?;
        // Multi-row statements: one round trip per chunk instead of per row.
        for chunk in unique.chunks(FORECAST_ROWS_PER_STATEMENT) {
            // `$n` placeholders, which both backends accept through the Any driver.
            let values: Vec<String> = (0..chunk.len())
                .map(|r| {
                    let cols: Vec<String> = (1..=8).map(|c| format!("${}", r * 8 + c)).collect();
                    format!("({})", cols.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO forecasts (site_id, time_utc, issued_utc, source, surplus_kw,
                   carbon_g_per_kwh, carbon_signal, price_usd_per_mwh) VALUES {}
                 ON CONFLICT (site_id, time_utc, issued_utc, source) DO UPDATE SET
                   surplus_kw = excluded.surplus_kw, carbon_g_per_kwh = excluded.carbon_g_per_kwh,
                   carbon_signal = excluded.carbon_signal,
                   price_usd_per_mwh = excluded.price_usd_per_mwh",
                values.join(", ")
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for p in chunk {
                q = q
                    .bind(p.site.clone())
                    .bind(time_text(p.time_utc))
                    .bind(time_text(p.issued_utc))
                    .bind(source.to_string())
                    .bind(p.surplus_kw)
                    .bind(p.carbon_g_per_kwh)
                    .bind(p.carbon_signal.as_str())
                    .bind(p.price_usd_per_mwh);
            }
            q.execute(&mut *tx)
                .await
                .map_err(db(format!("saving forecasts from {source}")))?;
        }
        tx.commit().await.map_err(db("committing forecasts"))?;
        Ok(points.len())
    }

    /// SQLite: each chunk of rows goes in as one JSON array bound to one parameter and expanded
    /// by SQLite's `json_each`, so the driver handles a handful of arguments per thousands of
    /// rows (per-argument handling dominates otherwise).
    async fn insert_forecasts_sqlite(
        &self,
        source: &str,
        points: &[&ForecastPoint],
    ) -> Result<usize> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting a transaction"))?;
        for chunk in points.chunks(FORECAST_ROWS_PER_JSON_STATEMENT) {
            let mut json = String::with_capacity(chunk.len() * 120);
            json.push('[');
            for (i, p) in chunk.iter().enumerate() {
                if i > 0 {
                    json.push(',');
                }
                let number = |v: Option<f64>| match v {
                    Some(x) if x.is_finite() => x.to_string(),
                    _ => "null".to_string(),
                };
                let _ = write!(
                    json,
                    "[{},\"{}\",\"{}\",{},{},\"{}\",{}]",
                    serde_json::Value::from(p.site.as_str()),
                    time_text(p.time_utc),
                    time_text(p.issued_utc),
                    number(p.surplus_kw),
                    number(p.carbon_g_per_kwh),
                    p.carbon_signal.as_str(),
                    number(p.price_usd_per_mwh)
                );
            }
            json.push(']');
            sqlx::query(
                "INSERT INTO forecasts (site_id, time_utc, issued_utc, source, surplus_kw,
                   carbon_g_per_kwh, carbon_signal, price_usd_per_mwh)
                 SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, $2, j.value ->> 3,
                        j.value ->> 4, j.value ->> 5, j.value ->> 6
                 FROM json_each($1) AS j WHERE true
                 ON CONFLICT (site_id, time_utc, issued_utc, source) DO UPDATE SET
                   surplus_kw = excluded.surplus_kw, carbon_g_per_kwh = excluded.carbon_g_per_kwh,
                   carbon_signal = excluded.carbon_signal,
                   price_usd_per_mwh = excluded.price_usd_per_mwh",
            )
            .bind(json)
            .bind(source.to_string())
            .execute(&mut *tx)
            .await
            .map_err(db(format!("saving forecasts from {source}")))?;
        }
        tx.commit().await.map_err(db("committing forecasts"))?;
        Ok(points.len())
    }

    /// For each time in `[from, to)`, the newest value issued at or before `as_of`.
    pub async fn forecast_window(
        &self,
        site: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        as_of: DateTime<Utc>,
    ) -> Result<Vec<ForecastRow>> {
        let rows = sqlx::query(
            "SELECT time_utc, issued_utc, source, surplus_kw, carbon_g_per_kwh, carbon_signal,
                    price_usd_per_mwh
             FROM forecasts
             WHERE site_id = $1 AND time_utc >= $2 AND time_utc < $3 AND issued_utc <= $4
             ORDER BY time_utc, issued_utc DESC, source",
        )
        .bind(site)
        .bind(time_text(from))
        .bind(time_text(to))
        .bind(time_text(as_of))
        .fetch_all(&self.pool)
        .await
        .map_err(db(format!("reading forecasts for {site}")))?;
        let mut out: Vec<ForecastRow> = Vec::new();
        for row in rows {
            let time_utc = parse_time("forecast time", &row.get::<String, _>(0))?;
            let next = ForecastRow {
                time_utc,
                issued_utc: parse_time("forecast issue time", &row.get::<String, _>(1))?,
                source: row.get(2),
                surplus_kw: row.get(3),
                carbon_g_per_kwh: row.get(4),
                carbon_signal: row.get(5),
                price_usd_per_mwh: row.get(6),
            };
            // An older issue of the same time fills only the fields the newer ones left empty
            // (a carbon-only provider forecast must not hide the surplus of another source).
            if let Some(last) = out.last_mut()
                && last.time_utc == time_utc
            {
                let mut used = false;
                if last.surplus_kw.is_none() && next.surplus_kw.is_some() {
                    last.surplus_kw = next.surplus_kw;
                    used = true;
                }
                if last.carbon_g_per_kwh.is_none() && next.carbon_g_per_kwh.is_some() {
                    last.carbon_g_per_kwh = next.carbon_g_per_kwh;
                    last.carbon_signal = next.carbon_signal.clone();
                    used = true;
                }
                if last.price_usd_per_mwh.is_none() && next.price_usd_per_mwh.is_some() {
                    last.price_usd_per_mwh = next.price_usd_per_mwh;
                    used = true;
                }
                if used && !last.source.split('+').any(|s| s == next.source) {
                    last.source = format!("{}+{}", last.source, next.source);
                }
                continue;
            }
            out.push(next);
        }
        Ok(out)
    }

    /// Inserts a new job; an existing id is a conflict.
    pub async fn insert_job(&self, job: &JobRecord) -> Result<()> {
        let _turn = self.write_turn().await;
        let result = sqlx::query(
            "INSERT INTO jobs (id, state, gpus, gpu_models, work_hours, release_utc, deadline_utc,
               checkpoint_gb, save_s, restore_s, migratable, home_site, current_site, state_reason,
               submitted_utc, owner, command)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
        )
        .bind(&job.id)
        .bind(job.state.as_str())
        .bind(i64::from(job.gpus))
        .bind(job.gpu_models.join("|"))
        .bind(job.work_hours)
        .bind(time_text(job.release_utc))
        .bind(time_text(job.deadline_utc))
        .bind(job.checkpoint_gb)
        .bind(job.save_s)
        .bind(job.restore_s)
        .bind(i64::from(job.migratable))
        .bind(&job.home_site)
        .bind(job.current_site.clone())
        .bind(job.state_reason.clone())
        .bind(time_text(job.submitted_utc))
        .bind(job.owner.clone())
        .bind(job.command.clone())
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::Conflict(format!("job `{}`", job.id)))
            }
            Err(e) => Err(db(format!("saving job {}", job.id))(e)),
        }
    }

    /// One job by id.
    pub async fn job(&self, id: &str) -> Result<Option<JobRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("{JOB_SELECT} WHERE id = $1")))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db(format!("reading job {id}")))?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Jobs, optionally only those in `state`, by release then id.
    pub async fn jobs(&self, state: Option<JobState>) -> Result<Vec<JobRecord>> {
        let rows = match state {
            Some(state) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "{JOB_SELECT} WHERE state = $1 ORDER BY release_utc, id"
                )))
                .bind(state.as_str())
                .fetch_all(&self.pool)
                .await
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "{JOB_SELECT} ORDER BY release_utc, id"
                )))
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(db("reading jobs"))?;
        rows.iter().map(job_from_row).collect()
    }

    /// Sets a job's state and reason.
    pub async fn set_job_state(
        &self,
        id: &str,
        state: JobState,
        reason: Option<&str>,
    ) -> Result<()> {
        let _turn = self.write_turn().await;
        sqlx::query("UPDATE jobs SET state = $1, state_reason = $2 WHERE id = $3")
            .bind(state.as_str())
            .bind(reason.map(str::to_string))
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(db(format!("updating job {id}")))?;
        Ok(())
    }

    /// Stores a plan, its assignments and migrations, and the job states it implies (planned or
    /// infeasible with the reason), in one transaction. Returns the plan's id.
    pub async fn save_plan(&self, new: &NewPlan) -> Result<i64> {
        let _turn = self.write_turn().await;
        let metrics = serde_json::to_string(&new.metrics).map_err(|e| corrupt("metrics", e))?;
        let provenance =
            serde_json::to_string(&new.provenance).map_err(|e| corrupt("provenance", e))?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting a transaction"))?;
        let row = sqlx::query(
            "INSERT INTO plans (created_utc, horizon_start_utc, slot_minutes, slots, status, method,
               emissions_g, lower_bound_g, baseline_emissions_g, grid_energy_kwh, surplus_used_kwh,
               metrics_json, provenance_json, instance_json)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
             RETURNING id",
        )
        .bind(time_text(new.created_utc))
        .bind(time_text(new.horizon_start_utc))
        .bind(i64::from(new.slot_minutes))
        .bind(new.slots as i64)
        .bind(&new.metrics.status)
        .bind(&new.metrics.method)
        .bind(new.metrics.emissions_g)
        .bind(new.metrics.lower_bound_g)
        .bind(new.metrics.baseline_emissions_g)
        .bind(new.metrics.grid_energy_kwh)
        .bind(new.metrics.surplus_used_kwh)
        .bind(metrics)
        .bind(provenance)
        .bind(&new.instance_json)
        .fetch_one(&mut *tx)
        .await
        .map_err(db("saving a plan"))?;
        let plan_id: i64 = row.get(0);
        for a in &new.plan.assignments {
            sqlx::query(
                "INSERT INTO assignments (plan_id, job_id, slot, site_id, power_w, gpu_model)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(plan_id)
            .bind(&a.job)
            .bind(a.slot as i64)
            .bind(&a.site)
            .bind(a.power_w)
            .bind(a.gpu_model.clone())
            .execute(&mut *tx)
            .await
            .map_err(db(format!("saving assignment of job {}", a.job)))?;
        }
        for m in &new.plan.migrations {
            sqlx::query(
                "INSERT INTO migrations (plan_id, job_id, from_site, to_site, slot, transfer_s,
                   window_slots) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(plan_id)
            .bind(&m.job)
            .bind(&m.from)
            .bind(&m.to)
            .bind(m.slot as i64)
            .bind(m.transfer_s)
            .bind(m.window_slots as i64)
            .execute(&mut *tx)
            .await
            .map_err(db(format!("saving migration of job {}", m.job)))?;
        }
        let mut planned: Vec<&str> = new
            .plan
            .assignments
            .iter()
            .map(|a| a.job.as_str())
            .collect();
        planned.sort_unstable();
        planned.dedup();
        for job in planned {
            sqlx::query(
                "UPDATE jobs SET state = 'planned', state_reason = NULL
                 WHERE id = $1 AND state IN ('queued', 'planned', 'infeasible')",
            )
            .bind(job)
            .execute(&mut *tx)
            .await
            .map_err(db(format!("marking job {job} planned")))?;
        }
        for entry in &new.metrics.infeasible_jobs {
            sqlx::query(
                "UPDATE jobs SET state = 'infeasible', state_reason = $1
                 WHERE id = $2 AND state IN ('queued', 'planned', 'infeasible')",
            )
            .bind(&entry.reason)
            .bind(&entry.job)
            .execute(&mut *tx)
            .await
            .map_err(db(format!("marking job {} infeasible", entry.job)))?;
        }
        // Fault injection for the crash tests: hold the written, uncommitted plan for this long,
        // after saying so on standard error, so a test can kill the process mid-write.
        if let Some(ms) = std::env::var(PAUSE_BEFORE_PLAN_COMMIT_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            eprintln!("plan written, not yet committed; pausing {ms} ms");
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        tx.commit().await.map_err(db("committing the plan"))?;
        Ok(plan_id)
    }

    /// Id of the newest plan older than plan `id` (ids can skip: a rolled-back write uses one up
    /// on PostgreSQL).
    pub async fn plan_id_before(&self, id: i64) -> Result<Option<i64>> {
        Ok(sqlx::query("SELECT MAX(id) FROM plans WHERE id < $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .map_err(db("finding the previous plan"))?
            .get(0))
    }

    /// Id of the newest plan.
    pub async fn latest_plan_id(&self) -> Result<Option<i64>> {
        Ok(sqlx::query("SELECT MAX(id) FROM plans")
            .fetch_one(&self.pool)
            .await
            .map_err(db("finding the latest plan"))?
            .get(0))
    }

    /// The newest plan, if any.
    pub async fn latest_plan(&self) -> Result<Option<PlanRecord>> {
        match self.latest_plan_id().await? {
            Some(id) => self.plan(id).await,
            None => Ok(None),
        }
    }

    /// A plan by id, with its assignments and migrations.
    pub async fn plan(&self, id: i64) -> Result<Option<PlanRecord>> {
        let Some(row) = sqlx::query(
            "SELECT id, created_utc, horizon_start_utc, slot_minutes, slots, metrics_json,
                    provenance_json, instance_json FROM plans WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db(format!("reading plan {id}")))?
        else {
            return Ok(None);
        };
        let assignments = sqlx::query(
            "SELECT job_id, slot, site_id, power_w, gpu_model FROM assignments
             WHERE plan_id = $1 ORDER BY job_id, slot",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(db(format!("reading assignments of plan {id}")))?
        .iter()
        .map(|r| Assignment {
            job: r.get(0),
            slot: r.get::<i64, _>(1) as usize,
            site: r.get(2),
            power_w: r.get(3),
            gpu_model: r.get(4),
        })
        .collect();
        let migrations = sqlx::query(
            "SELECT job_id, from_site, to_site, slot, transfer_s, window_slots FROM migrations
             WHERE plan_id = $1 ORDER BY job_id, slot",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(db(format!("reading migrations of plan {id}")))?
        .iter()
        .map(|r| Migration {
            job: r.get(0),
            from: r.get(1),
            to: r.get(2),
            slot: r.get::<i64, _>(3) as usize,
            transfer_s: r.get(4),
            window_slots: r.get::<i64, _>(5) as usize,
        })
        .collect();
        let metrics: Metrics = serde_json::from_str(&row.get::<String, _>(5))
            .map_err(|e| corrupt(&format!("plan {id} metrics"), e))?;
        let provenance: Vec<SignalProvenance> = serde_json::from_str(&row.get::<String, _>(6))
            .map_err(|e| corrupt(&format!("plan {id} provenance"), e))?;
        let plan = Plan {
            assignments,
            migrations,
            unplanned: metrics.infeasible_jobs.clone(),
        };
        Ok(Some(PlanRecord {
            id: row.get(0),
            created_utc: parse_time("plan time", &row.get::<String, _>(1))?,
            horizon_start_utc: parse_time("plan horizon", &row.get::<String, _>(2))?,
            slot_minutes: row.get::<i64, _>(3) as u32,
            slots: row.get::<i64, _>(4) as usize,
            metrics,
            provenance,
            instance_json: row.get(7),
            plan,
        }))
    }
}

/// A stored API token, without its secret.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenRecord {
    /// Public prefix of the token.
    pub id: String,
    /// Holder: a user name, or a label for agents and viewers.
    pub name: String,
    /// `admin`, `user`, `agent` or `viewer`.
    pub role: String,
    /// The site an agent token is bound to.
    pub site: Option<String>,
    /// When it was created.
    pub created_utc: DateTime<Utc>,
}

/// A token that authorises one checkpoint transfer between two site agents.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TransferToken {
    /// SHA-256 of the token (the token itself is never stored).
    pub hash: String,
    /// The migrating job.
    pub job: String,
    /// Source site (uploads the checkpoint).
    pub from_site: String,
    /// Destination site (receives it).
    pub to_site: String,
    /// The plan that ordered the migration.
    pub plan_id: i64,
    /// When it was issued.
    pub created_utc: DateTime<Utc>,
    /// After this the destination refuses it.
    pub expires_utc: DateTime<Utc>,
}

/// A plan without its assignments: for history lists.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlanSummary {
    /// Plan id.
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
    pub metrics: windfall_solver::Metrics,
}

impl PlanSummary {
    /// End of the horizon.
    pub fn horizon_end_utc(&self) -> DateTime<Utc> {
        self.horizon_start_utc
            + chrono::Duration::minutes(i64::from(self.slot_minutes)) * self.slots as i32
    }
}

/// One agent event.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EventRecord {
    /// The reporting site.
    pub site: String,
    /// Event kind.
    pub kind: String,
    /// What the agent attached.
    pub detail: serde_json::Value,
    /// When it arrived.
    pub time_utc: DateTime<Utc>,
}

/// A site agent's newest heartbeat.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Heartbeat {
    /// Site id.
    pub site: String,
    /// When it arrived.
    pub time_utc: DateTime<Utc>,
    /// Inventory the agent reported (JSON).
    pub inventory_json: String,
}

impl Store {
    /// Stores a token's hash and holder. `id` is the token's public prefix.
    pub async fn insert_token(
        &self,
        id: &str,
        hash: &str,
        name: &str,
        role: &str,
        site: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if let Some(site) = site
            && !self.sites().await?.iter().any(|s| s.id == site)
        {
            return Err(StoreError::UnknownSite {
                site: site.to_string(),
                context: "token".to_string(),
            });
        }
        sqlx::query(
            "INSERT INTO tokens (id, hash, name, role, site_id, created_utc)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(hash)
        .bind(name)
        .bind(role)
        .bind(site.map(str::to_string))
        .bind(time_text(now))
        .execute(&self.pool)
        .await
        .map_err(db("saving a token"))?;
        Ok(())
    }

    /// Every plan's id, creation time and horizon, newest first.
    pub async fn plan_summaries(&self) -> Result<Vec<PlanSummary>> {
        let rows = sqlx::query(
            "SELECT id, created_utc, horizon_start_utc, slot_minutes, slots, metrics_json
             FROM plans ORDER BY id DESC",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("listing plans"))?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.get(0);
                let what = format!("plan {id}");
                let metrics: String = row.get(5);
                Ok(PlanSummary {
                    id,
                    created_utc: parse_time(&what, &row.get::<String, _>(1))?,
                    horizon_start_utc: parse_time(&what, &row.get::<String, _>(2))?,
                    slot_minutes: row.get::<i64, _>(3) as u32,
                    slots: row.get::<i64, _>(4) as usize,
                    metrics: serde_json::from_str(&metrics).map_err(|e| corrupt(&what, e))?,
                })
            })
            .collect()
    }

    /// The holder of the token with this hash.
    pub async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row =
            sqlx::query("SELECT id, name, role, site_id, created_utc FROM tokens WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&self.pool)
                .await
                .map_err(db("checking a token"))?;
        row.map(|row| {
            let id: String = row.get(0);
            Ok(TokenRecord {
                created_utc: parse_time(&format!("token {id}"), &row.get::<String, _>(4))?,
                name: row.get(1),
                role: row.get(2),
                site: row.get(3),
                id,
            })
        })
        .transpose()
    }

    /// Records a site agent's heartbeat and inventory, replacing the previous one.
    pub async fn record_heartbeat(
        &self,
        site: &str,
        now: DateTime<Utc>,
        inventory_json: &str,
    ) -> Result<()> {
        let _turn = self.write_turn().await;
        sqlx::query(
            "INSERT INTO heartbeats (site_id, time_utc, inventory_json) VALUES ($1, $2, $3)
             ON CONFLICT (site_id) DO UPDATE SET time_utc = excluded.time_utc,
               inventory_json = excluded.inventory_json",
        )
        .bind(site)
        .bind(time_text(now))
        .bind(inventory_json)
        .execute(&self.pool)
        .await
        .map_err(db(format!("recording a heartbeat from {site}")))?;
        Ok(())
    }

    /// The newest heartbeat of every site that has sent one.
    pub async fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        let rows = sqlx::query(
            "SELECT site_id, time_utc, inventory_json FROM heartbeats ORDER BY site_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("reading heartbeats"))?;
        rows.iter()
            .map(|row| {
                let site: String = row.get(0);
                Ok(Heartbeat {
                    time_utc: parse_time(&format!("heartbeat {site}"), &row.get::<String, _>(1))?,
                    inventory_json: row.get(2),
                    site,
                })
            })
            .collect()
    }

    /// Stores a checkpoint-transfer token's hash for one migration.
    pub async fn insert_transfer_token(&self, token: &TransferToken) -> Result<()> {
        let _turn = self.write_turn().await;
        sqlx::query(
            "INSERT INTO transfer_tokens
               (hash, job_id, from_site, to_site, plan_id, created_utc, expires_utc)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&token.hash)
        .bind(&token.job)
        .bind(&token.from_site)
        .bind(&token.to_site)
        .bind(token.plan_id)
        .bind(time_text(token.created_utc))
        .bind(time_text(token.expires_utc))
        .execute(&self.pool)
        .await
        .map_err(db(format!("saving a transfer token for job {}", token.job)))?;
        Ok(())
    }

    /// The transfer token with this hash, expired or not.
    pub async fn transfer_token(&self, hash: &str) -> Result<Option<TransferToken>> {
        let row = sqlx::query(
            "SELECT hash, job_id, from_site, to_site, plan_id, created_utc, expires_utc
             FROM transfer_tokens WHERE hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(db("checking a transfer token"))?;
        row.map(|row| {
            let job: String = row.get(1);
            let what = format!("transfer token for job {job}");
            Ok(TransferToken {
                hash: row.get(0),
                from_site: row.get(2),
                to_site: row.get(3),
                plan_id: row.get(4),
                created_utc: parse_time(&what, &row.get::<String, _>(5))?,
                expires_utc: parse_time(&what, &row.get::<String, _>(6))?,
                job,
            })
        })
        .transpose()
    }

    /// Events reported for `job`, oldest first.
    pub async fn job_events(&self, job: &str) -> Result<Vec<EventRecord>> {
        let rows = sqlx::query(
            "SELECT site_id, kind, detail_json, time_utc FROM events WHERE job_id = $1 ORDER BY id",
        )
        .bind(job)
        .fetch_all(&self.pool)
        .await
        .map_err(db(format!("reading the events of job {job}")))?;
        rows.iter()
            .map(|row| {
                let detail: String = row.get(2);
                Ok(EventRecord {
                    site: row.get(0),
                    kind: row.get(1),
                    detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                    time_utc: parse_time(&format!("event of job {job}"), &row.get::<String, _>(3))?,
                })
            })
            .collect()
    }

    /// Records an agent event and, in the same transaction, the job state it implies.
    pub async fn record_event(
        &self,
        site: &str,
        job: Option<&str>,
        kind: &str,
        detail_json: &str,
        new_state: Option<JobState>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting a transaction"))?;
        sqlx::query(
            "INSERT INTO events (site_id, job_id, kind, detail_json, time_utc)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(site)
        .bind(job.map(str::to_string))
        .bind(kind)
        .bind(detail_json)
        .bind(time_text(now))
        .execute(&mut *tx)
        .await
        .map_err(db(format!("recording a {kind} event from {site}")))?;
        if let (Some(job), Some(state)) = (job, new_state) {
            sqlx::query("UPDATE jobs SET state = $1, current_site = $2 WHERE id = $3")
                .bind(state.as_str())
                .bind(site)
                .bind(job)
                .execute(&mut *tx)
                .await
                .map_err(db(format!("updating job {job}")))?;
        }
        tx.commit().await.map_err(db("committing an event"))?;
        Ok(())
    }

    /// Takes the planning lock for the life of the returned guard, or returns `None` when
    /// another process holds it. PostgreSQL: a session advisory lock on a dedicated connection;
    /// SQLite: an exclusive lock on `lock_path`. Both end with the process, even when killed.
    pub async fn try_planning_lock(
        &self,
        lock_path: Option<&std::path::Path>,
    ) -> Result<Option<PlanningLock>> {
        match self.backend {
            Backend::Postgres => {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(db("taking a connection"))?;
                let row = sqlx::query("SELECT CAST(pg_try_advisory_lock($1) AS INTEGER)")
                    .bind(PLANNING_LOCK_KEY)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db("taking the planning lock"))?;
                let taken: i32 = row.get(0);
                Ok((taken == 1).then_some(PlanningLock::Postgres(Some(conn))))
            }
            Backend::Sqlite => {
                let path = lock_path.ok_or_else(|| {
                    StoreError::Conflict(
                        "planning lock: no lock file path for the SQLite database".into(),
                    )
                })?;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(path)
                    .map_err(|e| StoreError::LockFile {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?;
                match file.try_lock() {
                    Ok(()) => Ok(Some(PlanningLock::File(file))),
                    Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                    Err(std::fs::TryLockError::Error(e)) => Err(StoreError::LockFile {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    }),
                }
            }
        }
    }
}

/// Forecast rows per INSERT statement (8 parameters each, well under both backends' limits).
const FORECAST_ROWS_PER_STATEMENT: usize = 10;

/// Rows per JSON-array statement on SQLite.
const FORECAST_ROWS_PER_JSON_STATEMENT: usize = 5_000;

/// Environment variable that makes `save_plan` pause before its commit (crash tests only).
pub const PAUSE_BEFORE_PLAN_COMMIT_ENV: &str = "WINDFALL_TEST_PAUSE_BEFORE_PLAN_COMMIT_MS";

/// Advisory lock key of the planning cycle (PostgreSQL).
const PLANNING_LOCK_KEY: i64 = 0x7769_6e64_6661;

/// Held while a planning cycle runs; see [`Store::try_planning_lock`].
pub enum PlanningLock {
    /// The connection holding the advisory lock.
    Postgres(Option<sqlx::pool::PoolConnection<sqlx::Any>>),
    /// The locked file.
    File(std::fs::File),
}

impl Drop for PlanningLock {
    fn drop(&mut self) {
        // Not released explicitly: close the connection, which ends the session and its lock,
        // rather than return it to the pool still holding the lock.
        if let PlanningLock::Postgres(conn) = self
            && let Some(conn) = conn.take()
        {
            drop(conn.detach());
        }
    }
}

impl PlanningLock {
    /// Releases the lock.
    pub async fn release(mut self) {
        if let PlanningLock::Postgres(conn) = &mut self
            && let Some(mut conn) = conn.take()
        {
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(PLANNING_LOCK_KEY)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                // A connection in an unknown state must not return to the pool holding the lock.
                let _ = conn.detach();
            }
        }
    }
}

const JOB_SELECT: &str =
    "SELECT id, state, gpus, gpu_models, work_hours, release_utc, deadline_utc,
    checkpoint_gb, save_s, restore_s, migratable, home_site, current_site, state_reason,
    submitted_utc, owner, command FROM jobs";

fn job_from_row(row: &AnyRow) -> Result<JobRecord> {
    let id: String = row.get(0);
    let what = format!("job {id}");
    let state_text: String = row.get(1);
    let models: String = row.get(3);
    Ok(JobRecord {
        state: JobState::from_str(&state_text).map_err(|e| corrupt(&what, e))?,
        gpus: u32::try_from(row.get::<i64, _>(2)).map_err(|e| corrupt(&what, e))?,
        gpu_models: models
            .split('|')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect(),
        work_hours: row.get(4),
        release_utc: parse_time(&what, &row.get::<String, _>(5))?,
        deadline_utc: parse_time(&what, &row.get::<String, _>(6))?,
        checkpoint_gb: row.get(7),
        save_s: row.get(8),
        restore_s: row.get(9),
        migratable: row.get::<i64, _>(10) != 0,
        home_site: row.get(11),
        current_site: row.get(12),
        state_reason: row.get(13),
        submitted_utc: parse_time(&what, &row.get::<String, _>(14))?,
        owner: row.get(15),
        command: row.get(16),
        id,
    })
}

/// Hides a password in a database URL for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
