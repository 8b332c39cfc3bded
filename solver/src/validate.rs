//! The independent validator: re-derives every constraint of formats.md and the plan's emissions
//! from the instance and the plan alone.
//!
//! It is the oracle for every solver test, so it must not share code with the solver's model,
//! heuristic or accounting (it reads only `Instance` and `Plan`). It performs no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::instance::{Instance, Job};
use crate::plan::Plan;

/// Numerical slack allowed on capacities, limits and work.
const TOL: f64 = 1e-6;

/// What `windfall validate` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    /// True when no constraint is violated.
    pub valid: bool,
    /// One message per violation, naming job, site and slot.
    pub violations: Vec<String>,
    /// Recomputed grid emissions, g CO2e.
    pub emissions_g: f64,
    /// Recomputed grid energy, kWh.
    pub grid_energy_kwh: f64,
    /// Recomputed surplus energy used, kWh.
    pub surplus_used_kwh: f64,
    /// Per-site series behind the totals (not printed by `windfall validate --json`).
    #[serde(skip)]
    pub sites: Vec<SiteSeries>,
}

/// One site's recomputed load and energy per slot.
#[derive(Clone, Debug)]
pub struct SiteSeries {
    /// Site id.
    pub site: String,
    /// Total load per slot, kW.
    pub load_kw: Vec<f64>,
    /// Grid import per slot, kW.
    pub grid_kw: Vec<f64>,
    /// Surplus used per slot, kW.
    pub surplus_used_kw: Vec<f64>,
    /// Grid emissions over the horizon, g.
    pub emissions_g: f64,
    /// Grid energy over the horizon, kWh.
    pub grid_energy_kwh: f64,
    /// Surplus energy used over the horizon, kWh.
    pub surplus_used_kwh: f64,
}

struct Run<'a> {
    slot: usize,
    site: &'a str,
    model: &'a str,
    power_w: f64,
}

