//! Lagrangian relaxation of the couplings between jobs (GPUs per pool and slot, power balance
//! per site and slot), maximised by projected subgradient ascent: a certified lower bound at any
//! size, and the prices that guide the large-instance search.
//!
//! With the coupling rows priced, the problem falls apart into one subproblem per job and one per
//! site-slot grid draw. Each job's subproblem is relaxed and solved exactly by a dynamic
//! programme over its slots and a work grid: at most one run per slot, at any allowed pool and
//! power level of one site (a job that may not move) or of all its sites (a migratable job,
//! whose migration penalties, transfer energy and lost time are dropped: each of them only adds
//! cost or removes work), with every run's work rounded **up** to the grid. Every real schedule
//! is a point of that relaxation, so the Lagrangian function is a lower bound on every plan
//! serving the included jobs, for any non-negative prices, converged or not. The final
//! evaluation keeps the value as a constant plus one term per job ([`BoundTerms`]), so pricings
//! at the same prices combine job by job, and prices the migratable jobs that moved once more
//! with their site as state, each move losing the least transfer time into the site it reaches
//! ([`moves_bound`]): still a relaxation of every real schedule. Its site-slot terms take the
//! sites' GPUs whole ([`Pricer::whole_gpus_gain_g`]), which only lifts the value at the same
//! prices; the ascent keeps the relaxation's own terms.
//!
//! Without change costs a job's option costs are its GPU count times a per-GPU cost shared by
//! every job with the same pools, so the options that no other beats on work and cost are found
//! once per pool group and slot, and each job's programme runs over those only: the work per
//! iteration follows the jobs' windows (the useful variables), not jobs x sites x slots. A job
//! with change costs (runs in a previous plan) adds the same penalty to every run of a slot but
//! the previous plan's, so its options are its group's raised by it, with that one run added.
//!
//! The subgradient ascent prices on the work grid its caller names ([`DualConfig::grid`]): the
//! coarse grid ([`Grid::Coarse`], 24 units per slot of fastest work, fewer for long jobs but at
//! least 8) is cheap enough for many iterations on thousands of jobs; on the fine grid (60
//! units per slot), which the master LP uses, the rounding gains a run at most 1/60 of a slot's
//! work: on the coarse grid a capped run can gain up to 1/8, which loosens the bound by a few
//! per cent. A unit is a whole fraction of a slot of the job's fastest full work wherever the
//! job is long enough, so a run there counts exactly and only slower ones are rounded
//! ([`work_grid`]). Even 1/60 per run
//! adds up over a long job's runs, so the rounds after the coarse ones stall price on twice the
//! fine grid where it fits, and the final evaluation at the best prices ([`final_bound`])
//! prices once more on the finest refinement of the fine grid (up to 16 times finer) that fits
//! a cell budget; a caller whose budget has room then doubles that grid while the last pricing
//! was cheap ([`Grid::doubled`], [`bound_on_grid`]).
//!
//! [`Pricer`] also prices *really* (`round_up` false, work rounded down): its schedules then do
//! their work, and a migratable job is priced with the site it last ran at as state, each move
//! losing the most transfer time over its site pairs; those schedules feed the master LP
//! (`master`) and its restricted MILP.
//!
//! The ascent is a projected subgradient method with Polyak steps towards the best plan's
//! objective, deflected directions, and a step scale halved (back at the best prices) when the
//! bound stalls.
//!
//! Must not perform I/O or read the clock: the caller bounds the work by an iteration count and
//! a stop callback.

use std::collections::BTreeMap;

use crate::problem::{Problem, Schedule, Slot};

/// Iterations without a better bound before the step scale is halved.
const PATIENCE: usize = 12;
/// Share of the last direction's opposing component kept in the next direction.
const DEFLECTION: f64 = 1.5;
/// The step scale below which the ascent stops.
pub(crate) const MIN_STEP_SCALE: f64 = 1e-4;

pub(crate) struct DualConfig<'a> {
    /// Most subgradient iterations.
    pub max_iterations: usize,
    /// Objective of the best known plan serving the included jobs, g: the step target.
    pub upper_g: f64,
    /// Stop once the bound is within this share of `upper_g`.
    pub rel_gap: f64,
    /// Asked between iterations; `true` ends the ascent with the best bound so far.
    pub stop: &'a dyn Fn() -> bool,
    /// Step scale to start with (1 at first; an earlier round's last scale after).
    pub start_scale: f64,
    /// Prices to start from (an earlier round's best); `None` reads them off the start plan.
    pub start: Option<&'a crate::heuristic::Prices>,
    /// The work grid the jobs are priced on.
    pub grid: Grid,
}

pub(crate) struct DualOutcome {
    /// The best Lagrangian value seen: a lower bound on the objective of every plan serving
    /// exactly the included jobs, g. `None` when a job's relaxation cannot finish its work.
    pub bound_g: Option<f64>,
    pub iterations: usize,
    /// The step scale the ascent ended with.
    pub scale: f64,
    /// Prices at the best bound, g per GPU, per pool and slot.
    pub gpu_price: Vec<Vec<f64>>,
    /// Prices at the best bound, g per kW held for one slot, per site and slot.
    pub kw_price: Vec<Vec<f64>>,
    /// Each job's relaxed schedule at the best prices: real on the grid's terms except for the
    /// couplings (it may overfill pools) and for a migratable job's moves.
    pub relaxed: Schedule,
}

/// Most loads one site and slot's whole GPU counts may give for
/// [`Pricer::whole_gpus_gain_g`] to take them: 8 GPUs at 4 levels give 495.
const WHOLE_GPUS_MOST_POINTS: usize = 20_000;

/// A load, kW, and the GPUs running to draw it.
type LoadCount = (f64, u32);

/// (load kW, GPUs running) of every count of `whole` GPUs at levels drawing `level_kw` each
/// (a GPU not counted is idle), by rising load; `None` beyond [`WHOLE_GPUS_MOST_POINTS`].
fn whole_counts(level_kw: &[f64], whole: u32) -> Option<Vec<LoadCount>> {
    let mut counts: Vec<LoadCount> = vec![(0.0, 0)];
    for &kw in level_kw {
        let before = counts.len();
        for i in 0..before {
            let (load, gpus) = counts[i];
            for n in 1..=whole.saturating_sub(gpus) {
                counts.push((load + f64::from(n) * kw, gpus + n));
            }
            if counts.len() > WHOLE_GPUS_MOST_POINTS {
                return None;
            }
        }
    }
    counts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    Some(counts)
}

/// Keeps the points `(load, paid)` that no other beats with no more load and at least as much
/// paid, by rising load. The grid draw's cost does not fall as the load rises, so a beaten
/// point is never the least.
fn pareto_loads(points: &mut Vec<(f64, f64)>) {
    points.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut most_paid = f64::NEG_INFINITY;
    points.retain(|&(_, paid)| {
        let keep = paid > most_paid;
        most_paid = most_paid.max(paid);
        keep
    });
}

/// One way to run a slot: pool, power level, work delivered and cost.
#[derive(Clone, Copy, Debug)]
struct Option_ {
    work_h: f64,
    cost_g: f64,
    pool: usize,
    level: usize,
}

/// The options of `points` that no other option beats on both work and cost, by rising cost.
fn pareto(points: &mut [Option_], out: &mut Vec<Option_>) {
    out.clear();
    points.sort_by(|a, b| {
        a.cost_g
            .total_cmp(&b.cost_g)
            .then(b.work_h.total_cmp(&a.work_h))
            .then(a.pool.cmp(&b.pool))
            .then(a.level.cmp(&b.level))
    });
    let mut most_work = f64::NEG_INFINITY;
    for p in points.iter() {
        if p.work_h > most_work + 1e-12 {
            out.push(*p);
            most_work = p.work_h;
        }
    }
}

/// [`price_job`] for a migratable job with the site it last ran at as state: `site_options[i]`
/// are the per-slot options at its i-th site (`moving.sites[i]`). A move (a run at another
/// site than the last one) loses `moving.loss_share` (of the site it reaches) of that run's
/// work and costs `moving.penalty_g` and its checkpoint transfer's load (`moving.transfer_kw`)
/// at both ends, priced at `lambda` in the slot it arrives in, as the plan's evaluation
/// charges them; the first placement of a fresh job is free.
#[allow(clippy::too_many_arguments)]
fn price_job_moving(
    site_options: &[&[Vec<Option_>]],
    window: std::ops::Range<usize>,
    scale: f64,
    unit_h: f64,
    k: usize,
    round_up: bool,
    moving: &Moving,
    lambda: &[Vec<f64>],
    dp: &mut Dp,
    picked: &mut [Option<Option_>],
) -> Option<f64> {
    let n_s = site_options.len();
    let w = k + 1;
    let fresh = n_s;
    let n_states = (n_s + 1) * w;
    dp.cost.clear();
    dp.cost.resize(n_states, f64::INFINITY);
    match moving.start {
        Start::Fresh | Start::Elsewhere => dp.cost[fresh * w] = 0.0,
        Start::At(i) => dp.cost[i * w] = 0.0,
    }
    let first_moves = moving.start == Start::Elsewhere;
    dp.back3.clear();
    dp.back3.resize(window.len() * n_states, (0, 0, 0));
    dp.any.resize(w, f64::INFINITY);
    dp.any_from.resize(w, 0);
    let to_units = |work_h: f64| Problem::grid_units(work_h, unit_h, k, round_up);
    // The transfer's priced load at a site in slot `t`.
    let transfer_g = |site: Option<usize>, t: usize| {
        site.map_or(0.0, |site| moving.transfer_kw * lambda[site][t])
    };
    for (i, t) in window.clone().enumerate() {
        dp.next.clone_from(&dp.cost);
        let back = &mut dp.back3[i * n_states..(i + 1) * n_states];
        for (state, b) in back.iter_mut().enumerate() {
            *b = ((state / w) as u16, (state % w) as u16, 0);
        }
        // Per work done, the cheapest state to move from, with the transfer's load at the site
        // it leaves. Where that is the site a run is at, a move from any other site costs no
        // less (prices and penalty >= 0) and does less work than staying, so it is skipped.
        dp.any.iter_mut().for_each(|v| *v = f64::INFINITY);
        let sources = if first_moves { n_s + 1 } else { n_s };
        for s in 0..sources {
            let leave_g = if s < n_s {
                transfer_g(Some(moving.sites[s]), t)
            } else {
                transfer_g(moving.elsewhere, t)
            };
            for u in 0..w {
                let v = dp.cost[s * w + u] + leave_g;
                if v < dp.any[u] {
                    dp.any[u] = v;
                    dp.any_from[u] = s as u16;
                }
            }
        }
        let fresh_cost = if first_moves {
            f64::INFINITY
        } else {
            dp.cost[fresh * w]
        };
        for s in 0..n_s {
            let row = &dp.cost[s * w..(s + 1) * w];
            let arrive_g = moving.penalty_g + transfer_g(Some(moving.sites[s]), t);
            for (o, opt) in site_options[s][t].iter().enumerate() {
                let c = opt.cost_g * scale;
                let stay = to_units(opt.work_h);
                let moved = to_units(opt.work_h * (1.0 - moving.loss_share[s]));
                let tag = o as u16 + 1;
                if fresh_cost.is_finite() {
                    let target = s * w + stay;
                    if fresh_cost + c < dp.next[target] - 1e-12 {
                        dp.next[target] = fresh_cost + c;
                        back[target] = (fresh as u16, 0, tag);
                    }
                }
                for u in 0..w {
                    let base = row[u];
                    if base.is_finite() {
                        let target = s * w + (u + stay).min(k);
                        if base + c < dp.next[target] - 1e-12 {
                            dp.next[target] = base + c;
                            back[target] = (s as u16, u as u16, tag);
                        }
                    }
                    let base = dp.any[u] + arrive_g;
                    if base.is_finite() && usize::from(dp.any_from[u]) != s {
                        let target = s * w + (u + moved).min(k);
                        if base + c < dp.next[target] - 1e-12 {
                            dp.next[target] = base + c;
                            back[target] = (dp.any_from[u], u as u16, tag);
                        }
                    }
                }
            }
        }
        std::mem::swap(&mut dp.cost, &mut dp.next);
    }
    let (mut state, value) = (0..n_s)
        .map(|s| (s, dp.cost[s * w + k]))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    if !value.is_finite() {
        return None;
    }
    let mut u = k;
    for (i, t) in window.clone().enumerate().rev() {
        let (ps, pu, o) = dp.back3[i * n_states + state * w + u];
        picked[i] = (o > 0).then(|| site_options[state][t][usize::from(o) - 1]);
        state = usize::from(ps);
        u = usize::from(pu);
    }
    Some(value)
}

