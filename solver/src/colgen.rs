//! Column generation over per-job schedules (price-and-branch), and the Lagrangian lower bound
//! it certifies.
//!
//! The master problem chooses one schedule (a column) per job; its rows are the couplings between
//! jobs: GPUs per pool and slot, and the power balance per site and slot with the grid draw as a
//! priced variable. Pricing is per job and exact on a discretised work grid (dynamic programming
//! over slots):
//!
//! - *relaxed pricing* lets a job pick any pool and power level in each slot, ignores migration
//!   losses, penalties and transfer energy, and rounds each slot's work **up** to the grid. Its
//!   schedules form a superset of every real schedule, so the Lagrangian function built from it
//!   is a true lower bound for any dual prices, converged or not;
//! - *real pricing* keeps a job at one site and rounds work **down**, so its schedules are real
//!   plans; every column is checked against the accounting rules before it is marked real.
//!
//! After the master LP converges (or its round budget ends), the master is solved as a MILP over
//! the real columns, warm-started from the seed plan. The schedule it returns is feasible by
//! construction; the bound is the best Lagrangian value seen.
//!
//! Must not perform I/O or read the clock: HiGHS keeps the MILP's time limit, the LP phase is
//! bounded by a round count.

use std::collections::BTreeSet;

use highs::{ColProblem, HighsModelStatus, Model, Row, Sense};

use crate::heuristic::progress;
use crate::problem::{Problem, Schedule, Slot};

/// A column enters when its reduced cost is below minus this, g.
const REDUCED_COST_EPS_G: f64 = 1e-6;

pub(crate) struct ColgenConfig<'a> {
    /// HiGHS time limit for the master MILP, seconds.
    pub mip_time_limit_s: f64,
    pub mip_rel_gap: f64,
    pub log: bool,
    /// Most master LP rounds (each re-solves the LP and prices every job).
    pub max_rounds: usize,
    /// Asked before each round after the first; `true` ends the rounds, and the master MILP
    /// runs over the columns so far.
    pub stop: &'a dyn Fn() -> bool,
}

pub(crate) struct ColgenOutcome {
    /// The master MILP's schedule over the included jobs (all served), if it found one.
    pub schedule: Option<Schedule>,
    /// A lower bound on the objective of every plan serving exactly the included jobs, g.
    pub lower_bound_g: Option<f64>,
    /// Whether pricing found no improving column before the round budget ended.
    pub converged: bool,
    pub rounds: usize,
    pub columns: usize,
}

#[derive(Clone)]
pub(crate) struct Column {
    pub job: usize,
    pub runs: Vec<Slot>,
    pub real: bool,
    pub cost_g: f64,
    /// (row index, coefficient).
    pub entries: Vec<(usize, f64)>,
}

/// Row layout of the master problem.
struct Rows {
    n_jobs_in: usize,
    /// Master row of each included job's convexity constraint.
    conv: Vec<Option<usize>>,
    n_pools: usize,
    n_slots: usize,
}

impl Rows {
    fn cap(&self, pool: usize, slot: usize) -> usize {
        self.n_jobs_in + pool * self.n_slots + slot
    }
    fn pow(&self, site: usize, slot: usize) -> usize {
        self.n_jobs_in + self.n_pools * self.n_slots + site * self.n_slots + slot
    }
}

/// Dual prices per job-independent row, clamped to the sign of a `<=` row in a minimisation.
struct Prices {
    /// g per GPU, per pool and slot.
    gpu: Vec<Vec<f64>>,
    /// g per kW (for one slot), per site and slot.
    kw: Vec<Vec<f64>>,
}

/// One way to run a slot at a site: pool, power level, added load and work at full slot time.
#[derive(Clone, Copy)]
struct RunOption {
    pool: usize,
    level: usize,
    load_kw: f64,
    work_h: f64,
    /// Work hours per wall hour, for the time lost to a transfer.
    work_per_h: f64,
}

