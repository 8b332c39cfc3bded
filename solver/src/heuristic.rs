//! The run-now baseline and the constructive heuristic.
//!
//! The heuristic places jobs in deadline order, each in the slots (at one site, or across sites
//! for a migratable job) where its marginal grid cost per work hour is lowest given the jobs
//! already placed, then improves the plan by taking each job out and putting it back where it is
//! now cheapest. It always yields a plan that respects capacity, grid limits, windows and the
//! feasibility domain; it serves as the MILP's starting point and as the answer when the MILP
//! finds nothing better in time.
//! It must not perform I/O or read the clock.

use crate::plan::Infeasible;
use crate::problem::{Problem, Schedule, Slot};

/// Residual state while jobs are placed one by one.
#[derive(Clone)]
pub(crate) struct Residual<'p> {
    /// Load per site and slot, kW.
    load_kw: Vec<Vec<f64>>,
    /// Free GPUs per pool and slot.
    pub free: Vec<Vec<u32>>,
    /// When set, placements are costed at these prices instead of the exact marginal cost.
    prices: Option<&'p Prices>,
    /// When set, placements may use GPUs that are taken and grid headroom that is drawn (the
    /// target of an ejection move, whose holders then make room); costs stay exact.
    pub overbook: bool,
    /// When set (and `prices` is not), placements also pay these prices per GPU, per pool and
    /// slot, on top of the exact grid cost: the value of a GPU-slot another job could use.
    pub congestion: Option<&'p [Vec<f64>]>,
    /// When set, placements use only the sites with `true` here.
    pub sites: Option<Vec<bool>>,
}

/// Prices of the coupling rows (from the Lagrangian dual): g per GPU per pool and slot, and g
/// per kW held for a slot per site and slot.
pub(crate) struct Prices {
    pub gpu: Vec<Vec<f64>>,
    pub kw: Vec<Vec<f64>>,
}

/// A schedule and the jobs it leaves out, with the reason.
pub(crate) type Pass = (Schedule, Vec<(usize, String)>);

/// Rounds of remove-and-reinsert after the first pass.
const IMPROVEMENT_ROUNDS: usize = 10;
/// The rounds end once one gains less than this share of the objective the first pass
/// reached (and places no job the pass left out): later rounds then move few jobs for little,
/// and on 10,000 jobs each costs seconds.
const ROUND_GAIN_SHARE: f64 = 1e-4;

