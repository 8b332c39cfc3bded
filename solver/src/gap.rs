//! Where a plan's gap lies: the plan's objective less the Lagrangian bound at the bound's
//! prices, split into what each job's schedule costs above its cheapest relaxed schedule at
//! those prices, what the GPU-slots the plan leaves idle are priced at, and the rest (the
//! plan's grid draw beyond what the power prices charge for its load). What whole GPUs at each
//! site add to the bound at the same prices is reported too.
//!
//! Rationale: with `mu` (per GPU-slot) and `lambda` (per kW) the prices, the Lagrangian value
//! is the sum over jobs of each one's cheapest priced schedule plus terms that depend on the
//! prices alone, so `plan - bound` is exactly the sum of three parts, each at least zero for a
//! valid plan: a job's priced schedule costs at least its cheapest; an idle GPU-slot's price
//! is not negative; the rest is what the plan's draw costs above its priced linearisation. A
//! large first part on few jobs points at jobs that the relaxation splits and a plan cannot
//! (gangs that fill a site); a large second part at capacity the relaxation uses and the plan
//! does not.
//!
//! It must not perform I/O or read the clock; it reads a finished plan and changes nothing.

use serde::{Deserialize, Serialize};

use crate::heuristic::{Prices, progress};
use crate::lagrange::{BoundTerms, Grid, Pricer};
use crate::problem::{Problem, Schedule, Slot};

/// Jobs listed in [`GapBreakdown::top_jobs`].
const TOP_JOBS: usize = 10;

/// A plan's gap against the Lagrangian bound at the bound's prices, in three parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GapBreakdown {
    /// The Lagrangian value at the prices, g: a lower bound, at most the bound reported.
    pub lagrangian_g: f64,
    /// The plan's objective, g.
    pub objective_g: f64,
    /// Over the served jobs, what each one's schedule costs at the prices above its cheapest
    /// relaxed schedule there, g.
    pub jobs_above_g: f64,
    /// Served jobs whose schedule costs at least `LEAST_ABOVE_G` above their cheapest.
    pub jobs_above_count: usize,
    /// The prices of the GPU-slots the plan leaves idle, g.
    pub idle_priced_g: f64,
    /// The rest: the plan's grid draw beyond what the power prices charge for its load, g.
    pub rest_g: f64,
    /// What whole GPUs at each site add to the bound at the prices (the bound reported counts
    /// it; `lagrangian_g` does not), g: surplus that the loads a site's GPUs can draw do not
    /// fill exactly. It comes out of the idle GPU-slots and the rest, but where the plan's
    /// checkpoint transfers run under a surplus, which the first part charges to the jobs.
    #[serde(default)]
    pub whole_gpus_g: f64,
    /// The jobs furthest above their cheapest schedule, furthest first.
    pub top_jobs: Vec<JobAbove>,
    /// Per site, in the instance's order.
    pub sites: Vec<SiteGap>,
}

/// One job's schedule against its cheapest at the prices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobAbove {
    pub job: String,
    pub gpus: u32,
    /// The site where the plan runs it in most slots.
    pub site: String,
    /// The site where its cheapest relaxed schedule at the prices runs in most slots (on the
    /// fine work grid), when it has one.
    pub cheapest_site: Option<String>,
    /// Its schedule's cost at the prices above its cheapest, g.
    pub above_g: f64,
}

/// One site's share of the first two parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteGap {
    pub site: String,
    /// `jobs_above_g` of the jobs the plan runs there in most slots, g.
    pub jobs_above_g: f64,
    /// The prices of its idle GPU-slots, g.
    pub idle_priced_g: f64,
}

impl GapBreakdown {
    /// A job counts as above its cheapest (in `jobs_above_count`, and where a job is listed
    /// as furthest above) from this many grams.
    pub const LEAST_ABOVE_G: f64 = 1.0;
}

impl SiteGap {
    /// The site's share of the first two parts, g.
    pub fn total_g(&self) -> f64 {
        self.jobs_above_g + self.idle_priced_g
    }
}

