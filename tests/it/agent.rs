//! Site agents end to end on loopback: `windfall serve`, two `windfall agent` processes with the
//! local executor and simulated GPUs, and the checkpointing workload `windfall-workload`. The
//! plan runs a job at site `a`, then moves it to site `b`: it checkpoints at `a`, the checkpoint
//! streams to `b` (through a proxy that can cut the connection or corrupt a byte), and it resumes
//! at `b`. The result must equal an uninterrupted run's.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration as StdDuration, Instant};

use chrono::{DateTime, Duration, DurationRound, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::service::{Api, FORECAST_CSV_HEADER, Server, token};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_windfall-workload");
const STEPS: u64 = 120;
const STEP_MS: u64 = 100;
const STATE_KIB: u64 = 2048;

fn workload_args(dir: &Path) -> String {
    format!(
        "{WORKLOAD} --steps {STEPS} --step-ms {STEP_MS} --state-kib {STATE_KIB} --out {} --log {}",
        dir.join("result.txt").display(),
        dir.join("runs.log").display()
    )
}

/// The result of an uninterrupted run.
fn reference_result(dir: &Path) -> String {
    let out = dir.join("reference.txt");
    let status = Command::new(WORKLOAD)
        .args([
            "--steps",
            &STEPS.to_string(),
            "--step-ms",
            "0",
            "--state-kib",
        ])
        .arg(STATE_KIB.to_string())
        .arg("--out")
        .arg(&out)
        .env_remove("WINDFALL_RESUME_FROM")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read_to_string(out).unwrap()
}

/// A `windfall agent` process, stopped with SIGTERM on drop.
struct AgentProcess {
    child: Child,
    addr: SocketAddr,
}

impl AgentProcess {
    fn start(config: &Path) -> AgentProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(["-v", "agent", "--config"])
            .arg(config)
            .env_remove("WINDFALL_AGENT_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the agent names its address: {line}"));
        AgentProcess { child, addr }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

struct Clock {
    plan_start: DateTime<Utc>,
    wall_start: DateTime<Utc>,
    speedup: f64,
}

fn agent_config(
    dir: &Path,
    site: &str,
    planner: &str,
    token: &str,
    advertise: Option<&str>,
    clock: &Clock,
) -> PathBuf {
    agent_config_with(dir, site, planner, token, advertise, clock, 1, "")
}

#[allow(clippy::too_many_arguments)]
fn agent_config_with(
    dir: &Path,
    site: &str,
    planner: &str,
    token: &str,
    advertise: Option<&str>,
    clock: &Clock,
    gpus: u32,
    extra: &str,
) -> PathBuf {
    let work = dir.join(format!("agent-{site}"));
    let advertise = advertise
        .map(|u| format!("advertise_url = \"{u}\"\n"))
        .unwrap_or_default();
    let text = format!(
        r#"site = "{site}"
planner_url = "{planner}"
token = "{token}"
listen = "127.0.0.1:0"
{advertise}work_dir = "{work}"
poll_seconds = 0.25
heartbeat_seconds = 1
checkpoint_timeout_seconds = 20
chunk_bytes = 262144
{extra}
[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "H100"
count = {gpus}
min_limit_w = 200
max_limit_w = 700

[clock]
plan_start_utc = "{plan_start}"
wall_start_utc = "{wall_start}"
speedup = {speedup}
"#,
        work = work.display(),
        plan_start = clock.plan_start.to_rfc3339(),
        wall_start = clock.wall_start.to_rfc3339(),
        speedup = clock.speedup,
    );
    let path = dir.join(format!("{site}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Sites `a` and `b` with one H100 each; `a` is clean in the first hour, `b` in the second.
/// Job `j` (two hours of work, due in three) is planned at `a` then moved to `b`.
async fn plan_a_move(api: &Api, admin: &str, hour: DateTime<Utc>, command: &str) -> Value {
    let model = json!({ "power_levels_w": [700, 400], "throughput": [1.0, 0.8], "idle_w": 50 });
    assert_eq!(
        api.put("/v1/gpu-models/H100", admin, model).await.0,
        StatusCode::OK
    );
    for id in ["a", "b"] {
        let site = json!({ "zone": "Z", "gpus": { "H100": 1 }, "pue": 1.1, "wan_gbps": 10 });
        let (status, body) = api.put(&format!("/v1/sites/{id}"), admin, site).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let mut csv = String::from(FORECAST_CSV_HEADER);
    for h in -1..26 {
        let t = hour + Duration::hours(h);
        for (site, clean_hour) in [("a", 0), ("b", 1)] {
            let carbon = if h == clean_hour { 10.0 } else { 900.0 };
            csv.push_str(&format!(
                "{},{},{site},0,{carbon},average,50\n",
                (hour - Duration::hours(2)).to_rfc3339(),
                t.to_rfc3339()
            ));
        }
    }
    api.upload_forecasts(admin, csv).await;
    let job = json!({ "id": "j", "gpus": 1, "work_hours": 2, "migratable": true,
        "home_site": "a", "checkpoint_gb": 0.002, "command": command,
        "release_utc": hour.to_rfc3339(),
        "deadline_utc": (hour + Duration::hours(3)).to_rfc3339() });
    let (status, body) = api.post("/v1/jobs", admin, job).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = api.post("/v1/plans", admin, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, plan) = api.get("/v1/plans/latest", Some(admin)).await;
    let migrations = plan["plan"]["migrations"].as_array().unwrap();
    assert_eq!(migrations.len(), 1, "{plan}");
    assert_eq!(
        (
            &migrations[0]["from"],
            &migrations[0]["to"],
            &migrations[0]["slot"]
        ),
        (&json!("a"), &json!("b"), &json!(1)),
        "{plan}"
    );
    plan
}

/// Faults a proxy injects into the client-to-server byte stream, counted over all connections.
#[derive(Default)]
struct Faults {
    cut_at: Option<u64>,
    flip_at: Option<u64>,
    forwarded: AtomicU64,
    cut_done: AtomicBool,
    flip_done: AtomicBool,
}

/// Forwards `listener`'s connections to the address set in `target`, injecting `faults`.
async fn proxy(
    listener: tokio::net::TcpListener,
    target: Arc<OnceLock<SocketAddr>>,
    faults: Arc<Faults>,
) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        let target = target.clone();
        let faults = faults.clone();
        tokio::spawn(async move {
            let addr = loop {
                if let Some(a) = target.get() {
                    break *a;
                }
                tokio::time::sleep(StdDuration::from_millis(20)).await;
            };
            let Ok(server) = tokio::net::TcpStream::connect(addr).await else {
                let _ = client.shutdown().await;
                return;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let back = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = client_read.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let start = faults.forwarded.fetch_add(n as u64, Ordering::SeqCst);
                let end = start + n as u64;
                if let Some(at) = faults.flip_at
                    && (start..end).contains(&at)
                    && !faults.flip_done.swap(true, Ordering::SeqCst)
                {
                    buf[(at - start) as usize] ^= 0x5a;
                }
                if let Some(at) = faults.cut_at
                    && (start..end).contains(&at)
                    && !faults.cut_done.swap(true, Ordering::SeqCst)
                {
                    let keep = (at - start) as usize;
                    let _ = server_write.write_all(&buf[..keep]).await;
                    back.abort();
                    return; // both halves drop: the connection is cut mid-request
                }
                if server_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = server_write.shutdown().await;
            let _ = back.await;
        });
    }
}

fn events_of(events: &Value) -> Vec<(String, String)> {
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["site"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A test CA and a certificate it signed for 127.0.0.1, from the openssl command:
/// (CA certificate, agent certificate, agent key).
fn test_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .expect("openssl is installed");
        assert!(status.success(), "openssl {args:?}");
    };
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=windfall test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=windfall test agent",
        "-keyout",
        "agent.key",
        "-out",
        "agent.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "agent.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
        "-out",
        "agent.crt",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("agent.crt"),
        dir.join("agent.key"),
    )
}

/// Runs the whole move; returns the job's events. With `tls`, site b serves HTTPS with a
/// certificate from a test CA that site a is configured to trust.
async fn run_move(faults: Option<Faults>, tls: bool) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("planner.db").display());
    let admin = token(&db, "admin", "root", None);
    let server = Server::start(&db);
    let api = Api::new(&server.url);
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    let plan = plan_a_move(&api, &admin, hour, &workload_args(dir.path())).await;
    let planned_w = plan["plan"]["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["site"] == "a")
        .unwrap()["power_w"]
        .as_f64()
        .unwrap();
    let token_a = token(&db, "agent", "agent-a", Some("a"));
    let token_b = token(&db, "agent", "agent-b", Some("b"));

    // One plan hour is 10 s of wall time; slot 0 starts 1.5 s from now.
    let clock = Clock {
        plan_start: hour,
        wall_start: Utc::now() + Duration::milliseconds(1500),
        speedup: 360.0,
    };
    let target = Arc::new(OnceLock::new());
    let advertise = match faults {
        Some(faults) => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(proxy(listener, target.clone(), Arc::new(faults)));
            Some(url)
        }
        None => None,
    };
    let (tls_a, tls_b) = if tls {
        let (ca, cert, key) = test_certificates(dir.path());
        (
            format!("[tls]\nca_pem = \"{}\"\n", ca.display()),
            format!(
                "[tls]\ncert_pem = \"{}\"\nkey_pem = \"{}\"\n",
                cert.display(),
                key.display()
            ),
        )
    } else {
        (String::new(), String::new())
    };
    let config_a = agent_config_with(
        dir.path(),
        "a",
        &server.url,
        &token_a,
        None,
        &clock,
        1,
        &tls_a,
    );
    let config_b = agent_config_with(
        dir.path(),
        "b",
        &server.url,
        &token_b,
        advertise.as_deref(),
        &clock,
        1,
        &tls_b,
    );
    let _agent_a = AgentProcess::start(&config_a);
    let agent_b = AgentProcess::start(&config_b);
    let _ = target.set(agent_b.addr);

    let started = Instant::now();
    loop {
        let (_, job) = api.get("/v1/jobs/j", Some(&admin)).await;
        if job["state"] == "done" {
            break;
        }
        assert!(
            job["state"] != "failed" && started.elapsed() < StdDuration::from_secs(90),
            "job j did not finish: {job}"
        );
        tokio::time::sleep(StdDuration::from_millis(250)).await;
    }
    let (_, events) = api.get("/v1/jobs/j/events", Some(&admin)).await;

    // Same result as an uninterrupted run, and no step computed twice or skipped.
    let result = std::fs::read_to_string(dir.path().join("result.txt")).unwrap();
    assert_eq!(result, reference_result(dir.path()));
    let log = std::fs::read_to_string(dir.path().join("runs.log")).unwrap();
    let runs: Vec<(u64, u64, String)> = log
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_string(),
            )
        })
        .collect();
    assert_eq!(runs.len(), 2, "one run at a, one at b: {log}");
    assert_eq!(runs[0].0, 0);
    assert_eq!(runs[0].2, "checkpoint");
    assert!(runs[0].1 > 0 && runs[0].1 < STEPS, "{log}");
    assert_eq!(runs[1], (runs[0].1, STEPS, "done".to_string()), "{log}");

    // The source dropped its copy only after the destination confirmed.
    let kinds = events_of(&events);
    let position = |site: &str, kind: &str| {
        kinds
            .iter()
            .position(|(s, k)| s == site && k == kind)
            .unwrap_or_else(|| panic!("no {kind} from {site}: {kinds:?}"))
    };
    assert!(position("a", "job_started") < position("a", "checkpoint_written"));
    assert!(position("a", "checkpoint_written") < position("a", "migration_sent"));
    assert!(position("a", "migration_sent") < position("b", "migration_received"));
    assert!(position("b", "migration_received") < position("a", "migration_done"));
    assert!(position("b", "migration_received") < position("b", "job_started"));
    assert!(position("b", "job_started") < position("b", "job_finished"));
    assert!(
        kinds.iter().any(|(_, k)| k == "progress"),
        "the workload's progress is reported: {kinds:?}"
    );
    let started_at_b = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["site"] == "b" && e["kind"] == "job_started")
        .unwrap();
    assert_eq!(started_at_b["detail"]["resumed_from_checkpoint"], true);
    let caps = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["site"] == "a" && e["kind"] == "power_caps")
        .unwrap();
    // The plan's cap, within the simulated device's 200-700 W, set and read back.
    assert_eq!(
        caps["detail"]["caps"][0]["applied_w"].as_f64(),
        Some(planned_w),
        "{caps}"
    );
    assert!(!dir.path().join("agent-a/jobs/j").exists());
    assert!(!dir.path().join("agent-a/outgoing/j.tar").exists());
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_moves_between_agents_and_ends_as_an_uninterrupted_run() {
    run_move(None, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_moves_over_tls() {
    let events = run_move(None, true).await;
    assert!(events.to_string().contains("migration_done"), "{events}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_connection_resumes_and_a_corrupted_chunk_is_sent_again() {
    // The archive is about 2 MiB in 256 KiB chunks: cut the link inside the third chunk, then
    // flip one byte inside the sixth.
    let events = run_move(
        Some(Faults {
            cut_at: Some(600_000),
            flip_at: Some(1_400_000),
            ..Faults::default()
        }),
        false,
    )
    .await;
    let done = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "migration_done")
        .unwrap();
    let detail = &done["detail"];
    assert!(
        detail["resumed_after_errors"].as_u64().unwrap() >= 1,
        "{done}"
    );
    assert!(detail["chunks_resent"].as_u64().unwrap() >= 1, "{done}");
}

/// One site `a` with `gpus` H100s, clean all day, and jobs `(id, release hour, deadline hour,
/// work hours, workload steps)` running the workload; returns the plan.
async fn one_site(
    api: &Api,
    admin: &str,
    hour: DateTime<Utc>,
    gpus: u32,
    jobs: &[(&str, i64, i64, f64, u64)],
    dir: &Path,
) -> Value {
    let model = json!({ "power_levels_w": [700, 400], "throughput": [1.0, 0.8], "idle_w": 50 });
    assert_eq!(
        api.put("/v1/gpu-models/H100", admin, model).await.0,
        StatusCode::OK
    );
    let site = json!({ "zone": "Z", "gpus": { "H100": gpus }, "pue": 1.1, "wan_gbps": 10 });
    assert_eq!(api.put("/v1/sites/a", admin, site).await.0, StatusCode::OK);
    let mut csv = String::from(FORECAST_CSV_HEADER);
    for h in -1..26 {
        csv.push_str(&format!(
            "{},{},a,0,100,average,50\n",
            (hour - Duration::hours(2)).to_rfc3339(),
            (hour + Duration::hours(h)).to_rfc3339()
        ));
    }
    api.upload_forecasts(admin, csv).await;
    for (id, release_h, deadline_h, work_h, steps) in jobs {
        let job_dir = dir.join(id);
        std::fs::create_dir_all(&job_dir).unwrap();
        let command = format!(
            "{WORKLOAD} --steps {steps} --step-ms 100 --state-kib 16 --out {} --log {}",
            job_dir.join("result.txt").display(),
            job_dir.join("runs.log").display()
        );
        let job = json!({ "id": id, "gpus": 1, "work_hours": work_h, "home_site": "a",
            "command": command, "release_utc": (hour + Duration::hours(*release_h)).to_rfc3339(),
            "deadline_utc": (hour + Duration::hours(*deadline_h)).to_rfc3339() });
        let (status, body) = api.post("/v1/jobs", admin, job).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = api.post("/v1/plans", admin, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    api.get("/v1/plans/latest", Some(admin)).await.1
}

async fn wait_for_state(api: &Api, admin: &str, job: &str, state: &str, limit_s: u64) {
    let started = Instant::now();
    loop {
        let (_, body) = api.get(&format!("/v1/jobs/{job}"), Some(admin)).await;
        if body["state"] == state {
            return;
        }
        assert!(
            started.elapsed() < StdDuration::from_secs(limit_s),
            "job {job} never reached {state}: {body}"
        );
        tokio::time::sleep(StdDuration::from_millis(200)).await;
    }
}

fn kill_job(work: &Path, job: &str) {
    if let Ok(pid) = std::fs::read_to_string(work.join("jobs").join(job).join("pid")) {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -KILL -{}", pid.trim())])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_lease_the_agent_starts_nothing_keeps_running_jobs_and_loses_no_event_then_resumes()
 {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("planner.db").display());
    let admin = token(&db, "admin", "root", None);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let server_args = ["--lease-seconds", "2", "--listen", listen.as_str()];
    let server = Server::start_with(&db, &server_args);
    let api = Api::new(&server.url);
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    // `first` (long) and `quick` fill both GPUs in hour 0; `second` is released at hour 1.
    let plan = one_site(
        &api,
        &admin,
        hour,
        2,
        &[
            ("first", 0, 1, 1.0, 400),
            ("quick", 0, 1, 1.0, 50),
            ("second", 1, 2, 1.0, 20),
        ],
        dir.path(),
    )
    .await;
    let slots: Vec<(String, u64)> = plan["plan"]["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["job"].as_str().unwrap().to_string(),
                a["slot"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(slots.contains(&("second".to_string(), 1)), "{plan}");
    let token_a = token(&db, "agent", "agent-a", Some("a"));
    let clock = Clock {
        plan_start: hour,
        wall_start: Utc::now() + Duration::milliseconds(1500),
        speedup: 360.0,
    };
    let config = agent_config_with(dir.path(), "a", &server.url, &token_a, None, &clock, 2, "");
    let _agent = AgentProcess::start(&config);
    wait_for_state(&api, &admin, "first", "running", 30).await;
    wait_for_state(&api, &admin, "quick", "running", 30).await;
    // The planner goes away; the 2 s lease runs out long before hour 1 starts (10 s of wall).
    drop(server);
    let hour_one = clock.wall_start + Duration::seconds(10);
    let wait = (hour_one - Utc::now()).to_std().unwrap_or_default() + StdDuration::from_secs(3);
    tokio::time::sleep(wait).await;
    let work = dir.path().join("agent-a");
    assert!(
        !work.join("jobs/second").exists(),
        "a job was started without a valid lease"
    );
    assert!(
        !dir.path().join("first/runs.log").exists(),
        "the running job was checkpointed or ended without a valid lease"
    );
    assert!(!work.join("jobs/first/exit_code").exists());
    // `quick` finished while the planner was away; its event waited in the outbox.
    let quick = std::fs::read_to_string(dir.path().join("quick/runs.log")).unwrap();
    assert_eq!(quick.trim(), "0 50 done");
    let server = Server::start_with(&db, &server_args);
    let api = Api::new(&server.url);
    wait_for_state(&api, &admin, "quick", "done", 30).await;
    // Back to normal work within hour 1: `second` starts, and `first`, past its hour, is
    // checkpointed and paused.
    wait_for_state(&api, &admin, "second", "done", 30).await;
    wait_for_state(&api, &admin, "first", "paused", 30).await;
    let first = std::fs::read_to_string(dir.path().join("first/runs.log")).unwrap();
    assert!(first.trim().ends_with("checkpoint"), "{first}");
    drop(server);
    kill_job(&work, "first");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_agent_adopts_its_running_job_and_the_budget_clamps_caps() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("planner.db").display());
    let admin = token(&db, "admin", "root", None);
    let server = Server::start(&db);
    let api = Api::new(&server.url);
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    one_site(
        &api,
        &admin,
        hour,
        2,
        &[("x", 0, 1, 1.0, 40), ("y", 0, 1, 1.0, 40)],
        dir.path(),
    )
    .await;
    let token_a = token(&db, "agent", "agent-a", Some("a"));
    let clock = Clock {
        plan_start: hour,
        wall_start: Utc::now() + Duration::milliseconds(500),
        speedup: 360.0,
    };
    // Two 700 W jobs against a 1,000 W budget: the second gets what is left.
    let config = agent_config_with(
        dir.path(),
        "a",
        &server.url,
        &token_a,
        None,
        &clock,
        2,
        "gpu_power_budget_w = 1000\n",
    );
    let agent = AgentProcess::start(&config);
    wait_for_state(&api, &admin, "x", "running", 30).await;
    wait_for_state(&api, &admin, "y", "running", 30).await;
    // Killed outright, then started again while the jobs run.
    let _ = Command::new("sh")
        .args(["-c", &format!("kill -KILL {}", agent.child.id())])
        .status();
    drop(agent);
    let _agent = AgentProcess::start(&config);
    wait_for_state(&api, &admin, "x", "done", 60).await;
    wait_for_state(&api, &admin, "y", "done", 60).await;
    for job in ["x", "y"] {
        // One run from step 0 to the end: adopted, not started twice.
        let log = std::fs::read_to_string(dir.path().join(job).join("runs.log")).unwrap();
        assert_eq!(log.trim(), "0 40 done", "job {job}: {log}");
        let (_, events) = api
            .get(&format!("/v1/jobs/{job}/events"), Some(&admin))
            .await;
        let kinds = events_of(&events);
        let starts = kinds.iter().filter(|(_, k)| k == "job_started").count();
        assert_eq!(starts, 1, "{kinds:?}");
    }
    let mut applied = Vec::new();
    for job in ["x", "y"] {
        let (_, events) = api
            .get(&format!("/v1/jobs/{job}/events"), Some(&admin))
            .await;
        let caps = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "power_caps")
            .unwrap()
            .clone();
        applied.push(caps["detail"]["caps"][0]["applied_w"].as_u64().unwrap());
    }
    applied.sort_unstable();
    assert_eq!(applied.iter().sum::<u64>(), 1000, "{applied:?}");
    assert!(applied[0] >= 200, "{applied:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_refuse_transfers_without_a_valid_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("planner.db").display());
    let admin = token(&db, "admin", "root", None);
    let server = Server::start(&db);
    let api = Api::new(&server.url);
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    plan_a_move(&api, &admin, hour, "true").await;
    let token_a = token(&db, "agent", "agent-a", Some("a"));
    let token_b = token(&db, "agent", "agent-b", Some("b"));
    // Far in the plan's past: the agent serves transfers but starts nothing.
    let clock = Clock {
        plan_start: hour - Duration::days(1),
        wall_start: Utc::now(),
        speedup: 1.0,
    };
    let config_b = agent_config(dir.path(), "b", &server.url, &token_b, None, &clock);
    let agent_b = AgentProcess::start(&config_b);
    let b = format!("http://{}", agent_b.addr);
    let http = reqwest::Client::new();
    let put = |token: Option<String>, job: &str| {
        let mut request = http
            .put(format!("{b}/v1/transfers/{job}/chunks?offset=0"))
            .header("x-windfall-chunk-sha256", "00")
            .body("x");
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        request.send()
    };
    assert_eq!(
        put(None, "j").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        put(Some("wf_0000_forged".into()), "j")
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    // Only the source site's agent gets a grant, once the destination reported its address.
    let planner = Api::new(&server.url);
    let mut grant = Value::Null;
    for _ in 0..50 {
        let (status, body) = planner
            .post("/v1/sites/a/migrations/j/token", &token_a, json!({}))
            .await;
        if status == StatusCode::OK {
            grant = body;
            break;
        }
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    }
    assert_eq!(grant["to"], "b", "{grant}");
    assert_eq!(
        planner
            .post("/v1/sites/b/migrations/j/token", &token_a, json!({}))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let token = grant["token"].as_str().unwrap().to_string();
    // Valid, but for job `j` only; a good token with a bad chunk hash is refused as data.
    let status = put(Some(token.clone()), "other").await.unwrap().status();
    assert_eq!(status, StatusCode::FORBIDDEN);
    let status = put(Some(token.clone()), "j").await.unwrap().status();
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let status = http
        .get(format!("{b}/v1/transfers/j"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::OK);
    // An expired token for this very migration is refused too.
    let store = windfall::db::Store::connect(&db).await.unwrap();
    let expired = windfall::auth::new_token().unwrap();
    store
        .insert_transfer_token(&windfall::db::TransferToken {
            hash: expired.hash.clone(),
            job: "j".into(),
            from_site: "a".into(),
            to_site: "b".into(),
            plan_id: 1,
            created_utc: Utc::now() - Duration::hours(8),
            expires_utc: Utc::now() - Duration::hours(2),
        })
        .await
        .unwrap();
    store.close().await;
    let response = put(Some(expired.token), "j").await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.text().await.unwrap().contains("expired"));
    // Nothing refused was written.
    let incoming = dir.path().join("agent-b/incoming");
    let written: Vec<_> = std::fs::read_dir(&incoming)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "{written:?}");
}

/// The Slurm executor against a real single-node Slurm (`scripts/slurm-local start`, which
/// `.ci/run` runs and which sets `WINDFALL_TEST_SLURM=1`): submit, checkpoint with
/// `scancel --batch --signal`, requeue from the checkpoint with the same result as an
/// uninterrupted run, and cancel.
#[test]
fn the_slurm_executor_checkpoints_and_resumes_a_job() {
    use windfall::agent::executor::{Executor, JobSpec, JobStatus, SlurmExecutor};
    if std::env::var_os("WINDFALL_TEST_SLURM").is_none() {
        eprintln!("skipped: set WINDFALL_TEST_SLURM=1 with Slurm running (scripts/slurm-local)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join("jobs/s");
    std::fs::create_dir_all(&job_dir).unwrap();
    let command = format!(
        "{WORKLOAD} --steps 60 --step-ms 100 --state-kib 64 --out {} --log {}",
        dir.path().join("result.txt").display(),
        dir.path().join("runs.log").display()
    );
    let mut slurm = SlurmExecutor::new("USR1", None);
    let mut spec = JobSpec {
        job: "s".into(),
        command,
        gpus: vec![],
        dir: job_dir.clone(),
        resume_from: None,
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < StdDuration::from_secs(60), "{what}");
            std::thread::sleep(StdDuration::from_millis(100));
        }
    };
    slurm.start(&spec).unwrap();
    let output = job_dir.join("output.log");
    wait_for("the job never started", &|| {
        std::fs::read_to_string(&output).is_ok_and(|t| t.contains("step 0 of 60"))
    });
    std::thread::sleep(StdDuration::from_millis(1500));
    slurm.request_checkpoint("s", &job_dir).unwrap();
    let marker = job_dir.join("checkpoint/.windfall-checkpoint-complete");
    wait_for("no checkpoint", &|| marker.exists());
    wait_for("the batch script did not end", &|| {
        job_dir.join("exit_code").exists()
    });
    assert_eq!(slurm.status("s", &job_dir).unwrap(), JobStatus::Exited(0));
    std::fs::rename(job_dir.join("checkpoint"), job_dir.join("resume")).unwrap();
    spec.resume_from = Some(job_dir.join("resume"));
    let first_id = std::fs::read_to_string(job_dir.join("slurm_job_id")).unwrap();
    slurm.start(&spec).unwrap();
    // Requeued, not resubmitted: the same Slurm job runs again.
    assert_eq!(
        std::fs::read_to_string(job_dir.join("slurm_job_id")).unwrap(),
        first_id
    );
    let result = dir.path().join("result.txt");
    wait_for("the resumed job never finished", &|| result.exists());
    let reference = Command::new(WORKLOAD)
        .args([
            "--steps",
            "60",
            "--step-ms",
            "0",
            "--state-kib",
            "64",
            "--out",
        ])
        .arg(dir.path().join("reference.txt"))
        .env_remove("WINDFALL_RESUME_FROM")
        .status()
        .unwrap();
    assert!(reference.success());
    assert_eq!(
        std::fs::read_to_string(result).unwrap(),
        std::fs::read_to_string(dir.path().join("reference.txt")).unwrap()
    );
    let log = std::fs::read_to_string(dir.path().join("runs.log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    let at: u64 = lines[0].split(' ').nth(1).unwrap().parse().unwrap();
    assert!(at > 0 && at < 60, "{log}");
    assert_eq!(lines[1], format!("{at} 60 done"));

    // Cancel: a second job stops and leaves the queue.
    let other = dir.path().join("jobs/t");
    std::fs::create_dir_all(&other).unwrap();
    let spec = JobSpec {
        job: "t".into(),
        command: "sleep 300".into(),
        gpus: vec![],
        dir: other.clone(),
        resume_from: None,
    };
    slurm.start(&spec).unwrap();
    assert_eq!(slurm.status("t", &other).unwrap(), JobStatus::Running);
    slurm.stop("t", &other).unwrap();
    wait_for("the cancelled job stayed queued", &|| {
        slurm_status(&other) != JobStatus::Running
    });
}

fn slurm_status(dir: &Path) -> windfall::agent::executor::JobStatus {
    use windfall::agent::executor::{Executor, SlurmExecutor};
    SlurmExecutor::new("USR1", None).status("t", dir).unwrap()
}
