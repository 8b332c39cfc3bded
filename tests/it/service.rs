//! The planner service end to end: `windfall serve` as a real process on 127.0.0.1, tokens from
//! `windfall token create`, jobs through `windfall submit` and `windfall jobs`, planning through
//! `windfall plan`, and the API's authorization, on SQLite and on PostgreSQL
//! (`WINDFALL_TEST_PG_URL`, as in the store tests).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use chrono::{Duration, DurationRound, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub(crate) fn windfall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args(args)
        .env_remove("WINDFALL_DB")
        .env_remove("WINDFALL_TOKEN")
        .output()
        .unwrap()
}

pub(crate) fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The databases to run against: a SQLite file, and a fresh PostgreSQL database when
/// `WINDFALL_TEST_PG_URL` is set (dropped at the end).
struct Databases {
    urls: Vec<String>,
    _dir: tempfile::TempDir,
    pg: Option<(String, String)>, // (admin url, database name)
}

impl Databases {
    fn new(name: &str) -> Databases {
        let dir = tempfile::tempdir().unwrap();
        let mut urls = vec![format!("sqlite://{}", dir.path().join("w.db").display())];
        let mut pg = None;
        if let Ok(base) = std::env::var("WINDFALL_TEST_PG_URL") {
            let db_name = format!("wf_svc_{name}_{}", std::process::id());
            psql(&base, &format!("DROP DATABASE IF EXISTS {db_name}"));
            psql(&base, &format!("CREATE DATABASE {db_name}"));
            let cut = base.rfind('/').unwrap();
            urls.push(format!("{}/{db_name}", &base[..cut]));
            pg = Some((base, db_name));
        } else {
            eprintln!("service::{name}: WINDFALL_TEST_PG_URL not set, PostgreSQL not checked here");
        }
        Databases {
            urls,
            _dir: dir,
            pg,
        }
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        if let Some((base, name)) = &self.pg {
            psql(
                base,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            );
        }
    }
}

/// Runs one statement on its own thread and runtime (callers may be inside a test's runtime).
fn psql(url: &str, sql: &str) {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || psql_blocking(&url, &sql))
        .join()
        .unwrap();
}

fn psql_blocking(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(url)
            .await
            .expect("WINDFALL_TEST_PG_URL is set but PostgreSQL is unreachable");
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    });
}

