//! windfall-solver: the placement model of model.md as a pure library.
//!
//! Plain data in (an [`Instance`]), a [`Plan`] and its [`Metrics`] out. The crate owns the instance
//! and plan formats, the exact MILP (good_lp + HiGHS), the constructive heuristic, the run-now
//! baseline and the independent validator.
//!
//! **Invariant:** no I/O, no clock, no async. Callers read files, time the solve and fill in
//! `Metrics::solve_seconds`. HiGHS keeps its own time limit inside the C++ library.
//!
//! # Layout
//! - `instance`: parsing and checking the instance format;
//! - `plan`: plan and metrics formats;
//! - `problem`: the indexed view, internal schedules and the accounting rules;
//! - `heuristic`: run-now baseline and the constructive heuristic;
//! - `improve`: local search over a complete plan (ejection moves, ruin and recreate);
//! - `sites`: the exact MILP over each site's resident jobs, the other jobs fixed;
//! - `milp`: the exact MILP, its LP relaxation, RINS and the site-held MILP over it;
//! - `colgen`: column generation over per-job schedules and its Lagrangian bound;
//! - `lagrange`: the relaxed and real per-job pricing programmes, the subgradient Lagrangian
//!   bound and prices for large instances;
//! - `master`: the master LP over those programmes' schedules (the Lagrangian dual to its
//!   optimum) and the restricted master MILP over the real ones;
//! - `subsets`: the bound from groups of jobs solved exactly on their own (superadditivity);
//! - `gap`: where a plan's gap lies against the Lagrangian bound at the bound's prices;
//! - `validate`: the independent oracle.

// Rationale: the model indexes several parallel arrays by site and slot; index loops say so.
#![allow(clippy::needless_range_loop)]

mod colgen;
mod crowding;
mod exchange;
mod gap;
mod heuristic;
mod improve;
pub mod instance;
mod lagrange;
mod master;
mod milp;
pub mod plan;
mod problem;
mod sites;
mod subsets;
pub mod validate;

pub use gap::{GapBreakdown, JobAbove, SiteGap};
pub use instance::{CarbonSignal, GpuModel, Instance, InstanceError, Job, Params, Site, UtcTime};
pub use plan::{Assignment, Infeasible, Metrics, Migration, Plan};
pub use validate::{SiteSeries, Validation, validate};

use problem::{Problem, Schedule};

/// Share of the time limit given to the column-generation master MILP (used when there are more
/// than twice `NEIGHBOURHOOD_JOBS` jobs); the rest goes to neighbourhood search when the plan is
/// not proven optimal.
const FULL_MILP_SHARE: f64 = 0.3;
/// HiGHS time limit for one neighbourhood MILP, seconds.
const NEIGHBOURHOOD_LIMIT_S: f64 = 1.0;
/// Least time left of a caller's budget worth another neighbourhood MILP, seconds.
const NEIGHBOURHOOD_LEAST_S: f64 = 0.1;
/// Jobs re-optimised together in one neighbourhood.
const NEIGHBOURHOOD_JOBS: usize = 6;
/// Jobs re-optimised together in one neighbourhood when the runs on which the plan agrees with
/// the LP relaxation stay fixed.
const RINS_NEIGHBOURHOOD_JOBS: usize = 16;

/// Subgradient iterations between two constructions at the Lagrangian prices.
const DUAL_ROUND_ITERATIONS: usize = 100;

/// Above this many jobs, `Auto` skips column generation and the compact LP bound: the
/// heuristic plans, the Lagrangian dual bounds it and prices guide its improvement.
const LARGE_JOBS: usize = 200;
/// Above this many run variables, a fleet on column generation's path under a caller's budget
/// spends what column generation and the master LP leave on the large fleets' steps (column
/// exchange, site MILPs, randomised search) instead of RINS, the neighbourhood MILPs and the
/// exact MILP in the time left. Rationale (docs/benchmarks.md, "Medium fleets"): on seven
/// 110-200-job draws of 4-8 sites (20,000-47,000 run variables) those steps gave plans 0.05-2.6 %
/// lower in 30 s on six and 0.02 % higher on one; on four 70-120-job draws of 2-4 sites (5,000-
/// 13,000), where the MILPs reach further, 0.7 % lower to 0.8 % higher. S (8,672) keeps its
/// path.
const MEDIUM_SEARCH_RUN_VARIABLES: usize = 20_000;
/// On that path column generation's LP rounds end at this share of the budget (its master MILP
/// then runs over the columns so far), so that the master LP and the large fleets' steps keep
/// their seconds. Rationale (docs/benchmarks.md, "A solve stops at its gap target"): on a
/// 120-job, 8-site draw the rounds took 13 s of 30 and column generation 21-23 s, the master LP
/// the rest, and the plan ended 7.2-8.0 % above its bound; with the rounds ended at 30 % it
/// ends 4.4-4.5 % above, and 1.9 % against 2.2-3.6 % on a 130-job draw; two others no worse.
const MEDIUM_COLGEN_ROUNDS_SHARE: f64 = 0.3;
/// Above this many run variables (job x slot x pool x power level within the jobs' windows),
/// `Auto` takes the large-instance path too, whatever the number of jobs: column generation's
/// pricing and the compact LP grow with them (measured in `docs/benchmarks.md`).
const LARGE_RUN_VARIABLES: usize = 50_000;

/// Share of a caller's budget the final pricings of the bound may take together when the cell
/// estimate's grid priced quickly (see `lagrange::Grid::doubled`).
const FINAL_REFINE_SHARE: f64 = 0.05;
/// A doubled work grid's pricing time against the last one's, as the refinements predict it:
/// the programmes' cells double and the options per slot stay the same (on the benchmark's
/// 1,000-job size 16 times finer priced in 0.20 s, 32 times finer in 0.39 s).
const REFINE_GROWTH: f64 = 2.0;
/// Share of a caller's budget the final evaluation may spend, after its refinements, pricing
/// the migratable jobs with their moves' losses and costs (`lagrange::moves_bound`).
/// Rationale: on the benchmark's 1,000-job size the 307 jobs whose free-move schedule moved
/// take about 3 s with the refinements; at 3 % of the budget 205-273 of them were priced,
/// and once each move's transfer energy is priced the rest lift the bound by 0.2-0.3 kg more
/// (docs/benchmarks.md).
const MOVES_BOUND_SHARE: f64 = 0.08;

/// Share of the time limit given to the MILP over the master LP's real schedules.
const RESTRICTED_MILP_SHARE: f64 = 0.2;
/// Share of the caller's budget (see [`Stop::budget`]) after which the Lagrangian rounds and
/// their constructions end, so the final pricing of the bound (about 5 % of the time limit:
/// `lagrange::FINAL_CELLS_PER_LIMIT_S`) ends within the limit.
const ROUNDS_SHARE: f64 = 0.93;
/// Share of what is left of a caller's budget, from the stall of the coarse rounds to
/// `ROUNDS_SHARE`, that the Lagrangian rounds on the finer grid take on large fleets; the rest
/// goes to the site MILPs and the local search's randomised ruin and recreate (which runs until
/// the budget ends). Rationale: on M (coarse stall at 4 s of 30 s) the finer rounds' last half
/// lifts the bound by about 0.5 kg while the search lowers the plan by about 2.2 kg; on L the
/// coarse rounds stall at about 60 % of the limit, and a fixed end for the finer rounds at 43 %
/// left them no round there, so the final bound was priced at the coarse rounds' prices: 70
/// fine iterations in 36 s lift it from 3,592.2 to 3,599.9 kg for about 1 kg of plan (M: 5.62-
/// 5.68 % either way; measured in docs/benchmarks.md).
const FINE_ROUNDS_SHARE: f64 = 0.5;
/// Share of the time the column exchange leaves on large fleets under a budget that goes to
/// the site MILPs (`sites`), before the local search, which gets the rest. Rationale: on a
/// 166-job, 2-site fleet (the large path forced) the site MILPs took the plan from 31.8 to
/// 31.1 kg; on M their gain is within the search's variance (docs/benchmarks.md).
const SITE_SEARCH_SHARE: f64 = 0.4;
/// Share of the time the Lagrangian rounds leave on large fleets under a budget that goes to
/// the column exchange (`exchange`), before the site MILPs and the local search. Rationale: on
/// the benchmark's 1,000-job size the exchange lowers the plan by about 1.7 kg in its 6 s and
/// the search by about 1.4 kg in the 6 s after it, where the search alone gained 2.1 kg in 12
/// s; the exchange ends early where its groups stop paying (docs/benchmarks.md).
const EXCHANGE_SHARE: f64 = 0.5;
/// Most randomised ruin-and-recreate moves per second of the time limit on large fleets under
/// a budget: the budget ends them, and the count only where the budget's clock stands still.
/// Rationale: M's search makes a million moves of 2-4 jobs in about 33 s, so a fixed cap of a
/// million ended a 300 s solve of M at 85 s; this is six times M's rate (docs/benchmarks.md).
const LNS_RUINS_PER_LIMIT_S: f64 = 200_000.0;
/// The fewest moves that cap allows, whatever the limit.
const LNS_LEAST_RUINS: usize = 1_000_000;
/// With jobs left out, the share of a caller's budget the large fleets' local search leaves
/// to serving them once the plan has made room. The late admission may also run up to this
/// share past the budget (the small fleets' steps use it to the end), and the one pricing that
/// counts the jobs it served in the bound does not ask the stop signal: its cells are capped
/// by [`LATE_BOUND_CELLS_SHARE`] instead (on `gridlimit`, 30 s, both ended within 0.1 s).
const LATE_ADMIT_SHARE: f64 = 0.02;
/// With jobs left out, the share of a large fleet's budgeted local search after which it
/// stops to serve what it can of them, then searches on with them served. Rationale: on a
/// fleet too busy to serve every job (3,000 jobs on 8 sites of 8 GPUs over 192 slots), the
/// jobs served only at the end stayed where they first fitted, several kg above their
/// cheapest at the bound's prices (docs/benchmarks.md).
const MIDWAY_ADMIT_SHARE: f64 = 0.5;
/// The share of the final evaluation's cells ([`lagrange::FINAL_CELLS_PER_LIMIT_S`]) the bound
/// over the jobs served once the late admission has served more may price (the coarse grid
/// where even the fine one exceeds it).
const LATE_BOUND_CELLS_SHARE: f64 = 0.2;
/// Step scale of the subgradient ascent when it starts at the master LP's prices.
const MASTER_START_SCALE: f64 = 0.05;
/// A round of the Lagrangian ascent that lifts the bound by less than this share of the gap
/// has stalled on its work grid.
const STALL_SHARE: f64 = 0.02;
/// On large fleets under a budget, a round on the finer grid (after its first) that lifts the
/// bound by less than this share of the gap ends the rounds. Rationale: on the benchmark's
/// 1,000-job size the third and later finer rounds lift the bound by 0.003-0.09 kg of a 21-23 kg
/// gap, about 2.5 s each, and the final bound, priced at their prices on finer grids, by no more;
/// the column exchange and the search lower the plan by more in those seconds: over three draws
/// the gap fell by 0.05-0.16 points on average (four runs against seven or more) and on none
/// rose. At [`STALL_SHARE`] itself the rounds ended a round earlier and one draw's gap rose by
/// 0.19 points, its last rounds' constructions having found a better plan (docs/benchmarks.md).
const SETTLE_SHARE: f64 = 0.005;

