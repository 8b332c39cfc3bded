//! The published policies windfall is compared with, each as the simulator replays it.
//!
//! Owns `run-now`, `wait-awhile`, `lowest-carbon-site`, `gaia-cst` and `surplus-chaser` and the
//! helpers they share. Every policy decides from a [`View`] only (jobs submitted so far,
//! forecasts issued so far) and never plans beyond the slot it is asked about, except where the
//! published idea itself commits to a start time (`gaia-cst`).
//!
//! Where a published policy reads a carbon signal, it reads the *effective* intensity a job
//! would see at a site: the grid intensity times the share of the job's power that the forecast
//! surplus does not cover. Rationale: the sites of a windfall fleet have surplus power, and a
//! baseline blind to it would be a straw man.

use std::collections::HashMap;

use super::scenario::{Fleet, SimJob};
use super::{Policy, Run, View, free_gpus};

/// Power a job draws at a site on a model at a level, kW (PUE included).
pub fn job_kw(fleet: &Fleet, job: &SimJob, site: usize, model: usize, level: usize) -> f64 {
    fleet.sites[site].pue * f64::from(job.gpus) * fleet.models[model].power_levels_w[level] / 1000.0
}

/// Effective carbon intensity for a job running alone at full power: the forecast grid
/// intensity times the share of its power the forecast surplus leaves to the grid, g/kWh.
pub fn effective_carbon(
    view: &View<'_>,
    job: &SimJob,
    site: usize,
    model: usize,
    slot: usize,
) -> f64 {
    let signal = view.forecast(site, slot);
    let kw = job_kw(view.fleet(), job, site, model, 0);
    if kw <= 0.0 {
        return 0.0;
    }
    signal.carbon_g_per_kwh * (kw - signal.surplus_kw).max(0.0) / kw
}

/// The first allowed model at `site` with enough free GPUs, in model order.
pub fn first_fit(job: &SimJob, site: usize, free: &[Vec<u32>]) -> Option<usize> {
    job.models
        .iter()
        .copied()
        .find(|&m| free[site][m] >= job.gpus)
}

/// Starts `job` at `site` on the first allowed model with free GPUs, at full power: takes the
/// GPUs and adds the run. Returns the model, or `None` when nothing fits.
pub fn take_first_fit(
    job: usize,
    spec: &SimJob,
    site: usize,
    free: &mut [Vec<u32>],
    runs: &mut Vec<Run>,
) -> Option<usize> {
    let model = first_fit(spec, site, free)?;
    free[site][model] -= spec.gpus;
    runs.push(Run {
        job,
        site,
        model,
        level: 0,
    });
    Some(model)
}

/// Power a job adds at a site over the idle draw of the GPUs it uses, kW.
fn extra_kw(fleet: &Fleet, job: &SimJob, site: usize, model: usize) -> f64 {
    job_kw(fleet, job, site, model, 0)
        - fleet.sites[site].pue * f64::from(job.gpus) * fleet.models[model].idle_w / 1000.0
}

/// The fastest allowed model the site has enough GPUs of in total (free or not).
fn fastest_model(fleet: &Fleet, job: &SimJob, site: usize) -> Option<usize> {
    job.models
        .iter()
        .copied()
        .filter(|&m| fleet.sites[site].gpus_of(&fleet.model_names[m]) >= job.gpus)
        .max_by(|&a, &b| {
            fleet.models[a]
                .speed
                .total_cmp(&fleet.models[b].speed)
                .then(b.cmp(&a))
        })
}

/// Whole slots of full-power work a job still needs on `model`.
fn slots_needed(fleet: &Fleet, remaining_h: f64, model: usize) -> usize {
    let per_slot = fleet.slot_hours() * fleet.models[model].speed;
    (remaining_h / per_slot - 1e-9).ceil().max(1.0) as usize
}

/// Last slot index + 1 a job may use before its deadline, within the trace.
fn window_end(fleet: &Fleet, job: &SimJob) -> usize {
    job.deadline_slot.min(fleet.slots)
}

/// Runs the jobs already started where they are, at full power, and takes their GPUs.
fn continue_started(
    view: &View<'_>,
    placed: &HashMap<usize, (usize, usize)>,
    free: &mut [Vec<u32>],
    runs: &mut Vec<Run>,
) {
    for job in view.open_jobs() {
        if let Some(&(site, model)) = placed.get(&job) {
            let spec = view.job(job).expect("open jobs are submitted");
            free[site][model] = free[site][model].saturating_sub(spec.gpus);
            runs.push(Run {
                job,
                site,
                model,
                level: 0,
            });
        }
    }
}

