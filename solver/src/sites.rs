//! Site search: the exact MILP over the jobs that stay at one site, each site in turn, with
//! every other job fixed where the plan has it.
//!
//! With each job held at its site, the MILP needs no location or migration variables: it
//! re-times the site's jobs and re-chooses their power caps jointly, which a search that moves
//! one job at a time cannot do (the caps that fill a slot's surplus exactly depend on which
//! other jobs share the slot). A site with many resident jobs is split into groups of jobs
//! whose windows are close. A group's answer is kept only when the plan's objective falls.
//!
//! It must not perform I/O or read the clock: the caller gives the seconds the step may take
//! and a stop callback.

use crate::heuristic;
use crate::milp;
use crate::problem::{Problem, Schedule};

/// Most jobs one site MILP re-plans.
const GROUP_JOBS: usize = 100;
/// Most seconds HiGHS gets for one group.
const GROUP_MOST_S: f64 = 4.0;
/// Least seconds worth giving HiGHS for one group; below it the step is skipped and its time
/// goes to the local search. Rationale: on the benchmark's 10,000-job size the search's share
/// gave 78-122 groups about 0.2 s each, 4-6 of them improved the plan (0.03 kg in 12 s in one
/// run), where the randomised search gains about 0.12 kg/s; on its 1,000-job size 15 groups
/// get about 0.44 s each (40 % of the 16.6 s left at 13.4 s) and gain 1.1 kg in 4.6 s
/// (docs/benchmarks.md).
const GROUP_LEAST_S: f64 = 0.35;

/// The outcome of [`search`].
pub(crate) struct SiteSearch {
    pub schedule: Schedule,
    /// Groups whose MILP lowered the objective.
    pub improvements: usize,
    /// MILPs solved.
    pub solves: usize,
}

/// The groups of jobs to re-plan: per site, the jobs the plan keeps there for good (no
/// migration, and not currently elsewhere), by window start, in groups of at most
/// `GROUP_JOBS`; sites with more resident jobs first.
fn groups(problem: &Problem, schedule: &Schedule) -> Vec<(usize, Vec<usize>)> {
    let n_sites = problem.inst.sites.len();
    let mut resident: Vec<Vec<usize>> = vec![Vec::new(); n_sites];
    for (job, runs) in schedule.runs.iter().enumerate() {
        let Some(runs) = runs else { continue };
        let Some(first) = runs.first() else { continue };
        let site = problem.pools[first.pool].site;
        let stays = runs.iter().all(|r| problem.pools[r.pool].site == site)
            && problem.jobs[job].current_site.is_none_or(|s| s == site)
            && heuristic::progress(problem, job, runs).is_some_and(|(_, moves)| moves == 0);
        if stays {
            resident[site].push(job);
        }
    }
    let mut sites: Vec<usize> = (0..n_sites).filter(|&s| !resident[s].is_empty()).collect();
    sites.sort_by_key(|&s| (std::cmp::Reverse(resident[s].len()), s));
    let mut out = Vec::new();
    for site in sites {
        let jobs = &mut resident[site];
        jobs.sort_by_key(|&j| (problem.jobs[j].window.start, problem.jobs[j].window.end, j));
        let n_groups = jobs.len().div_ceil(GROUP_JOBS);
        let per_group = jobs.len().div_ceil(n_groups);
        for chunk in jobs.chunks(per_group) {
            out.push((site, chunk.to_vec()));
        }
    }
    out
}

