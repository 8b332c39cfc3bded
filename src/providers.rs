//! HTTP forecast providers behind the [`ForecastSource`] trait (Electricity Maps, WattTime v3, the
//! Carbon Aware SDK WebAPI, the GB Carbon Intensity API), their per-site configuration with an
//! ordered fallback list, a file cache with a time to live, and the request policy: timeouts,
//! retries with exponential back-off on network errors and 5xx, HTTP 429 honoured through
//! `Retry-After`, no retry on 4xx.
//!
//! Owns the network side only; response bodies are parsed by `windfall_forecasts::providers`.
//! Must not log credentials and must not write to the store (`windfall ingest` does).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde::Deserialize;
use windfall_forecasts::CarbonSignal;
use windfall_forecasts::providers::{
    ProviderError, ProviderForecast, parse_carbon_aware_forecast, parse_electricity_maps_forecast,
    parse_gb_intensity, parse_watttime_forecast,
};

/// Why a provider gave no forecast.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The credentials were refused (401/403).
    #[error("{provider}: HTTP {status}: credentials refused: {message}")]
    Auth {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Rate limited for longer than the policy waits.
    #[error("{provider}: HTTP 429: rate limited; the provider asks to wait {retry_after_s} s")]
    RateLimited {
        /// Provider name.
        provider: String,
        /// What `Retry-After` asked for.
        retry_after_s: u64,
    },
    /// Another HTTP error (after retries for 5xx).
    #[error("{provider}: HTTP {status}: {message}")]
    Http {
        /// Provider name.
        provider: String,
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// No answer (connection refused, timeout) after retries.
    #[error("{provider}: no answer after {attempts} attempts: {message}")]
    Network {
        /// Provider name.
        provider: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        message: String,
    },
    /// The body was refused.
    #[error("{0}")]
    Body(#[from] ProviderError),
    /// The configuration is incomplete (a missing credential).
    #[error("{provider}: {message}")]
    Config {
        /// Provider name.
        provider: String,
        /// What is missing.
        message: String,
    },
}

/// Timeouts and retries for provider requests.
#[derive(Clone, Debug)]
pub struct HttpPolicy {
    /// Per-request timeout.
    pub timeout: Duration,
    /// Retries after the first attempt (network errors, 5xx, 429).
    pub retries: u32,
    /// First back-off; doubles per retry.
    pub backoff: Duration,
    /// Longest `Retry-After` the policy waits for; longer gives `RateLimited`.
    pub max_retry_after: Duration,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            timeout: Duration::from_secs(20),
            retries: 3,
            backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

type Fetch<'a> = Pin<Box<dyn Future<Output = Result<ProviderForecast, FetchError>> + Send + 'a>>;

/// A source of carbon-intensity forecasts for a location (zone, region or region id).
pub trait ForecastSource: Send + Sync {
    /// The configured name.
    fn name(&self) -> &str;
    /// The forecast from `from` on, as the provider gives it now.
    fn fetch<'a>(&'a self, location: &'a str, from: DateTime<Utc>) -> Fetch<'a>;
}

/// Sends `make()` under `policy`: retries network errors and 5xx with exponential back-off,
/// waits out 429 `Retry-After` up to the policy's limit, returns 4xx at once.
async fn send(
    provider: &str,
    policy: &HttpPolicy,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> Result<String, FetchError> {
    let mut backoff = policy.backoff;
    let mut last = String::new();
    let mut last_http: Option<(u16, String)> = None;
    for attempt in 0..=policy.retries {
        if attempt > 0 {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
        let response = match make().timeout(policy.timeout).send().await {
            Ok(r) => r,
            Err(e) => {
                last_http = None;
                last = if e.is_timeout() {
                    format!("timed out after {:.0} s", policy.timeout.as_secs_f64())
                } else {
                    e.to_string()
                };
                tracing::warn!("{provider}: attempt {}: {last}", attempt + 1);
                continue;
            }
        };
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let wait_s = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(policy.backoff.as_secs().max(1));
            if Duration::from_secs(wait_s) > policy.max_retry_after || attempt == policy.retries {
                return Err(FetchError::RateLimited {
                    provider: provider.to_string(),
                    retry_after_s: wait_s,
                });
            }
            tracing::warn!("{provider}: rate limited; waiting {wait_s} s as Retry-After asks");
            tokio::time::sleep(Duration::from_secs(wait_s)).await;
            backoff = policy.backoff;
            continue;
        }
        let text = match response.text().await {
            Ok(t) => t,
            Err(e) => {
                last = format!("reading the body: {e}");
                continue;
            }
        };
        if status.is_success() {
            return Ok(text);
        }
        let message = short(&text);
        if status.is_server_error() {
            last = format!("HTTP {status}: {message}");
            last_http = Some((status.as_u16(), message.clone()));
            tracing::warn!("{provider}: attempt {}: {last}", attempt + 1);
            continue;
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(FetchError::Auth {
                provider: provider.to_string(),
                status: status.as_u16(),
                message,
            });
        }
        return Err(FetchError::Http {
            provider: provider.to_string(),
            status: status.as_u16(),
            message,
        });
    }
    Err(match last_http {
        Some((status, message)) => FetchError::Http {
            provider: provider.to_string(),
            status,
            message: format!("{message} (after {} attempts)", policy.retries + 1),
        },
        None => FetchError::Network {
            provider: provider.to_string(),
            attempts: policy.retries + 1,
            message: last,
        },
    })
}

/// The provider's error message, shortened for a log line.
fn short(text: &str) -> String {
    let v: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let message = v
        .as_ref()
        .and_then(|v| {
            v["message"]
                .as_str()
                .or(v["msg"].as_str())
                .or(v["detail"].as_str())
                .or(v["error"]["message"].as_str())
                .or(v["error"].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| text.trim().to_string());
    message.chars().take(200).collect()
}

/// Electricity Maps v3: `GET {base}/carbon-intensity/forecast?zone=` with the token in a header
/// (`auth-token` by default; configurable, as the provider has moved it).
pub struct ElectricityMaps {
    name: String,
    base: String,
    header: String,
    token: String,
    policy: HttpPolicy,
    http: reqwest::Client,
}

impl ForecastSource for ElectricityMaps {
    fn name(&self) -> &str {
        &self.name
    }
    fn fetch<'a>(&'a self, location: &'a str, _from: DateTime<Utc>) -> Fetch<'a> {
        Box::pin(async move {
            let url = format!("{}/carbon-intensity/forecast", self.base);
            let text = send(&self.name, &self.policy, || {
                self.http
                    .get(&url)
                    .query(&[("zone", location)])
                    .header(self.header.as_str(), self.token.as_str())
            })
            .await?;
            Ok(parse_electricity_maps_forecast(&text)?)
        })
    }
}

/// WattTime v3: `GET {base}/login` (HTTP Basic) for a bearer token valid 30 minutes, then
/// `GET {base}/v3/forecast?region=&signal_type=`; a 401 logs in again once.
pub struct WattTime {
    name: String,
    base: String,
    username: String,
    password: String,
    signal_type: String,
    token: tokio::sync::Mutex<Option<String>>,
    policy: HttpPolicy,
    http: reqwest::Client,
}

impl WattTime {
    async fn login(&self) -> Result<String, FetchError> {
        let url = format!("{}/login", self.base);
        let text = send(&self.name, &self.policy, || {
            self.http
                .get(&url)
                .basic_auth(&self.username, Some(&self.password))
        })
        .await?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            FetchError::Body(ProviderError {
                provider: self.name.clone(),
                message: format!("malformed login body: {e}"),
            })
        })?;
        v["token"].as_str().map(str::to_string).ok_or_else(|| {
            FetchError::Body(ProviderError {
                provider: self.name.clone(),
                message: "the login answer holds no token".into(),
            })
        })
    }
}

impl ForecastSource for WattTime {
    fn name(&self) -> &str {
        &self.name
    }
    fn fetch<'a>(&'a self, location: &'a str, _from: DateTime<Utc>) -> Fetch<'a> {
        Box::pin(async move {
            let url = format!("{}/v3/forecast", self.base);
            for fresh_login in [false, true] {
                let token = {
                    let mut slot = self.token.lock().await;
                    if fresh_login || slot.is_none() {
                        *slot = Some(self.login().await?);
                    }
                    slot.clone().unwrap_or_default()
                };
                let result = send(&self.name, &self.policy, || {
                    self.http
                        .get(&url)
                        .bearer_auth(&token)
                        .query(&[("region", location), ("signal_type", &self.signal_type)])
                })
                .await;
                match result {
                    Ok(text) => return Ok(parse_watttime_forecast(&text)?),
                    Err(FetchError::Auth { status: 401, .. }) if !fresh_login => continue,
                    Err(e) => return Err(e),
                }
            }
            unreachable!("the loop returns on its second pass")
        })
    }
}

/// The Carbon Aware SDK WebAPI (self-hosted, no auth): `GET {base}/emissions/forecasts/current`.
pub struct CarbonAwareSdk {
    name: String,
    base: String,
    signal: CarbonSignal,
    policy: HttpPolicy,
    http: reqwest::Client,
}

impl ForecastSource for CarbonAwareSdk {
    fn name(&self) -> &str {
        &self.name
    }
    fn fetch<'a>(&'a self, location: &'a str, _from: DateTime<Utc>) -> Fetch<'a> {
        Box::pin(async move {
            let url = format!("{}/emissions/forecasts/current", self.base);
            let text = send(&self.name, &self.policy, || {
                self.http.get(&url).query(&[("location", location)])
            })
            .await?;
            Ok(parse_carbon_aware_forecast(&text, self.signal)?)
        })
    }
}

/// The GB Carbon Intensity API (no auth): location `national`, `regionid/N` or `postcode/XX`.
pub struct GbCarbonIntensity {
    name: String,
    base: String,
    policy: HttpPolicy,
    http: reqwest::Client,
}

impl ForecastSource for GbCarbonIntensity {
    fn name(&self) -> &str {
        &self.name
    }
    fn fetch<'a>(&'a self, location: &'a str, from: DateTime<Utc>) -> Fetch<'a> {
        Box::pin(async move {
            let at = from.format("%Y-%m-%dT%H:%MZ");
            let url = if location == "national" {
                format!("{}/intensity/{at}/fw48h", self.base)
            } else {
                format!("{}/regional/intensity/{at}/fw48h/{location}", self.base)
            };
            let text = send(&self.name, &self.policy, || {
                self.http
                    .get(&url)
                    .header(reqwest::header::ACCEPT, "application/json")
            })
            .await?;
            Ok(parse_gb_intensity(&text)?)
        })
    }
}

/// `providers.toml`: the providers and, per site, the ordered sources to try.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersConfig {
    /// Providers by name.
    #[serde(default, rename = "provider")]
    pub providers: Vec<ProviderConfig>,
    /// Sites and their sources.
    #[serde(default, rename = "site")]
    pub sites: Vec<SiteSources>,
    /// Request timeout, seconds.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Retries per request.
    #[serde(default)]
    pub retries: Option<u32>,
}

/// One provider.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Name sites refer to.
    pub name: String,
    /// `electricity-maps`, `watttime`, `carbon-aware-sdk` or `gb-carbon-intensity`.
    pub kind: String,
    /// Base URL (each kind has a default).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Environment variable holding the token (Electricity Maps).
    #[serde(default)]
    pub token_env: Option<String>,
    /// The token itself, when the file is kept private (the environment variable wins).
    #[serde(default)]
    pub token: Option<String>,
    /// The WattTime user name and password, when the file is kept private.
    #[serde(default)]
    pub username: Option<String>,
    /// See `username`.
    #[serde(default)]
    pub password: Option<String>,
    /// Header carrying the token (Electricity Maps; default `auth-token`).
    #[serde(default)]
    pub auth_header: Option<String>,
    /// Environment variables holding the WattTime user name and password.
    #[serde(default)]
    pub username_env: Option<String>,
    /// See `username_env`.
    #[serde(default)]
    pub password_env: Option<String>,
    /// WattTime signal (`co2_moer`, marginal, by default; `co2_aoer` average).
    #[serde(default)]
    pub signal_type: Option<String>,
    /// Carbon Aware SDK: whether its data source gives `average` or `marginal` values.
    #[serde(default)]
    pub carbon_signal: Option<String>,
}

/// A site's sources, in fallback order.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteSources {
    /// Site id.
    pub id: String,
    /// Provider and location pairs.
    pub sources: Vec<SourceRef>,
}

/// One provider at one location.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRef {
    /// Provider name.
    pub provider: String,
    /// Zone, region or region id as that provider names it.
    pub location: String,
}

