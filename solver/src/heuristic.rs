//! The run-now baseline and the constructive heuristic.
//!
//! The heuristic places jobs in deadline order, each at the single site and in the slots where
//! its marginal grid cost per work hour is lowest given the jobs already placed. It always yields a
//! plan that respects capacity, grid limits, windows and the feasibility domain; it serves as the
//! MILP's starting point and as the answer when the MILP finds nothing better in time.
//! It must not perform I/O or read the clock.

use crate::plan::Infeasible;
use crate::problem::{Problem, Schedule, Slot};

/// Residual state while jobs are placed one by one.
struct Residual {
    /// Load per site and slot, kW.
    load_kw: Vec<Vec<f64>>,
    /// Free GPUs per pool and slot.
    free: Vec<Vec<u32>>,
}

impl Residual {
    fn new(problem: &Problem) -> Residual {
        Residual {
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
        if let Some(limit) = spec.grid_limit_kw
            && after > limit + 1e-9
        {
            return None;
        }
        Some((after - before) * problem.slot_h * problem.grid_cost_g_per_kwh(site, slot))
    }
}

/// Places every job with a non-empty window, in deadline order. Jobs that cannot be placed are
/// returned with the reason.
pub(crate) fn construct(problem: &Problem, skip: &[bool]) -> (Schedule, Vec<(usize, String)>) {
    let mut residual = Residual::new(problem);
    let mut runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    let mut failed = Vec::new();
    let mut order: Vec<usize> = (0..problem.jobs.len()).filter(|&j| !skip[j]).collect();
    order.sort_by_key(|&j| (problem.jobs[j].window.end, problem.jobs[j].window.start, j));
    for job in order {
        match best_single_site(problem, &residual, job) {
            Some(slots) => {
                commit(problem, &mut residual, job, &slots);
                runs[job] = Some(slots);
            }
            None => failed.push((
                job,
                "no GPU capacity or grid headroom left before its deadline once jobs with earlier deadlines are placed".to_string(),
            )),
        }
    }
    (Schedule { runs }, failed)
}

fn commit(problem: &Problem, residual: &mut Residual, job: usize, slots: &[Slot]) {
    let view = &problem.jobs[job];
    for run in slots {
        let site = problem.pools[run.pool].site;
        residual.load_kw[site][run.slot] += problem.run_load_kw(job, run.pool, run.level);
        residual.free[run.pool][run.slot] -= view.gpus;
    }
    if let (Some(current), Some(first)) = (view.current_site, slots.first()) {
        let site = problem.pools[first.pool].site;
        if site != current {
            let kw = problem.transfer_kwh(job) / problem.slot_h;
            residual.load_kw[current][first.slot] += kw;
            residual.load_kw[site][first.slot] += kw;
        }
    }
}

/// The cheapest single-site schedule for a job, or `None`.
fn best_single_site(problem: &Problem, residual: &Residual, job: usize) -> Option<Vec<Slot>> {
    let view = &problem.jobs[job];
    let mut sites: Vec<usize> = view.pools.iter().map(|&p| problem.pools[p].site).collect();
    sites.sort_unstable();
    sites.dedup();
    if let Some(current) = view.current_site
        && !view.migratable
    {
        sites.retain(|&s| s == current);
    }
    let mut best: Option<(f64, Vec<Slot>)> = None;
    for site in sites {
        if let Some((cost, slots)) = schedule_at_site(problem, residual, job, site)
            && best.as_ref().is_none_or(|(c, _)| cost < *c - 1e-9)
        {
            best = Some((cost, slots));
        }
    }
    best.map(|(_, slots)| slots)
}

fn schedule_at_site(
    problem: &Problem,
    residual: &Residual,
    job: usize,
    site: usize,
) -> Option<(f64, Vec<Slot>)> {
    let view = &problem.jobs[job];
    // The cheapest option per slot: (cost per work hour, cost, slot).
    let mut options: Vec<(f64, f64, Slot)> = Vec::new();
    for slot in view.window.clone() {
        let mut best: Option<(f64, f64, Slot)> = None;
        for &pool in view
            .pools
            .iter()
            .filter(|&&p| problem.pools[p].site == site)
        {
            if residual.free[pool][slot] < view.gpus {
                continue;
            }
            for level in 0..problem.pools[pool].levels_w.len() {
                let add_kw = problem.run_load_kw(job, pool, level);
                let Some(cost) = residual.marginal_cost_g(problem, site, slot, add_kw) else {
                    continue;
                };
                let per_work = cost / problem.slot_work_h(pool, level);
                if best.is_none_or(|(b, _, _)| per_work < b - 1e-12) {
                    best = Some((per_work, cost, Slot { slot, pool, level }));
                }
            }
        }
        if let Some(option) = best {
            options.push(option);
        }
    }
    options.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.slot.cmp(&b.2.slot)));
    let migrating_from = view.current_site.filter(|&c| c != site);
    let mut chosen: Vec<Slot> = Vec::new();
    let mut cost = 0.0;
    for (_, slot_cost, slot) in options {
        chosen.push(slot);
        cost += slot_cost;
        chosen.sort();
        if progress_h(problem, job, &chosen, migrating_from) + 1e-9 >= view.work_hours {
            break;
        }
    }
    if progress_h(problem, job, &chosen, migrating_from) + 1e-9 < view.work_hours {
        return None;
    }
    if let Some(from) = migrating_from {
        let first = chosen.first()?;
        let last = chosen.last()?;
        if last.slot - first.slot + 1 < problem.min_window_slots(job, from, site) {
            return None;
        }
        // Transfer energy at both ends must fit under the grid limits.
        let kw = problem.transfer_kwh(job) / problem.slot_h;
        let at_dest = problem.run_load_kw(job, first.pool, first.level) + kw;
        let dest_cost = residual.marginal_cost_g(problem, site, first.slot, at_dest)?;
        let src_cost = residual.marginal_cost_g(problem, from, first.slot, kw)?;
        cost += dest_cost + src_cost + problem.inst.params.migration_penalty_g;
    }
    Some((cost, chosen))
}

/// Work delivered by single-site runs, net of the transfer time after a migration into the site.
fn progress_h(problem: &Problem, job: usize, runs: &[Slot], migrating_from: Option<usize>) -> f64 {
    let lost = |slot: usize| -> f64 {
        let (Some(from), Some(first)) = (migrating_from, runs.first()) else {
            return 0.0;
        };
        let site = problem.pools[first.pool].site;
        let transfer_s = problem.transfer_s(job, from, site);
        let elapsed_s = (slot - first.slot) as f64 * problem.slot_s;
        (transfer_s - elapsed_s).clamp(0.0, problem.slot_s) / 3600.0
    };
    runs.iter()
        .map(|r| {
            let pool = &problem.pools[r.pool];
            (problem.slot_h - lost(r.slot)) * pool.speed * pool.throughput[r.level]
        })
        .sum()
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
