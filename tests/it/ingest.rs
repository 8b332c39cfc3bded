//! Forecast ingestion from real published files (`../shared/data`, read by tests only) and
//! `windfall ingest` as a real process.

use std::path::PathBuf;
use std::process::Command;

/// The shared data folder, if this checkout sits beside it.
fn shared_data() -> Option<PathBuf> {
    let candidates = [
        std::env::var("WINDFALL_SHARED_DATA")
            .ok()
            .map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data")),
        Some(PathBuf::from("/work/shared/data")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_dir());
    if found.is_none() {
        eprintln!(
            "ingest: ../shared/data not found (set WINDFALL_SHARED_DATA); real files not checked"
        );
    }
    found
}

fn gunzip(path: &std::path::Path) -> String {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn every_electricity_maps_export_and_the_gb_curtailment_file_parse() {
    let Some(data) = shared_data() else { return };
    let dir = data.join("carbon/em_greendcc_16regions_2021_2023");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".csv.gz"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 48, "16 zones x 3 years");
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = gunzip(file);
        let rows = text.lines().count() - 1;
        let points = windfall_forecasts::parse_em_export_csv(&text, &name, "site")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(points.len(), rows, "{name}");
        // 2021-2023 are not leap years; the set has no gaps.
        assert_eq!(points.len(), 8760, "{name}");
        assert!(points.iter().all(|p| p.carbon_g_per_kwh.is_some()));
    }
    let gb = data.join("energy/gb_wind_curtailment_oct2025/october_imbalance_over_time.csv");
    let text = std::fs::read_to_string(&gb).unwrap();
    let points = windfall_forecasts::parse_gb_curtailment_csv(&text, "gb", "site", 0.001).unwrap();
    assert_eq!(points.len(), text.lines().count() - 1);
    assert!(points.iter().any(|p| p.surplus_kw.unwrap() > 0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn windfall_ingest_stores_a_real_export_with_its_source() {
    let Some(data) = shared_data() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("i.db").display());
    {
        let store = windfall::db::Store::connect(&url).await.unwrap();
        store
            .upsert_gpu_model(
                "H100",
                &windfall_solver::GpuModel {
                    power_levels_w: vec![700.0],
                    throughput: vec![1.0],
                    speed: 1.0,
                    idle_w: 0.0,
                },
            )
            .await
            .unwrap();
        let site = windfall::model::SiteConfig {
            id: "de".into(),
            zone: Some("DE-LU".into()),
            gpus: [("H100".to_string(), 8)].into_iter().collect(),
            pue: 1.2,
            grid_limit_kw: None,
            wan_gbps: 10.0,
        };
        store.upsert_site(&site, chrono::Utc::now()).await.unwrap();
        store.close().await;
    }
    let file = data.join("carbon/em_greendcc_16regions_2021_2023/DE-LU_2023_hourly.csv.gz");
    let ingest = |extra: &[&str]| {
        let mut args = vec!["ingest", "--db", &url, "--file", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(&args)
            .output()
            .unwrap()
    };
    let out = ingest(&["--format", "em-export", "--site", "de"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("stored 8760 rows"), "{stdout}");
    let store = windfall::db::Store::connect(&url).await.unwrap();
    let t = |s: &str| {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let rows = store
        .forecast_window(
            "de",
            t("2023-01-01T00:00:00Z"),
            t("2024-01-01T00:00:00Z"),
            t("2024-01-01T00:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 8760);
    assert_eq!(rows[0].source, "DE-LU_2023_hourly.csv.gz");
    assert_eq!(rows[0].carbon_signal, "average");
    store.close().await;
    // Without --site the one-zone export is refused, naming the flag; nothing is written.
    let out = ingest(&["--format", "em-export"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--site"));
    // A site the database does not know fails the whole file.
    let out = ingest(&["--format", "em-export", "--site", "nowhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown site `nowhere`"));
}
