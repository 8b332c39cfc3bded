//! Lower bounds from groups of jobs solved exactly on their own.
//!
//! A plan's objective is the all-idle floor (every GPU idle, every slot) plus what its jobs add
//! to it. Where each site and slot's grid cost is convex and non-decreasing in its load (no
//! negative grid weight), every run only adds load (no power level below idle), and each job's
//! own terms are non-negative (no negative migration penalty, no previous plan whose change
//! penalty a run could take back), what the jobs add is superadditive over disjoint groups of
//! them: the load of one group can only raise the cost of another's. So the floor plus, for a
//! partition of the served jobs, the sum of each group's least addition when it is planned alone
//! bounds every plan serving them all. Each group's least addition is its exact MILP's dual bound
//! less the floor; unlike the LP and Lagrangian bounds it sees integrality: whole slots, the
//! power levels' lattice, and the surplus a job cannot use in part.
//!
//! Owns the choice of groups (one around the slots where a plan draws grid at a site that has
//! surplus, every other job alone) and their MILPs. It must not perform I/O or read the clock:
//! its time comes from the caller as the seconds left and as HiGHS time limits.

use crate::milp;
use crate::problem::{Problem, Schedule};

/// Share of the plan's grid draw above the floor at sites with surplus whose slots set the
/// group's span: the costliest such slots up to this share.
const HOT_SHARE: f64 = 0.9;
/// A job joins the group when its window meets the span and its slack there (slots of its
/// window beyond those its work needs on the fastest GPUs of the span's sites) is at most this
/// many times the span's length: jobs with more can leave the span to the others.
const SPAN_SLACK: f64 = 2.0;
/// Most jobs in the group, the tightest first: its MILP must close within seconds.
const GROUP_MOST_JOBS: usize = 16;
/// Slots between two of the plan's costly slots beyond which they fall in different clusters.
const CLUSTER_GAP: usize = 3;
/// Fewest jobs in the group: one job alone is solved alone anyway.
const GROUP_LEAST_JOBS: usize = 2;
/// Share of the seconds left that a group's MILP may take; the jobs alone get the rest.
/// Rationale: jobs alone rarely add (in `solve -v` on S and five other draws none did), and
/// on S the group's MILP reached 8.7 g under a 4 s limit with this share, 7.9 g with 0.6.
const GROUP_SHARE: f64 = 0.9;
/// Most seconds for one job's MILP alone: a model of one job's runs, far smaller than a group's.
const SINGLE_MOST_S: f64 = 0.25;
/// Seconds below which no MILP is started.
const LEAST_S: f64 = 0.05;
/// Seconds below which no group's MILP is started. Rationale: building a group's model and
/// HiGHS's presolve take time its limit does not count; on S a second cluster's 11 jobs,
/// started with a 0.11-0.12 s limit, ended past the margin and the solve at 5.04-5.07 s of 5.
const GROUP_LEAST_S: f64 = 0.25;
/// Relative gap at which the MILPs stop: their bounds are compared in grams against plans of
/// kilograms.
const MILP_REL_GAP: f64 = 1e-7;

/// What the groups gave.
#[derive(Clone, Debug)]
pub(crate) struct GroupBound {
    /// A lower bound on every plan serving the jobs it covered, g.
    pub bound_g: f64,
    /// The all-idle floor, g.
    pub floor_g: f64,
    /// Jobs planned together in the group (0 when none was formed or its MILP gave no bound).
    pub group_jobs: usize,
    /// The group's least addition to the floor, g.
    pub group_excess_g: f64,
    /// Jobs solved alone, and how many of them add to the floor whatever their plan.
    pub singles_solved: usize,
    pub singles_lifting: usize,
}