/// Subgradient iterations of the bound a large instance gets when no step computed one (the
/// heuristic alone): about 4 s on the benchmark's 10,000-job size.
const QUICK_DUAL_ITERATIONS: usize = 20;

/// Share of the time limit given to each RINS solve (the MILP over the runs on which the plan
/// and the compact LP relaxation disagree), taken from the neighbourhood search.
const RINS_SHARE: f64 = 0.3;
/// Most RINS solves; another follows only when the last one improved the plan.
const RINS_ROUNDS: usize = 3;
/// Under a caller's budget, a RINS solve whose share would leave less than this many seconds
/// gets all that is left: one neighbourhood MILP's limit (`NEIGHBOURHOOD_LIMIT_S`), below which
/// the neighbourhoods after it would have no full solve. Rationale: on S's published draw
/// RINS starts about 3.2 s into a 5 s solve on a slower machine, and its 1.5 s share found
/// nothing where 1.7 s found a better plan (27.184-27.188 kg against 27.198 kg); the 0.2 s it
/// left the neighbourhoods gained nothing (docs/benchmarks.md).
const RINS_ALL_BELOW_S: f64 = NEIGHBOURHOOD_LIMIT_S;

/// Least time a caller's budget must have left after the other steps for the exact MILP over
/// the served jobs to run in it, seconds (below it HiGHS would not finish its root).
const LEFTOVER_MILP_MIN_S: f64 = 2.0;
/// Share of that time given to HiGHS; the rest covers building the model and what follows.
const LEFTOVER_MILP_SHARE: f64 = 0.9;
/// Least time the neighbourhood search's share must leave of a caller's budget for the exact
/// MILP to get it; below it the neighbourhoods take all that is left, seconds. Rationale: on
/// S's 50 jobs x 48 slots the exact MILP's root cuts took over 20 s to lift the bound by 9 g;
/// on one S draw, given 2.7 s, the exact MILP found nothing where the neighbourhoods took the
/// plan from 2.8 % to 0.8 % above its bound, and whether it got them hung on a few
/// milliseconds when this threshold was the 2 s floor above (docs/benchmarks.md). On 30-job
/// fleets, where it gets 10 s and more, its cuts lift the bound. The threshold moves the edge
/// between the two, it does not remove it.
const NEIGHBOURHOODS_ALL_BELOW_S: f64 = 3.0;

/// Most relative gap at which a MILP over part of the plan stops (see `sub_gap` in [`solve`]).
/// Rationale: S's benchmark asks for 0.1 %, and RINS then stopped at once, its neighbourhood's
/// incumbent within 0.1 % of the neighbourhood's bound, where `windfall solve` (0.01 %) gained
/// 0.013 kg.
const SUB_MILP_REL_GAP: f64 = 1e-4;
/// Least time given to the LP relaxation that bounds a plan when no other step gave a bound,
/// seconds.
const LP_BOUND_MIN_TIME_S: f64 = 10.0;
/// Least time left of a caller's budget worth giving the LP relaxation when another step has
/// bounded the plan already, seconds; with less it is skipped. Rationale: on a 166 x 4 x 48
/// instance with a 30 s limit the LP, given the whole limit again after column generation and
/// the master LP had taken 17 s, ran the solve to 39.7 s for no better bound.
const LP_LEAST_LEFT_S: f64 = 0.5;
/// Seconds the bound from groups of jobs solved on their own (`subsets`) leaves of the caller's
/// budget, on the second core beside the plan's steps: HiGHS may overrun its limit by a little.
const GROUP_BOUND_MARGIN_S: f64 = 0.15;
/// Share of the caller's budget past its end that a solve still waits for the groups' bound,
/// and how often it looks, milliseconds. Rationale: on a 140-job draw over 72 slots the groups'
/// last MILP (built just before its limit) held a 30 s solve to 32.5 s for no bound; on S the
/// groups' bound, which S's 0.1 % needs, is in by the end of the budget.
const GROUP_WAIT_GRACE_SHARE: f64 = 0.02;
const GROUP_WAIT_POLL_MS: u64 = 5;
/// Share of the time limit the groups' MILPs may take in all for a caller without a budget.
const GROUP_BOUND_SHARE: f64 = 0.3;

/// Which algorithm `solve` may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// The heuristic, then the exact MILP started from it on up to 12 jobs, column generation
    /// and rounds of the Lagrangian bound with constructions at its prices up to 200 jobs and
    /// 50,000 run variables (job x slot x pool x power level in the windows), the Lagrangian
    /// rounds alone above (then, under a [`Stop::budget`], the site MILPs); local search, RINS
    /// and neighbourhood search use what time is left,
    /// and up to 200 jobs the exact MILP over the served jobs what a [`Stop::budget`] still
    /// has after them (for its bound).
    #[default]
    Auto,
    /// The constructive heuristic alone.
    Heuristic,
    /// The heuristic, then column generation and neighbourhood search at any size (`Auto` uses
    /// the exact MILP instead on up to 12 jobs).
    ColumnGeneration,
    /// The heuristic, then the Lagrangian bound and a construction at its prices, at any size
    /// (`Auto` does this above 200 jobs or 50,000 run variables).
    Lagrangian,
    /// The heuristic, then the direct time-indexed MILP over every job with the whole time
    /// limit, at any size (no neighbourhood search): the reference the benchmark compares with.
    DirectMilp,
}

/// How hard to try.
#[derive(Clone, Debug)]
pub struct SolveOptions {
    /// Wall-time budget for the MILP, seconds.
    pub time_limit_s: f64,
    /// Relative gap at which the MILP stops as optimal.
    pub mip_rel_gap: f64,
    /// Algorithm choice.
    pub method: Method,
    /// Print the MILP solver's log to standard output.
    pub log: bool,
    /// Compute a lower bound (an LP relaxation, and the master LP with its restricted MILP)
    /// when the plan is not proven optimal. Rolling re-planning that only needs the plan turns
    /// it off.
    pub bound: bool,
    /// Most column-generation rounds (each re-solves the master LP and prices every job); the
    /// solver has no clock, so this is how a caller bounds the pricing work.
    pub max_colgen_rounds: usize,
    /// Most subgradient iterations of the Lagrangian bound (each prices every job once).
    pub max_dual_iterations: usize,
    /// Most rounds of the Lagrangian master LP (each solves the LP and prices every job once).
    pub max_master_rounds: usize,
    /// Asked between steps of the solver's own loops (heuristic rounds, dual iterations,
    /// neighbourhoods); when it answers `true` the solver finishes with what it has. The solver
    /// reads no clock: a caller that wants a wall-time limit passes one that does, best made
    /// with [`Stop::budget`] so that long phases can leave the end of the limit to the steps
    /// after them.
    pub stop: Stop,
    /// Told what each finished step reached (its plan and bound, kg), for a caller that shows
    /// progress on long solves; the default tells no one.
    pub progress: Progress,
}

/// A caller's stop signal (see [`SolveOptions::stop`]); the default never stops.
///
/// A signal made with [`Stop::budget`] also tells how much of the caller's budget has passed,
/// so the solver can end a long phase early and keep the rest for the steps that must follow
/// it (the final pricing of the bound), and can give the time its steps leave to an exact
/// MILP; one made with [`Stop::new`] only says "stop now".
#[derive(Clone, Default)]
pub struct Stop(Option<StopKind>);

#[derive(Clone)]
enum StopKind {
    Now(std::sync::Arc<dyn Fn() -> bool + Send + Sync>),
    Budget(std::sync::Arc<dyn Fn() -> f64 + Send + Sync>),
}

impl Stop {
    /// A signal that asks `f` whether to stop now.
    pub fn new(f: impl Fn() -> bool + Send + Sync + 'static) -> Stop {
        Stop(Some(StopKind::Now(std::sync::Arc::new(f))))
    }

    /// A signal over a budget: `f()` answers the share of it that has passed (0 at the start,
    /// 1 or more once it is spent); the solver stops at 1.
    pub fn budget(f: impl Fn() -> f64 + Send + Sync + 'static) -> Stop {
        Stop(Some(StopKind::Budget(std::sync::Arc::new(f))))
    }

    /// Whether the caller wants the solver to stop now.
    pub fn now(&self) -> bool {
        self.at(1.0)
    }

    /// Whether `share` of the caller's budget has passed; for a signal made with
    /// [`Stop::new`], whether it wants the solver to stop now.
    pub fn at(&self, share: f64) -> bool {
        match &self.0 {
            None => false,
            Some(StopKind::Now(f)) => f(),
            Some(StopKind::Budget(f)) => f() >= share,
        }
    }

    /// The share of the budget that has passed, for a signal made with [`Stop::budget`].
    pub fn passed(&self) -> Option<f64> {
        match &self.0 {
            Some(StopKind::Budget(f)) => Some(f()),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        hook_fmt(f, "Stop", self.0.is_some(), "never")
    }
}

/// Debug output of a caller's hook: whether one is set.
fn hook_fmt(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    set: bool,
    unset: &str,
) -> std::fmt::Result {
    write!(f, "{name}({})", if set { "caller" } else { unset })
}

/// A caller's progress sink (see [`SolveOptions::progress`]); the default drops the messages.
#[derive(Clone, Default)]
pub struct Progress(Option<std::sync::Arc<ProgressFn>>);

/// What a [`Progress`] sink calls with each message.
type ProgressFn = dyn Fn(&str) + Send + Sync;

impl Progress {
    /// A sink that hands each message to `f`.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Progress {
        Progress(Some(std::sync::Arc::new(f)))
    }

    /// Reports the message `message` builds, built only when someone listens.
    fn report(&self, message: impl FnOnce() -> String) {
        if let Some(f) = &self.0 {
            f(&message());
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        hook_fmt(f, "Progress", self.0.is_some(), "none")
    }
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            time_limit_s: 30.0,
            mip_rel_gap: 1e-4,
            method: Method::Auto,
            log: false,
            bound: true,
            max_colgen_rounds: 400,
            max_dual_iterations: 300,
            max_master_rounds: 200,
            stop: Stop::default(),
            progress: Progress::default(),
        }
    }
}

/// A plan with its metrics.
#[derive(Clone, Debug)]
pub struct Solution {
    /// The plan in the public format.
    pub plan: Plan,
    /// Its metrics (`solve_seconds` is left at 0 for the caller to fill in).
    pub metrics: Metrics,
    /// Where its gap lies against the Lagrangian bound at the bound's prices, on the paths
    /// that price (Lagrangian and column generation).
    pub gap_breakdown: Option<GapBreakdown>,
}

