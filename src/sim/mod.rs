//! The simulator: replays a scenario (formats.md section 2) slot by slot against a placement
//! policy, with the accounting rules of formats.md section 1 applied to the *actual* signals.
//!
//! Owns the scenario model and its loading (`scenario`), the forecasts a policy may see
//! (`forecast`), the replay engine and its metrics (this file), the policies (`policies`,
//! `planner`), the scenario builder (`build`) and the report (`report`).
//!
//! **Invariants:** a policy sees the world only through [`View`]: jobs already submitted, and
//! forecasts issued at or before the current slot's start (never an actual of the current or a
//! later slot). The engine, not the policy, enforces GPU capacity, allowed models, power levels
//! and non-migratable jobs; a decision that breaks them is dropped and counted in
//! `rejected_decisions`. Replays are deterministic for a given scenario, policy and seed (the
//! rolling planner's time limit aside).

pub mod build;
pub mod forecast;
pub mod planner;
pub mod policies;
pub mod report;
pub mod scenario;

use serde::Serialize;

pub use forecast::{ErrorModel, Forecasts, Signal};
pub use scenario::{Fleet, Scenario, ScenarioError, SimJob, SiteConfig};

/// One job run for one slot, as a policy decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Job index in the scenario.
    pub job: usize,
    /// Site index.
    pub site: usize,
    /// GPU model index (into [`Fleet::model_names`]).
    pub model: usize,
    /// Power level index into the model's `power_levels_w` (0 = full power).
    pub level: usize,
}

/// A job's state as the replay goes.
#[derive(Clone, Debug, Default)]
pub struct JobStatus {
    /// Work left, hours at full power on a speed-1.0 GPU.
    pub remaining_h: f64,
    /// Site holding the job's process or checkpoint; `None` before its first run.
    pub location: Option<usize>,
    /// Seconds of an incoming checkpoint transfer still to wait for at `location`.
    pub transfer_left_s: f64,
    /// Completion time, hours after the scenario start.
    pub done_h: Option<f64>,
    /// Last slot it ran in.
    pub last_slot: Option<usize>,
}

/// What a policy may see at one slot.
pub struct View<'a> {
    fleet: &'a Fleet,
    jobs: &'a [SimJob],
    status: &'a [JobStatus],
    released: &'a [usize],
    forecasts: &'a Forecasts<'a>,
    now: usize,
}

impl<'a> View<'a> {
    /// The current slot (0-based from the scenario start).
    pub fn now(&self) -> usize {
        self.now
    }

    /// Sites, GPU models, parameters and the slot grid.
    pub fn fleet(&self) -> &'a Fleet {
        self.fleet
    }

    /// Jobs submitted by now, in submission order.
    pub fn released(&self) -> &'a [usize] {
        self.released
    }

    /// Jobs submitted by now and not finished, in submission order.
    pub fn open_jobs(&self) -> impl Iterator<Item = usize> + '_ {
        self.released
            .iter()
            .copied()
            .filter(|&j| self.status[j].done_h.is_none())
    }

    /// A submitted job; `None` for a job not yet submitted.
    pub fn job(&self, job: usize) -> Option<&'a SimJob> {
        (self.jobs[job].release_slot <= self.now).then(|| &self.jobs[job])
    }

    /// A submitted job's state; `None` for a job not yet submitted.
    pub fn status(&self, job: usize) -> Option<&'a JobStatus> {
        (self.jobs[job].release_slot <= self.now).then(|| &self.status[job])
    }

    /// The newest forecast issued at or before now for `site` at `slot` (an observed actual for
    /// a past slot).
    pub fn forecast(&self, site: usize, slot: usize) -> Signal {
        self.forecasts.at(site, slot, self.now)
    }
}