impl<'p> Residual<'p> {
    pub fn new(problem: &Problem) -> Residual<'p> {
        Residual {
            prices: None,
            overbook: false,
            congestion: None,
            sites: None,
            load_kw: (0..problem.inst.sites.len())
                .map(|s| vec![problem.idle_load_kw[s]; problem.n_slots])
                .collect(),
            free: problem
                .pools
                .iter()
                .map(|p| vec![p.gpus; problem.n_slots])
                .collect(),
        }
    }

    /// Grid cost (g) of adding `add_kw` at a site and slot, or `None` if it breaks the grid limit.
    fn marginal_cost_g(
        &self,
        problem: &Problem,
        site: usize,
        slot: usize,
        add_kw: f64,
    ) -> Option<f64> {
        let spec = &problem.inst.sites[site];
        let surplus = spec.surplus_kw[slot];
        let before = (self.load_kw[site][slot] - surplus).max(0.0);
        let after = (self.load_kw[site][slot] + add_kw - surplus).max(0.0);
        if !self.overbook && add_kw > 0.0 && self.over_limit_kw(problem, site, slot, add_kw) > 1e-9
        {
            return None;
        }
        if let Some(prices) = self.prices {
            return Some(add_kw * prices.kw[site][slot]);
        }
        Some((after - before) * problem.slot_h * problem.grid_cost_g_per_kwh(site, slot))
    }

    /// How far adding `add_kw` at a site and slot would take its grid draw past the site's
    /// grid limit, kW (0 when it fits or the site has no limit).
    pub fn over_limit_kw(&self, problem: &Problem, site: usize, slot: usize, add_kw: f64) -> f64 {
        let spec = &problem.inst.sites[site];
        spec.grid_limit_kw.map_or(0.0, |limit| {
            (self.load_kw[site][slot] + add_kw - spec.surplus_kw[slot] - limit).max(0.0)
        })
    }

    /// Cost of drawing one more kW for the slot at a site beyond its surplus, g: the power price
    /// when placements are priced, else the grid's objective weight over the slot.
    fn weight_g_per_kw(&self, problem: &Problem, site: usize, slot: usize) -> f64 {
        match self.prices {
            Some(prices) => prices.kw[site][slot],
            None => problem.slot_h * problem.grid_cost_g_per_kwh(site, slot),
        }
    }

    /// The GPU prices placements pay, if any.
    fn gpu_price(&self) -> Option<&'p [Vec<f64>]> {
        self.prices.map(|p| p.gpu.as_slice()).or(self.congestion)
    }

    /// Adds (`sign` = 1) or removes (`sign` = -1) a job's runs and transfer energy.
    pub fn apply(&mut self, problem: &Problem, job: usize, runs: &[Slot], sign: f64) {
        for ((site, slot), kw) in problem.added_load_kw(job, runs) {
            self.load_kw[site][slot] += sign * kw;
        }
        let gpus = problem.jobs[job].gpus;
        for run in runs {
            let free = &mut self.free[run.pool][run.slot];
            *free = if sign > 0.0 {
                *free - gpus
            } else {
                *free + gpus
            };
        }
    }

    /// Exact objective increase of adding a job's runs, or `None` if they do not fit.
    pub fn cost_g(
        &self,
        problem: &Problem,
        job: usize,
        runs: &[Slot],
        migrations: usize,
    ) -> Option<f64> {
        let gpus = problem.jobs[job].gpus;
        if !self.overbook && runs.iter().any(|r| self.free[r.pool][r.slot] < gpus) {
            return None;
        }
        let mut cost = problem.inst.params.migration_penalty_g * migrations as f64;
        if let Some(gpu_price) = self.gpu_price() {
            cost += runs
                .iter()
                .map(|r| f64::from(gpus) * gpu_price[r.pool][r.slot])
                .sum::<f64>();
        }
        for ((site, slot), kw) in problem.added_load_kw(job, runs) {
            cost += self.marginal_cost_g(problem, site, slot, kw)?;
        }
        Some(cost)
    }
}

/// Work a job's runs deliver under the accounting rules, and its number of migrations; `None`
/// when a move breaks the feasibility domain or the job may not move.
pub(crate) fn progress(problem: &Problem, job: usize, runs: &[Slot]) -> Option<(f64, usize)> {
    let view = &problem.jobs[job];
    let mut previous = view.current_site;
    let mut moved: Option<(usize, f64)> = None; // (migration slot, transfer seconds)
    let mut done_h = 0.0;
    let mut migrations = 0;
    for (i, run) in runs.iter().enumerate() {
        let site = problem.pools[run.pool].site;
        if let Some(prev) = previous
            && prev != site
        {
            if !view.migratable {
                return None;
            }
            let last_here = runs[i..]
                .iter()
                .take_while(|r| problem.pools[r.pool].site == site)
                .last()
                .map_or(run.slot, |r| r.slot);
            if last_here - run.slot + 1 < problem.min_window_slots(job, prev, site) {
                return None;
            }
            moved = Some((run.slot, problem.transfer_s(job, prev, site)));
            migrations += 1;
        }
        previous = Some(site);
        let mut effective_h = problem.slot_h;
        if let Some((slot, transfer_s)) = moved {
            let elapsed_s = (run.slot - slot) as f64 * problem.slot_s;
            effective_h -= (transfer_s - elapsed_s).clamp(0.0, problem.slot_s) / 3600.0;
        }
        let pool = &problem.pools[run.pool];
        done_h += effective_h * pool.speed * pool.throughput[run.level];
    }
    Some((done_h, migrations))
}