/// A credential from its environment variable, else from the file.
fn secret(
    provider: &str,
    var: Option<&String>,
    inline: Option<&String>,
    what: &str,
) -> Result<String, FetchError> {
    if let Some(value) = var.and_then(|v| std::env::var(v).ok()) {
        return Ok(value);
    }
    if let Some(value) = inline {
        return Ok(value.clone());
    }
    Err(FetchError::Config {
        provider: provider.to_string(),
        message: match var {
            Some(v) => format!("the environment variable {v} ({what}) is not set"),
            None => format!("no `{what}_env` or `{what}` configured"),
        },
    })
}

impl ProvidersConfig {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<ProvidersConfig> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a configuration; `name` labels errors.
    pub fn parse(text: &str, name: &str) -> Result<ProvidersConfig> {
        let config: ProvidersConfig = toml::from_str(text)
            .with_context(|| format!("{name}: invalid providers configuration"))?;
        let path = std::path::Path::new(name);
        for site in &config.sites {
            for s in &site.sources {
                if !config.providers.iter().any(|p| p.name == s.provider) {
                    bail!(
                        "{}: site {}: unknown provider `{}`",
                        path.display(),
                        site.id,
                        s.provider
                    );
                }
            }
        }
        Ok(config)
    }

    /// The request policy.
    pub fn policy(&self) -> HttpPolicy {
        let mut p = HttpPolicy::default();
        if let Some(t) = self.timeout_seconds.filter(|t| *t > 0.0) {
            p.timeout = Duration::from_secs_f64(t);
        }
        if let Some(r) = self.retries {
            p.retries = r;
        }
        p
    }