/// A job's work grid in the pricing programmes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grid {
    /// 24 units per slot of the job's fastest work, 24 to 240 units, and at least 8 units per
    /// slot (the subgradient ascent's, cheap enough for thousands of jobs).
    Coarse,
    /// 60 units per slot of the job's fastest work, 24 to 4,000 units: a run's rounding gains
    /// it at most 1/60 of a slot's work.
    Fine,
    /// The fine grid refined `n` times (`n` x 60 units per slot, at most `n` x 4,000 units):
    /// the rounds after the coarse ones stall (twice finer) and the final evaluation at the
    /// best prices ([`final_bound`], up to 16 times finer by the cell estimate, then doubled
    /// while a caller's budget has room: [`Grid::doubled`]).
    Finer(u32),
}

/// Units per slot of fastest work of the coarse grid, and its most units unless a job's work
/// spans more than COARSE_MOST_UNITS / COARSE_LEAST_UNITS_PER_SLOT slots.
const COARSE_UNITS_PER_SLOT: f64 = 24.0;
const COARSE_MOST_UNITS: f64 = 240.0;
/// Fewest units per slot of fastest work of the coarse grid: a run's rounding gains it at most
/// 1/8 of a slot's work however long the job. Rationale: with 15-minute slots a job of 10 hours
/// had 6 units per slot under the cap alone; on the benchmark's 1,000-job size with 15-minute
/// slots the floor lifts the 30 s bound from 285.9 kg (aligned units alone) to 292.5 kg, where
/// 24 units per slot left the plan no search (docs/benchmarks.md); on hourly slots no job of
/// the benchmark spans 30 slots, so it changes nothing there.
const COARSE_LEAST_UNITS_PER_SLOT: f64 = 8.0;
/// Units per slot of fastest work of the fine grid.
const FINE_UNITS_PER_SLOT: f64 = 60.0;
/// Fewest and most units of a job's fine grid.
const FINE_LEAST_UNITS: f64 = 24.0;
const FINE_MOST_UNITS: f64 = 4000.0;
/// Programme cells (window slots x work units, summed over jobs) the subgradient rounds after
/// the coarse ones stall may price: twice the fine grid where it fits, else the fine grid; an
/// instance whose fine grid exceeds it is priced on the coarse grid only.
pub(crate) const FINE_MOST_CELLS: f64 = 1e8;

/// Refinements of the fine grid the final evaluation tries, finest first.
const FINAL_REFINEMENTS: [u32; 5] = [16, 8, 4, 2, 1];
/// Programme cells the final evaluation at the best prices may use per second of the caller's
/// time limit: about 5 % of it at the rates measured on two cores with the pricing floor (cells
/// estimated as the fine grid's times the refinement; the floor skips most sites of the jobs
/// that may run at any one of them, so cells overstate the work): the benchmark's 1,000-job
/// size prices 16 times finer in about 0.7 s, its 10,000-job size 16 times finer in 13.6 s. Rationale: at 1.5e6 (the rate before the floor) L priced 4 times finer,
/// 3,578.6 kg, against 3,591.6 kg now (docs/benchmarks.md).
pub(crate) const FINAL_CELLS_PER_LIMIT_S: f64 = 3.5e6;

/// A job's work grid: hours per unit and the units that reach its work.
///
/// Where the job's work spans the grid's fewest units or more, a unit is a whole fraction of a
/// slot of its fastest full work: a run there counts exactly, and only slower runs (other GPU
/// models, lower power levels) are rounded, up in the relaxations and down in real pricing, by
/// less than a unit. Shorter jobs split their work into the grid's fewest units.
fn work_grid(problem: &Problem, job: usize, grid: Grid) -> (f64, usize) {
    let view = &problem.jobs[job];
    let fastest_h = problem.fastest_slot_h(job);
    if view.work_hours <= 1e-9 {
        return (1.0, 0);
    }
    // Units per slot of fastest work, fewest units, most units, and fewest units per slot of
    // fastest work however long the job.
    let (per_slot, least, most, least_per_slot) = match grid {
        Grid::Coarse => (
            COARSE_UNITS_PER_SLOT,
            COARSE_UNITS_PER_SLOT,
            COARSE_MOST_UNITS,
            COARSE_LEAST_UNITS_PER_SLOT,
        ),
        Grid::Fine => (FINE_UNITS_PER_SLOT, FINE_LEAST_UNITS, FINE_MOST_UNITS, 0.0),
        Grid::Finer(n) => (
            FINE_UNITS_PER_SLOT * f64::from(n),
            FINE_LEAST_UNITS,
            FINE_MOST_UNITS * f64::from(n),
            0.0,
        ),
    };
    // The programmes keep units in 16 bits.
    let cap = f64::from(u16::MAX) - 2.0;
    if fastest_h <= 0.0 {
        let most = most.min(cap);
        return (view.work_hours / most, most as usize);
    }
    // Slots of the job's fastest full work.
    let slots = view.work_hours / fastest_h;
    let most = most.max((least_per_slot * slots).ceil()).min(cap);
    let aligned = (most / slots).floor().min(per_slot);
    if aligned >= 1.0 && aligned * slots >= least {
        let unit_h = fastest_h / aligned;
        let units = (view.work_hours / unit_h - 1e-9).ceil().max(1.0) as usize;
        return (unit_h, units);
    }
    let units = (slots * per_slot).ceil().clamp(least, most) as usize;
    (view.work_hours / units as f64, units)
}

/// A grid's programme cells (window slots x work units) for the jobs with `include[j]`.
pub(crate) fn grid_cells(problem: &Problem, include: &[bool], grid: Grid) -> f64 {
    (0..problem.jobs.len())
        .filter(|&j| include[j])
        .map(|j| problem.jobs[j].window.len() as f64 * work_grid(problem, j, grid).1 as f64)
        .sum()
}

/// A Lagrangian value at fixed prices split into its terms: a constant (the capacity and power
/// rows, the grid draws and the change costs) plus one term per job, the cost of its cheapest
/// relaxed schedule. Any lower bound on a job's term keeps the sum a bound, so the terms of
/// several relaxations at the same prices (finer grids, moves that lose work) combine job by
/// job: [`BoundTerms::merge`] keeps each job's largest.
#[derive(Clone, Debug)]
pub(crate) struct BoundTerms {
    constant_g: f64,
    /// What the site-slot terms gain, at the same prices, when each site's GPUs are whole
    /// ([`Pricer::whole_gpus_gain_g`]); part of the value.
    whole_gpus_g: f64,
    /// Per job: the largest lower bound on its term so far; 0 for a job left out.
    job_g: Vec<f64>,
    /// The jobs priced.
    include: Vec<bool>,
    /// The jobs whose cheapest relaxed schedule moved (ran at two sites, or first away from
    /// the site its checkpoint is at) in some pricing merged: only those can gain from their
    /// moves' losses ([`moves_bound`]).
    moved: Vec<bool>,
}

impl BoundTerms {
    /// The bound, g: a lower bound on every plan serving the jobs priced.
    pub fn value_g(&self) -> f64 {
        self.constant_g + self.whole_gpus_g + self.job_g.iter().sum::<f64>()
    }

    /// The Lagrangian value itself, g: [`BoundTerms::value_g`] without the whole-GPU gain of
    /// the site-slot terms.
    pub fn lagrangian_g(&self) -> f64 {
        self.value_g() - self.whole_gpus_g
    }

    /// What the site-slot terms gain when each site's GPUs are whole, g.
    pub fn whole_gpus_g(&self) -> f64 {
        self.whole_gpus_g
    }

    /// Job `job`'s term, g: a lower bound on what its cheapest schedule costs at the prices
    /// (0 for a job left out).
    pub fn job_g(&self, job: usize) -> f64 {
        self.job_g[job]
    }

    /// The jobs priced.
    pub fn included(&self) -> &[bool] {
        &self.include
    }

    /// Keeps each job's larger term (both at the same prices and over the same jobs).
    pub fn merge(&mut self, other: &BoundTerms) {
        for (mine, theirs) in self.job_g.iter_mut().zip(&other.job_g) {
            *mine = mine.max(*theirs);
        }
        for (mine, theirs) in self.moved.iter_mut().zip(&other.moved) {
            *mine |= *theirs;
        }
        self.whole_gpus_g = self.whole_gpus_g.max(other.whole_gpus_g);
    }
}

/// The Lagrangian value at `prices` on the finest refinement of the fine grid whose
/// programmes stay within `most_cells` (window slots x work units, summed over the jobs): a
/// lower bound on every plan serving the jobs with `include[j]`, with the grid used; `None`
/// when even the fine grid is too large or a job's relaxation cannot finish its work.
///
/// Rationale: a run's rounding up to the grid is what the relaxation gives away that no plan
/// has; at the same prices each refinement lifts the bound (measured on the benchmark's
/// 1,000-job size: 309.95 kg on the fine grid, 312.42, 313.40, 314.01 and 314.32 kg at 2, 4,
/// 8 and 16 times finer), for the cost of one pricing.
pub(crate) fn final_bound(
    problem: &Problem,
    include: &[bool],
    prices: &crate::heuristic::Prices,
    most_cells: f64,
) -> Option<(BoundTerms, Grid)> {
    let grid = FINAL_REFINEMENTS
        .iter()
        .map(|&n| if n == 1 { Grid::Fine } else { Grid::Finer(n) })
        .find(|&g| grid_cells(problem, include, g) <= most_cells)?;
    bound_on_grid(problem, include, prices, grid).map(|terms| (terms, grid))
}

/// The grid a job is priced on with its site as state ([`Moves::Real`], [`Moves::Bound`]), if
/// it is: a migratable job with more than one site and work to do, on `grid` when its site x
/// work-unit states fit [`MOVING_STATES_MAX`] there; for
/// [`Moves::Bound`] on the finest of `grid`, half of it, ..., down to the fine grid that fits.
fn site_state_grid(problem: &Problem, job: usize, grid: Grid, moves: Moves) -> Option<Grid> {
    let view = &problem.jobs[job];
    let sites = problem.run_sites(job).len();
    if moves == Moves::Free || !view.migratable || view.work_hours <= 1e-9 || sites <= 1 {
        return None;
    }
    let mut at = grid;
    loop {
        if sites * (work_grid(problem, job, at).1 + 1) <= MOVING_STATES_MAX {
            return Some(at);
        }
        at = match (moves, at) {
            (Moves::Bound, Grid::Finer(n)) if n > 2 => Grid::Finer(n / 2),
            (Moves::Bound, Grid::Finer(_)) => Grid::Fine,
            _ => return None,
        };
    }
}

/// The Lagrangian value at `prices` on `grid`, by terms: a lower bound on every plan serving
/// the jobs with `include[j]`; `None` when a job's relaxation cannot finish its work.
pub(crate) fn bound_on_grid(
    problem: &Problem,
    include: &[bool],
    prices: &crate::heuristic::Prices,
    grid: Grid,
) -> Option<BoundTerms> {
    terms_on_grid(problem, include, prices, grid, true)
}

/// [`bound_on_grid`] without the sites' whole-GPU gain, for merging into terms at the same
/// prices that have it: the gain depends on the prices alone, not on the grid, and
/// [`BoundTerms::merge`] keeps the larger.
pub(crate) fn finer_terms_on_grid(
    problem: &Problem,
    include: &[bool],
    prices: &crate::heuristic::Prices,
    grid: Grid,
) -> Option<BoundTerms> {
    terms_on_grid(problem, include, prices, grid, false)
}