/// A running `windfall serve`, stopped with SIGTERM on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(db: &str) -> Server {
        Server::start_with(db, &[])
    }

    /// `windfall serve` with `extra` arguments.
    pub(crate) fn start_with(db: &str, extra: &[&str]) -> Server {
        let listen = if extra.contains(&"--listen") {
            &[][..]
        } else {
            &["--listen", "127.0.0.1:0"][..]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(["serve", "--db", db])
            .args(listen)
            .args(["--slots", "24", "--time-limit", "3"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("serve names its address")
            .to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{line}");
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The shell's own `kill`: no procps needed.
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

pub(crate) fn token(db: &str, role: &str, name: &str, site: Option<&str>) -> String {
    let mut args = vec![
        "token", "create", "--db", db, "--role", role, "--name", name,
    ];
    if let Some(site) = site {
        args.extend(["--site", site]);
    }
    stdout(&windfall(&args)).trim().to_string()
}

/// The canonical forecast CSV header.
pub(crate) const FORECAST_CSV_HEADER: &str =
    "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh\n";

pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    pub(crate) fn new(base: &str) -> Api {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Api {
            http: reqwest::Client::new(),
            base: base.to_string(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
    pub(crate) async fn get(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, token, None).await
    }
    pub(crate) async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }
    /// Uploads canonical forecast CSV as `token`'s user; the upload must succeed.
    pub(crate) async fn upload_forecasts(&self, token: &str, csv: String) {
        let response = self
            .http
            .post(format!("{}/v1/forecasts", self.base))
            .bearer_auth(token)
            .header("X-Windfall-Source", "test")
            .body(csv)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    pub(crate) async fn put(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::PUT, path, Some(token), Some(body))
            .await
    }
}

/// Two sites (`clean` and `dirty`) with 26 hours of forecasts from the current hour.
async fn set_up_fleet(api: &Api, admin: &str) {
    let model = json!({ "power_levels_w": [700, 400], "throughput": [1.0, 0.8], "idle_w": 50 });
    assert_eq!(
        api.put("/v1/gpu-models/H100", admin, model).await.0,
        StatusCode::OK
    );
    for id in ["clean", "dirty"] {
        let site = json!({ "zone": "Z", "gpus": { "H100": 4 }, "pue": 1.2, "wan_gbps": 10 });
        let (status, body) = api.put(&format!("/v1/sites/{id}"), admin, site).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    let issued = hour - Duration::hours(2);
    let mut csv = String::from(FORECAST_CSV_HEADER);
    for h in -1..26 {
        let t = hour + Duration::hours(h);
        for (site, carbon) in [("clean", 40.0 + h as f64), ("dirty", 700.0)] {
            csv.push_str(&format!(
                "{},{},{site},0,{carbon},average,50\n",
                issued.to_rfc3339(),
                t.to_rfc3339()
            ));
        }
    }
    api.upload_forecasts(admin, csv).await;
}

/// Submits `n` migratable jobs `j0..` of 1-2 GPUs and 2-4 work hours, homed at `dirty`, with
/// deadlines `first_deadline_h` to `first_deadline_h + spread_h - 1` hours from now.
async fn submit_jobs(api: &Api, admin: &str, n: i64, first_deadline_h: i64, spread_h: i64) {
    for i in 0..n {
        let deadline = Utc::now() + Duration::hours(first_deadline_h + i % spread_h);
        let body = json!({ "id": format!("j{i}"), "gpus": 1 + i % 2, "work_hours": 2 + i % 3,
            "migratable": true, "home_site": "dirty", "deadline_utc": deadline.to_rfc3339() });
        let (status, job) = api.post("/v1/jobs", admin, body).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_plans_and_directives_end_to_end_with_authorization() {
    let dbs = Databases::new("e2e");
    for db in &dbs.urls {
        let admin = token(db, "admin", "root", None);
        let server = Server::start(db);
        let api = Api::new(&server.url);
        set_up_fleet(&api, &admin).await;
        let alice = token(db, "user", "alice", None);
        let bob = token(db, "user", "bob", None);
        let agent = token(db, "agent", "agent-clean", Some("clean"));
        let viewer = token(db, "viewer", "dashboard", None);

        // Alice submits through the CLI.
        let deadline = (Utc::now() + Duration::hours(20)).to_rfc3339();
        let submitted = stdout(&windfall(&[
            "submit",
            "--server",
            &server.url,
            "--token",
            &alice,
            "--json",
            "--id",
            "train-1",
            "--gpus",
            "2",
            "--work-hours",
            "3",
            "--deadline",
            &deadline,
            "--home-site",
            "dirty",
            "--command",
            "python train.py",
        ]));
        let job: Value = serde_json::from_str(&submitted).unwrap();
        assert_eq!(
            (job["id"].as_str(), job["state"].as_str()),
            (Some("train-1"), Some("queued"))
        );

        // One planning cycle from cron.
        let plan_out = stdout(&windfall(&[
            "plan",
            "--db",
            db,
            "--slots",
            "24",
            "--time-limit",
            "3",
        ]));
        assert!(plan_out.contains("plan #1"), "{plan_out}");

        let (status, plan) = api.get("/v1/plans/latest", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK, "{plan}");
        let runs: Vec<&Value> = plan["plan"]["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["job"] == "train-1")
            .collect();
        assert!(runs.len() >= 3, "{plan}");
        assert!(runs.iter().all(|a| a["site"] == "clean"), "{plan}");

        // The agent of `clean` reads its directives, with the job's command.
        let (status, directives) = api.get("/v1/sites/clean/directives", Some(&agent)).await;
        assert_eq!(status, StatusCode::OK, "{directives}");
        let listed = directives["runs"].as_array().unwrap();
        assert_eq!(listed.len(), runs.len());
        assert_eq!(listed[0]["command"], "python train.py");
        // ... but not another site's, nor may it report for one.
        let (status, _) = api.get("/v1/sites/dirty/directives", Some(&agent)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let inventory = json!({ "inventory": { "H100": 4 } });
        let (status, _) = api
            .post("/v1/sites/dirty/heartbeat", &agent, inventory.clone())
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = api
            .post("/v1/sites/clean/heartbeat", &agent, inventory)
            .await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = api
            .post(
                "/v1/sites/clean/events",
                &agent,
                json!({ "kind": "job_started", "job": "train-1" }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");

        // Bob can neither read nor cancel Alice's job, and sees none of it.
        let (status, _) = api.get("/v1/jobs/train-1", Some(&bob)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = api.post("/v1/jobs/train-1/cancel", &bob, json!(null)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let bobs = stdout(&windfall(&[
            "jobs",
            "list",
            "--server",
            &server.url,
            "--token",
            &bob,
        ]));
        assert!(bobs.contains("0 job(s)"), "{bobs}");
        let alices = stdout(&windfall(&[
            "jobs",
            "list",
            "--server",
            &server.url,
            "--token",
            &alice,
        ]));
        assert!(
            alices.contains("train-1") && alices.contains("running"),
            "{alices}"
        );
        let shown = stdout(&windfall(&[
            "jobs",
            "show",
            "train-1",
            "--server",
            &server.url,
            "--token",
            &alice,
        ]));
        assert!(shown.contains("planned runs"), "{shown}");
        assert!(shown.contains("kg run-now"), "{shown}");
        let (_, detail) = api.get("/v1/jobs/train-1", Some(&alice)).await;
        let e = &detail["plan"]["emissions"];
        let (expected, baseline) = (
            e["expected_g"].as_f64().unwrap(),
            e["run_now_baseline_g"].as_f64().unwrap(),
        );
        assert!(expected > 0.0 && expected < 0.2 * baseline, "{detail}");

        // A viewer reads but never writes; no token or a wrong one is 401.
        let (status, _) = api.get("/v1/jobs/train-1", Some(&viewer)).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = api.post("/v1/jobs", &viewer, json!({ "gpus": 1 })).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = api
            .put(
                "/v1/sites/clean",
                &viewer,
                json!({ "gpus": {}, "wan_gbps": 1 }),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = api.get("/v1/jobs", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = api.get("/v1/jobs", Some("wf_00000000_nope")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // Bad input names the field.
        let base = json!({ "gpus": 1, "work_hours": 1, "home_site": "clean",
                           "deadline_utc": (Utc::now() + Duration::hours(5)).to_rfc3339() });
        for (change, field) in [
            (json!({ "gpus": 0 }), "gpus"),
            (json!({ "work_hours": -1 }), "work_hours"),
            (json!({ "home_site": "mars" }), "home_site"),
            (
                json!({ "deadline_utc": "2020-01-01T00:00:00Z" }),
                "deadline_utc",
            ),
            (json!({ "gpus": "two" }), "gpus"),
            (json!({ "colour": "red" }), "colour"),
        ] {
            let mut body = base.clone();
            for (k, v) in change.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (status, error) = api.post("/v1/jobs", &alice, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {error}");
            assert!(
                error["error"].as_str().unwrap().contains(field),
                "{field}: {error}"
            );
        }
        // An unmeetable deadline is accepted as infeasible, with the reason.
        let mut tight = base.clone();
        tight["work_hours"] = json!(30);
        let (status, job) = api.post("/v1/jobs", &alice, tight).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        assert_eq!(job["state"], "infeasible");
        assert!(
            job["state_reason"]
                .as_str()
                .unwrap()
                .contains("not enough time")
        );

        // Alice cancels through the CLI.
        let cancelled = stdout(&windfall(&[
            "jobs",
            "cancel",
            "train-1",
            "--server",
            &server.url,
            "--token",
            &alice,
            "--json",
        ]));
        let cancelled: Value = serde_json::from_str(&cancelled).unwrap();
        assert_eq!(cancelled["state"], "cancelled");

        // Forecasts as known now, with their source.
        let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
        let (status, forecasts) = api
            .get(
                &format!(
                    "/v1/forecasts?site=clean&from={}&to={}",
                    hour.to_rfc3339().replace('+', "%2B"),
                    (hour + Duration::hours(3)).to_rfc3339().replace('+', "%2B")
                ),
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{forecasts}");
        let values = forecasts["values"].as_array().unwrap();
        assert_eq!(values.len(), 3, "{forecasts}");
        assert_eq!(values[0]["source"], "test");
        assert_eq!(values[0]["carbon_g_per_kwh"], 40.0);
        let (status, _) = api
            .get(
                "/v1/forecasts?site=mars&from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z",
                Some(&viewer),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        let (status, health) = api.get("/healthz", None).await;
        assert_eq!(
            (status, health["status"].as_str()),
            (StatusCode::OK, Some("ok"))
        );
        let (status, spec) = api.get("/openapi.json", None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(spec["paths"]["/v1/jobs"]["post"].is_object());
        let (_, metrics) = api.get("/metrics", None).await;
        let metrics = metrics.as_str().unwrap().to_string();
        assert!(
            metrics.contains("windfall_http_requests_total"),
            "{metrics}"
        );
        assert!(
            metrics.contains("windfall_agent_heartbeat_age_seconds{site=\"clean\"}"),
            "{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_plan_runs_started_together_write_one_plan() {
    let dbs = Databases::new("lock");
    for db in &dbs.urls {
        let admin = token(db, "admin", "root", None);
        let server = Server::start(db);
        let api = Api::new(&server.url);
        set_up_fleet(&api, &admin).await;
        // Enough jobs that a cycle runs for seconds, so the two overlap.
        submit_jobs(&api, &admin, 24, 12, 8).await;
        let spawn = || {
            Command::new(env!("CARGO_BIN_EXE_windfall"))
                .args(["plan", "--db", db, "--slots", "24", "--time-limit", "4"])
                // The winner holds its lock at least this long, so the two runs overlap.
                .env(windfall::db::PAUSE_BEFORE_PLAN_COMMIT_ENV, "1500")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let outputs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let succeeded = outputs.iter().filter(|o| o.status.success()).count();
        assert_eq!(succeeded, 1, "{outputs:?}");
        let refused = outputs.iter().find(|o| !o.status.success()).unwrap();
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("planning lock"),
            "{refused:?}"
        );
        let (_, latest) = api.get("/v1/plans/latest", Some(&admin)).await;
        assert_eq!(latest["id"], 1, "exactly one plan was written");
    }
}

/// One integer from a query, on its own thread and runtime.
fn query_i64(url: &str, sql: &str) -> i64 {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.unwrap();
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .unwrap();
            let value: i64 = sqlx::Row::get(&row, 0);
            pool.close().await;
            value
        })
    })
    .join()
    .unwrap()
}

fn sqlite_integrity(url: &str) -> String {
    let url = url.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            let row = sqlx::query("PRAGMA integrity_check")
                .fetch_one(&pool)
                .await
                .unwrap();
            let value: String = sqlx::Row::get(&row, 0);
            pool.close().await;
            value
        })
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_plan_run_leaves_the_previous_plan_current() {
    let dbs = Databases::new("crash");
    for db in &dbs.urls {
        let admin = token(db, "admin", "root", None);
        let server = Server::start(db);
        let api = Api::new(&server.url);
        set_up_fleet(&api, &admin).await;
        submit_jobs(&api, &admin, 30, 10, 12).await;
        // A high change penalty: a rerun with unchanged inputs must keep its plan.
        let plan_args = [
            "plan",
            "--db",
            db,
            "--slots",
            "24",
            "--time-limit",
            "2",
            "--change-penalty-g",
            "1000",
        ];
        stdout(&windfall(&plan_args));
        let mut completed = 1;
        // SIGKILL at points spread over a run: while connecting, solving and writing.
        for delay_ms in [30, 120, 250, 400, 600, 900, 1300] {
            let mut child = Command::new(env!("CARGO_BIN_EXE_windfall"))
                .args(plan_args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            let finished = child.try_wait().unwrap().is_some_and(|s| s.success());
            child.kill().ok();
            child.wait().unwrap();
            completed += usize::from(finished);
            let plans = query_i64(db, "SELECT COUNT(*) FROM plans");
            assert!(plans >= completed as i64);
            // Every stored plan is whole: it has its assignments, and no assignment is orphaned.
            let empty = query_i64(
                db,
                "SELECT COUNT(*) FROM plans p WHERE NOT EXISTS \
                 (SELECT 1 FROM assignments a WHERE a.plan_id = p.id)",
            );
            assert_eq!(
                empty, 0,
                "a plan without assignments after a kill at {delay_ms} ms"
            );
            let orphans = query_i64(
                db,
                "SELECT COUNT(*) FROM assignments a WHERE NOT EXISTS \
                 (SELECT 1 FROM plans p WHERE p.id = a.plan_id)",
            );
            assert_eq!(orphans, 0);
            let (status, latest) = api.get("/v1/plans/latest", Some(&admin)).await;
            assert_eq!(status, StatusCode::OK);
            let newest = query_i64(db, "SELECT MAX(id) FROM plans");
            assert_eq!(latest["id"].as_i64(), Some(newest), "{latest}");
        }
        // And exactly during the write: the plan's rows are in its transaction, not committed.
        let before = query_i64(db, "SELECT COUNT(*) FROM plans");
        let newest = query_i64(db, "SELECT MAX(id) FROM plans");
        let mut child = Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(plan_args)
            .env(windfall::db::PAUSE_BEFORE_PLAN_COMMIT_ENV, "20000")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("not yet committed"), "{line}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(query_i64(db, "SELECT COUNT(*) FROM plans"), before);
        let (_, latest) = api.get("/v1/plans/latest", Some(&admin)).await;
        assert_eq!(latest["id"].as_i64(), Some(newest), "{latest}");
        if db.starts_with("sqlite:") {
            assert_eq!(sqlite_integrity(db), "ok");
        }
        // The lock died with the killed runs: a rerun succeeds.
        let plan_id = |out: &str| -> i64 {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix('#'))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no plan id in {out}"))
        };
        let before = query_i64(db, "SELECT MAX(id) FROM plans");
        let rerun = plan_id(&stdout(&windfall(&plan_args)));
        assert!(rerun > before);
        // With unchanged inputs the rerun keeps the previous plan's runs (plan stability), and
        // the diff says so; a new job shows up as added.
        let (status, diff) = api
            .get(&format!("/v1/plans/{rerun}/diff"), Some(&admin))
            .await;
        assert_eq!(status, StatusCode::OK, "{diff}");
        assert_eq!(diff["previous_plan_id"].as_i64(), Some(before));
        // Nothing planned before moves; the rerun may only place jobs the first run left out.
        assert!(
            diff["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|j| j["status"] == "added"),
            "{diff}"
        );
        let body = json!({ "id": "late", "gpus": 1, "work_hours": 1, "home_site": "clean",
            "deadline_utc": (Utc::now() + Duration::hours(23)).to_rfc3339() });
        assert_eq!(
            api.post("/v1/jobs", &admin, body).await.0,
            StatusCode::CREATED
        );
        let latest = plan_id(&stdout(&windfall(&plan_args)));
        let (_, diff) = api
            .get(&format!("/v1/plans/{latest}/diff"), Some(&admin))
            .await;
        let added: Vec<&Value> = diff["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["status"] == "added")
            .collect();
        let (_, late) = api.get("/v1/jobs/late", Some(&admin)).await;
        assert_eq!(added.len(), 1, "{diff} {late}");
        assert_eq!(added[0]["job"], "late");
    }
}

#[test]
fn the_api_load_benchmark_runs_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("bench.db").display());
    let out = stdout(&windfall(&[
        "bench",
        "api",
        "--db",
        &db,
        "--duration",
        "1",
        "--concurrency",
        "2",
    ]));
    assert!(
        out.contains("requests/s") && out.contains(" 0 errors"),
        "{out}"
    );
    // A second run refuses the now non-empty database instead of mixing its data in.
    let again = windfall(&["bench", "api", "--db", &db, "--duration", "1"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("empty database"));
}

#[test]
fn a_configuration_file_fills_in_what_flags_and_environment_do_not_give() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("from-config.db");
    let config = dir.path().join("windfall.toml");
    std::fs::write(
        &config,
        format!("db = \"sqlite://{}\"\ntime_limit = 5\n", db_path.display()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let out = windfall(&[
        "token", "create", "--config", config, "--role", "admin", "--name", "ops",
    ]);
    assert!(stdout(&out).starts_with("wf_"));
    assert!(db_path.exists(), "the file's db was not used");
    // A flag wins over the file.
    let other = dir.path().join("from-flag.db");
    let flag_db = format!("sqlite://{}", other.display());
    stdout(&windfall(&[
        "token", "create", "--config", config, "--db", &flag_db, "--role", "viewer", "--name", "v",
    ]));
    assert!(other.exists());
    // Unknown keys are named.
    std::fs::write(dir.path().join("bad.toml"), "colour = \"red\"\n").unwrap();
    let bad = windfall(&[
        "plan",
        "--config",
        dir.path().join("bad.toml").to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown key `colour`"));
}

#[tokio::test(flavor = "multi_thread")]
async fn planning_uses_the_inventory_agents_report() {
    let dbs = Databases::new("inventory");
    for db in &dbs.urls {
        let admin = token(db, "admin", "root", None);
        let server = Server::start(db);
        let api = Api::new(&server.url);
        set_up_fleet(&api, &admin).await;
        let agent = token(db, "agent", "agent-clean", Some("clean"));
        let body = json!({ "id": "t", "gpus": 2, "work_hours": 2, "home_site": "dirty",
            "deadline_utc": (Utc::now() + Duration::hours(10)).to_rfc3339() });
        assert_eq!(
            api.post("/v1/jobs", &admin, body).await.0,
            StatusCode::CREATED
        );
        let site_of_t = |plan: &Value| {
            plan["plan"]["assignments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["job"] == "t")
                .map(|a| a["site"].as_str().unwrap().to_string())
        };
        let plan_args = ["plan", "--db", db, "--slots", "24", "--time-limit", "2"];
        // The clean site's agent reports only one usable GPU: the 2-GPU job must go elsewhere.
        let (status, _) = api
            .post(
                "/v1/sites/clean/heartbeat",
                &agent,
                json!({ "inventory": { "H100": 1 } }),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        stdout(&windfall(&plan_args));
        let (_, plan) = api.get("/v1/plans/latest", Some(&admin)).await;
        assert_eq!(site_of_t(&plan).as_deref(), Some("dirty"), "{plan}");
        // All four back: the job moves to the clean site.
        api.post(
            "/v1/sites/clean/heartbeat",
            &agent,
            json!({ "inventory": { "H100": 4 } }),
        )
        .await;
        stdout(&windfall(&plan_args));
        let (_, plan) = api.get("/v1/plans/latest", Some(&admin)).await;
        assert_eq!(site_of_t(&plan).as_deref(), Some("clean"), "{plan}");
    }
}