/// The breakdown of `schedule` at `prices`, whose bound terms are `terms`. Jobs the schedule
/// serves that the terms do not price (served after the bound) are priced here on the fine
/// grid; the terms of the prices alone do not depend on the jobs. `None` when the terms price
/// a job the schedule does not serve, or a job priced here cannot finish its work.
pub(crate) fn breakdown(
    problem: &Problem,
    schedule: &Schedule,
    prices: &Prices,
    terms: &BoundTerms,
) -> Option<GapBreakdown> {
    let n_jobs = problem.jobs.len();
    let served: Vec<bool> = schedule.runs.iter().map(Option::is_some).collect();
    let included = terms.included();
    if (0..n_jobs).any(|j| included[j] && !served[j]) {
        return None;
    }
    let late: Vec<bool> = (0..n_jobs).map(|j| served[j] && !included[j]).collect();
    let mut late_g = vec![0.0; n_jobs];
    if late.iter().any(|&l| l) {
        let mut pricer = Pricer::new(problem, &late, Grid::Fine, false);
        if !pricer.price(&prices.gpu, &prices.kw, true) {
            return None;
        }
        for j in (0..n_jobs).filter(|&j| late[j]) {
            late_g[j] = pricer.job_value_g[j];
        }
    }
    let term_g = |job: usize| {
        if late[job] {
            late_g[job]
        } else {
            terms.job_g(job)
        }
    };
    let n_sites = problem.inst.sites.len();
    let mut usage = vec![vec![0.0; problem.n_slots]; problem.pools.len()];
    let mut sites: Vec<SiteGap> = problem
        .inst
        .sites
        .iter()
        .map(|s| SiteGap {
            site: s.id.clone(),
            jobs_above_g: 0.0,
            idle_priced_g: 0.0,
        })
        .collect();
    // The site where `runs` spend most slots (the first of a tie).
    let most_slots_at = |runs: &[Slot]| {
        let mut slots_at = vec![0usize; n_sites];
        for run in runs {
            slots_at[problem.pools[run.pool].site] += 1;
        }
        (0..n_sites)
            .max_by_key(|&s| (slots_at[s], std::cmp::Reverse(s)))
            .unwrap_or(0)
    };
    let mut above: Vec<(f64, usize, usize)> = Vec::new();
    for job in 0..n_jobs {
        let Some(runs) = &schedule.runs[job] else {
            continue;
        };
        let gpus = f64::from(problem.jobs[job].gpus);
        let mut priced_g = 0.0;
        for run in runs {
            priced_g += gpus * prices.gpu[run.pool][run.slot]
                + problem.change_g(job, run.slot, run.pool, run.level);
            usage[run.pool][run.slot] += gpus;
        }
        for ((site, slot), kw) in problem.added_load_kw(job, runs) {
            priced_g += prices.kw[site][slot] * kw;
        }
        let migrations = progress(problem, job, runs).map_or(0, |(_, m)| m);
        priced_g += problem.inst.params.migration_penalty_g * migrations as f64;
        let site = most_slots_at(runs);
        let above_g = priced_g - term_g(job);
        sites[site].jobs_above_g += above_g;
        above.push((above_g, job, site));
    }
    for (pool, used) in usage.iter().enumerate() {
        let spec = &problem.pools[pool];
        for (slot, &gpus) in used.iter().enumerate() {
            sites[spec.site].idle_priced_g +=
                prices.gpu[pool][slot] * (f64::from(spec.gpus) - gpus).max(0.0);
        }
    }
    let objective_g = problem.evaluate(schedule).objective_g;
    let lagrangian_g = terms.lagrangian_g() + late_g.iter().sum::<f64>();
    let jobs_above_g: f64 = above.iter().map(|a| a.0).sum();
    let idle_priced_g: f64 = sites.iter().map(|s| s.idle_priced_g).sum();
    above.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    // Where the jobs furthest above would run at the prices: their relaxed schedules, priced
    // once more (only theirs).
    let mut top = vec![false; n_jobs];
    for &(_, job, _) in above.iter().take(TOP_JOBS) {
        top[job] = true;
    }
    let mut pricer = Pricer::new(problem, &top, Grid::Fine, false);
    let priced = pricer.price(&prices.gpu, &prices.kw, true);
    Some(GapBreakdown {
        lagrangian_g,
        objective_g,
        jobs_above_g,
        jobs_above_count: above
            .iter()
            .filter(|a| a.0 >= GapBreakdown::LEAST_ABOVE_G)
            .count(),
        idle_priced_g,
        rest_g: objective_g - lagrangian_g - jobs_above_g - idle_priced_g,
        whole_gpus_g: terms.whole_gpus_g(),
        top_jobs: above
            .iter()
            .take(TOP_JOBS)
            .map(|&(above_g, job, site)| JobAbove {
                job: problem.inst.jobs[job].id.clone(),
                gpus: problem.jobs[job].gpus,
                site: problem.inst.sites[site].id.clone(),
                cheapest_site: pricer.runs[job]
                    .as_deref()
                    .filter(|runs| priced && !runs.is_empty())
                    .map(|runs| problem.inst.sites[most_slots_at(runs)].id.clone()),
                above_g,
            })
            .collect(),
        sites,
    })
}