    /// Builds provider `name`.
    pub fn source(
        &self,
        name: &str,
        http: &reqwest::Client,
        policy: &HttpPolicy,
    ) -> Result<Arc<dyn ForecastSource>, FetchError> {
        let c = self
            .providers
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| FetchError::Config {
                provider: name.to_string(),
                message: "no such provider in the configuration".into(),
            })?;
        let base = |default: &str| {
            c.base_url
                .clone()
                .unwrap_or_else(|| default.to_string())
                .trim_end_matches('/')
                .to_string()
        };
        let (http, policy) = (http.clone(), policy.clone());
        Ok(match c.kind.as_str() {
            "electricity-maps" => Arc::new(ElectricityMaps {
                name: c.name.clone(),
                base: base("https://api.electricitymap.org/v3"),
                header: c.auth_header.clone().unwrap_or_else(|| "auth-token".into()),
                token: secret(&c.name, c.token_env.as_ref(), c.token.as_ref(), "token")?,
                policy,
                http,
            }),
            "watttime" => Arc::new(WattTime {
                name: c.name.clone(),
                base: base("https://api.watttime.org"),
                username: secret(
                    &c.name,
                    c.username_env.as_ref(),
                    c.username.as_ref(),
                    "username",
                )?,
                password: secret(
                    &c.name,
                    c.password_env.as_ref(),
                    c.password.as_ref(),
                    "password",
                )?,
                signal_type: c.signal_type.clone().unwrap_or_else(|| "co2_moer".into()),
                token: tokio::sync::Mutex::new(None),
                policy,
                http,
            }),
            "carbon-aware-sdk" => Arc::new(CarbonAwareSdk {
                name: c.name.clone(),
                base: base("http://127.0.0.1:8080"),
                signal: match c.carbon_signal.as_deref() {
                    None | Some("marginal") => CarbonSignal::Marginal,
                    Some("average") => CarbonSignal::Average,
                    Some(other) => {
                        return Err(FetchError::Config {
                            provider: c.name.clone(),
                            message: format!("carbon_signal `{other}`: use average or marginal"),
                        });
                    }
                },
                policy,
                http,
            }),
            "gb-carbon-intensity" => Arc::new(GbCarbonIntensity {
                name: c.name.clone(),
                base: base("https://api.carbonintensity.org.uk"),
                policy,
                http,
            }),
            other => {
                return Err(FetchError::Config {
                    provider: c.name.clone(),
                    message: format!(
                        "kind `{other}`: use electricity-maps, watttime, carbon-aware-sdk or gb-carbon-intensity"
                    ),
                });
            }
        })
    }
}

