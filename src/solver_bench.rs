//! `windfall bench solver`: the solver on seeded instances built from the public traces at three
//! sizes, against the direct time-indexed MILP.
//!
//! Owns the size table, building each instance (a scenario from `sim::build` over the size's
//! sites and days, planned offline as one instance), timing the solves and reading peak memory.
//! Each size runs in a child process of its own, so its peak memory is its own. It writes only
//! into a temporary folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use windfall_solver::{Method, SolveOptions, solve};

use crate::sim::build::{BuildConfig, SurplusRule, build};
use crate::sim::{Scenario, planner::offline_instance};

/// The zones sites are drawn from, in order (repeated beyond 16 sites).
const ZONES: [&str; 16] = [
    "DE-LU",
    "GB",
    "US-CAL-CISO",
    "AU-NSW",
    "CA-ON",
    "US-TEX-ERCO",
    "CL-SIC",
    "AU-VIC",
    "BR-SP",
    "IN-WE",
    "JP-TK",
    "KR",
    "SG",
    "US-MIDA-PJM",
    "US-NY-NYIS",
    "ZA",
];

/// One benchmark size.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Name: S, M or L; `None` for a custom size, labelled by its shape (`30x4x24`).
    pub name: Option<&'static str>,
    /// Jobs.
    pub jobs: usize,
    /// Sites.
    pub sites: usize,
    /// Hourly slots.
    pub slots: usize,
    /// windfall's time limit, seconds.
    pub limit_s: f64,
    /// The direct MILP's time limit, seconds (`None`: not run at this size).
    pub direct_limit_s: Option<f64>,
}

/// The sizes of the solver-at-scale targets.
pub const SIZES: [Size; 3] = [
    Size {
        name: Some("S"),
        jobs: 50,
        sites: 4,
        slots: 48,
        limit_s: 5.0,
        direct_limit_s: Some(5.0),
    },
    Size {
        name: Some("M"),
        jobs: 1000,
        sites: 12,
        slots: 96,
        limit_s: 30.0,
        direct_limit_s: Some(120.0),
    },
    Size {
        name: Some("L"),
        jobs: 10_000,
        sites: 50,
        slots: 192,
        limit_s: 300.0,
        direct_limit_s: None,
    },
];

/// Limits of a custom size (`JOBSxSITESxSLOTS`) unless `--time-limit` replaces them.
const CUSTOM_LIMIT_S: f64 = 30.0;

impl Size {
    /// The size a `--sizes` entry names: S, M or L, or `JOBSxSITESxSLOTS` (slots a whole number
    /// of days, hourly), which runs windfall for 30 s and the direct MILP for as long.
    /// `limit_s` replaces windfall's limit and, where the size runs it, the direct MILP's.
    pub fn parse(name: &str, limit_s: Option<f64>) -> Result<Size> {
        let named = SIZES
            .iter()
            .find(|s| s.name.is_some_and(|n| n.eq_ignore_ascii_case(name)));
        let mut size = match named {
            Some(size) => *size,
            None => {
                let parts: Vec<&str> = name.split(['x', 'X']).collect();
                let numbers: Option<Vec<usize>> =
                    parts.iter().map(|p| p.trim().parse().ok()).collect();
                let Some([jobs, sites, slots]) = numbers
                    .as_deref()
                    .and_then(|n| <[usize; 3]>::try_from(n).ok())
                else {
                    bail!(
                        "unknown size `{name}`: choose S, M or L, or give JOBSxSITESxSLOTS (e.g. 30x4x24)"
                    );
                };
                if jobs == 0 || sites == 0 || slots == 0 || slots % 24 != 0 {
                    bail!(
                        "size `{name}`: jobs, sites and slots must be positive and slots a whole number of days (a multiple of 24)"
                    );
                }
                Size {
                    name: None,
                    jobs,
                    sites,
                    slots,
                    limit_s: CUSTOM_LIMIT_S,
                    direct_limit_s: Some(CUSTOM_LIMIT_S),
                }
            }
        };
        if let Some(limit_s) = limit_s {
            if !(limit_s.is_finite() && limit_s > 0.0) {
                bail!("--time-limit must be a positive number of seconds, not {limit_s}");
            }
            size.limit_s = limit_s;
            size.direct_limit_s = size.direct_limit_s.map(|_| limit_s);
        }
        Ok(size)
    }

    /// The size's label: its name, or its shape for a custom size.
    pub fn label(&self) -> String {
        self.name.map_or_else(
            || format!("{}x{}x{}", self.jobs, self.sites, self.slots),
            str::to_string,
        )
    }
}

