//! The `windfall` binary as a real process: solve, validate and their errors.

use std::ffi::OsStr;
use std::process::{Command, Output};

use crate::fixtures::random_instance;

/// Runs the built binary with `args` and waits for it.
fn windfall<I, A>(args: I) -> Output
where
    I: IntoIterator<Item = A>,
    A: AsRef<OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn solve_then_validate_agree_on_emissions() {
    let dir = tempfile::tempdir().unwrap();
    let instance_path = dir.path().join("instance.json");
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&instance_path, random_instance(21, 10, 3, 24).to_json()).unwrap();
    let out = windfall([
        OsStr::new("solve"),
        OsStr::new("--json"),
        OsStr::new("--time-limit"),
        OsStr::new("5"),
        OsStr::new("--instance"),
        instance_path.as_os_str(),
        OsStr::new("--out"),
        plan_path.as_os_str(),
    ]);
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
    let out = windfall([
        OsStr::new("validate"),
        OsStr::new("--json"),
        OsStr::new("--instance"),
        instance_path.as_os_str(),
        OsStr::new("--plan"),
        plan_path.as_os_str(),
    ]);
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
    let out = windfall([
        OsStr::new("validate"),
        OsStr::new("--instance"),
        instance_path.as_os_str(),
        OsStr::new("--plan"),
        plan_path.as_os_str(),
    ]);
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
    let out = windfall([
        OsStr::new("solve"),
        OsStr::new("--instance"),
        path.as_os_str(),
    ]);
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
    let out = windfall([
        OsStr::new("demo"),
        OsStr::new("--time-limit"),
        OsStr::new("5"),
        OsStr::new("--data-dir"),
        dir.path().as_os_str(),
    ]);
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
