//! windfall's own planner as a simulator policy (rolling re-planning on the forecasts known at
//! each tick) and the oracle (the same solver with perfect knowledge).
//!
//! Owns turning the replay's state into a solver instance (open jobs with their remaining work
//! and where their checkpoint is, forecasts over the horizon, the previous plan for stability),
//! reading the plan back as runs, and the fall-back for jobs the plan cannot serve: a job whose
//! deadline has passed or that the solver reports infeasible runs as soon as GPUs are free, at
//! full power, where it is. It must not see anything the [`View`] does not show, except the
//! offline oracle, which is given the whole scenario by definition.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use windfall_solver::{
    Instance, Job, Method, Site, SolveOptions, UtcTime, instance::CarbonSignal, solve,
};

use super::policies::take_first_fit;
use super::scenario::{Fleet, Scenario};
use super::{PlannerOptions, Policy, Run, View, free_gpus};

/// Largest scenario (jobs) the oracle solves offline in one instance; above it the oracle
/// re-plans on a rolling horizon with perfect forecasts.
pub const ORACLE_OFFLINE_MAX_JOBS: usize = 60;

/// The rolling planner.
pub struct Rolling {
    name: String,
    options: PlannerOptions,
    /// Planned runs by absolute slot.
    plan: BTreeMap<usize, Vec<Run>>,
    /// The last plan in the solver's format, by absolute slot, for plan stability.
    previous: Vec<(usize, windfall_solver::Assignment)>,
    last_full_slot: Option<usize>,
    released_at_last_plan: usize,
    /// Jobs the last plan could not serve.
    unserved: HashSet<usize>,
    frozen: bool,
    solves: usize,
    solve_seconds: f64,
    fallback_runs: usize,
    methods: BTreeMap<String, usize>,
}

impl Rolling {
    /// A rolling planner named `name`.
    pub fn new(options: PlannerOptions, name: &str) -> Rolling {
        Rolling {
            name: name.to_string(),
            options,
            plan: BTreeMap::new(),
            previous: Vec::new(),
            last_full_slot: None,
            released_at_last_plan: 0,
            unserved: HashSet::new(),
            frozen: false,
            solves: 0,
            solve_seconds: 0.0,
            fallback_runs: 0,
            methods: BTreeMap::new(),
        }
    }

    fn replan(&mut self, view: &View<'_>, method: Method) {
        let fleet = view.fleet();
        let now = view.now();
        let horizon = self.options.horizon_slots.min(fleet.slots - now);
        let mut jobs = Vec::new();
        let mut index = HashMap::new();
        for j in view.open_jobs() {
            let spec = view.job(j).expect("open jobs are submitted");
            let status = view.status(j).expect("open jobs are submitted");
            if spec.deadline_slot <= now || status.remaining_h <= 0.0 {
                continue; // late: the fall-back runs it
            }
            index.insert(spec.id.clone(), j);
            jobs.push(Job {
                id: spec.id.clone(),
                gpus: spec.gpus,
                gpu_models: spec
                    .models
                    .iter()
                    .map(|&m| fleet.model_names[m].clone())
                    .collect(),
                // A deadline past the horizon is fine: the solver asks only for the horizon's
                // pro-rata share of the work.
                work_hours: status.remaining_h,
                release_utc: UtcTime(fleet.slot_start(now)),
                deadline_utc: UtcTime(spec.deadline_utc),
                checkpoint_gb: spec.checkpoint_gb,
                save_s: spec.save_s,
                restore_s: spec.restore_s,
                migratable: spec.migratable,
                home_site: fleet.sites[spec.home_site].id.clone(),
                current_site: status.location.map(|s| fleet.sites[s].id.clone()),
            });
        }
        self.released_at_last_plan = view.released().len();
        self.plan.retain(|&slot, _| slot < now);
        self.unserved.clear();
        if jobs.is_empty() || horizon == 0 {
            return;
        }
        let instance = Instance {
            start_utc: UtcTime(fleet.slot_start(now)),
            slot_minutes: fleet.slot_minutes,
            slots: horizon,
            gpu_models: fleet.gpu_models(),
            sites: sites_over(fleet, horizon, |s, t| view.forecast(s, now + t)),
            links_gbps: fleet.links_gbps.clone(),
            jobs,
            params: windfall_solver::Params {
                migration_penalty_g: fleet.params.migration_penalty_g
                    + self.options.migration_penalty_g,
                ..fleet.params.clone()
            },
            previous_assignments: self
                .previous
                .iter()
                .filter(|(slot, _)| *slot >= now && *slot < now + horizon)
                .map(|(slot, a)| windfall_solver::Assignment {
                    slot: slot - now,
                    ..a.clone()
                })
                .collect(),
        };
        self.solve_into(fleet, &instance, now, &index, method);
    }

