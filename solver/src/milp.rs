//! The exact time-indexed MILP of model.md, built with good_lp and solved by HiGHS.
//!
//! Owns the formulation (placement, locations, migrations with the feasibility domain, work with
//! transfer losses, capacity, power balance, grid limits) and the reading of HiGHS's answer and
//! dual bound. It is exact on small instances; large ones need the heuristic's start and a time
//! limit. The LP relaxation returns its run variables, and [`solve_rins`] solves the MILP with
//! those on which a plan and the relaxation agree fixed. It must not perform I/O or read the
//! clock.

use std::collections::{BTreeMap, BTreeSet};

use good_lp::{Expression, ProblemVariables, SolverModel, Variable, VariableDefinition, variable};

use crate::problem::{Problem, Schedule, Slot};

/// Tie-break weight per slot index and run, g: prefers earlier completion among equal plans.
const EARLINESS_G: f64 = 1e-7;

/// Columns above which HiGHS runs without presolve and without its MIP's symmetry detection.
/// Presolve checks the time limit only between reductions: on the benchmark's 1,000-job direct
/// MILP (2.9 million columns) it ran for 181 s of a 120 s limit even without its slowest rule
/// (parallel rows and columns), and 325-452 s with it; without presolve HiGHS stopped at 129 s,
/// and without the symmetry detection too at 120 s (on a slower machine at 130 s of the 114 s
/// its budget left), with the same plan, at about twice the memory (7.0-7.3 GiB against 3.4
/// GiB; docs/benchmarks.md). The compact models the solver's own steps build (up to 200 jobs
/// and 50,000 run variables; S at 15-minute slots has 80,798 columns) keep both.
const PRESOLVE_MOST_COLUMNS: usize = 200_000;

/// HiGHS settings for one solve.
#[derive(Clone, Debug)]
pub(crate) struct MilpConfig<'a> {
    pub time_limit_s: f64,
    /// The caller's budget, when the model's build counts against it: HiGHS then gets at most
    /// what is left of it once the model is built (a large model takes seconds to build, which
    /// HiGHS's own limit does not count).
    pub budget: Option<Budget<'a>>,
    pub mip_rel_gap: f64,
    /// Solve the LP relaxation instead of the MILP.
    pub relax: bool,
    /// Allow leaving a job out at a high penalty, so one impossible job does not sink the plan.
    pub soft_work: bool,
    /// Print HiGHS's log to standard output.
    pub log: bool,
}

/// A caller's budget: its stop signal and its limit, seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget<'a> {
    pub stop: &'a crate::Stop,
    pub limit_s: f64,
}

impl Budget<'_> {
    /// Seconds left of the budget; unbounded when the stop signal tells no share.
    pub fn left_s(&self) -> f64 {
        self.stop
            .passed()
            .map_or(f64::INFINITY, |p| (1.0 - p).max(0.0) * self.limit_s)
    }
}

/// What HiGHS returned.
pub(crate) struct MilpOutcome {
    /// The schedule read from the incumbent, if HiGHS has one.
    pub schedule: Option<Schedule>,
    /// Jobs whose work the incumbent leaves unserved.
    pub unserved: Vec<usize>,
    /// Whether HiGHS proved the incumbent optimal within the gap.
    pub proven_optimal: bool,
    /// A lower bound on the objective of every plan serving all included jobs, g.
    pub lower_bound_g: Option<f64>,
    /// The LP relaxation's run variables, per job, when `relax` was set and the LP solved.
    pub relaxed: Option<Relaxed>,
}

/// The LP relaxation's run variables: per job, the value of each run (slot, pool, level) it
/// gives a positive value (those it leaves out are 0).
pub(crate) type Relaxed = Vec<BTreeMap<(usize, usize, usize), f64>>;

/// A run variable counts as agreeing with the LP relaxation when the LP value is within this of
/// the incumbent's 0 or 1.
const AGREE_EPS: f64 = 1e-6;
/// Most points of a site's load lattice (see [`load_lattice_kw`]); a site with more gets no
/// lattice cuts: its points lie so close together that the chords add next to nothing.
const LATTICE_MOST_POINTS: usize = 20_000;
/// The lattice's resolution, kW (1 mW): each GPU's run load is rounded to it.
const LATTICE_UNIT_KW: f64 = 1e-6;
/// Slack on each lattice cut, kW: more than the rounding of the largest lattice's sums.
const LATTICE_CUT_SLACK_KW: f64 = 1e-4;
/// Least lift a lattice cut must give where the load meets the surplus, kW, to be added.
const LATTICE_CUT_LEAST_KW: f64 = 1e-3;

struct Builder {
    vars: ProblemVariables,
    warm: Vec<f64>,
    constraints: Vec<good_lp::Constraint>,
    objective: Expression,
}

impl Builder {
    fn add(&mut self, def: VariableDefinition, warm: f64) -> Variable {
        self.warm.push(warm);
        self.vars.add(def)
    }
}

/// Per included job: its x variables keyed by (slot, pool, level).
type JobVars = BTreeMap<(usize, usize, usize), usize>;