fn terms_on_grid(
    problem: &Problem,
    include: &[bool],
    prices: &crate::heuristic::Prices,
    grid: Grid,
    whole_gpus: bool,
) -> Option<BoundTerms> {
    let mut pricer = Pricer::new(problem, include, grid, false);
    if !pricer.price(&prices.gpu, &prices.kw, true) {
        return None;
    }
    let job_g: Vec<f64> = (0..problem.jobs.len())
        .map(|j| {
            if include[j] {
                pricer.job_value_g[j]
            } else {
                0.0
            }
        })
        .collect();
    let constant_g = pricer.value_g - job_g.iter().sum::<f64>();
    let whole_gpus_g = if whole_gpus {
        pricer.whole_gpus_gain_g(&prices.gpu, &prices.kw)
    } else {
        0.0
    };
    let moved = (0..problem.jobs.len())
        .map(|j| {
            let runs = pricer.runs[j].as_deref().unwrap_or_default();
            let site = |r: &Slot| problem.pools[r.pool].site;
            runs.first().is_some_and(|first| {
                problem.jobs[j]
                    .current_site
                    .is_some_and(|c| c != site(first))
                    || runs.iter().any(|r| site(r) != site(first))
            })
        })
        .collect();
    Some(BoundTerms {
        constant_g,
        whole_gpus_g,
        job_g,
        include: include.to_vec(),
        moved,
    })
}

/// The jobs [`moves_bound`] prices on `grid`: those of `terms` whose free-move schedule moved
/// and that may be priced with their site as state.
fn movers(problem: &Problem, terms: &BoundTerms, grid: Grid) -> Vec<bool> {
    (0..problem.jobs.len())
        .map(|j| {
            terms.include[j]
                && terms.moved[j]
                && site_state_grid(problem, j, grid, Moves::Bound).is_some()
        })
        .collect()
}

/// Programme cells (window slots x sites x work units) of [`moves_bound`] on `grid`.
pub(crate) fn moves_cells(problem: &Problem, terms: &BoundTerms, grid: Grid) -> f64 {
    (0..problem.jobs.len())
        .filter(|&j| terms.include[j] && terms.moved[j])
        .filter_map(|j| {
            let at = site_state_grid(problem, j, grid, Moves::Bound)?;
            let sites = problem.run_sites(j).len() as f64;
            Some(
                problem.jobs[j].window.len() as f64
                    * sites
                    * (work_grid(problem, j, at).1 + 1) as f64,
            )
        })
        .sum()
}

/// Raises the terms of `terms` (at `prices`) of the migratable jobs whose free-move schedule
/// moved: each priced with its site as state, every move losing the least transfer time into
/// the site it reaches over the sites it may leave ([`Moves::Bound`]), on the finest of `grid`
/// and its halvings its states fit.
/// Every real schedule is a point of that relaxation, and free moves price a superset, so each
/// job keeps the larger of its two terms (a job whose free-move schedule stays put would gain
/// nothing on that grid). Jobs left when `stop` answers `true` keep theirs. Returns the jobs
/// priced and the jobs it would price.
pub(crate) fn moves_bound(
    problem: &Problem,
    prices: &crate::heuristic::Prices,
    grid: Grid,
    stop: &(dyn Fn() -> bool + Sync),
    terms: &mut BoundTerms,
) -> (usize, usize) {
    let movers = movers(problem, terms, grid);
    let candidates = movers.iter().filter(|&&m| m).count();
    if candidates == 0 {
        return (0, 0);
    }
    let mut pricer = Pricer::with_moves(problem, &movers, grid, Moves::Bound);
    // A job whose moves cost work it cannot spare has no real schedule either; like a job
    // left at the stop, it keeps its free-move term, which still bounds.
    pricer.price_until(&prices.gpu, &prices.kw, true, stop);
    let mut priced = 0;
    for j in (0..movers.len()).filter(|&j| movers[j] && pricer.runs[j].is_some()) {
        terms.job_g[j] = terms.job_g[j].max(pricer.job_value_g[j]);
        priced += 1;
    }
    (priced, candidates)
}

/// Most refinement of the fine grid [`Grid::doubled`] gives (units stay within 16 bits
/// whatever the refinement: a long job's grid stops refining well before it).
const MOST_REFINEMENT: u32 = 1024;

impl Grid {
    /// The grid with twice the units per slot (the coarse grid has none finer in this
    /// sequence), or `None` past [`MOST_REFINEMENT`]. Rationale: a caller whose budget
    /// still has room after [`final_bound`] refines while the last pricing was cheap; on the
    /// benchmark's 1,000-job size the cell estimate picks 16 times finer (0.2 s), and the
    /// doubling reaches 32 or 64 times finer as the run's speed allows, 0.21-0.25 kg higher.
    pub(crate) fn doubled(self) -> Option<Grid> {
        match self {
            Grid::Coarse => None,
            Grid::Fine => Some(Grid::Finer(2)),
            Grid::Finer(n) if n < MOST_REFINEMENT => Some(Grid::Finer(2 * n)),
            Grid::Finer(_) => None,
        }
    }
}

/// One pool group's options for one iteration, per GPU: `options[slot]`.
struct GroupOptions {
    pools: Vec<usize>,
    options: Vec<Vec<Option_>>,
}

/// Per included job, how it is priced.
struct JobPricing {
    job: usize,
    /// Shared per-GPU option groups (no change costs), one per site it might stay at or one
    /// over all its sites.
    groups: Vec<usize>,
    /// Its work grid: hours per unit, and the units that reach its work.
    unit_h: f64,
    units: usize,
    /// For a migratable job, its real pricing with the site it last ran at as state.
    moving: Option<Moving>,
}

/// How a migratable job's moves are priced in the site-state programme.
#[derive(Clone, Debug)]
struct Moving {
    /// One option group per site.
    site_groups: Vec<usize>,
    /// The site of each option group.
    sites: Vec<usize>,
    /// The site its checkpoint is at when that is none of `sites` ([`Start::Elsewhere`]).
    elsewhere: Option<usize>,
    /// Load of a checkpoint transfer at each end, kW for the slot the move arrives in, and the
    /// objective penalty per move, g: what a move costs besides its lost work, in bound pricing
    /// ([`Moves::Bound`]). Real pricing, whose schedules feed the master LP (whose rows charge
    /// a column's transfers exactly) and the constructions, leaves both at 0. Rationale: priced
    /// there too, the master's columns changed and its restricted MILP's plan on the
    /// benchmark's 50-job size rose from 27.217 to 27.29 kg (docs/benchmarks.md).
    transfer_kw: f64,
    penalty_g: f64,
    /// Where the job starts: index into its site groups, or none yet.
    start: Start,
    /// Per site (index into `sites`), the share of a slot's work lost in the slot a move
    /// arriving there runs: for real pricing the most over all its site pairs, so the
    /// programme's schedules do their work; for bounds the least over the sites a move may
    /// leave for it, so every real schedule stays a point of the relaxation.
    loss_share: Vec<f64>,
}

/// Which jobs a [`Pricer`] prices with their site as state, and how their moves count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moves {
    /// Every job over all its sites at once, moves free (the subgradient ascent's relaxation).
    Free,
    /// Migratable jobs with their site as state, each move losing the most transfer time over
    /// the job's site pairs, for real (rounded-down) pricing; bounds are priced with moves free.
    Real,
    /// Migratable jobs with their site as state, each move losing the least transfer time into
    /// the site it reaches, in bound (rounded-up) pricing as well: a relaxation that still
    /// holds every real schedule, tighter than free moves ([`moves_bound`]).
    Bound,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// Never ran: the first placement is free.
    Fresh,
    /// Its checkpoint is at this site (index into the job's sites).
    At(usize),
    /// Its checkpoint is at a site it may not run at: every first run is a move.
    Elsewhere,
}

/// Most site x work-unit states of one migratable job priced with its site as state; above,
/// the job is priced over all its sites at once with moves free (a weaker relaxation, cheaper).
const MOVING_STATES_MAX: usize = 40_000;

/// Reusable buffers of the pricing dynamic programme.
#[derive(Default)]
struct Dp {
    cost: Vec<f64>,
    next: Vec<f64>,
    /// Per window slot and state: (previous state, option index + 1; 0 = not run).
    back: Vec<(u16, u16)>,
    /// The site-state programme's: (previous site state, previous units, option + 1).
    back3: Vec<(u16, u16, u16)>,
    any: Vec<f64>,
    any_from: Vec<u16>,
    /// Per window slot: the most units it and the slots after it can add, at most `k`.
    most_after: Vec<usize>,
    /// Each window slot's options' units on the grid, slot after slot.
    units: Vec<usize>,
}

/// One pricing thread's buffers.
#[derive(Default)]
struct Scratch {
    dp: Dp,
    points: Vec<Option_>,
    own_options: Vec<Vec<Option_>>,
    /// Per site, per slot: a moving job's own options (see [`Pricer::own_options`]).
    own_site_options: Vec<Vec<Vec<Option_>>>,
    picked: Vec<Option<Option_>>,
    best_picked: Vec<Option<Option_>>,
    /// Per window slot: cheapest cost per grid unit and most units (see [`price_floor`]).
    rates: Vec<(f64, usize)>,
    /// Alternatives by their floor: (floor, alternative).
    order: Vec<(f64, usize)>,
}

impl Scratch {
    fn new(n_slots: usize) -> Scratch {
        Scratch {
            own_options: vec![Vec::new(); n_slots],
            ..Scratch::default()
        }
    }
}

/// Fewest included jobs per pricing thread: below, threads cost more than they save.
const JOBS_PER_PRICING_THREAD: usize = 64;

/// Threads that price `n_jobs` jobs: the machine's cores, fewer when there are few jobs. The
/// answer does not depend on it.
pub(crate) fn pricing_threads(n_jobs: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(n_jobs / JOBS_PER_PRICING_THREAD).max(1)
}

/// A floor under [`price_job`]'s value over the same options, grid and rounding, cheap next to
/// it: each slot gives at most its largest option's units at its cheapest cost per unit, and
/// the cheapest units are taken first until the work is reached (the relaxation of "at most one
/// option per slot" to "any share of a slot's most units"). Infinite when even that cannot
/// reach the work (the programme then has no answer either); minus infinity, which prunes
/// nothing, when some option pays (a negative cost).
fn price_floor(
    options: &[Vec<Option_>],
    window: std::ops::Range<usize>,
    scale: f64,
    unit_h: f64,
    k: usize,
    round_up: bool,
    rates: &mut Vec<(f64, usize)>,
) -> f64 {
    rates.clear();
    for t in window {
        let (mut rate, mut most) = (f64::INFINITY, 0);
        for opt in &options[t] {
            if opt.cost_g < 0.0 {
                return f64::NEG_INFINITY;
            }
            let units = Problem::grid_units(opt.work_h, unit_h, k, round_up);
            if units > 0 {
                rate = rate.min(opt.cost_g * scale / units as f64);
                most = most.max(units);
            }
        }
        if most > 0 {
            rates.push((rate, most));
        }
    }
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut need, mut floor) = (k, 0.0);
    for &(rate, most) in rates.iter() {
        if need == 0 {
            break;
        }
        let take = most.min(need);
        floor += rate * take as f64;
        need -= take;
    }
    if need > 0 { f64::INFINITY } else { floor }
}