/// A file cache of provider bodies' parsed forecasts, keyed by provider and location.
#[derive(Clone, Debug)]
pub struct Cache {
    /// Folder.
    pub dir: PathBuf,
    /// How long an entry is fresh.
    pub ttl: Duration,
}

#[derive(serde::Serialize, Deserialize)]
struct CachedForecast {
    fetched_utc: DateTime<Utc>,
    issued_utc: Option<DateTime<Utc>>,
    signal: String,
    values: Vec<(DateTime<Utc>, i64, f64)>,
}

impl Cache {
    fn path(&self, provider: &str, location: &str) -> PathBuf {
        let clean: String = format!("{provider}-{location}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{clean}.json"))
    }

    /// A fresh cached forecast, if any.
    pub fn get(&self, provider: &str, location: &str) -> Option<(DateTime<Utc>, ProviderForecast)> {
        let text = std::fs::read_to_string(self.path(provider, location)).ok()?;
        let c: CachedForecast = serde_json::from_str(&text).ok()?;
        let age = (Utc::now() - c.fetched_utc).to_std().ok()?;
        if age > self.ttl {
            return None;
        }
        Some((
            c.fetched_utc,
            ProviderForecast {
                issued_utc: c.issued_utc,
                signal: CarbonSignal::parse(&c.signal)?,
                values: c
                    .values
                    .into_iter()
                    .map(|(t, d, v)| windfall_forecasts::providers::ProviderValue {
                        time_utc: t,
                        duration_s: d,
                        carbon_g_per_kwh: v,
                    })
                    .collect(),
            },
        ))
    }

    /// Stores `forecast` (best effort: a cache that cannot be written only costs a refetch).
    pub fn put(&self, provider: &str, location: &str, forecast: &ProviderForecast) {
        let c = CachedForecast {
            fetched_utc: Utc::now(),
            issued_utc: forecast.issued_utc,
            signal: forecast.signal.as_str().to_string(),
            values: forecast
                .values
                .iter()
                .map(|v| (v.time_utc, v.duration_s, v.carbon_g_per_kwh))
                .collect(),
        };
        let path = self.path(provider, location);
        let written = std::fs::create_dir_all(&self.dir).and_then(|()| {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&c).unwrap_or_default())?;
            std::fs::rename(tmp, &path)
        });
        if let Err(e) = written {
            tracing::warn!("forecast cache {}: {e}", path.display());
        }
    }
}