/// Places every job with a non-empty window: first in deadline order, then in rounds that take
/// each job out and put it back where it is now cheapest. Jobs that cannot be placed are
/// returned with the reason.
///
/// Passes are made in deadline order and in size order, each either spreading migratable jobs
/// over sites or keeping every job at one site; when a pass leaves jobs out, it is repeated with
/// those jobs placed first. The pass that places
/// more jobs, then costs less, wins. Rationale: spreading is usually cheaper but can take
/// capacity a later job needed, and deadline order can starve a large job with a late deadline.
///
/// With `quick` only the two deadline-order passes run (large instances). The passes run side
/// by side, one thread each, and are compared in a fixed order, so the answer does not depend on
/// the threads. Once `stop` answers `true`, no further retry or improvement round starts.
pub(crate) fn construct(
    problem: &Problem,
    skip: &[bool],
    quick: bool,
    stop: &(dyn Fn() -> bool + Sync),
) -> Pass {
    let mut best: Option<((usize, f64), Pass)> = None;
    // Largest jobs (GPU x work hours) first is the other natural order: they get the clean
    // capacity and the small ones fill in around them.
    let mut by_size: Vec<usize> = (0..problem.jobs.len()).filter(|&j| !skip[j]).collect();
    by_size.sort_by(|&a, &b| {
        let size = |j: usize| f64::from(problem.jobs[j].gpus) * problem.jobs[j].work_hours;
        size(b).total_cmp(&size(a)).then(a.cmp(&b))
    });
    let configurations = [
        (true, Vec::new()),
        (false, Vec::new()),
        (true, by_size.clone()),
        (false, by_size),
    ];
    let n_configurations = if quick { 2 } else { configurations.len() };
    // The passes are independent: one thread each, compared in configuration order.
    let passes: Vec<((usize, f64), Pass)> = std::thread::scope(|scope| {
        let handles: Vec<_> = configurations
            .into_iter()
            .take(n_configurations)
            .map(|(spread, seed_order)| {
                scope.spawn(move || {
                    with_retries(problem, skip, spread, seed_order, None, None, stop)
                })
            })
            .collect();
        handles.into_iter().map(join).collect()
    });
    for pass in passes {
        if best.as_ref().is_none_or(|(k, _)| pass.0 < *k) {
            best = Some(pass);
        }
    }
    best.expect("at least one pass runs").1
}

/// A scoped thread's answer; a panic in it goes on in the caller.
pub(crate) fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A pass, repeated up to twice with the jobs it left out placed first; returns the best try
/// (fewest jobs left out, then lowest objective; the earlier on a tie) with its key.
fn with_retries(
    problem: &Problem,
    skip: &[bool],
    spread: bool,
    mut first: Vec<usize>,
    prices: Option<&Prices>,
    prefer: Option<&Schedule>,
    stop: &(dyn Fn() -> bool + Sync),
) -> ((usize, f64), Pass) {
    let key = |pass: &Pass| (pass.1.len(), problem.evaluate(&pass.0).objective_g);
    let mut best: Option<((usize, f64), Pass)> = None;
    for _ in 0..3 {
        if best.is_some() && stop() {
            break;
        }
        let pass = construct_pass(problem, skip, spread, &first, prices, prefer, stop);
        let pass_key = key(&pass);
        let failed: Vec<usize> = pass.1.iter().map(|(j, _)| *j).collect();
        if best.as_ref().is_none_or(|(k, _)| pass_key < *k) {
            best = Some((pass_key, pass));
        }
        if failed.is_empty() {
            break;
        }
        for job in failed {
            if !first.contains(&job) {
                first.push(job);
            }
        }
    }
    best.expect("at least one pass runs")
}

/// Keeps the runs in `kept` (jobs with `Some` there) and places every other job with a
/// non-empty window around them, in deadline order, spreading where that is cheaper. Used to
/// warm-start from the previous plan; the caller validates the result.
pub(crate) fn complete(problem: &Problem, skip: &[bool], kept: &Schedule) -> Pass {
    let mut residual = Residual::new(problem);
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    for (job, slots) in kept.runs.iter().enumerate() {
        if let Some(slots) = slots.as_ref().filter(|_| !skip[job]) {
            residual.apply(problem, job, slots, 1.0);
            runs[job] = Some(slots.clone());
        }
    }
    let mut order: Vec<usize> = (0..problem.jobs.len())
        .filter(|&j| !skip[j] && runs[j].is_none())
        .collect();
    order.sort_by_key(|&j| (problem.jobs[j].window.end, problem.jobs[j].window.start, j));
    let mut failed = Vec::new();
    for job in order {
        match best_placement(problem, &residual, job, true) {
            Some((_, slots)) => {
                residual.apply(problem, job, &slots, 1.0);
                runs[job] = Some(slots);
            }
            None => failed.push((job, "no GPU capacity or grid headroom left before its deadline once the other jobs are placed".to_string())),
        }
    }
    (Schedule { runs }, failed)
}