/// The cheapest way to finish `work_h` with at most one option per slot, on a work grid of
/// `unit_h` hours (`k` units reach the work). With `round_up` each run's work is rounded **up**
/// to the grid: a lower bound on every real schedule over the same options; otherwise **down**:
/// every schedule found does the work. Fills `picked` (per window slot) and returns the cost
/// times `scale`.
#[allow(clippy::too_many_arguments)]
fn price_job(
    options: &[Vec<Option_>],
    window: std::ops::Range<usize>,
    scale: f64,
    unit_h: f64,
    k: usize,
    round_up: bool,
    dp: &mut Dp,
    picked: &mut [Option<Option_>],
) -> Option<f64> {
    let n = window.len();
    dp.cost.clear();
    dp.cost.resize(k + 1, f64::INFINITY);
    dp.cost[0] = 0.0;
    dp.back.clear();
    dp.back.resize(n * (k + 1), (0, 0));
    // The most units the slots from each window slot on can add: a state below `k` minus
    // that cannot reach the work, and is not extended.
    dp.units.clear();
    dp.most_after.clear();
    for t in window.clone() {
        let first = dp.units.len();
        dp.units.extend(
            options[t]
                .iter()
                .map(|o| Problem::grid_units(o.work_h, unit_h, k, round_up)),
        );
        dp.most_after
            .push(dp.units[first..].iter().copied().max().unwrap_or(0));
    }
    let mut most_after = 0usize;
    for most in dp.most_after.iter_mut().rev() {
        most_after = (most_after + *most).min(k);
        *most = most_after;
    }
    let mut reach = 0; // highest state reached so far
    let mut first_option = 0; // this slot's first entry in `dp.units`
    for (i, t) in window.clone().enumerate() {
        dp.next.clone_from(&dp.cost);
        let back = &mut dp.back[i * (k + 1)..(i + 1) * (k + 1)];
        for (u, b) in back.iter_mut().enumerate() {
            *b = (u as u16, 0);
        }
        // States from which even the most work in every slot left falls short are dead.
        let lo = k - dp.most_after[i];
        let mut new_reach = reach;
        for (o, opt) in options[t].iter().enumerate() {
            let units = dp.units[first_option + o];
            let c = opt.cost_g * scale;
            // Below `split` a state moves up by `units`; from it on, it lands on `k`. An
            // unreached state costs infinity and never improves one.
            let split = (k - units).min(reach + 1);
            let (cost, next) = (&dp.cost, &mut dp.next);
            if lo < split {
                let moved = next[lo + units..split + units]
                    .iter_mut()
                    .zip(&mut back[lo + units..split + units]);
                for (u, (&base, (to, b))) in cost[lo..split].iter().zip(moved).enumerate() {
                    let cand = base + c;
                    if cand < *to - 1e-12 {
                        *to = cand;
                        *b = ((lo + u) as u16, o as u16 + 1);
                        new_reach = new_reach.max(lo + u + units);
                    }
                }
            }
            let from = split.max(lo);
            if from <= reach {
                for (u, &base) in cost[from..=reach].iter().enumerate() {
                    let cand = base + c;
                    if cand < next[k] - 1e-12 {
                        next[k] = cand;
                        back[k] = ((from + u) as u16, o as u16 + 1);
                        new_reach = k;
                    }
                }
            }
        }
        reach = new_reach;
        first_option += options[t].len();
        std::mem::swap(&mut dp.cost, &mut dp.next);
    }
    let value = dp.cost[k];
    if !value.is_finite() {
        return None;
    }
    let mut u = k;
    for (i, t) in window.clone().enumerate().rev() {
        let (prev, o) = dp.back[i * (k + 1) + u];
        picked[i] = (o > 0).then(|| options[t][usize::from(o) - 1]);
        u = usize::from(prev);
    }
    Some(value)
}

/// A job's cheapest schedule and its cost at the prices, or `None` when it cannot finish.
type JobPriced = Option<(f64, Vec<Slot>)>;

/// The relaxed per-job programmes of a set of jobs, set up once and priced at any prices.
///
/// After [`Pricer::price`], `value_g` is the Lagrangian value (a lower bound on every plan
/// serving the included jobs), `job_value_g[j]` each included job's cheapest relaxed schedule
/// at those prices, `runs[j]` that schedule, and `grad_*` the projected subgradient.
pub(crate) struct Pricer<'p, 'a> {
    problem: &'p Problem<'a>,
    /// kW per GPU (net of idle) and work per slot, per pool and level.
    pool_kw: Vec<Vec<f64>>,
    pool_work: Vec<Vec<f64>>,
    /// Power row bounds: surplus minus idle load (and minus the held jobs' load, see
    /// [`Pricer::hold`]), per site and slot, kW.
    pub upper_kw: Vec<Vec<f64>>,
    /// GPU row bounds: the pool's GPUs (less those the held jobs use), per pool and slot.
    pub cap_gpus: Vec<Vec<f64>>,
    /// The grid draw's bound per site and slot, kW (infinite without a limit).
    pub grid_limit_kw: Vec<Vec<f64>>,
    /// The grid draw's cost per kW held for a slot, g.
    pub grid_g_per_kw: Vec<Vec<f64>>,
    groups: Vec<GroupOptions>,
    group_slots: Vec<Vec<bool>>,
    jobs: Vec<JobPricing>,
    moves: Moves,
    /// Threads that price the jobs (see [`pricing_threads`]); the answer does not depend on it.
    threads: usize,
    // Buffers.
    points: Vec<Option_>,
    scratch: Scratch,
    gpu_use: Vec<Vec<f64>>,
    kw_use: Vec<Vec<f64>>,
    /// Results of the last `price`.
    pub value_g: f64,
    pub job_value_g: Vec<f64>,
    pub runs: Vec<Option<Vec<Slot>>>,
    pub grad_mu: Vec<Vec<f64>>,
    pub grad_lambda: Vec<Vec<f64>>,
}

impl<'p, 'a> Pricer<'p, 'a> {
    /// Sets up the programmes of the jobs with `include[j]` on a work grid; with `real` also
    /// the site-state programmes of migratable jobs for real pricing.
    pub fn new(
        problem: &'p Problem<'a>,
        include: &[bool],
        grid: Grid,
        real: bool,
    ) -> Pricer<'p, 'a> {
        Pricer::with_moves(
            problem,
            include,
            grid,
            if real { Moves::Real } else { Moves::Free },
        )
    }