/// Builds and solves the model over the jobs with `include[j]`, starting from `warm` if given.
///
/// Jobs left out of `include` but planned in `fixed` stay where `fixed` has them: their GPUs and
/// load are a fixed background for the included jobs.
pub(crate) fn solve(
    problem: &Problem,
    include: &[bool],
    warm: Option<&Schedule>,
    fixed: Option<&Schedule>,
    config: &MilpConfig,
) -> Result<MilpOutcome, String> {
    build_and_solve(problem, include, warm, fixed, None, None, config)
}

/// Relaxation-induced neighbourhood search (RINS): the MILP over the included jobs with every
/// run variable on which `incumbent` and the LP relaxation `relaxed` agree fixed to that value,
/// started from `incumbent`; the jobs left out stay where `incumbent` has them. Its answer is
/// never worse than the incumbent, and the variables left free are where the LP sees something
/// better.
pub(crate) fn solve_rins(
    problem: &Problem,
    include: &[bool],
    incumbent: &Schedule,
    relaxed: &Relaxed,
    config: &MilpConfig,
) -> Result<MilpOutcome, String> {
    build_and_solve(
        problem,
        include,
        Some(incumbent),
        Some(incumbent),
        Some(relaxed),
        None,
        config,
    )
}

/// The MILP over the included jobs, each held at the site `site_of` names (any slot of its
/// window, any pool and power level there), with every other job where `incumbent` has it;
/// started from `incumbent`, so its answer is never worse. Each included job must be able to
/// stay at its site: no migration in `incumbent`, and already there if it is anywhere.
/// With the sites fixed, no location or migration variables are needed: the model is a
/// re-timing and re-capping of each site's jobs, small enough to solve well.
pub(crate) fn solve_at_sites(
    problem: &Problem,
    include: &[bool],
    incumbent: &Schedule,
    site_of: &[Option<usize>],
    config: &MilpConfig,
) -> Result<MilpOutcome, String> {
    build_and_solve(
        problem,
        include,
        Some(incumbent),
        Some(incumbent),
        None,
        Some(site_of),
        config,
    )
}

/// The loads beyond idle that GPU runs can draw at a site, kW, ascending: every sum of one run
/// load per GPU, each of a pool's GPUs idle or at one of its power levels. A gang at one level
/// draws such a sum too, so the run load of every plan lies on this lattice. `None` when it has
/// more than `LATTICE_MOST_POINTS` points.
fn load_lattice_kw(problem: &Problem, site: usize) -> Option<Vec<f64>> {
    let pue = problem.inst.sites[site].pue;
    let mut sums: Vec<i64> = vec![0];
    for pool in problem.pools.iter().filter(|p| p.site == site) {
        // Each load one pool's GPUs can draw, in lattice units, with the fewest GPUs drawing it.
        let mut reach: BTreeMap<i64, u32> = BTreeMap::from([(0, 0)]);
        for &level_w in &pool.levels_w {
            let step = (pue * (level_w - pool.idle_w) / 1000.0 / LATTICE_UNIT_KW).round() as i64;
            let mut next = reach.clone();
            for (&units, &gpus) in &reach {
                for n in 1..=pool.gpus.saturating_sub(gpus) {
                    let fewest = next.entry(units + i64::from(n) * step).or_insert(gpus + n);
                    *fewest = (*fewest).min(gpus + n);
                }
                if next.len() > LATTICE_MOST_POINTS {
                    return None;
                }
            }
            reach = next;
        }
        let mut combined: BTreeSet<i64> = BTreeSet::new();
        for &before in &sums {
            combined.extend(reach.keys().map(|&units| before + units));
            if combined.len() > LATTICE_MOST_POINTS {
                return None;
            }
        }
        sums = combined.into_iter().collect();
    }
    Some(
        sums.into_iter()
            .map(|u| u as f64 * LATTICE_UNIT_KW)
            .collect(),
    )
}

/// The lattice cut of a site and slot whose surplus leaves `headroom_kw` beyond the idle and
/// fixed load: with `a` the highest lattice point at or below the headroom and `b` the lowest
/// above it, the grid draw `e >= max(0, G - headroom)` of every run load `G` on the lattice
/// lies on or above the chord `e >= beta * (G - a)`, `beta = (b - headroom) / (b - a)`
/// (checkpoint transfers only add to the draw). Returns `(beta, a)`, or `None` where the
/// headroom lies outside the lattice or the chord lifts the LP by less than
/// `LATTICE_CUT_LEAST_KW`. Rationale: an LP fills the surplus with fractions of a GPU, which
/// a plan cannot; on S the bound was the idle load's emissions alone.
fn lattice_cut(lattice: &[f64], headroom_kw: f64) -> Option<(f64, f64)> {
    let above = lattice.partition_point(|&v| v <= headroom_kw);
    if above == 0 || above == lattice.len() {
        return None;
    }
    let (a, b) = (lattice[above - 1], lattice[above]);
    let beta = (b - headroom_kw) / (b - a);
    (beta * (headroom_kw - a) >= LATTICE_CUT_LEAST_KW).then_some((beta, a))
}