/// A placement policy: asked once per slot which jobs run where.
pub trait Policy {
    /// The policy's name as `--policy` spells it.
    fn name(&self) -> &str;
    /// The runs for the current slot.
    fn decide(&mut self, view: &View<'_>) -> Vec<Run>;
    /// A line on how the policy worked (planner method, fall-backs), for the report.
    fn summary(&self) -> Option<String> {
        None
    }
}

/// Energy and emissions of one site over the replay.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SiteTotals {
    /// Site id.
    pub site: String,
    /// Energy drawn (load), kWh.
    pub energy_kwh: f64,
    /// Grid energy, kWh.
    pub grid_energy_kwh: f64,
    /// Surplus energy used, kWh.
    pub surplus_used_kwh: f64,
    /// Surplus energy available, kWh.
    pub surplus_available_kwh: f64,
    /// Grid emissions, kg CO2e.
    pub emissions_kg: f64,
    /// Busy GPU-slots over all GPU-slots.
    pub gpu_utilisation: f64,
}

/// Metrics of one replay (formats.md section 2, plus utilisation and per-site energy).
#[derive(Clone, Debug, Serialize)]
pub struct Metrics {
    /// Policy name.
    pub policy: String,
    /// Jobs in the scenario.
    pub jobs: usize,
    /// Jobs finished by the end of the trace.
    pub completed: usize,
    /// Jobs finished after their deadline or not at all.
    pub deadline_misses: usize,
    /// Ids of the jobs that missed their deadline.
    pub missed_jobs: Vec<String>,
    /// Sum over jobs of work hours completed, each weighted by its GPU count.
    pub work_done_hours: f64,
    /// Grid emissions, kg CO2e.
    pub emissions_kg: f64,
    /// Grid energy, kWh.
    pub grid_energy_kwh: f64,
    /// Surplus energy used, kWh.
    pub surplus_used_kwh: f64,
    /// Surplus energy available at all sites, kWh.
    pub surplus_available_kwh: f64,
    /// Checkpoint migrations between sites.
    pub migrations: usize,
    /// Checkpoint data moved, GB.
    pub gb_moved: f64,
    /// Mean of completion minus submission over completed jobs, hours.
    pub mean_completion_hours: f64,
    /// 95th percentile of completion minus submission over completed jobs, hours.
    pub p95_completion_hours: f64,
    /// Busy GPU-slots over all GPU-slots of the fleet.
    pub gpu_utilisation: f64,
    /// Site-slots whose grid import exceeded the site's grid limit.
    pub grid_limit_exceeded_slots: usize,
    /// Decisions the engine dropped (capacity, model, level, non-migratable, duplicate).
    pub rejected_decisions: usize,
    /// Per-site totals.
    pub sites: Vec<SiteTotals>,
    /// How the policy worked, when it says.
    pub note: Option<String>,
    /// Wall time of the replay, seconds.
    pub wall_seconds: f64,
}

/// Per-slot series of one replay, for charts.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Series {
    /// Grid emissions per slot, kg.
    pub emissions_kg: Vec<f64>,
    /// Surplus used per slot, kWh.
    pub surplus_used_kwh: Vec<f64>,
    /// Surplus available per slot, kWh.
    pub surplus_available_kwh: Vec<f64>,
    /// Per site and slot: load, surplus used and grid power, kW (conservation: load = surplus
    /// used + grid).
    pub site_load_kw: Vec<Vec<f64>>,
    /// See `site_load_kw`.
    pub site_surplus_used_kw: Vec<Vec<f64>>,
    /// See `site_load_kw`.
    pub site_grid_kw: Vec<Vec<f64>>,
    /// Completion minus submission per completed job, hours.
    pub completion_hours: Vec<f64>,
}

/// A replay's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Summary metrics.
    pub metrics: Metrics,
    /// Per-slot series.
    pub series: Series,
    /// Final state of every job.
    pub jobs: Vec<JobStatus>,
}

