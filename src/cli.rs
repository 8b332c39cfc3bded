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
    /// TOML configuration file. Its keys (db, listen, server, token, slots, slot_minutes,
    /// time_limit, change_penalty_g, max_forecast_age_hours) fill in what neither a flag nor an environment variable
    /// gives: flag > environment > file > default.
    #[arg(long, global = true, env = "WINDFALL_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// `windfall report --format`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ReportFormat {
    Md,
    Csv,
    Json,
}

/// An RFC 3339 time with an offset, in UTC; the error names the flag.
pub fn utc_arg(flag: &str, text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .with_context(|| format!("{flag} `{text}` is not an RFC 3339 time with an offset"))
}

/// A number `ok` accepts, or an error saying what `what` is expected.
fn number_where(text: &str, ok: impl Fn(f64) -> bool, what: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && ok(v) => Ok(v),
        _ => Err(format!("must be {what}, got `{text}`")),
    }
}

/// A time limit in seconds: a finite number above 0.
fn positive_seconds(text: &str) -> Result<f64, String> {
    number_where(text, |s| s > 0.0, "a number of seconds above 0")
}

/// A relative gap: a fraction in [0, 1), 0.01 meaning 1 %.
fn gap_fraction(text: &str) -> Result<f64, String> {
    number_where(
        text,
        |g| (0.0..1.0).contains(&g),
        "a fraction in [0, 1) (0.01 is 1 %)",
    )
}

/// A finite number at or above 0.
fn non_negative(text: &str) -> Result<f64, String> {
    number_where(text, |v| v >= 0.0, "a number at or above 0")
}

/// A finite number above 0.
fn positive(text: &str) -> Result<f64, String> {
    number_where(text, |v| v > 0.0, "a number above 0")
}

/// `windfall solve --method`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MethodArg {
    Auto,
    Heuristic,
    ColumnGeneration,
    DirectMilp,
    /// The heuristic, then the Lagrangian bound and a construction at its prices (what `auto`
    /// does above 200 jobs or 50,000 run variables).
    Lagrangian,
}

/// Where the database is: `sqlite://PATH` (the embedded default) or `postgres://...`.
#[derive(Debug, clap::Args)]
pub struct DbArgs {
    /// Database URL.
    #[arg(long, env = "WINDFALL_DB", default_value = "sqlite://windfall.db")]
    pub db: String,
}

/// Where the API is and who is asking.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Base URL of `windfall serve`.
    #[arg(long, env = "WINDFALL_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Bearer token (`windfall token create`).
    #[arg(long, env = "WINDFALL_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Horizon and solver settings of a planning cycle.
#[derive(Debug, clap::Args)]
pub struct CycleArgs {
    /// Horizon length in slots.
    #[arg(long, env = "WINDFALL_PLAN_SLOTS", default_value_t = 48)]
    pub slots: usize,
    /// Slot length in minutes (the horizon starts at the current slot boundary, UTC).
    #[arg(long, env = "WINDFALL_SLOT_MINUTES", default_value_t = 60)]
    pub slot_minutes: u32,
    /// Solver time limit in seconds.
    #[arg(long, env = "WINDFALL_TIME_LIMIT", default_value_t = 30.0, value_parser = positive_seconds)]
    pub time_limit: f64,
    /// Plan stability: g CO2e a job-slot changed against the previous plan must save before the
    /// planner moves it (a slot moved elsewhere counts twice).
    #[arg(long, env = "WINDFALL_CHANGE_PENALTY_G", default_value_t = 10.0, value_parser = non_negative)]
    pub change_penalty_g: f64,
    /// A site whose newest forecast is older than this (hours) at the horizon start makes the
    /// plan degraded; the plan is still made, on the fallback rules, and says why.
    #[arg(long, env = "WINDFALL_MAX_FORECAST_AGE_HOURS", default_value_t = 24.0, value_parser = positive)]
    pub max_forecast_age_hours: f64,
}

/// `windfall token` actions.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it once (only its hash is stored).
    Create {
        #[command(flatten)]
        db: DbArgs,
        /// admin, user (own jobs), agent (one site) or viewer (read-only).
        #[arg(long)]
        role: String,
        /// The site an agent token is bound to (required for agents, refused for others).
        #[arg(long)]
        site: Option<String>,
        /// Holder's name: the owner of the jobs a user token submits.
        #[arg(long)]
        name: String,
    },
}

/// `windfall jobs` actions.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List jobs (a user token sees its own).
    List {
        #[command(flatten)]
        server: ServerArgs,
        /// Only jobs in this state (queued, planned, running, ...).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one job with its planned runs.
    Show {
        #[command(flatten)]
        server: ServerArgs,
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel {
        #[command(flatten)]
        server: ServerArgs,
        /// Job id.
        id: String,
    },
}

/// Layouts `windfall ingest` reads.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum IngestFormat {
    /// windfall's canonical forecast CSV (sites named per row).
    Canonical,
    /// Electricity Maps hourly export (carbon intensity, average signal).
    EmExport,
    /// GB balancing-mechanism wind curtailment (surplus, GWh per hour).
    GbCurtailment,
    /// CAISO production-and-curtailment data, Curtailments sheet as CSV (MW, 5-minute
    /// intervals, Pacific time); stored as hourly surplus.
    Caiso,
}

