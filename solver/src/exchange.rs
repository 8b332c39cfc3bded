//! Column exchange: groups of jobs whose windows overlap are re-planned together by column
//! generation (the master LP of `master`, every other job held where the plan has it), then by
//! the MILP over the real schedules the master met, started from the plan.
//!
//! Rationale: on large fleets the constructions at the Lagrangian prices place jobs one at a
//! time, and the local search moves a few at a time; when the clean sites are full, which jobs
//! get their GPU-slots is a choice many jobs make together. The master's duals price the
//! group's GPU-slots and power given the rest of the plan, its real schedules offer each job
//! the places worth having, and the restricted MILP picks one per job jointly. A group's answer
//! is kept only when the plan's objective falls, so the step never loses the plan it starts
//! from.
//!
//! It must not perform I/O or read the clock: the caller gives the seconds left to the step
//! and a stop callback.

use crate::heuristic::Prices;
use crate::master::{self, MasterConfig};
use crate::problem::{Problem, Schedule};

/// Most jobs one group holds. Rationale: on the benchmark's 1,000-job size, with real
/// pricing every round, groups of 112 got 2-6 master rounds each in the seconds the bound
/// leaves and 7 of 19 improved the plan; with real pricing once, groups of 50 get 10-40
/// rounds and about half improve it, and groups of 80 ended 0.4-0.7 kg lower than groups of
/// 50 in two runs each (groups of 120 spread wider, 332.9-333.5 kg; docs/benchmarks.md).
const GROUP_JOBS: usize = 80;
/// Most master LP rounds per group.
const MASTER_ROUNDS: usize = 40;
/// Share of a group's seconds the master rounds may take; its restricted MILP gets the rest
/// (on M about 0.2 s a group; with half the seconds for the rounds, 0.15 s for the MILP, one
/// run ended 0.2 kg higher).
const MASTER_SHARE: f64 = 0.3;
/// Least seconds worth giving one group.
const GROUP_LEAST_S: f64 = 0.3;
/// Groups re-planned before the step may judge its yield, and the least share of them that
/// must have lowered the plan for it to go on. Rationale: on the benchmark's 1,000-job size
/// 19-27 of 27-41 groups (44-70 %) improved the plan; on its 10,000-job size, where a group's
/// jobs by window are spread over 50 sites and rarely compete, 7 of 102 and 11 of 45 did, and the
/// local search gains more in those seconds (docs/benchmarks.md).
const YIELD_GROUPS: usize = 8;
const YIELD_LEAST_SHARE: f64 = 1.0 / 3.0;

/// The outcome of [`search`].
pub(crate) struct Exchange {
    pub schedule: Schedule,
    /// Groups whose restricted MILP lowered the objective.
    pub improvements: usize,
    /// Groups re-planned.
    pub groups: usize,
}

/// The served jobs by window (start, then end), in groups of at most `GROUP_JOBS`; the first
/// group holds `offset` jobs fewer, so a second pass with half a group's offset mixes jobs
/// that the first pass kept apart.
fn groups(problem: &Problem, schedule: &Schedule, offset: usize) -> Vec<Vec<usize>> {
    let mut jobs: Vec<usize> = (0..problem.jobs.len())
        .filter(|&j| schedule.runs[j].is_some())
        .collect();
    jobs.sort_by_key(|&j| (problem.jobs[j].window.start, problem.jobs[j].window.end, j));
    let n_groups = jobs.len().div_ceil(GROUP_JOBS).max(1);
    let size = jobs.len().div_ceil(n_groups).max(1);
    let first = size.saturating_sub(offset).max(1).min(jobs.len());
    let mut out = vec![jobs[..first].to_vec()];
    out.extend(jobs[first..].chunks(size).map(<[usize]>::to_vec));
    out.retain(|g| !g.is_empty());
    out
}

