//! The Dantzig-Wolfe master LP over the relaxed job programmes of `lagrange`: column generation
//! that maximises the same Lagrangian dual as the subgradient ascent, to its optimum, with the
//! master's duals as prices.
//!
//! The master picks a convex combination of schedules (columns) per job under the coupling rows
//! (GPUs per pool and slot, power balance per site and slot with the grid draw as a priced
//! variable). Its duals price the rows; [`Pricer::price`] then gives each job's cheapest relaxed
//! schedule, which enters the master when its reduced cost is negative, and the Lagrangian
//! value at those prices, a true lower bound at every round. Pricing happens at a smoothed point
//! between the best-bound prices and the master's (Wentges smoothing), which damps the
//! oscillation of the master's duals; when the smoothed point yields no improving column the
//! master's own duals are priced, so the method stops only at the master LP's optimum, where the
//! bound equals the LP value.
//!
//! The outcome carries the prices at the best bound and, per job, the schedule with the largest
//! weight in the last master solution: the constructions start from them.
//!
//! Must not perform I/O or read the clock: rounds are bounded by a count and a stop callback.

use std::collections::BTreeSet;

use highs::{HighsModelStatus, Model, Sense};

use crate::colgen::{ColgenConfig, Column, grow, master_problem, solve_master_mip};
use crate::heuristic::{Prices, progress};
use crate::lagrange::{Grid, Pricer};
use crate::problem::{Problem, Schedule, Slot};

/// A column enters when its reduced cost is below minus this, g.
const REDUCED_COST_EPS_G: f64 = 1e-6;
/// Weight of the best-bound prices in the smoothed pricing point.
const SMOOTHING: f64 = 0.5;

pub(crate) struct MasterConfig<'a> {
    /// Most master LP solves.
    pub max_rounds: usize,
    /// The best known plan's objective, g: the ascent stops once the bound is within
    /// `rel_gap` of it.
    pub upper_g: f64,
    /// Relative tolerance for convergence (bound against the master LP value) and for the plan.
    pub rel_gap: f64,
    /// Asked between rounds; `true` ends the ascent with the best bound so far.
    pub stop: &'a dyn Fn() -> bool,
    pub log: bool,
    /// Hold the jobs outside the included set where the seed plans them (their GPUs and load
    /// come off the rows' bounds): the master then re-plans the included jobs around them, and
    /// its bound holds for that subproblem only.
    pub hold_rest: bool,
    /// Prices to begin at (another step's best): each job's relaxed schedule at them is among
    /// the first columns besides the seed's, made real by [`realize`] it joins the restricted
    /// master, and they are the first centre of the smoothing, so the rounds start near the
    /// dual optimum. The jobs are priced really only at the rounds' duals.
    pub start: Option<&'a Prices>,
    /// Price the jobs really at every round's duals (their schedules enter the LP too), or
    /// only once, after the last round, for the restricted master. Real pricing of migratable
    /// jobs tracks their site and costs many times a relaxed round.
    pub real_each_round: bool,
}

pub(crate) struct MasterOutcome {
    /// The best Lagrangian value seen, g: a lower bound on every plan serving exactly the
    /// included jobs. `None` when some job's relaxation cannot finish its work.
    pub bound_g: Option<f64>,
    pub rounds: usize,
    pub columns: usize,
    /// Whether the bound met the master LP value (the dual is maximised).
    pub converged: bool,
    /// Prices at the best bound.
    pub prices: Prices,
    /// Per included job, the schedule with the largest weight in the last master solution.
    pub relaxed: Schedule,
    /// The real schedules met on the way (relaxed answers made real by [`realize`]), for a
    /// master MILP.
    pub restricted: Restricted,
}

/// Where a job's column puts its entries in the master's rows: one convexity row per included
/// job, then GPU rows per pool and slot, then power rows per site and slot.
#[derive(Clone)]
struct Layout {
    n_slots: usize,
    cap_base: usize,
    pow_base: usize,
    /// Convexity row per job (`usize::MAX` for a job left out).
    conv: Vec<usize>,
}

