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
//! serving the included jobs, for any non-negative prices, converged or not.
//!
//! Without change costs a job's option costs are its GPU count times a per-GPU cost shared by
//! every job with the same pools, so the options that no other beats on work and cost are found
//! once per pool group and slot, and each job's programme runs over those only: the work per
//! iteration follows the jobs' windows (the useful variables), not jobs x sites x slots.
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
    /// The pools of each alternative when the job has change costs and is priced on its own.
    own: Vec<Vec<usize>>,
    /// Units of its work grid ([`Problem::work_grid_units`]).
    units: usize,
}

/// Reusable buffers of the pricing dynamic programme.
#[derive(Default)]
struct Dp {
    cost: Vec<f64>,
    next: Vec<f64>,
    /// Per window slot and state: (previous state, option index + 1; 0 = not run).
    back: Vec<(u16, u16)>,
}

/// The cheapest way, on the job's work grid with every run's work rounded **up**, to finish
/// `work_h` with at most one option per slot, on a grid of `k` units: a lower bound on every real
/// schedule over the same options. Fills `picked` (per window slot) and returns the cost times
/// `scale`.
fn price_job(
    options: &[Vec<Option_>],
    window: std::ops::Range<usize>,
    scale: f64,
    work_h: f64,
    k: usize,
    dp: &mut Dp,
    picked: &mut [Option<Option_>],
) -> Option<f64> {
    let unit_h = work_h / k as f64;
    let n = window.len();
    dp.cost.clear();
    dp.cost.resize(k + 1, f64::INFINITY);
    dp.cost[0] = 0.0;
    dp.back.clear();
    dp.back.resize(n * (k + 1), (0, 0));
    let mut reach = 0; // highest state reached so far
    for (i, t) in window.clone().enumerate() {
        dp.next.clone_from(&dp.cost);
        let back = &mut dp.back[i * (k + 1)..(i + 1) * (k + 1)];
        for (u, b) in back.iter_mut().enumerate() {
            *b = (u as u16, 0);
        }
        let mut new_reach = reach;
        for (o, opt) in options[t].iter().enumerate() {
            let units = ((opt.work_h / unit_h - 1e-9).ceil().max(0.0) as usize).min(k);
            let c = opt.cost_g * scale;
            for u in 0..=reach {
                let base = dp.cost[u];
                if !base.is_finite() {
                    continue;
                }
                let v = (u + units).min(k);
                if base + c < dp.next[v] - 1e-12 {
                    dp.next[v] = base + c;
                    back[v] = (u as u16, o as u16 + 1);
                    new_reach = new_reach.max(v);
                }
            }
        }
        reach = new_reach;
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
    let h = problem.slot_h;
    // Per pool and level: kW per GPU and work per slot.
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
    // Row bounds and grid draw per site and slot.
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
        let site_sets: Vec<Vec<usize>> = if view.migratable || sites.len() <= 1 {
            vec![sites]
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
        if !problem.previous[job].is_empty() {
            jobs.push(JobPricing {
                job,
                groups: Vec::new(),
                own: pool_sets,
                units: problem.work_grid_units(job),
            });
            continue;
        }
        let job_groups = pool_sets
            .into_iter()
            .map(|pools| {
                let next = groups.len();
                let group = *group_ids.entry(pools.clone()).or_insert(next);
                if group == next {
                    groups.push(GroupOptions {
                        pools,
                        options: vec![Vec::new(); n_slots],
                    });
                }
                group
            })
            .collect();
        jobs.push(JobPricing {
            job,
            groups: job_groups,
            own: Vec::new(),
            units: problem.work_grid_units(job),
        });
    }
    // Slots each group is needed in.
    let mut group_slots = vec![vec![false; n_slots]; groups.len()];
    for jp in &jobs {
        for &g in &jp.groups {
            for t in problem.jobs[jp.job].window.clone() {
                group_slots[g][t] = true;
            }
        }
    }

    // Starting prices: grid cost where the start plan draws from the grid, nothing elsewhere.
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
    let mut mu = vec![vec![0.0; n_slots]; n_pools];
    let mut lambda: Vec<Vec<f64>> = if let Some(start) = config.start {
        mu.clone_from(&start.gpu);
        start.kw.clone()
    } else {
        (0..n_sites)
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
            .collect()
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
    let mut relaxed_runs: Vec<Option<Vec<Slot>>> = vec![None; problem.jobs.len()];
    let mut scale = config.start_scale;
    let mut since_better = 0;
    let mut points: Vec<Option_> = Vec::new();
    let mut own_options: Vec<Vec<Option_>> = vec![Vec::new(); n_slots];
    let mut gpu_use = vec![vec![0.0; n_slots]; n_pools];
    let mut kw_use = vec![vec![0.0; n_slots]; n_sites];
    let mut dp = Dp::default();
    let mut grad_mu = vec![vec![0.0; n_slots]; n_pools];
    let mut grad_lambda = vec![vec![0.0; n_slots]; n_sites];
    let mut dir_mu = vec![vec![0.0; n_slots]; n_pools];
    let mut dir_lambda = vec![vec![0.0; n_slots]; n_sites];
    let mut picked: Vec<Option<Option_>> = Vec::new();
    let mut best_picked: Vec<Option<Option_>> = Vec::new();

    // The options of a pool set in one slot: per GPU (`gpus` = 1) or for a whole job.
    let options_at = |pools: &[usize],
                      slot: usize,
                      mu: &[Vec<f64>],
                      lambda: &[Vec<f64>],
                      job: Option<usize>,
                      points: &mut Vec<Option_>| {
        points.clear();
        let gpus = job.map_or(1.0, |j| f64::from(problem.jobs[j].gpus));
        for &pool in pools {
            let site = problem.pools[pool].site;
            for level in 0..pool_kw[pool].len() {
                points.push(Option_ {
                    work_h: pool_work[pool][level],
                    cost_g: gpus * (mu[pool][slot] + pool_kw[pool][level] * lambda[site][slot])
                        + job.map_or(0.0, |j| problem.change_g(j, slot, pool, level)),
                    pool,
                    level,
                });
            }
        }
    };

    while best.iterations < config.max_iterations.max(1) {
        if best.iterations > 0 && (config.stop)() {
            break;
        }
        best.iterations += 1;
        for (g, group) in groups.iter_mut().enumerate() {
            for t in 0..n_slots {
                if group_slots[g][t] {
                    options_at(&group.pools, t, &mu, &lambda, None, &mut points);
                    pareto(&mut points, &mut group.options[t]);
                }
            }
        }
        for row in gpu_use.iter_mut().chain(kw_use.iter_mut()) {
            row.iter_mut().for_each(|v| *v = 0.0);
        }
        let mut value = problem.change_constant_g();
        let mut feasible = true;
        for jp in &jobs {
            let view = &problem.jobs[jp.job];
            let gpus = f64::from(view.gpus);
            let window = view.window.clone();
            picked.clear();
            picked.resize(window.len(), None);
            best_picked.clear();
            best_picked.resize(window.len(), None);
            let mut best_value: Option<f64> = None;
            for a in 0..jp.groups.len().max(jp.own.len()) {
                let (options, scale_cost): (&[Vec<Option_>], f64) = if jp.own.is_empty() {
                    (&groups[jp.groups[a]].options, gpus)
                } else {
                    for t in window.clone() {
                        options_at(&jp.own[a], t, &mu, &lambda, Some(jp.job), &mut points);
                        pareto(&mut points, &mut own_options[t]);
                    }
                    (&own_options, 1.0)
                };
                let v = if view.work_hours <= 1e-9 {
                    // Nothing to do: only slots that pay (a kept previous run) are taken.
                    let mut v = 0.0;
                    for (i, t) in window.clone().enumerate() {
                        picked[i] = options[t].first().copied().filter(|o| o.cost_g < 0.0);
                        v += picked[i].map_or(0.0, |o| o.cost_g * scale_cost);
                    }
                    Some(v)
                } else {
                    price_job(
                        options,
                        window.clone(),
                        scale_cost,
                        view.work_hours,
                        jp.units,
                        &mut dp,
                        &mut picked,
                    )
                };
                if let Some(v) = v
                    && best_value.is_none_or(|b| v < b - 1e-12)
                {
                    best_value = Some(v);
                    best_picked.clone_from(&picked);
                }
            }
            let Some(v) = best_value else {
                feasible = false;
                continue;
            };
            value += v;
            let runs = relaxed_runs[jp.job].get_or_insert_with(Vec::new);
            runs.clear();
            for (i, t) in window.clone().enumerate() {
                if let Some(o) = best_picked[i] {
                    runs.push(Slot {
                        slot: t,
                        pool: o.pool,
                        level: o.level,
                    });
                    let site = problem.pools[o.pool].site;
                    gpu_use[o.pool][t] += gpus;
                    kw_use[site][t] += gpus * pool_kw[o.pool][o.level];
                }
            }
        }
        if !feasible {
            best.bound_g = None;
            break;
        }
        // Capacity and power rows, and the grid draw's own minimum.
        let mut norm2 = 0.0;
        for p in 0..n_pools {
            let cap = f64::from(problem.pools[p].gpus);
            for t in 0..n_slots {
                value -= mu[p][t] * cap;
                let g = gpu_use[p][t] - cap;
                let g = if mu[p][t] <= 0.0 { g.max(0.0) } else { g };
                grad_mu[p][t] = g;
                norm2 += g * g;
            }
        }
        for s in 0..n_sites {
            for t in 0..n_slots {
                let (l, cost, limit) = (lambda[s][t], grid_g_per_kw[s][t], grid_limit_kw[s][t]);
                value -= l * upper_kw[s][t];
                let net = cost - l;
                let need = kw_use[s][t] - upper_kw[s][t];
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
                grad_lambda[s][t] = g;
                norm2 += g * g;
            }
        }
        if best
            .bound_g
            .is_none_or(|b| value > b + 1e-9 * b.abs().max(1.0))
        {
            best.bound_g = Some(value);
            best.gpu_price.clone_from(&mu);
            best.kw_price.clone_from(&lambda);
            best.relaxed.runs.clone_from(&relaxed_runs);
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
                if grid_limit_kw[s][t].is_infinite() {
                    l = l.min(grid_g_per_kw[s][t]);
                }
                lambda[s][t] = l;
            }
        }
    }
    best.scale = scale;
    best
}