/// The cheapest schedule on the work grid over `sites`, or `None` if they cannot finish the work.
///
/// A dynamic programme over slots whose state is where the job last ran and the work units done
/// so far. A move between sites (only for a migratable job) pays the migration penalty and the
/// transfer energy at both ends, and loses the transfer time in the slot it arrives in; losses
/// spilling into later slots and the feasibility domain are not modelled here, so a schedule can
/// come out unreal, which `make_column` detects.
fn cheapest_schedule(
    problem: &Problem,
    job: usize,
    prices: &Prices,
    sites: &[usize],
    round_up: bool,
) -> Option<(f64, Vec<Slot>)> {
    let view = &problem.jobs[job];
    if view.work_hours <= 1e-9 {
        // Nothing to run; in the relaxation a slot may still pay off (a previous run kept), so
        // the value is the sum of each slot's cheapest negative option, transfer costs ignored.
        let value: f64 = if round_up {
            view.window
                .clone()
                .map(|slot| {
                    view.pools
                        .iter()
                        .filter(|&&p| sites.contains(&problem.pools[p].site))
                        .flat_map(|&pool| {
                            (0..problem.pools[pool].levels_w.len()).map(move |level| {
                                let site = problem.pools[pool].site;
                                problem.change_g(job, slot, pool, level)
                                    + f64::from(view.gpus) * prices.gpu[pool][slot]
                                    + problem.run_load_kw(job, pool, level) * prices.kw[site][slot]
                            })
                        })
                        .fold(0.0, f64::min)
                })
                .sum()
        } else {
            0.0
        };
        return Some((value, Vec::new()));
    }
    let window = view.window.clone();
    if window.is_empty() || sites.is_empty() {
        return None;
    }
    let k = problem.work_grid_units(job);
    let unit_h = view.work_hours / k as f64;
    let to_units = |work_h: f64| Problem::grid_units(work_h, unit_h, k, round_up);
    // States: index into `states` = the site the job last ran at; the extra last state is "has
    // not run yet" when the job has no current site.
    let mut states: Vec<usize> = sites.to_vec();
    let start_state = match view.current_site {
        Some(c) => match states.iter().position(|&s| s == c) {
            Some(i) => i,
            None => {
                states.push(c);
                states.len() - 1
            }
        },
        None => states.len(),
    };
    let n_states = states.len() + 1;
    let penalty = problem.inst.params.migration_penalty_g;
    let transfer_kw = problem.transfer_kwh(job) / problem.slot_h;
    // Options per site index at full slot time.
    let site_options: Vec<Vec<RunOption>> = sites
        .iter()
        .map(|&site| {
            let mut options = Vec::new();
            for &pool in view
                .pools
                .iter()
                .filter(|&&p| problem.pools[p].site == site)
            {
                for level in 0..problem.pools[pool].levels_w.len() {
                    let p = &problem.pools[pool];
                    options.push(RunOption {
                        pool,
                        level,
                        load_kw: problem.run_load_kw(job, pool, level),
                        work_h: problem.slot_work_h(pool, level),
                        work_per_h: p.speed * p.throughput[level],
                    });
                }
            }
            options
        })
        .collect();
    let idx = |state: usize, u: usize| state * (k + 1) + u;
    let mut dp = vec![f64::INFINITY; n_states * (k + 1)];
    dp[idx(start_state, 0)] = 0.0;
    // Per slot: for each (state, units) reached, (previous state, previous units, run or none).
    let mut back: Vec<Vec<(u16, u16, Option<Slot>)>> = Vec::with_capacity(window.len());
    for slot in window.clone() {
        let mut next = dp.clone();
        let mut pick: Vec<(u16, u16, Option<Slot>)> = (0..n_states * (k + 1))
            .map(|i| ((i / (k + 1)) as u16, (i % (k + 1)) as u16, None))
            .collect();
        // Loop order: the cost and work of a transition depend on (from, to, option) only, so
        // they are computed once per slot and the inner loop over work units is adds and
        // compares.
        for from in 0..n_states {
            let row = &dp[idx(from, 0)..=idx(from, k)];
            let Some(first_u) = row.iter().position(|v| v.is_finite()) else {
                continue;
            };
            for (to, options) in site_options.iter().enumerate() {
                let moving = from != to && from < states.len();
                if moving && !view.migratable {
                    continue;
                }
                let (extra_g, lost_h) = if moving {
                    let (a, b) = (states[from], sites[to]);
                    (
                        penalty + transfer_kw * (prices.kw[a][slot] + prices.kw[b][slot]),
                        (problem.transfer_s(job, a, b) / 3600.0).min(problem.slot_h),
                    )
                } else {
                    (0.0, 0.0)
                };
                let site = sites[to];
                for option in options {
                    let RunOption {
                        pool,
                        level,
                        load_kw: kw,
                        work_h,
                        work_per_h,
                    } = *option;
                    let work_h = if moving {
                        work_h - lost_h * work_per_h
                    } else {
                        work_h
                    };
                    let units = to_units(work_h);
                    let step_g = extra_g
                        + problem.change_g(job, slot, pool, level)
                        + f64::from(view.gpus) * prices.gpu[pool][slot]
                        + kw * prices.kw[site][slot];
                    let run = Some(Slot { slot, pool, level });
                    for u in first_u..=k {
                        let base = row[u];
                        if !base.is_finite() {
                            continue;
                        }
                        let cost = base + step_g;
                        let target = idx(to, (u + units).min(k));
                        if cost < next[target] - 1e-12 {
                            next[target] = cost;
                            pick[target] = (from as u16, u as u16, run);
                        }
                    }
                }
            }
        }
        dp = next;
        back.push(pick);
    }
    let (mut state, best) = (0..n_states)
        .map(|s| (s, dp[idx(s, k)]))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    if !best.is_finite() {
        return None;
    }
    let mut runs = Vec::new();
    let mut u = k;
    for pick in back.iter().rev() {
        let (from, from_u, run) = pick[idx(state, u)];
        if let Some(run) = run {
            runs.push(run);
        }
        state = from as usize;
        u = from_u as usize;
    }
    runs.reverse();
    Some((best, runs))
}