/// Plans an instance. Jobs that cannot be served are reported by id with a reason and the rest
/// are still planned. Deterministic: the same instance and options give the same plan, unless the
/// MILP stops on its time limit.
pub fn solve(instance: &Instance, options: &SolveOptions) -> Solution {
    let problem = Problem::new(instance);
    let n_jobs = problem.jobs.len();
    let mut infeasible: Vec<Infeasible> = Vec::new();
    let mut skip = vec![false; n_jobs];
    for (job, skipped) in skip.iter_mut().enumerate() {
        if let Some(reason) = heuristic::alone_infeasibility(&problem, job) {
            infeasible.push(reason);
            *skipped = true;
        }
    }

    // The jobs a plan leaves out: those no plan can serve, then the given ones. Every
    // candidate plan lists both, or the validator rightly rejects it for the former.
    let alone_infeasible = infeasible;
    let named = |jobs: &[(usize, String)]| -> Vec<Infeasible> {
        let mut named = alone_infeasible.clone();
        named.extend(jobs.iter().map(|(j, reason)| Infeasible {
            job: instance.jobs[*j].id.clone(),
            reason: reason.clone(),
        }));
        named
    };
    let stop = || options.stop.now();
    // The gap at which a MILP over part of the plan (a neighbourhood, a site, RINS's free
    // runs, the master's columns) stops: that part's optimum proves nothing about the plan's,
    // so it searches to the tolerance the plan is judged by or tighter.
    let sub_gap = options.mip_rel_gap.min(SUB_MILP_REL_GAP);
    // Seconds left of a caller's budget (unbounded without one): no HiGHS solve is given more.
    let budget = milp::Budget {
        stop: &options.stop,
        limit_s: options.time_limit_s,
    };
    let left_s = || budget.left_s();
    // A fleet too large for column generation and the compact LP, whatever the method.
    let n_run_variables = run_variables(&problem, &skip);
    let large_size =
        skip.iter().filter(|s| !**s).count() > LARGE_JOBS || n_run_variables > LARGE_RUN_VARIABLES;
    let large =
        options.method == Method::Lagrangian || (options.method == Method::Auto && large_size);
    // A large fleet under a caller's budget: its local search gets a share of the budget for
    // randomised ruin and recreate.
    let budgeted_search = large && options.stop.passed().is_some();
    let (mut heuristic_schedule, mut heuristic_failed) =
        heuristic::construct(&problem, &skip, large, &stop);
    let mut method = "heuristic".to_string();
    let kg = |schedule: &Schedule| problem.evaluate(schedule).objective_g / 1000.0;
    let progress = &options.progress;
    progress.report(|| {
        format!(
            "heuristic: {:.3} kg, {} job(s) left out",
            kg(&heuristic_schedule),
            heuristic_failed.len()
        )
    });
    // Plan stability: the previous plan's runs, for every job they still finish, with the
    // heuristic's runs for the rest, start the search when that is valid and cheaper.
    if !instance.previous_assignments.is_empty() {
        let mut kept = Schedule {
            runs: vec![None; n_jobs],
        };
        for job in (0..n_jobs).filter(|&j| !skip[j]) {
            let runs = problem.previous_runs(job);
            let finishes = heuristic::progress(&problem, job, &runs)
                .is_some_and(|(done_h, _)| done_h + 1e-9 >= problem.jobs[job].work_hours);
            if !runs.is_empty() && finishes {
                kept.runs[job] = Some(runs);
            }
        }
        let (completed, completed_failed) = heuristic::complete(&problem, &skip, &kept);
        let better = (
            completed_failed.len(),
            problem.evaluate(&completed).objective_g,
        ) < (
            heuristic_failed.len(),
            problem.evaluate(&heuristic_schedule).objective_g,
        );
        if completed != heuristic_schedule
            && better
            && validate(
                instance,
                &problem.to_plan(&completed, &named(&completed_failed)),
            )
            .valid
        {
            heuristic_schedule = completed;
            heuristic_failed = completed_failed;
            method = "previous plan (completed by the heuristic)".to_string();
        }
    }
    let start_name = method.clone();
    let mut chosen = heuristic_schedule.clone();
    let mut unserved: Vec<(usize, String)> = heuristic_failed.clone();
    let mut proven_optimal = false;
    let mut milp_bound: Option<f64> = None;

    // Small instances get the whole limit for the exact MILP: neighbourhoods would cover most of
    // them anyway.
    let n_included = skip.iter().filter(|s| !**s).count();
    let full_milp_share =
        if n_included <= 2 * NEIGHBOURHOOD_JOBS || options.method == Method::DirectMilp {
            1.0
        } else {
            FULL_MILP_SHARE
        };
    let mut colgen_bound: Option<f64> = None;
    let use_colgen = options.method == Method::ColumnGeneration
        || (options.method == Method::Auto && n_included > 2 * NEIGHBOURHOOD_JOBS && !large);
    let full_milp_share = if use_colgen {
        FULL_MILP_SHARE
    } else {
        full_milp_share
    };
    // A medium fleet with many run variables under a caller's budget: after column generation
    // and the master LP it takes the large fleets' steps (column exchange, site MILPs,
    // randomised search) instead of the compact LP, RINS, the neighbourhood MILPs and the exact
    // MILP in the time left.
    let medium_search = use_colgen
        && options.stop.passed().is_some()
        && n_run_variables > MEDIUM_SEARCH_RUN_VARIABLES;
    let budgeted_search = budgeted_search || medium_search;
    // The compact LP relaxation that RINS fixes against needs only the served jobs, so it
    // starts on a core that column generation's pricing leaves idle (up to 127 jobs it prices
    // on one thread) while column generation and the master LP run. Rationale: on S RINS then
    // starts 0.2 s earlier, where it ends within a tenth of a second of the budget on slower
    // machines; beside pricing on both cores (200 jobs) it found nothing and added 500 MiB to the
    // peak.
    let mut early_compact = (use_colgen
        && !medium_search
        && options.bound
        && lagrange::pricing_threads(n_included)
            < std::thread::available_parallelism().map_or(1, |n| n.get()))
    .then(|| {
        let served: Vec<bool> = heuristic_schedule
            .runs
            .iter()
            .map(Option::is_some)
            .collect();
        EarlyCompactLp::spawn(instance, served, options)
    });
    // The compact LP over the jobs with `served[j]`: the early one when it covers them, else
    // solved now.
    let compact_over =
        |early: &mut Option<EarlyCompactLp>, served: &[bool], bounded: bool, left_s: f64| {
            early
                .take()
                .and_then(|early| early.take(served))
                .or_else(|| compact_relaxation(&problem, served, options, bounded, left_s))
        };
    if use_colgen {
        // Column generation over the jobs the heuristic placed, seeded with its plan.
        let include: Vec<bool> = (0..n_jobs)
            .map(|j| heuristic_schedule.runs[j].is_some())
            .collect();
        // On the medium path its rounds end at MEDIUM_COLGEN_ROUNDS_SHARE of the budget.
        let rounds_end = if medium_search {
            MEDIUM_COLGEN_ROUNDS_SHARE
        } else {
            1.0
        };
        let rounds_stop = || options.stop.at(rounds_end);
        let config = colgen::ColgenConfig {
            mip_time_limit_s: options.time_limit_s * full_milp_share,
            mip_rel_gap: options.mip_rel_gap,
            log: options.log,
            max_rounds: options.max_colgen_rounds,
            stop: &rounds_stop,
        };
        match colgen::solve(&problem, &include, &heuristic_schedule, &config) {
            Ok(outcome) => {
                colgen_bound = outcome.lower_bound_g;
                let summary = format!(
                    "column generation ({} columns, {} rounds{})",
                    outcome.columns,
                    outcome.rounds,
                    if outcome.converged {
                        ""
                    } else {
                        ", stopped before convergence"
                    }
                );
                method = format!("{start_name}, then {summary} found nothing better");
                if let Some(schedule) = outcome.schedule {
                    let candidate = problem.to_plan(&schedule, &named(&unserved));
                    let objective = problem.evaluate(&schedule).objective_g;
                    let current = problem.evaluate(&chosen).objective_g;
                    if objective < current && validate(instance, &candidate).valid {
                        chosen = schedule;
                        method = summary;
                    }
                }
                if let Some(bound) = colgen_bound {
                    let objective = problem.evaluate(&chosen).objective_g;
                    proven_optimal = within_gap(objective, bound, options.mip_rel_gap);
                }
                progress.report(|| {
                    format!(
                        "column generation: {:.3} kg, bound {}",
                        kg(&chosen),
                        bound_kg(colgen_bound)
                    )
                });
            }
            Err(err) => method = format!("{start_name} (column generation: {err})"),
        }
    } else if matches!(options.method, Method::Auto | Method::DirectMilp) && !large {
        let include: Vec<bool> = skip.iter().map(|s| !s).collect();
        // Under a caller's budget the model's build counts: a fleet's direct MILP (millions of
        // columns) takes seconds to build before HiGHS's own clock starts.
        let config = milp::MilpConfig {
            budget: Some(budget),
            time_limit_s: options.time_limit_s * full_milp_share,
            mip_rel_gap: options.mip_rel_gap,
            relax: false,
            soft_work: true,
            log: options.log,
        };
        match milp::solve(&problem, &include, Some(&heuristic_schedule), None, &config) {
            Ok(outcome) => {
                milp_bound = outcome.lower_bound_g;
                if let Some(schedule) = outcome.schedule {
                    let reason = if outcome.proven_optimal {
                        "cannot be fitted alongside the other jobs: the GPUs or grid headroom it needs before its deadline are taken"
                    } else {
                        "not placed: no plan found within the time limit fits it alongside the other jobs (GPUs or grid headroom before its deadline)"
                    };
                    let candidate_unserved: Vec<(usize, String)> = outcome
                        .unserved
                        .iter()
                        .map(|&j| (j, reason.to_string()))
                        .collect();
                    let candidate_plan = problem.to_plan(&schedule, &named(&candidate_unserved));
                    // The MILP answer must pass the independent validator before it is used.
                    if validate(instance, &candidate_plan).valid {
                        proven_optimal = outcome.proven_optimal;
                        method = if outcome.proven_optimal {
                            "milp".to_string()
                        } else if schedule == heuristic_schedule {
                            format!(
                                "{start_name} (the MILP found nothing better within the time limit)"
                            )
                        } else {
                            "milp (time limit; best plan found)".to_string()
                        };
                        chosen = schedule;
                        unserved = candidate_unserved;
                    } else {
                        method = format!("{start_name} (the MILP plan failed validation)");
                    }
                } else {
                    method = format!("{start_name} (the MILP found no plan within the time limit)");
                }
            }
            Err(err) => method = format!("{start_name} (MILP: {err})"),
        }
    }

    for (job, _) in &unserved {
        chosen.runs[*job] = None;
    }
    // Admission moves for the jobs `unserved` leaves out of `chosen` (at every site in turn
    // where the cheapest fails, with `every_site`): the plan, the jobs still left out and the
    // jobs it served, when it serves some and the validator accepts it.
    let serve_left_out = |chosen: &Schedule,
                          unserved: &[(usize, String)],
                          every_site: bool,
                          stop: &(dyn Fn() -> bool + Sync)| {
        let left_out: Vec<usize> = unserved.iter().map(|(j, _)| *j).collect();
        let (admitted, served) = improve::admit(&problem, chosen, &left_out, every_site, stop);
        let still: Vec<(usize, String)> = unserved
            .iter()
            .filter(|(j, _)| !served.contains(j))
            .cloned()
            .collect();
        (!served.is_empty()
            && validate(instance, &problem.to_plan(&admitted, &named(&still))).valid)
            .then_some((admitted, still, served))
    };
    // The jobs the first plan leaves out, unless an exact MILP proved it right, each get an
    // ejection move that serves them by moving the jobs in their way.
    if !unserved.is_empty() && !proven_optimal && !stop() {
        let left_out = unserved.len();
        if let Some((admitted, still, _)) = serve_left_out(&chosen, &unserved, false, &stop) {
            method = format!(
                "{method}, then {} job(s) it left out served by moving others",
                left_out - still.len()
            );
            chosen = admitted;
            unserved = still;
        }
        progress.report(|| {
            format!(
                "{} of {} job(s) left out now served: {:.3} kg",
                left_out - unserved.len(),
                left_out,
                kg(&chosen)
            )
        });
    }
    // From here the jobs left out are fixed: a step's plan replaces the chosen one when it
    // costs less and the validator accepts it.
    let unserved = unserved;
    let fixed_served: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
    // The jobs column generation's bound covers.
    let heuristic_served: Vec<bool> = heuristic_schedule
        .runs
        .iter()
        .map(Option::is_some)
        .collect();
    let improves = |candidate: &Schedule, chosen: &Schedule| {
        problem.evaluate(candidate).objective_g < problem.evaluate(chosen).objective_g
            && validate(instance, &problem.to_plan(candidate, &named(&unserved))).valid
    };
    let mut dual_bound: Option<f64> = None;
    // The bound from groups of jobs solved on their own, on a thread of its own, with the jobs
    // it covers.
    let mut group_thread: Option<GroupThread> = None;
    let mut restricted_share = 0.0;
    // The Lagrangian prices at the best bound, when there are any: what a GPU-slot (and a kW)
    // is worth to other jobs.
    let mut best_prices: Option<heuristic::Prices> = None;
    // The bound's terms at those prices, per job, from their last pricing.
    let mut final_terms: Option<lagrange::BoundTerms> = None;
    // Column generation's plan can gain from the same rounds (they are cheap next to it).
    if large || (use_colgen && !proven_optimal) {
        // Rounds of subgradient ascent, each followed by a construction at the best prices so
        // far; each new plan sharpens the next round's step target.
        let include: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
        let skip_now: Vec<bool> = include.iter().map(|i| !i).collect();
        // A construction at `prices`, guided by the relaxed schedules at them: its plan when
        // it serves every job and improves on `chosen`.
        let rebuild = |chosen: &Schedule,
                       prices: &heuristic::Prices,
                       relaxed: &Schedule,
                       stop: &(dyn Fn() -> bool + Sync)| {
            let (priced, failed) =
                heuristic::construct_priced(&problem, &skip_now, prices, relaxed, stop);
            (failed.is_empty() && improves(&priced, chosen)).then_some(priced)
        };
        let mut prices: Option<heuristic::Prices> = None;
        let (mut iterations, mut constructions) = (0, 0);
        let mut fine_iterations = 0;
        let mut scale = 1.0;
        let mut master_summary = String::new();
        let mut master_converged = false;
        if !large && options.bound && !stop() {
            // The master LP over the relaxed programmes: the Lagrangian dual to its optimum,
            // prices for a construction, and real schedules for a restricted master MILP.
            let config = master::MasterConfig {
                max_rounds: options.max_master_rounds,
                upper_g: problem.evaluate(&chosen).objective_g,
                rel_gap: options.mip_rel_gap,
                stop: &stop,
                log: options.log,
                hold_rest: false,
                start: None,
                real_each_round: true,
            };
            match master::solve(&problem, &include, &chosen, &config) {
                Ok(outcome) => {
                    master_summary = format!(
                        ", master LP ({} columns, {} rounds{})",
                        outcome.columns,
                        outcome.rounds,
                        if outcome.converged { ", converged" } else { "" }
                    );
                    dual_bound = outcome.bound_g;
                    master_converged = outcome.converged && outcome.bound_g.is_some();
                    if let Some(priced) = rebuild(&chosen, &outcome.prices, &outcome.relaxed, &stop)
                    {
                        chosen = priced;
                        constructions += 1;
                    }
                    let proven = dual_bound.is_some_and(|b| {
                        let objective = problem.evaluate(&chosen).objective_g;
                        within_gap(objective, b, options.mip_rel_gap)
                    });
                    if !proven && !stop() {
                        restricted_share = RESTRICTED_MILP_SHARE;
                        let n_real = outcome.restricted.len();
                        match outcome.restricted.solve(
                            &problem,
                            &chosen,
                            (options.time_limit_s * RESTRICTED_MILP_SHARE).min(left_s()),
                            sub_gap,
                            options.log,
                        ) {
                            Ok(Some(schedule)) if improves(&schedule, &chosen) => {
                                chosen = schedule;
                                master_summary.push_str(&format!(
                                    ", then a better plan from its {n_real} real schedules"
                                ));
                            }
                            Ok(_) => {}
                            Err(err) => {
                                master_summary.push_str(&format!(" (restricted master: {err})"))
                            }
                        }
                    }
                    progress.report(|| {
                        format!(
                            "master LP: {:.3} kg, bound {}",
                            kg(&chosen),
                            bound_kg(dual_bound)
                        )
                    });
                    group_thread =
                        spawn_group_bound(instance, &problem, &chosen, dual_bound, options);
                    prices = Some(outcome.prices);
                    // The subgradient starts at the master's prices, near the dual optimum.
                    scale = MASTER_START_SCALE;
                }
                Err(err) => master_summary = format!(", master LP: {err}"),
            }
        }
        // The rounds price on the coarse work grid until they stall (a round gains less than
        // STALL_SHARE of the gap, or its step has shrunk away), then on a finer grid where it
        // fits: its bound is a few per cent tighter than the coarse grid's at the same prices,
        // and a coarse round that stalls has little left to gain there. Twice the fine grid
        // where that fits, else the fine grid. Rationale: on M (30 s) the doubled grid ends
        // at a 314.7 kg bound against 313.9 kg on the fine grid and 314.3 kg four times finer:
        // finer prices outweigh the iterations the dearer pricing costs, up to a point.
        let stalled_grid = [lagrange::Grid::Finer(2), lagrange::Grid::Fine]
            .into_iter()
            .find(|&g| lagrange::grid_cells(&problem, &include, g) <= lagrange::FINE_MOST_CELLS);
        let mut grid = lagrange::Grid::Coarse;
        // The rounds leave the end of the caller's budget to the final pricing below. On
        // large fleets under a budget, once the rounds price on the finer grid they end
        // FINE_ROUNDS_SHARE of the way to ROUNDS_SHARE, leaving the rest to the local search.
        // The share of the budget at which the rounds end.
        let mut rounds_end = ROUNDS_SHARE;
        // The relaxed schedules of the last round, when its prices are the best and the
        // rounds ended before a construction at them.
        let mut unbuilt: Option<Schedule> = None;
        // A converged master has maximised the dual already.
        while !master_converged
            && iterations < options.max_dual_iterations
            && !(iterations > 0 && options.stop.at(rounds_end))
        {
            let current = problem.evaluate(&chosen).objective_g;
            let outcome = lagrange::dual_bound(
                &problem,
                &include,
                &chosen,
                &lagrange::DualConfig {
                    max_iterations: DUAL_ROUND_ITERATIONS
                        .min(options.max_dual_iterations - iterations),
                    upper_g: current,
                    rel_gap: options.mip_rel_gap,
                    stop: &|| options.stop.at(rounds_end),
                    start: prices.as_ref(),
                    start_scale: scale,
                    grid,
                },
            );
            iterations += outcome.iterations;
            if grid != lagrange::Grid::Coarse {
                fine_iterations += outcome.iterations;
            }
            scale = outcome.scale;
            let Some(bound) = outcome.bound_g else { break };
            let previous = dual_bound;
            let improved_bound = dual_bound.is_none_or(|b| bound > b);
            if improved_bound {
                dual_bound = Some(bound);
                prices = Some(heuristic::Prices {
                    gpu: outcome.gpu_price,
                    kw: outcome.kw_price,
                });
            }
            progress.report(|| {
                format!(
                    "Lagrangian bound ({} grid): {iterations} subgradient iteration(s), bound {}, plan {:.3} kg",
                    if grid != lagrange::Grid::Coarse { "fine" } else { "coarse" },
                    bound_kg(dual_bound),
                    kg(&chosen)
                )
            });
            if within_gap(current, bound, options.mip_rel_gap) {
                break;
            }
            let step_gone = scale < lagrange::MIN_STEP_SCALE;
            let mut stalled =
                step_gone || previous.is_some_and(|b| bound - b < STALL_SHARE * (current - bound));
            // A coarse round that has not stalled is weighed against the finer grid: one
            // pricing there at the best prices (a true bound too). When it lifts the bound by
            // more than the round did, the coarse grid's rounding is what holds the bound back,
            // and the rounds move on. Otherwise its value stays the bound, which the next
            // coarse round, rounded coarser, rarely beats: that round then counts as stalled
            // (its gain over the bound is below zero), keeps the prices it started from, and
            // the rounds move on after it. So once a finer grid fits, at most three coarse
            // rounds run (M and L ran three, where they ran four and seven before:
            // docs/benchmarks.md).
            if !stalled
                && grid == lagrange::Grid::Coarse
                && !options.stop.at(rounds_end)
                && let (Some(finer), Some(b), Some(best)) =
                    (stalled_grid, previous, prices.as_ref())
                && let Some(terms) = lagrange::finer_terms_on_grid(&problem, &include, best, finer)
            {
                let probe = terms.lagrangian_g();
                let best_bound = dual_bound.unwrap_or(bound);
                if probe > best_bound {
                    dual_bound = Some(probe);
                }
                stalled = probe - best_bound > bound - b;
            }
            // A stalled coarse round moves to the finer grid; the rounds end when their share
            // of the budget has passed or the step has shrunk away on the last grid.
            let finer = stalled_grid.filter(|_| stalled && grid == lagrange::Grid::Coarse);
            // On large fleets under a budget, a round on the finer grid (not its first) that
            // lifts the bound by less than SETTLE_SHARE of the gap ends the rounds: their
            // seconds go to the steps that lower the plan.
            let settled = budgeted_search
                && grid != lagrange::Grid::Coarse
                && fine_iterations > outcome.iterations
                && previous.is_some_and(|b| bound - b < SETTLE_SHARE * (current - bound));
            if options.stop.at(rounds_end) || (step_gone && finer.is_none()) || settled {
                unbuilt = improved_bound.then_some(outcome.relaxed);
                break;
            }
            if let Some(finer) = finer {
                grid = finer;
                scale = scale.max(MASTER_START_SCALE);
                if budgeted_search {
                    let passed = options.stop.passed().unwrap_or(0.0);
                    rounds_end = passed + FINE_ROUNDS_SHARE * (ROUNDS_SHARE - passed);
                }
            }
            if !improved_bound && constructions > 0 {
                continue;
            }
            if let Some(priced) = rebuild(
                &chosen,
                prices.as_ref().expect("set with the bound"),
                &outcome.relaxed,
                &|| options.stop.at(rounds_end),
            ) {
                chosen = priced;
                constructions += 1;
            }
            progress.report(|| format!("construction at the prices: plan {:.3} kg", kg(&chosen)));
        }
        // A construction at the best prices when the rounds ended before one: which plan the
        // rounds leave then does not hang on whether their last round ended in time for it.
        if let (Some(relaxed), Some(best)) = (unbuilt, prices.as_ref())
            && !stop()
        {
            if let Some(priced) = rebuild(&chosen, best, &relaxed, &stop) {
                chosen = priced;
                constructions += 1;
            }
            progress.report(|| {
                format!(
                    "construction at the best prices: plan {:.3} kg",
                    kg(&chosen)
                )
            });
        }
        // The best prices (the rounds' or the master's) once more on the finest work grid that
        // fits: a tighter bound for one pricing.
        let final_from = options.stop.passed();
        let most_cells = lagrange::FINAL_CELLS_PER_LIMIT_S * options.time_limit_s.max(1.0);
        if let Some(best) = prices.as_ref()
            && let Some((mut terms, mut grid)) =
                lagrange::final_bound(&problem, &include, best, most_cells)
        {
            // Under a caller's budget, the grid is doubled while the pricings so far and the
            // next one (about twice the last) fit FINAL_REFINE_SHARE of it: the cell estimate
            // above overstates what the pricing floor leaves to price on many fleets. Every
            // pricing is at the same prices, so each job keeps its best term over the grids
            // (a refinement past a job's least units need not nest in the last grid, and the
            // coarser grids price more migratable jobs with their moves' losses).
            let mut from = final_from;
            while let (Some(first), Some(last), Some(now), Some(finer)) =
                (final_from, from, options.stop.passed(), grid.doubled())
            {
                let next = REFINE_GROWTH * (now - last);
                if now - first + next > FINAL_REFINE_SHARE || now + next >= 1.0 {
                    break;
                }
                from = Some(now);
                match lagrange::finer_terms_on_grid(&problem, &include, best, finer) {
                    Some(finer_terms) => terms.merge(&finer_terms),
                    None => break,
                }
                grid = finer;
            }
            // The migratable jobs once more with their moves' least losses: under a budget
            // until MOVES_BOUND_SHARE more of it has passed, job by job; without one when its
            // cells fit the estimate the grid was chosen by.
            let (movers_priced, movers) = match final_from {
                Some(first) => {
                    let end = (first + FINAL_REFINE_SHARE + MOVES_BOUND_SHARE).min(1.0);
                    let stop = || options.stop.at(end);
                    if stop() {
                        (0, 0)
                    } else {
                        lagrange::moves_bound(&problem, best, grid, &stop, &mut terms)
                    }
                }
                None if lagrange::moves_cells(&problem, &terms, grid) <= most_cells => {
                    lagrange::moves_bound(&problem, best, grid, &|| false, &mut terms)
                }
                None => (0, 0),
            };
            let bound = terms.value_g();
            if dual_bound.is_none_or(|b| bound > b) {
                dual_bound = Some(bound);
            }
            progress.report(|| {
                format!(
                    "bound at the best prices, on grids up to {}, {movers_priced} of {movers} \
                     moving job(s) with their moves' losses: {:.3} kg",
                    match grid {
                        lagrange::Grid::Finer(n) => format!("{n} times finer"),
                        _ => "fine".to_string(),
                    },
                    bound / 1000.0
                )
            });
            final_terms = Some(terms);
        }
        best_prices = prices;
        let before = method.clone();
        let subgradient = if iterations > 0 {
            let fine = if fine_iterations > 0 {
                format!(", {fine_iterations} on the fine grid")
            } else {
                String::new()
            };
            format!(", Lagrangian bound ({iterations} subgradient iterations{fine})")
        } else {
            String::new()
        };
        method = format!(
            "{before}{master_summary}{subgradient}{}",
            if constructions > 0 {
                format!(", then {constructions} better plan(s) built at its prices")
            } else {
                String::new()
            }
        );
    }
    // The compact LP relaxation, once solved for RINS.
    let mut compact: Option<CompactLp> = None;
    // The exact MILP's bound over the jobs it covered, when it ran in the time left.
    let mut leftover_bound: Option<(f64, Vec<bool>)> = None;
    // Whether jobs left out were served after the Lagrangian bound (part-way through the
    // search or at the end), and the jobs still left out after the search's part-way admission.
    let mut late_admitted = false;
    let mut midway_unserved: Option<Vec<(usize, String)>> = None;
    // Whether a bound so far over the jobs `chosen` serves (column generation's over the jobs
    // the heuristic served, the Lagrangian's over those fixed above, `compact`'s over its own)
    // proves `chosen` within the caller's gap target: the steps below only lower the plan, so
    // they stop there, as a MILP stops at its gap.
    let target_met = |chosen: &Schedule, compact: Option<&CompactLp>| {
        let served: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
        let objective = problem.evaluate(chosen).objective_g;
        [
            colgen_bound.filter(|_| heuristic_served == served),
            dual_bound.filter(|_| fixed_served == served),
            compact
                .filter(|c| c.served == served)
                .and_then(|c| c.bound_g),
        ]
        .into_iter()
        .flatten()
        .any(|bound| within_gap(objective, bound, options.mip_rel_gap))
    };
    // Once the steps below find the target met: the seconds into the caller's budget then, if
    // it has a clock.
    let mut met_at: Option<Option<f64>> = None;
    let mut meets = |chosen: &Schedule, compact: Option<&CompactLp>| {
        if met_at.is_none() && target_met(chosen, compact) {
            met_at = Some(
                options
                    .stop
                    .passed()
                    .map(|share| share * options.time_limit_s),
            );
        }
        met_at.is_some()
    };
    if !matches!(options.method, Method::Heuristic | Method::DirectMilp)
        && !proven_optimal
        && !meets(&chosen, None)
    {
        // On large fleets under a budget, the site MILPs re-time and re-cap each site's jobs
        // first, in a share of the time left; the local search gets the rest. So do medium
        // ones with many run variables ([`MEDIUM_SEARCH_RUN_VARIABLES`]); on the others the
        // restricted master, RINS and the exact MILP in the time left re-plan every job
        // together.
        if budgeted_search && !stop() {
            let step_end_s = (1.0 - EXCHANGE_SHARE) * left_s();
            let outcome = exchange::search(
                &problem,
                &chosen,
                best_prices.as_ref(),
                sub_gap,
                &|| (left_s() - step_end_s).max(0.0),
                &stop,
            );
            if outcome.improvements > 0 && improves(&outcome.schedule, &chosen) {
                chosen = outcome.schedule;
                method = format!(
                    "{method}, then {} of {} column exchange(s) improved it",
                    outcome.improvements, outcome.groups
                );
            }
            progress.report(|| format!("column exchange: {:.3} kg", kg(&chosen)));
        }
        if budgeted_search && !stop() && !meets(&chosen, None) {
            let outcome = sites::search(
                &problem,
                &chosen,
                SITE_SEARCH_SHARE * left_s(),
                sub_gap,
                &stop,
            );
            if outcome.improvements > 0 && improves(&outcome.schedule, &chosen) {
                chosen = outcome.schedule;
                method = format!(
                    "{method}, then {} of {} site MILP(s) improved it",
                    outcome.improvements, outcome.solves
                );
            }
            progress.report(|| format!("site MILPs: {:.3} kg", kg(&chosen)));
        }
        // Randomised ruin and recreate on large fleets under a budget, until it ends.
        let ruins = if budgeted_search {
            LNS_LEAST_RUINS.max((LNS_RUINS_PER_LIMIT_S * options.time_limit_s) as usize)
        } else {
            0
        };
        // There the randomised moves alone: on the benchmark's 10,000 jobs the ejection pass
        // over every job gained 0.09 kg in the time the randomised moves gained 1.05 kg.
        let search_end = if unserved.is_empty() {
            1.0
        } else {
            1.0 - LATE_ADMIT_SHARE
        };
        // With jobs left out, a budgeted search stops part-way to serve what it can of them
        // (its moves may have made room), then goes on with them served, so that the jobs
        // served late are searched as well instead of staying where they first fitted.
        let left_out_ids: Vec<usize> = unserved.iter().map(|(j, _)| *j).collect();
        let admit_midway = budgeted_search
            && !left_out_ids.is_empty()
            && !proven_optimal
            && serving_only_adds(&problem, &left_out_ids);
        let first_end = match options.stop.passed() {
            Some(passed) if admit_midway => passed + MIDWAY_ADMIT_SHARE * (search_end - passed),
            _ => search_end,
        };
        let congestion = best_prices.as_ref().map(|p| p.gpu.as_slice());
        if !meets(&chosen, None) {
            let local = improve::improve(
                &problem,
                &chosen,
                congestion,
                &|| options.stop.at(first_end),
                ruins,
                !budgeted_search,
                &[],
            );
            if local.gain_g > 0.0 && improves(&local.schedule, &chosen) {
                chosen = local.schedule;
                method = format!("{method}, then {} local-search move(s)", local.moves);
            }
            progress.report(|| format!("local search: {:.3} kg", kg(&chosen)));
        }
        if admit_midway && !options.stop.at(search_end) && !meets(&chosen, None) {
            let search_stop = || options.stop.at(search_end);
            let mut still_out = unserved.clone();
            let mut admitted_now: Vec<usize> = Vec::new();
            if let Some((admitted, still, served)) =
                serve_left_out(&chosen, &unserved, true, &search_stop)
            {
                admitted_now = served;
                method = format!(
                    "{method}, then {} job(s) left out served part-way",
                    admitted_now.len()
                );
                chosen = admitted;
                still_out = still;
                late_admitted = true;
            }
            progress.report(|| {
                format!(
                    "{} of {} job(s) left out served part-way through the search: {:.3} kg",
                    admitted_now.len(),
                    left_out_ids.len(),
                    kg(&chosen)
                )
            });
            let local = improve::improve(
                &problem,
                &chosen,
                congestion,
                &search_stop,
                ruins,
                false,
                &admitted_now,
            );
            if local.gain_g > 0.0
                && problem.evaluate(&local.schedule).objective_g
                    < problem.evaluate(&chosen).objective_g
                && validate(
                    instance,
                    &problem.to_plan(&local.schedule, &named(&still_out)),
                )
                .valid
            {
                chosen = local.schedule;
                method = format!("{method}, then {} more local-search move(s)", local.moves);
            }
            progress.report(|| format!("local search with them: {:.3} kg", kg(&chosen)));
            midway_unserved = Some(still_out);
        }
        // RINS: the compact LP relaxation over the served jobs (also the plan's bound, below),
        // then the MILP over the runs on which it and the plan disagree, while that improves.
        let mut rins_share = 0.0;
        if !large && options.bound && !stop() && !meets(&chosen, None) {
            let served: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
            let bounded = milp_bound.is_some() || colgen_bound.is_some() || dual_bound.is_some();
            compact = compact_over(&mut early_compact, &served, bounded, left_s());
            progress.report(|| match &compact {
                Some(CompactLp {
                    bound_g: Some(bound),
                    relaxed: Some(_),
                    ..
                }) => format!("LP relaxation: {:.3} kg", bound / 1000.0),
                Some(_) => "LP relaxation: no optimum within its time, so no RINS".to_string(),
                None => "LP relaxation: none (too little of the budget left, or HiGHS failed), \
                         so no RINS"
                    .to_string(),
            });
            if let Some(relaxed) = compact.as_ref().and_then(|c| c.relaxed.as_ref()) {
                let config = milp::MilpConfig {
                    budget: None,
                    time_limit_s: options.time_limit_s * RINS_SHARE,
                    mip_rel_gap: sub_gap,
                    relax: false,
                    soft_work: false,
                    log: options.log,
                };
                let mut improvements = 0;
                for _ in 0..RINS_ROUNDS {
                    if stop() || meets(&chosen, compact.as_ref()) {
                        break;
                    }
                    rins_share += RINS_SHARE;
                    let config = milp::MilpConfig {
                        budget: None,
                        time_limit_s: share_or_rest_s(
                            config.time_limit_s,
                            left_s(),
                            RINS_ALL_BELOW_S,
                        ),
                        ..config.clone()
                    };
                    let Ok(outcome) =
                        milp::solve_rins(&problem, &served, &chosen, relaxed, &config)
                    else {
                        break;
                    };
                    let Some(schedule) = outcome.schedule.filter(|s| {
                        outcome.unserved.is_empty()
                            && problem.evaluate(s).objective_g
                                < problem.evaluate(&chosen).objective_g * (1.0 - 1e-9)
                    }) else {
                        break;
                    };
                    if !validate(instance, &problem.to_plan(&schedule, &named(&unserved))).valid {
                        break;
                    }
                    chosen = schedule;
                    improvements += 1;
                    progress.report(|| format!("RINS: {:.3} kg", kg(&chosen)));
                }
                if improvements > 0 {
                    method = format!("{method}, then {improvements} RINS improvement(s)");
                }
            }
        }
        // Large instances skip the neighbourhood MILPs: their rounds use the whole limit, and
        // without a stop signal the plan then depends on no wall-clock limit.
        // The shares above are reserved, but the steps often end early: when what the share
        // leaves after the neighbourhoods is shorter than NEIGHBOURHOODS_ALL_BELOW_S, they get
        // all of what is left (each solve within it) rather than leaving it to an exact MILP
        // too short to finish its root.
        let budget_s = if large || meets(&chosen, compact.as_ref()) {
            0.0
        } else {
            let share_s = options.time_limit_s
                * (1.0 - full_milp_share - restricted_share - rins_share).max(0.0);
            share_or_rest_s(share_s, left_s(), NEIGHBOURHOODS_ALL_BELOW_S)
        };
        let (improved, n_improvements) = neighbourhood_search(
            &problem,
            &chosen,
            budget_s,
            sub_gap,
            compact.as_ref().and_then(|c| c.relaxed.as_ref()),
            &stop,
            &left_s,
        );
        if n_improvements > 0
            && validate(instance, &problem.to_plan(&improved, &named(&unserved))).valid
        {
            chosen = improved;
            method = format!("{method}, then {n_improvements} neighbourhood MILP improvement(s)");
        }
        if budget_s > 0.0 {
            progress.report(|| format!("neighbourhood search: {:.3} kg", kg(&chosen)));
        }
        // The time the steps above left of a caller's budget (many medium solves end well
        // inside their limit) goes to the exact MILP over the served jobs, started from the
        // plan: HiGHS's cuts and branching give a bound that sees integrality, which the master
        // LP cannot, and sometimes a better plan.
        let time_left_s = left_s();
        if !large
            && options.bound
            && time_left_s.is_finite()
            && time_left_s >= LEFTOVER_MILP_MIN_S
            && !meets(&chosen, compact.as_ref())
        {
            let served_now: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
            let config = milp::MilpConfig {
                budget: None,
                time_limit_s: time_left_s * LEFTOVER_MILP_SHARE,
                mip_rel_gap: options.mip_rel_gap,
                relax: false,
                soft_work: false,
                log: options.log,
            };
            if let Ok(outcome) = milp::solve(&problem, &served_now, Some(&chosen), None, &config) {
                method = format!("{method}, then the exact MILP in the time left");
                if let Some(schedule) = outcome.schedule.filter(|s| {
                    outcome.unserved.is_empty()
                        && problem.evaluate(s).objective_g
                            < problem.evaluate(&chosen).objective_g * (1.0 - 1e-9)
                        && validate(instance, &problem.to_plan(s, &named(&unserved))).valid
                }) {
                    chosen = schedule;
                    method = format!("{method} (a better plan)");
                }
                leftover_bound = outcome.lower_bound_g.map(|bound| (bound, served_now));
            }
            progress.report(|| {
                format!(
                    "exact MILP in the time left: {:.3} kg, bound {}",
                    kg(&chosen),
                    bound_kg(leftover_bound.as_ref().map(|(b, _)| *b))
                )
            });
        }
    }
    if let Some(at_s) = met_at {
        let at = at_s.map_or(String::new(), |s| format!(" at {s:.1} s"));
        method = format!("{method}, then the gap target met{at}");
        progress.report(|| {
            format!(
                "gap target met{at}: {:.3} kg; the steps that only lower the plan are skipped",
                kg(&chosen)
            )
        });
    }
    // The jobs still left out get one more try now that the search has moved the others: the
    // first plan's crowding that kept them out may be gone. Only where serving a job can only
    // add to the objective, so that every bound over the jobs served before stays a bound.
    let mut unserved = midway_unserved.unwrap_or(unserved);
    let late_stop = || options.stop.at(1.0 + LATE_ADMIT_SHARE);
    let left_out: Vec<usize> = unserved.iter().map(|(j, _)| *j).collect();
    let mut late_bound: Option<f64> = None;
    if !left_out.is_empty()
        && !proven_optimal
        && !late_stop()
        && serving_only_adds(&problem, &left_out)
    {
        if let Some((admitted, still, _)) = serve_left_out(&chosen, &unserved, false, &late_stop) {
            method = format!(
                "{method}, then {} more job(s) served once the search had made room",
                unserved.len() - still.len()
            );
            chosen = admitted;
            unserved = still;
            late_admitted = true;
        }
        progress.report(|| {
            format!(
                "{} of {} job(s) left out served at the end: {:.3} kg",
                left_out.len() - unserved.len(),
                left_out.len(),
                kg(&chosen)
            )
        });
    }
    // The bounds so far leave the jobs served late out; one pricing at the best prices over
    // the jobs served now counts them too.
    if late_admitted
        && options.bound
        && let Some(best) = best_prices.as_ref()
    {
        let served_now: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
        let most_cells = LATE_BOUND_CELLS_SHARE
            * lagrange::FINAL_CELLS_PER_LIMIT_S
            * options.time_limit_s.max(1.0);
        late_bound = match lagrange::final_bound(&problem, &served_now, best, most_cells) {
            Some((terms, _)) => Some(terms.value_g()),
            None => lagrange::bound_on_grid(&problem, &served_now, best, lagrange::Grid::Coarse)
                .map(|terms| terms.value_g()),
        };
    }
    let mut infeasible = named(&unserved);
    infeasible.sort_by(|a, b| a.job.cmp(&b.job));
    let served: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
    // A bound over `over`, jobs all served now, also bounds the plan when the late admission
    // added the rest (each can only add to the objective).
    let covers = |over: &[bool]| {
        over == served.as_slice()
            || (late_admitted && over.iter().zip(&served).all(|(o, s)| !o || *s))
    };
    let evaluation = problem.evaluate(&chosen);

    // Lower bound over plans serving the same jobs: the best of the bounds that cover exactly
    // those jobs, then the LP relaxation over them (below). The MILP's covers every included
    // job; column generation's the jobs the heuristic served; the Lagrangian's those served
    // once the jobs left out were fixed, which the later steps keep served; the exact MILP in
    // the time left the jobs it was given.
    let all_included_served = (0..n_jobs).all(|j| skip[j] || served[j]);
    // Once the gap target is met the groups' bound is not waited for: the thread starts no
    // further MILP and ends with the one it is in.
    let group_bound = group_thread.and_then(|thread| {
        if met_at.is_some() {
            thread.abandon();
            None
        } else {
            thread.finish(&|| options.stop.at(1.0 + GROUP_WAIT_GRACE_SHARE))
        }
    });
    if let Some((group, _)) = &group_bound {
        progress.report(|| {
            format!(
                "bound from jobs solved on their own: {:.3} kg ({} job(s) together add {:.1} g \
                 to the all-idle floor of {:.3} kg; {} of {} alone add some)",
                group.bound_g / 1000.0,
                group.group_jobs,
                group.group_excess_g,
                group.floor_g / 1000.0,
                group.singles_lifting,
                group.singles_solved
            )
        });
    }
    // Where the final plan's gap lies at the bound's prices; its Lagrangian value also bounds
    // the plan (it prices jobs served after the bound with the rest).
    let gap_breakdown = match (&best_prices, &final_terms) {
        (Some(prices), Some(terms)) => gap::breakdown(&problem, &chosen, prices, terms),
        _ => None,
    };
    let mut lower_bound_g = [
        // A plan that serves no job is the only plan serving none: its objective (the idle
        // floor) is its bound.
        served.iter().all(|s| !s).then_some(evaluation.objective_g),
        gap_breakdown.as_ref().map(|b| b.lagrangian_g),
        milp_bound.filter(|_| all_included_served),
        group_bound
            .as_ref()
            .filter(|(_, over)| covers(over))
            .map(|(group, _)| group.bound_g),
        colgen_bound.filter(|_| covers(&heuristic_served)),
        leftover_bound
            .filter(|(_, over)| covers(over))
            .map(|(bound, _)| bound),
        dual_bound.filter(|_| covers(&fixed_served)),
        late_bound,
    ]
    .into_iter()
    .flatten()
    .reduce(f64::max);
    // Unless the MILP proved its plan optimal, the LP relaxation over the served jobs is solved
    // too: a MILP stopped early may not have finished its root, and the better bound is kept.
    // Large instances rely on the Lagrangian bound: the compact LP would not fit their budget
    // (on the benchmark's 10,000-job size it outgrew 24 GiB). A path that computed none (the
    // heuristic alone, or rounds stopped before their first iteration) gets a short ascent.
    if !proven_optimal && options.bound && large_size && dual_bound.is_none() {
        let served_now: Vec<bool> = chosen.runs.iter().map(Option::is_some).collect();
        let outcome = lagrange::dual_bound(
            &problem,
            &served_now,
            &chosen,
            &lagrange::DualConfig {
                max_iterations: QUICK_DUAL_ITERATIONS,
                upper_g: problem.evaluate(&chosen).objective_g,
                rel_gap: options.mip_rel_gap,
                stop: &|| false,
                start: None,
                start_scale: 1.0,
                grid: lagrange::Grid::Coarse,
            },
        );
        if let Some(bound) = outcome.bound_g {
            lower_bound_g = Some(lower_bound_g.map_or(bound, |b| b.max(bound)));
        }
        progress.report(|| format!("Lagrangian bound: {}", bound_kg(outcome.bound_g)));
    } else if !proven_optimal
        && options.bound
        && !large_size
        // A Lagrangian path forced on a smaller fleet keeps its own bound.
        && (!large || dual_bound.is_none())
        // Bounds that meet the gap target already need no LP.
        && !lower_bound_g
            .is_some_and(|bound| within_gap(evaluation.objective_g, bound, options.mip_rel_gap))
    {
        let lp_bound = match compact {
            Some(lp) if lp.served == served => lp.bound_g,
            _ => compact_over(
                &mut early_compact,
                &served,
                lower_bound_g.is_some(),
                left_s(),
            )
            .and_then(|lp| lp.bound_g),
        };
        lower_bound_g = match (lower_bound_g, lp_bound) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    // The groups' bound named where it is the one kept.
    if let (Some((group, over)), Some(bound)) = (&group_bound, lower_bound_g)
        && covers(over)
        && group.bound_g >= bound
        && group.bound_g > group.floor_g
    {
        method = format!(
            "{method}, then a bound from {} job(s) planned together and {} alone",
            group.group_jobs, group.singles_solved
        );
    }
    let objective_g = evaluation.objective_g;
    let lower_bound_g = lower_bound_g.unwrap_or(0.0).clamp(0.0, objective_g);
    let gap = if objective_g > 0.0 {
        (objective_g - lower_bound_g) / objective_g
    } else {
        0.0
    };
    // A bound within the tolerance proves the plan optimal, whichever step gave it.
    let proven_optimal = proven_optimal || (lower_bound_g > 0.0 && gap <= options.mip_rel_gap);
    progress.report(|| {
        format!(
            "done: {:.3} kg, bound {:.3} kg, gap {:.3} %",
            objective_g / 1000.0,
            lower_bound_g / 1000.0,
            100.0 * gap
        )
    });

    let not_served: Vec<bool> = served.iter().map(|s| !s).collect();
    let baseline = problem.evaluate(&heuristic::run_now(&problem, &not_served));
    let plan = problem.to_plan(&chosen, &infeasible);
    let status = if !infeasible.is_empty() {
        "partial"
    } else if proven_optimal {
        "optimal"
    } else {
        "feasible"
    };
    // How many jobs every plan leaves out: those that cannot run alone, and the floor the
    // GPU-slots of the windows put on the others.
    let left_out_at_least = if infeasible.is_empty() {
        0
    } else {
        let can_run: Vec<usize> = (0..n_jobs).filter(|&j| !skip[j]).collect();
        (alone_infeasible.len() + crowding::left_out_floor(&problem, &can_run))
            .min(infeasible.len())
    };
    let metrics = Metrics {
        status: status.to_string(),
        emissions_g: evaluation.emissions_g,
        lower_bound_g,
        gap,
        objective_g,
        baseline_emissions_g: baseline.emissions_g,
        grid_energy_kwh: evaluation.grid_energy_kwh,
        surplus_used_kwh: evaluation.surplus_used_kwh,
        surplus_available_kwh: problem.surplus_available_kwh(),
        migrations: evaluation.migrations.len(),
        infeasible_jobs: infeasible,
        left_out_at_least,
        solve_seconds: 0.0,
        method,
    };
    Solution {
        plan,
        metrics,
        gap_breakdown,
    }
}

/// Whether serving any of `jobs` can only add to a plan's objective: every grid weight is
/// non-negative, no power level draws less than idle, migrations cost nothing or more, and none
/// of the jobs has runs in a previous plan (whose change penalty a run could take back).
fn serving_only_adds(problem: &Problem, jobs: &[usize]) -> bool {
    let weights = (0..problem.inst.sites.len()).all(|site| {
        (0..problem.n_slots).all(|slot| problem.grid_cost_g_per_kwh(site, slot) >= 0.0)
    });
    let levels = problem
        .pools
        .iter()
        .all(|p| p.levels_w.iter().all(|&w| w >= p.idle_w));
    weights
        && levels
        && problem.inst.params.migration_penalty_g >= 0.0
        && jobs.iter().all(|&j| problem.previous[j].is_empty())
}

/// The thread computing [`subsets::group_bound`] (its answer and the jobs it covers), and the
/// flag that tells it to start no further MILP.
struct GroupThread {
    handle: std::thread::JoinHandle<Option<(subsets::GroupBound, Vec<bool>)>>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl GroupThread {
    /// Its answer, once the MILP it is in ends: it starts no other. When `stop` answers `true`
    /// first (the caller's budget is spent), `None`, and the thread ends on its own with that
    /// MILP: HiGHS may overrun the limit it was given by the seconds its model takes to build.
    fn finish(self, stop: &dyn Fn() -> bool) -> Option<(subsets::GroupBound, Vec<bool>)> {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        while !self.handle.is_finished() {
            if stop() {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(GROUP_WAIT_POLL_MS));
        }
        self.handle.join().ok().flatten()
    }

    /// Tells it to start no other MILP, without waiting for the one it is in.
    fn abandon(self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Starts the bound from groups of jobs solved on their own (`subsets`) on a thread of its own,
/// around `plan`'s grid draw, when it can hold: serving the plan's jobs only adds to the
/// objective, and `bound_g` does not prove the plan already. It works on the second core while
/// the plan's steps go on, and ends `GROUP_BOUND_MARGIN_S` before the caller's budget. Its
/// MILPs print no HiGHS log, whatever `options.log` says.
fn spawn_group_bound(
    instance: &Instance,
    problem: &Problem,
    plan: &Schedule,
    bound_g: Option<f64>,
    options: &SolveOptions,
) -> Option<GroupThread> {
    let served: Vec<bool> = plan.runs.iter().map(Option::is_some).collect();
    let jobs: Vec<usize> = (0..served.len()).filter(|&j| served[j]).collect();
    let objective_g = problem.evaluate(plan).objective_g;
    let proven = bound_g.is_some_and(|b| objective_g - b <= options.mip_rel_gap * objective_g);
    if proven || jobs.is_empty() || !serving_only_adds(problem, &jobs) {
        return None;
    }
    let (instance, plan) = (instance.clone(), plan.clone());
    let stop = options.stop.clone();
    let limit_s = options.time_limit_s;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cancelled = done.clone();
    let handle = std::thread::spawn(move || {
        let problem = Problem::new(&instance);
        let left_s = || {
            stop.passed().map_or(f64::INFINITY, |p| {
                ((1.0 - p) * limit_s - GROUP_BOUND_MARGIN_S).max(0.0)
            })
        };
        let unbudgeted_s = limit_s * GROUP_BOUND_SHARE;
        let cancelled = || cancelled.load(std::sync::atomic::Ordering::Relaxed);
        subsets::group_bound(
            &problem,
            &served,
            &plan,
            &left_s,
            unbudgeted_s,
            &cancelled,
            // HiGHS's log stays the plan's: two solvers writing at once would garble it.
            false,
        )
        .map(|group| (group, served))
    });
    Some(GroupThread { handle, done })
}

/// Whether `bound_g` proves a plan of `objective_g` within the relative gap `rel_gap`.
fn within_gap(objective_g: f64, bound_g: f64, rel_gap: f64) -> bool {
    objective_g - bound_g <= rel_gap * objective_g.abs()
}

/// A step's share of a caller's budget, seconds, or all that is left (`left_s`) when the share
/// would leave less than `least_rest_s` to the steps after it: too little for them to use.
/// Without a budget (`left_s` infinite) the share stands.
fn share_or_rest_s(share_s: f64, left_s: f64, least_rest_s: f64) -> f64 {
    if left_s.is_finite() && left_s - share_s < least_rest_s {
        left_s
    } else {
        share_s
    }
}

/// A bound for a progress message, kg.
fn bound_kg(bound_g: Option<f64>) -> String {
    bound_g.map_or_else(|| "none".to_string(), |b| format!("{:.3} kg", b / 1000.0))
}

/// Run variables of the jobs without `skip[j]`: slots in the window times the power levels of
/// the pools the job may use.
fn run_variables(problem: &Problem, skip: &[bool]) -> usize {
    (0..problem.jobs.len())
        .filter(|&j| !skip[j])
        .map(|j| {
            let view = &problem.jobs[j];
            view.window.len()
                * view
                    .pools
                    .iter()
                    .map(|&p| problem.pools[p].levels_w.len())
                    .sum::<usize>()
        })
        .sum()
}

/// The compact LP relaxation over a set of served jobs.
struct CompactLp {
    /// The jobs it covers.
    served: Vec<bool>,
    /// Its value, g: a lower bound on every plan serving exactly those jobs.
    bound_g: Option<f64>,
    /// Its run variables, for RINS.
    relaxed: Option<milp::Relaxed>,
}

/// The compact LP relaxation solved on a thread of its own, from the start of a solve. One
/// that no step takes (column generation proved the plan, say) is dropped and its thread ends
/// on its own within its time limit: waiting for it made a solve that column generation
/// proves in 0.02 s take 0.2 s.
struct EarlyCompactLp {
    /// The jobs it covers.
    served: Vec<bool>,
    handle: std::thread::JoinHandle<Option<CompactLp>>,
}

impl EarlyCompactLp {
    /// Starts [`compact_relaxation`] over the jobs with `served[j]`, within the caller's
    /// budget as if another step had bounded the plan, HiGHS's log off (two solvers writing
    /// at once would garble it).
    fn spawn(instance: &Instance, served: Vec<bool>, options: &SolveOptions) -> Self {
        let (instance, cover) = (instance.clone(), served.clone());
        let options = SolveOptions {
            log: false,
            ..options.clone()
        };
        let handle = std::thread::spawn(move || {
            let problem = Problem::new(&instance);
            let left_s = milp::Budget {
                stop: &options.stop,
                limit_s: options.time_limit_s,
            }
            .left_s();
            compact_relaxation(&problem, &cover, &options, true, left_s)
        });
        EarlyCompactLp { served, handle }
    }

    /// Its answer, once it ends, when it covers exactly the jobs with `served[j]`; otherwise
    /// `None` at once, the thread left to end on its own within its time limit.
    fn take(self, served: &[bool]) -> Option<CompactLp> {
        if self.served != served {
            return None;
        }
        self.handle.join().ok().flatten()
    }
}

/// The compact LP relaxation over the jobs with `served[j]`; `None` when HiGHS fails or when
/// `bounded` (another step has bounded the plan) and too little of the caller's budget is
/// `left_s`.
fn compact_relaxation(
    problem: &Problem,
    served: &[bool],
    options: &SolveOptions,
    bounded: bool,
    left_s: f64,
) -> Option<CompactLp> {
    // A plan without a bound cannot say how good it is, so then the LP gets its own budget (an
    // LP relaxation is cheap next to the MILP); once a bound exists, only what is left.
    let own_s = options.time_limit_s.max(LP_BOUND_MIN_TIME_S);
    let time_limit_s = if bounded { own_s.min(left_s) } else { own_s };
    if time_limit_s < LP_LEAST_LEFT_S {
        return None;
    }
    let config = milp::MilpConfig {
        budget: None,
        time_limit_s,
        mip_rel_gap: options.mip_rel_gap,
        relax: true,
        soft_work: false,
        log: options.log,
    };
    milp::solve(problem, served, None, None, &config)
        .ok()
        .map(|o| CompactLp {
            served: served.to_vec(),
            bound_g: o.lower_bound_g,
            relaxed: o.relaxed,
        })
}

/// Emissions of the run-now baseline for every job of an instance, g CO2e.
pub fn baseline_emissions_g(instance: &Instance) -> f64 {
    let problem = Problem::new(instance);
    let skip = vec![false; problem.jobs.len()];
    problem
        .evaluate(&heuristic::run_now(&problem, &skip))
        .emissions_g
}

/// The run-now baseline of an instance as a plan (formats.md: released jobs start in release
/// order at their home site, first fit, at full power, until done).
pub fn baseline_plan(instance: &Instance) -> Plan {
    let problem = Problem::new(instance);
    let skip = vec![false; problem.jobs.len()];
    problem.to_plan(&heuristic::run_now(&problem, &skip), &[])
}

/// Grid emissions of a plan attributed to its jobs, g CO2e, per job as (slot, grams).
///
/// Each site-slot's grid import is shared in proportion to load: a job's share of the slot's
/// emissions is its added load (at its power cap, net of the idle power it replaces) over the
/// site's total load, so surplus power is spread evenly over everything running. Idle power
/// and checkpoint transfers keep their own share, so job totals sum to at most the plan's
/// emissions. Assignments that name an unknown job, site or model are skipped (the validator
/// reports them).
pub fn job_emissions_g(
    instance: &Instance,
    plan: &Plan,
) -> std::collections::BTreeMap<String, Vec<(usize, f64)>> {
    let problem = Problem::new(instance);
    let h = problem.slot_h;
    let n_slots = instance.slots;
    let site_index = |id: &str| instance.sites.iter().position(|s| s.id == id);
    let mut load_kw: Vec<Vec<f64>> = (0..instance.sites.len())
        .map(|s| vec![problem.idle_load_kw[s]; n_slots])
        .collect();
    let mut runs: Vec<(String, usize, usize, f64)> = Vec::new(); // job, site, slot, kW
    let jobs_by_id: std::collections::BTreeMap<&str, &Job> =
        instance.jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    for a in &plan.assignments {
        let (Some(site), Some(&job)) = (site_index(&a.site), jobs_by_id.get(a.job.as_str())) else {
            continue;
        };
        let model = a.gpu_model.clone().or_else(|| {
            instance.sites[site]
                .gpus
                .keys()
                .find(|m| {
                    instance.gpu_models.get(*m).is_some_and(|g| {
                        g.power_levels_w
                            .iter()
                            .any(|w| (w - a.power_w).abs() < 1e-6)
                    })
                })
                .cloned()
        });
        let Some(spec) = model.and_then(|m| instance.gpu_models.get(&m)) else {
            continue;
        };
        if a.slot >= n_slots {
            continue;
        }
        let kw =
            instance.sites[site].pue * f64::from(job.gpus) * (a.power_w - spec.idle_w) / 1000.0;
        load_kw[site][a.slot] += kw;
        runs.push((a.job.clone(), site, a.slot, kw));
    }
    for m in &plan.migrations {
        let (Some(from), Some(to)) = (site_index(&m.from), site_index(&m.to)) else {
            continue;
        };
        let kwh = instance
            .jobs
            .iter()
            .find(|j| j.id == m.job)
            .map_or(0.0, |j| {
                instance.params.transfer_kwh_per_gb * j.checkpoint_gb
            });
        if m.slot < n_slots {
            load_kw[from][m.slot] += kwh / h;
            load_kw[to][m.slot] += kwh / h;
        }
    }
    let mut out: std::collections::BTreeMap<String, Vec<(usize, f64)>> = Default::default();
    for (job, site, slot, kw) in runs {
        let spec = &instance.sites[site];
        let total = load_kw[site][slot];
        let grid_kw = (total - spec.surplus_kw[slot]).max(0.0);
        let share = if total > 0.0 { kw / total } else { 0.0 };
        let g = share * grid_kw * h * spec.carbon_g_per_kwh[slot];
        out.entry(job).or_default().push((slot, g));
    }
    out
}

/// Large-neighbourhood search: re-optimises groups of jobs that overlap in time with the exact
/// MILP while every other job stays where it is, keeping each change that lowers the objective.
/// Under a caller's budget (`left_s` finite) it spends at most `budget_s` seconds; without one,
/// at most `budget_s / NEIGHBOURHOOD_LIMIT_S` solves (each neighbourhood has its own HiGHS
/// limit). Returns the schedule and how many neighbourhoods improved it.
fn neighbourhood_search(
    problem: &Problem,
    start: &problem::Schedule,
    budget_s: f64,
    mip_rel_gap: f64,
    relaxed: Option<&milp::Relaxed>,
    stop: &dyn Fn() -> bool,
    left_s: &dyn Fn() -> f64,
) -> (problem::Schedule, usize) {
    // With the LP relaxation, a group's runs on which it agrees with the plan stay fixed, so a
    // group can hold more jobs.
    let group_jobs = if relaxed.is_some() {
        RINS_NEIGHBOURHOOD_JOBS
    } else {
        NEIGHBOURHOOD_JOBS
    };
    let mut current = start.clone();
    let mut current_objective = problem.evaluate(&current).objective_g;
    let mut served: Vec<usize> = (0..problem.jobs.len())
        .filter(|&j| current.runs[j].is_some())
        .collect();
    if served.len() <= group_jobs {
        return (current, 0);
    }
    // Two families of neighbourhoods, each a sliding group over a job order: jobs that overlap in
    // time, and jobs that share a site (by where they start) and overlap in time.
    served.sort_by_key(|&j| (problem.jobs[j].window.start, problem.jobs[j].window.end, j));
    let mut by_site = served.clone();
    let first_site = |j: usize| {
        start.runs[j]
            .as_ref()
            .and_then(|runs| runs.first())
            .map_or(usize::MAX, |r| problem.pools[r.pool].site)
    };
    by_site.sort_by_key(|&j| (first_site(j), problem.jobs[j].window.start, j));
    let sliding = |order: &Vec<usize>| -> Vec<Vec<usize>> {
        (0..order.len())
            .step_by(group_jobs / 2)
            .map(|i| order[i..(i + group_jobs).min(order.len())].to_vec())
            .collect()
    };
    let mut groups = sliding(&served);
    groups.extend(sliding(&by_site));
    // Under a caller's budget the share is seconds: the search ends when `left_s` falls to
    // `end_left_s` (an unbounded share leaves the end to the budget). Without one, a count of
    // solves stands for it: each takes its HiGHS limit or less, plus building the model.
    let start_left_s = left_s();
    let timed = start_left_s.is_finite();
    let end_left_s = if timed && budget_s.is_finite() {
        (start_left_s - budget_s).max(0.0)
    } else {
        0.0
    };
    let max_solves = if budget_s.is_finite() && !timed {
        (budget_s / NEIGHBOURHOOD_LIMIT_S).floor() as usize
    } else {
        usize::MAX
    };
    let mut config = milp::MilpConfig {
        budget: None,
        time_limit_s: NEIGHBOURHOOD_LIMIT_S,
        mip_rel_gap,
        relax: false,
        soft_work: false,
        log: false,
    };
    let mut solves = 0;
    let mut improvements = 0;
    'rounds: loop {
        let mut improved = false;
        for group in &groups {
            // Each solve within what is left of the share.
            config.time_limit_s = NEIGHBOURHOOD_LIMIT_S.min(left_s() - end_left_s);
            if solves >= max_solves || stop() || config.time_limit_s < NEIGHBOURHOOD_LEAST_S {
                break 'rounds;
            }
            solves += 1;
            let mut include = vec![false; problem.jobs.len()];
            for &j in group {
                include[j] = true;
            }
            let solved = match relaxed {
                Some(relaxed) => milp::solve_rins(problem, &include, &current, relaxed, &config),
                None => milp::solve(problem, &include, Some(&current), Some(&current), &config),
            };
            let Ok(outcome) = solved else {
                continue;
            };
            let Some(schedule) = outcome.schedule else {
                continue;
            };
            let mut candidate = current.clone();
            for &j in group {
                candidate.runs[j] = schedule.runs[j].clone();
            }
            let objective = problem.evaluate(&candidate).objective_g;
            if objective < current_objective - 1e-6 * current_objective.max(1.0) {
                current = candidate;
                current_objective = objective;
                improvements += 1;
                improved = true;
            }
        }
        if !improved {
            break;
        }
    }
    (current, improvements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::tests::random_instance;

    /// A progress hook that keeps every message, and the messages it keeps.
    fn recorded_progress() -> (Progress, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = messages.clone();
        let progress = Progress::new(move |m| sink.lock().expect("not poisoned").push(m.into()));
        (progress, messages)
    }

    #[test]
    fn a_medium_fleet_reports_its_lp_relaxation_which_the_bound_keeps() {
        let instance = random_instance(3, 20, 3, 12);
        let (progress, messages) = recorded_progress();
        let options = SolveOptions {
            progress,
            ..SolveOptions::default()
        };
        let solution = solve(&instance, &options);
        assert!(validate(&instance, &solution.plan).valid);
        let messages = messages.lock().expect("not poisoned");
        // The kilograms a progress message starting with `prefix` reports first.
        let reported_kg = |prefix: &str| -> f64 {
            messages
                .iter()
                .find_map(|m| m.strip_prefix(prefix))
                .and_then(|rest| rest.split(" kg").next())
                .and_then(|kg| kg.parse().ok())
                .unwrap_or_else(|| panic!("no `{prefix}` value in {messages:?}"))
        };
        let bound_kg = solution.metrics.lower_bound_g / 1000.0;
        let lp_kg = reported_kg("LP relaxation: ");
        assert!(
            lp_kg <= bound_kg + 5e-4,
            "LP {lp_kg} kg above the bound {bound_kg} kg"
        );
        // The groups' thread reported too, and the bound kept it.
        let groups_kg = reported_kg("bound from jobs solved on their own: ");
        assert!(
            groups_kg <= bound_kg + 5e-4,
            "groups' bound {groups_kg} kg above the bound {bound_kg} kg"
        );
    }

    /// With no job to serve the plan is the idle floor and nothing else: proven optimal, its
    /// bound its objective, not a 100 % gap.
    #[test]
    fn a_plan_with_no_jobs_is_its_own_bound() {
        let mut instance = random_instance(4, 5, 2, 12);
        instance.jobs.clear();
        let solution = solve(&instance, &SolveOptions::default());
        assert!(validate(&instance, &solution.plan).valid);
        assert_eq!(solution.metrics.status, "optimal");
        assert!(solution.metrics.objective_g > 0.0);
        assert_eq!(solution.metrics.lower_bound_g, solution.metrics.objective_g);
        assert_eq!(solution.metrics.gap, 0.0);
    }

    #[test]
    fn the_heuristic_alone_on_a_large_fleet_is_bounded_by_a_short_lagrangian_ascent() {
        // Over 200 jobs: the compact LP, which outgrows memory on large fleets, is not built.
        let instance = random_instance(5, 230, 3, 24);
        let (progress, messages) = recorded_progress();
        let options = SolveOptions {
            method: Method::Heuristic,
            progress,
            ..SolveOptions::default()
        };
        let solution = solve(&instance, &options);
        let metrics = &solution.metrics;
        assert!(validate(&instance, &solution.plan).valid);
        assert!(metrics.lower_bound_g > 0.0, "no bound");
        assert!(metrics.lower_bound_g <= metrics.objective_g + 1e-6);
        let messages = messages.lock().expect("not poisoned");
        assert!(
            messages.iter().any(|m| m.starts_with("Lagrangian bound: ")),
            "{messages:?}"
        );
        // Without a bound asked for, none is computed.
        let unbounded = solve(
            &instance,
            &SolveOptions {
                method: Method::Heuristic,
                bound: false,
                ..SolveOptions::default()
            },
        );
        assert_eq!(unbounded.metrics.lower_bound_g, 0.0);
        assert_eq!(unbounded.plan, solution.plan);
    }
}
