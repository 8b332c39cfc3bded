//! The store's round trips, run against SQLite and against the real PostgreSQL.
//!
//! PostgreSQL tests use `WINDFALL_TEST_PG_URL` (e.g. `postgres://postgres@127.0.0.1:5432/test`);
//! each test creates and drops its own database. `.ci/run` sets the variable, so in CI an
//! unreachable server fails these tests instead of skipping them. Without the variable they say
//! so on standard error and check SQLite only.

use chrono::{DateTime, TimeZone, Utc};
use windfall::db::{Store, StoreError};
use windfall::fleet::{self, Horizon};
use windfall::model::{JobRecord, JobState, NewPlan, SiteConfig};
use windfall_solver::{SolveOptions, solve, validate};

fn t(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

async fn with_each_backend<F, Fut>(name: &str, test: F)
where
    F: Fn(Store) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    test(Store::connect(&url).await.unwrap()).await;
    match std::env::var("WINDFALL_TEST_PG_URL") {
        Ok(base) => {
            let db_name = format!("wf_{}_{}", name, std::process::id());
            let admin = sqlx::PgPool::connect(&base)
                .await
                .expect("WINDFALL_TEST_PG_URL is set but PostgreSQL is unreachable");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {db_name}"
            )))
            .execute(&admin)
            .await
            .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
                .execute(&admin)
                .await
                .unwrap();
            let url = match base.rfind('/') {
                Some(i) if base[..i].contains("://") && i > base.find("://").unwrap() + 2 => {
                    format!("{}/{db_name}", &base[..i])
                }
                _ => format!("{base}/{db_name}"),
            };
            let store = Store::connect(&url).await.unwrap();
            assert_eq!(store.backend(), windfall::db::Backend::Postgres);
            test(store.clone()).await;
            store.close().await;
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {db_name}")))
                .execute(&admin)
                .await
                .unwrap();
        }
        Err(_) => eprintln!(
            "store::{name}: WINDFALL_TEST_PG_URL not set, PostgreSQL not checked here (.ci/run checks it)"
        ),
    }
}

fn site(id: &str) -> SiteConfig {
    SiteConfig {
        id: id.into(),
        zone: Some("DE-LU".into()),
        gpus: [("H100".to_string(), 8)].into_iter().collect(),
        pue: 1.2,
        grid_limit_kw: Some(25.5),
        wan_gbps: 10.0,
    }
}

fn job(id: &str) -> JobRecord {
    JobRecord {
        id: id.into(),
        state: JobState::Queued,
        gpus: 2,
        gpu_models: vec!["H100".into(), "A100".into()],
        work_hours: 3.25,
        release_utc: t("2023-05-27T01:00:00Z"),
        deadline_utc: t("2023-05-28T01:00:00Z"),
        checkpoint_gb: 42.5,
        save_s: 60.0,
        restore_s: 120.0,
        migratable: true,
        home_site: "s1".into(),
        current_site: None,
        state_reason: None,
        submitted_utc: t("2023-05-27T00:55:00Z"),
        owner: Some("alice".into()),
        command: Some("python train.py --epochs 3".into()),
    }
}

