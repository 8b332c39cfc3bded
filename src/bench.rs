//! `windfall bench api`: a load benchmark of the planner API on loopback.
//!
//! Owns the benchmark's set-up (a fresh fleet, tokens and a plan in the given database), the load
//! (workers alternating job submissions and directive polls over real HTTP) and the report
//! (requests/s, latency percentiles, errors). Must only be pointed at a database made for it: it
//! writes jobs, sites and tokens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::Utc;
use serde_json::json;

use crate::auth::{Role, new_token};
use crate::db::Store;
use crate::model::SiteConfig;
use crate::planning::CycleConfig;
use crate::server::AppState;

/// Load settings.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// How long the load runs.
    pub duration: Duration,
    /// Concurrent clients.
    pub concurrency: usize,
}

/// What the load measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl LoadReport {
    /// One line per figure.
    pub fn text(&self, label: &str) -> String {
        format!(
            "{label}: {} requests in {:.1} s = {:.0} requests/s; latency p50 {:.2} ms, p90 {:.2} ms, \
             p99 {:.2} ms, max {:.2} ms; {} errors",
            self.requests,
            self.seconds,
            self.requests as f64 / self.seconds,
            self.p50_ms,
            self.p90_ms,
            self.p99_ms,
            self.max_ms,
            self.errors
        )
    }
}

async fn token(store: &Store, role: Role, name: &str, site: Option<&str>) -> Result<String> {
    let t = new_token().context("reading the system's random source")?;
    store
        .insert_token(&t.id, &t.hash, name, role.as_str(), site, Utc::now())
        .await?;
    Ok(t.token)
}

/// Opens `db_url`, which must hold no sites, and creates the benchmarks' GPU model and their one
/// site, `bench`, with `gpus` GPUs.
async fn bench_store(db_url: &str, gpus: u32) -> Result<Store> {
    let store = Store::connect(db_url)
        .await
        .with_context(|| format!("opening {}", crate::db::redact(db_url)))?;
    if !store.sites().await?.is_empty() {
        bail!("the benchmark needs an empty database: it creates its own site, data and tokens");
    }
    let model = windfall_solver::GpuModel {
        power_levels_w: vec![700.0, 400.0],
        throughput: vec![1.0, 0.8],
        speed: 1.0,
        idle_w: 50.0,
    };
    store.upsert_gpu_model("H100", &model).await?;
    let site = SiteConfig {
        id: "bench".into(),
        zone: None,
        gpus: [("H100".to_string(), gpus)].into_iter().collect(),
        pue: 1.2,
        grid_limit_kw: None,
        wan_gbps: 10.0,
    };
    store.upsert_site(&site, Utc::now()).await?;
    Ok(store)
}