/// Most Lagrangian subgradient iterations of a timed solve: enough that the time limit, not the
/// count, ends them on large fleets (the solver's default, for callers without a clock, is 300,
/// which ends a 1,000-job solve in a third of a 30 s limit).
const TIMED_DUAL_ITERATIONS: usize = 5000;

/// The options of a solve bounded by wall time, as `windfall solve`, the planning service and
/// this benchmark run it: the limit for HiGHS and for the solver's own loops (a budget, so
/// long phases leave room for the steps after them), progress in the log, and iteration caps
/// the limit ends first.
pub fn timed_options(time_limit_s: f64) -> SolveOptions {
    SolveOptions {
        time_limit_s,
        max_dual_iterations: TIMED_DUAL_ITERATIONS,
        stop: stop_after(time_limit_s),
        progress: progress_log(),
        ..SolveOptions::default()
    }
}

/// A stop signal that fires `limit_s` seconds from now: the wall-time limit the solver's own
/// loops honour (HiGHS keeps its own). It tells the solver how much of the limit has passed, so
/// the steps that follow a long phase fit inside it.
pub fn stop_after(limit_s: f64) -> windfall_solver::Stop {
    let start = Instant::now();
    let limit_s = limit_s.max(0.0);
    windfall_solver::Stop::budget(move || {
        let elapsed_s = start.elapsed().as_secs_f64();
        if limit_s > 0.0 {
            elapsed_s / limit_s
        } else {
            f64::INFINITY
        }
    })
}

/// The solver's progress messages as `info` log lines (`windfall solve -v`, the planning
/// service's log), each with the seconds since the solve began.
pub fn progress_log() -> windfall_solver::Progress {
    let started = Instant::now();
    windfall_solver::Progress::new(move |message| {
        tracing::info!("solve {:.1} s: {message}", started.elapsed().as_secs_f64())
    })
}

/// What to run besides windfall's solve.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The public data folder.
    pub data: PathBuf,
    /// Where to write each size's instance, if anywhere.
    pub save_instances: Option<PathBuf>,
    /// Whether to run the direct MILP on the sizes that have a limit for it.
    pub direct: bool,
    /// Replaces each size's time limit (windfall's and the direct MILP's), seconds.
    pub time_limit_s: Option<f64>,
    /// Seed of the instance draw.
    pub seed: u64,
    /// First hour of the horizon.
    pub start_utc: chrono::DateTime<chrono::Utc>,
}

/// The seed of the published figures.
pub const DEFAULT_SEED: u64 = 7;
/// The start of the published figures' horizon.
pub const DEFAULT_START_UTC: &str = "2022-06-01T00:00:00Z";

/// One solve's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Figures {
    /// Plan emissions, kg.
    pub emissions_kg: f64,
    /// Certified lower bound, kg.
    pub lower_bound_kg: f64,
    /// Relative gap.
    pub gap: f64,
    /// Jobs the plan could not serve.
    pub unserved: usize,
    /// Jobs every plan leaves out, at least (the solver's floor).
    #[serde(default)]
    pub unserved_at_least: usize,
    /// Wall time, s.
    pub wall_s: f64,
    /// Algorithm summary.
    pub method: String,
    /// Where the gap lies at the bound's prices, on the paths that price.
    #[serde(default)]
    pub gap_breakdown: Option<windfall_solver::GapBreakdown>,
}

/// One size's result (a child process prints it as one JSON line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizeResult {
    /// Size name.
    pub size: String,
    /// jobs x sites x slots.
    pub shape: String,
    /// Seconds building the instance.
    pub build_s: f64,
    /// windfall's solve.
    pub windfall: Figures,
    /// Peak resident memory after windfall's solve, MiB.
    pub peak_mib: f64,
    /// The direct MILP's solve, where run.
    pub direct: Option<Figures>,
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Checks `solution`'s plan with the independent validator: an error, naming `who`, when the
/// plan breaks a constraint or its emissions are not the ones the validator recomputes.
pub fn check_plan(
    instance: &windfall_solver::Instance,
    solution: &windfall_solver::Solution,
    who: &str,
) -> Result<()> {
    let check = windfall_solver::validate(instance, &solution.plan);
    if !check.valid {
        bail!(
            "{who}'s plan fails the independent validator with {} violation(s), the first: {}",
            check.violations.len(),
            check.violations.first().map_or("", String::as_str)
        );
    }
    let claimed_g = solution.metrics.emissions_g;
    if (check.emissions_g - claimed_g).abs() > EMISSIONS_AGREE_G.max(1e-6 * claimed_g) {
        bail!(
            "{who}'s plan emits {:.3} g by the independent validator's count, {claimed_g:.3} g by \
             its own",
            check.emissions_g
        );
    }
    Ok(())
}