/// Places every job as `construct` does, but costs each first placement at the coupling
/// prices (GPU congestion and the value of power per site and slot) instead of the marginal cost
/// given the jobs placed before it; the improvement rounds then use exact costs. The first pass
/// keeps each job's `relaxed` schedule (the Lagrangian subproblem's answer at these prices)
/// where it still fits once the jobs before it are placed; the second places every job afresh;
/// the third does so least slack first (the jobs with the fewest spare slots in their windows
/// choose first, so flexible jobs fill in around them). Returns the best.
pub(crate) fn construct_priced(
    problem: &Problem,
    skip: &[bool],
    prices: &Prices,
    relaxed: &Schedule,
    stop: &(dyn Fn() -> bool + Sync),
) -> Pass {
    // The three passes are independent: one thread each, compared in this order.
    let least_slack = least_slack_first(problem, skip);
    let ((ka, a), b, c) = std::thread::scope(|scope| {
        let b = scope.spawn(|| construct_pass(problem, skip, true, &[], Some(prices), None, stop));
        let c = scope
            .spawn(|| construct_pass(problem, skip, true, &least_slack, Some(prices), None, stop));
        let a = with_retries(
            problem,
            skip,
            true,
            Vec::new(),
            Some(prices),
            Some(relaxed),
            stop,
        );
        (a, join(b), join(c))
    });
    let kb = (b.1.len(), problem.evaluate(&b.0).objective_g);
    let (kb, b) = if ka <= kb { (ka, a) } else { (kb, b) };
    let kc = (c.1.len(), problem.evaluate(&c.0).objective_g);
    if kb <= kc { b } else { c }
}

/// The jobs without `skip[j]`, least slack first: the slots in the window beyond those the job
/// needs at its fastest pool at full power (ties by id order).
fn least_slack_first(problem: &Problem, skip: &[bool]) -> Vec<usize> {
    let slack = |j: usize| {
        let fastest_h = problem.fastest_slot_h(j);
        let needed = if fastest_h > 0.0 {
            problem.jobs[j].work_hours / fastest_h
        } else {
            f64::INFINITY
        };
        problem.jobs[j].window.len() as f64 - needed
    };
    let mut order: Vec<usize> = (0..problem.jobs.len()).filter(|&j| !skip[j]).collect();
    order.sort_by(|&a, &b| slack(a).total_cmp(&slack(b)).then(a.cmp(&b)));
    order
}

fn construct_pass(
    problem: &Problem,
    skip: &[bool],
    spread: bool,
    first: &[usize],
    prices: Option<&Prices>,
    prefer: Option<&Schedule>,
    stop: &(dyn Fn() -> bool + Sync),
) -> Pass {
    let mut residual = Residual::new(problem);
    residual.prices = prices;
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    let mut order: Vec<usize> = (0..problem.jobs.len()).filter(|&j| !skip[j]).collect();
    let mut rank = vec![usize::MAX; problem.jobs.len()];
    for (position, &j) in first.iter().enumerate().rev() {
        rank[j] = position;
    }
    order.sort_by_key(|&j| {
        (
            rank[j],
            problem.jobs[j].window.end,
            problem.jobs[j].window.start,
            j,
        )
    });
    for &job in &order {
        // A preferred schedule is kept when it still fits and finishes the job.
        let preferred = prefer
            .and_then(|p| p.runs[job].as_ref())
            .filter(|slots| {
                progress(problem, job, slots).is_some_and(|(done_h, migrations)| {
                    done_h + 1e-9 >= problem.jobs[job].work_hours
                        && residual.cost_g(problem, job, slots, migrations).is_some()
                })
            })
            .cloned();
        let placed = preferred
            .or_else(|| best_placement(problem, &residual, job, spread).map(|(_, slots)| slots));
        if let Some(slots) = placed {
            residual.apply(problem, job, &slots, 1.0);
            runs[job] = Some(slots);
        }
    }
    residual.prices = None;
    let placed_g = problem
        .evaluate(&Schedule { runs: runs.clone() })
        .objective_g;
    for _ in 0..IMPROVEMENT_ROUNDS {
        if stop() {
            break;
        }
        let mut improved = false;
        let mut gain_g = 0.0;
        let mut newly_placed = false;
        for &job in &order {
            let current = runs[job].take();
            if let Some(slots) = &current {
                residual.apply(problem, job, slots, -1.0);
            }
            let current_cost = current.as_ref().and_then(|slots| {
                let (_, migrations) = progress(problem, job, slots)?;
                residual.cost_g(problem, job, slots, migrations)
            });
            let candidate = best_placement(problem, &residual, job, spread);
            let chosen = match (current, current_cost, candidate) {
                (Some(cur), Some(cur_cost), Some((cost, slots))) => {
                    if cost < cur_cost - 1e-6 {
                        improved = true;
                        gain_g += cur_cost - cost;
                        slots
                    } else {
                        cur
                    }
                }
                (None, _, Some((_, slots))) => {
                    improved = true;
                    newly_placed = true;
                    slots
                }
                (Some(cur), _, _) => cur,
                (None, _, None) => continue,
            };
            residual.apply(problem, job, &chosen, 1.0);
            runs[job] = Some(chosen);
        }
        if !improved || (!newly_placed && gain_g < ROUND_GAIN_SHARE * placed_g) {
            break;
        }
    }
    let failed = order
        .iter()
        .filter(|&&j| runs[j].is_none())
        .map(|&j| (j, "no GPU capacity or grid headroom left before its deadline once the other jobs are placed".to_string()))
        .collect();
    (Schedule { runs }, failed)
}