/// The bound of the module doc over the jobs with `served[j]`, with the group chosen around
/// `plan`'s grid draw at sites with surplus. `left_s` answers the seconds left of the caller's
/// budget (infinite without one, when the MILPs' limits add up to `unbudgeted_s` at most, half
/// for the groups and half for the jobs alone);
/// once `cancelled` answers `true` no further MILP starts. The caller must have
/// checked that serving the jobs can only add to the objective. `None` when no MILP gave a
/// bound.
pub(crate) fn group_bound(
    problem: &Problem,
    served: &[bool],
    plan: &Schedule,
    left_s: &dyn Fn() -> f64,
    unbudgeted_s: f64,
    cancelled: &dyn Fn() -> bool,
    log: bool,
) -> Option<GroupBound> {
    let n_jobs = problem.jobs.len();
    let floor_g = problem
        .evaluate(&Schedule {
            runs: vec![None; n_jobs],
        })
        .objective_g;
    let config = |time_limit_s: f64| milp::MilpConfig {
        budget: None,
        time_limit_s,
        mip_rel_gap: MILP_REL_GAP,
        relax: false,
        soft_work: false,
        log,
    };
    // A group's least addition to the floor, when its MILP gives a bound in `limit_s`, and
    // whether the MILP proved it.
    let excess = |jobs: &[usize], limit_s: f64| -> Option<(f64, bool)> {
        let mut include = vec![false; n_jobs];
        for &j in jobs {
            include[j] = true;
        }
        let outcome = milp::solve(problem, &include, Some(plan), None, &config(limit_s)).ok()?;
        let bound_g = outcome.lower_bound_g?;
        Some(((bound_g - floor_g).max(0.0), outcome.proven_optimal))
    };
    // Without a budget, the time limits handed out count against `unbudgeted_s`, half of it for
    // the groups and half for the jobs alone (no clock here says how much of a limit a MILP
    // used, so a group that closes early must not starve the jobs alone).
    let group_pot_s = std::cell::Cell::new(unbudgeted_s / 2.0);
    let single_pot_s = std::cell::Cell::new(unbudgeted_s / 2.0);
    let budget_s = |share: f64, most_s: f64, pot_s: &std::cell::Cell<f64>| {
        if cancelled() {
            return 0.0;
        }
        let left = left_s();
        let left = if left.is_finite() { left } else { pot_s.get() };
        let limit_s = (left * share).min(most_s).max(0.0);
        pot_s.set(pot_s.get() - limit_s);
        limit_s
    };

    // Around each cluster of the plan's grid draw at sites with surplus, the costliest first:
    // the jobs with little slack there, the span widened a slot each side while the group's
    // MILP closes with nothing added (a wider group holds the narrower one until the cap on
    // its jobs cuts, so it adds at least as much), until it adds something, runs out of time
    // or reaches its most jobs.
    let mut in_group = vec![false; n_jobs];
    let (mut group_jobs, mut group_excess_g) = (0, 0.0);
    for cluster in hot_clusters(problem, plan) {
        let eligible: Vec<bool> = (0..n_jobs).map(|j| served[j] && !in_group[j]).collect();
        let mut tried: Vec<usize> = Vec::new();
        for widen in 0..problem.n_slots {
            let first = cluster.first.saturating_sub(widen);
            let last = (cluster.last + widen).min(problem.n_slots - 1);
            let (group, full) = span_group(problem, &eligible, &cluster.sites, first, last);
            if group.len() < GROUP_LEAST_JOBS || group == tried {
                if full || (first == 0 && last == problem.n_slots - 1) {
                    break;
                }
                continue;
            }
            let limit_s = budget_s(GROUP_SHARE, f64::INFINITY, &group_pot_s);
            if limit_s < GROUP_LEAST_S {
                break;
            }
            let Some((excess_g, closed)) = excess(&group, limit_s) else {
                break;
            };
            tried = group;
            if excess_g > 0.0 || !closed || full {
                if excess_g > 0.0 {
                    group_jobs += tried.len();
                    group_excess_g += excess_g;
                    for &j in &tried {
                        in_group[j] = true;
                    }
                }
                break;
            }
        }
    }
    // Every other served job alone, while time is left; a job not solved adds nothing.
    let (mut singles_solved, mut singles_lifting, mut singles_g) = (0, 0, 0.0);
    for job in (0..n_jobs).filter(|&j| served[j] && !in_group[j]) {
        let limit_s = budget_s(1.0, SINGLE_MOST_S, &single_pot_s);
        if limit_s < LEAST_S {
            break;
        }
        if let Some((excess_g, _)) = excess(&[job], limit_s) {
            singles_solved += 1;
            if excess_g > 0.0 {
                singles_lifting += 1;
                singles_g += excess_g;
            }
        }
    }
    (group_jobs > 0 || singles_solved > 0).then_some(GroupBound {
        bound_g: floor_g + group_excess_g + singles_g,
        floor_g,
        group_jobs,
        group_excess_g,
        singles_solved,
        singles_lifting,
    })
}

/// Slots of a plan's grid draw at sites with surplus that lie close together.
struct Cluster {
    first: usize,
    last: usize,
    /// Per site, whether the cluster draws grid there.
    sites: Vec<bool>,
}