/// Replays `scenario` under `policy`. `progress(slot, slots)` is called after each slot.
pub fn simulate(
    scenario: &Scenario,
    forecasts: &Forecasts<'_>,
    policy: &mut dyn Policy,
    progress: &mut dyn FnMut(usize, usize),
) -> Outcome {
    let wall = std::time::Instant::now();
    let fleet = &scenario.fleet;
    let n_sites = fleet.sites.len();
    let n_slots = fleet.slots;
    let h = fleet.slot_hours();
    let slot_s = h * 3600.0;
    let mut status: Vec<JobStatus> = scenario
        .jobs
        .iter()
        .map(|j| JobStatus {
            remaining_h: j.work_hours,
            ..JobStatus::default()
        })
        .collect();
    let mut order: Vec<usize> = (0..scenario.jobs.len()).collect();
    order.sort_by_key(|&j| {
        (
            scenario.jobs[j].release_slot,
            scenario.jobs[j].submit_utc,
            j,
        )
    });
    let mut released: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut series = Series {
        site_load_kw: vec![vec![0.0; n_slots]; n_sites],
        site_surplus_used_kw: vec![vec![0.0; n_slots]; n_sites],
        site_grid_kw: vec![vec![0.0; n_slots]; n_sites],
        ..Series::default()
    };
    let mut totals: Vec<SiteTotals> = fleet
        .sites
        .iter()
        .map(|s| SiteTotals {
            site: s.id.clone(),
            ..SiteTotals::default()
        })
        .collect();
    let mut busy_gpu_slots = vec![0u64; n_sites];
    let mut migrations = 0;
    let mut gb_moved = 0.0;
    let mut rejected = 0;
    let mut grid_exceeded = 0;

    for now in 0..n_slots {
        while next < order.len() && scenario.jobs[order[next]].release_slot <= now {
            released.push(order[next]);
            next += 1;
        }
        let decisions = {
            let view = View {
                fleet,
                jobs: &scenario.jobs,
                status: &status,
                released: &released,
                forecasts,
                now,
            };
            policy.decide(&view)
        };
        // Admission: the engine enforces the physical rules, in the policy's order.
        let mut free: Vec<Vec<u32>> = fleet
            .sites
            .iter()
            .map(|s| fleet.model_names.iter().map(|m| s.gpus_of(m)).collect())
            .collect();
        let mut seen = vec![false; scenario.jobs.len()];
        let mut accepted: Vec<Run> = Vec::with_capacity(decisions.len());
        for run in decisions {
            let ok = run.job < scenario.jobs.len()
                && run.site < n_sites
                && run.model < fleet.model_names.len()
                && !seen[run.job]
                && scenario.jobs[run.job].release_slot <= now
                && status[run.job].done_h.is_none()
                && scenario.jobs[run.job].allows(run.model)
                && run.level < fleet.models[run.model].power_levels_w.len()
                && free[run.site][run.model] >= scenario.jobs[run.job].gpus
                && (scenario.jobs[run.job].migratable
                    || status[run.job].location.is_none_or(|l| l == run.site));
            if !ok {
                rejected += 1;
                continue;
            }
            seen[run.job] = true;
            free[run.site][run.model] -= scenario.jobs[run.job].gpus;
            accepted.push(run);
        }
        // Loads: idle GPUs, running jobs, checkpoint transfers.
        let mut load_kw: Vec<f64> = vec![0.0; n_sites];
        for (s, site) in fleet.sites.iter().enumerate() {
            let idle_w: f64 = fleet
                .model_names
                .iter()
                .enumerate()
                .map(|(m, _)| f64::from(free[s][m]) * fleet.models[m].idle_w)
                .sum();
            load_kw[s] += site.pue * idle_w / 1000.0;
        }
        for run in &accepted {
            let job = &scenario.jobs[run.job];
            let model = &fleet.models[run.model];
            load_kw[run.site] +=
                fleet.sites[run.site].pue * f64::from(job.gpus) * model.power_levels_w[run.level]
                    / 1000.0;
            busy_gpu_slots[run.site] += u64::from(job.gpus);
            let state = &mut status[run.job];
            if let Some(from) = state.location
                && from != run.site
            {
                let transfer_s = job.save_s
                    + 8.0 * job.checkpoint_gb / fleet.link_gbps(from, run.site)
                    + job.restore_s;
                let transfer_kw = fleet.params.transfer_kwh_per_gb * job.checkpoint_gb / h;
                load_kw[from] += transfer_kw;
                load_kw[run.site] += transfer_kw;
                state.transfer_left_s = transfer_s;
                migrations += 1;
                gb_moved += job.checkpoint_gb;
            }
            state.location = Some(run.site);
            state.last_slot = Some(now);
            let waited_s = state.transfer_left_s.min(slot_s);
            state.transfer_left_s -= waited_s;
            let rate = model.speed * model.throughput[run.level];
            let progress_h = (slot_s - waited_s) / 3600.0 * rate;
            if progress_h + 1e-9 >= state.remaining_h {
                let needed_s = if rate > 0.0 {
                    state.remaining_h / rate * 3600.0
                } else {
                    0.0
                };
                state.done_h = Some(now as f64 * h + (waited_s + needed_s) / 3600.0);
                state.remaining_h = 0.0;
            } else {
                state.remaining_h -= progress_h;
            }
        }
        // Accounting on the actuals.
        let mut slot_emissions_kg = 0.0;
        let mut slot_surplus_used = 0.0;
        let mut slot_surplus_available = 0.0;
        for s in 0..n_sites {
            let actual = scenario.actual(s, now);
            let used_kw = load_kw[s].min(actual.surplus_kw);
            let grid_kw = load_kw[s] - used_kw;
            if fleet.sites[s]
                .grid_limit_kw
                .is_some_and(|limit| grid_kw > limit + 1e-6)
            {
                grid_exceeded += 1;
            }
            let emissions_kg = grid_kw * h * actual.carbon_g_per_kwh / 1000.0;
            series.site_load_kw[s][now] = load_kw[s];
            series.site_surplus_used_kw[s][now] = used_kw;
            series.site_grid_kw[s][now] = grid_kw;
            let t = &mut totals[s];
            t.energy_kwh += load_kw[s] * h;
            t.grid_energy_kwh += grid_kw * h;
            t.surplus_used_kwh += used_kw * h;
            t.surplus_available_kwh += actual.surplus_kw * h;
            t.emissions_kg += emissions_kg;
            slot_emissions_kg += emissions_kg;
            slot_surplus_used += used_kw * h;
            slot_surplus_available += actual.surplus_kw * h;
        }
        series.emissions_kg.push(slot_emissions_kg);
        series.surplus_used_kwh.push(slot_surplus_used);
        series.surplus_available_kwh.push(slot_surplus_available);
        progress(now + 1, n_slots);
    }

    for (s, t) in totals.iter_mut().enumerate() {
        let gpus: u32 = fleet.sites[s].gpus.values().sum();
        t.gpu_utilisation = ratio(busy_gpu_slots[s] as f64, f64::from(gpus) * n_slots as f64);
    }
    let mut completed = 0;
    let mut missed_jobs = Vec::new();
    let mut work_done_hours = 0.0;
    for (job, state) in scenario.jobs.iter().zip(&status) {
        work_done_hours += (job.work_hours - state.remaining_h) * f64::from(job.gpus);
        match state.done_h {
            Some(done_h) => {
                completed += 1;
                series.completion_hours.push(done_h - job.submit_h);
                if done_h > job.deadline_h + 1e-6 {
                    missed_jobs.push(job.id.clone());
                }
            }
            None => missed_jobs.push(job.id.clone()),
        }
    }
    let mut sorted = series.completion_hours.clone();
    sorted.sort_by(f64::total_cmp);
    let total_gpus: u32 = fleet.sites.iter().flat_map(|s| s.gpus.values()).sum();
    let metrics = Metrics {
        policy: policy.name().to_string(),
        jobs: scenario.jobs.len(),
        completed,
        deadline_misses: missed_jobs.len(),
        missed_jobs,
        work_done_hours,
        emissions_kg: totals.iter().map(|t| t.emissions_kg).sum(),
        grid_energy_kwh: totals.iter().map(|t| t.grid_energy_kwh).sum(),
        surplus_used_kwh: totals.iter().map(|t| t.surplus_used_kwh).sum(),
        surplus_available_kwh: totals.iter().map(|t| t.surplus_available_kwh).sum(),
        migrations,
        gb_moved,
        mean_completion_hours: ratio(sorted.iter().sum(), sorted.len() as f64),
        p95_completion_hours: percentile(&sorted, 0.95),
        gpu_utilisation: ratio(
            busy_gpu_slots.iter().sum::<u64>() as f64,
            f64::from(total_gpus) * n_slots as f64,
        ),
        grid_limit_exceeded_slots: grid_exceeded,
        rejected_decisions: rejected,
        sites: totals,
        note: policy.summary(),
        wall_seconds: wall.elapsed().as_secs_f64(),
    };
    Outcome {
        metrics,
        series,
        jobs: status,
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The `q` quantile of sorted values (nearest rank); 0 for none.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Per-site GPU counts indexed by model, for policies that track free GPUs in a slot.
pub fn free_gpus(fleet: &Fleet) -> Vec<Vec<u32>> {
    fleet
        .sites
        .iter()
        .map(|s| fleet.model_names.iter().map(|m| s.gpus_of(m)).collect())
        .collect()
}

/// Names and order of the built-in policies.
pub const POLICIES: [&str; 7] = [
    "run-now",
    "wait-awhile",
    "lowest-carbon-site",
    "gaia-cst",
    "surplus-chaser",
    "windfall",
    "oracle",
];

/// Options of the planner-based policies.
#[derive(Clone, Debug)]
pub struct PlannerOptions {
    /// Planning horizon, slots.
    pub horizon_slots: usize,
    /// Solver time limit per planning tick, seconds.
    pub solve_seconds: f64,
    /// Re-optimise the whole plan every this many slots; arrivals in between are inserted into
    /// the standing plan.
    pub replan_every: usize,
    /// Objective penalty per migration the planner adds to the scenario's own, g CO2e: the
    /// operational risk of a move that forecast errors may undo.
    pub migration_penalty_g: f64,
    /// Most column-generation rounds per full re-plan.
    pub colgen_rounds: usize,
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            horizon_slots: 48,
            solve_seconds: 2.0,
            replan_every: 6,
            migration_penalty_g: 300.0,
            colgen_rounds: 3,
        }
    }
}