/// Runs column generation over the jobs with `include[j]`, every one of which `seed` serves.
pub(crate) fn solve(
    problem: &Problem,
    include: &[bool],
    seed: &Schedule,
    config: &ColgenConfig,
) -> Result<ColgenOutcome, String> {
    let n_sites = problem.inst.sites.len();
    let n_slots = problem.n_slots;
    let n_pools = problem.pools.len();
    let h = problem.slot_h;
    let jobs: Vec<usize> = (0..problem.jobs.len()).filter(|&j| include[j]).collect();
    if jobs.iter().any(|&j| seed.runs[j].is_none()) {
        return Err("the seed plan must serve every included job".into());
    }
    let mut conv = vec![None; problem.jobs.len()];
    for (i, &j) in jobs.iter().enumerate() {
        conv[j] = Some(i);
    }
    let rows = Rows {
        n_jobs_in: jobs.len(),
        conv,
        n_pools,
        n_slots,
    };
    // Row bounds (upper; convexity rows are equalities) and the grid draw columns.
    let mut upper: Vec<f64> = vec![1.0; jobs.len()];
    for pool in &problem.pools {
        upper.extend(std::iter::repeat_n(f64::from(pool.gpus), n_slots));
    }
    let mut grid_cols: Vec<(f64, f64, usize)> = Vec::new(); // (cost per kW, limit kW, row)
    for site in 0..n_sites {
        let spec = &problem.inst.sites[site];
        for slot in 0..n_slots {
            let base = problem.idle_load_kw[site] - spec.surplus_kw[slot];
            upper.push(-base);
            let limit = spec
                .grid_limit_kw
                .map_or(f64::INFINITY, |l| l.max(base.max(0.0)));
            grid_cols.push((
                h * problem.grid_cost_g_per_kwh(site, slot),
                limit,
                rows.pow(site, slot),
            ));
        }
    }

    let make_column = |job: usize, runs: Vec<Slot>, relaxed_ok: bool| -> Option<Column> {
        let view = &problem.jobs[job];
        let real = progress(problem, job, &runs)
            .filter(|(done_h, _)| done_h + 1e-9 >= view.work_hours)
            .map(|(_, migrations)| migrations);
        if real.is_none() && !relaxed_ok {
            return None;
        }
        let mut entries: Vec<(usize, f64)> = Vec::new();
        for run in &runs {
            entries.push((rows.cap(run.pool, run.slot), f64::from(view.gpus)));
        }
        for ((site, slot), kw) in problem.added_load_kw(job, &runs) {
            entries.push((rows.pow(site, slot), kw));
        }
        entries.push((rows.conv[job].expect("included job"), 1.0));
        let change_g: f64 = runs
            .iter()
            .map(|r| problem.change_g(job, r.slot, r.pool, r.level))
            .sum();
        Some(Column {
            job,
            cost_g: problem.inst.params.migration_penalty_g * real.unwrap_or(0) as f64 + change_g,
            real: real.is_some(),
            runs,
            entries,
        })
    };

    let mut columns: Vec<Column> = Vec::new();
    let mut known: BTreeSet<(usize, Vec<Slot>)> = BTreeSet::new();
    for &j in &jobs {
        let runs = seed.runs[j].clone().expect("checked above");
        let column = make_column(j, runs.clone(), false)
            .ok_or_else(|| format!("the seed plan's schedule for job {j} is not feasible"))?;
        known.insert((j, runs));
        columns.push(column);
    }

    // The master LP, grown column by column.
    let (mut pb, row_handles) = master_problem(jobs.len(), &upper, &grid_cols);
    for c in &columns {
        pb.add_column(
            c.cost_g,
            0.0..,
            c.entries.iter().map(|&(r, v)| (row_handles[r], v)),
        );
    }
    let mut model = Model::new(pb);
    model.make_quiet();
    model.set_sense(Sense::Minimise);
    model.set_option("threads", 1);
    model.set_option("random_seed", 0);

    let mut best_bound: Option<f64> = None;
    let mut converged = false;
    let mut rounds = 0;
    while rounds < config.max_rounds.max(1) && !(rounds > 0 && (config.stop)()) {
        rounds += 1;
        let solved = model
            .try_solve()
            .map_err(|e| format!("HiGHS failed on the master LP: {e:?}"))?;
        if solved.status() != HighsModelStatus::Optimal {
            return Err(format!(
                "the master LP ended with status {:?}",
                solved.status()
            ));
        }
        let lp_value = solved.objective_value();
        let duals: Vec<f64> = solved.get_solution().dual_rows().to_vec();
        let prices = Prices {
            gpu: (0..n_pools)
                .map(|p| {
                    (0..n_slots)
                        .map(|t| -duals[rows.cap(p, t)].min(0.0))
                        .collect()
                })
                .collect(),
            kw: (0..n_sites)
                .map(|s| {
                    (0..n_slots)
                        .map(|t| -duals[rows.pow(s, t)].min(0.0))
                        .collect()
                })
                .collect(),
        };
        // Lagrangian bound: sum of the relaxed pricing minima, the grid draw's own minimum, and
        // the clamped prices times the row bounds.
        // The change penalty's constant part lies outside the master (see `Problem::change_g`).
        let mut bound = problem.change_constant_g();
        for (i, &u) in upper.iter().enumerate().skip(jobs.len()) {
            bound -= (-duals[i].min(0.0)) * u;
        }
        for &(cost, limit, row) in &grid_cols {
            let net = cost - (-duals[row].min(0.0));
            if net < 0.0 {
                bound += net * limit;
            }
        }
        let mut new_columns: Vec<Column> = Vec::new();
        let mut improving = false;
        for &j in &jobs {
            let view = &problem.jobs[j];
            let pi = duals[rows.conv[j].expect("included job")];
            let sites = problem.run_sites(j);
            // Relaxed pricing: the bound, and a column.
            let relaxed = if view.migratable {
                cheapest_schedule(problem, j, &prices, &sites, true)
            } else {
                sites
                    .iter()
                    .filter_map(|&s| cheapest_schedule(problem, j, &prices, &[s], true))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
            };
            let Some((relaxed_value, relaxed_runs)) = relaxed else {
                bound = f64::NEG_INFINITY;
                continue;
            };
            bound += relaxed_value;
            if relaxed_value - pi < -REDUCED_COST_EPS_G {
                improving = true;
            }
            let mut candidates = vec![(relaxed_runs, true)];
            for &s in &sites {
                if let Some((_, runs)) = cheapest_schedule(problem, j, &prices, &[s], false) {
                    candidates.push((runs, false));
                }
            }
            for (runs, relaxed_ok) in candidates {
                if known.contains(&(j, runs.clone())) {
                    continue;
                }
                let Some(column) = make_column(j, runs.clone(), relaxed_ok) else {
                    continue;
                };
                let reduced = column.cost_g
                    - column
                        .entries
                        .iter()
                        .map(|&(r, v)| duals[r] * v)
                        .sum::<f64>();
                if reduced < -REDUCED_COST_EPS_G {
                    known.insert((j, runs));
                    new_columns.push(column);
                }
            }
        }
        if bound.is_finite() {
            best_bound = Some(best_bound.map_or(bound, |b: f64| b.max(bound)));
        }
        if config.log {
            println!(
                "colgen round {rounds}: LP {lp_value:.3} g, bound {bound:.3} g, {} new columns",
                new_columns.len()
            );
        }
        if !improving {
            converged = true;
            let lp_bound = lp_value + problem.change_constant_g();
            best_bound = Some(best_bound.map_or(lp_bound, |b| b.max(lp_bound)));
            break;
        }
        if new_columns.is_empty() {
            break;
        }
        model = grow(solved, &new_columns, &row_handles)?;
        columns.extend(new_columns);
    }

    let schedule = solve_master_mip(problem, &jobs, &upper, &grid_cols, &columns, config)?;
    Ok(ColgenOutcome {
        schedule,
        lower_bound_g: best_bound,
        converged,
        rounds,
        columns: columns.len(),
    })
}