    fn solve_into(
        &mut self,
        fleet: &Fleet,
        instance: &Instance,
        offset: usize,
        index: &HashMap<String, usize>,
        method: Method,
    ) {
        let started = Instant::now();
        let solution = solve(
            instance,
            &SolveOptions {
                time_limit_s: self.options.solve_seconds,
                method,
                bound: false,
                max_colgen_rounds: self.options.colgen_rounds,
                ..SolveOptions::default()
            },
        );
        self.solve_seconds += started.elapsed().as_secs_f64();
        self.solves += 1;
        let method = solution
            .metrics
            .method
            .split(" (")
            .next()
            .unwrap_or("")
            .split(',')
            .next()
            .unwrap_or("")
            .to_string();
        *self.methods.entry(method).or_default() += 1;
        self.previous = solution
            .plan
            .assignments
            .iter()
            .map(|a| (a.slot + offset, a.clone()))
            .collect();
        for a in &solution.plan.assignments {
            let (Some(&job), Some(site)) = (index.get(&a.job), fleet.site_index(&a.site)) else {
                continue;
            };
            let Some(model) = a
                .gpu_model
                .as_ref()
                .and_then(|m| fleet.model_names.iter().position(|n| n == m))
            else {
                continue;
            };
            let Some(level) = fleet.models[model]
                .power_levels_w
                .iter()
                .position(|w| (w - a.power_w).abs() < 1e-6)
            else {
                continue;
            };
            self.plan.entry(a.slot + offset).or_default().push(Run {
                job,
                site,
                model,
                level,
            });
        }
        for infeasible in &solution.metrics.infeasible_jobs {
            if let Some(&job) = index.get(&infeasible.job) {
                self.unserved.insert(job);
            }
        }
    }
}

/// The fleet's sites with series over `horizon` slots from `value(site, slot)`.
fn sites_over(
    fleet: &Fleet,
    horizon: usize,
    value: impl Fn(usize, usize) -> super::Signal,
) -> Vec<Site> {
    fleet
        .sites
        .iter()
        .enumerate()
        .map(|(s, spec)| {
            let series: Vec<super::Signal> = (0..horizon).map(|t| value(s, t)).collect();
            Site {
                id: spec.id.clone(),
                zone: spec.zone.clone(),
                gpus: spec.gpus.clone(),
                pue: spec.pue,
                grid_limit_kw: spec.grid_limit_kw,
                wan_gbps: spec.wan_gbps,
                surplus_kw: series.iter().map(|v| v.surplus_kw).collect(),
                carbon_g_per_kwh: series.iter().map(|v| v.carbon_g_per_kwh).collect(),
                carbon_signal: CarbonSignal::default(),
                price_usd_per_mwh: None,
            }
        })
        .collect()
}

impl Policy for Rolling {
    fn name(&self) -> &str {
        &self.name
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let now = view.now();
        // A full re-optimisation every `replan_every` slots; in between, arrivals are inserted
        // into the standing plan by the heuristic (the previous plan's runs are kept).
        let full = !self.frozen
            && self
                .last_full_slot
                .is_none_or(|last| now >= last + self.options.replan_every.max(1));
        let arrivals = !self.frozen && view.released().len() != self.released_at_last_plan;
        if full {
            self.last_full_slot = Some(now);
            self.replan(view, Method::Auto);
        } else if arrivals {
            self.replan(view, Method::Heuristic);
        }
        let fleet = view.fleet();
        let mut free = free_gpus(fleet);
        let mut runs: Vec<Run> = Vec::new();
        let mut running = HashSet::new();
        for run in self.plan.get(&now).into_iter().flatten() {
            let Some(status) = view.status(run.job) else {
                continue;
            };
            if status.done_h.is_some() {
                continue;
            }
            let gpus = view.job(run.job).expect("submitted").gpus;
            if free[run.site][run.model] >= gpus {
                free[run.site][run.model] -= gpus;
                running.insert(run.job);
                runs.push(*run);
            }
        }
        // Fall-back: late jobs and jobs the plan cannot serve run now where they are.
        for job in view.open_jobs() {
            if running.contains(&job) {
                continue;
            }
            let spec = view.job(job).expect("open jobs are submitted");
            let status = view.status(job).expect("open jobs are submitted");
            let late = spec.deadline_slot <= now;
            let planned_later = self
                .plan
                .range(now..)
                .any(|(_, r)| r.iter().any(|r| r.job == job));
            if !(late || self.unserved.contains(&job) || (self.frozen && !planned_later)) {
                continue;
            }
            let site = status.location.unwrap_or(spec.home_site);
            if take_first_fit(job, spec, site, &mut free, &mut runs).is_some() {
                self.fallback_runs += 1;
            }
        }
        runs
    }

