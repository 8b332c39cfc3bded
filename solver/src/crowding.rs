//! A floor on the number of jobs every plan leaves out when the fleet is too busy to serve
//! them all, from the GPU-slots their windows offer.
//!
//! A served job runs at least `ceil(work / most work one slot gives)` whole slots on all of
//! its GPUs (its fastest pool at its fastest level; a move only loses time), inside its window,
//! on the pools it may use. For a span of slots, the jobs whose windows lie inside it can use
//! at most the span's GPU-slots of the pools any of them may use, so at most as many of them
//! are served as their least needs fit, taken smallest first: the rest are left out by every
//! plan. Spans that do not overlap hold different jobs and different GPU-slots, so their
//! shortfalls add up; the floor is the largest sum over spans that do not overlap, a dynamic
//! programme over the spans' ends (slots squared spans, each judged over the distinct needs).
//! Grid limits, power and the pools' split by site are left out, so the floor is a true one
//! but may lie below the least number any plan leaves out.
//!
//! It must not perform I/O or read the clock, and changes no plan.

use crate::problem::Problem;

/// The least number of `jobs` that every plan leaves out: the largest sum, over spans of
/// slots that do not overlap, of how many of the jobs whose windows lie inside a span cannot
/// fit its GPU-slots even at their least needs. Jobs without a window or a pool are not
/// counted (the caller reports them as unable to run alone).
pub(crate) fn left_out_floor(problem: &Problem, jobs: &[usize]) -> usize {
    let n_slots = problem.n_slots;
    // Per window end, the jobs ending there: (window start, least GPU-slots, job).
    let mut by_end: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n_slots + 1];
    for &job in jobs {
        let view = &problem.jobs[job];
        let most_per_slot_h = view
            .pools
            .iter()
            .flat_map(|&p| (0..problem.pools[p].throughput.len()).map(move |l| (p, l)))
            .map(|(p, level)| problem.slot_work_h(p, level))
            .fold(0.0, f64::max);
        if view.window.is_empty() || view.window.end > n_slots || most_per_slot_h <= 0.0 {
            continue;
        }
        let slots = (view.work_hours / most_per_slot_h - 1e-9).ceil().max(0.0) as usize;
        let need = slots * view.gpus as usize;
        by_end[view.window.end].push((view.window.start, need, job));
    }
    // shortfall[a][b]: jobs inside [a, b) that its GPU-slots cannot hold.
    let mut shortfall = vec![vec![0usize; n_slots + 1]; n_slots + 1];
    let mut usable = vec![false; problem.pools.len()];
    for (a, row) in shortfall.iter_mut().enumerate() {
        // The distinct needs of the jobs inside, ascending, with their counts.
        let mut needs: Vec<(usize, usize)> = Vec::new();
        usable.iter_mut().for_each(|u| *u = false);
        let (mut inside, mut gpus) = (0usize, 0usize);
        for b in a + 1..=n_slots {
            for &(start, need, job) in &by_end[b] {
                if start < a {
                    continue;
                }
                inside += 1;
                match needs.binary_search_by_key(&need, |&(n, _)| n) {
                    Ok(i) => needs[i].1 += 1,
                    Err(i) => needs.insert(i, (need, 1)),
                }
                for &p in &problem.jobs[job].pools {
                    if !usable[p] {
                        usable[p] = true;
                        gpus += problem.pools[p].gpus as usize;
                    }
                }
            }
            if inside == 0 {
                continue;
            }
            let mut room = gpus * (b - a);
            let mut fit = 0;
            for &(need, count) in &needs {
                // A job with no work left needs no GPU-slot.
                let take = room.checked_div(need).map_or(count, |n| count.min(n));
                fit += take;
                room -= take * need;
                if take < count {
                    break;
                }
            }
            row[b] = inside - fit;
        }
    }
    // best[b]: the largest sum of shortfalls over spans that do not overlap, inside [0, b).
    let mut best = vec![0usize; n_slots + 1];
    for b in 1..=n_slots {
        best[b] = (0..b)
            .map(|a| best[a] + shortfall[a][b])
            .fold(best[b - 1], usize::max);
    }
    best[n_slots]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::tests::random_instance;
    use crate::{Instance, SolveOptions, solve};

    /// One site of 2 GPUs over 8 one-hour slots: five 2-hour jobs due within the first 4
    /// slots and three 3-hour jobs released at slot 4. Each half holds 8 GPU-slots, so one
    /// job of each half is left out by every plan, though the whole horizon's 16 GPU-slots
    /// would hold 7 of the 8 jobs' 19 hours.
    fn two_crowded_halves() -> Instance {
        let hour = |h: usize| format!("2023-06-01T{h:02}:00:00Z");
        let job = |i: usize, work: f64, release: usize, deadline: usize| {
            serde_json::json!({
                "id": format!("job-{i}"), "gpus": 1, "work_hours": work,
                "release_utc": hour(release), "deadline_utc": hour(deadline),
                "checkpoint_gb": 10.0, "migratable": false, "home_site": "site-0"
            })
        };
        let jobs: Vec<serde_json::Value> = (0..5)
            .map(|i| job(i, 2.0, 0, 4))
            .chain((5..8).map(|i| job(i, 3.0, 4, 8)))
            .collect();
        let value = serde_json::json!({
            "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 8,
            "gpu_models": {
                "H100": { "power_levels_w": [700, 400], "throughput": [1.0, 0.78],
                          "speed": 1.0, "idle_w": 50 }
            },
            "sites": [{
                "id": "site-0", "gpus": { "H100": 2 }, "pue": 1.2, "wan_gbps": 10.0,
                "surplus_kw": vec![0.0; 8], "carbon_g_per_kwh": vec![300.0; 8]
            }],
            "jobs": jobs
        });
        Instance::from_json(&value.to_string()).expect("a valid instance")
    }

    /// The shortfalls of spans that do not overlap add up, and the floor is what the exact
    /// MILP's proven plan leaves out; `solve` reports it.
    #[test]
    fn spans_that_do_not_overlap_add_their_shortfalls() {
        let instance = two_crowded_halves();
        let problem = Problem::new(&instance);
        let all: Vec<usize> = (0..problem.jobs.len()).collect();
        assert_eq!(left_out_floor(&problem, &all), 2);
        let first_half: Vec<usize> = (0..5).collect();
        assert_eq!(left_out_floor(&problem, &first_half), 1);
        let solution = solve(&instance, &SolveOptions::default());
        assert_eq!(solution.metrics.status, "partial");
        assert_eq!(solution.metrics.infeasible_jobs.len(), 2);
        assert_eq!(solution.metrics.left_out_at_least, 2);
    }

    /// On crowded random fleets every plan leaves out at least the floor, which is not always
    /// zero.
    #[test]
    fn no_plan_leaves_out_fewer_jobs_than_the_floor() {
        let mut above_zero = 0;
        for seed in 0..10 {
            let instance = random_instance(seed, 24, 1, 8);
            let problem = Problem::new(&instance);
            let all: Vec<usize> = (0..problem.jobs.len()).collect();
            let floor = left_out_floor(&problem, &all);
            let options = SolveOptions {
                time_limit_s: 5.0,
                ..SolveOptions::default()
            };
            let solution = solve(&instance, &options);
            let left_out = solution.metrics.infeasible_jobs.len();
            assert!(
                floor <= left_out,
                "seed {seed}: floor {floor}, left out {left_out}"
            );
            assert!(solution.metrics.left_out_at_least >= floor.min(left_out));
            assert!(
                solution.metrics.left_out_at_least <= left_out,
                "seed {seed}"
            );
            above_zero += usize::from(floor > 0);
        }
        assert!(above_zero > 0, "no seed crowded its fleet");
    }
}
