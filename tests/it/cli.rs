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

/// `solve --explain-gap`: with `--json` the metrics carry the breakdown, whose parts add up
/// to the plan less the bound at the prices (at most the bound reported); as a table it names
/// the parts and the jobs furthest above their cheapest schedule. On the exact MILP's path
/// it says there is none.
#[test]
fn explain_gap_splits_the_gap_into_parts_that_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let instance_path = dir.path().join("instance.json");
    std::fs::write(&instance_path, random_instance(23, 40, 3, 24).to_json()).unwrap();
    let solve = |extra: &[&str]| {
        let mut args = vec![
            OsStr::new("solve"),
            OsStr::new("--time-limit"),
            OsStr::new("5"),
            OsStr::new("--explain-gap"),
            OsStr::new("--instance"),
            instance_path.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let out = windfall(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let out = solve(&["--method", "lagrangian", "--json"]);
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let b = &metrics["gap_breakdown"];
    let g = |key: &str| {
        b[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {metrics}"))
    };
    let objective_g = metrics["objective_g"].as_f64().unwrap();
    let parts_g = g("jobs_above_g") + g("idle_priced_g") + g("rest_g");
    assert!(
        (objective_g - g("lagrangian_g") - parts_g).abs() <= 1e-6 * objective_g,
        "{b}"
    );
    assert!(g("lagrangian_g") <= metrics["lower_bound_g"].as_f64().unwrap() + 1e-6 * objective_g);
    assert!(
        b["top_jobs"]
            .as_array()
            .is_some_and(|jobs| !jobs.is_empty()),
        "{b}"
    );
    assert_eq!(b["sites"].as_array().map(Vec::len), Some(3), "{b}");

    let table = String::from_utf8_lossy(&solve(&["--method", "lagrangian"]).stdout).to_string();
    for needle in [
        "gap breakdown",
        "jobs' schedules above",
        "GPU-slots left idle",
        "furthest above (1 g or more):",
    ] {
        assert!(table.contains(needle), "no `{needle}` in {table}");
    }

    std::fs::write(&instance_path, random_instance(23, 6, 2, 12).to_json()).unwrap();
    let table = String::from_utf8_lossy(&solve(&[]).stdout).to_string();
    assert!(table.contains("gap breakdown     none"), "{table}");
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
fn limits_and_gaps_out_of_range_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("instance.json");
    std::fs::write(&path, random_instance(3, 4, 2, 12).to_json()).unwrap();
    let instance = path.to_str().unwrap();
    for (flag, value, expected) in [
        ("--gap", "2", "a fraction in [0, 1)"),
        ("--gap", "-0.1", "a fraction in [0, 1)"),
        ("--time-limit", "nan", "seconds above 0"),
        ("--time-limit", "0", "seconds above 0"),
        ("--time-limit", "inf", "seconds above 0"),
    ] {
        let out = windfall(["solve", "--instance", instance, &format!("{flag}={value}")]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains(expected), "{err}");
        assert!(out.stdout.is_empty(), "{flag} {value}: nothing solved");
    }
    // The planning service's settings, from a configuration file as from a flag.
    let config = dir.path().join("windfall.toml");
    std::fs::write(&config, "time_limit = -3\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args(["--config", config.to_str().unwrap(), "plan"])
        .env_remove("WINDFALL_TIME_LIMIT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--time-limit") && err.contains("`-3`"),
        "{err}"
    );
    // In range, the same flags solve.
    let out = windfall([
        "solve",
        "--instance",
        instance,
        "--gap",
        "0.01",
        "--time-limit",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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

/// A fleet too busy for its jobs: one site of 2 GPUs over 8 hourly slots, five 2-hour jobs
/// due in the first 4 slots and three 3-hour jobs in the last 4. `solve` says how many it
/// leaves out and how many every plan must (one of each half), in its table and its JSON.
#[test]
fn solve_says_how_many_jobs_every_plan_leaves_out() {
    let hour = |h: usize| format!("2023-06-01T{h:02}:00:00Z");
    let job = |i: usize, work: f64, release: usize, deadline: usize| {
        serde_json::json!({
            "id": format!("job-{i}"), "gpus": 1, "work_hours": work,
            "release_utc": hour(release), "deadline_utc": hour(deadline),
            "checkpoint_gb": 10.0, "migratable": false, "home_site": "site-0"
        })
    };
    let jobs: Vec<serde_json::Value> = (0..5)
        .map(|i| job(i, 2.0, 0, 4))
        .chain((5..8).map(|i| job(i, 3.0, 4, 8)))
        .collect();
    let instance = serde_json::json!({
        "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 8,
        "gpu_models": { "H100": { "power_levels_w": [700, 400], "throughput": [1.0, 0.78],
                                  "speed": 1.0, "idle_w": 50 } },
        "sites": [{ "id": "site-0", "gpus": { "H100": 2 }, "pue": 1.2,
                    "surplus_kw": vec![0.0; 8], "carbon_g_per_kwh": vec![300.0; 8] }],
        "jobs": jobs
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.json");
    std::fs::write(&path, instance.to_string()).unwrap();
    let out = windfall([
        OsStr::new("solve"),
        OsStr::new("--instance"),
        path.as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("left out          2 job(s); every plan leaves out at least 2"),
        "{stdout}"
    );
    let out = windfall([
        OsStr::new("solve"),
        OsStr::new("--json"),
        OsStr::new("--instance"),
        path.as_os_str(),
    ]);
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(metrics["status"], "partial");
    assert_eq!(metrics["infeasible_jobs"].as_array().map(Vec::len), Some(2));
    assert_eq!(metrics["left_out_at_least"], 2);
}
