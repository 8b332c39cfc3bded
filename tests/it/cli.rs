//! The `windfall` binary as a real process: solve, validate and their errors.

use std::process::Command;

use crate::fixtures::random_instance;

fn windfall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_windfall"))
}

#[test]
fn solve_then_validate_agree_on_emissions() {
    let dir = tempfile::tempdir().unwrap();
    let instance_path = dir.path().join("instance.json");
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&instance_path, random_instance(21, 10, 3, 24).to_json()).unwrap();
    let out = windfall()
        .args(["solve", "--json", "--time-limit", "5", "--instance"])
        .arg(&instance_path)
        .arg("--out")
        .arg(&plan_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "status",
        "emissions_g",
        "lower_bound_g",
        "gap",
        "baseline_emissions_g",
        "grid_energy_kwh",
        "surplus_used_kwh",
        "migrations",
        "infeasible_jobs",
        "solve_seconds",
        "method",
    ] {
        assert!(metrics.get(key).is_some(), "metrics lack {key}: {metrics}");
    }
    let out = windfall()
        .args(["validate", "--json", "--instance"])
        .arg(&instance_path)
        .arg("--plan")
        .arg(&plan_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(check["valid"], true);
    let (a, b) = (
        metrics["emissions_g"].as_f64().unwrap(),
        check["emissions_g"].as_f64().unwrap(),
    );
    assert!(
        (a - b).abs() <= 1e-6 * a.max(1.0),
        "solve {a} vs validate {b}"
    );
}

#[test]
fn an_invalid_plan_exits_1_with_violations() {
    let dir = tempfile::tempdir().unwrap();
    let instance_path = dir.path().join("instance.json");
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&instance_path, random_instance(21, 4, 2, 12).to_json()).unwrap();
    std::fs::write(&plan_path, r#"{"assignments": [], "migrations": []}"#).unwrap();
    let out = windfall()
        .args(["validate", "--instance"])
        .arg(&instance_path)
        .arg("--plan")
        .arg(&plan_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("work hours before its deadline"));
}

#[test]
fn a_malformed_instance_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 1, "bogus": 1}"#,
    )
    .unwrap();
    let out = windfall()
        .args(["solve", "--instance"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json") && err.contains("unknown field `bogus`"),
        "{err}"
    );
}

#[test]
fn demo_prints_the_summary_and_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = windfall()
        .args(["demo", "--time-limit", "5", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "emissions",
        "run-now baseline",
        "surplus used",
        "grid energy",
        "jobs on time",
        "migrations",
        "(validated)",
        "report",
    ] {
        assert!(
            stdout.contains(needle),
            "summary lacks `{needle}`:\n{stdout}"
        );
    }
    let report = dir.path().join("report").join("plan-1.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(
        html.contains("<svg")
            && html.contains("Emissions")
            && !html.contains("http://")
            && !html.contains("https://")
    );
    assert!(dir.path().join("windfall-demo.db").exists());
}