/// A solved master with `columns` added; HiGHS keeps its basis for the next solve.
pub(crate) fn grow(
    solved: highs::SolvedModel,
    columns: &[Column],
    rows: &[Row],
) -> Result<Model, String> {
    let mut model = Model::from(solved);
    for c in columns {
        model
            .try_add_column(
                c.cost_g,
                0.0..,
                c.entries.iter().map(|&(r, v)| (rows[r], v)),
            )
            .map_err(|e| format!("HiGHS refused a column: {e:?}"))?;
    }
    Ok(model)
}

/// The master's rows (convexity per included job, then GPU and power rows with their upper
/// bounds) and its grid draw columns, without job columns.
pub(crate) fn master_problem(
    n_jobs_in: usize,
    upper: &[f64],
    grid_cols: &[(f64, f64, usize)],
) -> (ColProblem, Vec<Row>) {
    let mut pb = ColProblem::default();
    let rows: Vec<Row> = upper
        .iter()
        .enumerate()
        .map(|(i, &u)| {
            if i < n_jobs_in {
                pb.add_row(1.0..=1.0)
            } else {
                pb.add_row(..=u)
            }
        })
        .collect();
    for &(cost, limit, row) in grid_cols {
        if limit.is_finite() {
            pb.add_column(cost, 0.0..=limit, [(rows[row], -1.0)]);
        } else {
            pb.add_column(cost, 0.0.., [(rows[row], -1.0)]);
        }
    }
    (pb, rows)
}