impl Layout {
    fn cap(&self, pool: usize, slot: usize) -> usize {
        self.cap_base + pool * self.n_slots + slot
    }

    fn pow(&self, site: usize, slot: usize) -> usize {
        self.pow_base + site * self.n_slots + slot
    }

    /// A schedule's column: real (transfer energy and migration penalty included) when
    /// `relaxed` is `None`, else relaxed as that pricer costs it (runs' load only).
    fn column(
        &self,
        problem: &Problem,
        job: usize,
        runs: Vec<Slot>,
        relaxed: Option<&Pricer>,
    ) -> Column {
        let gpus = f64::from(problem.jobs[job].gpus);
        let mut entries: Vec<(usize, f64)> = runs
            .iter()
            .map(|r| (self.cap(r.pool, r.slot), gpus))
            .collect();
        let mut cost_g: f64 = runs
            .iter()
            .map(|r| problem.change_g(job, r.slot, r.pool, r.level))
            .sum();
        match relaxed {
            None => {
                for ((site, slot), kw) in problem.added_load_kw(job, &runs) {
                    entries.push((self.pow(site, slot), kw));
                }
                let migrations = progress(problem, job, &runs).map_or(0, |(_, m)| m);
                cost_g += problem.inst.params.migration_penalty_g * migrations as f64;
            }
            Some(pricer) => {
                for r in &runs {
                    let site = problem.pools[r.pool].site;
                    entries.push((self.pow(site, r.slot), pricer.run_kw(job, r)));
                }
            }
        }
        entries.push((self.conv[job], 1.0));
        Column {
            job,
            runs,
            real: relaxed.is_none(),
            cost_g,
            entries,
        }
    }
}

/// A column's reduced cost at the master's row duals, g.
fn reduced_cost_g(column: &Column, duals: &[f64]) -> f64 {
    column.cost_g
        - column
            .entries
            .iter()
            .map(|&(r, v)| duals[r] * v)
            .sum::<f64>()
}

/// A master problem over real schedules only, solved as a MILP (price-and-branch).
pub(crate) struct Restricted {
    jobs: Vec<usize>,
    upper: Vec<f64>,
    grid_cols: Vec<(f64, f64, usize)>,
    layout: Layout,
    columns: Vec<Column>,
    known: BTreeSet<(usize, Vec<Slot>)>,
}

impl Restricted {
    /// Adds a real schedule's column unless it is known.
    fn add(&mut self, problem: &Problem, job: usize, runs: Vec<Slot>) {
        if self.known.insert((job, runs.clone())) {
            self.columns
                .push(self.layout.column(problem, job, runs, None));
        }
    }

    /// Real columns held.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// The best combination of the real columns and `start`'s schedules (the MILP's starting
    /// point), within HiGHS's time limit; `None` when it finds none.
    pub fn solve(
        &self,
        problem: &Problem,
        start: &Schedule,
        time_limit_s: f64,
        rel_gap: f64,
        log: bool,
    ) -> Result<Option<Schedule>, String> {
        // The start's columns first: the MILP is seeded with the first column of each job.
        let mut ordered: Vec<Column> = Vec::with_capacity(self.columns.len() + self.jobs.len());
        let mut seeded: BTreeSet<(usize, &[Slot])> = BTreeSet::new();
        for &j in &self.jobs {
            if let Some(runs) = &start.runs[j] {
                seeded.insert((j, runs));
                ordered.push(self.layout.column(problem, j, runs.clone(), None));
            }
        }
        ordered.extend(
            self.columns
                .iter()
                .filter(|c| !seeded.contains(&(c.job, c.runs.as_slice())))
                .cloned(),
        );
        let config = ColgenConfig {
            mip_time_limit_s: time_limit_s,
            mip_rel_gap: rel_gap,
            log,
            max_rounds: 0,
            stop: &|| false,
        };
        solve_master_mip(
            problem,
            &self.jobs,
            &self.upper,
            &self.grid_cols,
            &ordered,
            &config,
        )
    }
}