/// [`solve`], with the run variables on which `agree` and `warm` agree fixed (see
/// [`solve_rins`]) and each job with a site in `site_of` held there (see [`solve_at_sites`]).
fn build_and_solve(
    problem: &Problem,
    include: &[bool],
    warm: Option<&Schedule>,
    fixed: Option<&Schedule>,
    agree: Option<&Relaxed>,
    site_of: Option<&[Option<usize>]>,
    config: &MilpConfig,
) -> Result<MilpOutcome, String> {
    let n_sites = problem.inst.sites.len();
    let h = problem.slot_h;
    let mut b = Builder {
        vars: ProblemVariables::new(),
        warm: Vec::new(),
        constraints: Vec::new(),
        objective: Expression::from(0.0),
    };
    let binary = |relax: bool| {
        if relax {
            variable().min(0.0).max(1.0)
        } else {
            variable().binary()
        }
    };
    let warm_runs =
        |job: usize| -> Vec<Slot> { warm.and_then(|w| w.runs[job].clone()).unwrap_or_default() };
    // Site load per slot beyond idle other than the included jobs' GPU runs (the fixed jobs'
    // load and checkpoint transfers), and the warm start's load, for the power balance.
    let mut load: Vec<Vec<Expression>> =
        vec![vec![Expression::from(0.0); problem.n_slots]; n_sites];
    let mut warm_load: Vec<Vec<f64>> = (0..n_sites)
        .map(|s| vec![problem.idle_load_kw[s]; problem.n_slots])
        .collect();
    // The load the included jobs' GPU runs draw, and the fixed jobs' load.
    let mut gpu_load: Vec<Vec<Expression>> =
        vec![vec![Expression::from(0.0); problem.n_slots]; n_sites];
    let mut fixed_kw: Vec<Vec<f64>> = vec![vec![0.0; problem.n_slots]; n_sites];
    // GPUs used per pool and slot.
    let mut used: BTreeMap<(usize, usize), Expression> = BTreeMap::new();
    let mut x_vars: Vec<JobVars> = vec![JobVars::new(); problem.jobs.len()];
    // Column positions of the variables the solution is read from.
    let mut unserved_vars: Vec<Option<usize>> = vec![None; problem.jobs.len()];
    if let Some(fixed) = fixed {
        for (job, runs) in fixed.runs.iter().enumerate() {
            let Some(runs) = runs.as_ref().filter(|_| !include[job]) else {
                continue;
            };
            for run in runs {
                *used.entry((run.pool, run.slot)).or_default() +=
                    Expression::from(f64::from(problem.jobs[job].gpus));
            }
            for ((site, slot), kw) in problem.added_load_kw(job, runs) {
                load[site][slot] += Expression::from(kw);
                warm_load[site][slot] += kw;
                fixed_kw[site][slot] += kw;
            }
        }
    }
    let mut earliness_max_g = 0.0;
    let max_cost = (0..n_sites)
        .flat_map(|s| (0..problem.n_slots).map(move |t| (s, t)))
        .map(|(s, t)| problem.grid_cost_g_per_kwh(s, t))
        .fold(0.0, f64::max);

    for job in 0..problem.jobs.len() {
        if !include[job] {
            continue;
        }
        let view = &problem.jobs[job];
        let runs = warm_runs(job);
        let warm_at = |slot: usize| runs.iter().find(|r| r.slot == slot).copied();
        let mut pools = view.pools.clone();
        if let Some(current) = view.current_site
            && !view.migratable
        {
            pools.retain(|&p| problem.pools[p].site == current);
        }
        if let Some(site) = site_of.and_then(|s| s[job]) {
            pools.retain(|&p| problem.pools[p].site == site);
        }
        let mut run_sites: Vec<usize> = pools.iter().map(|&p| problem.pools[p].site).collect();
        run_sites.sort_unstable();
        run_sites.dedup();
        let mut loc_sites = run_sites.clone();
        if let Some(current) = view.current_site
            && !loc_sites.contains(&current)
        {
            loc_sites.push(current);
            loc_sites.sort_unstable();
        }

        // Placement, work and capacity.
        let mut work = Expression::from(0.0);
        // Number of slots the job runs in, for the slot-count cut below.
        let mut run_slots = Expression::from(0.0);
        // run[site][slot] and speed-weighted run (work per wall hour) per site and slot.
        let mut run_expr: BTreeMap<(usize, usize), Expression> = BTreeMap::new();
        let mut speed_expr: BTreeMap<(usize, usize), Expression> = BTreeMap::new();
        for slot in view.window.clone() {
            let mut one_place = Expression::from(0.0);
            for &pool in &pools {
                let site = problem.pools[pool].site;
                for level in 0..problem.pools[pool].levels_w.len() {
                    let on = warm_at(slot) == Some(Slot { slot, pool, level });
                    let lp =
                        agree.map(|a| a[job].get(&(slot, pool, level)).copied().unwrap_or(0.0));
                    let def = match lp {
                        Some(v) if on && v >= 1.0 - AGREE_EPS => variable().min(1.0).max(1.0),
                        Some(v) if !on && v <= AGREE_EPS => variable().min(0.0).max(0.0),
                        _ => binary(config.relax),
                    };
                    let x = b.add(def, if on { 1.0 } else { 0.0 });
                    x_vars[job].insert((slot, pool, level), b.warm.len() - 1);
                    one_place += x;
                    run_slots += x;
                    work += problem.slot_work_h(pool, level) * x;
                    *run_expr.entry((site, slot)).or_default() += x;
                    *speed_expr.entry((site, slot)).or_default() +=
                        (problem.pools[pool].speed * problem.pools[pool].throughput[level]) * x;
                    *used.entry((pool, slot)).or_default() += f64::from(view.gpus) * x;
                    let add_kw = problem.run_load_kw(job, pool, level);
                    gpu_load[site][slot] += add_kw * x;
                    if on {
                        warm_load[site][slot] += add_kw;
                    }
                    // The LP relaxation leaves the tie-break out: costs that small next to the
                    // grams trip HiGHS's postsolve on large relaxations.
                    let tie = if config.relax {
                        0.0
                    } else {
                        EARLINESS_G * slot as f64
                    };
                    b.objective += (tie + problem.change_g(job, slot, pool, level)) * x;
                    earliness_max_g += tie;
                }
            }
            b.constraints.push(one_place.leq(1.0));
        }

        // Locations and migrations: only when the job could be at two or more sites.
        let warm_sites: Vec<Option<usize>> = view
            .window
            .clone()
            .map(|slot| warm_at(slot).map(|r| problem.pools[r.pool].site))
            .collect();
        let mut warm_loc: Vec<usize> = Vec::new(); // index 0 = before the window
        {
            let first_site = warm_sites.iter().flatten().next().copied();
            let mut here = view.current_site.or(first_site).unwrap_or(loc_sites[0]);
            warm_loc.push(here);
            for s in &warm_sites {
                if let Some(s) = s {
                    here = *s;
                }
                warm_loc.push(here);
            }
        }
        if loc_sites.len() >= 2 {
            let start = view.window.start;
            let n = view.window.len() + 1;
            let mut loc: BTreeMap<(usize, usize), Variable> = BTreeMap::new(); // (site, idx)
            for idx in 0..n {
                let mut total = Expression::from(0.0);
                for &site in &loc_sites {
                    let warm_value = if warm_loc[idx] == site { 1.0 } else { 0.0 };
                    let def = if idx == 0 && view.current_site.is_some() {
                        let fixed = if view.current_site == Some(site) {
                            1.0
                        } else {
                            0.0
                        };
                        variable().min(fixed).max(fixed)
                    } else {
                        binary(config.relax)
                    };
                    let v = b.add(def, warm_value);
                    loc.insert((site, idx), v);
                    total += v;
                }
                b.constraints.push(total.eq(1.0));
            }
            let run_at = |site: usize, slot: usize| -> Expression {
                run_expr.get(&(site, slot)).cloned().unwrap_or_default()
            };
            for idx in 1..n {
                let slot = start + idx - 1;
                for &site in &loc_sites {
                    let here = loc[&(site, idx)];
                    let before = loc[&(site, idx - 1)];
                    b.constraints.push(run_at(site, slot).leq(here));
                    if view.migratable {
                        b.constraints.push((here - before).leq(run_at(site, slot)));
                    } else {
                        b.constraints.push((here - before).eq(0.0));
                    }
                }
            }
            if view.migratable {
                // Each obligation with its column, so a warm start that moves sets it.
                let mut obligation_vars: BTreeMap<(usize, usize), (Variable, usize)> =
                    BTreeMap::new();
                let max_speed = |site: usize| {
                    pools
                        .iter()
                        .filter(|&&p| problem.pools[p].site == site)
                        .map(|&p| problem.pools[p].speed)
                        .fold(0.0, f64::max)
                };
                for idx in 1..n {
                    let slot = start + idx - 1;
                    for &from in &loc_sites {
                        for &to in &run_sites {
                            if from == to {
                                continue;
                            }
                            let min_window = problem.min_window_slots(job, from, to);
                            let leave = loc[&(from, idx - 1)];
                            let arrive = loc[&(to, idx)];
                            if slot + min_window > view.window.end {
                                b.constraints.push((leave + arrive).leq(1.0));
                                continue;
                            }
                            let warm_m = if warm_loc[idx - 1] == from && warm_loc[idx] == to {
                                1.0
                            } else {
                                0.0
                            };
                            let m = b.add(variable().min(0.0).max(1.0), warm_m);
                            b.constraints.push((leave + arrive - m).leq(1.0));
                            b.objective += problem.inst.params.migration_penalty_g * m;
                            let kw = problem.transfer_kwh(job) / h;
                            load[from][slot] += kw * m;
                            load[to][slot] += kw * m;
                            if warm_m > 0.0 {
                                warm_load[from][slot] += kw;
                                warm_load[to][slot] += kw;
                            }
                            // Work lost while the checkpoint moves, in wall time from the slot start.
                            let transfer_h = problem.transfer_s(job, from, to) / 3600.0;
                            let top = max_speed(to);
                            let mut i = 0;
                            while transfer_h - i as f64 * h > 0.0 && slot + i < view.window.end {
                                let lost_h = (transfer_h - i as f64 * h).min(h);
                                let speed_here =
                                    speed_expr.get(&(to, slot + i)).cloned().unwrap_or_default();
                                let warm_loss = if warm_m > 0.0 {
                                    warm_at(slot + i)
                                        .filter(|r| problem.pools[r.pool].site == to)
                                        .map_or(0.0, |r| {
                                            lost_h
                                                * problem.pools[r.pool].speed
                                                * problem.pools[r.pool].throughput[r.level]
                                        })
                                } else {
                                    0.0
                                };
                                let loss = b.add(variable().min(0.0), warm_loss);
                                // loss >= lost_h * speed_here - lost_h * top * (1 - m)
                                b.constraints.push(
                                    (lost_h * speed_here + (lost_h * top) * m - loss)
                                        .leq(lost_h * top),
                                );
                                work -= loss;
                                i += 1;
                            }
                            // Feasibility domain: stay at least `min_window` slots and run there at
                            // or after the window's last slot before leaving.
                            if min_window >= 2 {
                                for k in 1..min_window {
                                    b.constraints
                                        .push(Expression::from(m).leq(loc[&(to, idx + k)]));
                                }
                                let due = slot + min_window - 1;
                                let (o, column) =
                                    *obligation_vars.entry((to, due)).or_insert_with(|| {
                                        let o = b.add(variable().min(0.0).max(1.0), 0.0);
                                        (o, b.warm.len() - 1)
                                    });
                                if warm_m > 0.0 {
                                    b.warm[column] = 1.0;
                                }
                                b.constraints.push(Expression::from(m).leq(o));
                            }
                        }
                    }
                }
                // Obligations carry forward until the job runs at the site, and never outlive it.
                let sites_with_due: Vec<usize> = {
                    let mut s: Vec<usize> = obligation_vars.keys().map(|&(site, _)| site).collect();
                    s.dedup();
                    s
                };
                for site in sites_with_due {
                    // The pending obligation and its warm value: due in the warm start, or
                    // carried from the slot before where the warm start did not run here.
                    let mut carried: Option<(Variable, f64)> = None;
                    for slot in view.window.clone() {
                        let created = obligation_vars.get(&(site, slot)).copied();
                        let pending = match (carried, created) {
                            (None, None) => None,
                            _ => {
                                let ran_here = slot > view.window.start
                                    && warm_at(slot - 1)
                                        .is_some_and(|r| problem.pools[r.pool].site == site);
                                let warm_created = created.map_or(0.0, |(_, c)| b.warm[c]);
                                let warm_carried = match carried {
                                    Some((_, w)) if !ran_here => w,
                                    _ => 0.0,
                                };
                                let warm_o = warm_created.max(warm_carried);
                                let o = b.add(variable().min(0.0).max(1.0), warm_o);
                                if let Some((c, _)) = created {
                                    b.constraints.push(Expression::from(c).leq(o));
                                }
                                if let Some((prev, _)) = carried {
                                    b.constraints.push((prev - run_at(site, slot - 1)).leq(o));
                                }
                                b.constraints
                                    .push(Expression::from(o).leq(loc[&(site, slot - start + 1)]));
                                Some((o, warm_o))
                            }
                        };
                        carried = pending;
                    }
                    if let Some((last, _)) = carried {
                        b.constraints
                            .push(Expression::from(last).leq(run_at(site, view.window.end - 1)));
                    }
                }
            }
        }

        // Slot-count cut: a job runs in whole slots, so it needs at least ceil(W / most work one
        // slot can give) of them; a job left out needs none. Rationale: it keeps the LP
        // relaxation from paying for a fraction of a short job's last slot.
        let most_per_slot_h = pools
            .iter()
            .map(|&p| problem.slot_work_h(p, 0))
            .fold(0.0, f64::max);
        let min_slots = (view.work_hours / most_per_slot_h - 1e-9).ceil().max(0.0);
        let mut slot_count_cut = run_slots;
        if config.soft_work {
            let max_thr_speed = pools
                .iter()
                .map(|&p| {
                    problem.pools[p].speed
                        * problem.pools[p].throughput.last().copied().unwrap_or(1.0)
                })
                .fold(f64::INFINITY, f64::min)
                .max(1e-3);
            let max_kw = pools
                .iter()
                .map(|&p| {
                    problem.run_load_kw(job, p, 0) + problem.idle_load_kw[problem.pools[p].site]
                })
                .fold(0.0, f64::max);
            let penalty = 10.0 * (max_cost + 1.0) * max_kw / max_thr_speed + 1000.0;
            let warm_unserved = if warm.and_then(|w| w.runs[job].as_ref()).is_some() {
                0.0
            } else {
                1.0
            };
            // All or nothing: a job is served in full or left out, never planned short.
            let unserved = b.add(binary(config.relax), warm_unserved);
            b.objective += (penalty * view.work_hours) * unserved;
            slot_count_cut += min_slots * unserved;
            work += view.work_hours * unserved;
            unserved_vars[job] = Some(b.warm.len() - 1);
        }
        b.constraints.push(slot_count_cut.geq(min_slots));
        b.constraints.push(work.geq(view.work_hours));
    }

    // Capacity.
    for (&(pool, _slot), expr) in &used {
        b.constraints
            .push(expr.clone().leq(f64::from(problem.pools[pool].gpus)));
    }
    let lattices: Vec<Option<Vec<f64>>> = (0..n_sites)
        .map(|site| load_lattice_kw(problem, site))
        .collect();
    // Power balance and grid limits: e >= idle + load - surplus, 0 <= e <= limit.
    for site in 0..n_sites {
        let spec = &problem.inst.sites[site];
        for slot in 0..problem.n_slots {
            let base = problem.idle_load_kw[site] - spec.surplus_kw[slot];
            let warm_e = (warm_load[site][slot] - spec.surplus_kw[slot]).max(0.0);
            let mut def = variable().min(0.0);
            if let Some(limit) = spec.grid_limit_kw {
                def = def.max(limit.max(base.max(0.0)));
            }
            let e = b.add(def, warm_e);
            b.objective += (h * problem.grid_cost_g_per_kwh(site, slot)) * e;
            let gpu_expr = std::mem::take(&mut gpu_load[site][slot]);
            let other_expr = std::mem::take(&mut load[site][slot]);
            // The loads GPU runs can draw are a lattice: where the surplus falls between two
            // of its points, the grid draw lies on or above the chord between them.
            let headroom_kw = -base - fixed_kw[site][slot];
            let cut = lattices[site]
                .as_deref()
                .and_then(|lattice| lattice_cut(lattice, headroom_kw));
            let Some((beta, at_kw)) = cut else {
                b.constraints.push((gpu_expr + other_expr - e).leq(-base));
                continue;
            };
            b.constraints
                .push((gpu_expr.clone() + other_expr - e).leq(-base));
            b.constraints
                .push((beta * gpu_expr - e).leq(beta * at_kw + LATTICE_CUT_SLACK_KW));
        }
    }

    let Builder {
        vars,
        warm: warm_values,
        constraints,
        objective,
    } = b;
    #[cfg(test)]
    if warm.is_some() && !config.relax {
        tests::record_warm_start(&vars, &warm_values, &constraints);
    }
    let mut highs_problem = vars
        .minimise(objective)
        .using(good_lp::solvers::highs::highs);
    for c in constraints {
        highs_problem.add_constraint(c);
    }
    let mut model = highs_problem.into_inner();
    model.make_quiet();
    if config.log {
        model.set_option("output_flag", true);
        model.set_option("log_to_console", true);
    }
    let time_limit_s = config
        .budget
        .map_or(config.time_limit_s, |b| config.time_limit_s.min(b.left_s()));
    model.set_option("time_limit", time_limit_s.max(0.01));
    model.set_option("mip_rel_gap", config.mip_rel_gap);
    model.set_option("threads", 1);
    model.set_option("random_seed", 0);
    if warm_values.len() > PRESOLVE_MOST_COLUMNS {
        model.set_option("presolve", "off");
        model.set_option("mip_detect_symmetry", false);
    }
    if warm.is_some() && !config.relax {
        model.set_solution(Some(&warm_values), None, None, None);
    }
    let solved = model
        .try_solve()
        .map_err(|e| format!("HiGHS failed: {e:?}"))?;
    use highs::HighsModelStatus as S;
    let status = solved.status();
    let has_solution = matches!(
        solved.primal_solution_status(),
        highs::HighsSolutionStatus::Feasible
    );
    let proven_optimal = matches!(status, S::Optimal);
    // The model leaves out the change penalty's constant part (see `Problem::change_g`).
    let constant_g = problem.change_constant_g() - earliness_max_g;
    let lower_bound_g = if config.relax {
        proven_optimal.then(|| solved.objective_value() + constant_g)
    } else {
        solved
            .double_info_value(c"mip_dual_bound")
            .ok()
            .filter(|v| v.is_finite())
            .map(|v| v + constant_g)
    };
    if matches!(status, S::Infeasible | S::UnboundedOrInfeasible) {
        return Err(
            "the model has no feasible plan (a site's idle load may exceed its grid limit)".into(),
        );
    }
    if config.relax {
        let relaxed = proven_optimal.then(|| {
            let values = solved.get_solution();
            let columns = values.columns();
            x_vars
                .iter()
                .map(|vars| {
                    vars.iter()
                        .filter(|(_, v)| columns[**v] > AGREE_EPS)
                        .map(|(&key, v)| (key, columns[*v]))
                        .collect()
                })
                .collect()
        });
        return Ok(MilpOutcome {
            schedule: None,
            unserved: Vec::new(),
            proven_optimal: false,
            lower_bound_g,
            relaxed,
        });
    }
    if !has_solution {
        return Ok(MilpOutcome {
            schedule: None,
            unserved: Vec::new(),
            proven_optimal: false,
            lower_bound_g,
            relaxed: None,
        });
    }
    let values = solved.get_solution();
    let columns = values.columns();
    // good_lp creates one HiGHS column per variable, in creation order, which `Builder::add`
    // mirrors in `warm`; the recorded positions index the solution.
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    let mut unserved = Vec::new();
    for job in 0..problem.jobs.len() {
        if !include[job] {
            continue;
        }
        if let Some(column) = unserved_vars[job]
            && columns[column] > 0.5
        {
            unserved.push(job);
            continue;
        }
        let mut slots: Vec<Slot> = x_vars[job]
            .iter()
            .filter(|(_, v)| columns[**v] > 0.5)
            .map(|(&(slot, pool, level), _)| Slot { slot, pool, level })
            .collect();
        slots.sort();
        runs[job] = Some(slots);
    }
    Ok(MilpOutcome {
        schedule: Some(Schedule { runs }),
        unserved,
        proven_optimal,
        lower_bound_g,
        relaxed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heuristic;
    use crate::instance::Instance;
    use crate::master::tests::random_instance;
    use crate::validate;

    thread_local! {
        /// Rows the last warm start on this thread broke, by more than HiGHS's tolerance.
        static WARM_START_BROKEN_ROWS: std::cell::Cell<Option<usize>> =
            const { std::cell::Cell::new(None) };
    }

    /// Counts the rows `warm` (one value per variable, in creation order) breaks.
    pub(super) fn record_warm_start(
        vars: &ProblemVariables,
        warm: &[f64],
        constraints: &[good_lp::Constraint],
    ) {
        let values: std::collections::HashMap<Variable, f64> = vars
            .iter_variables_with_def()
            .map(|(v, _)| v)
            .zip(warm.iter().copied())
            .collect();
        let broken = constraints
            .iter()
            .filter(|c| {
                let lhs = c.expression().eval_with(&values);
                if c.is_equality() {
                    lhs.abs() > 1e-6
                } else {
                    lhs > 1e-6
                }
            })
            .count();
        WARM_START_BROKEN_ROWS.with(|cell| cell.set(Some(broken)));
    }

    #[test]
    fn a_plan_that_moves_under_the_feasibility_domain_is_a_warm_start_that_breaks_no_row() {
        // 500 GB over 10 Gbit/s with 60 s to save and restore: 460 s, more than 0.1 of an hour,
        // so a move must stay two slots at its destination, an obligation of the model. The job
        // runs where the grid is clean: at `a` first, then at `b`.
        let instance = Instance::from_json(
            r#"{
              "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 6,
              "gpu_models": { "H100": { "power_levels_w": [700], "throughput": [1.0], "idle_w": 0 } },
              "sites": [
                { "id": "a", "gpus": { "H100": 1 }, "pue": 1.0, "wan_gbps": 10,
                  "surplus_kw": [0, 0, 0, 0, 0, 0], "carbon_g_per_kwh": [50, 50, 50, 600, 600, 600] },
                { "id": "b", "gpus": { "H100": 1 }, "pue": 1.0, "wan_gbps": 10,
                  "surplus_kw": [0, 0, 0, 0, 0, 0], "carbon_g_per_kwh": [600, 600, 600, 50, 50, 50] }
              ],
              "jobs": [
                { "id": "train", "gpus": 1, "work_hours": 5.5, "release_utc": "2023-06-01T00:00:00Z",
                  "deadline_utc": "2023-06-01T06:00:00Z", "checkpoint_gb": 500, "save_s": 30,
                  "restore_s": 30, "migratable": true, "home_site": "a" }
              ],
              "params": { "alpha": 0.1, "transfer_kwh_per_gb": 0 }
            }"#,
        )
        .expect("instance");
        let problem = Problem::new(&instance);
        assert_eq!(problem.min_window_slots(0, 0, 1), 2);
        let config = MilpConfig {
            budget: None,
            time_limit_s: 30.0,
            mip_rel_gap: 1e-7,
            relax: false,
            soft_work: false,
            log: false,
        };
        let include = [true];
        let first = solve(&problem, &include, None, None, &config).expect("solved");
        let plan = first.schedule.expect("a plan");
        assert_eq!(problem.evaluate(&plan).migrations.len(), 1, "{plan:?}");
        let again = solve(&problem, &include, Some(&plan), None, &config).expect("solved");
        assert_eq!(WARM_START_BROKEN_ROWS.with(|c| c.get()), Some(0));
        assert_eq!(again.schedule.as_ref(), Some(&plan));
    }

    /// A schedule as an LP point: 1 on each of its runs.
    fn as_relaxed(schedule: &Schedule) -> Relaxed {
        schedule
            .runs
            .iter()
            .map(|runs| {
                runs.iter()
                    .flatten()
                    .map(|r| ((r.slot, r.pool, r.level), 1.0))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_budget_gives_highs_only_what_is_left_of_it() {
        let quarter_left = crate::Stop::budget(|| 0.75);
        let budget = |stop| Budget {
            stop,
            limit_s: 40.0,
        };
        let overrun = crate::Stop::budget(|| 1.5);
        let no_budget = crate::Stop::default();
        assert!((budget(&quarter_left).left_s() - 10.0).abs() < 1e-9);
        assert!(budget(&overrun).left_s().abs() < 1e-9);
        assert_eq!(budget(&no_budget).left_s(), f64::INFINITY);

        // A budget spent while the model was built: HiGHS stops at once with the warm start,
        // where the 30 s the step was given would have searched on.
        let never = || false;
        let instance = random_instance(3, 20, 4, 24);
        let problem = Problem::new(&instance);
        let skip = vec![false; problem.jobs.len()];
        let (start, failed) = heuristic::construct(&problem, &skip, false, &never);
        assert!(failed.is_empty());
        let spent = crate::Stop::budget(|| 1.0);
        let config = MilpConfig {
            budget: Some(budget(&spent)),
            time_limit_s: 30.0,
            mip_rel_gap: 1e-7,
            relax: false,
            soft_work: false,
            log: false,
        };
        let include = vec![true; problem.jobs.len()];
        let started = std::time::Instant::now();
        let outcome = solve(&problem, &include, Some(&start), None, &config).expect("MILP");
        // Without the budget this MILP runs to its 30 s and proves nothing either.
        assert!(started.elapsed().as_secs_f64() < 10.0);
        assert!(!outcome.proven_optimal);
        let kept = outcome.schedule.expect("the warm start is kept");
        assert!(problem.evaluate(&kept).objective_g <= problem.evaluate(&start).objective_g + 1e-6);
    }

    #[test]
    fn rins_never_loses_the_incumbent_and_finds_the_optimum_the_relaxation_points_at() {
        let never = || false;
        let exact = MilpConfig {
            budget: None,
            time_limit_s: 30.0,
            mip_rel_gap: 1e-7,
            relax: false,
            soft_work: false,
            log: false,
        };
        let mut compared = 0;
        for seed in 0..10 {
            let instance = random_instance(seed, 7, 3, 10);
            let problem = Problem::new(&instance);
            let skip = vec![false; problem.jobs.len()];
            let (start, failed) = heuristic::construct(&problem, &skip, false, &never);
            if !failed.is_empty() {
                continue;
            }
            let include = vec![true; problem.jobs.len()];
            let start_g = problem.evaluate(&start).objective_g;
            let optimum = solve(&problem, &include, Some(&start), None, &exact).expect("MILP");
            let Some(best) = optimum.schedule.filter(|_| optimum.proven_optimal) else {
                continue;
            };
            let best_g = problem.evaluate(&best).objective_g;
            let tolerance = 1e-6 * best_g.max(1.0);

            // The compact LP relaxation: RINS from the heuristic's plan keeps or improves it.
            let lp_config = MilpConfig {
                relax: true,
                ..exact.clone()
            };
            let lp = solve(&problem, &include, None, None, &lp_config).expect("LP");
            let relaxed = lp.relaxed.expect("the LP solves");
            assert!(lp.lower_bound_g.expect("LP value") <= best_g + tolerance);
            let rins = solve_rins(&problem, &include, &start, &relaxed, &exact).expect("RINS");
            let plan = rins.schedule.expect("the incumbent is a solution");
            let plan_g = problem.evaluate(&plan).objective_g;
            assert!(
                plan_g <= start_g + tolerance,
                "seed {seed}: {plan_g} > {start_g}"
            );
            assert!(
                plan_g >= best_g - tolerance,
                "seed {seed}: {plan_g} < {best_g}"
            );
            let check = validate(&instance, &problem.to_plan(&plan, &[]));
            assert!(check.valid, "seed {seed}: {:?}", check.violations);

            // A relaxation that points at the optimum leaves its runs free: RINS finds it.
            let rins =
                solve_rins(&problem, &include, &start, &as_relaxed(&best), &exact).expect("RINS");
            let found_g = problem
                .evaluate(&rins.schedule.expect("a plan"))
                .objective_g;
            assert!(
                (found_g - best_g).abs() <= tolerance,
                "seed {seed}: {found_g} vs the optimum {best_g}"
            );
            // One that agrees with the incumbent fixes every run: the incumbent comes back.
            let rins =
                solve_rins(&problem, &include, &start, &as_relaxed(&start), &exact).expect("RINS");
            assert_eq!(rins.schedule.expect("a plan"), start, "seed {seed}");
            compared += 1;
        }
        assert!(compared >= 6, "only {compared} instances were compared");
    }

    #[test]
    fn the_load_lattice_holds_every_load_the_gpus_can_draw_and_its_chords_lie_below() {
        let instance = random_instance(3, 4, 3, 6);
        let problem = Problem::new(&instance);
        for site in 0..instance.sites.len() {
            let lattice = load_lattice_kw(&problem, site).expect("a small lattice");
            // Every GPU idle or at one level, enumerated GPU by GPU.
            let mut loads: Vec<f64> = vec![0.0];
            for pool in problem.pools.iter().filter(|p| p.site == site) {
                let pue = instance.sites[site].pue;
                let mut steps = vec![0.0];
                steps.extend(
                    pool.levels_w
                        .iter()
                        .map(|w| pue * (w - pool.idle_w) / 1000.0),
                );
                for _ in 0..pool.gpus {
                    loads = loads
                        .iter()
                        .flat_map(|l| steps.iter().map(move |s| l + s))
                        .collect();
                }
            }
            for load in &loads {
                let nearest = lattice
                    .iter()
                    .map(|v| (v - load).abs())
                    .fold(f64::INFINITY, f64::min);
                assert!(nearest < 1e-5, "site {site}: {load} kW is off the lattice");
            }
            for v in &lattice {
                assert!(
                    loads.iter().any(|l| (l - v).abs() < 1e-5),
                    "site {site}: {v} kW cannot be drawn"
                );
            }
            assert!(lattice.windows(2).all(|w| w[0] < w[1]));
            // The chord at any headroom never rises above the grid draw at a lattice point,
            // and lifts it strictly between the two points around the headroom.
            let top = lattice.last().copied().unwrap_or(0.0);
            let mut cuts = 0;
            for i in 0..=400 {
                let headroom = top * f64::from(i) / 400.0 - 0.01;
                let Some((beta, at)) = lattice_cut(&lattice, headroom) else {
                    continue;
                };
                cuts += 1;
                assert!(beta > 0.0 && beta <= 1.0);
                for &g in &lattice {
                    let draw = (g - headroom).max(0.0);
                    assert!(
                        beta * (g - at) <= draw + 1e-9,
                        "site {site}, headroom {headroom}: chord above the draw at {g} kW"
                    );
                }
                assert!(beta * (headroom - at) >= LATTICE_CUT_LEAST_KW);
            }
            assert!(cuts > 0, "site {site}: no headroom gave a cut");
        }
    }
}