/// Re-plans each site's resident jobs with the exact MILP, within `budget_s` seconds of HiGHS
/// time in all, until `stop` answers `true`.
pub(crate) fn search(
    problem: &Problem,
    start: &Schedule,
    budget_s: f64,
    mip_rel_gap: f64,
    stop: &dyn Fn() -> bool,
) -> SiteSearch {
    let mut current = start.clone();
    let mut current_g = problem.evaluate(&current).objective_g;
    let groups = groups(problem, start);
    let mut left_s = budget_s;
    let (mut improvements, mut solves) = (0, 0);
    for (i, (site, jobs)) in groups.iter().enumerate() {
        let limit_s = (left_s / (groups.len() - i) as f64).min(GROUP_MOST_S);
        if stop() || limit_s < GROUP_LEAST_S {
            break;
        }
        left_s -= limit_s;
        let mut include = vec![false; problem.jobs.len()];
        let mut site_of = vec![None; problem.jobs.len()];
        for &j in jobs {
            include[j] = true;
            site_of[j] = Some(*site);
        }
        let config = milp::MilpConfig {
            budget: None,
            time_limit_s: limit_s,
            mip_rel_gap,
            relax: false,
            soft_work: false,
            log: false,
        };
        solves += 1;
        let Ok(outcome) = milp::solve_at_sites(problem, &include, &current, &site_of, &config)
        else {
            continue;
        };
        let Some(schedule) = outcome.schedule.filter(|_| outcome.unserved.is_empty()) else {
            continue;
        };
        if problem.adopt_if_lower(&mut current, &mut current_g, &schedule, jobs) {
            improvements += 1;
        }
    }
    SiteSearch {
        schedule: current,
        improvements,
        solves,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::tests::{proven_optima_of, random_instance};
    use crate::validate;

    /// On one site every served job is resident, so the site search is the exact MILP over
    /// all of them: from the heuristic's plan it reaches the proven optimum, and never loses
    /// the plan it started from.
    #[test]
    fn on_one_site_the_search_reaches_the_exact_optimum() {
        let never = || false;
        let mut improved = 0;
        for case in proven_optima_of(0..8, 8, 1, 12) {
            let (seed, best_g) = (case.seed, case.optimum_g);
            let problem = Problem::new(&case.instance);
            let start_g = problem.evaluate(&case.start).objective_g;
            let found = search(&problem, &case.start, 30.0, 1e-7, &never);
            let found_g = problem.evaluate(&found.schedule).objective_g;
            let tolerance = 1e-6 * best_g.max(1.0);
            assert!(
                (found_g - best_g).abs() <= tolerance,
                "seed {seed}: {found_g} vs the optimum {best_g}"
            );
            assert!(found_g <= start_g + tolerance, "seed {seed}");
            assert_eq!(
                found.improvements > 0,
                start_g > best_g + tolerance,
                "seed {seed}"
            );
            improved += found.improvements;
            let check = validate(&case.instance, &problem.to_plan(&found.schedule, &[]));
            assert!(check.valid, "seed {seed}: {:?}", check.violations);
        }
        assert!(improved > 0, "no seed left the heuristic room to improve");
    }

    /// A job that migrates, or one with other jobs at other sites, keeps its runs: only the
    /// site's resident jobs change, and the plan stays valid.
    #[test]
    fn jobs_that_move_stay_as_they_are() {
        let never = || false;
        let mut other_jobs = 0;
        for seed in 0..6 {
            let instance = random_instance(seed, 14, 3, 16);
            let problem = Problem::new(&instance);
            let skip = vec![false; problem.jobs.len()];
            let (start, failed) = heuristic::construct(&problem, &skip, false, &never);
            if !failed.is_empty() {
                continue;
            }
            let resident: Vec<usize> = groups(&problem, &start)
                .into_iter()
                .flat_map(|(_, jobs)| jobs)
                .collect();
            let found = search(&problem, &start, 20.0, 1e-6, &never);
            for job in 0..problem.jobs.len() {
                if !resident.contains(&job) {
                    other_jobs += 1;
                    assert_eq!(found.schedule.runs[job], start.runs[job], "seed {seed}");
                } else {
                    let site = |s: &Schedule| {
                        s.runs[job]
                            .as_ref()
                            .and_then(|r| r.first())
                            .map(|r| problem.pools[r.pool].site)
                    };
                    assert_eq!(site(&found.schedule), site(&start), "seed {seed} job {job}");
                }
            }
            assert!(
                problem.evaluate(&found.schedule).objective_g
                    <= problem.evaluate(&start).objective_g + 1e-6
            );
            let check = validate(&instance, &problem.to_plan(&found.schedule, &[]));
            assert!(check.valid, "seed {seed}: {:?}", check.violations);
        }
        assert!(other_jobs > 0, "no seed had a job that is not resident");
    }
}
