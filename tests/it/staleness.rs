//! Degraded plans: `windfall plan` on a database whose forecasts are stale, have a short gap,
//! and mix signal types says so in its output and stores the reasons with the plan.

use chrono::{Duration, DurationRound, Utc};
use windfall_forecasts::{CarbonSignal, ForecastPoint};

use super::service::{stdout, windfall};

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_gappy_mixed_forecast_makes_a_degraded_plan_that_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("w.db").display());
    let store = windfall::db::Store::connect(&db).await.unwrap();
    let model = windfall_solver::GpuModel {
        power_levels_w: vec![700.0, 400.0],
        throughput: vec![1.0, 0.8],
        speed: 1.0,
        idle_w: 50.0,
    };
    store.upsert_gpu_model("H100", &model).await.unwrap();
    for id in ["a", "b"] {
        store
            .upsert_site(
                &windfall::model::SiteConfig {
                    id: id.into(),
                    zone: None,
                    gpus: [("H100".to_string(), 2)].into_iter().collect(),
                    pue: 1.2,
                    grid_limit_kw: None,
                    wan_gbps: 10.0,
                },
                Utc::now(),
            )
            .await
            .unwrap();
    }
    let hour = Utc::now().duration_trunc(Duration::hours(1)).unwrap();
    let mut points = Vec::new();
    for h in -1..26 {
        // Site a: issued three days ago, hours 5 and 6 missing; site b: fresh and marginal.
        if h != 5 && h != 6 {
            points.push(ForecastPoint {
                issued_utc: hour - Duration::hours(72),
                time_utc: hour + Duration::hours(h),
                site: "a".into(),
                surplus_kw: Some(0.0),
                carbon_g_per_kwh: Some(100.0 + h as f64),
                carbon_signal: CarbonSignal::Average,
                price_usd_per_mwh: None,
            });
        }
        points.push(ForecastPoint {
            issued_utc: hour - Duration::hours(1),
            time_utc: hour + Duration::hours(h),
            site: "b".into(),
            surplus_kw: Some(0.0),
            carbon_g_per_kwh: Some(300.0),
            carbon_signal: CarbonSignal::Marginal,
            price_usd_per_mwh: None,
        });
    }
    store.insert_forecasts("test", &points).await.unwrap();
    store.close().await;
    let out = stdout(&windfall(&[
        "plan",
        "--db",
        &db,
        "--slots",
        "24",
        "--time-limit",
        "2",
    ]));
    assert!(out.contains("DEGRADED: site a: stale forecast"), "{out}");
    assert!(
        out.contains("DEGRADED: site a: 2 slot(s) interpolated"),
        "{out}"
    );
    assert!(
        out.contains("mixes signal types (1 site(s) marginal, 1 average)"),
        "{out}"
    );
    assert!(!out.contains("site b: stale"), "{out}");
    // The interpolated values lie on the line between their neighbours.
    let store = windfall::db::Store::connect(&db).await.unwrap();
    let plan = store.latest_plan().await.unwrap().unwrap();
    let instance = windfall_solver::Instance::from_json(&plan.instance_json).unwrap();
    let a = instance.sites.iter().find(|s| s.id == "a").unwrap();
    assert!((a.carbon_g_per_kwh[5] - 105.0).abs() < 1e-9);
    assert!((a.carbon_g_per_kwh[6] - 106.0).abs() < 1e-9);
    assert!(
        plan.provenance
            .iter()
            .any(|p| p.site == "a" && p.degraded.iter().any(|r| r.contains("stale")))
    );
    store.close().await;
    // A longer allowed age: no longer stale, still interpolated.
    let out = stdout(&windfall(&[
        "plan",
        "--db",
        &db,
        "--slots",
        "24",
        "--time-limit",
        "2",
        "--max-forecast-age-hours",
        "100",
    ]));
    assert!(!out.contains("stale"), "{out}");
    assert!(out.contains("interpolated"), "{out}");
}