/// What a fetch for one site produced.
#[derive(Debug)]
pub struct Fetched {
    /// The provider that answered.
    pub provider: String,
    /// Its location.
    pub location: String,
    /// The forecast.
    pub forecast: ProviderForecast,
    /// When it was fetched (earlier than now when it came from the cache).
    pub fetched_utc: DateTime<Utc>,
    /// Providers tried before it, with why they failed.
    pub failures: Vec<String>,
}

/// Tries `sources` in order, the cache first for each, until one gives a forecast.
pub async fn fetch_with_fallback(
    sources: &[(Arc<dyn ForecastSource>, String)],
    from: DateTime<Utc>,
    cache: Option<&Cache>,
) -> Result<Fetched> {
    let mut failures = Vec::new();
    for (source, location) in sources {
        if let Some((fetched_utc, forecast)) = cache.and_then(|c| c.get(source.name(), location)) {
            return Ok(Fetched {
                provider: source.name().to_string(),
                location: location.clone(),
                forecast,
                fetched_utc,
                failures,
            });
        }
        match source.fetch(location, from).await {
            Ok(forecast) => {
                if let Some(c) = cache {
                    c.put(source.name(), location, &forecast);
                }
                return Ok(Fetched {
                    provider: source.name().to_string(),
                    location: location.clone(),
                    forecast,
                    fetched_utc: Utc::now(),
                    failures,
                });
            }
            Err(e) => {
                tracing::warn!("{e}; trying the next provider");
                failures.push(e.to_string());
            }
        }
    }
    bail!(
        "every provider failed: {}",
        if failures.is_empty() {
            "no providers configured".to_string()
        } else {
            failures.join("; ")
        }
    )
}

