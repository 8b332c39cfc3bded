//! The dashboard in a real browser: `windfall demo` seeds a database, `windfall serve` hosts it,
//! and Debian's headless Chromium, driven through ChromeDriver's WebDriver API, signs in, reads
//! the overview, a site timeline, the Gantt view and a report, and downloads the report. The
//! numbers on the page must equal the API's and `windfall report`'s. Screenshots go to
//! `target/test-artifacts/dashboard/`.
//!
//! Needs `chromium` and `chromedriver` (Debian packages `chromium`, `chromium-driver`): `.ci/run`
//! installs them and sets `WINDFALL_TEST_BROWSER=1`, which makes a missing browser a failure.

use std::path::{Path, PathBuf};
use std::time::{Duration as StdDuration, Instant};

use serde_json::Value;
use windfall::webdriver::{Browser, Driver};

use super::service::{Api, Server, stdout, token, windfall};

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts/dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot_png().await.unwrap();
    std::fs::write(artifacts().join(format!("{name}.png")), png).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_in_a_real_browser_shows_the_same_numbers_as_the_api_and_the_report() {
    if !windfall::webdriver::available() {
        assert!(
            std::env::var_os("WINDFALL_TEST_BROWSER").is_none(),
            "WINDFALL_TEST_BROWSER is set but chromium or chromedriver is missing"
        );
        eprintln!("skipped: install chromium and chromium-driver (or run .ci/run)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stdout(&windfall(&[
        "demo",
        "--data-dir",
        data.to_str().unwrap(),
        "--time-limit",
        "3",
    ]));
    let db = format!("sqlite://{}", data.join("windfall-demo.db").display());
    let viewer = token(&db, "viewer", "sustainability", None);
    let server = Server::start(&db);
    let api = Api::new(&server.url);
    let (_, plan) = api.get("/v1/plans/latest", Some(&viewer)).await;
    let metrics = &plan["metrics"];
    let start = plan["horizon_start_utc"].as_str().unwrap().to_string();
    let end = (chrono::DateTime::parse_from_rfc3339(&start).unwrap()
        + chrono::Duration::minutes(
            plan["slot_minutes"].as_i64().unwrap() * plan["slots"].as_i64().unwrap(),
        ))
    .to_rfc3339();
    let report: Value = serde_json::from_str(&stdout(&windfall(&[
        "report", "--db", &db, "--from", &start, "--to", &end, "--format", "json",
    ])))
    .unwrap();

    let downloads = dir.path().join("downloads");
    std::fs::create_dir_all(&downloads).unwrap();
    let (_driver, browser) = Driver::start(Some(&downloads)).await.unwrap();

    // Login: an unauthenticated visit lands on the sign-in form.
    browser.go(&format!("{}/", server.url)).await.unwrap();
    assert!(browser.current_url().await.unwrap().ends_with("/login"));
    screenshot(&browser, "01-login").await;
    browser.type_into("#token", &viewer).await.unwrap();
    browser.click("#sign-in").await.unwrap();
    // The click submits the form; the browser then follows the redirect to the overview.
    let overview = format!("{}/", server.url);
    let started = Instant::now();
    while browser.current_url().await.unwrap() != overview {
        assert!(
            started.elapsed() < StdDuration::from_secs(20),
            "signing in did not reach the overview: {}",
            browser.current_url().await.unwrap()
        );
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    }
    // Wait for the overview to be rendered before reading it.
    while browser.count("#kpi-emissions-kg").await.unwrap() == 0 {
        assert!(
            started.elapsed() < StdDuration::from_secs(20),
            "no overview"
        );
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    }

    // Overview: the same figures as the API and `windfall report` for this plan.
    let kg = |g: &Value| format!("{:.3}", g.as_f64().unwrap() / 1000.0);
    assert_eq!(
        browser.text("#kpi-emissions-kg").await.unwrap(),
        kg(&metrics["emissions_g"])
    );
    assert_eq!(
        browser.text("#kpi-baseline-kg").await.unwrap(),
        kg(&metrics["baseline_emissions_g"])
    );
    assert_eq!(
        browser.text("#kpi-emissions-kg").await.unwrap(),
        format!("{:.3}", report["total"]["emissions_kg"].as_f64().unwrap())
    );
    assert_eq!(
        browser.text("#kpi-baseline-kg").await.unwrap(),
        format!("{:.3}", report["total"]["baseline_kg"].as_f64().unwrap())
    );
    assert_eq!(
        browser.text("#kpi-surplus-mwh").await.unwrap(),
        format!(
            "{:.3}",
            metrics["surplus_used_kwh"].as_f64().unwrap() / 1000.0
        )
    );
    let infeasible = metrics["infeasible_jobs"].as_array().unwrap().len();
    let jobs = plan_jobs(&plan);
    assert_eq!(
        browser.text("#kpi-deadlines").await.unwrap(),
        format!("{} / {}", jobs - infeasible, jobs)
    );
    assert_eq!(
        browser.text("#kpi-migrations").await.unwrap(),
        plan["plan"]["migrations"]
            .as_array()
            .unwrap()
            .len()
            .to_string()
    );
    assert!(!browser.text("#forecast-status").await.unwrap().is_empty());
    let overview_ms = browser.load_ms().await.unwrap();
    // A chosen period: the plans in force over it, as `windfall report` stitches them.
    browser
        .go(&format!(
            "{}/?from={}&to={}",
            server.url,
            start.replace('+', "%2B"),
            end.replace('+', "%2B")
        ))
        .await
        .unwrap();
    assert_eq!(
        browser.text("#period-emissions-kg").await.unwrap(),
        format!("{:.3}", report["total"]["emissions_kg"].as_f64().unwrap())
    );
    screenshot(&browser, "02-overview").await;

    // A site timeline: an SVG with the load, surplus and carbon lines.
    let site = plan["plan"]["assignments"][0]["site"].as_str().unwrap();
    browser
        .go(&format!("{}/sites/{site}", server.url))
        .await
        .unwrap();
    assert!(browser.count("#site-timeline svg polyline").await.unwrap() >= 3);
    assert!(browser.text("h1").await.unwrap().contains(site));
    screenshot(&browser, "03-site").await;

    // The Gantt view: one block per planned job-slot on the first page.
    browser.go(&format!("{}/jobs", server.url)).await.unwrap();
    let blocks = browser.count("#gantt rect.run").await.unwrap();
    assert!(blocks > 0);
    assert!(
        browser
            .text("#jobs-count")
            .await
            .unwrap()
            .starts_with(&format!("{jobs} jobs match"))
    );
    let jobs_ms = browser.load_ms().await.unwrap();
    screenshot(&browser, "04-gantt").await;

    // The report page, then its CSV download through the browser.
    browser
        .go(&format!("{}/reports", server.url))
        .await
        .unwrap();
    assert_eq!(
        browser.text("#report-emissions-kg").await.unwrap(),
        format!("{:.3}", report["total"]["emissions_kg"].as_f64().unwrap())
    );
    screenshot(&browser, "05-report").await;
    browser.click("#download-csv").await.unwrap();
    let started = Instant::now();
    let csv = loop {
        let done = std::fs::read_dir(&downloads)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "csv"));
        if let Some(p) = done {
            break std::fs::read_to_string(p).unwrap();
        }
        assert!(
            started.elapsed() < StdDuration::from_secs(20),
            "no download"
        );
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    };
    let total = csv.lines().find(|l| l.starts_with("total,all,")).unwrap();
    let emissions: f64 = total.split(',').nth(3).unwrap().parse().unwrap();
    assert!((emissions - report["total"]["emissions_kg"].as_f64().unwrap()).abs() < 1e-6);
    eprintln!(
        "dashboard load times in Chromium: overview {overview_ms:.0} ms, jobs {jobs_ms:.0} ms ({jobs} jobs)"
    );
}

/// Jobs in the plan: those with runs plus those reported infeasible.
fn plan_jobs(plan: &Value) -> usize {
    let mut ids: Vec<&str> = plan["plan"]["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["job"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len() + plan["metrics"]["infeasible_jobs"].as_array().unwrap().len()
}