#[cfg(test)]
mod tests {
    use crate::master::tests::random_instance;
    use crate::{Method, SolveOptions, solve, validate};

    /// On the Lagrangian and column-generation paths the breakdown prices the plan solved: no
    /// part is below zero (a job's schedule costs at least its cheapest at the prices, an idle
    /// GPU-slot's price is not negative, and the plan's draw costs at least its priced
    /// linearisation), no job or site is below zero, and the bound at the prices is at most
    /// the one reported. The exact MILP's path, which prices nothing, has none.
    #[test]
    fn no_part_of_the_gap_is_negative_and_the_bound_at_the_prices_holds() {
        let mut explained = 0;
        for (seed, n_jobs, method) in [
            (0, 40, Method::Lagrangian),
            (1, 40, Method::Lagrangian),
            (2, 60, Method::Lagrangian),
            (3, 30, Method::Auto),
            (4, 30, Method::Auto),
        ] {
            let instance = random_instance(seed, n_jobs, 3, 24);
            let options = SolveOptions {
                method,
                time_limit_s: 5.0,
                ..SolveOptions::default()
            };
            let solution = solve(&instance, &options);
            assert!(validate(&instance, &solution.plan).valid, "seed {seed}");
            // Every plan on the Lagrangian path has one (seed 2's serves a job after the
            // bound, which is priced with the rest).
            let Some(b) = solution.gap_breakdown else {
                assert_eq!(
                    method,
                    Method::Auto,
                    "seed {seed}: {}",
                    solution.metrics.method
                );
                continue;
            };
            explained += 1;
            let objective_g = solution.metrics.objective_g;
            let tol_g = 1e-6 * objective_g.abs().max(1.0);
            assert!((b.objective_g - objective_g).abs() <= tol_g, "seed {seed}");
            assert!(
                b.lagrangian_g <= solution.metrics.lower_bound_g + tol_g,
                "seed {seed}: {} above the reported bound {}",
                b.lagrangian_g,
                solution.metrics.lower_bound_g
            );
            assert!(b.jobs_above_g >= -tol_g, "seed {seed}: {b:?}");
            assert!(b.idle_priced_g >= -tol_g, "seed {seed}: {b:?}");
            assert!(b.rest_g >= -tol_g, "seed {seed}: {b:?}");
            assert!(b.whole_gpus_g >= 0.0, "seed {seed}: {b:?}");
            assert!(
                b.lagrangian_g + b.whole_gpus_g <= b.objective_g + tol_g,
                "seed {seed}: {b:?}"
            );
            for job in &b.top_jobs {
                assert!(job.above_g >= -tol_g, "seed {seed}: {job:?}");
            }
            for site in &b.sites {
                assert!(site.idle_priced_g >= -tol_g, "seed {seed}: {site:?}");
            }
            let sites_g: f64 = b.sites.iter().map(|s| s.jobs_above_g).sum();
            assert!((sites_g - b.jobs_above_g).abs() <= tol_g, "seed {seed}");
        }
        assert!(explained >= 3, "{explained} breakdown(s)");

        let small = random_instance(5, 8, 2, 12);
        let solution = solve(&small, &SolveOptions::default());
        assert!(
            solution.gap_breakdown.is_none(),
            "the exact MILP prices nothing"
        );
    }
}