/// Solves `instance` and, after the clock stops, checks the plan ([`check_plan`]): a plan that
/// fails fails the size rather than print figures for it.
fn figures(
    instance: &windfall_solver::Instance,
    options: &SolveOptions,
    who: &str,
) -> Result<Figures> {
    let started = Instant::now();
    let solution = solve(instance, options);
    let wall_s = started.elapsed().as_secs_f64();
    check_plan(instance, &solution, who)?;
    let m = &solution.metrics;
    Ok(Figures {
        emissions_kg: m.emissions_g / 1000.0,
        lower_bound_kg: m.lower_bound_g / 1000.0,
        gap: m.gap,
        unserved: m.infeasible_jobs.len(),
        unserved_at_least: m.left_out_at_least,
        wall_s,
        method: m.method.clone(),
        gap_breakdown: solution.gap_breakdown,
    })
}

/// Grams by which the solver's and the validator's emissions may differ (float sums in
/// different orders), or a millionth of the plan's, whichever is more.
const EMISSIONS_AGREE_G: f64 = 0.01;

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds and solves one size in this process.
pub fn run_size(size: &Size, run: &RunOptions) -> Result<SizeResult> {
    let data = run.data.as_path();
    let started = Instant::now();
    let dir = TempDir(std::env::temp_dir().join(format!(
        "windfall-bench-solver-{}-{}",
        std::process::id(),
        size.label()
    )));
    let zones: Vec<String> = (0..size.sites)
        .map(|i| ZONES[i % ZONES.len()].to_string())
        .collect();
    build(&BuildConfig {
        out: dir.path().to_path_buf(),
        data: data.to_path_buf(),
        zones,
        start_utc: run.start_utc,
        days: (size.slots / 24) as u32,
        surplus: SurplusRule::Auto,
        jobs: size.jobs,
        gpus_per_site: 8,
        slack: (0.5, 3.0),
        migratable_share: 0.8,
        seed: run.seed,
    })?;
    let scenario = Scenario::load(dir.path())?;
    let (instance, _) = offline_instance(&scenario);
    let build_s = started.elapsed().as_secs_f64();
    if let Some(folder) = &run.save_instances {
        std::fs::create_dir_all(folder)
            .with_context(|| format!("creating {}", folder.display()))?;
        let path = folder.join(format!("bench-{}.json", size.label()));
        std::fs::write(&path, serde_json::to_string(&instance)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("  instance written to {}", path.display());
    }
    let windfall = figures(
        &instance,
        &SolveOptions {
            mip_rel_gap: 1e-3,
            progress: windfall_solver::Progress::default(),
            ..timed_options(size.limit_s)
        },
        "windfall",
    )?;
    let peak_mib = peak_rss_mib();
    // Said at once, so a direct MILP that overruns its limit does not hide windfall's figures.
    eprintln!(
        "  windfall {:.3} kg (bound {:.3}, gap {:.2} %, {} unserved, every plan at least {}) in {:.1} s, peak {:.0} MiB; {}",
        windfall.emissions_kg,
        windfall.lower_bound_kg,
        windfall.gap * 100.0,
        windfall.unserved,
        windfall.unserved_at_least,
        windfall.wall_s,
        peak_mib,
        windfall.method
    );
    if let Some(b) = &windfall.gap_breakdown {
        let furthest: Vec<String> = b
            .top_jobs
            .iter()
            .take(3)
            .filter(|j| j.above_g >= windfall_solver::GapBreakdown::LEAST_ABOVE_G)
            .map(|j| format!("{} ({} GPUs) {:.3}", j.job, j.gpus, j.above_g / 1000.0))
            .collect();
        eprintln!(
            "  where the gap lies (`windfall solve --explain-gap`): {:.3} kg jobs above their \
             cheapest at the bound's prices ({} jobs; furthest: {}), {:.3} kg idle priced \
             GPU-slots, {:.3} kg the rest ({:.3} kg of the gap in the bound: whole GPUs at \
             each site)",
            b.jobs_above_g / 1000.0,
            b.jobs_above_count,
            if furthest.is_empty() {
                "none".to_string()
            } else {
                furthest.join(", ")
            },
            b.idle_priced_g / 1000.0,
            b.rest_g / 1000.0,
            b.whole_gpus_g / 1000.0
        );
    }
    let direct = size
        .direct_limit_s
        .filter(|_| run.direct)
        .map(|limit_s| {
            figures(
                &instance,
                &SolveOptions {
                    time_limit_s: limit_s,
                    mip_rel_gap: 1e-3,
                    method: Method::DirectMilp,
                    // Its limit counts from the start, model build included, as windfall's does.
                    stop: stop_after(limit_s),
                    ..SolveOptions::default()
                },
                "the direct MILP",
            )
        })
        .transpose()?;
    Ok(SizeResult {
        size: size.label(),
        shape: format!("{} x {} x {}", size.jobs, size.sites, size.slots),
        build_s,
        windfall,
        peak_mib,
        direct,
    })
}

/// Runs the named sizes, each in a child process, and returns a Markdown table.
pub fn run(sizes: &[String], run: &RunOptions) -> Result<String> {
    let exe: PathBuf = std::env::current_exe().context("locating the windfall binary")?;
    // Every name is checked before the first size runs.
    let parsed = sizes
        .iter()
        .map(|name| Size::parse(name, run.time_limit_s))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    for size in &parsed {
        let label = size.label();
        eprintln!(
            "size {label}: {} jobs x {} sites x {} slots from {} (seed {}), windfall limit {} s{}...",
            size.jobs,
            size.sites,
            size.slots,
            run.start_utc.format("%Y-%m-%d %H:%M UTC"),
            run.seed,
            size.limit_s,
            size.direct_limit_s
                .map_or(String::new(), |l| format!(", direct MILP limit {l} s"))
        );
        let mut child = Command::new(&exe);
        child
            .args(["bench", "solver", "--child", "--sizes", &label, "--data"])
            .arg(&run.data);
        if let Some(limit_s) = run.time_limit_s {
            child.arg("--time-limit").arg(limit_s.to_string());
        }
        if let Some(folder) = &run.save_instances {
            child.arg("--save-instances").arg(folder);
        }
        if !run.direct {
            child.arg("--no-direct");
        }
        child
            .arg("--seed")
            .arg(run.seed.to_string())
            .arg("--start")
            .arg(run.start_utc.to_rfc3339());
        let output = child
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("running the size in a child process")?;
        if !output.status.success() {
            bail!("size {label} failed (its error is above)");
        }
        let result: SizeResult = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("reading size {label}'s result"))?;
        if let Some(d) = &result.direct {
            eprintln!(
                "  direct MILP {:.3} kg (bound {:.3}, gap {:.2} %) in {:.1} s",
                d.emissions_kg,
                d.lower_bound_kg,
                d.gap * 100.0,
                d.wall_s
            );
        }
        rows.push(result);
    }
    let mut table = String::from(
        "| size | jobs x sites x slots | windfall kg | bound kg | gap | unserved (every plan at least) | wall s | peak MiB | direct MILP kg | its bound kg | its gap | its wall s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let w = &r.windfall;
        let (dk, db, dg, dw) = match &r.direct {
            Some(d) => (
                format!("{:.3}", d.emissions_kg),
                format!("{:.3}", d.lower_bound_kg),
                format!("{:.2} %", d.gap * 100.0),
                format!("{:.1}", d.wall_s),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        table.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.2} % | {} ({}) | {:.1} | {:.0} | {dk} | {db} | {dg} | {dw} |\n",
            r.size,
            r.shape,
            w.emissions_kg,
            w.lower_bound_kg,
            w.gap * 100.0,
            w.unserved,
            w.unserved_at_least,
            w.wall_s,
            r.peak_mib
        ));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_after_tells_how_much_of_its_limit_has_passed() {
        let stop = stop_after(3600.0);
        assert!(stop.at(0.0));
        assert!(!stop.at(0.5));
        assert!(!stop.now());
        assert!(stop.passed().is_some_and(|p| (0.0..0.01).contains(&p)));
        assert!(stop_after(0.0).now());
    }

    #[test]
    fn sizes_are_named_or_given_as_a_shape() {
        let m = Size::parse("m", None).unwrap();
        assert_eq!((m.label().as_str(), m.jobs, m.limit_s), ("M", 1000, 30.0));
        let custom = Size::parse("30x4x24", Some(120.0)).unwrap();
        assert_eq!(custom.label(), "30x4x24");
        assert_eq!((custom.jobs, custom.sites, custom.slots), (30, 4, 24));
        assert_eq!(
            (custom.limit_s, custom.direct_limit_s),
            (120.0, Some(120.0))
        );
        assert_eq!(Size::parse("L", Some(60.0)).unwrap().direct_limit_s, None);
        for bad in ["XL", "30x4", "30x4x25", "0x4x24", "ax4x24"] {
            let err = Size::parse(bad, None).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
        assert!(Size::parse("S", Some(-1.0)).is_err());
    }
}