/// Solves the master problem with integer columns over the real ones, warm-started from the seed
/// columns (the first one per job).
pub(crate) fn solve_master_mip(
    problem: &Problem,
    jobs: &[usize],
    upper: &[f64],
    grid_cols: &[(f64, f64, usize)],
    columns: &[Column],
    config: &ColgenConfig,
) -> Result<Option<Schedule>, String> {
    let (mut pb, row_handles) = master_problem(jobs.len(), upper, grid_cols);
    let mut load = vec![0.0; upper.len()];
    let mut start: Vec<f64> = Vec::new();
    let mut seeded = vec![false; problem.jobs.len()];
    let real: Vec<&Column> = columns.iter().filter(|c| c.real).collect();
    let mut seed_values = Vec::with_capacity(real.len());
    for c in &real {
        let on = !seeded[c.job];
        seeded[c.job] = true;
        if on {
            for &(r, v) in &c.entries {
                load[r] += v;
            }
        }
        seed_values.push(if on { 1.0 } else { 0.0 });
    }
    for &(_, _, row) in grid_cols {
        start.push((load[row] - upper[row]).max(0.0));
    }
    for c in &real {
        pb.add_integer_column(
            c.cost_g,
            0.0..=1.0,
            c.entries.iter().map(|&(r, v)| (row_handles[r], v)),
        );
    }
    start.extend(seed_values);
    let mut model = Model::new(pb);
    model.make_quiet();
    if config.log {
        model.set_option("output_flag", true);
        model.set_option("log_to_console", true);
    }
    model.set_sense(Sense::Minimise);
    model.set_option("threads", 1);
    model.set_option("random_seed", 0);
    model.set_option("time_limit", config.mip_time_limit_s.max(0.01));
    model.set_option("mip_rel_gap", config.mip_rel_gap);
    // A refused start only costs time: the MILP then searches without it.
    let _ = model.try_set_solution(Some(&start), None, None, None);
    let solved = model
        .try_solve()
        .map_err(|e| format!("HiGHS failed on the master MILP: {e:?}"))?;
    if !matches!(
        solved.primal_solution_status(),
        highs::HighsSolutionStatus::Feasible
    ) {
        return Ok(None);
    }
    let values = solved.get_solution();
    let values = &values.columns()[grid_cols.len()..];
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    for (c, &v) in real.iter().zip(values) {
        if v > 0.5 {
            runs[c.job] = Some(c.runs.clone());
        }
    }
    if jobs.iter().any(|&j| runs[j].is_none()) {
        return Ok(None);
    }
    Ok(Some(Schedule { runs }))
}