/// Builds the named policy for `scenario`.
pub fn make_policy(
    name: &str,
    scenario: &Scenario,
    options: &PlannerOptions,
) -> Result<Box<dyn Policy>, String> {
    Ok(match name {
        "run-now" => Box::new(policies::RunNow::default()),
        "wait-awhile" => Box::new(policies::WaitAwhile),
        "lowest-carbon-site" => Box::new(policies::LowestCarbonSite::default()),
        "gaia-cst" => Box::new(policies::GaiaCst::default()),
        "surplus-chaser" => Box::new(policies::SurplusChaser),
        "windfall" => Box::new(planner::Rolling::new(options.clone(), "windfall")),
        "oracle" => Box::new(planner::Oracle::new(scenario, options)),
        other => {
            return Err(format!(
                "unknown policy `{other}`; choose one of {} or `all`",
                POLICIES.join(", ")
            ));
        }
    })
}

/// Replays every named policy and returns their outcomes in order. The oracle replays against
/// perfect forecasts; every other policy against `forecasts`.
pub fn simulate_all(
    scenario: &Scenario,
    names: &[String],
    error: &ErrorModel,
    options: &PlannerOptions,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<Outcome>, String> {
    let forecasts = Forecasts::new(scenario, error.clone());
    let perfect = Forecasts::perfect(scenario);
    let mut outcomes = Vec::new();
    for name in names {
        let mut policy = make_policy(name, scenario, options)?;
        let seen = if name == "oracle" {
            &perfect
        } else {
            &forecasts
        };
        outcomes.push(simulate(scenario, seen, policy.as_mut(), &mut |t, n| {
            progress(name, t, n)
        }));
    }
    Ok(outcomes)
}