    fn summary(&self) -> Option<String> {
        let methods: Vec<String> = self
            .methods
            .iter()
            .map(|(m, n)| format!("{m} x{n}"))
            .collect();
        Some(format!(
            "{} solve(s), {:.1} s solving ({}); horizon {} slots, full re-plan every {} slot(s), arrivals inserted in between; {} fall-back job-slot run(s)",
            self.solves,
            self.solve_seconds,
            methods.join(", "),
            self.options.horizon_slots,
            self.options.replan_every,
            self.fallback_runs
        ))
    }
}

/// The oracle: windfall's solver with perfect knowledge. Up to [`ORACLE_OFFLINE_MAX_JOBS`] jobs
/// it plans the whole trace offline in one instance (knowing every arrival); above, it re-plans
/// on a rolling horizon twice the planner's with perfect forecasts (it is replayed against the
/// actuals), which knows the signals but not future arrivals.
pub struct Oracle {
    inner: Rolling,
    offline: bool,
}

impl Oracle {
    /// Plans `scenario` (offline when small enough).
    pub fn new(scenario: &Scenario, options: &PlannerOptions) -> Oracle {
        let fleet = &scenario.fleet;
        if scenario.jobs.len() > ORACLE_OFFLINE_MAX_JOBS {
            let rolling_options = PlannerOptions {
                horizon_slots: options.horizon_slots * 2,
                ..options.clone()
            };
            return Oracle {
                inner: Rolling::new(rolling_options, "oracle"),
                offline: false,
            };
        }
        let (instance, index) = offline_instance(scenario);
        let mut inner = Rolling::new(
            PlannerOptions {
                solve_seconds: (options.solve_seconds * 10.0).max(30.0),
                ..options.clone()
            },
            "oracle",
        );
        inner.solve_into(fleet, &instance, 0, &index, Method::Auto);
        inner.frozen = true;
        Oracle {
            inner,
            offline: true,
        }
    }
}

/// The whole scenario as one instance over the actuals: every job released at its submission,
/// deadlines capped at the trace end; with the index of each job id in the scenario.
pub fn offline_instance(scenario: &Scenario) -> (Instance, HashMap<String, usize>) {
    let fleet = &scenario.fleet;
    let end = fleet.slot_start(fleet.slots);
    let mut index = HashMap::new();
    let jobs: Vec<Job> = scenario
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.release_slot < fleet.slots)
        .map(|(i, j)| {
            index.insert(j.id.clone(), i);
            Job {
                id: j.id.clone(),
                gpus: j.gpus,
                gpu_models: j
                    .models
                    .iter()
                    .map(|&m| fleet.model_names[m].clone())
                    .collect(),
                work_hours: j.work_hours,
                release_utc: UtcTime(j.submit_utc),
                deadline_utc: UtcTime(j.deadline_utc.min(end)),
                checkpoint_gb: j.checkpoint_gb,
                save_s: j.save_s,
                restore_s: j.restore_s,
                migratable: j.migratable,
                home_site: fleet.sites[j.home_site].id.clone(),
                current_site: None,
            }
        })
        .collect();
    let instance = Instance {
        start_utc: UtcTime(fleet.start_utc),
        slot_minutes: fleet.slot_minutes,
        slots: fleet.slots,
        gpu_models: fleet.gpu_models(),
        sites: sites_over(fleet, fleet.slots, |s, t| scenario.actual(s, t)),
        links_gbps: fleet.links_gbps.clone(),
        jobs,
        params: fleet.params.clone(),
        previous_assignments: Vec::new(),
    };
    (instance, index)
}

impl Policy for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        self.inner.decide(view)
    }

    fn summary(&self) -> Option<String> {
        let mode = if self.offline {
            "offline over the whole trace, knowing every arrival"
        } else {
            "rolling with perfect forecasts (too many jobs to solve offline)"
        };
        Some(format!(
            "{mode}; {}",
            self.inner.summary().unwrap_or_default()
        ))
    }
}
