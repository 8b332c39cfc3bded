//! HTTP forecast providers against a real HTTP server on 127.0.0.1 that serves each provider's
//! documented payloads (`../shared/design/providers.md`) and its error responses: 401, 429 with
//! Retry-After, 500, a malformed body and a timeout; and the fallback to the next provider.
//! The first path segment picks the server's behaviour: `ok`, `500once`, `429once`, `401`,
//! `malformed`, `slow`, `down`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use windfall::providers::{FetchError, ProvidersConfig, fetch_with_fallback, site_sources};
use windfall_forecasts::CarbonSignal;

use super::service::{stdout, windfall};

const EM: &str = r#"{"zone":"DE","forecast":[{"carbonIntensity":326,"datetime":"2030-01-01T00:00:00.000Z"},{"carbonIntensity":297,"datetime":"2030-01-01T01:00:00.000Z"},{"carbonIntensity":301,"datetime":"2030-01-01T02:00:00.000Z"}],"updatedAt":"2029-12-31T23:25:24.685Z"}"#;
const WT: &str = r#"{"data":[{"point_time":"2030-01-01T00:00:00+00:00","value":870},{"point_time":"2030-01-01T00:05:00+00:00","value":860}],"meta":{"data_point_period_seconds":300,"region":"CAISO_NORTH","warnings":[],"signal_type":"co2_moer","model":{"date":"2023-03-01"},"units":"lbs_co2_per_mwh","generated_at_period_seconds":300,"generated_at":"2029-12-31T23:55:00+00:00"}}"#;
const CAS: &str = r#"[{"generatedAt":"2029-12-31T23:35:00+00:00","requestedAt":"2029-12-31T23:37:49+00:00","location":"northeurope","dataStartAt":"2030-01-01T00:00:00+00:00","dataEndAt":"2030-01-01T01:00:00+00:00","windowSize":0,"optimalDataPoints":[{"location":"IE","timestamp":"2030-01-01T00:30:00+00:00","duration":30,"value":448.4}],"forecastData":[{"location":"IE","timestamp":"2030-01-01T00:00:00+00:00","duration":30,"value":532.0},{"location":"IE","timestamp":"2030-01-01T00:30:00+00:00","duration":30,"value":448.4}]}]"#;
const GB: &str = r#"{"data":[{"from":"2030-01-01T00:00Z","to":"2030-01-01T00:30Z","intensity":{"forecast":266,"actual":null,"index":"moderate"}},{"from":"2030-01-01T00:30Z","to":"2030-01-01T01:00Z","intensity":{"forecast":270,"actual":null,"index":"moderate"}}]}"#;

#[derive(Default)]
struct Seen {
    counts: Mutex<HashMap<String, usize>>,
}

impl Seen {
    fn count(&self, mode: &str) -> usize {
        self.counts.lock().unwrap().get(mode).copied().unwrap_or(0)
    }
}

