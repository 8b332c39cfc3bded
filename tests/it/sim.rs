//! The simulator: each baseline on tiny hand-computed scenarios, energy conservation, no
//! forecast leak, the planner policies, scenario errors, the scenario builder on the real
//! traces, and `windfall simulate` as a real process.

use std::path::{Path, PathBuf};
use std::process::Command;

use windfall::sim::{
    self, ErrorModel, Forecasts, Outcome, PlannerOptions, Policy, Run, Scenario, View,
};

fn at(slot: usize) -> String {
    format!("2023-06-01T{slot:02}:00:00Z")
}

/// One 1 kW GPU model ("G", one level, no idle draw) and sites with one GPU each.
fn sites_toml(sites: &[&str]) -> String {
    let mut text = String::from(
        "[gpu_models.G]\npower_levels_w = [1000.0]\nthroughput = [1.0]\nspeed = 1.0\nidle_w = 0.0\n",
    );
    for id in sites {
        text.push_str(&format!(
            "\n[[sites]]\nid = \"{id}\"\ngpus = {{ G = 1 }}\npue = 1.0\nwan_gbps = 10.0\n"
        ));
    }
    text
}

/// `series[site] = [(surplus_kw, carbon)]` per slot.
fn signals_csv(sites: &[&str], series: &[Vec<(f64, f64)>]) -> String {
    let mut text = String::from("time_utc,site,surplus_kw,carbon_g_per_kwh,price_usd_per_mwh\n");
    for (s, id) in sites.iter().enumerate() {
        for (t, (surplus, carbon)) in series[s].iter().enumerate() {
            text.push_str(&format!("{},{id},{surplus},{carbon},\n", at(t)));
        }
    }
    text
}

fn job_row(id: &str, submit: usize, work_h: f64, deadline: usize, gb: f64, home: &str) -> String {
    format!(
        "{id},{},1,,{work_h},{},{gb},true,{home},0,0\n",
        at(submit),
        at(deadline)
    )
}

fn write_scenario(dir: &Path, sites: &str, signals: &str, jobs: &[String]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("sites.toml"), sites).unwrap();
    std::fs::write(dir.join("signals.csv"), signals).unwrap();
    let mut text = String::from(
        "id,submit_utc,gpus,gpu_models,work_hours,deadline_utc,checkpoint_gb,migratable,home_site,save_s,restore_s\n",
    );
    for row in jobs {
        text.push_str(row);
    }
    std::fs::write(dir.join("jobs.csv"), text).unwrap();
    dir.to_path_buf()
}

fn replay(scenario: &Scenario, policy: &str) -> Outcome {
    let forecasts = Forecasts::new(scenario, ErrorModel::default().scaled(0.0));
    let mut policy = sim::make_policy(policy, scenario, &PlannerOptions::default()).unwrap();
    sim::simulate(scenario, &forecasts, policy.as_mut(), &mut |_, _| {})
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// One site, carbon 100, 400, 50, 200 g/kWh, no surplus; a 1 kW job of 1 h due at the end.
fn one_site() -> (tempfile::TempDir, Scenario) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a"]),
        &signals_csv(
            &["a"],
            &[vec![(0.0, 100.0), (0.0, 400.0), (0.0, 50.0), (0.0, 200.0)]],
        ),
        &[job_row("j", 0, 1.0, 4, 1.0, "a")],
    );
    let scenario = Scenario::load(&dir).unwrap();
    (tmp, scenario)
}

#[test]
fn run_now_runs_at_once_at_home() {
    let (_tmp, scenario) = one_site();
    let m = replay(&scenario, "run-now").metrics;
    assert!(close(m.emissions_kg, 0.1), "{m:?}"); // 1 kWh x 100 g
    assert_eq!((m.completed, m.deadline_misses), (1, 0));
    assert!(close(m.mean_completion_hours, 1.0));
}

#[test]
fn wait_awhile_picks_the_cleanest_slot_before_the_deadline() {
    let (_tmp, scenario) = one_site();
    let m = replay(&scenario, "wait-awhile").metrics;
    assert!(close(m.emissions_kg, 0.05), "{m:?}"); // slot 2: 1 kWh x 50 g
    assert!(close(m.mean_completion_hours, 3.0));
}