/// `windfall scenario` commands.
#[derive(Debug, Subcommand)]
pub enum ScenarioCommand {
    /// Build a scenario folder from the public traces (carbon and prices per zone, a surplus
    /// rule, jobs from the GAIA PAI trace with Alibaba GPU gang sizes). Seeded and reproducible;
    /// docs/evaluation.md states every rule.
    Build(BuildArgs),
}

/// Arguments of `windfall scenario build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// Output folder (created; its sites.toml, signals.csv and jobs.csv are replaced).
    #[arg(long)]
    out: PathBuf,
    /// The public data folder.
    #[arg(long, default_value = "../shared/data")]
    data: PathBuf,
    /// Comma-separated Electricity Maps zones, one site each (e.g. US-CAL-CISO,DE-LU,GB).
    #[arg(long, value_delimiter = ',', required = true)]
    zones: Vec<String>,
    /// Scenario start, RFC 3339 UTC, a whole hour (the traces cover 2021-2023).
    #[arg(long)]
    start: String,
    /// Length in days.
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// Surplus rule: auto (price rule, GB curtailment where a zone has no prices), price, pv,
    /// gb-curtailment.
    #[arg(long, value_enum, default_value_t = crate::sim::build::SurplusRule::Auto)]
    surplus: crate::sim::build::SurplusRule,
    /// Number of jobs.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// GPUs per site.
    #[arg(long, default_value_t = 8)]
    gpus_per_site: u32,
    /// Deadline slack range LO:HI: deadline = submit + work on the slowest GPU x (1 + U(LO, HI))
    /// + 2 h.
    #[arg(long, default_value = "0.5:3")]
    slack: String,
    /// Share of jobs that may migrate between sites.
    #[arg(long, default_value_t = 0.8)]
    migratable_share: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl BuildArgs {
    fn to_config(&self) -> anyhow::Result<crate::sim::build::BuildConfig> {
        let (lo, hi) = self
            .slack
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .with_context(|| format!("--slack `{}` is not LO:HI", self.slack))?;
        let start = chrono::DateTime::parse_from_rfc3339(&self.start)
            .with_context(|| format!("--start `{}` is not an RFC 3339 time", self.start))?
            .with_timezone(&chrono::Utc);
        if !(0.0..=1.0).contains(&self.migratable_share) {
            anyhow::bail!("--migratable-share must be in [0, 1]");
        }
        Ok(crate::sim::build::BuildConfig {
            out: self.out.clone(),
            data: self.data.clone(),
            zones: self.zones.clone(),
            start_utc: start,
            days: self.days,
            surplus: self.surplus,
            jobs: self.jobs,
            gpus_per_site: self.gpus_per_site,
            slack: (lo, hi),
            migratable_share: self.migratable_share,
            seed: self.seed,
        })
    }
}