async fn handler(State(seen): State<Arc<Seen>>, headers: HeaderMap, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let mode = parts.next().unwrap_or("").to_string();
    let rest = parts.next().unwrap_or("").to_string();
    let n = {
        let mut counts = seen.counts.lock().unwrap();
        let c = counts.entry(mode.clone()).or_default();
        *c += 1;
        *c
    };
    let body = if rest.starts_with("carbon-intensity/forecast") {
        if headers.get("auth-token").and_then(|v| v.to_str().ok()) != Some("em-secret") {
            return (StatusCode::UNAUTHORIZED, r#"{"error":"Invalid auth-token","message":"The provided token is invalid. If this token used to work, please visit https://help.electricitymaps.com to get support"}"#).into_response();
        }
        EM
    } else if rest == "login" {
        // HTTP Basic wt-user:wt-pass
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            == Some("Basic d3QtdXNlcjp3dC1wYXNz");
        if !ok {
            return (StatusCode::UNAUTHORIZED, "unauthorized").into_response();
        }
        return r#"{"token":"wt-token"}"#.into_response();
    } else if rest.starts_with("v3/forecast") {
        if headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            != Some("Bearer wt-token")
        {
            return (StatusCode::UNAUTHORIZED, "expired").into_response();
        }
        WT
    } else if rest.starts_with("emissions/forecasts/current") {
        CAS
    } else if rest.starts_with("intensity/") {
        GB
    } else {
        return (
            StatusCode::NOT_FOUND,
            r#"{"error":{"code":"404","message":"no such route"}}"#,
        )
            .into_response();
    };
    match mode.as_str() {
        "ok" => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        "500once" if n == 1 => (StatusCode::INTERNAL_SERVER_ERROR, r#"{"title":"Exception","status":500}"#).into_response(),
        "500once" => body.into_response(),
        "429once" if n == 1 => (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")], "slow down").into_response(),
        "429once" => body.into_response(),
        "429long" => (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "3600")], "slow down").into_response(),
        "401" => (StatusCode::UNAUTHORIZED, r#"{"error":"Invalid auth-token","message":"Please provide a valid authentication header."}"#).into_response(),
        "malformed" => "{\"forecast\": [".into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            body.into_response()
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":{"code":"500","message":"down"}}"#).into_response(),
    }
}

async fn server() -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = axum::Router::new()
        .fallback(handler)
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A configuration with one provider per (kind, mode) and site `s` using `sources`.
fn config(base: &str, sources: &[(&str, &str)]) -> ProvidersConfig {
    let mut text = String::from("timeout_seconds = 1\nretries = 2\n");
    for mode in [
        "ok",
        "500once",
        "429once",
        "429long",
        "401",
        "malformed",
        "slow",
        "down",
    ] {
        text.push_str(&format!(
            "[[provider]]\nname = \"em-{mode}\"\nkind = \"electricity-maps\"\nbase_url = \"{base}/{mode}\"\ntoken = \"em-secret\"\n\
             [[provider]]\nname = \"wt-{mode}\"\nkind = \"watttime\"\nbase_url = \"{base}/{mode}\"\nusername = \"wt-user\"\npassword = \"wt-pass\"\n\
             [[provider]]\nname = \"cas-{mode}\"\nkind = \"carbon-aware-sdk\"\nbase_url = \"{base}/{mode}\"\n\
             [[provider]]\nname = \"gb-{mode}\"\nkind = \"gb-carbon-intensity\"\nbase_url = \"{base}/{mode}\"\n"
        ));
    }
    text.push_str("[[site]]\nid = \"s\"\nsources = [");
    for (provider, location) in sources {
        text.push_str(&format!(
            "{{ provider = \"{provider}\", location = \"{location}\" }},"
        ));
    }
    text.push_str("]\n");
    ProvidersConfig::parse(&text, "test providers.toml").unwrap()
}

async fn fetch(
    base: &str,
    sources: &[(&str, &str)],
) -> anyhow::Result<windfall::providers::Fetched> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let list = site_sources(&config(base, sources), "s", None, &http)?;
    fetch_with_fallback(&list, Utc::now(), None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_adapter_reads_its_providers_documented_payload() {
    let (base, _) = server().await;
    let em = fetch(&base, &[("em-ok", "DE")]).await.unwrap();
    assert_eq!(em.forecast.signal, CarbonSignal::Average);
    assert_eq!(em.forecast.values.len(), 3);
    assert_eq!(em.forecast.values[0].carbon_g_per_kwh, 326.0);
    let wt = fetch(&base, &[("wt-ok", "CAISO_NORTH")]).await.unwrap();
    assert_eq!(wt.forecast.signal, CarbonSignal::Marginal);
    // 870 lbs/MWh = 394.6 g/kWh.
    assert!((wt.forecast.values[0].carbon_g_per_kwh - 394.625_361_9).abs() < 1e-6);
    let cas = fetch(&base, &[("cas-ok", "northeurope")]).await.unwrap();
    assert_eq!(cas.forecast.values[1].duration_s, 1800);
    let gb = fetch(&base, &[("gb-ok", "national")]).await.unwrap();
    assert_eq!(gb.forecast.values.len(), 2);
    // Hourly points, time-weighted: (266 + 270) / 2.
    let points = windfall::providers::to_points("s", &gb, 3600);
    assert_eq!(points.len(), 1);
    assert_eq!(points[0].carbon_g_per_kwh, Some(268.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_are_retried_or_reported_by_name_and_the_next_provider_takes_over() {
    let (base, seen) = server().await;
    // 500 once: retried, then served.
    let got = fetch(&base, &[("cas-500once", "x")]).await.unwrap();
    assert_eq!(got.provider, "cas-500once");
    assert_eq!(seen.count("500once"), 2);
    // 429 with Retry-After: 1 s waited, then served.
    let started = Instant::now();
    fetch(&base, &[("gb-429once", "national")]).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(seen.count("429once"), 2);
    // A Retry-After longer than the policy waits: reported, not waited for.
    let e = fetch(&base, &[("gb-429long", "national")])
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("wait 3600 s"), "{e:#}");
    // 401: no retry, the provider named.
    let e = fetch(&base, &[("em-401", "DE")]).await.unwrap_err();
    assert!(format!("{e:#}").contains("em-401: HTTP 401"), "{e:#}");
    assert_eq!(seen.count("401"), 1);
    // A malformed body.
    let e = fetch(&base, &[("em-malformed", "DE")]).await.unwrap_err();
    assert!(format!("{e:#}").contains("malformed body"), "{e:#}");
    // A timeout, after the retries.
    let e = fetch(&base, &[("cas-slow", "x")]).await.unwrap_err();
    assert!(format!("{e:#}").contains("timed out"), "{e:#}");
    assert_eq!(seen.count("slow"), 3);
    // Fallback: the first provider is down, the second answers.
    let got = fetch(&base, &[("em-down", "DE"), ("gb-ok", "national")])
        .await
        .unwrap();
    assert_eq!(got.provider, "gb-ok");
    assert_eq!(got.failures.len(), 1);
    assert!(got.failures[0].contains("em-down"), "{:?}", got.failures);
    // A wrong credential is an error that names the provider, never the secret.
    let http = reqwest::Client::new();
    let mut bad = config(&base, &[("em-ok", "DE")]);
    for p in &mut bad.providers {
        p.token = Some("not-the-secret".into());
    }
    let list = site_sources(&bad, "s", None, &http).unwrap();
    let e = fetch_with_fallback(&list, Utc::now(), None)
        .await
        .unwrap_err();
    let text = format!("{e:#}");
    assert!(
        text.contains("HTTP 401") && !text.contains("not-the-secret"),
        "{text}"
    );
    let e: FetchError = FetchError::Config {
        provider: "p".into(),
        message: "m".into(),
    };
    assert_eq!(e.to_string(), "p: m");
}

#[tokio::test(flavor = "multi_thread")]
async fn windfall_ingest_fetches_stores_and_reuses_its_cache() {
    let (base, seen) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            "timeout_seconds = 1\nretries = 0\n[[provider]]\nname = \"em\"\nkind = \"electricity-maps\"\nbase_url = \"{base}/down\"\ntoken_env = \"TEST_EM_TOKEN\"\n\
             [[provider]]\nname = \"wt\"\nkind = \"watttime\"\nbase_url = \"{base}/ok\"\nusername_env = \"TEST_WT_USER\"\npassword_env = \"TEST_WT_PASS\"\n\
             [[site]]\nid = \"a\"\nsources = [{{ provider = \"em\", location = \"DE\" }}, {{ provider = \"wt\", location = \"CAISO_NORTH\" }}]\n"
        ),
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("w.db").display());
    // A site to attach the values to.
    let store = windfall::db::Store::connect(&db).await.unwrap();
    store
        .upsert_site(
            &windfall::model::SiteConfig {
                id: "a".into(),
                zone: None,
                gpus: Default::default(),
                pue: 1.2,
                grid_limit_kw: None,
                wan_gbps: 10.0,
            },
            Utc::now(),
        )
        .await
        .unwrap();
    // An older forecast with surplus and carbon: the provider's carbon-only values must not hide
    // its surplus.
    store
        .insert_forecasts(
            "surplus-file",
            &[windfall_forecasts::ForecastPoint {
                issued_utc: chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                    .unwrap()
                    .into(),
                time_utc: chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
                    .unwrap()
                    .into(),
                site: "a".into(),
                surplus_kw: Some(42.0),
                carbon_g_per_kwh: Some(100.0),
                carbon_signal: CarbonSignal::Average,
                price_usd_per_mwh: None,
            }],
        )
        .await
        .unwrap();
    store.close().await;
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args([
                "ingest",
                "--db",
                &db,
                "--provider",
                "auto",
                "--site",
                "a",
                "--providers",
            ])
            .arg(&providers)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .env("TEST_EM_TOKEN", "em-secret")
            .env("TEST_WT_USER", "wt-user")
            .env("TEST_WT_PASS", "wt-pass")
            .output()
            .unwrap()
    };
    let out = run();
    let text = stdout(&out);
    assert!(text.contains("from wt:CAISO_NORTH"), "{text}");
    assert!(text.contains("marginal"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("em: HTTP 500"));
    let fetched = seen.count("ok");
    // Within the cache's lifetime the provider is not asked again.
    let text = stdout(&run());
    assert!(text.contains("from wt:CAISO_NORTH"), "{text}");
    assert_eq!(seen.count("ok"), fetched);
    let store = windfall::db::Store::connect(&db).await.unwrap();
    let rows = store
        .forecast_window(
            "a",
            chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
                .unwrap()
                .into(),
            chrono::DateTime::parse_from_rfc3339("2030-01-02T00:00:00Z")
                .unwrap()
                .into(),
            Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].carbon_signal, "marginal");
    assert_eq!(rows[0].source, "wt:CAISO_NORTH+surplus-file");
    assert_eq!(rows[0].surplus_kw, Some(42.0));
    // (870 + 860) / 2 lbs/MWh over the covered ten minutes, in g/kWh.
    assert!((rows[0].carbon_g_per_kwh.unwrap() - 865.0 * 0.453_592_37).abs() < 1e-9);
    store.close().await;
    // Without its credential the provider is skipped with a message naming the variable.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args([
            "ingest",
            "--db",
            &db,
            "--provider",
            "em",
            "--site",
            "a",
            "--providers",
        ])
        .arg(&providers)
        .env_remove("TEST_EM_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TEST_EM_TOKEN"));
    let _ = windfall(&["--version"]);
}
