//! The solver's indexed view of an instance, its internal schedule type and the accounting rules
//! of formats.md applied to that schedule.
//!
//! Owns slot windows, GPU pools (site x model), transfer times and the evaluation of a schedule
//! (progress, loads, emissions, migrations). The validator re-derives all of this independently;
//! nothing here may be used by `validate`.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::instance::Instance;
use crate::plan::{Assignment, Infeasible, Migration, Plan};

/// GPUs of one model at one site.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    pub site: usize,
    pub model: String,
    pub gpus: u32,
    pub speed: f64,
    pub levels_w: Vec<f64>,
    pub throughput: Vec<f64>,
    pub idle_w: f64,
}

/// A job as the solver sees it.
#[derive(Clone, Debug)]
pub(crate) struct JobView {
    /// Slots lying wholly inside `[release, deadline)` and inside the horizon.
    pub window: Range<usize>,
    /// Pools with an allowed model and enough GPUs for the gang.
    pub pools: Vec<usize>,
    pub current_site: Option<usize>,
    pub home_site: usize,
    pub gpus: u32,
    /// Work that must be done inside the horizon (see [`required_work_h`]).
    pub work_hours: f64,
    pub migratable: bool,
}

pub(crate) struct Problem<'a> {
    pub inst: &'a Instance,
    pub slot_h: f64,
    pub slot_s: f64,
    pub n_slots: usize,
    pub pools: Vec<Pool>,
    pub jobs: Vec<JobView>,
    /// Load of a site with every GPU idle, kW.
    pub idle_load_kw: Vec<f64>,
    /// Per job, the previous plan's runs: slot -> (pool, level).
    pub previous: Vec<BTreeMap<usize, (usize, usize)>>,
    link_gbps: Vec<Vec<f64>>,
}

/// One slot of one job: where and how hard it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Slot {
    pub slot: usize,
    pub pool: usize,
    pub level: usize,
}

/// The solver's plan: per job, its run slots in ascending order; `None` = unplanned.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Schedule {
    pub runs: Vec<Option<Vec<Slot>>>,
}

/// Energy and emissions of a schedule under the accounting rules.
#[derive(Clone, Debug)]
pub(crate) struct Evaluation {
    pub emissions_g: f64,
    pub objective_g: f64,
    pub grid_energy_kwh: f64,
    pub surplus_used_kwh: f64,
    pub migrations: Vec<Migration>,
}