    /// [`Pricer::new`] with the pricing of moves named.
    pub fn with_moves(
        problem: &'p Problem<'a>,
        include: &[bool],
        grid: Grid,
        moves: Moves,
    ) -> Pricer<'p, 'a> {
        let n_sites = problem.inst.sites.len();
        let n_slots = problem.n_slots;
        let n_pools = problem.pools.len();
        let h = problem.slot_h;
        let pool_kw: Vec<Vec<f64>> = problem
            .pools
            .iter()
            .map(|p| {
                let pue = problem.inst.sites[p.site].pue;
                p.levels_w
                    .iter()
                    .map(|w| pue * (w - p.idle_w) / 1000.0)
                    .collect()
            })
            .collect();
        let pool_work: Vec<Vec<f64>> = (0..n_pools)
            .map(|p| {
                (0..problem.pools[p].levels_w.len())
                    .map(|l| problem.slot_work_h(p, l))
                    .collect()
            })
            .collect();
        let upper_kw: Vec<Vec<f64>> = (0..n_sites)
            .map(|s| {
                let spec = &problem.inst.sites[s];
                (0..n_slots)
                    .map(|t| spec.surplus_kw[t] - problem.idle_load_kw[s])
                    .collect()
            })
            .collect();
        let grid_limit_kw: Vec<Vec<f64>> = (0..n_sites)
            .map(|s| {
                let spec = &problem.inst.sites[s];
                (0..n_slots)
                    .map(|t| {
                        let base = -upper_kw[s][t];
                        spec.grid_limit_kw
                            .map_or(f64::INFINITY, |l| l.max(base.max(0.0)))
                    })
                    .collect()
            })
            .collect();
        let grid_g_per_kw: Vec<Vec<f64>> = (0..n_sites)
            .map(|s| {
                (0..n_slots)
                    .map(|t| h * problem.grid_cost_g_per_kwh(s, t))
                    .collect()
            })
            .collect();

        // Pool groups and each job's alternatives.
        let mut group_ids: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
        let mut groups: Vec<GroupOptions> = Vec::new();
        let mut jobs: Vec<JobPricing> = Vec::new();
        for job in (0..problem.jobs.len()).filter(|&j| include[j]) {
            let view = &problem.jobs[job];
            let sites = problem.run_sites(job);
            let state_grid = site_state_grid(problem, job, grid, moves);
            let (unit_h, units) = work_grid(problem, job, state_grid.unwrap_or(grid));
            let moving = state_grid.is_some();
            let site_sets: Vec<Vec<usize>> = if view.migratable || sites.len() <= 1 {
                vec![sites.clone()]
            } else {
                sites.iter().map(|&s| vec![s]).collect()
            };
            let pool_sets: Vec<Vec<usize>> = site_sets
                .iter()
                .map(|set| {
                    view.pools
                        .iter()
                        .copied()
                        .filter(|&p| set.contains(&problem.pools[p].site))
                        .collect()
                })
                .collect();
            let mut group_of = |pools: Vec<usize>| {
                let next = groups.len();
                let group = *group_ids.entry(pools.clone()).or_insert(next);
                if group == next {
                    groups.push(GroupOptions {
                        pools,
                        options: vec![Vec::new(); n_slots],
                    });
                }
                group
            };
            let site_groups: Vec<usize> = if moving {
                sites
                    .iter()
                    .map(|&site| {
                        group_of(
                            view.pools
                                .iter()
                                .copied()
                                .filter(|&p| problem.pools[p].site == site)
                                .collect(),
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let job_groups = pool_sets.into_iter().map(&mut group_of).collect();
            let moving = moving.then(|| {
                let from: Vec<usize> = sites.iter().copied().chain(view.current_site).collect();
                // Per site reached, the least share over the sites a move may leave; the most
                // over every pair.
                let mut least = vec![1.0_f64; sites.len()];
                let mut most = 0.0_f64;
                for &a in &from {
                    for (i, &b) in sites.iter().enumerate() {
                        if a != b {
                            let share = (problem.transfer_s(job, a, b) / problem.slot_s).min(1.0);
                            least[i] = least[i].min(share);
                            most = most.max(share);
                        }
                    }
                }
                Moving {
                    site_groups,
                    sites: sites.clone(),
                    elsewhere: view.current_site.filter(|c| !sites.contains(c)),
                    transfer_kw: if moves == Moves::Bound {
                        problem.transfer_kwh(job) / problem.slot_h
                    } else {
                        0.0
                    },
                    penalty_g: if moves == Moves::Bound {
                        problem.inst.params.migration_penalty_g
                    } else {
                        0.0
                    },
                    start: match view.current_site {
                        None => Start::Fresh,
                        Some(c) => sites
                            .iter()
                            .position(|&s| s == c)
                            .map_or(Start::Elsewhere, Start::At),
                    },
                    loss_share: if moves == Moves::Bound {
                        least
                    } else {
                        vec![most; sites.len()]
                    },
                }
            });
            jobs.push(JobPricing {
                job,
                groups: job_groups,
                unit_h,
                units,
                moving,
            });
        }
        // Slots each group is needed in.
        let mut group_slots = vec![vec![false; n_slots]; groups.len()];
        for jp in &jobs {
            let site_groups = jp.moving.iter().flat_map(|m| m.site_groups.iter());
            for &g in jp.groups.iter().chain(site_groups) {
                for t in problem.jobs[jp.job].window.clone() {
                    group_slots[g][t] = true;
                }
            }
        }
        let n_jobs = problem.jobs.len();
        Pricer {
            problem,
            pool_kw,
            pool_work,
            upper_kw,
            cap_gpus: problem
                .pools
                .iter()
                .map(|p| vec![f64::from(p.gpus); n_slots])
                .collect(),
            grid_limit_kw,
            grid_g_per_kw,
            groups,
            group_slots,
            threads: pricing_threads(jobs.len()),
            jobs,
            moves,
            points: Vec::new(),
            scratch: Scratch::new(n_slots),
            gpu_use: vec![vec![0.0; n_slots]; n_pools],
            kw_use: vec![vec![0.0; n_slots]; n_sites],
            value_g: f64::NEG_INFINITY,
            job_value_g: vec![0.0; n_jobs],
            runs: vec![None; n_jobs],
            grad_mu: vec![vec![0.0; n_slots]; n_pools],
            grad_lambda: vec![vec![0.0; n_slots]; n_sites],
        }
    }

    /// Holds every job outside the priced set where `background` plans it: its GPUs come off
    /// the pools' bounds and its load beyond idle (runs and checkpoint transfers) off the
    /// sites' power bounds. The value is then the Lagrangian of the priced jobs' subproblem
    /// with the rest fixed, a bound on that subproblem only.
    pub fn hold(&mut self, include: &[bool], background: &Schedule) {
        let problem = self.problem;
        for (job, runs) in background.runs.iter().enumerate() {
            let Some(runs) = runs.as_ref().filter(|_| !include[job]) else {
                continue;
            };
            let gpus = f64::from(problem.jobs[job].gpus);
            for run in runs {
                self.cap_gpus[run.pool][run.slot] -= gpus;
            }
            for ((site, slot), kw) in problem.added_load_kw(job, runs) {
                self.upper_kw[site][slot] -= kw;
            }
        }
    }

    /// Added load of one relaxed run, kW (no transfer energy: the relaxation drops it).
    pub fn run_kw(&self, job: usize, run: &Slot) -> f64 {
        f64::from(self.problem.jobs[job].gpus) * self.pool_kw[run.pool][run.level]
    }

    /// What the terms of the capacity and power rows and of the grid draw gain, at prices
    /// `mu` and `lambda`, g, when each site and slot's GPUs are whole: the relaxation lets a
    /// site's priced load take any value, where a plan's runs draw one of the loads its GPUs
    /// can (each idle or at one of its levels), so surplus that falls between two of them is
    /// either left unused or topped up from the grid.
    ///
    /// Rationale: add to the problem, per pool, slot and power level, the count `n` of the
    /// pool's GPUs running at that level, with the jobs' GPUs there at most `n`, at most the
    /// pool's GPUs running, and the site's power row over the counts' load. Every plan keeps
    /// its value (its own counts satisfy them), so pricing the new link at `mu + lambda x kW`
    /// leaves each job's term as it is and replaces each site and slot's terms by the least,
    /// over whole counts, of the grid draw's cost less what the prices pay for the counts. The
    /// relaxation's own terms are that least over any counts at all, with the rows priced
    /// rather than kept, so each replacement only lifts the value. A site and slot whose
    /// counts give more than [`WHOLE_GPUS_MOST_POINTS`] loads keeps its own terms.
    pub fn whole_gpus_gain_g(&self, mu: &[Vec<f64>], lambda: &[Vec<f64>]) -> f64 {
        let problem = self.problem;
        let mut gain_g = 0.0;
        let mut points: Vec<(f64, f64)> = Vec::new();
        let mut pool_points: Vec<(f64, f64)> = Vec::new();
        let mut next: Vec<(f64, f64)> = Vec::new();
        // (load kW, GPUs running) of every count of a pool's GPUs at each level, per pool and
        // number of whole GPUs (the same in every slot but where held jobs take some); `None`
        // beyond the most points.
        let mut counts_of: BTreeMap<(usize, u32), Option<Vec<LoadCount>>> = BTreeMap::new();
        for s in 0..problem.inst.sites.len() {
            let pools: Vec<usize> = (0..problem.pools.len())
                .filter(|&p| problem.pools[p].site == s)
                .collect();
            'slots: for t in 0..problem.n_slots {
                let (l, cost, limit, upper) = (
                    lambda[s][t],
                    self.grid_g_per_kw[s][t],
                    self.grid_limit_kw[s][t],
                    self.upper_kw[s][t],
                );
                // The relaxation's own terms for this site and slot.
                let mut own = -l * upper;
                if cost - l < -1e-9 {
                    own += (cost - l) * limit;
                }
                // (load kW, what the prices pay g) of every whole count, the dominated left out.
                points.clear();
                points.push((0.0, 0.0));
                for (i, &p) in pools.iter().enumerate() {
                    let cap = self.cap_gpus[p][t];
                    own -= mu[p][t] * cap;
                    let whole = (cap + 1e-9).floor().max(0.0) as u32;
                    let Some(counts) = counts_of
                        .entry((p, whole))
                        .or_insert_with(|| whole_counts(&self.pool_kw[p], whole))
                    else {
                        continue 'slots;
                    };
                    // The counts come by rising load, so one pass keeps what the points
                    // after it do not beat (a point beaten at an equal load may stay: the
                    // least below is the same).
                    pool_points.clear();
                    let mut most_paid = f64::NEG_INFINITY;
                    for &(load, gpus) in counts.iter() {
                        let paid = mu[p][t] * f64::from(gpus) + l * load;
                        if paid > most_paid {
                            pool_points.push((load, paid));
                            most_paid = paid;
                        }
                    }
                    // The first pool's points are the site's so far as they are.
                    if i == 0 {
                        std::mem::swap(&mut points, &mut pool_points);
                        continue;
                    }
                    next.clear();
                    for &(load, paid) in &points {
                        next.extend(pool_points.iter().map(|&(pl, pp)| (load + pl, paid + pp)));
                        if next.len() > WHOLE_GPUS_MOST_POINTS {
                            continue 'slots;
                        }
                    }
                    pareto_loads(&mut next);
                    std::mem::swap(&mut points, &mut next);
                }
                if !own.is_finite() {
                    continue;
                }
                let whole = points
                    .iter()
                    .filter(|&&(load, _)| load - upper <= limit + 1e-9)
                    .map(|&(load, paid)| cost * (load - upper).max(0.0) - paid)
                    .fold(f64::INFINITY, f64::min);
                if whole.is_finite() && whole > own {
                    gain_g += whole - own;
                }
            }
        }
        gain_g
    }

    /// The priced cost of one GPU running at `pool` and `level` in `slot`, g.
    fn per_gpu_g(
        &self,
        pool: usize,
        level: usize,
        slot: usize,
        mu: &[Vec<f64>],
        lambda: &[Vec<f64>],
    ) -> f64 {
        let site = self.problem.pools[pool].site;
        mu[pool][slot] + self.pool_kw[pool][level] * lambda[site][slot]
    }

    /// The options of a pool set in one slot, per GPU.
    fn options_at(
        &self,
        pools: &[usize],
        slot: usize,
        mu: &[Vec<f64>],
        lambda: &[Vec<f64>],
        points: &mut Vec<Option_>,
    ) {
        points.clear();
        for &pool in pools {
            for level in 0..self.pool_kw[pool].len() {
                points.push(Option_ {
                    work_h: self.pool_work[pool][level],
                    cost_g: self.per_gpu_g(pool, level, slot, mu, lambda),
                    pool,
                    level,
                });
            }
        }
    }

    /// `out`: a job's options in one slot over the pools of `group`, for all its GPUs and with
    /// its change costs: every run of those pools on their frontier of work and cost, built from
    /// the group's shared frontier. A change cost is the same `+penalty` for every run but the
    /// previous plan's in that slot, so the group's frontier, scaled to the job's GPUs and
    /// raised by it, with the previous run (at `-penalty`) added, has the same frontier as every
    /// run of the pools.
    #[allow(clippy::too_many_arguments)]
    fn own_options(
        &self,
        job: usize,
        group: usize,
        slot: usize,
        mu: &[Vec<f64>],
        lambda: &[Vec<f64>],
        points: &mut Vec<Option_>,
        out: &mut Vec<Option_>,
    ) {
        let problem = self.problem;
        let gpus = f64::from(problem.jobs[job].gpus);
        let group = &self.groups[group];
        points.clear();
        points.extend(group.options[slot].iter().map(|o| Option_ {
            cost_g: gpus * o.cost_g + problem.change_g(job, slot, o.pool, o.level),
            ..*o
        }));
        if let Some(&(pool, level)) = problem.previous[job]
            .get(&slot)
            .filter(|(pool, _)| group.pools.contains(pool))
        {
            points.push(Option_ {
                work_h: self.pool_work[pool][level],
                cost_g: gpus * self.per_gpu_g(pool, level, slot, mu, lambda)
                    + problem.change_g(job, slot, pool, level),
                pool,
                level,
            });
        }
        pareto(points, out);
    }

    /// The cheapest relaxed (or, without `round_up`, real) schedule of the `i`-th included job
    /// at `mu` and `lambda`, with its value; `None` when its programme cannot finish the work.
    fn price_one(
        &self,
        i: usize,
        mu: &[Vec<f64>],
        lambda: &[Vec<f64>],
        round_up: bool,
        scratch: &mut Scratch,
    ) -> JobPriced {
        let problem = self.problem;
        let jp = &self.jobs[i];
        let job = jp.job;
        let view = &problem.jobs[job];
        let gpus = f64::from(view.gpus);
        let window = view.window.clone();
        scratch.picked.clear();
        scratch.picked.resize(window.len(), None);
        scratch.best_picked.clear();
        scratch.best_picked.resize(window.len(), None);
        let mut best_value: Option<f64> = None;
        let site_state = !round_up || self.moves == Moves::Bound;
        // A job with change costs (runs in a previous plan) is priced on its own options,
        // built per slot from its groups' (see [`Pricer::own_options`]).
        let own = !problem.previous[job].is_empty();
        if let Some(moving) = jp.moving.as_ref().filter(|_| site_state) {
            // With change costs each site's options are the job's own.
            if own {
                let n_sites = moving.site_groups.len();
                if scratch.own_site_options.len() < n_sites {
                    scratch
                        .own_site_options
                        .resize(n_sites, vec![Vec::new(); problem.n_slots]);
                }
                for (i, &g) in moving.site_groups.iter().enumerate() {
                    for t in window.clone() {
                        self.own_options(
                            job,
                            g,
                            t,
                            mu,
                            lambda,
                            &mut scratch.points,
                            &mut scratch.own_site_options[i][t],
                        );
                    }
                }
            }
            let site_options: Vec<&[Vec<Option_>]> = if own {
                scratch.own_site_options[..moving.site_groups.len()]
                    .iter()
                    .map(Vec::as_slice)
                    .collect()
            } else {
                moving
                    .site_groups
                    .iter()
                    .map(|&g| self.groups[g].options.as_slice())
                    .collect()
            };
            best_value = price_job_moving(
                &site_options,
                window.clone(),
                if own { 1.0 } else { gpus },
                jp.unit_h,
                jp.units,
                round_up,
                moving,
                lambda,
                &mut scratch.dp,
                &mut scratch.best_picked,
            );
        }
        let alternatives = if jp.moving.is_some() && site_state {
            0
        } else {
            jp.groups.len()
        };
        // Alternatives (a job that may run at any one of its sites has one per site) are
        // priced cheapest floor first, and one whose floor is no better than the best value so
        // far is skipped: the same value for a fraction of the programmes. A job with one
        // alternative keeps its order and gets no floor. A job priced on its own has its
        // shared group's floor less what its change costs can take off (`-penalty` at most
        // per previous run, `+penalty` for every other run).
        let floors = alternatives > 1 && view.work_hours > 1e-9;
        let own_credit_g = if own {
            problem.inst.params.change_penalty_g.max(0.0) * problem.previous[job].len() as f64
        } else {
            0.0
        };
        let mut order = std::mem::take(&mut scratch.order);
        order.clear();
        for a in 0..alternatives {
            let floor = if floors {
                price_floor(
                    &self.groups[jp.groups[a]].options,
                    window.clone(),
                    gpus,
                    jp.unit_h,
                    jp.units,
                    round_up,
                    &mut scratch.rates,
                ) - own_credit_g
            } else {
                f64::NEG_INFINITY
            };
            order.push((floor, a));
        }
        order.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        for &(floor, a) in &order {
            if floor == f64::INFINITY || best_value.is_some_and(|b| floor - 1e-9 * floor.abs() >= b)
            {
                break;
            }
            if own {
                for t in window.clone() {
                    self.own_options(
                        job,
                        jp.groups[a],
                        t,
                        mu,
                        lambda,
                        &mut scratch.points,
                        &mut scratch.own_options[t],
                    );
                }
            }
            let (options, scale_cost): (&[Vec<Option_>], f64) = if own {
                (&scratch.own_options, 1.0)
            } else {
                (&self.groups[jp.groups[a]].options, gpus)
            };
            let v = if view.work_hours <= 1e-9 {
                // Nothing to do: only slots that pay (a kept previous run) are taken.
                let mut v = 0.0;
                for (i, t) in window.clone().enumerate() {
                    scratch.picked[i] = options[t].first().copied().filter(|o| o.cost_g < 0.0);
                    v += scratch.picked[i].map_or(0.0, |o| o.cost_g * scale_cost);
                }
                Some(v)
            } else {
                price_job(
                    options,
                    window.clone(),
                    scale_cost,
                    jp.unit_h,
                    jp.units,
                    round_up,
                    &mut scratch.dp,
                    &mut scratch.picked,
                )
            };
            if let Some(v) = v
                && best_value.is_none_or(|b| v < b - 1e-12)
            {
                best_value = Some(v);
                scratch.best_picked.clone_from(&scratch.picked);
            }
        }
        scratch.order = order;
        let v = best_value?;
        let runs = window
            .zip(&scratch.best_picked)
            .filter_map(|(t, o)| {
                o.map(|o| Slot {
                    slot: t,
                    pool: o.pool,
                    level: o.level,
                })
            })
            .collect();
        Some((v, runs))
    }

    /// Prices every included job at `mu` (g per GPU, per pool and slot) and `lambda` (g per kW,
    /// per site and slot), both >= 0. Returns `false` when some job's relaxation cannot finish
    /// its work (then nothing bounds the plan).
    ///
    /// With `round_up` false the programmes round each run's work down instead: every schedule
    /// in `runs` then does its work except for a migratable job's transfer losses, but `value_g`
    /// bounds nothing.
    pub fn price(&mut self, mu: &[Vec<f64>], lambda: &[Vec<f64>], round_up: bool) -> bool {
        self.price_until(mu, lambda, round_up, &|| false)
    }

    /// [`Pricer::price`], asking `stop` before each job: the jobs left when it answers `true`
    /// get no schedule (`runs[j]` `None`), and then `value_g` bounds nothing and the answer is
    /// `false`; each priced job's `job_value_g` still holds.
    pub fn price_until(
        &mut self,
        mu: &[Vec<f64>],
        lambda: &[Vec<f64>],
        round_up: bool,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> bool {
        let problem = self.problem;
        let n_slots = problem.n_slots;
        let mut points = std::mem::take(&mut self.points);
        for g in 0..self.groups.len() {
            for t in 0..n_slots {
                if self.group_slots[g][t] {
                    let pools = std::mem::take(&mut self.groups[g].pools);
                    self.options_at(&pools, t, mu, lambda, &mut points);
                    self.groups[g].pools = pools;
                    pareto(&mut points, &mut self.groups[g].options[t]);
                }
            }
        }
        for row in self.gpu_use.iter_mut().chain(self.kw_use.iter_mut()) {
            row.iter_mut().for_each(|v| *v = 0.0);
        }
        self.points = points;
        let n_jobs_in = self.jobs.len();
        let threads = self.threads.min(n_jobs_in).max(1);
        // Per job: `None` when left at the stop, else its cheapest schedule if it can finish.
        let results: Vec<Option<JobPriced>> = if threads <= 1 {
            let mut scratch = std::mem::take(&mut self.scratch);
            let results = (0..n_jobs_in)
                .map(|i| (!stop()).then(|| self.price_one(i, mu, lambda, round_up, &mut scratch)))
                .collect();
            self.scratch = scratch;
            results
        } else {
            // Contiguous chunks, one per thread, joined in job order: the same answer as one
            // thread, bit for bit.
            let chunk = n_jobs_in.div_ceil(threads);
            let this = &*self;
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..n_jobs_in)
                    .step_by(chunk)
                    .map(|lo| {
                        scope.spawn(move || {
                            let mut scratch = Scratch::new(n_slots);
                            (lo..(lo + chunk).min(n_jobs_in))
                                .map(|i| {
                                    (!stop()).then(|| {
                                        this.price_one(i, mu, lambda, round_up, &mut scratch)
                                    })
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(crate::heuristic::join)
                    .collect()
            })
        };
        let mut value = problem.change_constant_g();
        let mut feasible = true;
        let site_state = !round_up || self.moves == Moves::Bound;
        for (i, result) in results.into_iter().enumerate() {
            let job = self.jobs[i].job;
            let Some((v, runs)) = result.flatten() else {
                self.runs[job] = None;
                feasible = false;
                continue;
            };
            let gpus = f64::from(problem.jobs[job].gpus);
            value += v;
            self.job_value_g[job] = v;
            let moving = self.jobs[i].moving.as_ref().filter(|_| site_state);
            let mut last_site = problem.jobs[job].current_site;
            for run in &runs {
                let site = problem.pools[run.pool].site;
                self.gpu_use[run.pool][run.slot] += gpus;
                self.kw_use[site][run.slot] += gpus * self.pool_kw[run.pool][run.level];
                // A site-state programme's moves load both ends with their transfers.
                if let (Some(moving), Some(last)) = (moving, last_site)
                    && last != site
                {
                    self.kw_use[last][run.slot] += moving.transfer_kw;
                    self.kw_use[site][run.slot] += moving.transfer_kw;
                }
                last_site = Some(site);
            }
            self.runs[job] = Some(runs);
        }
        if !feasible {
            self.value_g = f64::NEG_INFINITY;
            return false;
        }
        // Capacity and power rows, and the grid draw's own minimum.
        for p in 0..problem.pools.len() {
            for t in 0..n_slots {
                let cap = self.cap_gpus[p][t];
                value -= mu[p][t] * cap;
                let g = self.gpu_use[p][t] - cap;
                self.grad_mu[p][t] = if mu[p][t] <= 0.0 { g.max(0.0) } else { g };
            }
        }
        for s in 0..problem.inst.sites.len() {
            for t in 0..n_slots {
                let (l, cost, limit) = (
                    lambda[s][t],
                    self.grid_g_per_kw[s][t],
                    self.grid_limit_kw[s][t],
                );
                value -= l * self.upper_kw[s][t];
                let net = cost - l;
                let need = self.kw_use[s][t] - self.upper_kw[s][t];
                let grid = if net > 1e-9 {
                    0.0
                } else if net < -1e-9 {
                    value += net * limit;
                    limit
                } else {
                    need.clamp(0.0, limit)
                };
                let mut g = need - grid;
                if l <= 0.0 {
                    g = g.max(0.0);
                }
                if limit.is_infinite() && l >= cost {
                    g = g.min(0.0);
                }
                self.grad_lambda[s][t] = g;
            }
        }
        self.value_g = value;
        true
    }
}

/// Maximises the Lagrangian dual over the jobs with `include[j]`, starting from prices read off
/// `start` (grid carbon where it draws from the grid).
pub(crate) fn dual_bound(
    problem: &Problem,
    include: &[bool],
    start: &Schedule,
    config: &DualConfig,
) -> DualOutcome {
    let n_sites = problem.inst.sites.len();
    let n_slots = problem.n_slots;
    let n_pools = problem.pools.len();
    let mut pricer = Pricer::new(problem, include, config.grid, false);
    let (mut mu, mut lambda) = match config.start {
        Some(start) => (start.gpu.clone(), start.kw.clone()),
        None => start_prices(problem, include, start, &pricer.grid_g_per_kw),
    };

    let mut best = DualOutcome {
        bound_g: None,
        iterations: 0,
        scale: config.start_scale,
        gpu_price: mu.clone(),
        kw_price: lambda.clone(),
        relaxed: Schedule {
            runs: vec![None; problem.jobs.len()],
        },
    };
    let mut scale = config.start_scale;
    let mut since_better = 0;
    let mut dir_mu = vec![vec![0.0; n_slots]; n_pools];
    let mut dir_lambda = vec![vec![0.0; n_slots]; n_sites];

    while best.iterations < config.max_iterations.max(1) {
        if best.iterations > 0 && (config.stop)() {
            break;
        }
        best.iterations += 1;
        if !pricer.price(&mu, &lambda, true) {
            best.bound_g = None;
            break;
        }
        let value = pricer.value_g;
        let (grad_mu, grad_lambda) = (&pricer.grad_mu, &pricer.grad_lambda);
        if best
            .bound_g
            .is_none_or(|b| value > b + 1e-9 * b.abs().max(1.0))
        {
            best.bound_g = Some(value);
            best.gpu_price.clone_from(&mu);
            best.kw_price.clone_from(&lambda);
            best.relaxed.runs.clone_from(&pricer.runs);
            since_better = 0;
        } else {
            since_better += 1;
            if since_better >= PATIENCE {
                scale /= 2.0;
                since_better = 0;
                // Restart from the best prices with the smaller step.
                mu.clone_from(&best.gpu_price);
                lambda.clone_from(&best.kw_price);
                dir_mu
                    .iter_mut()
                    .chain(dir_lambda.iter_mut())
                    .flatten()
                    .for_each(|d| *d = 0.0);
                if scale < MIN_STEP_SCALE {
                    break;
                }
                continue;
            }
        }
        let norm2: f64 = grad_mu
            .iter()
            .chain(grad_lambda.iter())
            .flatten()
            .map(|g| g * g)
            .sum();
        let target = config.upper_g;
        let gap = target - best.bound_g.unwrap_or(value);
        if gap <= config.rel_gap * target.abs() || norm2 <= 1e-18 {
            break;
        }
        // Deflection (Camerini, Fratta and Maffioli): when the new subgradient turns back against
        // the last direction, part of that direction is kept, which damps the zig-zag between
        // coupled rows.
        let dot: f64 = grad_mu
            .iter()
            .flatten()
            .zip(dir_mu.iter().flatten())
            .chain(
                grad_lambda
                    .iter()
                    .flatten()
                    .zip(dir_lambda.iter().flatten()),
            )
            .map(|(g, d)| g * d)
            .sum();
        let dir_norm2: f64 = dir_mu
            .iter()
            .chain(dir_lambda.iter())
            .flatten()
            .map(|d| d * d)
            .sum();
        let beta = if dot < 0.0 && dir_norm2 > 0.0 {
            -DEFLECTION * dot / dir_norm2
        } else {
            0.0
        };
        let mut norm2 = 0.0;
        for (d_row, g_row) in dir_mu
            .iter_mut()
            .chain(dir_lambda.iter_mut())
            .zip(grad_mu.iter().chain(grad_lambda.iter()))
        {
            for (d, g) in d_row.iter_mut().zip(g_row) {
                *d = g + beta * *d;
                norm2 += *d * *d;
            }
        }
        if norm2 <= 1e-18 {
            break;
        }
        let step = scale * (target - value).max(gap * 0.1) / norm2;
        for p in 0..n_pools {
            for t in 0..n_slots {
                mu[p][t] = (mu[p][t] + step * dir_mu[p][t]).max(0.0);
            }
        }
        for s in 0..n_sites {
            for t in 0..n_slots {
                let mut l = (lambda[s][t] + step * dir_lambda[s][t]).max(0.0);
                if pricer.grid_limit_kw[s][t].is_infinite() {
                    l = l.min(pricer.grid_g_per_kw[s][t]);
                }
                lambda[s][t] = l;
            }
        }
    }
    best.scale = scale;
    best
}

/// Starting prices read off a plan: no GPU price, and the grid cost where the plan draws from
/// the grid.
fn start_prices(
    problem: &Problem,
    include: &[bool],
    start: &Schedule,
    grid_g_per_kw: &[Vec<f64>],
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let n_sites = problem.inst.sites.len();
    let n_slots = problem.n_slots;
    let mut load_kw: Vec<Vec<f64>> = (0..n_sites)
        .map(|s| vec![problem.idle_load_kw[s]; n_slots])
        .collect();
    for (job, runs) in start.runs.iter().enumerate() {
        let Some(runs) = runs.as_ref().filter(|_| include[job]) else {
            continue;
        };
        for ((s, t), kw) in problem.added_load_kw(job, runs) {
            load_kw[s][t] += kw;
        }
    }
    let mu = vec![vec![0.0; n_slots]; problem.pools.len()];
    let lambda = (0..n_sites)
        .map(|s| {
            (0..n_slots)
                .map(|t| {
                    if load_kw[s][t] > problem.inst.sites[s].surplus_kw[t] + 1e-9 {
                        grid_g_per_kw[s][t]
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    (mu, lambda)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::tests::random_instance;

    /// Prices every job of `problem` at prices off the heuristic's plan, with `threads` threads.
    fn price_with(
        problem: &Problem,
        threads: usize,
        round_up: bool,
    ) -> (f64, Vec<f64>, Vec<Option<Vec<Slot>>>) {
        let include = vec![true; problem.jobs.len()];
        let skip = vec![false; problem.jobs.len()];
        let (start, _) = crate::heuristic::construct(problem, &skip, true, &|| false);
        let mut pricer = Pricer::new(problem, &include, Grid::Coarse, true);
        pricer.threads = threads;
        let (mu, lambda) = start_prices(problem, &include, &start, &pricer.grid_g_per_kw);
        pricer.price(&mu, &lambda, round_up);
        (
            pricer.value_g,
            pricer.job_value_g.clone(),
            pricer.runs.clone(),
        )
    }

    /// Whole GPUs at each site keep the bound a bound: at the start prices and at random
    /// prices around them, the value with the sites' whole-GPU gain is at most the objective
    /// of the heuristic's plan serving the same jobs, the gain is not negative, and on these
    /// fleets (surplus at every other site, grid limits) it lifts the value somewhere.
    #[test]
    fn whole_gpus_keep_the_bound_below_every_plan() {
        let mut lifted = 0;
        let mut priced = 0;
        for seed in 0..6u64 {
            let instance = random_instance(seed, 30, 3, 24);
            let problem = Problem::new(&instance);
            let skip = vec![false; problem.jobs.len()];
            let (plan, _) = crate::heuristic::construct(&problem, &skip, true, &|| false);
            let include: Vec<bool> = plan.runs.iter().map(Option::is_some).collect();
            let objective_g = problem.evaluate(&plan).objective_g;
            let pricer = Pricer::new(&problem, &include, Grid::Fine, false);
            let (mu, lambda) = start_prices(&problem, &include, &plan, &pricer.grid_g_per_kw);
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            for round in 0..4 {
                let mut jitter = |v: f64| if round == 0 { v } else { v * 2.0 * next() };
                let prices = crate::heuristic::Prices {
                    gpu: mu
                        .iter()
                        .map(|r| r.iter().map(|&v| jitter(v)).collect())
                        .collect(),
                    kw: lambda
                        .iter()
                        .map(|r| r.iter().map(|&v| jitter(v)).collect())
                        .collect(),
                };
                let Some(terms) = bound_on_grid(&problem, &include, &prices, Grid::Fine) else {
                    continue;
                };
                priced += 1;
                assert!(terms.whole_gpus_g() >= 0.0, "seed {seed} round {round}");
                assert!(
                    terms.value_g() <= objective_g + 1e-6 * objective_g.abs().max(1.0),
                    "seed {seed} round {round}: {} above the plan's {objective_g}",
                    terms.value_g()
                );
                if terms.whole_gpus_g() > 1e-3 {
                    lifted += 1;
                }
            }
        }
        assert!(priced >= 12, "{priced} pricing(s)");
        assert!(lifted > 0, "no pricing gained from whole GPUs");
    }

    /// Skipping the alternatives whose floor is no better than the best value so far changes
    /// no job's value: each is the cheapest of all its alternatives' programmes priced one by
    /// one. Every floor is at most its programme's value, and infinite exactly when the
    /// programme has no answer. With a previous plan, the jobs priced on their own get the
    /// options of every run of their pools with their change costs (built from the shared
    /// groups), and their floors stay below their values too.
    #[test]
    fn skipping_alternatives_by_their_floor_keeps_every_value() {
        let mut alternatives = 0;
        let mut own_alternatives = 0;
        let mut own_moving = 0;
        for (seed, with_previous) in [(3, false), (11, false), (3, true), (11, true)] {
            let mut instance = random_instance(seed, 120, 4, 24);
            if with_previous {
                let problem = Problem::new(&instance);
                let skip = vec![false; problem.jobs.len()];
                let (previous, _) = crate::heuristic::construct(&problem, &skip, false, &|| false);
                instance.previous_assignments = problem.to_plan(&previous, &[]).assignments;
                instance.params.change_penalty_g = 50.0;
            }
            let problem = Problem::new(&instance);
            let include = vec![true; problem.jobs.len()];
            let skip = vec![false; problem.jobs.len()];
            let (start, _) = crate::heuristic::construct(&problem, &skip, true, &|| false);
            let moves: &[Moves] = if with_previous {
                &[Moves::Free, Moves::Real, Moves::Bound]
            } else {
                &[Moves::Free]
            };
            for (round_up, &moves) in [true, false]
                .into_iter()
                .flat_map(|r| moves.iter().map(move |m| (r, m)))
            {
                let mut pricer = Pricer::with_moves(&problem, &include, Grid::Coarse, moves);
                let (mu, lambda) = start_prices(&problem, &include, &start, &pricer.grid_g_per_kw);
                assert!(pricer.price(&mu, &lambda, round_up), "seed {seed}");
                let (mut dp, mut rates) = (Dp::default(), Vec::new());
                let mut scratch = Scratch::new(problem.n_slots);
                for jp in &pricer.jobs {
                    let view = &problem.jobs[jp.job];
                    if !problem.previous[jp.job].is_empty() && view.work_hours > 1e-9 {
                        own_moving += usize::from(jp.moving.is_some());
                        own_alternatives += check_own_pricing(
                            &problem,
                            &pricer,
                            jp,
                            (&mu, &lambda),
                            round_up,
                            &mut scratch,
                        );
                        continue;
                    }
                    if view.work_hours <= 1e-9 || jp.groups.len() < 2 {
                        continue;
                    }
                    let gpus = f64::from(view.gpus);
                    let mut picked = vec![None; view.window.len()];
                    let mut best = f64::INFINITY;
                    for &g in &jp.groups {
                        let options = &pricer.groups[g].options;
                        let (unit_h, k) = (jp.unit_h, jp.units);
                        let window = view.window.clone();
                        let value = price_job(
                            options,
                            window.clone(),
                            gpus,
                            unit_h,
                            k,
                            round_up,
                            &mut dp,
                            &mut picked,
                        );
                        let floor =
                            price_floor(options, window, gpus, unit_h, k, round_up, &mut rates);
                        match value {
                            Some(v) => {
                                assert!(floor <= v + 1e-9 * v.abs().max(1.0), "{floor} > {v}");
                                best = best.min(v);
                            }
                            None => assert_eq!(floor, f64::INFINITY),
                        }
                        alternatives += 1;
                    }
                    let priced = pricer.job_value_g[jp.job];
                    assert!(
                        (priced - best).abs() <= 1e-9 * best.abs().max(1.0),
                        "seed {seed}, job {}: {priced} against {best}",
                        jp.job
                    );
                }
            }
        }
        assert!(alternatives > 0, "no job had two alternatives");
        assert!(own_alternatives > 0, "no job was priced on its own");
        assert!(
            own_moving > 0,
            "no job with change costs was priced with its site as state"
        );
    }

    /// For a job priced on its own: its options in each group and slot against every run of
    /// the group's pools with the job's change costs; for a job priced with its site as state,
    /// its value against that programme over those options; otherwise each alternative's value
    /// against its floor, and the job's value against the cheapest alternative. Answers how
    /// many groups it checked.
    fn check_own_pricing(
        problem: &Problem,
        pricer: &Pricer,
        jp: &JobPricing,
        (mu, lambda): (&[Vec<f64>], &[Vec<f64>]),
        round_up: bool,
        scratch: &mut Scratch,
    ) -> usize {
        let job = jp.job;
        let view = &problem.jobs[job];
        let gpus = f64::from(view.gpus);
        let credit = problem.inst.params.change_penalty_g * problem.previous[job].len() as f64;
        let (mut dp, mut rates) = (Dp::default(), Vec::new());
        let mut picked = vec![None; view.window.len()];
        let (unit_h, k, window) = (jp.unit_h, jp.units, view.window.clone());
        // Every run of a group's pools with the job's change costs, on their frontier.
        let mut every = |g: usize| {
            let mut options = vec![Vec::new(); problem.n_slots];
            for t in window.clone() {
                let mut points = Vec::new();
                for &pool in &pricer.groups[g].pools {
                    let site = problem.pools[pool].site;
                    for level in 0..pricer.pool_kw[pool].len() {
                        let per_gpu = mu[pool][t] + pricer.pool_kw[pool][level] * lambda[site][t];
                        points.push(Option_ {
                            work_h: pricer.pool_work[pool][level],
                            cost_g: gpus * per_gpu + problem.change_g(job, t, pool, level),
                            pool,
                            level,
                        });
                    }
                }
                pareto(&mut points, &mut options[t]);
                let mut built = Vec::new();
                pricer.own_options(job, g, t, mu, lambda, &mut scratch.points, &mut built);
                assert_eq!(built.len(), options[t].len(), "job {job}, slot {t}");
                for (x, y) in built.iter().zip(&options[t]) {
                    assert!((x.cost_g - y.cost_g).abs() <= 1e-9 * y.cost_g.abs().max(1.0));
                    assert_eq!(x.work_h, y.work_h, "job {job}, slot {t}");
                }
            }
            options
        };
        let priced = pricer.job_value_g[job];
        let close = |v: f64, w: f64| (v - w).abs() <= 1e-9 * w.abs().max(1.0);
        let site_state = !round_up || pricer.moves == Moves::Bound;
        if let Some(moving) = jp.moving.as_ref().filter(|_| site_state) {
            let per_site: Vec<Vec<Vec<Option_>>> =
                moving.site_groups.iter().map(|&g| every(g)).collect();
            let slices: Vec<&[Vec<Option_>]> = per_site.iter().map(Vec::as_slice).collect();
            let value = price_job_moving(
                &slices,
                window,
                1.0,
                unit_h,
                k,
                round_up,
                moving,
                lambda,
                &mut dp,
                &mut picked,
            );
            if let Some(v) = value {
                assert!(close(priced, v), "job {job}: {priced} against {v}");
            }
            return per_site.len();
        }
        let mut best = f64::INFINITY;
        for &g in &jp.groups {
            let options = every(g);
            let value = price_job(
                &options,
                window.clone(),
                1.0,
                unit_h,
                k,
                round_up,
                &mut dp,
                &mut picked,
            );
            let group = &pricer.groups[g].options;
            let floor =
                price_floor(group, window.clone(), gpus, unit_h, k, round_up, &mut rates) - credit;
            if let Some(v) = value {
                assert!(
                    floor <= v + 1e-9 * v.abs().max(1.0),
                    "job {job}: {floor} > {v}"
                );
                best = best.min(v);
            }
        }
        if best.is_finite() {
            assert!(close(priced, best), "job {job}: {priced} against {best}");
        }
        jp.groups.len()
    }

    #[test]
    fn pricing_on_several_threads_gives_the_single_thread_answer_bit_for_bit() {
        let instance = random_instance(11, 300, 4, 24);
        let problem = Problem::new(&instance);
        for round_up in [true, false] {
            let (value, job_values, runs) = price_with(&problem, 1, round_up);
            assert!(value.is_finite());
            for threads in [2, 3, 7] {
                let (v, jv, r) = price_with(&problem, threads, round_up);
                assert_eq!(v.to_bits(), value.to_bits(), "{threads} threads");
                assert!(
                    jv.iter()
                        .zip(&job_values)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{threads} threads"
                );
                assert_eq!(r, runs, "{threads} threads");
            }
        }
    }

    /// Every grid's units reach the job's work (so real pricing does it) and fit 16 bits; where
    /// a job spans the grid's fewest units, a slot of its fastest full work is a whole number of
    /// units (so such a run counts exactly), and the coarse grid keeps at least 8 units per slot
    /// of work however long the job.
    #[test]
    fn work_grids_reach_the_work_and_count_a_fastest_run_exactly() {
        let mut instance = random_instance(3, 60, 4, 24);
        for (j, job) in instance.jobs.iter_mut().enumerate() {
            // From about a minute's work to about 76 hours of it, spread over the jobs.
            job.work_hours = 0.02 * 1.15f64.powi(j as i32);
        }
        let problem = Problem::new(&instance);
        let grids = [
            (Grid::Coarse, 24.0_f64),
            (Grid::Fine, 60.0),
            (Grid::Finer(16), 960.0),
            (Grid::Finer(1024), 61_440.0),
        ];
        let mut aligned = 0;
        for job in 0..problem.jobs.len() {
            let work_h = problem.jobs[job].work_hours;
            let fastest_h = problem.fastest_slot_h(job);
            let slots = work_h / fastest_h;
            for (grid, per_slot) in grids {
                let (unit_h, units) = work_grid(&problem, job, grid);
                assert!(
                    units >= 1 && units < usize::from(u16::MAX),
                    "{grid:?}: {units} units"
                );
                assert!(
                    units as f64 * unit_h >= work_h * (1.0 - 1e-9),
                    "job {job}, {grid:?}: {units} units of {unit_h} h miss {work_h} h"
                );
                let per_fastest_slot = fastest_h / unit_h;
                if slots * per_slot.min(f64::from(u16::MAX) / slots) >= 24.0 {
                    assert!(
                        (per_fastest_slot - per_fastest_slot.round()).abs() < 1e-6,
                        "job {job}, {grid:?}: {per_fastest_slot} units per fastest slot"
                    );
                    aligned += 1;
                }
                if grid == Grid::Coarse && slots >= 1.0 {
                    assert!(
                        (8.0 - 1e-9..=24.0 + 1e-9).contains(&per_fastest_slot),
                        "job {job}: {per_fastest_slot} coarse units per slot over {slots} slots"
                    );
                }
            }
        }
        assert!(aligned > 0);
    }

    #[test]
    fn the_final_bound_on_a_finer_grid_stays_below_the_exact_optimum() {
        // At the prices read off the heuristic's plan and at the best prices of a subgradient
        // ascent, the finest grid's value bounds the proven optimum (with and without change
        // costs).
        let never = || false;
        let mut compared = 0;
        for case in crate::master::tests::proven_optima(0..8) {
            let crate::master::tests::ProvenOptimum {
                seed,
                with_previous,
                instance,
                start,
                optimum_g,
            } = case;
            let problem = Problem::new(&instance);
            let include = vec![true; problem.jobs.len()];
            let tolerance = 1e-6 * optimum_g.max(1.0);
            let pricer = Pricer::new(&problem, &include, Grid::Fine, false);
            let (mu, lambda) = start_prices(&problem, &include, &start, &pricer.grid_g_per_kw);
            let ascent = dual_bound(
                &problem,
                &include,
                &start,
                &DualConfig {
                    max_iterations: 60,
                    upper_g: problem.evaluate(&start).objective_g,
                    rel_gap: 1e-9,
                    stop: &never,
                    start_scale: 1.0,
                    start: None,
                    grid: Grid::Coarse,
                },
            );
            let at_start = crate::heuristic::Prices {
                gpu: mu,
                kw: lambda,
            };
            let at_best = crate::heuristic::Prices {
                gpu: ascent.gpu_price,
                kw: ascent.kw_price,
            };
            for (prices, good) in [(&at_start, false), (&at_best, true)] {
                let (mut terms, grid) =
                    final_bound(&problem, &include, prices, 1e7).expect("every job can finish");
                let bound = terms.value_g();
                assert_eq!(
                    grid,
                    Grid::Finer(16),
                    "a tiny instance fits the finest grid"
                );
                assert!(
                    bound <= optimum_g + tolerance,
                    "seed {seed} ({with_previous}): bound {bound} above the optimum {optimum_g}"
                );
                // The refinements a caller's budget may add stay bounds too.
                let mut finer = grid.doubled();
                while let Some(g) = finer.filter(|&g| g != Grid::Finer(256)) {
                    let refined_terms =
                        bound_on_grid(&problem, &include, prices, g).expect("every job can finish");
                    let refined = refined_terms.value_g();
                    assert!(
                        refined <= optimum_g + tolerance,
                        "seed {seed} ({with_previous}), {g:?}: bound {refined} above the optimum {optimum_g}"
                    );
                    terms.merge(&refined_terms);
                    finer = g.doubled();
                }
                // The moves' least losses keep every merged term a bound.
                let merged = terms.value_g();
                moves_bound(&problem, prices, Grid::Finer(128), &|| false, &mut terms);
                let with_moves = terms.value_g();
                assert!(
                    with_moves >= merged - tolerance && with_moves <= optimum_g + tolerance,
                    "seed {seed} ({with_previous}): {merged} merged, {with_moves} with the moves' losses, optimum {optimum_g}"
                );
                // Prices near the dual optimum bound closely; those off a plan need not.
                assert!(
                    !good || bound > 0.5 * optimum_g,
                    "seed {seed}: {bound}, {optimum_g}"
                );
            }
            compared += 1;
        }
        assert!(compared >= 8, "only {compared} instances were compared");
    }

    /// A job of 4.5 hours in 6 hourly slots whose two sites take turns at being clean, priced
    /// at the grid's carbon: its Lagrangian value with free moves, then with its moves priced
    /// by [`moves_bound`] (and the jobs priced and the candidates), and its exact optimum, g.
    /// With `fast_pair`, two more sites, always dirty and with a fast link between them.
    fn hopper_bounds(
        save_s: f64,
        wan_gbps: f64,
        transfer_kwh_per_gb: f64,
        migration_penalty_g: f64,
        fast_pair: bool,
    ) -> (f64, f64, (usize, usize), f64) {
        let carbon = |clean_first: bool| -> Vec<f64> {
            (0..6)
                .map(|t| {
                    if (t % 2 == 0) == clean_first {
                        50.0
                    } else {
                        500.0
                    }
                })
                .collect()
        };
        let site = |id: &str, clean_first: bool| {
            serde_json::json!({
                "id": id, "zone": id, "gpus": { "H100": 1 }, "pue": 1.0, "wan_gbps": wan_gbps,
                "surplus_kw": vec![0.0; 6], "carbon_g_per_kwh": carbon(clean_first),
            })
        };
        let mut sites = vec![site("a", true), site("b", false)];
        if fast_pair {
            for id in ["c", "d"] {
                sites.push(serde_json::json!({
                    "id": id, "zone": id, "gpus": { "H100": 1 }, "pue": 1.0, "wan_gbps": 1e6,
                    "surplus_kw": vec![0.0; 6], "carbon_g_per_kwh": vec![900.0; 6],
                }));
            }
        }
        let instance = crate::Instance::from_json(
            &serde_json::json!({
                "start_utc": "2024-01-01T00:00:00Z", "slot_minutes": 60, "slots": 6,
                "gpu_models": { "H100": {
                    "power_levels_w": [700.0], "throughput": [1.0], "speed": 1.0, "idle_w": 0.0,
                } },
                "sites": sites,
                "jobs": [{
                    "id": "hopper", "gpus": 1, "work_hours": 4.5,
                    "release_utc": "2024-01-01T00:00:00Z", "deadline_utc": "2024-01-01T06:00:00Z",
                    "checkpoint_gb": 150.0, "save_s": save_s, "restore_s": save_s,
                    "migratable": true, "home_site": "a",
                }],
                "params": {
                    "alpha": 1.0, "transfer_kwh_per_gb": transfer_kwh_per_gb,
                    "migration_penalty_g": migration_penalty_g,
                },
            })
            .to_string(),
        )
        .expect("a valid instance");
        let problem = Problem::new(&instance);
        let include = vec![true];
        let pricer = Pricer::new(&problem, &include, Grid::Fine, false);
        // The grid's carbon as the power price: the Lagrangian value is then the job's own
        // emissions in its relaxation.
        let prices = crate::heuristic::Prices {
            gpu: vec![vec![0.0; 6]; problem.pools.len()],
            kw: pricer.grid_g_per_kw.clone(),
        };
        let mut terms = bound_on_grid(&problem, &include, &prices, Grid::Finer(16)).unwrap();
        let free = terms.value_g();
        let priced = moves_bound(&problem, &prices, Grid::Finer(16), &|| false, &mut terms);
        let with_moves = terms.value_g();
        let exact = crate::milp::solve(
            &problem,
            &include,
            None,
            None,
            &crate::milp::MilpConfig {
                budget: None,
                time_limit_s: 30.0,
                mip_rel_gap: 1e-9,
                relax: false,
                soft_work: false,
                log: false,
            },
        )
        .expect("the MILP runs");
        assert!(exact.proven_optimal);
        let optimum_g = problem.evaluate(&exact.schedule.unwrap()).objective_g;
        (free, with_moves, priced, optimum_g)
    }

    /// One migratable job, two sites whose clean hours alternate and a slow link: with moves
    /// free its relaxation hops to every clean hour, but each move loses 40 % of a slot, so no
    /// real schedule can. The moves' least losses lift the bound to the exact optimum's
    /// neighbourhood and never past it.
    #[test]
    fn the_moves_losses_lift_the_bound_of_a_job_that_would_hop() {
        let (free, with_moves, priced, optimum_g) = hopper_bounds(120.0, 1.0, 0.0, 0.0, false);
        assert_eq!(priced, (1, 1));
        assert!(
            with_moves > free + 100.0 && with_moves <= optimum_g + 1e-6 * optimum_g,
            "free moves {free} g, with their losses {with_moves} g, optimum {optimum_g} g"
        );
    }

    /// The same job with two more sites it never gains from, always dirty, with a fast link
    /// between them: a move's loss is the least over the sites it may leave for the site it
    /// reaches, so a fast link that reaches neither of the job's clean sites leaves the bound
    /// as it was without them.
    #[test]
    fn a_fast_link_elsewhere_leaves_the_moves_losses_into_a_site_as_they_are() {
        let (_, alone, _, alone_optimum_g) = hopper_bounds(120.0, 1.0, 0.0, 0.0, false);
        let (free, with_moves, priced, optimum_g) = hopper_bounds(120.0, 1.0, 0.0, 0.0, true);
        assert_eq!(priced, (1, 1));
        assert!((optimum_g - alone_optimum_g).abs() <= 1e-6 * optimum_g);
        assert!(
            (with_moves - alone).abs() <= 1e-6 * alone && with_moves > free + 100.0,
            "free moves {free} g, with their losses {with_moves} g, two sites alone {alone} g"
        );
        assert!(with_moves <= optimum_g + 1e-6 * optimum_g);
    }

    #[test]
    fn the_moves_transfer_energy_and_penalty_lift_the_bound_of_a_job_that_would_hop() {
        // No time lost to a move: only its transfer's energy at both ends, or its penalty,
        // or both, make hopping cost anything, and the bound meets the optimum (175 g with
        // free moves against 655, 475 and 755 g).
        for (kwh_per_gb, penalty_g) in [(0.002, 0.0), (0.0, 100.0), (0.002, 100.0)] {
            let (free, with_moves, priced, optimum_g) =
                hopper_bounds(0.0, 1e6, kwh_per_gb, penalty_g, false);
            assert_eq!(priced, (1, 1));
            assert!(
                with_moves > free + 50.0 && (with_moves - optimum_g).abs() <= 1e-6 * optimum_g,
                "{kwh_per_gb} kWh/GB, {penalty_g} g a move: free moves {free} g, with their \
                 costs {with_moves} g, optimum {optimum_g} g"
            );
        }
    }
}