/// The cheapest placement found for a job given the residual state: each single site, and for a
/// migratable job the cheapest slots across all sites. Returns (cost, runs).
///
/// Each (slot, pool, level) option's cost per work hour is computed once and shared by every
/// candidate site set and deepest power cap; a candidate whose runs' separate costs (a floor
/// under their exact cost: the grid cost is convex in the load and migrations only add) already
/// reach the best cost found is not costed exactly. Rationale: a migratable job on 50 sites has
/// 51 candidates times 4 caps, which made placements the bulk of constructions and local search.
pub(crate) fn best_placement(
    problem: &Problem,
    residual: &Residual,
    job: usize,
    spread: bool,
) -> Option<(f64, Vec<Slot>)> {
    let view = &problem.jobs[job];
    let mut sites = problem.run_sites(job);
    if let Some(allowed) = &residual.sites {
        sites.retain(|&s| allowed[s]);
    }
    let table = OptionTable::new(problem, residual, job, &sites);
    let candidates = table.candidates(problem, &sites, spread && view.migratable);
    // Deeper power caps save energy per work hour but may leave too few slots to finish, so the
    // deepest allowed cap is varied too.
    let most_levels = table.levels;
    let mut best: Option<(f64, Vec<Slot>)> = None;
    let mut options: Vec<(f64, Slot)> = Vec::new();
    // Per pool of the table and power level, the cheapest cost per work hour with levels no
    // deeper than that one: over a candidate's pools, times the job's work, a floor under
    // every placement the candidate gives with those levels when every cost is non-negative.
    // A candidate and level whose floor lies above the best cost found cannot beat it, so they
    // are not costed: the same placement for a fraction of the work (docs/benchmarks.md).
    let width = view.window.len();
    let mut pool_floor = vec![f64::INFINITY; table.pools.len() * most_levels];
    if table.nonnegative {
        for (k, floors) in pool_floor.chunks_mut(most_levels).enumerate() {
            for s in 0..width {
                let row = &table.per_work[(k * width + s) * most_levels..][..most_levels];
                for (floor, &c) in floors.iter_mut().zip(row) {
                    *floor = floor.min(c);
                }
            }
            for level in 1..most_levels {
                floors[level] = floors[level].min(floors[level - 1]);
            }
        }
    }
    for allowed in &candidates {
        let cheapest_per_work = |level: usize| {
            allowed
                .iter()
                .map(|&k| pool_floor[k * most_levels + level])
                .fold(f64::INFINITY, f64::min)
        };
        for deepest_level in (0..most_levels).rev() {
            let best_g = best.as_ref().map_or(f64::INFINITY, |(c, _)| *c);
            if table.nonnegative
                && view.work_hours > 1e-9
                && cheapest_per_work(deepest_level) * view.work_hours > best_g + 1e-6
            {
                continue;
            }
            if let Some((cost, slots)) = cheapest_slots(
                problem,
                residual,
                job,
                &table,
                allowed,
                deepest_level,
                best_g,
                &mut options,
            ) && cost < best_g - 1e-9
            {
                best = Some((cost, slots));
            }
        }
    }
    best
}