/// The site's sources in its fallback order, or only `only` when given.
pub fn site_sources(
    config: &ProvidersConfig,
    site: &str,
    only: Option<&str>,
    http: &reqwest::Client,
) -> Result<Vec<(Arc<dyn ForecastSource>, String)>> {
    let policy = config.policy();
    let entry = config
        .sites
        .iter()
        .find(|s| s.id == site)
        .with_context(|| {
            format!("site `{site}` has no [[site]] entry in the providers configuration")
        })?;
    let mut out = Vec::new();
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    for s in &entry.sources {
        if only.is_some_and(|o| o != s.provider) {
            continue;
        }
        match config.source(&s.provider, http, &policy) {
            Ok(source) => out.push((source, s.location.clone())),
            Err(e) => {
                errors.insert(s.provider.clone(), e.to_string());
            }
        }
    }
    if out.is_empty() {
        match only {
            Some(o) if errors.is_empty() => {
                bail!("site `{site}` lists no source from provider `{o}`")
            }
            _ if !errors.is_empty() => bail!(
                "no usable provider for site `{site}`: {}",
                errors.into_values().collect::<Vec<_>>().join("; ")
            ),
            _ => bail!("site `{site}` lists no sources"),
        }
    }
    for (name, e) in errors {
        tracing::warn!("skipping provider {name}: {e}");
    }
    Ok(out)
}

/// Canonical points for `site` from a fetched forecast, resampled to `bucket_s` (time-weighted,
/// see `windfall_forecasts::providers::resample`); issue time = the provider's, else the fetch
/// time.
pub fn to_points(
    site: &str,
    fetched: &Fetched,
    bucket_s: i64,
) -> Vec<windfall_forecasts::ForecastPoint> {
    let issued = fetched.forecast.issued_utc.unwrap_or(fetched.fetched_utc);
    windfall_forecasts::providers::resample(&fetched.forecast.values, bucket_s)
        .iter()
        .map(|v| windfall_forecasts::ForecastPoint {
            issued_utc: issued.min(fetched.fetched_utc),
            time_utc: v.time_utc,
            site: site.to_string(),
            surplus_kw: None,
            carbon_g_per_kwh: Some(v.carbon_g_per_kwh),
            carbon_signal: fetched.forecast.signal,
            price_usd_per_mwh: None,
        })
        .collect()
}