#[test]
fn gaia_cst_maximises_savings_per_hour_waited() {
    // Savings per hour against starting now (100 g): slot 1 saves -300, slot 2 saves 50 over
    // 2 h (25 g/h), slot 3 saves -100: it waits for slot 2.
    let (_tmp, scenario) = one_site();
    let m = replay(&scenario, "gaia-cst").metrics;
    assert!(close(m.emissions_kg, 0.05), "{m:?}");
}

#[test]
fn gaia_cst_prefers_a_small_saving_soon_over_a_large_one_late() {
    // Carbon 100, 90, 100, 100, 10: waiting 1 h saves 10 g (10 g/h); waiting 4 h saves 90 g
    // (22.5 g/h): it waits 4 h. With 60 at slot 1 (40 g/h) it would start at slot 1.
    let tmp = tempfile::tempdir().unwrap();
    for (second, expected_kg) in [(90.0, 0.01), (60.0, 0.06)] {
        let dir = write_scenario(
            &tmp.path().join(format!("s{second}")),
            &sites_toml(&["a"]),
            &signals_csv(
                &["a"],
                &[vec![
                    (0.0, 100.0),
                    (0.0, second),
                    (0.0, 100.0),
                    (0.0, 100.0),
                    (0.0, 10.0),
                ]],
            ),
            &[job_row("j", 0, 1.0, 5, 1.0, "a")],
        );
        let scenario = Scenario::load(&dir).unwrap();
        let m = replay(&scenario, "gaia-cst").metrics;
        assert!(close(m.emissions_kg, expected_kg), "{second}: {m:?}");
    }
}

/// Two sites: `a` at 300 g/kWh, `b` at 100 g/kWh.
#[test]
fn lowest_carbon_site_starts_at_the_cleanest_site() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a", "b"]),
        &signals_csv(&["a", "b"], &[vec![(0.0, 300.0); 3], vec![(0.0, 100.0); 3]]),
        &[job_row("j", 0, 2.0, 3, 1.0, "a")],
    );
    let scenario = Scenario::load(&dir).unwrap();
    let m = replay(&scenario, "lowest-carbon-site").metrics;
    assert!(close(m.emissions_kg, 0.2), "{m:?}"); // 2 kWh at b
    assert_eq!(m.migrations, 0); // the first placement is free
    let run_now = replay(&scenario, "run-now").metrics;
    assert!(close(run_now.emissions_kg, 0.6), "{run_now:?}");
}

#[test]
fn surplus_chaser_follows_surplus_and_pays_for_each_move() {
    // Slot 0: surplus 1 kW at b; slot 1: at a; slot 2: none. Carbon 100 everywhere. A 2 h job
    // with a 10 GB checkpoint over 10 Gbit/s: the move to a takes 8 s and 0.05 kWh at each end.
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a", "b"]),
        &signals_csv(
            &["a", "b"],
            &[
                vec![(0.0, 100.0), (1.0, 100.0), (0.0, 100.0)],
                vec![(1.0, 100.0), (0.0, 100.0), (0.0, 100.0)],
            ],
        ),
        &[job_row("j", 0, 2.0, 3, 10.0, "a")],
    );
    let scenario = Scenario::load(&dir).unwrap();
    let out = replay(&scenario, "surplus-chaser");
    let m = &out.metrics;
    // Slot 0: at b on surplus, 0 g. Slot 1: at a, 1.05 kW load against 1 kW surplus, 0.05 kW
    // transfer at b: 10 g. Slot 2: 8 s of work left, at a on the grid: 100 g.
    assert!(close(m.emissions_kg, 0.110), "{m:?}");
    assert_eq!(m.migrations, 1);
    assert!(close(m.gb_moved, 10.0));
    assert!(close(m.surplus_used_kwh, 2.0));
    assert!(close(out.jobs[0].done_h.unwrap(), 2.0 + 8.0 / 3600.0));
}