/// A job's options given the residual state: per pool it may use (at the sites asked for),
/// window slot and power level, the cost per work hour of running there, infinite where the
/// GPUs are taken or the grid limit would break.
struct OptionTable {
    /// The job's pools at the sites asked for, in the job's pool order.
    pools: Vec<usize>,
    /// Most power levels over those pools.
    levels: usize,
    /// `per_work[(k * window + s) * levels + level]` for pool `pools[k]` and window slot `s`.
    per_work: Vec<f64>,
    /// Whether every cost the job can meet is non-negative (grid weights or power prices at its
    /// sites and slots, GPU prices, the migration penalty): only then is the sum of its runs'
    /// separate costs a floor under their exact cost.
    nonnegative: bool,
}

impl OptionTable {
    fn new(problem: &Problem, residual: &Residual, job: usize, sites: &[usize]) -> OptionTable {
        let view = &problem.jobs[job];
        let pools: Vec<usize> = view
            .pools
            .iter()
            .copied()
            .filter(|&p| sites.contains(&problem.pools[p].site))
            .collect();
        let levels = pools
            .iter()
            .map(|&p| problem.pools[p].levels_w.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let width = view.window.len();
        let mut per_work = vec![f64::INFINITY; pools.len() * width * levels];
        for (k, &pool) in pools.iter().enumerate() {
            let site = problem.pools[pool].site;
            let n_levels = problem.pools[pool].levels_w.len();
            for (s, slot) in view.window.clone().enumerate() {
                if !residual.overbook && residual.free[pool][slot] < view.gpus {
                    continue;
                }
                let congestion = residual
                    .gpu_price()
                    .map_or(0.0, |p| f64::from(view.gpus) * p[pool][slot]);
                for level in 0..n_levels {
                    let add_kw = problem.run_load_kw(job, pool, level);
                    let Some(cost) = residual.marginal_cost_g(problem, site, slot, add_kw) else {
                        continue;
                    };
                    per_work[(k * width + s) * levels + level] =
                        (cost + congestion) / problem.slot_work_h(pool, level);
                }
            }
        }
        let nonnegative = problem.inst.params.migration_penalty_g >= 0.0
            && per_work.iter().all(|&c| c >= 0.0)
            && sites.iter().chain(view.current_site.as_ref()).all(|&site| {
                view.window
                    .clone()
                    .all(|slot| residual.weight_g_per_kw(problem, site, slot) >= 0.0)
            });
        OptionTable {
            pools,
            levels,
            per_work,
            nonnegative,
        }
    }

    /// The candidate pool sets, as positions in `pools`: each of `sites` alone, then all of
    /// them together when `across` and there are two or more.
    fn candidates(&self, problem: &Problem, sites: &[usize], across: bool) -> Vec<Vec<usize>> {
        let mut candidates: Vec<Vec<usize>> = sites
            .iter()
            .map(|&s| {
                (0..self.pools.len())
                    .filter(|&k| problem.pools[self.pools[k]].site == s)
                    .collect()
            })
            .collect();
        if across && sites.len() > 1 {
            candidates.push((0..self.pools.len()).collect());
        }
        candidates
    }
}

/// Takes the job's cheapest (slot, pool, level) options per work hour among the table's pools
/// at positions `allowed`, with power levels no deeper than `deepest_level`, until its work is
/// done; returns the exact cost and the runs, or `None` if they cannot finish it within the
/// feasibility domain and the limits, or if their separate costs already reach `best_g` (then
/// their exact cost does too). `options` is scratch space.
#[allow(clippy::too_many_arguments)]
fn cheapest_slots(
    problem: &Problem,
    residual: &Residual,
    job: usize,
    table: &OptionTable,
    allowed: &[usize],
    deepest_level: usize,
    best_g: f64,
    options: &mut Vec<(f64, Slot)>,
) -> Option<(f64, Vec<Slot>)> {
    let view = &problem.jobs[job];
    let width = view.window.len();
    // The cheapest option per slot: (cost per work hour, slot option).
    options.clear();
    for (s, slot) in view.window.clone().enumerate() {
        let mut best: Option<(f64, Slot)> = None;
        for &k in allowed {
            let pool = table.pools[k];
            let levels = problem.pools[pool].levels_w.len().min(deepest_level + 1);
            let row = &table.per_work[(k * width + s) * table.levels..][..levels];
            for (level, &per_work) in row.iter().enumerate() {
                if per_work.is_finite() && best.is_none_or(|(b, _)| per_work < b - 1e-12) {
                    best = Some((per_work, Slot { slot, pool, level }));
                }
            }
        }
        if let Some(option) = best {
            options.push(option);
        }
    }
    if view.work_hours <= 1e-9 {
        return Some((0.0, Vec::new()));
    }
    // One option per slot, so the key is total and an unstable sort gives the same order.
    options.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.slot.cmp(&b.1.slot)));
    let mut chosen: Vec<Slot> = Vec::new();
    // Work before transfer losses: progress can only be lower, so it is checked once this much
    // is reached.
    let mut raw_h = 0.0;
    // The runs' separate costs: a floor under their exact cost.
    let mut floor_g = 0.0;
    for &(per_work, slot) in options.iter() {
        chosen.push(slot);
        let work_h = problem.slot_work_h(slot.pool, slot.level);
        raw_h += work_h;
        floor_g += per_work * work_h;
        // The floor only grows with more runs: once past the best cost, nothing found here
        // could replace it.
        if table.nonnegative && floor_g > best_g + 1e-6 {
            return None;
        }
        if raw_h + 1e-9 < view.work_hours {
            continue;
        }
        chosen.sort();
        if let Some((done_h, migrations)) = progress(problem, job, &chosen)
            && done_h + 1e-9 >= view.work_hours
        {
            let cost = residual.cost_g(problem, job, &chosen, migrations)?;
            return Some((cost, chosen));
        }
    }
    None
}