/// The clusters of the slots where `plan` draws grid at a site whose surplus exceeds its idle
/// load, over the costliest such slots up to `HOT_SHARE` of their grams; slots more than
/// `CLUSTER_GAP` apart fall in different clusters. Costliest cluster first.
fn hot_clusters(problem: &Problem, plan: &Schedule) -> Vec<Cluster> {
    let n_sites = problem.inst.sites.len();
    let mut load_kw: Vec<Vec<f64>> = (0..n_sites)
        .map(|s| vec![problem.idle_load_kw[s]; problem.n_slots])
        .collect();
    for (job, runs) in plan.runs.iter().enumerate() {
        if let Some(runs) = runs {
            for ((site, slot), kw) in problem.added_load_kw(job, runs) {
                load_kw[site][slot] += kw;
            }
        }
    }
    // (grid draw, g; slot; site) where the site had surplus beyond its idle load: there the
    // floor draws none.
    let mut hot: Vec<(f64, usize, usize)> = Vec::new();
    for (site, loads) in load_kw.iter().enumerate() {
        let surplus = &problem.inst.sites[site].surplus_kw;
        let idle = problem.idle_load_kw[site];
        for (slot, &load) in loads.iter().enumerate() {
            if surplus[slot] <= idle {
                continue;
            }
            let over_kw = (load - surplus[slot]).max(0.0);
            let g = over_kw * problem.slot_h * problem.grid_cost_g_per_kwh(site, slot);
            if g > 0.0 {
                hot.push((g, slot, site));
            }
        }
    }
    hot.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let total_g: f64 = hot.iter().map(|h| h.0).sum();
    let mut taken_g = 0.0;
    let mut kept = 0;
    while kept < hot.len() && taken_g < HOT_SHARE * total_g {
        taken_g += hot[kept].0;
        kept += 1;
    }
    hot.truncate(kept);
    hot.sort_by_key(|h| (h.1, h.2));
    let mut clusters: Vec<(f64, Cluster)> = Vec::new();
    for (g, slot, site) in hot {
        match clusters.last_mut() {
            Some((grams, c)) if slot <= c.last + CLUSTER_GAP => {
                *grams += g;
                c.last = slot;
                c.sites[site] = true;
            }
            _ => {
                let mut sites = vec![false; n_sites];
                sites[site] = true;
                let cluster = Cluster {
                    first: slot,
                    last: slot,
                    sites,
                };
                clusters.push((g, cluster));
            }
        }
    }
    clusters.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.first.cmp(&b.1.first)));
    clusters.into_iter().map(|(_, c)| c).collect()
}