#[tokio::test]
async fn sites_jobs_and_forecasts_round_trip() {
    with_each_backend("roundtrip", |store| async move {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        store.upsert_site(&site("s1"), now).await.unwrap();
        let mut changed = site("s1");
        changed.grid_limit_kw = None;
        store.upsert_site(&changed, now).await.unwrap();
        assert_eq!(store.sites().await.unwrap(), vec![changed]);

        store.insert_job(&job("j1")).await.unwrap();
        assert_eq!(store.job("j1").await.unwrap().unwrap(), job("j1"));
        assert!(matches!(
            store.insert_job(&job("j1")).await,
            Err(StoreError::Conflict(_))
        ));
        store
            .set_job_state("j1", JobState::Cancelled, Some("by user"))
            .await
            .unwrap();
        let back = store.job("j1").await.unwrap().unwrap();
        assert_eq!(
            (back.state, back.state_reason.as_deref()),
            (JobState::Cancelled, Some("by user"))
        );
        assert_eq!(store.jobs(Some(JobState::Queued)).await.unwrap(), vec![]);

        let point = |issued: &str, carbon: f64| windfall_forecasts::ForecastPoint {
            issued_utc: t(issued),
            time_utc: t("2023-05-27T02:00:00Z"),
            site: "s1".into(),
            surplus_kw: Some(1.5),
            carbon_g_per_kwh: Some(carbon),
            carbon_signal: windfall_forecasts::CarbonSignal::Marginal,
            price_usd_per_mwh: None,
        };
        store
            .insert_forecasts(
                "test",
                &[
                    point("2023-05-26T00:00:00Z", 100.0),
                    point("2023-05-27T00:00:00Z", 120.0),
                ],
            )
            .await
            .unwrap();
        // The newest issue known at the planning time wins; later issues are invisible.
        let rows = store
            .forecast_window(
                "s1",
                t("2023-05-27T00:00:00Z"),
                t("2023-05-28T00:00:00Z"),
                t("2023-05-26T12:00:00Z"),
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].carbon_g_per_kwh, Some(100.0));
        let rows = store
            .forecast_window(
                "s1",
                t("2023-05-27T00:00:00Z"),
                t("2023-05-28T00:00:00Z"),
                t("2023-05-27T00:00:00Z"),
            )
            .await
            .unwrap();
        assert_eq!(
            (
                rows[0].carbon_g_per_kwh,
                rows[0].carbon_signal.as_str(),
                rows[0].price_usd_per_mwh
            ),
            (Some(120.0), "marginal", None)
        );
        let mut unknown = point("2023-05-27T00:00:00Z", 1.0);
        unknown.site = "nowhere".into();
        let err = store
            .insert_forecasts("test", &[unknown])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown site `nowhere`"), "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_planned_sample_round_trips_and_revalidates() {
    with_each_backend("plan", |store| async move {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let counts = fleet::load_samples(&store, now).await.unwrap();
        assert_eq!((counts.sites, counts.jobs), (4, 120));
        let horizon = Horizon {
            start_utc: t(windfall_forecasts::samples::DEMO_START_UTC),
            slot_minutes: 60,
            slots: 24,
        };
        let (instance, provenance) = fleet::build_instance(&store, horizon).await.unwrap();
        assert_eq!(instance.sites.len(), 4);
        assert!(
            provenance
                .iter()
                .all(|p| p.filled_slots == 0 && !p.sources.is_empty())
        );
        let solution = solve(
            &instance,
            &SolveOptions {
                method: windfall_solver::Method::Heuristic,
                ..SolveOptions::default()
            },
        );
        let id = store
            .save_plan(&NewPlan {
                created_utc: now,
                horizon_start_utc: horizon.start_utc,
                slot_minutes: 60,
                slots: 24,
                metrics: solution.metrics.clone(),
                provenance: provenance.clone(),
                instance_json: instance.to_json(),
                plan: solution.plan.clone(),
            })
            .await
            .unwrap();
        let record = store.latest_plan().await.unwrap().unwrap();
        assert_eq!(record.id, id);
        assert_eq!(record.metrics, solution.metrics);
        assert_eq!(record.provenance, provenance);
        let mut expected = solution.plan.assignments.clone();
        expected.sort_by(|a, b| (&a.job, a.slot).cmp(&(&b.job, b.slot)));
        assert_eq!(record.plan.assignments, expected);
        let check = validate(
            &windfall_solver::Instance::from_json(&record.instance_json).unwrap(),
            &record.plan,
        );
        assert!(check.valid, "{:?}", check.violations);
        assert!(
            (check.emissions_g - solution.metrics.emissions_g).abs()
                <= 1e-6 * check.emissions_g.max(1.0)
        );
        let planned = store.jobs(Some(JobState::Planned)).await.unwrap();
        assert!(!planned.is_empty());
        // The next planning run two hours later sees this plan, moved onto its slots.
        let later = Horizon {
            start_utc: horizon.start_utc + chrono::Duration::hours(2),
            ..horizon
        };
        let (next, _) = fleet::build_instance(&store, later).await.unwrap();
        let moved: Vec<_> = expected
            .iter()
            .filter(|a| a.slot >= 2)
            .map(|a| (a.job.clone(), a.slot - 2, a.site.clone()))
            .collect();
        let seen: Vec<_> = next
            .previous_assignments
            .iter()
            .map(|a| (a.job.clone(), a.slot, a.site.clone()))
            .collect();
        assert!(!moved.is_empty());
        assert_eq!(seen, moved);
        for entry in &solution.metrics.infeasible_jobs {
            let stored = store.job(&entry.job).await.unwrap().unwrap();
            assert_eq!(stored.state, JobState::Infeasible);
            assert_eq!(stored.state_reason.as_deref(), Some(entry.reason.as_str()));
        }
    })
    .await;
}
