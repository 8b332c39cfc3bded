//! The agent's side of the planner API: heartbeat, directives, events and transfer tokens.
//!
//! Owns the request and response shapes the agent relies on. Must not hold agent state or retry
//! forever: a failed call returns its error and the agent decides (keep the lease, retry later).

use std::time::Duration as StdDuration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

/// One slot of work for this site.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Run {
    /// Job id.
    pub job: String,
    /// Slot start.
    pub start_utc: DateTime<Utc>,
    /// Slot end.
    pub end_utc: DateTime<Utc>,
    /// Power cap per GPU, W.
    pub power_cap_w: f64,
    /// GPU model to run on.
    pub gpu_model: String,
    /// GPUs the job needs.
    #[serde(default)]
    pub gpus: u32,
    /// Shell command (none for jobs submitted without one).
    #[serde(default)]
    pub command: Option<String>,
}

/// A checkpoint move into or out of this site.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MigrationDirective {
    /// Job id.
    pub job: String,
    /// Source site.
    pub from: String,
    /// Destination site.
    pub to: String,
    /// Start of the slot in which the job first runs at the destination.
    pub start_utc: DateTime<Utc>,
}

/// What the planner wants of this site.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Directives {
    /// The plan they come from.
    pub plan_id: Option<i64>,
    /// Until when the agent may act on them without reaching the planner.
    pub lease_until_utc: DateTime<Utc>,
    /// Runs, by slot.
    pub runs: Vec<Run>,
    /// Migrations touching this site.
    pub migrations: Vec<MigrationDirective>,
}

/// A transfer token with the destination's address.
#[derive(Clone, Debug, Deserialize)]
pub struct TransferGrant {
    /// The bearer token for the destination agent.
    pub token: String,
    /// Destination site.
    pub to: String,
    /// Destination agent's base URL.
    pub destination_url: String,
}

/// What a valid transfer token allows.
#[derive(Clone, Debug, Deserialize)]
pub struct TransferScope {
    /// Job id.
    pub job: String,
    /// Source site.
    pub from: String,
    /// Destination site.
    pub to: String,
    /// Expiry.
    pub expires_utc: DateTime<Utc>,
}

/// An authenticated client of `windfall serve` for one site.
#[derive(Clone, Debug)]
pub struct PlannerLink {
    http: reqwest::Client,
    base: String,
    token: String,
    site: String,
}

impl PlannerLink {
    /// A client for `base` acting for `site` with `token`.
    /// `ca_pem` adds trusted CA certificates (for a planner behind a private CA).
    pub fn new(
        base: &str,
        token: &str,
        site: &str,
        ca_pem: Option<&std::path::Path>,
    ) -> Result<PlannerLink> {
        let http = super::http_client(ca_pem, StdDuration::from_secs(30))?;
        Ok(PlannerLink {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            site: site.to_string(),
        })
    }

    /// The site this link acts for.
    pub fn site(&self) -> &str {
        &self.site
    }

    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Value> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("{what}: the planner at {} did not answer", self.base))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            bail!("{what}: the planner answered {status}: {message}");
        }
        serde_json::from_str(&text)
            .with_context(|| format!("{what}: the planner's answer is not JSON"))
    }

    /// Reports inventory, the agent's address and details.
    pub async fn heartbeat(&self, inventory: &Value, agent_url: &str, detail: Value) -> Result<()> {
        let url = format!("{}/v1/sites/{}/heartbeat", self.base, self.site);
        let body = json!({ "inventory": inventory, "agent_url": agent_url, "detail": detail });
        self.send(self.http.post(url).json(&body), "heartbeat")
            .await?;
        Ok(())
    }

    /// Directives for `[from, to)`.
    pub async fn directives(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Directives> {
        let url = format!("{}/v1/sites/{}/directives", self.base, self.site);
        let value = self
            .send(
                self.http
                    .get(url)
                    .query(&[("from", from.to_rfc3339()), ("to", to.to_rfc3339())]),
                "fetching directives",
            )
            .await?;
        serde_json::from_value(value).context("the planner's directives have an unexpected shape")
    }

    /// Records an event (job state changes follow from its kind).
    pub async fn event(&self, kind: &str, job: Option<&str>, detail: Value) -> Result<()> {
        let url = format!("{}/v1/sites/{}/events", self.base, self.site);
        let body = json!({ "kind": kind, "job": job, "detail": detail });
        self.send(
            self.http.post(url).json(&body),
            &format!("reporting {kind}"),
        )
        .await?;
        Ok(())
    }

    /// A token to move `job`'s checkpoint out of this site.
    pub async fn transfer_grant(&self, job: &str) -> Result<TransferGrant> {
        let url = format!(
            "{}/v1/sites/{}/migrations/{job}/token",
            self.base, self.site
        );
        let value = self
            .send(
                self.http.post(url),
                &format!("asking for a transfer token for job {job}"),
            )
            .await?;
        serde_json::from_value(value)
            .context("the planner's transfer grant has an unexpected shape")
    }

    /// What `token` allows, or an error when the planner refuses it.
    pub async fn verify_transfer(&self, token: &str) -> Result<TransferScope> {
        let url = format!("{}/v1/transfers/verify", self.base);
        let value = self
            .send(
                self.http.post(url).json(&json!({ "token": token })),
                "verifying a transfer token",
            )
            .await?;
        serde_json::from_value(value).context("the planner's token check has an unexpected shape")
    }
}
