//! Command-line interface: argument definitions (clap) and the glue that runs each command.
//!
//! Owns exit codes and what goes to standard output (results) versus standard error (progress
//! and errors). Logic lives in the library modules and the solver crate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand, ValueEnum};
use windfall_solver::{Instance, Method, Plan, SolveOptions, solve, validate};

/// windfall places deferrable GPU jobs across sites so they run on curtailed renewable energy
/// and clean grid power, while every job meets its deadline.
#[derive(Debug, Parser)]
#[command(name = "windfall", version, about, long_about = None)]
pub struct Cli {
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
/// `windfall solve --method`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MethodArg {
    Auto,
    Heuristic,
    ColumnGeneration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the main job on the embedded default: fresh SQLite database, bundled sample sites,
    /// forecasts and jobs, a 48-hour plan, a summary and an HTML report.
    Demo {
        /// Folder for the demo database and report (created if missing; the demo database in it
        /// is replaced).
        #[arg(long, env = "WINDFALL_DATA_DIR", default_value = "windfall-data")]
        data_dir: PathBuf,
        /// Planning start (RFC 3339 with offset); defaults to the sample's planning day.
        #[arg(long, default_value = windfall_forecasts::samples::DEMO_START_UTC)]
        start: String,
        /// Horizon length in hourly slots.
        #[arg(long, default_value_t = 48)]
        slots: usize,
        /// MILP time limit in seconds; the heuristic's plan is used if nothing better is found.
        #[arg(long, default_value_t = 20.0)]
        time_limit: f64,
    },
    /// Solve an instance file (JSON: horizon, GPU models, sites with signals, jobs) and print its metrics.
    Solve {
        /// Instance JSON file.
        #[arg(long)]
        instance: PathBuf,
        /// Print the metrics as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Write the plan as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Time limit in seconds for the MILP work (the exact MILP, or the column-generation master
        /// MILP and the neighbourhood search). The LP relaxation that bounds the plan gets at least
        /// 10 s more when nothing else proved the plan optimal.
        #[arg(long, default_value_t = 30.0)]
        time_limit: f64,
        /// Relative gap (plan vs lower bound) at which a plan counts as optimal.
        #[arg(long, default_value_t = 1e-4)]
        gap: f64,
        /// Algorithm: `auto` (exact MILP up to 12 jobs, column generation above), `heuristic`
        /// (constructive heuristic alone: fast, no optimality claim) or `column-generation` (at any
        /// size).
        #[arg(long, value_enum, default_value_t = MethodArg::Auto)]
        method: MethodArg,
        /// Shorthand for `--method heuristic`.
        #[arg(long, conflicts_with = "method")]
        heuristic: bool,
        /// Print the MILP solver's (HiGHS) log to standard output.
        #[arg(long, conflicts_with = "json")]
        solver_log: bool,
    },
    /// Check a plan against every constraint of its instance, independently of the solver, and
    /// recompute its energy and emissions. Exits 1 when the plan is invalid.
    Validate {
        /// Instance JSON file.
        #[arg(long)]
        instance: PathBuf,
        /// Plan JSON file.
        #[arg(long)]
        plan: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Parses arguments, runs the command and turns errors into a message and exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(format!("{filter},highs=error"))
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli.command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Demo {
            data_dir,
            start,
            slots,
            time_limit,
        } => {
            let start_utc = DateTime::parse_from_rfc3339(&start)
                .with_context(|| {
                    format!("--start `{start}` is not an RFC 3339 time with an offset")
                })?
                .with_timezone(&Utc);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let config = crate::demo::DemoConfig {
                data_dir,
                start_utc,
                slots,
                time_limit_s: time_limit,
            };
            let outcome = runtime.block_on(crate::demo::run(&config, Utc::now()))?;
            print!("{}", outcome.summary);
            println!("  report         {}", outcome.report_path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Solve {
            instance,
            json,
            out,
            time_limit,
            gap,
            method,
            heuristic,
            solver_log,
        } => {
            let parsed = read_instance(&instance)?;
            let options = SolveOptions {
                time_limit_s: time_limit,
                mip_rel_gap: gap,
                method: if heuristic {
                    Method::Heuristic
                } else {
                    match method {
                        MethodArg::Auto => Method::Auto,
                        MethodArg::Heuristic => Method::Heuristic,
                        MethodArg::ColumnGeneration => Method::ColumnGeneration,
                    }
                },
                log: solver_log,
            };
            let started = Instant::now();
            let mut solution = solve(&parsed, &options);
            solution.metrics.solve_seconds = started.elapsed().as_secs_f64();
            if let Some(out) = &out {
                std::fs::write(out, solution.plan.to_json() + "\n")
                    .with_context(|| format!("writing the plan to {}", out.display()))?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&solution.metrics)?);
            } else {
                let m = &solution.metrics;
                println!("status            {}", m.status);
                println!("method            {}", m.method);
                println!("emissions         {:.3} kg CO2e", m.emissions_g / 1000.0);
                println!(
                    "lower bound       {:.3} kg CO2e (gap {:.3} %)",
                    m.lower_bound_g / 1000.0,
                    100.0 * m.gap
                );
                println!(
                    "run-now baseline  {:.3} kg CO2e",
                    m.baseline_emissions_g / 1000.0
                );
                println!("grid energy       {:.2} kWh", m.grid_energy_kwh);
                println!(
                    "surplus used      {:.2} of {:.2} kWh",
                    m.surplus_used_kwh, m.surplus_available_kwh
                );
                println!("migrations        {}", m.migrations);
                println!("solve time        {:.2} s", m.solve_seconds);
                for entry in &m.infeasible_jobs {
                    println!("infeasible        {}: {}", entry.job, entry.reason);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate {
            instance,
            plan,
            json,
        } => {
            let parsed = read_instance(&instance)?;
            let text = read(&plan)?;
            let plan_value = Plan::from_json(&text)
                .with_context(|| format!("reading plan {}", plan.display()))?;
            let result = validate(&parsed, &plan_value);
            if json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                println!("valid             {}", result.valid);
                println!(
                    "emissions         {:.3} kg CO2e",
                    result.emissions_g / 1000.0
                );
                println!("grid energy       {:.2} kWh", result.grid_energy_kwh);
                println!("surplus used      {:.2} kWh", result.surplus_used_kwh);
                for v in &result.violations {
                    println!("violation         {v}");
                }
            }
            Ok(if result.valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn read_instance(path: &Path) -> Result<Instance> {
    let text = read(path)?;
    Instance::from_json(&text).with_context(|| format!("instance {}", path.display()))
}