/// Checks `plan` against `instance` and recomputes its energy and emissions.
pub fn validate(instance: &Instance, plan: &Plan) -> Validation {
    let mut violations = Vec::new();
    let h = f64::from(instance.slot_minutes) / 60.0;
    let slot_s = f64::from(instance.slot_minutes) * 60.0;
    let start = instance.start_utc.0;
    let sites: BTreeMap<&str, usize> = instance
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let jobs: BTreeMap<&str, &Job> = instance.jobs.iter().map(|j| (j.id.as_str(), j)).collect();

    let mut unplanned = BTreeSet::new();
    for entry in &plan.unplanned {
        if !jobs.contains_key(entry.job.as_str()) {
            violations.push(format!("unplanned lists unknown job `{}`", entry.job));
        }
        unplanned.insert(entry.job.as_str());
    }

    // Per job, its runs in slot order; per (site, model, slot), GPUs busy; per (site, slot), GPU power.
    let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    let mut busy: BTreeMap<(usize, &str, usize), u64> = BTreeMap::new();
    let n_sites = instance.sites.len();
    let mut gpu_power_w = vec![vec![0.0_f64; instance.slots]; n_sites];
    let mut extra_kwh = vec![vec![0.0_f64; instance.slots]; n_sites];

    for a in &plan.assignments {
        let Some(job) = jobs.get(a.job.as_str()) else {
            violations.push(format!(
                "assignment names unknown job `{}` (slot {})",
                a.job, a.slot
            ));
            continue;
        };
        let Some(&site_idx) = sites.get(a.site.as_str()) else {
            violations.push(format!(
                "job {}: slot {}: unknown site `{}`",
                a.job, a.slot, a.site
            ));
            continue;
        };
        if unplanned.contains(a.job.as_str()) {
            violations.push(format!(
                "job {}: listed as unplanned but assigned to {} in slot {}",
                a.job, a.site, a.slot
            ));
        }
        if a.slot >= instance.slots {
            violations.push(format!(
                "job {}: slot {} is outside the horizon of {} slots",
                a.job, a.slot, instance.slots
            ));
            continue;
        }
        let slot_start = start + chrono::Duration::seconds((a.slot as f64 * slot_s) as i64);
        let slot_end = slot_start + chrono::Duration::seconds(slot_s as i64);
        if slot_start < job.release_utc.0 {
            violations.push(format!(
                "job {}: slot {} at {} starts before its release {}",
                a.job, a.slot, a.site, job.release_utc
            ));
        }
        if slot_end > job.deadline_utc.0 {
            violations.push(format!(
                "job {}: slot {} at {} ends after its deadline {}",
                a.job, a.slot, a.site, job.deadline_utc
            ));
        }
        let site = &instance.sites[site_idx];
        let allowed = |m: &str| job.gpu_models.is_empty() || job.gpu_models.iter().any(|x| x == m);
        let model: Option<&str> = match &a.gpu_model {
            Some(m) => Some(m.as_str()),
            None => site
                .gpus
                .iter()
                .filter(|(m, n)| **n > 0 && allowed(m))
                .map(|(m, _)| m.as_str())
                .find(|m| {
                    instance.gpu_models[*m]
                        .power_levels_w
                        .iter()
                        .any(|p| (p - a.power_w).abs() < TOL)
                }),
        };
        let Some(model) = model else {
            violations.push(format!(
                "job {}: slot {}: site {} has no allowed GPU model with a {} W level",
                a.job, a.slot, a.site, a.power_w
            ));
            continue;
        };
        if !allowed(model) || site.gpus.get(model).copied().unwrap_or(0) == 0 {
            violations.push(format!(
                "job {}: slot {}: GPU model {} is not allowed for the job or absent at {}",
                a.job, a.slot, model, a.site
            ));
            continue;
        }
        let Some(spec) = instance.gpu_models.get(model) else {
            violations.push(format!(
                "job {}: slot {}: unknown GPU model {model}",
                a.job, a.slot
            ));
            continue;
        };
        if !spec
            .power_levels_w
            .iter()
            .any(|p| (p - a.power_w).abs() < TOL)
        {
            violations.push(format!(
                "job {}: slot {} at {}: {} W is not a power level of {}",
                a.job, a.slot, a.site, a.power_w, model
            ));
            continue;
        }
        *busy.entry((site_idx, model, a.slot)).or_default() += u64::from(job.gpus);
        gpu_power_w[site_idx][a.slot] += f64::from(job.gpus) * (a.power_w - spec.idle_w);
        runs.entry(job.id.as_str()).or_default().push(Run {
            slot: a.slot,
            site: site.id.as_str(),
            model,
            power_w: a.power_w,
        });
    }

    // Capacity per site, model and slot.
    for (&(site_idx, model, slot), &used) in &busy {
        let have = u64::from(
            instance.sites[site_idx]
                .gpus
                .get(model)
                .copied()
                .unwrap_or(0),
        );
        if used > have {
            violations.push(format!(
                "site {}: slot {slot}: {used} {model} GPUs planned but only {have} available",
                instance.sites[site_idx].id
            ));
        }
    }

    // Per job: one place per slot, migrations, feasibility domain and work.
    let mut derived_migrations = Vec::new();
    for job in &instance.jobs {
        if unplanned.contains(job.id.as_str()) {
            continue;
        }
        let mut job_runs = runs.remove(job.id.as_str()).unwrap_or_default();
        job_runs.sort_by_key(|r| r.slot);
        for pair in job_runs.windows(2) {
            if pair[0].slot == pair[1].slot {
                violations.push(format!(
                    "job {}: slot {}: placed twice ({} and {})",
                    job.id, pair[0].slot, pair[0].site, pair[1].site
                ));
            }
        }
        let mut previous_site: Option<&str> = job.current_site.as_deref();
        let mut lost_until_s: Option<(usize, f64)> = None; // (migration slot, transfer seconds)
        let mut progress_h = 0.0;
        for (i, run) in job_runs.iter().enumerate() {
            if let Some(prev) = previous_site
                && prev != run.site
            {
                let link = link_gbps(instance, prev, run.site);
                let transfer_s = job.save_s + 8.0 * job.checkpoint_gb / link + job.restore_s;
                let last_here = job_runs[i..]
                    .iter()
                    .take_while(|r| r.site == run.site)
                    .last()
                    .map(|r| r.slot)
                    .unwrap_or(run.slot);
                let window_slots = last_here - run.slot + 1;
                if !job.migratable {
                    violations.push(format!(
                        "job {}: slot {}: moves from {prev} to {} but is not migratable",
                        job.id, run.slot, run.site
                    ));
                }
                if transfer_s > instance.params.alpha * window_slots as f64 * slot_s + TOL {
                    violations.push(format!(
                        "job {}: slot {}: migration {prev} -> {} takes {transfer_s:.1} s but stays only {window_slots} slot(s); the feasibility domain needs transfer_s <= {} x window",
                        job.id, run.slot, run.site, instance.params.alpha
                    ));
                }
                let transfer_kwh = instance.params.transfer_kwh_per_gb * job.checkpoint_gb;
                extra_kwh[sites[prev]][run.slot] += transfer_kwh;
                extra_kwh[sites[run.site]][run.slot] += transfer_kwh;
                derived_migrations.push((
                    job.id.as_str(),
                    prev,
                    run.site,
                    run.slot,
                    transfer_s,
                    window_slots,
                ));
                lost_until_s = Some((run.slot, transfer_s));
            }
            previous_site = Some(run.site);
            let spec = &instance.gpu_models[run.model];
            let level = spec
                .power_levels_w
                .iter()
                .position(|p| (p - run.power_w).abs() < TOL)
                .expect("level checked above");
            let mut effective_h = h;
            if let Some((mig_slot, transfer_s)) = lost_until_s {
                let elapsed_s = (run.slot - mig_slot) as f64 * slot_s;
                let lost_s = (transfer_s - elapsed_s).clamp(0.0, slot_s);
                effective_h -= lost_s / 3600.0;
            }
            progress_h += effective_h * spec.speed * spec.throughput[level];
        }
        // A deadline past the horizon requires the horizon's pro-rata share of the work.
        let horizon_end =
            start + chrono::Duration::seconds((instance.slots as f64 * slot_s) as i64);
        let required_h = if job.deadline_utc.0 <= horizon_end {
            job.work_hours
        } else {
            let from = job.release_utc.0.max(start);
            let inside_s = (horizon_end - from).num_seconds().max(0) as f64;
            let whole_s = (job.deadline_utc.0 - from).num_seconds().max(1) as f64;
            job.work_hours * inside_s / whole_s
        };
        if progress_h + TOL < required_h {
            let what = if required_h < job.work_hours {
                "work hours required inside the horizon (its deadline lies past it)"
            } else {
                "work hours before its deadline"
            };
            violations.push(format!(
                "job {}: plan completes {progress_h:.4} of {required_h:.4} {what}",
                job.id
            ));
        }
    }
    // Listed migrations must be exactly the derived ones.
    let listed: BTreeSet<(&str, &str, &str, usize)> = plan
        .migrations
        .iter()
        .map(|m| (m.job.as_str(), m.from.as_str(), m.to.as_str(), m.slot))
        .collect();
    for &(job, from, to, slot, transfer_s, window_slots) in &derived_migrations {
        match plan
            .migrations
            .iter()
            .find(|m| m.job == job && m.from == from && m.to == to && m.slot == slot)
        {
            None => violations.push(format!(
                "job {job}: slot {slot}: moves {from} -> {to} but the plan lists no such migration"
            )),
            Some(m) => {
                if (m.transfer_s - transfer_s).abs() > 1e-3 || m.window_slots != window_slots {
                    violations.push(format!(
                        "job {job}: slot {slot}: migration lists transfer_s={} window_slots={} but the assignments give {transfer_s:.3} and {window_slots}",
                        m.transfer_s, m.window_slots
                    ));
                }
            }
        }
    }
    let derived: BTreeSet<(&str, &str, &str, usize)> = derived_migrations
        .iter()
        .map(|&(j, f, t, s, _, _)| (j, f, t, s))
        .collect();
    for entry in listed.difference(&derived) {
        violations.push(format!(
            "job {}: slot {}: migration {} -> {} is listed but the assignments do not move the job",
            entry.0, entry.3, entry.1, entry.2
        ));
    }

    // Power balance, grid limit and emissions.
    let mut emissions_g = 0.0;
    let mut grid_energy_kwh = 0.0;
    let mut surplus_used_kwh = 0.0;
    let mut site_series = Vec::with_capacity(n_sites);
    for (site_idx, site) in instance.sites.iter().enumerate() {
        let mut series = SiteSeries {
            site: site.id.clone(),
            load_kw: Vec::with_capacity(instance.slots),
            grid_kw: Vec::with_capacity(instance.slots),
            surplus_used_kw: Vec::with_capacity(instance.slots),
            emissions_g: 0.0,
            grid_energy_kwh: 0.0,
            surplus_used_kwh: 0.0,
        };
        let idle_all_w: f64 = site
            .gpus
            .iter()
            .map(|(m, &n)| f64::from(n) * instance.gpu_models[m].idle_w)
            .sum();
        for slot in 0..instance.slots {
            let load_kw = site.pue * (idle_all_w + gpu_power_w[site_idx][slot]) / 1000.0
                + extra_kwh[site_idx][slot] / h;
            let surplus_kw = load_kw.min(site.surplus_kw[slot]);
            let grid_kw = load_kw - surplus_kw;
            if let Some(limit) = site.grid_limit_kw
                && grid_kw > limit + TOL
            {
                violations.push(format!(
                    "site {}: slot {slot}: grid import {grid_kw:.3} kW exceeds its limit of {limit} kW",
                    site.id
                ));
            }
            series.load_kw.push(load_kw);
            series.grid_kw.push(grid_kw);
            series.surplus_used_kw.push(surplus_kw);
            series.emissions_g += grid_kw * h * site.carbon_g_per_kwh[slot];
            series.grid_energy_kwh += grid_kw * h;
            series.surplus_used_kwh += surplus_kw * h;
        }
        emissions_g += series.emissions_g;
        grid_energy_kwh += series.grid_energy_kwh;
        surplus_used_kwh += series.surplus_used_kwh;
        site_series.push(series);
    }

    Validation {
        valid: violations.is_empty(),
        violations,
        emissions_g,
        grid_energy_kwh,
        surplus_used_kwh,
        sites: site_series,
    }
}

fn link_gbps(instance: &Instance, a: &str, b: &str) -> f64 {
    if let Some(v) = instance.links_gbps.get(a).and_then(|row| row.get(b)) {
        return *v;
    }
    if let Some(v) = instance.links_gbps.get(b).and_then(|row| row.get(a)) {
        return *v;
    }
    let wan = |id: &str| {
        instance
            .sites
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.wan_gbps)
            .unwrap_or(f64::INFINITY)
    };
    wan(a).min(wan(b))
}