impl<'a> Problem<'a> {
    pub fn new(inst: &'a Instance) -> Problem<'a> {
        let slot_s = f64::from(inst.slot_minutes) * 60.0;
        let mut pools = Vec::new();
        let mut idle_load_kw = Vec::with_capacity(inst.sites.len());
        for (site_idx, site) in inst.sites.iter().enumerate() {
            let mut idle_w = 0.0;
            for (model, &gpus) in &site.gpus {
                let spec = &inst.gpu_models[model];
                idle_w += f64::from(gpus) * spec.idle_w;
                if gpus == 0 {
                    continue;
                }
                pools.push(Pool {
                    site: site_idx,
                    model: model.clone(),
                    gpus,
                    speed: spec.speed,
                    levels_w: spec.power_levels_w.clone(),
                    throughput: spec.throughput.clone(),
                    idle_w: spec.idle_w,
                });
            }
            idle_load_kw.push(site.pue * idle_w / 1000.0);
        }
        let site_index = |id: &str| inst.sites.iter().position(|s| s.id == id);
        let n_sites = inst.sites.len();
        let mut link_gbps = vec![vec![f64::INFINITY; n_sites]; n_sites];
        for a in 0..n_sites {
            for b in 0..n_sites {
                link_gbps[a][b] = inst.sites[a].wan_gbps.min(inst.sites[b].wan_gbps);
            }
        }
        // A one-way override applies both ways unless the reverse is also given.
        for (from, row) in &inst.links_gbps {
            for (to, &gbps) in row {
                if let (Some(a), Some(b)) = (site_index(from), site_index(to)) {
                    link_gbps[a][b] = gbps;
                    let reverse_given = inst
                        .links_gbps
                        .get(to)
                        .is_some_and(|r| r.contains_key(from));
                    if !reverse_given {
                        link_gbps[b][a] = gbps;
                    }
                }
            }
        }
        let start = inst.start_utc.0;
        let horizon_end = start + chrono::Duration::seconds((slot_s * inst.slots as f64) as i64);
        let jobs = inst
            .jobs
            .iter()
            .map(|job| {
                let from_start_s =
                    |t: chrono::DateTime<chrono::Utc>| (t - start).num_seconds() as f64;
                let first = (from_start_s(job.release_utc.0) / slot_s).ceil().max(0.0) as usize;
                let end = (from_start_s(job.deadline_utc.0) / slot_s).floor();
                let end = if end < 0.0 {
                    0
                } else {
                    (end as usize).min(inst.slots)
                };
                let window = first.min(end)..end;
                let allowed =
                    |m: &str| job.gpu_models.is_empty() || job.gpu_models.iter().any(|x| x == m);
                let job_pools = pools
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| allowed(&p.model) && p.gpus >= job.gpus)
                    .map(|(i, _)| i)
                    .collect();
                JobView {
                    window,
                    pools: job_pools,
                    current_site: job.current_site.as_deref().and_then(site_index),
                    home_site: site_index(&job.home_site).expect("instance checked"),
                    gpus: job.gpus,
                    work_hours: required_work_h(job, start, horizon_end),
                    migratable: job.migratable,
                }
            })
            .collect();
        let mut previous: Vec<BTreeMap<usize, (usize, usize)>> =
            vec![BTreeMap::new(); inst.jobs.len()];
        let job_index: BTreeMap<&str, usize> = inst
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| (job.id.as_str(), j))
            .collect();
        for a in &inst.previous_assignments {
            let Some(&job) = job_index.get(a.job.as_str()) else {
                continue;
            };
            let Some(site) = site_index(&a.site) else {
                continue;
            };
            let found = pools.iter().enumerate().find_map(|(i, p)| {
                let model_ok = a.gpu_model.as_ref().is_none_or(|m| *m == p.model);
                let level = p
                    .levels_w
                    .iter()
                    .position(|&w| (w - a.power_w).abs() < 1e-6);
                (p.site == site && model_ok)
                    .then_some(level)
                    .flatten()
                    .map(|l| (i, l))
            });
            if let Some(run) = found
                && a.slot < inst.slots
            {
                previous[job].insert(a.slot, run);
            }
        }
        Problem {
            inst,
            previous,
            slot_h: slot_s / 3600.0,
            slot_s,
            n_slots: inst.slots,
            pools,
            jobs,
            idle_load_kw,
            link_gbps,
        }
    }

    /// save + 8 x checkpoint / link + restore, seconds.
    pub fn transfer_s(&self, job: usize, from: usize, to: usize) -> f64 {
        let spec = &self.inst.jobs[job];
        spec.save_s + 8.0 * spec.checkpoint_gb / self.link_gbps[from][to] + spec.restore_s
    }

    /// Sites where a job may run, ascending: those with an allowed pool, and only its current
    /// site when it is there and may not move.
    pub fn run_sites(&self, job: usize) -> Vec<usize> {
        let view = &self.jobs[job];
        let mut sites: Vec<usize> = view.pools.iter().map(|&p| self.pools[p].site).collect();
        sites.sort_unstable();
        sites.dedup();
        if let Some(current) = view.current_site
            && !view.migratable
        {
            sites.retain(|&s| s == current);
        }
        sites
    }

    /// The fewest slots a job must stay after a migration (feasibility domain).
    pub fn min_window_slots(&self, job: usize, from: usize, to: usize) -> usize {
        let transfer_s = self.transfer_s(job, from, to);
        let per_slot = self.inst.params.alpha * self.slot_s;
        // A tiny tolerance keeps exact multiples (e.g. 360 s over 0.1 x 3600 s) at one slot.
        (((transfer_s - 1e-9) / per_slot).ceil().max(1.0)) as usize
    }

    /// Energy moved per migration of this job, kWh, charged to each end.
    pub fn transfer_kwh(&self, job: usize) -> f64 {
        self.inst.params.transfer_kwh_per_gb * self.inst.jobs[job].checkpoint_gb
    }

    /// Load added by a job's gang at a level, kW, net of the idle power it replaces.
    pub fn run_load_kw(&self, job: usize, pool: usize, level: usize) -> f64 {
        let p = &self.pools[pool];
        self.inst.sites[p.site].pue
            * f64::from(self.jobs[job].gpus)
            * (p.levels_w[level] - p.idle_w)
            / 1000.0
    }

    /// Load a job's runs add per (site, slot), kW, including checkpoint transfers at both ends:
    /// sorted by (site, slot), each pair once.
    pub fn added_load_kw(&self, job: usize, runs: &[Slot]) -> Vec<((usize, usize), f64)> {
        let mut added: Vec<((usize, usize), f64)> = Vec::with_capacity(runs.len() + 2);
        let mut previous = self.jobs[job].current_site;
        for run in runs {
            let site = self.pools[run.pool].site;
            added.push(((site, run.slot), self.run_load_kw(job, run.pool, run.level)));
            if let Some(prev) = previous
                && prev != site
            {
                let kw = self.transfer_kwh(job) / self.slot_h;
                added.push(((prev, run.slot), kw));
                added.push(((site, run.slot), kw));
            }
            previous = Some(site);
        }
        // Stable, so a pair's loads add up in the order they came.
        added.sort_by_key(|&(key, _)| key);
        added.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                kept.1 += later.1;
                true
            } else {
                false
            }
        });
        added
    }

    /// Objective change (g) of running a job in one slot at a pool and level, against the
    /// previous plan: `+penalty` for a slot it did not run there, `-penalty` for one it did, and
    /// nothing for a job the previous plan did not run (a new job moves nothing). With
    /// [`Problem::change_constant_g`] this sums to the change penalty of any schedule.
    pub fn change_g(&self, job: usize, slot: usize, pool: usize, level: usize) -> f64 {
        let penalty = self.inst.params.change_penalty_g;
        if self.previous[job].is_empty() {
            0.0
        } else if self.previous[job].get(&slot) == Some(&(pool, level)) {
            -penalty
        } else {
            penalty
        }
    }

    /// Change penalty of a plan that keeps no previous run, g.
    pub fn change_constant_g(&self) -> f64 {
        self.inst.params.change_penalty_g
            * self.previous.iter().map(BTreeMap::len).sum::<usize>() as f64
    }

    /// The previous plan's runs for a job, in slot order; empty when it had none.
    pub fn previous_runs(&self, job: usize) -> Vec<Slot> {
        self.previous[job]
            .iter()
            .map(|(&slot, &(pool, level))| Slot { slot, pool, level })
            .collect()
    }

    /// A job's most work in one slot (its fastest allowed pool at full power), h.
    pub fn fastest_slot_h(&self, job: usize) -> f64 {
        self.jobs[job]
            .pools
            .iter()
            .map(|&p| self.slot_work_h(p, 0))
            .fold(0.0, f64::max)
    }

    /// Units of a job's work grid for the pricing programmes: 24 per slot of its fastest full
    /// work, at least 24 and at most 240, so the per-slot rounding stays at 1/24 of a slot's work
    /// whatever the job's length.
    pub fn work_grid_units(&self, job: usize) -> usize {
        const UNITS_PER_SLOT: f64 = 24.0;
        const MOST_UNITS: usize = 240;
        let fastest_h = self.fastest_slot_h(job);
        if fastest_h > 0.0 {
            ((self.jobs[job].work_hours / fastest_h * UNITS_PER_SLOT).ceil() as usize)
                .clamp(UNITS_PER_SLOT as usize, MOST_UNITS)
        } else {
            MOST_UNITS
        }
    }

    /// Units of a work grid of `unit_h` hours that a run doing `work_h` counts for, at most
    /// `k`: rounded **up** (the pricing relaxations, a lower bound on every real schedule) or
    /// **down** (every schedule found does its work).
    pub fn grid_units(work_h: f64, unit_h: f64, k: usize, round_up: bool) -> usize {
        let units = if round_up {
            (work_h / unit_h - 1e-9).ceil()
        } else {
            (work_h / unit_h + 1e-9).floor()
        };
        (units.max(0.0) as usize).min(k)
    }

    /// Work hours one slot delivers at a pool and level.
    pub fn slot_work_h(&self, pool: usize, level: usize) -> f64 {
        let p = &self.pools[pool];
        self.slot_h * p.speed * p.throughput[level]
    }

    pub fn price_usd_per_kwh(&self, site: usize, slot: usize) -> f64 {
        self.inst.sites[site]
            .price_usd_per_mwh
            .as_ref()
            .map_or(0.0, |p| p[slot] / 1000.0)
    }

    /// Objective weight of one kWh drawn from the grid at a site and slot, g.
    pub fn grid_cost_g_per_kwh(&self, site: usize, slot: usize) -> f64 {
        self.inst.sites[site].carbon_g_per_kwh[slot]
            + self.inst.params.lambda_cost_g_per_usd * self.price_usd_per_kwh(site, slot)
    }

    /// Surplus available over the horizon, kWh.
    pub fn surplus_available_kwh(&self) -> f64 {
        self.inst
            .sites
            .iter()
            .map(|s| s.surplus_kw.iter().sum::<f64>() * self.slot_h)
            .sum()
    }

    /// Takes `jobs`' runs from `answer` (a re-plan of those jobs around the rest of
    /// `current`) into `current` when that lowers its objective `current_g` (both updated);
    /// `true` when it did.
    pub(crate) fn adopt_if_lower(
        &self,
        current: &mut Schedule,
        current_g: &mut f64,
        answer: &Schedule,
        jobs: &[usize],
    ) -> bool {
        let mut candidate = current.clone();
        for &j in jobs {
            candidate.runs[j] = answer.runs[j].clone();
        }
        let candidate_g = self.evaluate(&candidate).objective_g;
        let lower = candidate_g < *current_g - 1e-9 * current_g.abs().max(1.0);
        if lower {
            *current = candidate;
            *current_g = candidate_g;
        }
        lower
    }

    /// Applies the accounting rules to a schedule.
    pub fn evaluate(&self, schedule: &Schedule) -> Evaluation {
        let n_sites = self.inst.sites.len();
        let mut load_kw: Vec<Vec<f64>> = (0..n_sites)
            .map(|s| vec![self.idle_load_kw[s]; self.n_slots])
            .collect();
        let mut migrations = Vec::new();
        for (job, runs) in schedule.runs.iter().enumerate() {
            let Some(runs) = runs else { continue };
            let mut previous = self.jobs[job].current_site;
            for (i, run) in runs.iter().enumerate() {
                let site = self.pools[run.pool].site;
                load_kw[site][run.slot] += self.run_load_kw(job, run.pool, run.level);
                if let Some(prev) = previous
                    && prev != site
                {
                    let last_here = runs[i..]
                        .iter()
                        .take_while(|r| self.pools[r.pool].site == site)
                        .last()
                        .map_or(run.slot, |r| r.slot);
                    let kwh = self.transfer_kwh(job);
                    load_kw[prev][run.slot] += kwh / self.slot_h;
                    load_kw[site][run.slot] += kwh / self.slot_h;
                    migrations.push(Migration {
                        job: self.inst.jobs[job].id.clone(),
                        from: self.inst.sites[prev].id.clone(),
                        to: self.inst.sites[site].id.clone(),
                        slot: run.slot,
                        transfer_s: self.transfer_s(job, prev, site),
                        window_slots: last_here - run.slot + 1,
                    });
                }
                previous = Some(site);
            }
        }
        let mut emissions_g = 0.0;
        let mut cost_g = 0.0;
        let mut grid_energy_kwh = 0.0;
        let mut surplus_used_kwh = 0.0;
        for (site_idx, site) in self.inst.sites.iter().enumerate() {
            for slot in 0..self.n_slots {
                let load = load_kw[site_idx][slot];
                let used = load.min(site.surplus_kw[slot]);
                let grid_kwh = (load - used) * self.slot_h;
                grid_energy_kwh += grid_kwh;
                surplus_used_kwh += used * self.slot_h;
                emissions_g += grid_kwh * site.carbon_g_per_kwh[slot];
                cost_g += grid_kwh
                    * self.inst.params.lambda_cost_g_per_usd
                    * self.price_usd_per_kwh(site_idx, slot);
            }
        }
        let change_g = self.change_constant_g()
            + schedule
                .runs
                .iter()
                .enumerate()
                .flat_map(|(job, runs)| runs.iter().flatten().map(move |r| (job, r)))
                .map(|(job, r)| self.change_g(job, r.slot, r.pool, r.level))
                .sum::<f64>();
        let objective_g = emissions_g
            + cost_g
            + self.inst.params.migration_penalty_g * migrations.len() as f64
            + change_g;
        Evaluation {
            emissions_g,
            objective_g,
            grid_energy_kwh,
            surplus_used_kwh,
            migrations,
        }
    }

    /// Writes a schedule in the public plan format.
    pub fn to_plan(&self, schedule: &Schedule, unplanned: &[Infeasible]) -> Plan {
        let mut assignments = Vec::new();
        for (job, runs) in schedule.runs.iter().enumerate() {
            for run in runs.iter().flatten() {
                let pool = &self.pools[run.pool];
                assignments.push(Assignment {
                    job: self.inst.jobs[job].id.clone(),
                    slot: run.slot,
                    site: self.inst.sites[pool.site].id.clone(),
                    power_w: pool.levels_w[run.level],
                    gpu_model: Some(pool.model.clone()),
                });
            }
        }
        Plan {
            assignments,
            migrations: self.evaluate(schedule).migrations,
            unplanned: unplanned.to_vec(),
        }
    }
}

/// Work a job must do inside the horizon: all of it when its deadline falls inside the horizon;
/// otherwise the share of its remaining window (from release or horizon start to deadline) that
/// lies inside the horizon. Rationale: a rolling planner must not push work past its horizon, where
/// it knows nothing, nor demand work the deadline does not yet require.
pub(crate) fn required_work_h(
    job: &crate::instance::Job,
    start: chrono::DateTime<chrono::Utc>,
    horizon_end: chrono::DateTime<chrono::Utc>,
) -> f64 {
    if job.deadline_utc.0 <= horizon_end {
        return job.work_hours;
    }
    let from = job.release_utc.0.max(start);
    let inside_s = (horizon_end - from).num_seconds().max(0) as f64;
    let whole_s = (job.deadline_utc.0 - from).num_seconds().max(1) as f64;
    job.work_hours * inside_s / whole_s
}