/// `run-now`: carbon-agnostic first-come-first-served at the home site, full power, until done
/// (formats.md's baseline).
#[derive(Default)]
pub struct RunNow {
    placed: HashMap<usize, (usize, usize)>,
}

impl Policy for RunNow {
    fn name(&self) -> &str {
        "run-now"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let mut free = free_gpus(view.fleet());
        let mut runs = Vec::new();
        continue_started(view, &self.placed, &mut free, &mut runs);
        for job in view.open_jobs() {
            if self.placed.contains_key(&job) {
                continue;
            }
            let spec = view.job(job).expect("open jobs are submitted");
            if let Some(model) = take_first_fit(job, spec, spec.home_site, &mut free, &mut runs) {
                self.placed.insert(job, (spec.home_site, model));
            }
        }
        runs
    }
}

/// `wait-awhile` (Wiesner et al., "Let's Wait Awhile", Middleware 2021), interruptible
/// variant: temporal shifting only. Each job stays at its home site and runs, at full power, in
/// the lowest-carbon slots before its deadline that cover its remaining work; the choice is
/// re-made every slot from the newest forecasts. A job with no slack left runs now.
#[derive(Default)]
pub struct WaitAwhile;

impl Policy for WaitAwhile {
    fn name(&self) -> &str {
        "wait-awhile"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let fleet = view.fleet();
        let now = view.now();
        let mut wanted: Vec<(usize, usize)> = Vec::new(); // (slack, job)
        for job in view.open_jobs() {
            let spec = view.job(job).expect("open jobs are submitted");
            let status = view.status(job).expect("open jobs are submitted");
            let Some(model) = fastest_model(fleet, spec, spec.home_site) else {
                continue;
            };
            let need = slots_needed(fleet, status.remaining_h, model);
            let end = window_end(fleet, spec);
            let available = end.saturating_sub(now);
            if need >= available {
                wanted.push((0, job));
                continue;
            }
            let mut slots: Vec<(f64, usize)> = (now..end)
                .map(|t| (effective_carbon(view, spec, spec.home_site, model, t), t))
                .collect();
            slots.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            if slots[..need].iter().any(|&(_, t)| t == now) {
                wanted.push((available - need, job));
            }
        }
        wanted.sort();
        let mut free = free_gpus(fleet);
        let mut runs = Vec::new();
        for (_, job) in wanted {
            let spec = view.job(job).expect("open jobs are submitted");
            take_first_fit(job, spec, spec.home_site, &mut free, &mut runs);
        }
        runs
    }
}

/// `lowest-carbon-site`: spatial greedy. A job starts as soon as it is submitted, at the site
/// with the lowest effective carbon intensity now among those with free GPUs of an allowed
/// model (its home site on a tie), and runs there at full power until done.
#[derive(Default)]
pub struct LowestCarbonSite {
    placed: HashMap<usize, (usize, usize)>,
}