#[test]
fn capacity_is_enforced_and_late_jobs_count_as_misses() {
    // One GPU, two 2 h jobs due at slot 3: run-now finishes one at 2 h, the other at 4 h (late).
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a"]),
        &signals_csv(&["a"], &[vec![(0.0, 100.0); 4]]),
        &[
            job_row("x", 0, 2.0, 3, 1.0, "a"),
            job_row("y", 0, 2.0, 3, 1.0, "a"),
        ],
    );
    let scenario = Scenario::load(&dir).unwrap();
    let m = replay(&scenario, "run-now").metrics;
    assert_eq!((m.completed, m.deadline_misses), (2, 1), "{m:?}");
    assert!(close(m.work_done_hours, 4.0));
    assert!(close(m.gpu_utilisation, 1.0));
}

/// A policy that tries to break the rules: twice the same job, an unsubmitted job, more GPUs
/// than the site has.
struct Greedy;

impl Policy for Greedy {
    fn name(&self) -> &str {
        "greedy"
    }
    fn decide(&mut self, _view: &View<'_>) -> Vec<Run> {
        let run = |job| Run {
            job,
            site: 0,
            model: 0,
            level: 0,
        };
        vec![run(0), run(0), run(1), run(2)]
    }
}

#[test]
fn the_engine_drops_decisions_that_break_the_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a"]),
        &signals_csv(&["a"], &[vec![(0.0, 100.0); 2]]),
        &[
            job_row("x", 0, 2.0, 2, 1.0, "a"),
            job_row("y", 0, 1.0, 2, 1.0, "a"),
            job_row("later", 1, 1.0, 2, 1.0, "a"),
        ],
    );
    let scenario = Scenario::load(&dir).unwrap();
    let forecasts = Forecasts::new(&scenario, ErrorModel::default());
    let out = sim::simulate(&scenario, &forecasts, &mut Greedy, &mut |_, _| {});
    // Slot 0: duplicate x, y without a GPU, `later` unsubmitted. Slot 1: duplicate x, y and
    // `later` without a GPU.
    assert_eq!(out.metrics.rejected_decisions, 6, "{:?}", out.metrics);
    assert!(close(out.metrics.emissions_kg, 0.2));
}