/// A real schedule close to a relaxed one: the relaxed runs, with power levels raised and slots
/// added at the site of a neighbouring run (cheapest at the prices per work hour gained) until
/// the accounting rules count the work done; `None` when no such repair exists (a move breaks
/// the feasibility domain, or the window has no room).
fn realize(
    problem: &Problem,
    job: usize,
    runs: &[Slot],
    mu: &[Vec<f64>],
    lambda: &[Vec<f64>],
) -> Option<Vec<Slot>> {
    let view = &problem.jobs[job];
    let gpus = f64::from(view.gpus);
    let price = |r: &Slot| {
        gpus * mu[r.pool][r.slot]
            + problem.run_load_kw(job, r.pool, r.level) * lambda[problem.pools[r.pool].site][r.slot]
    };
    let mut runs = runs.to_vec();
    let (mut done_h, _) = progress(problem, job, &runs)?;
    for _ in 0..=view.window.len() * 4 {
        if done_h + 1e-9 >= view.work_hours {
            return Some(runs);
        }
        // (cost per work hour gained, candidate runs, work done)
        let mut best: Option<(f64, Vec<Slot>, f64)> = None;
        let mut consider = |candidate: Vec<Slot>, extra_g: f64| {
            if let Some((d, _)) = progress(problem, job, &candidate)
                && d > done_h + 1e-12
            {
                let per_h = extra_g / (d - done_h);
                if best.as_ref().is_none_or(|(b, _, _)| per_h < *b - 1e-12) {
                    best = Some((per_h, candidate, d));
                }
            }
        };
        for i in 0..runs.len() {
            let r = runs[i];
            if r.level > 0 {
                let raised = Slot {
                    level: r.level - 1,
                    ..r
                };
                let mut candidate = runs.clone();
                candidate[i] = raised;
                consider(candidate, price(&raised) - price(&r));
            }
        }
        let mut next = 0;
        for slot in view.window.clone() {
            while next < runs.len() && runs[next].slot < slot {
                next += 1;
            }
            if runs.get(next).is_some_and(|r| r.slot == slot) {
                continue;
            }
            // The pool of the run before (or, before the first run, after).
            let Some(neighbour) = next
                .checked_sub(1)
                .map(|i| runs[i])
                .or(runs.get(next).copied())
            else {
                continue;
            };
            let added = Slot {
                slot,
                pool: neighbour.pool,
                level: 0,
            };
            let mut candidate = runs.clone();
            candidate.insert(next, added);
            consider(candidate, price(&added));
        }
        let (_, candidate, d) = best?;
        runs = candidate;
        done_h = d;
    }
    None
}

/// Each job's cheapest real schedule at the prices (a relaxed answer that falls short of the
/// work repaired by [`realize`]), for the jobs that have one.
fn real_schedules(
    problem: &Problem,
    pricer: &mut Pricer,
    jobs: &[usize],
    mu: &[Vec<f64>],
    lambda: &[Vec<f64>],
) -> Vec<(usize, Vec<Slot>)> {
    pricer.price(mu, lambda, false);
    jobs.iter()
        .filter_map(|&j| {
            let runs = pricer.runs[j].clone()?;
            if progress(problem, j, &runs)
                .is_some_and(|(d, _)| d + 1e-9 >= problem.jobs[j].work_hours)
            {
                Some((j, runs))
            } else {
                realize(problem, j, &runs, mu, lambda).map(|real| (j, real))
            }
        })
        .collect()
}