/// The run-now baseline of formats.md: released jobs start in release order at their home site,
/// first fit, at full power in consecutive slots until done; deadlines and grid limits ignored.
pub(crate) fn run_now(problem: &Problem, skip: &[bool]) -> Schedule {
    let start = problem.inst.start_utc.0;
    let release_slot = |j: usize| -> usize {
        let s = (problem.inst.jobs[j].release_utc.0 - start).num_seconds() as f64 / problem.slot_s;
        s.ceil().max(0.0) as usize
    };
    let mut order: Vec<usize> = (0..problem.jobs.len()).filter(|&j| !skip[j]).collect();
    order.sort_by_key(|&j| (problem.inst.jobs[j].release_utc, j));
    let mut free: Vec<Vec<u32>> = problem
        .pools
        .iter()
        .map(|p| vec![p.gpus; problem.n_slots])
        .collect();
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    let mut waiting: Vec<usize> = Vec::new();
    let mut next = 0;
    for slot in 0..problem.n_slots {
        while next < order.len() && release_slot(order[next]) <= slot {
            waiting.push(order[next]);
            next += 1;
        }
        let mut still_waiting = Vec::new();
        for &job in &waiting {
            let view = &problem.jobs[job];
            let pool =
                view.pools.iter().copied().find(|&p| {
                    problem.pools[p].site == view.home_site && free[p][slot] >= view.gpus
                });
            let Some(pool) = pool else {
                still_waiting.push(job);
                continue;
            };
            let mut done_h = 0.0;
            let mut slots = Vec::new();
            let mut t = slot;
            while done_h + 1e-9 < view.work_hours && t < problem.n_slots {
                free[pool][t] = free[pool][t].saturating_sub(view.gpus);
                slots.push(Slot {
                    slot: t,
                    pool,
                    level: 0,
                });
                done_h += problem.slot_work_h(pool, 0);
                t += 1;
            }
            runs[job] = Some(slots);
        }
        waiting = still_waiting;
    }
    Schedule { runs }
}

