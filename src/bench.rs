//! `windfall bench api`: a load benchmark of the planner API on loopback.
//!
//! Owns the benchmark's set-up (a fresh fleet, tokens and a plan in the given database), the load
//! (workers alternating job submissions and directive polls over real HTTP) and the report
//! (requests/s, latency percentiles, errors). Must only be pointed at a database made for it: it
//! writes jobs, sites and tokens.

use std::fmt::Write as _;
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

/// Opens `db_url`, which must hold no sites, and creates the benchmarks' GPU model and the sites
/// `(id, zone, H100 count)`.
async fn bench_store(db_url: &str, sites: &[(&str, Option<&str>, u32)]) -> Result<Store> {
    let store = Store::connect(db_url)
        .await
        .with_context(|| format!("opening {}", crate::db::redact(db_url)))?;
    if !store.sites().await?.is_empty() {
        bail!("the benchmark needs an empty database: it creates its own sites, data and tokens");
    }
    let model = windfall_solver::GpuModel {
        power_levels_w: vec![700.0, 400.0],
        throughput: vec![1.0, 0.8],
        speed: 1.0,
        idle_w: 50.0,
    };
    store.upsert_gpu_model("H100", &model).await?;
    for (id, zone, gpus) in sites {
        let site = SiteConfig {
            id: (*id).to_string(),
            zone: zone.map(str::to_string),
            gpus: [("H100".to_string(), *gpus)].into_iter().collect(),
            pue: 1.2,
            grid_limit_kw: None,
            wan_gbps: 10.0,
        };
        store.upsert_site(&site, Utc::now()).await?;
    }
    Ok(store)
}

/// Sets up a fleet in `db_url`, serves it on a free loopback port and runs the load.
pub async fn run(db_url: &str, load: &LoadConfig) -> Result<LoadReport> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = bench_store(db_url, &[("bench", None, 400)]).await?;
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
        max_forecast_age_h: 24.0,
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
    let store = bench_store(db_url, &[("bench", None, 8)]).await?;
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