/// Runs column generation over the jobs with `include[j]`, every one of which `seed` serves
/// (its schedules are the first columns, so the master is feasible from the start).
pub(crate) fn solve(
    problem: &Problem,
    include: &[bool],
    seed: &Schedule,
    config: &MasterConfig,
) -> Result<MasterOutcome, String> {
    let n_sites = problem.inst.sites.len();
    let n_slots = problem.n_slots;
    let n_pools = problem.pools.len();
    let jobs: Vec<usize> = (0..problem.jobs.len()).filter(|&j| include[j]).collect();
    if jobs.iter().any(|&j| seed.runs[j].is_none()) {
        return Err("the seed plan must serve every included job".into());
    }
    let mut pricer = Pricer::new(problem, include, Grid::Fine, true);
    if config.hold_rest {
        pricer.hold(include, seed);
    }
    let mut conv = vec![usize::MAX; problem.jobs.len()];
    for (i, &j) in jobs.iter().enumerate() {
        conv[j] = i;
    }
    let n_in = jobs.len();
    let layout = Layout {
        n_slots,
        cap_base: n_in,
        pow_base: n_in + n_pools * n_slots,
        conv,
    };
    let mut upper: Vec<f64> = vec![1.0; n_in];
    for cap in &pricer.cap_gpus {
        upper.extend(cap.iter().copied());
    }
    let mut grid_cols: Vec<(f64, f64, usize)> = Vec::new();
    for s in 0..n_sites {
        for t in 0..n_slots {
            upper.push(pricer.upper_kw[s][t]);
            grid_cols.push((
                pricer.grid_g_per_kw[s][t],
                pricer.grid_limit_kw[s][t],
                layout.pow(s, t),
            ));
        }
    }

    let mut restricted = Restricted {
        jobs: jobs.clone(),
        upper: upper.clone(),
        grid_cols: grid_cols.clone(),
        layout: layout.clone(),
        columns: Vec::new(),
        known: BTreeSet::new(),
    };

    let mut columns: Vec<Column> = Vec::new();
    let mut known: BTreeSet<(usize, Vec<Slot>)> = BTreeSet::new();
    for &j in &jobs {
        let runs = seed.runs[j].clone().expect("checked above");
        known.insert((j, runs.clone()));
        columns.push(layout.column(problem, j, runs, None));
    }
    let constant_g = problem.change_constant_g();
    let mut best_bound: Option<f64> = None;
    let mut best_mu = vec![vec![0.0; n_slots]; n_pools];
    let mut best_lambda = vec![vec![0.0; n_slots]; n_sites];
    if let Some(start) = config.start
        && pricer.price(&start.gpu, &start.kw, true)
    {
        best_bound = Some(pricer.value_g);
        best_mu.clone_from(&start.gpu);
        best_lambda.clone_from(&start.kw);
        for &j in &jobs {
            let Some(runs) = pricer.runs[j].clone() else {
                continue;
            };
            if known.insert((j, runs.clone())) {
                if let Some(real) = realize(problem, j, &runs, &start.gpu, &start.kw) {
                    restricted.add(problem, j, real);
                }
                columns.push(layout.column(problem, j, runs, Some(&pricer)));
            }
        }
        // No real pricing at the start prices: it costs as much as many relaxed rounds, and
        // the relaxed answers made real above are real schedules already.
    }
    let (mut pb, row_handles) = master_problem(n_in, &upper, &grid_cols);
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
    // Rationale: each round adds columns to a solved master, so its basis stays primal
    // feasible; primal simplex without presolve re-solves it fastest (measured on the M
    // benchmark instance: about a third fewer seconds per round than dual simplex).
    model.set_option("simplex_strategy", 4);
    model.set_option("presolve", "off");

    let mut mu_s = best_mu.clone();
    let mut lambda_s = best_lambda.clone();
    let mut converged = false;
    let mut rounds = 0;
    let mut lp_g;
    let mut weights: Vec<f64>;
    let mut last_duals: Option<Prices> = None;
    loop {
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
        lp_g = solved.objective_value() + constant_g;
        let solution = solved.get_solution();
        let duals: Vec<f64> = solution.dual_rows().to_vec();
        weights = solution.columns()[grid_cols.len()..].to_vec();
        let mu_m: Vec<Vec<f64>> = (0..n_pools)
            .map(|p| {
                (0..n_slots)
                    .map(|t| (-duals[layout.cap(p, t)]).max(0.0))
                    .collect()
            })
            .collect();
        let lambda_m: Vec<Vec<f64>> = (0..n_sites)
            .map(|s| {
                (0..n_slots)
                    .map(|t| {
                        let l = (-duals[layout.pow(s, t)]).max(0.0);
                        if pricer.grid_limit_kw[s][t].is_infinite() {
                            l.min(pricer.grid_g_per_kw[s][t])
                        } else {
                            l
                        }
                    })
                    .collect()
            })
            .collect();
        // Price at the smoothed point first; on a mispricing (no improving column there), at
        // the master's own duals.
        let mut new_columns: Vec<Column> = Vec::new();
        let alphas: &[f64] = if best_bound.is_some() {
            &[SMOOTHING, 0.0]
        } else {
            &[0.0]
        };
        for &alpha in alphas {
            for (dst, (b, m)) in mu_s.iter_mut().chain(lambda_s.iter_mut()).zip(
                best_mu
                    .iter()
                    .chain(best_lambda.iter())
                    .zip(mu_m.iter().chain(lambda_m.iter())),
            ) {
                for (d, (b, m)) in dst.iter_mut().zip(b.iter().zip(m)) {
                    *d = alpha * b + (1.0 - alpha) * m;
                }
            }
            if !pricer.price(&mu_s, &lambda_s, true) {
                return Ok(MasterOutcome {
                    bound_g: None,
                    rounds,
                    columns: columns.len(),
                    converged: false,
                    prices: Prices {
                        gpu: best_mu,
                        kw: best_lambda,
                    },
                    relaxed: seed.clone(),
                    restricted,
                });
            }
            if best_bound.is_none_or(|b| pricer.value_g > b) {
                best_bound = Some(pricer.value_g);
                best_mu.clone_from(&mu_s);
                best_lambda.clone_from(&lambda_s);
            }
            for &j in &jobs {
                let Some(runs) = pricer.runs[j].as_ref() else {
                    continue;
                };
                if known.contains(&(j, runs.clone())) {
                    continue;
                }
                let column = layout.column(problem, j, runs.clone(), Some(&pricer));
                if reduced_cost_g(&column, &duals) < -REDUCED_COST_EPS_G {
                    known.insert((j, column.runs.clone()));
                    if let Some(real) = realize(problem, j, &column.runs, &mu_s, &lambda_s) {
                        restricted.add(problem, j, real);
                    }
                    new_columns.push(column);
                }
            }
            if !new_columns.is_empty() {
                break;
            }
        }
        let relaxed_new = new_columns.len();
        // Real pricing at the master's duals: schedules that do their work, for the LP and the
        // restricted master; or, with `real_each_round` false, once after the last round.
        if config.real_each_round {
            for (j, runs) in real_schedules(problem, &mut pricer, &jobs, &mu_m, &lambda_m) {
                if known.contains(&(j, runs.clone())) {
                    continue;
                }
                let column = layout.column(problem, j, runs.clone(), None);
                restricted.add(problem, j, runs.clone());
                if reduced_cost_g(&column, &duals) < -REDUCED_COST_EPS_G {
                    known.insert((j, runs));
                    new_columns.push(column);
                }
            }
        } else {
            last_duals = Some(Prices {
                gpu: mu_m,
                kw: lambda_m,
            });
        }
        let bound = best_bound.expect("priced at least once");
        if config.log {
            println!(
                "master round {rounds}: LP {lp_g:.3} g, bound {bound:.3} g, {relaxed_new} relaxed + {} real new columns",
                new_columns.len() - relaxed_new
            );
        }
        if relaxed_new == 0 || lp_g - bound <= config.rel_gap * lp_g.abs() {
            converged = true;
            break;
        }
        if config.upper_g - bound <= config.rel_gap * config.upper_g.abs()
            || rounds >= config.max_rounds
            || (config.stop)()
        {
            break;
        }
        model = grow(solved, &new_columns, &row_handles)?;
        columns.extend(new_columns);
    }
    if let Some(last) = last_duals {
        for (j, runs) in real_schedules(problem, &mut pricer, &jobs, &last.gpu, &last.kw) {
            restricted.add(problem, j, runs);
        }
    }
    // Per job, its heaviest column in the last master solution.
    let mut heaviest: Vec<Option<(f64, usize)>> = vec![None; problem.jobs.len()];
    for (c, column) in columns.iter().enumerate() {
        let w = weights.get(c).copied().unwrap_or(0.0);
        if heaviest[column.job].is_none_or(|(b, _)| w > b + 1e-9) {
            heaviest[column.job] = Some((w, c));
        }
    }
    let relaxed = Schedule {
        runs: heaviest
            .iter()
            .map(|h| h.map(|(_, c)| columns[c].runs.clone()))
            .collect(),
    };
    Ok(MasterOutcome {
        bound_g: best_bound,
        rounds,
        columns: columns.len(),
        converged,
        prices: Prices {
            gpu: best_mu,
            kw: best_lambda,
        },
        relaxed,
        restricted,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::instance::Instance;
    use crate::{heuristic, milp, validate};

    /// A seeded instance: solar-shaped surplus at half the sites, daily carbon cycles, two GPU
    /// models with power levels, grid limits, and jobs of 1-4 GPUs, most of them migratable.
    pub(crate) fn random_instance(
        seed: u64,
        n_jobs: usize,
        n_sites: usize,
        n_slots: usize,
    ) -> Instance {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let hour = |h: usize| format!("2023-06-01T{h:02}:00:00Z");
        let sites: Vec<serde_json::Value> = (0..n_sites)
            .map(|s| {
                let phase = next() * 24.0;
                let base = 80.0 + next() * 420.0;
                let solar_kw = if s % 2 == 0 { 2.0 + next() * 6.0 } else { 0.0 };
                let surplus: Vec<f64> = (0..n_slots)
                    .map(|t| {
                        let x = ((t as f64 + phase) % 24.0 - 6.0) / 12.0 * std::f64::consts::PI;
                        (solar_kw * x.sin()).max(0.0)
                    })
                    .collect();
                let carbon: Vec<f64> = (0..n_slots)
                    .map(|t| base * (1.0 + 0.3 * ((t as f64 + phase) / 4.0).cos()))
                    .collect();
                let model = if s % 3 == 2 { "A100" } else { "H100" };
                serde_json::json!({
                    "id": format!("site-{s}"), "gpus": { model: 4 }, "pue": 1.2,
                    "grid_limit_kw": 30.0, "wan_gbps": 10.0,
                    "surplus_kw": surplus, "carbon_g_per_kwh": carbon
                })
            })
            .collect();
        let jobs: Vec<serde_json::Value> = (0..n_jobs)
            .map(|j| {
                let gpus = [1, 1, 2, 4][(next() * 4.0) as usize];
                let release = (next() * (n_slots / 2) as f64) as usize;
                let work = 0.5 + next() * 3.0;
                let span = (work.ceil() as usize * 2 + (next() * 4.0) as usize).max(2);
                let deadline = (release + span).min(n_slots);
                serde_json::json!({
                    "id": format!("job-{j}"), "gpus": gpus,
                    "work_hours": work.min((deadline - release) as f64 * 0.9),
                    "release_utc": hour(release), "deadline_utc": hour(deadline),
                    "checkpoint_gb": 5.0 + next() * 95.0, "save_s": 30, "restore_s": 60,
                    "migratable": next() < 0.75,
                    "home_site": format!("site-{}", (next() * n_sites as f64) as usize)
                })
            })
            .collect();
        let value = serde_json::json!({
            "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": n_slots,
            "gpu_models": {
                "H100": { "power_levels_w": [700, 550, 400], "throughput": [1.0, 0.92, 0.78],
                          "speed": 1.0, "idle_w": 50 },
                "A100": { "power_levels_w": [400, 300], "throughput": [1.0, 0.85],
                          "speed": 0.6, "idle_w": 40 }
            },
            "sites": sites, "jobs": jobs,
            "params": { "change_penalty_g": 25.0 }
        });
        Instance::from_json(&value.to_string()).expect("a valid instance")
    }

    /// A tiny seeded instance whose optimum the exact MILP proves, with the heuristic's plan.
    pub(crate) struct ProvenOptimum {
        pub seed: u64,
        pub with_previous: bool,
        pub instance: Instance,
        pub start: Schedule,
        pub optimum_g: f64,
    }

    /// `random_instance(seed, 6, 3, 10)` for each seed, once as it is and once with the
    /// heuristic's plan as the previous plan (so change costs are priced), where the heuristic
    /// places every job and the exact MILP proves the optimum.
    pub(crate) fn proven_optima(seeds: std::ops::Range<u64>) -> Vec<ProvenOptimum> {
        proven_optima_of(seeds, 6, 3, 10)
    }

    /// [`proven_optima`] over `random_instance(seed, n_jobs, n_sites, n_slots)`.
    pub(crate) fn proven_optima_of(
        seeds: std::ops::Range<u64>,
        n_jobs: usize,
        n_sites: usize,
        n_slots: usize,
    ) -> Vec<ProvenOptimum> {
        let exact = milp::MilpConfig {
            budget: None,
            time_limit_s: 30.0,
            mip_rel_gap: 1e-7,
            relax: false,
            soft_work: false,
            log: false,
        };
        let never = || false;
        let mut cases = Vec::new();
        for seed in seeds {
            let mut instance = random_instance(seed, n_jobs, n_sites, n_slots);
            for with_previous in [false, true] {
                if with_previous {
                    let problem = Problem::new(&instance);
                    let skip = vec![false; n_jobs];
                    let (start, _) = heuristic::construct(&problem, &skip, false, &never);
                    let plan = problem.to_plan(&start, &[]);
                    instance.previous_assignments = plan.assignments;
                }
                let problem = Problem::new(&instance);
                let skip = vec![false; problem.jobs.len()];
                let (start, failed) = heuristic::construct(&problem, &skip, false, &never);
                if !failed.is_empty() {
                    continue;
                }
                let include = vec![true; problem.jobs.len()];
                let optimum = milp::solve(&problem, &include, Some(&start), None, &exact)
                    .expect("the MILP runs");
                let Some(best) = optimum.schedule.filter(|_| optimum.proven_optimal) else {
                    continue;
                };
                let optimum_g = problem.evaluate(&best).objective_g;
                cases.push(ProvenOptimum {
                    seed,
                    with_previous,
                    instance: instance.clone(),
                    start,
                    optimum_g,
                });
            }
        }
        cases
    }

    #[test]
    fn the_master_bound_is_below_the_exact_optimum_and_its_plans_are_real() {
        let never = || false;
        let mut compared = 0;
        for case in proven_optima(0..12) {
            let ProvenOptimum {
                seed,
                with_previous,
                instance,
                start,
                optimum_g,
            } = case;
            let problem = Problem::new(&instance);
            let include = vec![true; problem.jobs.len()];
            let config = MasterConfig {
                max_rounds: 500,
                upper_g: problem.evaluate(&start).objective_g,
                rel_gap: 1e-9,
                stop: &never,
                log: false,
                hold_rest: false,
                start: None,
                real_each_round: true,
            };
            let outcome = solve(&problem, &include, &start, &config).expect("master");
            let bound = outcome.bound_g.expect("every job can finish");
            let tolerance = 1e-6 * optimum_g.max(1.0);
            assert!(
                bound <= optimum_g + tolerance,
                "seed {seed} ({with_previous}): bound {bound} above the optimum {optimum_g}"
            );
            assert!(
                bound > 0.5 * optimum_g,
                "seed {seed}: bound {bound}, {optimum_g}"
            );
            let plan = outcome
                .restricted
                .solve(&problem, &start, 10.0, 1e-7, false)
                .expect("the restricted master runs")
                .expect("the start is a solution");
            let objective = problem.evaluate(&plan).objective_g;
            assert!(
                objective >= optimum_g - tolerance,
                "seed {seed}: {objective}"
            );
            assert!(objective <= problem.evaluate(&start).objective_g + tolerance);
            let check = validate(&instance, &problem.to_plan(&plan, &[]));
            assert!(check.valid, "seed {seed}: {:?}", check.violations);
            compared += 1;
        }
        assert!(compared >= 10, "only {compared} instances were compared");
    }
}