/// Sets up a fleet in `db_url`, serves it on a free loopback port and runs the load.
pub async fn run(db_url: &str, load: &LoadConfig) -> Result<LoadReport> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = bench_store(db_url, 400).await?;
    // A day of forecasts and a plan over 100 jobs, so directive polls return real runs.
    let hour = chrono::DurationRound::duration_trunc(Utc::now(), chrono::Duration::hours(1))?;
    let points: Vec<windfall_forecasts::ForecastPoint> = (-1..26)
        .map(|h| windfall_forecasts::ForecastPoint {
            issued_utc: hour - chrono::Duration::hours(2),
            time_utc: hour + chrono::Duration::hours(h),
            site: "bench".into(),
            surplus_kw: Some(0.0),
            carbon_g_per_kwh: Some(300.0 + 100.0 * (h as f64 / 24.0 * std::f64::consts::TAU).sin()),
            carbon_signal: windfall_forecasts::CarbonSignal::Average,
            price_usd_per_mwh: None,
        })
        .collect();
    store.insert_forecasts("bench", &points).await?;
    for i in 0..100 {
        store
            .insert_job(&crate::model::JobRecord {
                id: format!("seed-{i}"),
                state: crate::model::JobState::Queued,
                gpus: 1 + i % 4,
                gpu_models: Vec::new(),
                work_hours: 1.0 + f64::from(i % 5),
                release_utc: hour,
                deadline_utc: hour + chrono::Duration::hours(20),
                checkpoint_gb: 10.0,
                save_s: 60.0,
                restore_s: 120.0,
                migratable: false,
                home_site: "bench".into(),
                current_site: None,
                state_reason: None,
                submitted_utc: hour,
                owner: Some("bench-user".into()),
                command: Some("python train.py".into()),
            })
            .await?;
    }
    let user = token(&store, Role::User, "bench-user", None).await?;
    let agent = token(&store, Role::Agent, "bench-agent", Some("bench")).await?;
    let cycle = CycleConfig {
        slots: 24,
        slot_minutes: 60,
        time_limit_s: 5.0,
        lock_path: crate::planning::sqlite_lock_path(db_url),
        change_penalty_g: 10.0,
    };
    let planned = crate::planning::run_cycle(&store, &cycle, Utc::now()).await?;
    eprintln!("set-up: {}", planned.summary());
    let state = Arc::new(AppState::new(store, cycle));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let app = crate::server::router(state);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(load.concurrency)
        .build()?;
    eprintln!(
        "load: {} clients for {:.0} s against {base}, half job submissions, half directive polls",
        load.concurrency,
        load.duration.as_secs_f64()
    );
    let started = Instant::now();
    let deadline = started + load.duration;
    let mut workers = Vec::new();
    for worker in 0..load.concurrency {
        let (client, base, user, agent) =
            (client.clone(), base.clone(), user.clone(), agent.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies_us: Vec<u32> = Vec::new();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let sent = Instant::now();
                let response = if i.is_multiple_of(2) {
                    let body = json!({
                        "id": format!("w{worker}-{i}"), "gpus": 1, "work_hours": 1.0,
                        "home_site": "bench",
                        "deadline_utc": (Utc::now() + chrono::Duration::hours(12)).to_rfc3339(),
                    });
                    client
                        .post(format!("{base}/v1/jobs"))
                        .bearer_auth(&user)
                        .json(&body)
                        .send()
                        .await
                } else {
                    client
                        .get(format!("{base}/v1/sites/bench/directives"))
                        .bearer_auth(&agent)
                        .send()
                        .await
                };
                let ok = match response {
                    Ok(r) => {
                        let ok = r.status().is_success();
                        let _ = r.bytes().await;
                        ok
                    }
                    Err(_) => false,
                };
                latencies_us.push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                errors += u64::from(!ok);
                i += 1;
            }
            (latencies_us, errors)
        }));
    }
    let mut latencies: Vec<u32> = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (l, e) = w.await.context("a load worker failed")?;
        latencies.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    server.abort();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        f64::from(latencies[i]) / 1000.0
    };
    Ok(LoadReport {
        requests: latencies.len() as u64,
        errors,
        seconds,
        p50_ms: pct(0.50),
        p90_ms: pct(0.90),
        p99_ms: pct(0.99),
        max_ms: latencies.last().map_or(0.0, |&v| f64::from(v) / 1000.0),
    })
}

/// Generates `rows` canonical forecast rows (one site, hourly), parses and stores them in one
/// call, and reports rows/s for each step. Needs an empty database.
pub async fn ingest(db_url: &str, rows: usize) -> Result<String> {
    let store = bench_store(db_url, 8).await?;
    let start = chrono::DateTime::parse_from_rfc3339("2000-01-01T00:00:00Z")?.with_timezone(&Utc);
    let mut text = String::with_capacity(rows * 96);
    text.push_str(
        "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh\n",
    );
    for i in 0..rows {
        let t = start + chrono::Duration::hours(i as i64);
        let issued = (t - chrono::Duration::hours(24)).format("%Y-%m-%dT%H:%M:%SZ");
        text.push_str(&format!(
            "{issued},{},bench,{:.1},{:.1},average,{:.2}\n",
            t.format("%Y-%m-%dT%H:%M:%SZ"),
            (i % 7) as f64,
            200.0 + (i % 300) as f64,
            40.0 + (i % 50) as f64
        ));
    }
    let parse_started = Instant::now();
    let points = windfall_forecasts::parse_canonical_csv(&text, "generated")?;
    let parse_s = parse_started.elapsed().as_secs_f64();
    let store_started = Instant::now();
    let stored = store.insert_forecasts("bench", &points).await?;
    let store_s = store_started.elapsed().as_secs_f64();
    store.close().await;
    Ok(format!(
        "{}: {stored} canonical rows; parse {parse_s:.2} s ({:.0} rows/s), store {store_s:.2} s \
         ({:.0} rows/s), both {:.0} rows/s",
        crate::db::redact(db_url),
        stored as f64 / parse_s,
        stored as f64 / store_s,
        stored as f64 / (parse_s + store_s)
    ))
}