/// Forecasts whose carbon value is 100 + the slot they were issued at.
#[test]
fn policies_never_see_a_forecast_issued_after_now() {
    struct Probe {
        worst_leak: f64,
        unsubmitted_seen: bool,
    }
    impl Policy for Probe {
        fn name(&self) -> &str {
            "probe"
        }
        fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
            let now = view.now();
            for slot in now..6 {
                let seen = view.forecast(0, slot).carbon_g_per_kwh;
                self.worst_leak = self.worst_leak.max(seen - (100.0 + now as f64));
            }
            if view.job(1).is_some() && now < 3 {
                self.unsubmitted_seen = true;
            }
            Vec::new()
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_scenario(
        tmp.path(),
        &sites_toml(&["a"]),
        &signals_csv(&["a"], &[vec![(0.0, 999.0); 6]]),
        &[
            job_row("x", 0, 1.0, 6, 1.0, "a"),
            job_row("late", 3, 1.0, 6, 1.0, "a"),
        ],
    );
    let mut forecasts =
        String::from("issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,price_usd_per_mwh\n");
    for issued in 0..6 {
        for target in issued..6 {
            forecasts.push_str(&format!(
                "{},{},a,0,{},\n",
                at(issued),
                at(target),
                100 + issued
            ));
        }
    }
    std::fs::write(dir.join("forecasts.csv"), forecasts).unwrap();
    let scenario = Scenario::load(&dir).unwrap();
    let seen = Forecasts::new(&scenario, ErrorModel::default());
    let mut probe = Probe {
        worst_leak: f64::NEG_INFINITY,
        unsubmitted_seen: false,
    };
    sim::simulate(&scenario, &seen, &mut probe, &mut |_, _| {});
    assert_eq!(
        probe.worst_leak, 0.0,
        "a forecast issued after now was seen"
    );
    assert!(
        !probe.unsubmitted_seen,
        "a job was visible before its submission"
    );

    // Without forecasts.csv, derived forecasts of future slots differ from the actuals, and a
    // past slot reads as its actual.
    std::fs::remove_file(dir.join("forecasts.csv")).unwrap();
    let scenario = Scenario::load(&dir).unwrap();
    let derived = Forecasts::new(&scenario, ErrorModel::default());
    assert_ne!(derived.at(0, 5, 0).carbon_g_per_kwh, 999.0);
    assert_eq!(derived.at(0, 1, 3).carbon_g_per_kwh, 999.0);
}

/// A small two-site fleet with solar-like surplus at one site and a carbon swing at the other.
fn two_site_day(dir: &Path, n_jobs: usize) -> Scenario {
    let sites = "[gpu_models.G]\npower_levels_w = [1000.0, 700.0]\nthroughput = [1.0, 0.8]\nidle_w = 50.0\n\n\
                 [[sites]]\nid = \"sun\"\ngpus = { G = 4 }\npue = 1.1\nwan_gbps = 10.0\n\n\
                 [[sites]]\nid = \"coal\"\ngpus = { G = 4 }\npue = 1.2\nwan_gbps = 10.0\n";
    let sun: Vec<(f64, f64)> = (0..24)
        .map(|t| {
            let surplus = if (8..16).contains(&t) { 3.0 } else { 0.0 };
            (surplus, 350.0 + 10.0 * t as f64)
        })
        .collect();
    let coal: Vec<(f64, f64)> = (0..24)
        .map(|t| (0.0, if t < 12 { 700.0 } else { 250.0 }))
        .collect();
    let jobs: Vec<String> = (0..n_jobs)
        .map(|k| {
            let home = if k % 2 == 0 { "coal" } else { "sun" };
            job_row(
                &format!("j{k}"),
                k % 6,
                2.0 + (k % 3) as f64,
                22,
                20.0,
                home,
            )
        })
        .collect();
    let dir = write_scenario(
        dir,
        sites,
        &signals_csv(&["sun", "coal"], &[sun, coal]),
        &jobs,
    );
    Scenario::load(&dir).unwrap()
}

#[test]
fn energy_is_conserved_for_every_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = two_site_day(tmp.path(), 10);
    for name in sim::POLICIES {
        let out = replay(&scenario, name);
        let s = &out.series;
        let mut emissions_kg = 0.0;
        for site in 0..2 {
            for t in 0..24 {
                let (load, used, grid) = (
                    s.site_load_kw[site][t],
                    s.site_surplus_used_kw[site][t],
                    s.site_grid_kw[site][t],
                );
                assert!(
                    (load - used - grid).abs() < 1e-9,
                    "{name}: site {site} slot {t}"
                );
                assert!(used >= 0.0 && grid >= -1e-12, "{name}");
                assert!(load > 0.0, "{name}: idle GPUs draw power");
            }
        }
        for t in 0..24 {
            emissions_kg += s.emissions_kg[t];
        }
        let m = &out.metrics;
        assert!((emissions_kg - m.emissions_kg).abs() < 1e-9, "{name}");
        let site_energy: f64 = m.sites.iter().map(|x| x.energy_kwh).sum();
        assert!(
            (site_energy - m.grid_energy_kwh - m.surplus_used_kwh).abs() < 1e-6,
            "{name}: {m:?}"
        );
        assert!(
            m.surplus_used_kwh <= m.surplus_available_kwh + 1e-9,
            "{name}"
        );
        assert_eq!(
            m.rejected_decisions, 0,
            "{name} made a decision the engine refused"
        );
        assert_eq!(m.completed, 10, "{name}: {m:?}");
    }
}