impl Policy for LowestCarbonSite {
    fn name(&self) -> &str {
        "lowest-carbon-site"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let fleet = view.fleet();
        let mut free = free_gpus(fleet);
        let mut runs = Vec::new();
        continue_started(view, &self.placed, &mut free, &mut runs);
        for job in view.open_jobs() {
            if self.placed.contains_key(&job) {
                continue;
            }
            let spec = view.job(job).expect("open jobs are submitted");
            let best = (0..fleet.sites.len())
                .filter_map(|site| first_fit(spec, site, &free).map(|m| (site, m)))
                .map(|(site, m)| {
                    let c = effective_carbon(view, spec, site, m, view.now());
                    (c, site != spec.home_site, site, m)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
            if let Some((_, _, site, model)) = best {
                free[site][model] -= spec.gpus;
                self.placed.insert(job, (site, model));
                runs.push(Run {
                    job,
                    site,
                    model,
                    level: 0,
                });
            }
        }
        runs
    }
}

/// `gaia-cst` (Hanafy et al., "Going Green for Less Green", GAIA, ASPLOS 2024): the Carbon
/// Savings per Waiting Time policy. When a job arrives, it picks the start time `s` that
/// maximises the carbon saved against starting now per hour waited, `(C(now) - C(s)) / (s -
/// now)`, among starts that still meet the deadline with an uninterrupted run (now when no
/// start saves carbon). The job then runs uninterrupted at its home site at full power.
#[derive(Default)]
pub struct GaiaCst {
    start_at: HashMap<usize, usize>,
    placed: HashMap<usize, (usize, usize)>,
}

impl Policy for GaiaCst {
    fn name(&self) -> &str {
        "gaia-cst"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let fleet = view.fleet();
        let now = view.now();
        let mut free = free_gpus(fleet);
        let mut runs = Vec::new();
        continue_started(view, &self.placed, &mut free, &mut runs);
        for job in view.open_jobs() {
            if self.placed.contains_key(&job) {
                continue;
            }
            let spec = view.job(job).expect("open jobs are submitted");
            let start = *self.start_at.entry(job).or_insert_with(|| {
                let Some(model) = fastest_model(fleet, spec, spec.home_site) else {
                    return now;
                };
                let need = slots_needed(fleet, spec.work_hours, model);
                let end = window_end(fleet, spec);
                if now + need >= end {
                    return now;
                }
                let latest = end - need;
                let carbon: Vec<f64> = (now..end)
                    .map(|t| effective_carbon(view, spec, spec.home_site, model, t))
                    .collect();
                let mut prefix = vec![0.0; carbon.len() + 1];
                for (i, c) in carbon.iter().enumerate() {
                    prefix[i + 1] = prefix[i] + c;
                }
                let cost = |s: usize| prefix[s - now + need] - prefix[s - now];
                let now_cost = cost(now);
                let mut best = (0.0, now);
                for s in now + 1..=latest {
                    let saving = now_cost - cost(s);
                    let per_slot = saving / (s - now) as f64;
                    if saving > 1e-9 && per_slot > best.0 {
                        best = (per_slot, s);
                    }
                }
                best.1
            });
            if now < start {
                continue;
            }
            if let Some(model) = take_first_fit(job, spec, spec.home_site, &mut free, &mut runs) {
                self.placed.insert(job, (spec.home_site, model));
            }
        }
        runs
    }
}

/// `surplus-chaser`: the energy-only baseline. Every slot, each job runs at full power at the
/// site with the most forecast surplus left that covers its power, moving there whatever the
/// checkpoint transfer costs (no feasibility domain); with no such site it runs where it is
/// (its home site before its first run).
#[derive(Default)]
pub struct SurplusChaser;

impl Policy for SurplusChaser {
    fn name(&self) -> &str {
        "surplus-chaser"
    }

    fn decide(&mut self, view: &View<'_>) -> Vec<Run> {
        let fleet = view.fleet();
        let now = view.now();
        let mut free = free_gpus(fleet);
        // Surplus left after the idle draw of every GPU.
        let mut left_kw: Vec<f64> = fleet
            .sites
            .iter()
            .enumerate()
            .map(|(s, site)| {
                let idle_w: f64 = fleet
                    .model_names
                    .iter()
                    .enumerate()
                    .map(|(m, name)| f64::from(site.gpus_of(name)) * fleet.models[m].idle_w)
                    .sum();
                view.forecast(s, now).surplus_kw - site.pue * idle_w / 1000.0
            })
            .collect();
        let mut runs = Vec::new();
        for job in view.open_jobs() {
            let spec = view.job(job).expect("open jobs are submitted");
            let location = view.status(job).and_then(|s| s.location);
            let may_run_at = |site: usize| spec.migratable || location.is_none_or(|l| l == site);
            let chase = (0..fleet.sites.len())
                .filter(|&site| may_run_at(site))
                .filter_map(|site| first_fit(spec, site, &free).map(|m| (site, m)))
                .filter(|&(site, m)| left_kw[site] >= extra_kw(fleet, spec, site, m))
                .max_by(|a, b| {
                    // Most surplus left; on a tie, stay put, then the lower site index.
                    left_kw[a.0]
                        .total_cmp(&left_kw[b.0])
                        .then((Some(a.0) == location).cmp(&(Some(b.0) == location)))
                        .then(b.0.cmp(&a.0))
                });
            let choice = chase.or_else(|| {
                let here = location.unwrap_or(spec.home_site);
                first_fit(spec, here, &free).map(|m| (here, m))
            });
            if let Some((site, model)) = choice {
                free[site][model] -= spec.gpus;
                left_kw[site] -= extra_kw(fleet, spec, site, model);
                runs.push(Run {
                    job,
                    site,
                    model,
                    level: 0,
                });
            }
        }
        runs
    }
}
