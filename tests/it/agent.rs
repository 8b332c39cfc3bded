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

use super::service::{Api, Server, token};

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
            .rsplit("http://")
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

[gpus]
backend = "simulated"
[[gpus.simulated]]
model = "H100"
count = 1
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
    let mut csv = String::from(
        "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh\n",
    );
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
    let response = api
        .http
        .post(format!("{}/v1/forecasts", api.base))
        .bearer_auth(admin)
        .header("X-Windfall-Source", "test")
        .body(csv)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
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

/// Runs the whole move; returns the job's events.
async fn run_move(faults: Option<Faults>) -> Value {
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
    let config_a = agent_config(dir.path(), "a", &server.url, &token_a, None, &clock);
    let config_b = agent_config(
        dir.path(),
        "b",
        &server.url,
        &token_b,
        advertise.as_deref(),
        &clock,
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
    run_move(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_connection_resumes_and_a_corrupted_chunk_is_sent_again() {
    // The archive is about 2 MiB in 256 KiB chunks: cut the link inside the third chunk, then
    // flip one byte inside the sixth.
    let events = run_move(Some(Faults {
        cut_at: Some(600_000),
        flip_at: Some(1_400_000),
        ..Faults::default()
    }))
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