#[test]
fn windfall_beats_the_baselines_and_the_oracle_bounds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = two_site_day(tmp.path(), 10);
    let results: Vec<(String, f64, usize)> = sim::POLICIES
        .iter()
        .map(|name| {
            let mut policy = sim::make_policy(name, &scenario, &PlannerOptions::default()).unwrap();
            let seen = if *name == "oracle" {
                Forecasts::perfect(&scenario)
            } else {
                Forecasts::new(&scenario, ErrorModel::default())
            };
            let out = sim::simulate(&scenario, &seen, policy.as_mut(), &mut |_, _| {});
            (
                name.to_string(),
                out.metrics.emissions_kg,
                out.metrics.deadline_misses,
            )
        })
        .collect();
    let get = |name: &str| results.iter().find(|r| r.0 == name).unwrap().clone();
    let windfall = get("windfall");
    let oracle = get("oracle");
    assert_eq!(windfall.2, 0, "{results:?}");
    assert_eq!(oracle.2, 0, "{results:?}");
    for baseline in [
        "run-now",
        "wait-awhile",
        "lowest-carbon-site",
        "gaia-cst",
        "surplus-chaser",
    ] {
        assert!(
            windfall.1 < get(baseline).1,
            "windfall vs {baseline}: {results:?}"
        );
    }
    assert!(oracle.1 <= windfall.1 * 1.001, "{results:?}");
}

#[test]
fn scenario_errors_name_the_file_and_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let base = |name: &str| tmp.path().join(name);
    let signals = signals_csv(&["a"], &[vec![(0.0, 100.0); 4]]);
    let cases: Vec<(PathBuf, String, String, Vec<String>, &str)> = vec![
        (
            base("unknown-home"),
            sites_toml(&["a"]),
            signals.clone(),
            vec![job_row("j", 0, 1.0, 3, 1.0, "nowhere")],
            "job `j`: unknown home_site `nowhere`",
        ),
        (
            base("gap"),
            sites_toml(&["a"]),
            signals.replace(&format!("{},a,0,100,\n", at(1)), ""),
            vec![],
            "not on a regular",
        ),
        (
            base("missing-site-row"),
            sites_toml(&["a", "b"]),
            signals.clone(),
            vec![],
            "site `b` has no row",
        ),
        (
            base("typo"),
            sites_toml(&["a"]).replace("pue = 1.0", "peu = 1.0"),
            signals.clone(),
            vec![],
            "sites.toml",
        ),
        (
            base("duplicate"),
            sites_toml(&["a"]),
            signals.clone(),
            vec![
                job_row("j", 0, 1.0, 3, 1.0, "a"),
                job_row("j", 0, 1.0, 3, 1.0, "a"),
            ],
            "job `j`: the id is used twice",
        ),
    ];
    for (dir, sites, signals, jobs, expected) in cases {
        write_scenario(&dir, &sites, &signals, &jobs);
        let err = Scenario::load(&dir).unwrap_err().to_string();
        assert!(err.contains(expected), "{}: {err}", dir.display());
    }
    let bad_line = write_scenario(
        &base("bad-line"),
        &sites_toml(&["a"]),
        &format!("{signals}{},a,x,100,\n", at(4)),
        &[],
    );
    let err = Scenario::load(&bad_line).unwrap_err().to_string();
    assert!(
        err.contains("signals.csv: line 6") && err.contains("surplus_kw"),
        "{err}"
    );
}