/// `windfall bench dashboard`: a plan of `jobs` jobs over four sites in an empty database, the
/// dashboard served in-process on loopback, and the time to serve each page over HTTP (server
/// render included); with `browser`, also each page's load time in headless Chromium.
pub async fn dashboard(db_url: &str, jobs: usize, browser: bool) -> Result<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sites = [
        ("site-0", Some("Z0"), 1000),
        ("site-1", Some("Z1"), 1000),
        ("site-2", Some("Z2"), 1000),
        ("site-3", Some("Z3"), 1000),
    ];
    let store = bench_store(db_url, &sites).await?;
    let hour = chrono::DurationRound::duration_trunc(Utc::now(), chrono::Duration::hours(1))?;
    let mut points = Vec::new();
    for (s, (site, _, _)) in sites.iter().enumerate() {
        for h in -1..26 {
            let phase = (h as f64 + 6.0 * s as f64) / 24.0 * std::f64::consts::TAU;
            points.push(windfall_forecasts::ForecastPoint {
                issued_utc: hour - chrono::Duration::hours(2),
                time_utc: hour + chrono::Duration::hours(h),
                site: (*site).to_string(),
                surplus_kw: Some((200.0 * phase.sin()).max(0.0)),
                carbon_g_per_kwh: Some(250.0 + 150.0 * phase.cos()),
                carbon_signal: windfall_forecasts::CarbonSignal::Average,
                price_usd_per_mwh: None,
            });
        }
    }
    store.insert_forecasts("bench", &points).await?;
    let seeded = Instant::now();
    for i in 0..jobs {
        let k = i as u32;
        store
            .insert_job(&crate::model::JobRecord {
                id: format!("job-{i:05}"),
                state: crate::model::JobState::Queued,
                gpus: 1 + k % 4,
                gpu_models: Vec::new(),
                work_hours: 1.0 + f64::from(k % 4),
                release_utc: hour,
                deadline_utc: hour + chrono::Duration::hours(8 + i64::from(k % 16)),
                checkpoint_gb: 5.0,
                save_s: 60.0,
                restore_s: 120.0,
                migratable: true,
                home_site: format!("site-{}", i % 4),
                current_site: None,
                state_reason: None,
                submitted_utc: hour,
                owner: Some(format!("user-{:02}", i % 20)),
                command: None,
            })
            .await?;
    }
    eprintln!(
        "set-up: {jobs} jobs stored in {:.1} s",
        seeded.elapsed().as_secs_f64()
    );
    let horizon = crate::fleet::Horizon {
        start_utc: hour,
        slot_minutes: 60,
        slots: 24,
    };
    let (instance, provenance) = crate::fleet::build_instance(&store, horizon).await?;
    let solving = Instant::now();
    let options = windfall_solver::SolveOptions {
        method: windfall_solver::Method::Heuristic,
        ..windfall_solver::SolveOptions::default()
    };
    let to_solve = instance.clone();
    let solution =
        tokio::task::spawn_blocking(move || windfall_solver::solve(&to_solve, &options)).await?;
    eprintln!(
        "set-up: heuristic plan in {:.1} s, {} assignments",
        solving.elapsed().as_secs_f64(),
        solution.plan.assignments.len()
    );
    store
        .save_plan(&crate::model::NewPlan {
            created_utc: Utc::now(),
            horizon_start_utc: hour,
            slot_minutes: 60,
            slots: 24,
            metrics: solution.metrics.clone(),
            provenance,
            instance_json: instance.to_json(),
            plan: solution.plan,
        })
        .await?;
    let viewer = token(&store, Role::Viewer, "bench-viewer", None).await?;
    let cycle = CycleConfig {
        slots: 24,
        slot_minutes: 60,
        time_limit_s: 5.0,
        lock_path: crate::planning::sqlite_lock_path(db_url),
        change_penalty_g: 10.0,
        max_forecast_age_h: 24.0,
    };
    let state = Arc::new(AppState::new(store, cycle));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let app = crate::server::router(state);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let cookie = format!("windfall_session={viewer}");
    let pages = [
        "/",
        "/sites/site-0",
        "/jobs",
        "/jobs?page=50",
        "/jobs?user=user-07",
        "/plans",
        "/reports",
    ];
    let mut out = format!(
        "dashboard with {jobs} jobs x 4 sites x 24 slots (heuristic plan)\n\
         {:<22} {:>10} {:>10} {:>10} {:>10}\n",
        "page", "min ms", "median ms", "max ms", "KiB"
    );
    for page in pages {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..5 {
            let sent = Instant::now();
            let response = client
                .get(format!("{base}{page}"))
                .header(reqwest::header::COOKIE, &cookie)
                .send()
                .await?;
            if !response.status().is_success() {
                bail!("{page}: {}", response.status());
            }
            bytes = response.bytes().await?.len();
            times.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let _ = writeln!(
            out,
            "{page:<22} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            times[0],
            times[times.len() / 2],
            times[times.len() - 1],
            bytes as f64 / 1024.0
        );
    }
    if browser {
        if !crate::webdriver::available() {
            bail!(
                "--browser needs chromium and chromedriver (Debian packages chromium, chromium-driver)"
            );
        }
        let (_driver, b) = crate::webdriver::Driver::start(None).await?;
        b.go(&format!("{base}/login")).await?;
        b.type_into("#token", &viewer).await?;
        b.click("#sign-in").await?;
        let signing_in = Instant::now();
        while b.current_url().await?.ends_with("/login") {
            if signing_in.elapsed() > Duration::from_secs(20) {
                bail!("signing in to the dashboard did not complete in 20 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = writeln!(
            out,
            "\nheadless Chromium, navigation start to load event end:"
        );
        for page in pages {
            b.go(&format!("{base}{page}")).await?;
            let _ = writeln!(out, "{page:<22} {:>10.1} ms", b.load_ms().await?);
        }
    }
    server.abort();
    Ok(out)
}