/// Re-plans groups of overlapping jobs in turn (a second pass offset by half a group), while
/// `left_s` (the seconds left to the step) has `GROUP_LEAST_S` for another, `stop` answers
/// `false`, and the groups keep paying (after `YIELD_GROUPS`, at least `YIELD_LEAST_SHARE` of
/// them lowered the plan). The master rounds begin at `prices` when given. Every MILP stops
/// at `rel_gap`.
pub(crate) fn search(
    problem: &Problem,
    start: &Schedule,
    prices: Option<&Prices>,
    rel_gap: f64,
    left_s: &dyn Fn() -> f64,
    stop: &dyn Fn() -> bool,
) -> Exchange {
    let mut current = start.clone();
    let mut current_g = problem.evaluate(&current).objective_g;
    let mut passes = vec![groups(problem, &current, 0)];
    passes.push(groups(problem, &current, GROUP_JOBS / 2));
    let total: usize = passes.iter().map(Vec::len).sum();
    let (mut improvements, mut done) = (0, 0);
    'passes: for pass in passes {
        for group in pass {
            let slice_s = (left_s() / (total - done) as f64).max(GROUP_LEAST_S);
            let poor =
                done >= YIELD_GROUPS && (improvements as f64) < YIELD_LEAST_SHARE * done as f64;
            if stop() || poor || left_s() < GROUP_LEAST_S {
                break 'passes;
            }
            done += 1;
            let mut include = vec![false; problem.jobs.len()];
            for &j in &group {
                include[j] = true;
            }
            // Seconds left to the step when this group must be done, and when its rounds must.
            let group_end = left_s() - slice_s;
            let rounds_end = group_end + (1.0 - MASTER_SHARE) * slice_s;
            let rounds_stop = || stop() || left_s() <= rounds_end;
            let config = MasterConfig {
                max_rounds: MASTER_ROUNDS,
                upper_g: current_g,
                rel_gap,
                stop: &rounds_stop,
                log: false,
                hold_rest: true,
                start: prices,
                real_each_round: false,
            };
            let Ok(outcome) = master::solve(problem, &include, &current, &config) else {
                continue;
            };
            let milp_s = (left_s() - group_end).max((1.0 - MASTER_SHARE) * GROUP_LEAST_S);
            let Ok(Some(schedule)) = outcome
                .restricted
                .solve(problem, &current, milp_s, rel_gap, false)
            else {
                continue;
            };
            if problem.adopt_if_lower(&mut current, &mut current_g, &schedule, &group) {
                improvements += 1;
            }
        }
    }
    Exchange {
        schedule: current,
        improvements,
        groups: done,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::heuristic;
    use crate::master::tests::random_instance;
    use crate::validate;

    /// Seconds left to the step, falling by a hundredth at each call: the rounds and groups
    /// end by count, whatever the machine's speed.
    fn countdown(start_s: f64) -> impl Fn() -> f64 {
        let left = Cell::new(start_s);
        move || {
            let now = left.get();
            left.set((now - 0.01).max(0.0));
            now
        }
    }

    /// Groups hold the rest of the plan fixed: every answer stays valid (no pool or power
    /// limit overfilled by a group and the jobs around it), never costs more than the plan it
    /// started from, serves the same jobs, and on some seeds lowers the heuristic's plan.
    #[test]
    fn exchanges_keep_plans_valid_and_lower_some() {
        let never = || false;
        let mut improved = 0;
        for seed in 0..5 {
            let instance = random_instance(seed, 60, 3, 24);
            let problem = Problem::new(&instance);
            let skip = vec![false; problem.jobs.len()];
            let (start, failed) = heuristic::construct(&problem, &skip, false, &never);
            let start_g = problem.evaluate(&start).objective_g;
            let left_s = countdown(3.0);
            let found = search(&problem, &start, None, 1e-6, &left_s, &never);
            let found_g = problem.evaluate(&found.schedule).objective_g;
            assert!(found.groups >= 2, "seed {seed}: {} group(s)", found.groups);
            assert!(found_g <= start_g + 1e-9 * start_g, "seed {seed}");
            assert_eq!(found.improvements > 0, found_g < start_g, "seed {seed}");
            for job in 0..problem.jobs.len() {
                assert_eq!(
                    found.schedule.runs[job].is_some(),
                    start.runs[job].is_some(),
                    "seed {seed} job {job}"
                );
            }
            let unplanned: Vec<_> = failed
                .iter()
                .map(|(j, reason)| crate::Infeasible {
                    job: instance.jobs[*j].id.clone(),
                    reason: reason.clone(),
                })
                .collect();
            let check = validate(&instance, &problem.to_plan(&found.schedule, &unplanned));
            assert!(check.valid, "seed {seed}: {:?}", check.violations);
            improved += found.improvements;
        }
        assert!(improved > 0, "no group lowered any heuristic plan");
    }
}