/// The jobs with `eligible[j]` planned together for the span `first..=last` at the sites with
/// `sites[s]`: those whose windows meet the span and whose slack there (slots of the window
/// beyond those the work needs on the fastest of those sites' GPUs) is at most `SPAN_SLACK`
/// times the span's length, the tightest `GROUP_MOST_JOBS`; and whether that cap cut some.
fn span_group(
    problem: &Problem,
    eligible: &[bool],
    sites: &[bool],
    first: usize,
    last: usize,
) -> (Vec<usize>, bool) {
    let span_slots = (last - first + 1) as f64;
    let mut candidates: Vec<(f64, usize)> = (0..problem.jobs.len())
        .filter(|&j| eligible[j])
        .filter_map(|j| {
            let view = &problem.jobs[j];
            if view.window.end <= first || view.window.start > last {
                return None;
            }
            // The most work one slot gives at one of the sites.
            let fastest_h = view
                .pools
                .iter()
                .filter(|&&p| sites[problem.pools[p].site])
                .flat_map(|&p| {
                    (0..problem.pools[p].levels_w.len()).map(move |k| problem.slot_work_h(p, k))
                })
                .fold(0.0, f64::max);
            if fastest_h <= 0.0 {
                return None;
            }
            let slack = view.window.len() as f64 - view.work_hours / fastest_h;
            (slack <= SPAN_SLACK * span_slots).then_some((slack, j))
        })
        .collect();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let full = candidates.len() > GROUP_MOST_JOBS;
    candidates.truncate(GROUP_MOST_JOBS);
    let mut group: Vec<usize> = candidates.into_iter().map(|(_, j)| j).collect();
    group.sort_unstable();
    (group, full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::Instance;
    use crate::master::tests::{ProvenOptimum, proven_optima};
    use crate::problem::Slot;

    /// One site of three H100s (a run at 400 W adds 350 W to idle), 100 g/kWh, hourly slots.
    /// Jobs a, b and c each need half a slot's work in slot 0 or 1, where the surplus leaves
    /// 0.5 kW above idle: one run fits in a slot, two do not, so some slot draws 0.2 kW from the
    /// grid. Job d must run in slot 6, where 0.2 kW is left: alone it draws 0.15 kW. The LP
    /// relaxation, lattice cuts and all, sees only part of that.
    fn crowded_slots() -> Instance {
        let hour = |h: usize| format!("2023-06-01T{h:02}:00:00Z");
        let mut surplus = vec![0.0; 8];
        surplus[0] = 0.15 + 0.5;
        surplus[1] = 0.15 + 0.5;
        surplus[6] = 0.15 + 0.2;
        let job = |id: &str, first: usize, last: usize| {
            serde_json::json!({
                "id": id, "gpus": 1, "work_hours": 0.5,
                "release_utc": hour(first), "deadline_utc": hour(last + 1),
                "checkpoint_gb": 1.0, "save_s": 0, "restore_s": 0, "migratable": false,
                "home_site": "a"
            })
        };
        let value = serde_json::json!({
            "start_utc": hour(0), "slot_minutes": 60, "slots": 8,
            "gpu_models": { "H100": { "power_levels_w": [700, 550, 400],
                                       "throughput": [1.0, 0.92, 0.78],
                                       "speed": 1.0, "idle_w": 50 } },
            "sites": [{ "id": "a", "gpus": { "H100": 3 }, "pue": 1.0, "wan_gbps": 10.0,
                        "surplus_kw": surplus, "carbon_g_per_kwh": vec![100.0; 8] }],
            "jobs": [job("a", 0, 1), job("b", 0, 1), job("c", 0, 1), job("d", 6, 6)],
            "params": {}
        });
        Instance::from_json(&value.to_string()).expect("a valid instance")
    }

    #[test]
    fn jobs_that_crowd_a_surplus_are_bounded_by_their_optimum_where_the_lp_is_not() {
        let instance = crowded_slots();
        let problem = Problem::new(&instance);
        let run = |slot| {
            Some(vec![Slot {
                slot,
                pool: 0,
                level: 2,
            }])
        };
        let plan = Schedule {
            runs: vec![run(0), run(0), run(1), run(6)],
        };
        // Idle 0.15 kW in the five slots without surplus; 0.2 and 0.15 kW over the surplus in
        // slots 0 and 6.
        let optimum_g = 5.0 * 15.0 + 20.0 + 15.0;
        assert!((problem.evaluate(&plan).objective_g - optimum_g).abs() < 1e-6);
        let served = vec![true; 4];
        let never = || false;
        let unbounded = || f64::INFINITY;
        let group = group_bound(&problem, &served, &plan, &unbounded, 10.0, &never, false)
            .expect("a bound");
        // a, b and c together (slot 0 is the costliest), d alone: their additions sum.
        assert_eq!(group.group_jobs, 3, "{group:?}");
        assert_eq!(
            (group.singles_solved, group.singles_lifting),
            (1, 1),
            "{group:?}"
        );
        assert!((group.floor_g - 75.0).abs() < 1e-6, "{group:?}");
        assert!((group.bound_g - optimum_g).abs() < 1e-3, "{group:?}");
        let relax = milp::MilpConfig {
            budget: None,
            time_limit_s: 10.0,
            mip_rel_gap: 1e-9,
            relax: true,
            soft_work: false,
            log: false,
        };
        let lp = milp::solve(&problem, &served, None, None, &relax).expect("the LP runs");
        let lp_g = lp.lower_bound_g.expect("an LP value");
        assert!(lp_g < optimum_g - 10.0, "LP {lp_g} g");
        // Once cancelled, no MILP starts and nothing is claimed.
        let cancelled = || true;
        let none = group_bound(
            &problem, &served, &plan, &unbounded, 10.0, &cancelled, false,
        );
        assert!(none.is_none(), "{none:?}");
    }

    #[test]
    fn group_bounds_stay_below_exact_optima() {
        let never = || false;
        let (mut compared, mut grouped, mut lifted) = (0, 0, 0);
        for case in proven_optima(0..12) {
            let ProvenOptimum {
                seed,
                instance,
                start,
                optimum_g,
                ..
            } = case;
            let problem = Problem::new(&instance);
            let served = vec![true; problem.jobs.len()];
            let jobs: Vec<usize> = (0..problem.jobs.len()).collect();
            if !crate::serving_only_adds(&problem, &jobs) {
                continue;
            }
            let group = group_bound(
                &problem,
                &served,
                &start,
                &|| f64::INFINITY,
                20.0,
                &never,
                false,
            )
            .expect("every job alone gives a bound");
            let tolerance = 1e-6 * optimum_g.max(1.0);
            assert!(
                group.bound_g <= optimum_g + tolerance,
                "seed {seed}: bound {} above the optimum {optimum_g} ({group:?})",
                group.bound_g
            );
            compared += 1;
            grouped += usize::from(group.group_jobs > 0);
            lifted += usize::from(group.singles_lifting > 0);
        }
        // The comparisons cover both parts: groups planned together and jobs alone that add.
        assert!(compared >= 10, "only {compared} instances compared");
        assert!(
            grouped >= 1 && lifted >= 1,
            "{grouped} grouped, {lifted} lifted"
        );
    }
}