/// Human reasons for jobs that cannot run even alone, or `None` when a job could.
pub(crate) fn alone_infeasibility(problem: &Problem, job: usize) -> Option<Infeasible> {
    let spec = &problem.inst.jobs[job];
    let view = &problem.jobs[job];
    let reason = if view.pools.is_empty() {
        let wanted = if spec.gpu_models.is_empty() {
            "any model".to_string()
        } else {
            spec.gpu_models.join(" or ")
        };
        Some(format!(
            "not enough GPUs: needs {} GPUs of {wanted} at one site, and no site has that many",
            spec.gpus
        ))
    } else if view.work_hours <= 1e-9 {
        None
    } else if view.window.is_empty() {
        Some(format!(
            "not enough time: no whole slot lies between release {} and deadline {} inside the horizon",
            spec.release_utc, spec.deadline_utc
        ))
    } else {
        let mut pools = view.pools.clone();
        if let Some(current) = view.current_site
            && !view.migratable
        {
            pools.retain(|&p| problem.pools[p].site == current);
        }
        let fastest = pools
            .iter()
            .map(|&p| problem.slot_work_h(p, 0))
            .fold(0.0, f64::max);
        let possible_h = fastest * view.window.len() as f64;
        if pools.is_empty() {
            Some(format!(
                "not enough GPUs: the job is not migratable and its current site has no {} allowed GPUs",
                spec.gpus
            ))
        } else if possible_h + 1e-9 < view.work_hours {
            Some(format!(
                "not enough time: needs {:.2} work hours but even at full power on the fastest allowed GPU the {} slot(s) before the deadline give {:.2}",
                view.work_hours,
                view.window.len(),
                possible_h
            ))
        } else {
            None
        }
    };
    reason.map(|reason| Infeasible {
        job: spec.id.clone(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::tests::random_instance;

    /// [`best_placement`] without the floor that skips candidates: every candidate site set and
    /// deepest power cap costed exactly, the first strictly cheapest kept.
    fn best_placement_costing_all(
        problem: &Problem,
        residual: &Residual,
        job: usize,
    ) -> Option<(f64, Vec<Slot>)> {
        let sites = problem.run_sites(job);
        let table = OptionTable::new(problem, residual, job, &sites);
        let candidates = table.candidates(problem, &sites, problem.jobs[job].migratable);
        let mut best: Option<(f64, Vec<Slot>)> = None;
        let mut scratch = Vec::new();
        for allowed in &candidates {
            for deepest in (0..table.levels).rev() {
                let found = cheapest_slots(
                    problem,
                    residual,
                    job,
                    &table,
                    allowed,
                    deepest,
                    f64::INFINITY,
                    &mut scratch,
                );
                if let Some((cost, slots)) = found
                    && best.as_ref().is_none_or(|(c, _)| cost < *c - 1e-9)
                {
                    best = Some((cost, slots));
                }
            }
        }
        best
    }

    #[test]
    fn skipping_candidates_by_their_floor_keeps_every_placement() {
        let mut compared = 0;
        let mut unpruned = 0;
        for seed in 0..12 {
            let mut instance = random_instance(seed, 40, 4, 24);
            if seed % 3 == 1 {
                // Power prices below zero in some slots: costs may then be negative, and the
                // floor must not prune.
                instance.params.lambda_cost_g_per_usd = 2000.0;
                for (s, site) in instance.sites.iter_mut().enumerate() {
                    site.price_usd_per_mwh = Some(
                        (0..instance.slots)
                            .map(|t| if (t + s) % 5 == 0 { -60.0 } else { 40.0 })
                            .collect(),
                    );
                }
            }
            let problem = Problem::new(&instance);
            let gpu: Vec<Vec<f64>> = problem
                .pools
                .iter()
                .enumerate()
                .map(|(p, _)| {
                    (0..problem.n_slots)
                        .map(|t| ((p * 7 + t * 3) % 11) as f64)
                        .collect()
                })
                .collect();
            let kw: Vec<Vec<f64>> = (0..instance.sites.len())
                .map(|s| {
                    (0..problem.n_slots)
                        .map(|t| ((s * 5 + t) % 9) as f64 * 40.0)
                        .collect()
                })
                .collect();
            let prices = Prices { gpu, kw };
            // Half the jobs placed first, so capacity, surplus and grid limits bind.
            let mut residual = Residual::new(&problem);
            for job in (0..problem.jobs.len()).step_by(2) {
                if let Some((_, runs)) = best_placement(&problem, &residual, job, true) {
                    residual.apply(&problem, job, &runs, 1.0);
                }
            }
            for mode in 0..3 {
                residual.prices = (mode == 1).then_some(&prices);
                residual.congestion = (mode == 2).then_some(prices.gpu.as_slice());
                for job in (1..problem.jobs.len()).step_by(2) {
                    let sites = problem.run_sites(job);
                    if !OptionTable::new(&problem, &residual, job, &sites).nonnegative {
                        unpruned += 1;
                    }
                    assert_eq!(
                        best_placement(&problem, &residual, job, true),
                        best_placement_costing_all(&problem, &residual, job),
                        "seed {seed}, mode {mode}, job {job}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 500, "{compared} placements compared");
        assert!(unpruned > 0, "the negative-cost case was not reached");
    }
}
