//! The batch user's side of the API: `windfall submit` and `windfall jobs list|show|cancel`.
//!
//! Owns HTTP calls to a `windfall serve` (reqwest with rustls) and their human or JSON output.
//! Must not touch the database: everything goes through the API and its authorization.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the server is and who is asking.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    /// Bearer token.
    pub token: String,
}

impl Endpoint {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }
}

fn client() -> Result<reqwest::Client> {
    // rustls with the ring provider; installing twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .context("building the HTTP client")
}

async fn send(request: reqwest::RequestBuilder, what: &str) -> Result<Value> {
    let response = request
        .send()
        .await
        .with_context(|| format!("{what}: cannot reach the server"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("{what}: reading the response"))?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() {
        let message = body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string());
        bail!("{what}: the server answered {status}: {message}");
    }
    Ok(body)
}

/// `POST /v1/jobs`.
pub async fn submit(endpoint: &Endpoint, submission: &Value) -> Result<Value> {
    let request = client()?
        .post(endpoint.url("/v1/jobs"))
        .bearer_auth(&endpoint.token)
        .json(submission);
    send(request, "submitting the job").await
}

/// `GET /v1/jobs`.
pub async fn list(endpoint: &Endpoint, state: Option<&str>) -> Result<Value> {
    let mut request = client()?
        .get(endpoint.url("/v1/jobs"))
        .bearer_auth(&endpoint.token);
    if let Some(state) = state {
        request = request.query(&[("state", state)]);
    }
    send(request, "listing jobs").await
}

/// `GET /v1/jobs/{id}`.
pub async fn show(endpoint: &Endpoint, id: &str) -> Result<Value> {
    let request = client()?
        .get(endpoint.url(&format!("/v1/jobs/{id}")))
        .bearer_auth(&endpoint.token);
    send(request, &format!("reading job {id}")).await
}

/// `POST /v1/jobs/{id}/cancel`.
pub async fn cancel(endpoint: &Endpoint, id: &str) -> Result<Value> {
    let request = client()?
        .post(endpoint.url(&format!("/v1/jobs/{id}/cancel")))
        .bearer_auth(&endpoint.token);
    send(request, &format!("cancelling job {id}")).await
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".to_string(),
        Some(other) => other.to_string(),
    }
}

/// A table of jobs for the terminal.
pub fn jobs_table(list: &Value) -> String {
    let jobs = list
        .get("jobs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = format!(
        "{:<24} {:<11} {:>4} {:>8} {:<20} {:<12} {}\n",
        "ID", "STATE", "GPUS", "WORK H", "DEADLINE (UTC)", "HOME", "OWNER"
    );
    for j in &jobs {
        let deadline = text(j, "deadline_utc");
        out.push_str(&format!(
            "{:<24} {:<11} {:>4} {:>8.2} {:<20} {:<12} {}\n",
            text(j, "id"),
            text(j, "state"),
            text(j, "gpus"),
            j.get("work_hours").and_then(Value::as_f64).unwrap_or(0.0),
            deadline.get(..16).unwrap_or(&deadline).replace('T', " "),
            text(j, "home_site"),
            text(j, "owner"),
        ));
    }
    out.push_str(&format!("{} job(s)\n", jobs.len()));
    out
}

/// One job for the terminal.
pub fn job_details(job: &Value) -> String {
    let mut out = String::new();
    for key in [
        "id",
        "state",
        "state_reason",
        "gpus",
        "work_hours",
        "release_utc",
        "deadline_utc",
        "home_site",
        "current_site",
        "owner",
        "command",
    ] {
        out.push_str(&format!("{key:<14} {}\n", text(job, key)));
    }
    if let Some(e) = job
        .get("plan")
        .and_then(|p| p.get("emissions"))
        .filter(|e| e.is_object())
    {
        let kg = |k: &str| e.get(k).and_then(Value::as_f64).unwrap_or(0.0) / 1000.0;
        out.push_str(&format!(
            "emissions      {:.3} kg CO2e expected ({:.3} kg so far) vs {:.3} kg run-now\n",
            kg("expected_g"),
            kg("so_far_g"),
            kg("run_now_baseline_g")
        ));
    }
    if let Some(runs) = job
        .get("plan")
        .and_then(|p| p.get("runs"))
        .and_then(Value::as_array)
    {
        let plan_id = job["plan"]["plan_id"].clone();
        out.push_str(&format!(
            "planned runs   {} in plan #{plan_id}\n",
            runs.len()
        ));
        for r in runs {
            out.push_str(&format!(
                "  {} -> {}  {:<12} {} W\n",
                text(r, "start_utc"),
                text(r, "end_utc"),
                text(r, "site"),
                text(r, "power_w"),
            ));
        }
    }
    out
}
