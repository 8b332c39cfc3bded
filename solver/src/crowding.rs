//! A floor on the number of jobs every plan leaves out when the fleet is too busy to serve
//! them all, from the GPU-slots their windows offer.
//!
//! A served job runs at least `ceil(work / most work one slot gives)` whole slots on all of
//! its GPUs (its fastest pool at its fastest level; a move only loses time), inside its window,
//! on the pools it may use; and the slots it holds could do at least its work on each of its
//! GPUs at the pools' most work per slot (whole slots of that pool for a job that stays at a
//! site where it may use one pool). For a span of slots, the jobs whose windows lie inside it
//! can use at most the span's GPU-slots, and the work those could do, of the pools any of them
//! may use, so at most as many of them are served as their least needs fit in each measure,
//! taken smallest first: the rest are left out by every plan. The work measure sees slower
//! GPU models, which give a slot less work than the fastest. Spans that do not overlap hold
//! different jobs and different GPU-slots, so their shortfalls add up; the floor is the
//! largest sum over spans that do not overlap, a dynamic programme over the spans' ends (the
//! spans from a window's start to a window's end, each judged over the jobs inside it). Grid
//! limits, power and the pools' split by site are left out, so the floor is a true one but may
//! lie below the least number any plan leaves out.
//!
//! It must not perform I/O or read the clock, and changes no plan.

use crate::problem::Problem;

/// Most (job, span) pairs the floor scans before it judges spans on a coarser grid of slots
/// (about 0.35 s for 10,000 jobs over 192 slots, judged slot by slot).
const MOST_JOB_SPANS: f64 = 2e8;

/// A job's least use of a span's capacity, in two measures.
#[derive(Clone, Copy)]
struct Need {
    /// GPU-slots: its GPUs times the least whole slots it runs.
    gpu_slots: usize,
    /// GPU-hours of work capacity: what its GPUs could do in the slots it holds, at least its
    /// GPUs times its work (a job held at one pool holds whole slots of that pool).
    work_h: f64,
}

/// The least number of `jobs` that every plan leaves out: the largest sum, over spans of
/// slots that do not overlap, of how many of the jobs whose windows lie inside a span cannot
/// fit its capacity even at their least needs. Jobs without a window or a pool are not
/// counted (the caller reports them as unable to run alone).
pub(crate) fn left_out_floor(problem: &Problem, jobs: &[usize]) -> usize {
    floor_within(problem, jobs, MOST_JOB_SPANS)
}