/// `windfall bench` targets.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Ingest generated canonical forecast rows into an empty database and print rows/s.
    Ingest {
        /// Database URL (an empty one).
        #[arg(long)]
        db: String,
        /// Rows to generate.
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
    },
    /// Load the API on loopback: half job submissions, half directive polls, over real HTTP
    /// against an in-process server; prints requests/s and latency percentiles. Needs an empty
    /// database (it creates a site, 100 jobs, a plan and tokens).
    Api {
        /// Database URL (an empty one).
        #[arg(long)]
        db: String,
        /// Seconds of load.
        #[arg(long, default_value_t = 60.0)]
        duration: f64,
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
    },
    /// Serve the dashboard for a plan of many jobs (four sites, 24 one-hour slots, a heuristic
    /// plan) from an empty database and time every page over HTTP; `--browser` also measures
    /// each page's load in headless Chromium.
    Dashboard {
        /// Database URL (an empty one).
        #[arg(long)]
        db: String,
        /// Jobs in the plan.
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        /// Also load each page in headless Chromium (needs chromium and chromedriver).
        #[arg(long)]
        browser: bool,
    },
    /// Build seeded instances from the public traces at sizes S (50 jobs x 4 sites x 48 slots),
    /// M (1,000 x 12 x 96) and L (10,000 x 50 x 192); solve each with windfall and, on S and M,
    /// with the direct MILP; check each plan with the independent validator (a plan that fails
    /// it fails the size); print emissions, bound, gap, wall time and peak memory. Each size
    /// runs in a child process.
    Solver {
        /// Sizes to run, comma-separated: S (5 s limit), M (30 s; direct MILP 120 s), L (300 s;
        /// no direct MILP), or JOBSxSITESxSLOTS such as 30x4x24 (slots a multiple of 24; 30 s
        /// for windfall and for the direct MILP).
        #[arg(long, value_delimiter = ',', default_value = "S,M")]
        sizes: Vec<String>,
        /// Replace each size's time limit, seconds (windfall's and the direct MILP's).
        #[arg(long, value_parser = positive_seconds)]
        time_limit: Option<f64>,
        /// The public data folder.
        #[arg(long, default_value = "../shared/data")]
        data: PathBuf,
        /// Write each size's instance (the `windfall solve` format) to this folder, as
        /// `bench-<size>.json`, so any run can be repeated with `windfall solve --instance FILE
        /// --time-limit SECONDS --gap 0.001` (the benchmark solves to the targets' 0.1 %
        /// tolerance; `solve`'s default is 0.01 %, which can take another path).
        #[arg(long)]
        save_instances: Option<PathBuf>,
        /// Leave out the direct MILP (about 2.5 minutes and 7 GiB on M).
        #[arg(long)]
        no_direct: bool,
        /// Seed of the instance draw (jobs, their windows and sizes, links). docs/benchmarks.md's
        /// figures use the default unless a section names another draw.
        #[arg(long, default_value_t = crate::solver_bench::DEFAULT_SEED)]
        seed: u64,
        /// First hour of the instances' horizon, UTC (RFC 3339, on the hour), within the public
        /// traces (2021 to 2023).
        #[arg(long, default_value = crate::solver_bench::DEFAULT_START_UTC)]
        start: chrono::DateTime<chrono::Utc>,
        /// Run the one size given in this process and print its result as JSON.
        #[arg(long, hide = true)]
        child: bool,
    },
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the planner API (HTTP/JSON; OpenAPI at /openapi.json) until SIGTERM or Ctrl-C.
    ///
    /// Every option also reads an environment variable (shown below). Tokens come from
    /// `windfall token create` against the same database.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on (port 0 picks a free port; the first output line names it).
        #[arg(long, env = "WINDFALL_LISTEN", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Seconds a site agent may keep acting on its last directives when it cannot reach
        /// the planner; past it the agent starts no new work.
        #[arg(long, env = "WINDFALL_LEASE_SECONDS", default_value_t = crate::server::DEFAULT_LEASE_S)]
        lease_seconds: i64,
        #[command(flatten)]
        cycle: CycleArgs,
    },
    /// A site agent: registers with the planner, heartbeats its GPU inventory, pulls its
    /// directives and at each slot boundary starts, pauses or migrates the site's jobs, with
    /// GPU power caps clamped to the devices and the site budget. Checkpoints move to the
    /// destination agent over HTTP (chunked, sha256-verified, resumable). `--config` names
    /// the site's agent configuration (TOML; see docs/agent.md). Logs go to standard error
    /// (`-v` for each action).
    Agent {
        /// Log the power caps it would set and change none (overrides the file).
        #[arg(long)]
        dry_run: bool,
    },
    /// Emissions and energy by site, user and day over a period, against the run-now baseline,
    /// with the method stated. Each slot comes from the plan in force when it began.
    Report {
        #[command(flatten)]
        db: DbArgs,
        /// Start of the period (RFC 3339 with an offset).
        #[arg(long)]
        from: String,
        /// End of the period (RFC 3339 with an offset).
        #[arg(long)]
        to: String,
        /// md, csv or json.
        #[arg(long, default_value = "md")]
        format: ReportFormat,
    },
    /// One planning cycle, for cron: read sites, forecasts and the queue, solve, store the plan
    /// in one transaction, print a summary. Exits 0 on success, 2 with a message on failure or
    /// when another cycle holds the planning lock.
    Plan {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        cycle: CycleArgs,
    },
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Store forecast values from a file (`.gz` is read transparently) with its source and issue
    /// times. The whole file is checked before anything is written, and written in one
    /// transaction.
    Ingest {
        #[command(flatten)]
        db: DbArgs,
        /// File to read.
        #[arg(
            long,
            conflicts_with = "provider",
            required_unless_present = "provider"
        )]
        file: Option<PathBuf>,
        /// Fetch from this HTTP provider (as named in --providers) for --site, or `auto` for the
        /// site's providers in their fallback order.
        #[arg(long, requires = "site")]
        provider: Option<String>,
        /// Providers configuration (TOML; see docs/forecasts.md).
        #[arg(long, env = "WINDFALL_PROVIDERS", default_value = "providers.toml")]
        providers: PathBuf,
        /// Folder for cached provider answers.
        #[arg(long, default_value = "windfall-data/provider-cache")]
        cache_dir: PathBuf,
        /// Minutes a cached provider answer is reused instead of fetched again (0: never).
        #[arg(long, default_value_t = 30.0, value_parser = non_negative)]
        cache_minutes: f64,
        /// The file's layout.
        #[arg(long, value_enum, default_value_t = IngestFormat::Canonical)]
        format: IngestFormat,
        /// Site the values belong to (em-export and gb-curtailment; canonical rows name theirs).
        #[arg(long)]
        site: Option<String>,
        /// The site's share of the curtailed power (gb-curtailment, caiso), in (0, 1].
        #[arg(long)]
        share: Option<f64>,
        /// Source label stored with every value [default: the file name].
        #[arg(long)]
        source: Option<String>,
    },
    /// Submit a job to the planner API.
    Submit {
        #[command(flatten)]
        server: ServerArgs,
        /// Job id (generated when absent).
        #[arg(long)]
        id: Option<String>,
        /// Gang size: GPUs used together at one site.
        #[arg(long)]
        gpus: u32,
        /// Work in hours at full power on a reference GPU.
        #[arg(long)]
        work_hours: f64,
        /// Hard deadline (RFC 3339 with offset).
        #[arg(long)]
        deadline: String,
        /// Earliest start (RFC 3339 with offset); now when absent.
        #[arg(long)]
        release: Option<String>,
        /// Site the job is submitted to.
        #[arg(long)]
        home_site: String,
        /// Allowed GPU models (repeat); any when absent.
        #[arg(long = "gpu-model")]
        gpu_models: Vec<String>,
        /// Checkpoint size in GB.
        #[arg(long, default_value_t = 0.0)]
        checkpoint_gb: f64,
        /// The job may move between sites at checkpoints.
        #[arg(long)]
        migratable: bool,
        /// Command (or Slurm script) the site agent runs.
        #[arg(long)]
        command: Option<String>,
    },
    /// List, show or cancel jobs through the planner API.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// Benchmarks that print figures (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(BenchCommand),
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
        #[arg(long, default_value_t = 20.0, value_parser = positive_seconds)]
        time_limit: f64,
    },
    /// Solve an instance file (JSON: horizon, GPU models, sites with signals, jobs) and print its metrics.
    ///
    /// With `-v` each step of the solver logs its plan and bound as it finishes, with the seconds
    /// since the solve began.
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
        /// MILP and the neighbourhood search). Up to 200 jobs, time those steps leave goes to the
        /// exact MILP over the served jobs, whose cuts sharpen the bound, unless the neighbourhood
        /// search's share would leave it under 3 s: then the neighbourhoods take it all. The LP
        /// relaxation that
        /// bounds the plan gets at least 10 s more when no other step bounded the plan; once one
        /// has, it gets only what is left of the limit. Up to 200 jobs a second thread also bounds
        /// the plan within the limit by groups of jobs solved exactly on their own.
        #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
        time_limit: f64,
        /// Relative gap (plan vs lower bound) at which a plan counts as optimal, as a fraction in
        /// [0, 1): 0.001 is 0.1 %. The solve stops once a bound proves its plan within it,
        /// usually well inside the time limit on small fleets with a loose target.
        #[arg(long, default_value_t = 1e-4, value_parser = gap_fraction)]
        gap: f64,
        /// Algorithm: `auto` (exact MILP up to 12 jobs, column generation up to 200 jobs and
        /// 50,000 run variables (job x slot x pool x power level in the windows), the Lagrangian
        /// bound with constructions at its prices above), `lagrangian` (that at any size),
        /// `heuristic`
        /// (constructive heuristic alone: fast, no optimality claim), `column-generation` (at any
        /// size) or `direct-milp` (the time-indexed MILP over every job at any size, for
        /// comparison).
        #[arg(long, value_enum, default_value_t = MethodArg::Auto)]
        method: MethodArg,
        /// Shorthand for `--method heuristic`.
        #[arg(long, conflicts_with = "method")]
        heuristic: bool,
        /// Print the MILP solver's (HiGHS) log to standard output.
        #[arg(long, conflicts_with = "json")]
        solver_log: bool,
        /// Also print where the gap lies: the plan's emissions less the Lagrangian bound at the
        /// bound's prices, split into what the jobs' schedules cost above their cheapest at
        /// those prices (with the jobs furthest above), what the GPU-slots the plan leaves idle
        /// are priced at, and the rest; per site. Given on the Lagrangian and
        /// column-generation paths (with `--json`, as the `gap_breakdown` key, null elsewhere).
        #[arg(long)]
        explain_gap: bool,
    },
    /// Replay a scenario folder (sites.toml, signals.csv, jobs.csv, optional forecasts.csv) slot
    /// by slot against one or more placement policies and print their metrics.
    ///
    /// Policies see only jobs already submitted and forecasts issued so far (the scenario's
    /// forecasts.csv, or the actuals with a seeded error that grows with lead time); energy and
    /// emissions are accounted on the actuals. The oracle sees the actuals. Progress goes to
    /// standard error.
    Simulate {
        /// Scenario folder.
        #[arg(long)]
        scenario: PathBuf,
        /// Policy, a comma-separated list, or `all`: run-now, wait-awhile, lowest-carbon-site,
        /// gaia-cst, surplus-chaser, windfall, oracle.
        #[arg(long, default_value = "all")]
        policy: String,
        /// Print JSON: one object for one policy, an array for several.
        #[arg(long)]
        json: bool,
        /// Write report.md with SVG charts into this folder.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Planning horizon of the windfall policy, slots (the oracle's rolling mode uses twice
        /// this).
        #[arg(long, default_value_t = 48)]
        horizon: usize,
        /// Solver time limit per planning tick, seconds.
        #[arg(long, default_value_t = 2.0)]
        solve_seconds: f64,
        /// Re-plan at least every this many slots (the planner also re-plans when jobs arrive).
        #[arg(long, default_value_t = 6)]
        replan_every: usize,
        /// Seed of the forecast error model (used when the scenario has no forecasts.csv).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Scale of the forecast error model: 0 = perfect forecasts, 1 = the documented default.
        #[arg(long, default_value_t = 1.0)]
        forecast_error: f64,
        /// Objective penalty per migration for the windfall planner and the oracle, g CO2e (added
        /// to the scenario's own): moves that forecast errors may undo must pay for themselves.
        #[arg(long, default_value_t = 300.0)]
        migration_penalty_g: f64,
        /// Most column-generation rounds per full re-plan (each prices every job at every site).
        #[arg(long, default_value_t = 3)]
        colgen_rounds: usize,
    },
    /// Build scenario folders for `windfall simulate` from public traces.
    #[command(subcommand)]
    Scenario(ScenarioCommand),
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
    if let Err(err) = apply_config_file() {
        eprintln!("error: {err:#}");
        return ExitCode::from(2);
    }
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
    match run(cli.command, cli.config) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command, config: Option<PathBuf>) -> Result<ExitCode> {
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
            explain_gap,
        } => {
            let parsed = read_instance(&instance)?;
            let options = SolveOptions {
                mip_rel_gap: gap,
                method: if heuristic {
                    Method::Heuristic
                } else {
                    match method {
                        MethodArg::Auto => Method::Auto,
                        MethodArg::Heuristic => Method::Heuristic,
                        MethodArg::ColumnGeneration => Method::ColumnGeneration,
                        MethodArg::DirectMilp => Method::DirectMilp,
                        MethodArg::Lagrangian => Method::Lagrangian,
                    }
                },
                log: solver_log,
                bound: true,
                ..crate::solver_bench::timed_options(time_limit)
            };
            let started = Instant::now();
            let mut solution = solve(&parsed, &options);
            solution.metrics.solve_seconds = started.elapsed().as_secs_f64();
            if let Some(out) = &out {
                std::fs::write(out, solution.plan.to_json() + "\n")
                    .with_context(|| format!("writing the plan to {}", out.display()))?;
            }
            if json {
                let mut value = serde_json::to_value(&solution.metrics)?;
                if explain_gap && let Some(object) = value.as_object_mut() {
                    object.insert(
                        "gap_breakdown".to_string(),
                        serde_json::to_value(&solution.gap_breakdown)?,
                    );
                }
                println!("{}", serde_json::to_string_pretty(&value)?);
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
                if !m.infeasible_jobs.is_empty() {
                    println!(
                        "left out          {} job(s); every plan leaves out at least {}",
                        m.infeasible_jobs.len(),
                        m.left_out_at_least
                    );
                }
                for entry in &m.infeasible_jobs {
                    println!("infeasible        {}: {}", entry.job, entry.reason);
                }
                if explain_gap {
                    print_gap_breakdown(solution.gap_breakdown.as_ref());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            db,
            listen,
            lease_seconds,
            cycle,
        } => {
            let runtime = runtime()?;
            runtime.block_on(async {
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                let state = crate::server::AppState::new(store, cycle_config(&db.db, &cycle))
                    .with_lease_s(lease_seconds);
                crate::server::serve(state, listen).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            db,
            from,
            to,
            format,
        } => {
            let (from, to) = (utc_arg("--from", &from)?, utc_arg("--to", &to)?);
            let runtime = runtime()?;
            let report = runtime.block_on(async {
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                let report = crate::period::PeriodReport::build(&store, from, to).await;
                store.close().await;
                report
            })?;
            print!(
                "{}",
                match format {
                    ReportFormat::Md => report.markdown(),
                    ReportFormat::Csv => report.csv(),
                    ReportFormat::Json => report.json() + "\n",
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Agent { dry_run } => {
            let site_config = config.context(
                "windfall agent needs its site configuration: windfall agent --config site.toml",
            )?;
            let runtime = runtime()?;
            runtime.block_on(crate::agent::run_from_file(&site_config, dry_run))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan { db, cycle } => {
            let runtime = runtime()?;
            let outcome = runtime.block_on(async {
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                let outcome =
                    crate::planning::run_cycle(&store, &cycle_config(&db.db, &cycle), Utc::now())
                        .await;
                store.close().await;
                outcome
            })?;
            println!("{}", outcome.summary());
            for entry in &outcome.metrics.infeasible_jobs {
                println!("  left out {}: {}", entry.job, entry.reason);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Token(TokenCommand::Create {
            db,
            role,
            site,
            name,
        }) => {
            let role: crate::auth::Role = role.parse().map_err(anyhow::Error::msg)?;
            match (role, &site) {
                (crate::auth::Role::Agent, None) => {
                    anyhow::bail!("an agent token needs --site: it acts for one site only")
                }
                (r, Some(_)) if r != crate::auth::Role::Agent => {
                    anyhow::bail!("--site applies to agent tokens only")
                }
                _ => {}
            }
            if name.trim().is_empty() {
                anyhow::bail!("--name must not be empty");
            }
            let new = crate::auth::new_token().context("reading the system's random source")?;
            let runtime = runtime()?;
            runtime.block_on(async {
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                store
                    .insert_token(
                        &new.id,
                        &new.hash,
                        &name,
                        role.as_str(),
                        site.as_deref(),
                        Utc::now(),
                    )
                    .await?;
                store.close().await;
                anyhow::Ok(())
            })?;
            eprintln!(
                "created {role} token {} for {name}; it is shown once, store it now:",
                new.id
            );
            println!("{}", new.token);
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit {
            server,
            id,
            gpus,
            work_hours,
            deadline,
            release,
            home_site,
            gpu_models,
            checkpoint_gb,
            migratable,
            command,
        } => {
            let time = |flag: &str, text: &str| utc_arg(flag, text).map(|t| t.to_rfc3339());
            let mut body = serde_json::json!({
                "gpus": gpus, "work_hours": work_hours, "deadline_utc": time("--deadline", &deadline)?,
                "home_site": home_site, "gpu_models": gpu_models, "checkpoint_gb": checkpoint_gb,
                "migratable": migratable,
            });
            if let Some(id) = id {
                body["id"] = id.into();
            }
            if let Some(release) = release {
                body["release_utc"] = time("--release", &release)?.into();
            }
            if let Some(command) = command {
                body["command"] = command.into();
            }
            let endpoint = endpoint(&server);
            let job = runtime()?.block_on(crate::client::submit(&endpoint, &body))?;
            if server.json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                print!("{}", crate::client::job_details(&job));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Jobs(action) => {
            let runtime = runtime()?;
            let (server, value, table) = match &action {
                JobsCommand::List { server, state } => {
                    let v = runtime
                        .block_on(crate::client::list(&endpoint(server), state.as_deref()))?;
                    let t = crate::client::jobs_table(&v);
                    (server, v, t)
                }
                JobsCommand::Show { server, id } => {
                    let v = runtime.block_on(crate::client::show(&endpoint(server), id))?;
                    let t = crate::client::job_details(&v);
                    (server, v, t)
                }
                JobsCommand::Cancel { server, id } => {
                    let v = runtime.block_on(crate::client::cancel(&endpoint(server), id))?;
                    let t = crate::client::job_details(&v);
                    (server, v, t)
                }
            };
            if server.json {
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{table}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ingest {
            db,
            file: None,
            provider: Some(provider),
            providers,
            cache_dir,
            cache_minutes,
            site,
            ..
        } => {
            let site = site.context("--provider needs --site")?;
            let config = crate::providers::ProvidersConfig::load(&providers)?;
            let _ = rustls::crypto::ring::default_provider().install_default();
            let http = reqwest::Client::builder()
                .build()
                .context("building the HTTP client")?;
            let only = (provider != "auto").then_some(provider.as_str());
            let sources = crate::providers::site_sources(&config, &site, only, &http)?;
            let cache = (cache_minutes > 0.0).then(|| crate::providers::Cache {
                dir: cache_dir.clone(),
                ttl: std::time::Duration::from_secs_f64(cache_minutes * 60.0),
            });
            let stored = runtime()?.block_on(async {
                let fetched =
                    crate::providers::fetch_with_fallback(&sources, Utc::now(), cache.as_ref())
                        .await?;
                for failure in &fetched.failures {
                    eprintln!("warning: {failure}");
                }
                let points = crate::providers::to_points(&site, &fetched, 3600);
                let label = format!("{}:{}", fetched.provider, fetched.location);
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                let stored = store.insert_forecasts(&label, &points).await;
                store.close().await;
                anyhow::Ok((stored?, label, fetched))
            })?;
            let (count, label, fetched) = stored;
            println!(
                "stored {count} hourly {} carbon values for site {site} from {label} (issued {}{})",
                fetched.forecast.signal.as_str(),
                fetched
                    .forecast
                    .issued_utc
                    .unwrap_or(fetched.fetched_utc)
                    .format("%Y-%m-%d %H:%M UTC"),
                if fetched.failures.is_empty() {
                    String::new()
                } else {
                    format!("; {} provider(s) before it failed", fetched.failures.len())
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Ingest {
            db,
            file,
            format,
            site,
            share,
            source,
            ..
        } => {
            let file = file.context("give --file or --provider")?;
            let started = Instant::now();
            let text = read_maybe_gz(&file)?;
            let name = file.display().to_string();
            let need_site = || {
                site.clone().with_context(|| {
                    format!("--site is required for --format {format:?}: the file holds one zone")
                })
            };
            let points = match format {
                IngestFormat::Canonical => windfall_forecasts::parse_canonical_csv(&text, &name)?,
                IngestFormat::EmExport => {
                    windfall_forecasts::parse_em_export_csv(&text, &name, &need_site()?)?
                }
                IngestFormat::Caiso => {
                    let share = share.context(
                        "--share is required for caiso: the site's share of CAISO curtailed power",
                    )?;
                    windfall_forecasts::parse_caiso_curtailment_csv(
                        &text,
                        &name,
                        &need_site()?,
                        share,
                    )?
                }
                IngestFormat::GbCurtailment => {
                    let share = share.context(
                        "--share is required for gb-curtailment: the site's share of GB curtailed power",
                    )?;
                    windfall_forecasts::parse_gb_curtailment_csv(
                        &text,
                        &name,
                        &need_site()?,
                        share,
                    )?
                }
            };
            eprintln!(
                "read {} rows from {name} in {:.1} s; storing",
                points.len(),
                started.elapsed().as_secs_f64()
            );
            let label = source.unwrap_or_else(|| {
                file.file_name()
                    .map_or(name.clone(), |n| n.to_string_lossy().into_owned())
            });
            let stored = runtime()?.block_on(async {
                let store = crate::db::Store::connect(&db.db)
                    .await
                    .with_context(|| format!("opening {}", crate::db::redact(&db.db)))?;
                let stored = store.insert_forecasts(&label, &points).await?;
                store.close().await;
                anyhow::Ok(stored)
            })?;
            println!(
                "stored {stored} rows from {name} as source `{label}` in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Solver {
            sizes,
            time_limit,
            data,
            save_instances,
            no_direct,
            seed,
            start,
            child,
        }) => {
            let run = crate::solver_bench::RunOptions {
                data,
                save_instances,
                direct: !no_direct,
                time_limit_s: time_limit,
                seed,
                start_utc: start,
            };
            if child {
                let [name] = sizes.as_slice() else {
                    anyhow::bail!("--child runs exactly one size");
                };
                let size = crate::solver_bench::Size::parse(name, time_limit)?;
                let result = crate::solver_bench::run_size(&size, &run)?;
                println!("{}", serde_json::to_string(&result)?);
            } else {
                print!("{}", crate::solver_bench::run(&sizes, &run)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Dashboard { db, jobs, browser }) => {
            let report = runtime()?.block_on(crate::bench::dashboard(&db, jobs, browser))?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Ingest { db, rows }) => {
            let report = runtime()?.block_on(crate::bench::ingest(&db, rows))?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Api {
            db,
            duration,
            concurrency,
        }) => {
            if !(duration.is_finite() && duration > 0.0) || concurrency == 0 {
                anyhow::bail!("--duration must be > 0 and --concurrency at least 1");
            }
            let load = crate::bench::LoadConfig {
                duration: std::time::Duration::from_secs_f64(duration),
                concurrency,
            };
            let report = runtime()?.block_on(crate::bench::run(&db, &load))?;
            println!("{}", report.text(&crate::db::redact(&db)));
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate {
            scenario,
            policy,
            json,
            report,
            horizon,
            solve_seconds,
            replan_every,
            seed,
            forecast_error,
            migration_penalty_g,
            colgen_rounds,
        } => {
            if horizon == 0
                || replan_every == 0
                || !(solve_seconds.is_finite() && solve_seconds > 0.0)
            {
                anyhow::bail!(
                    "--horizon and --replan-every must be at least 1 and --solve-seconds > 0"
                );
            }
            if !(forecast_error.is_finite() && forecast_error >= 0.0) {
                anyhow::bail!("--forecast-error must be >= 0");
            }
            if !(migration_penalty_g.is_finite() && migration_penalty_g >= 0.0) {
                anyhow::bail!("--migration-penalty-g must be >= 0");
            }
            let loaded = crate::sim::Scenario::load(&scenario)
                .with_context(|| format!("loading scenario {}", scenario.display()))?;
            let names: Vec<String> = if policy == "all" {
                crate::sim::POLICIES.iter().map(|p| p.to_string()).collect()
            } else {
                policy.split(',').map(|p| p.trim().to_string()).collect()
            };
            for name in &names {
                if !crate::sim::POLICIES.contains(&name.as_str()) {
                    anyhow::bail!(
                        "unknown policy `{name}`; choose from {} or `all`",
                        crate::sim::POLICIES.join(", ")
                    );
                }
            }
            let error = crate::sim::ErrorModel {
                seed,
                ..crate::sim::ErrorModel::default()
            }
            .scaled(forecast_error);
            let options = crate::sim::PlannerOptions {
                horizon_slots: horizon,
                solve_seconds,
                replan_every,
                migration_penalty_g,
                colgen_rounds,
            };
            eprintln!(
                "scenario {}: {} sites, {} jobs, {} slots of {} min",
                loaded.name,
                loaded.fleet.sites.len(),
                loaded.jobs.len(),
                loaded.fleet.slots,
                loaded.fleet.slot_minutes
            );
            let started = Instant::now();
            let mut last_print = Instant::now();
            let outcomes = crate::sim::simulate_all(
                &loaded,
                &names,
                &error,
                &options,
                &mut |name, slot, slots| {
                    if slot == slots || last_print.elapsed().as_secs_f64() >= 5.0 {
                        last_print = Instant::now();
                        eprintln!(
                            "  {name}: slot {slot}/{slots} ({:.0} %), {:.0} s elapsed",
                            100.0 * slot as f64 / slots as f64,
                            started.elapsed().as_secs_f64()
                        );
                    }
                },
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            if let Some(dir) = &report {
                let described = crate::sim::Forecasts::new(&loaded, error.clone()).describe();
                crate::sim::report::write_report(dir, &loaded, &described, &outcomes)
                    .with_context(|| format!("writing the report into {}", dir.display()))?;
                eprintln!("report written to {}", dir.join("report.md").display());
            }
            let metrics: Vec<&crate::sim::Metrics> = outcomes.iter().map(|o| &o.metrics).collect();
            if json {
                let text = if metrics.len() == 1 {
                    serde_json::to_string_pretty(metrics[0])?
                } else {
                    serde_json::to_string_pretty(&metrics)?
                };
                println!("{text}");
            } else {
                print!("{}", crate::sim::report::table(&outcomes));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Scenario(ScenarioCommand::Build(args)) => {
            let summary = crate::sim::build::build(&args.to_config()?)?;
            println!("{summary}");
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

/// Configuration keys and the environment variables they stand in for.
const CONFIG_KEYS: [(&str, &str); 9] = [
    ("db", "WINDFALL_DB"),
    ("listen", "WINDFALL_LISTEN"),
    ("server", "WINDFALL_SERVER"),
    ("token", "WINDFALL_TOKEN"),
    ("slots", "WINDFALL_PLAN_SLOTS"),
    ("slot_minutes", "WINDFALL_SLOT_MINUTES"),
    ("time_limit", "WINDFALL_TIME_LIMIT"),
    ("change_penalty_g", "WINDFALL_CHANGE_PENALTY_G"),
    ("max_forecast_age_hours", "WINDFALL_MAX_FORECAST_AGE_HOURS"),
];

/// Reads the `--config` file (or `WINDFALL_CONFIG`) and exports each key as its environment
/// variable unless that is already set, so clap's precedence becomes flag > environment > file
/// > default.
fn apply_config_file() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let from_args = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--config=").map(str::to_string).or_else(|| {
            (a == "--config")
                .then(|| args.get(i + 1).cloned())
                .flatten()
        })
    });
    let Some(path) = from_args.or_else(|| std::env::var("WINDFALL_CONFIG").ok()) else {
        return Ok(());
    };
    // `windfall agent --config site.toml` names the agent's own file, read by the agent.
    let mut rest = args.iter().skip(1);
    let mut subcommand = None;
    while let Some(a) = rest.next() {
        if a == "--config" {
            rest.next();
        } else if !a.starts_with('-') {
            subcommand = Some(a.as_str());
            break;
        }
    }
    if subcommand == Some("agent") {
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading configuration file {path}"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("configuration file {path}"))?;
    for (key, value) in &table {
        let Some((_, var)) = CONFIG_KEYS.iter().find(|(k, _)| k == key) else {
            let known: Vec<&str> = CONFIG_KEYS.iter().map(|(k, _)| *k).collect();
            anyhow::bail!(
                "configuration file {path}: unknown key `{key}` (known: {})",
                known.join(", ")
            );
        };
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            _ => anyhow::bail!("configuration file {path}: `{key}` must be a string or a number"),
        };
        if std::env::var_os(var).is_none() {
            // SAFETY: called at the start of `main`, before any thread exists.
            unsafe { std::env::set_var(var, text) };
        }
    }
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("starting the async runtime")
}

fn endpoint(server: &ServerArgs) -> crate::client::Endpoint {
    crate::client::Endpoint {
        server: server.server.clone(),
        token: server.token.clone(),
    }
}

fn cycle_config(db_url: &str, cycle: &CycleArgs) -> crate::planning::CycleConfig {
    crate::planning::CycleConfig {
        slots: cycle.slots,
        slot_minutes: cycle.slot_minutes,
        time_limit_s: cycle.time_limit,
        lock_path: crate::planning::sqlite_lock_path(db_url),
        change_penalty_g: cycle.change_penalty_g,
        max_forecast_age_h: cycle.max_forecast_age_hours,
    }
}

/// Reads a text file, decompressing it when its name ends in `.gz`.
fn read_maybe_gz(path: &Path) -> Result<String> {
    if path.extension().is_some_and(|e| e == "gz") {
        use std::io::Read;
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut text = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .with_context(|| format!("decompressing {} (gzip, UTF-8 text)", path.display()))?;
        Ok(text)
    } else {
        read(path)
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Sites `solve --explain-gap`'s table lists.
const SITES_SHOWN: usize = 12;

/// `windfall solve --explain-gap`'s table: the gap's three parts, the jobs furthest above
/// their cheapest schedule, and the sites with the largest shares (at most `SITES_SHOWN`, each
/// at least 0.05 % of the plan; `--json` has every site).
fn print_gap_breakdown(breakdown: Option<&windfall_solver::GapBreakdown>) {
    let Some(b) = breakdown else {
        println!(
            "gap breakdown     none: no Lagrangian prices bound the plan (the heuristic alone, the \
             exact MILP's path, or a plan proven optimal before any prices)"
        );
        return;
    };
    let kg = |g: f64| g / 1000.0;
    println!(
        "gap breakdown     {:.3} kg plan - {:.3} kg Lagrangian bound at its prices = {:.3} kg:",
        kg(b.objective_g),
        kg(b.lagrangian_g),
        kg(b.objective_g - b.lagrangian_g)
    );
    println!(
        "  {:>9.3} kg  jobs' schedules above their cheapest at the prices ({} job(s) at 1 g or more)",
        kg(b.jobs_above_g),
        b.jobs_above_count
    );
    println!(
        "  {:>9.3} kg  GPU-slots left idle, at their prices",
        kg(b.idle_priced_g)
    );
    println!(
        "  {:>9.3} kg  the rest: grid draw beyond what the power prices charge for the load",
        kg(b.rest_g)
    );
    println!(
        "  ({:.3} kg of the gap is in the bound: the loads whole GPUs draw at each site)",
        kg(b.whole_gpus_g)
    );
    println!("  furthest above (1 g or more):");
    for job in b
        .top_jobs
        .iter()
        .filter(|j| j.above_g >= windfall_solver::GapBreakdown::LEAST_ABOVE_G)
    {
        let cheapest = job
            .cheapest_site
            .as_ref()
            .map_or(String::new(), |s| format!("; cheapest at the prices: {s}"));
        println!(
            "  {:>9.3} kg  {} ({} GPU(s), mostly at {}{cheapest})",
            kg(job.above_g),
            job.job,
            job.gpus,
            job.site
        );
    }
    let mut sites: Vec<&windfall_solver::SiteGap> = b.sites.iter().collect();
    sites.sort_by(|x, y| y.total_g().total_cmp(&x.total_g()));
    println!("  by site, largest first (jobs above + idle GPU-slots):");
    for site in sites
        .iter()
        .take(SITES_SHOWN)
        .filter(|s| s.total_g() >= 0.5e-3 * b.objective_g.abs())
    {
        println!(
            "  {:>9.3} kg  {} ({:.3} + {:.3} kg)",
            kg(site.total_g()),
            site.site,
            kg(site.jobs_above_g),
            kg(site.idle_priced_g)
        );
    }
}

fn read_instance(path: &Path) -> Result<Instance> {
    let text = read(path)?;
    Instance::from_json(&text).with_context(|| format!("instance {}", path.display()))
}