/// The shared data folder, if this checkout sits beside it.
fn shared_data() -> Option<PathBuf> {
    [
        std::env::var("WINDFALL_SHARED_DATA")
            .ok()
            .map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data")),
        Some(PathBuf::from("/work/shared/data")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_dir())
}

#[test]
fn scenario_build_and_simulate_run_as_processes_on_real_traces() {
    let Some(data) = shared_data() else {
        panic!("../shared/data not found: set WINDFALL_SHARED_DATA");
    };
    let tmp = tempfile::tempdir().unwrap();
    let build = |out: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(["scenario", "build", "--data"])
            .arg(&data)
            .arg("--out")
            .arg(out)
            .args([
                "--zones",
                "DE-LU,GB,US-CAL-CISO",
                "--start",
                "2023-05-01T00:00:00Z",
                "--days",
                "2",
                "--jobs",
                "12",
                "--seed",
                "3",
            ])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let (first, second) = (tmp.path().join("a"), tmp.path().join("b"));
    build(&first);
    build(&second);
    for file in ["sites.toml", "signals.csv", "jobs.csv"] {
        assert_eq!(
            std::fs::read(first.join(file)).unwrap(),
            std::fs::read(second.join(file)).unwrap(),
            "{file} is not reproducible"
        );
    }
    let scenario = Scenario::load(&first).unwrap();
    assert_eq!(
        (
            scenario.fleet.sites.len(),
            scenario.jobs.len(),
            scenario.fleet.slots
        ),
        (3, 12, 48)
    );

    let report = tmp.path().join("report");
    let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
        .arg("simulate")
        .arg("--scenario")
        .arg(&first)
        .args([
            "--policy",
            "run-now,wait-awhile,windfall",
            "--json",
            "--solve-seconds",
            "1",
        ])
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("windfall: slot 48/48"),
        "progress: {stderr}"
    );
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 3);
    for r in results {
        for key in [
            "policy",
            "jobs",
            "completed",
            "deadline_misses",
            "work_done_hours",
            "emissions_kg",
            "grid_energy_kwh",
            "surplus_used_kwh",
            "surplus_available_kwh",
            "migrations",
            "gb_moved",
            "mean_completion_hours",
        ] {
            assert!(r.get(key).is_some(), "{key} missing in {r}");
        }
    }
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("| windfall |"), "{md}");
    let svg = std::fs::read_to_string(report.join("emissions.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));

    let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
        .arg("simulate")
        .arg("--scenario")
        .arg(&first)
        .args(["--policy", "fastest"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown policy `fastest`"));
}

#[test]
fn scenario_build_names_a_zone_without_data() {
    let Some(data) = shared_data() else {
        panic!("../shared/data not found: set WINDFALL_SHARED_DATA");
    };
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args(["scenario", "build", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(tmp.path().join("s"))
        .args([
            "--zones",
            "DE-LU,XX-NOWHERE",
            "--start",
            "2023-05-01T00:00:00Z",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no carbon data for zone XX-NOWHERE"),
        "{stderr}"
    );
    assert!(
        !tmp.path().join("s").exists(),
        "nothing is written on error"
    );
}

#[test]
fn the_solver_benchmark_draws_other_seeds_and_seasons() {
    let Some(data) = shared_data() else {
        panic!("../shared/data not found: set WINDFALL_SHARED_DATA");
    };
    let tmp = tempfile::tempdir().unwrap();
    let bench = |seed: &str, start: &str, out: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
            .args(["bench", "solver", "--sizes", "6x2x24", "--no-direct"])
            .args([
                "--time-limit",
                "1",
                "--seed",
                seed,
                "--start",
                start,
                "--data",
            ])
            .arg(&data)
            .arg("--save-instances")
            .arg(out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(output.status.success(), "{stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(stdout.contains("| 6x2x24 | 6 x 2 x 24 |"), "{stdout}");
        let instance: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("bench-6x2x24.json")).unwrap())
                .unwrap();
        (stderr, instance)
    };
    let (said, winter) = bench("3", "2021-01-15T00:00:00Z", &tmp.path().join("a"));
    assert!(
        said.contains("from 2021-01-15 00:00 UTC (seed 3)"),
        "{said}"
    );
    assert_eq!(winter["start_utc"], "2021-01-15T00:00:00Z");
    let (_, other_seed) = bench("4", "2021-01-15T00:00:00Z", &tmp.path().join("b"));
    assert_eq!(other_seed["start_utc"], "2021-01-15T00:00:00Z");
    assert_ne!(
        winter["jobs"], other_seed["jobs"],
        "another seed draws other jobs"
    );
    // A start outside the traces is refused, naming the date.
    let output = Command::new(env!("CARGO_BIN_EXE_windfall"))
        .args([
            "bench",
            "solver",
            "--sizes",
            "6x2x24",
            "--no-direct",
            "--time-limit",
            "1",
        ])
        .args(["--start", "2030-01-01T00:00:00Z", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("2030-01-01"), "{err}");
}