/// [`left_out_floor`] scanning about `most_job_spans` (job, span) pairs at most.
fn floor_within(problem: &Problem, jobs: &[usize], most_job_spans: f64) -> usize {
    let n_slots = problem.n_slots;
    // Each pool's most work per GPU in one slot, h.
    let pool_work_h: Vec<f64> = (0..problem.pools.len())
        .map(|p| {
            (0..problem.pools[p].throughput.len())
                .map(|level| problem.slot_work_h(p, level))
                .fold(0.0, f64::max)
        })
        .collect();
    // The jobs that count: (window, least needs, pools).
    let mut counted: Vec<(std::ops::Range<usize>, Need, &[usize])> = Vec::new();
    for &job in jobs {
        let view = &problem.jobs[job];
        let most_per_slot_h = view
            .pools
            .iter()
            .map(|&p| pool_work_h[p])
            .fold(0.0, f64::max);
        if view.window.is_empty() || view.window.end > n_slots || most_per_slot_h <= 0.0 {
            continue;
        }
        let gpus = view.gpus as usize;
        let whole_slots = |per_slot_h: f64| (view.work_hours / per_slot_h - 1e-9).ceil().max(0.0);
        // A job that may move, or that may use two pools of one site, can split its work
        // over pools; one that stays at a site with one pool it may use holds whole slots of
        // that pool.
        let site_work_h = |site: usize| {
            let mut at_site = view
                .pools
                .iter()
                .filter(|&&p| problem.pools[p].site == site && pool_work_h[p] > 0.0);
            match (at_site.next(), at_site.next()) {
                (Some(&p), None) => whole_slots(pool_work_h[p]) * pool_work_h[p],
                _ => view.work_hours,
            }
        };
        let work_h = if view.migratable {
            view.work_hours
        } else {
            view.pools
                .iter()
                .filter(|&&p| pool_work_h[p] > 0.0)
                .map(|&p| site_work_h(problem.pools[p].site))
                .fold(f64::INFINITY, f64::min)
        };
        let need = Need {
            gpu_slots: whole_slots(most_per_slot_h) as usize * gpus,
            work_h: gpus as f64 * work_h,
        };
        counted.push((view.window.clone(), need, &view.pools));
    }
    // The jobs in ascending order of each need, so that a span takes its smallest first.
    let mut by_slots: Vec<usize> = (0..counted.len()).collect();
    by_slots.sort_by_key(|&i| counted[i].1.gpu_slots);
    let mut by_work: Vec<usize> = (0..counted.len()).collect();
    by_work.sort_by(|&x, &y| counted[x].1.work_h.total_cmp(&counted[y].1.work_h));
    // shortfall[a][b]: jobs inside [a, b) that its capacity cannot hold.
    // On long horizons with many jobs the spans begin and end on a coarser grid of `step`
    // slots, each window widened to it: a wider span holds the jobs of a narrower one with
    // more capacity, so the floor stays true and its cost stays near MOST_JOB_SPANS scans.
    let spans = (n_slots * n_slots / 2).max(1) as f64;
    let step = ((spans * counted.len() as f64 / most_job_spans)
        .sqrt()
        .ceil() as usize)
        .max(1);
    if step > 1 {
        for (window, _, _) in &mut counted {
            *window = window.start / step * step..(window.end.div_ceil(step) * step).min(n_slots);
        }
    }
    // Only spans that begin where a job's window does and end where one's does are judged: any
    // other holds the same jobs as the narrowest such span inside it, with more capacity.
    let mut starts = vec![false; n_slots + 1];
    for (window, _, _) in &counted {
        starts[window.start] = true;
    }
    let mut shortfall = vec![vec![0usize; n_slots + 1]; n_slots + 1];
    let mut usable = vec![false; problem.pools.len()];
    for (a, row) in shortfall.iter_mut().enumerate() {
        if !starts[a] {
            continue;
        }
        // The jobs that start at a or later, in each order.
        let later = |order: &[usize]| -> Vec<usize> {
            order
                .iter()
                .copied()
                .filter(|&i| counted[i].0.start >= a)
                .collect()
        };
        let (slots_order, work_order) = (later(&by_slots), later(&by_work));
        usable.iter_mut().for_each(|u| *u = false);
        let (mut gpus, mut work_per_slot_h) = (0usize, 0.0);
        let mut ending: Vec<Vec<usize>> = vec![Vec::new(); n_slots + 1];
        for &i in &slots_order {
            ending[counted[i].0.end].push(i);
        }
        let mut inside = 0;
        for b in a + 1..=n_slots {
            for &i in &ending[b] {
                inside += 1;
                for &p in counted[i].2 {
                    if !usable[p] {
                        usable[p] = true;
                        gpus += problem.pools[p].gpus as usize;
                        work_per_slot_h += problem.pools[p].gpus as f64 * pool_work_h[p];
                    }
                }
            }
            if ending[b].is_empty() || inside == 0 {
                continue;
            }
            let span = b - a;
            let inside_by = |i: usize| counted[i].0.end <= b;
            let slot_fit = fits(&slots_order, gpus * span, |i| {
                inside_by(i).then_some(counted[i].1.gpu_slots)
            });
            // Work capacity with a little room for rounding, so that no job that fits is
            // counted out.
            let room_h = work_per_slot_h * span as f64 * (1.0 + 1e-9) + 1e-9;
            let work_fit = fits(&work_order, room_h, |i| {
                inside_by(i).then_some(counted[i].1.work_h)
            });
            row[b] = inside - slot_fit.min(work_fit);
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

/// How many of the jobs of `order` (ascending in their need) that `need` counts (it answers
/// `None` for the others) fit `room`, smallest first.
fn fits<T>(order: &[usize], room: T, need: impl Fn(usize) -> Option<T>) -> usize
where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + Default,
{
    let mut used = T::default();
    let mut fit = 0;
    for next in order.iter().filter_map(|&i| need(i)) {
        let total = used + next;
        if total > room {
            break;
        }
        used = total;
        fit += 1;
    }
    fit
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
        // On a grid coarser than the horizon the one span left holds 7 of the 19 hours' jobs.
        assert_eq!(floor_within(&problem, &all, 1.0), 1);
        let solution = solve(&instance, &SolveOptions::default());
        assert_eq!(solution.metrics.status, "partial");
        assert_eq!(solution.metrics.infeasible_jobs.len(), 2);
        assert_eq!(solution.metrics.left_out_at_least, 2);
    }

    /// An H100 and an A100 (0.6 of its speed) at two sites over 4 one-hour slots, and four
    /// migratable 2-hour jobs: the 8 GPU-slots would hold all four at the H100's pace, but the
    /// slots do 6.4 hours of work, so one job is left out by every plan.
    #[test]
    fn slower_gpus_hold_less_work() {
        let job = |i: usize| {
            serde_json::json!({
                "id": format!("job-{i}"), "gpus": 1, "work_hours": 2.0,
                "release_utc": "2023-06-01T00:00:00Z", "deadline_utc": "2023-06-01T04:00:00Z",
                "checkpoint_gb": 1.0, "migratable": true, "home_site": "site-0"
            })
        };
        let site = |id: &str, model: &str| {
            serde_json::json!({
                "id": id, "gpus": { model: 1 }, "pue": 1.2, "wan_gbps": 10.0,
                "surplus_kw": vec![0.0; 4], "carbon_g_per_kwh": vec![300.0; 4]
            })
        };
        let value = serde_json::json!({
            "start_utc": "2023-06-01T00:00:00Z", "slot_minutes": 60, "slots": 4,
            "gpu_models": {
                "H100": { "power_levels_w": [700], "throughput": [1.0], "speed": 1.0,
                          "idle_w": 50 },
                "A100": { "power_levels_w": [400], "throughput": [1.0], "speed": 0.6,
                          "idle_w": 40 }
            },
            "sites": [site("site-0", "H100"), site("site-1", "A100")],
            "jobs": (0..4).map(job).collect::<Vec<_>>()
        });
        let instance = Instance::from_json(&value.to_string()).expect("a valid instance");
        let problem = Problem::new(&instance);
        assert_eq!(left_out_floor(&problem, &[0, 1, 2, 3]), 1);
        let solution = solve(&instance, &SolveOptions::default());
        assert_eq!(solution.metrics.infeasible_jobs.len(), 1);
        assert_eq!(solution.metrics.left_out_at_least, 1);
    }

    /// On crowded random fleets every plan leaves out at least the floor, which is not always
    /// zero.
    #[test]
    fn no_plan_leaves_out_fewer_jobs_than_the_floor() {
        let mut above_zero = 0;
        for (seed, n_sites, n_jobs) in (0..8).map(|s| (s, 1, 24)).chain((0..8).map(|s| (s, 3, 48)))
        {
            let instance = random_instance(seed, n_jobs, n_sites, 8);
            let problem = Problem::new(&instance);
            let all: Vec<usize> = (0..problem.jobs.len()).collect();
            let floor = left_out_floor(&problem, &all);
            let options = SolveOptions {
                time_limit_s: 2.0,
                ..SolveOptions::default()
            };
            let solution = solve(&instance, &options);
            let left_out = solution.metrics.infeasible_jobs.len();
            assert!(
                floor <= left_out,
                "seed {seed}, {n_sites} site(s): floor {floor}, left out {left_out}"
            );
            assert!(solution.metrics.left_out_at_least >= floor.min(left_out));
            assert!(
                solution.metrics.left_out_at_least <= left_out,
                "seed {seed}"
            );
            above_zero += usize::from(floor > 0);
        }
        assert!(
            above_zero > 4,
            "only {above_zero} seed(s) crowded their fleet"
        );
    }
}
