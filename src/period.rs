//! Period reports (`windfall report`, dashboard downloads): emissions and energy by site, user and
//! day over `[from, to)`, against the run-now baseline, with the method stated.
//!
//! Owns stitching stored plans into one account of a period: each slot is taken from the plan in
//! force when it began (the newest plan created at or before its start that covers it; a slot
//! no plan was made before takes the newest plan covering it). Every energy and emission figure
//! comes from the independent validator's per-site series of that plan and from the solver's
//! per-job attribution; nothing here re-implements accounting. Must not write to the store.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;
use windfall_solver::{Instance, baseline_plan, job_emissions_g, validate};

use crate::db::Store;

/// Emissions and energy of one group (a site-day, a user-day, or a total).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Planned grid emissions, kg CO2e.
    pub emissions_kg: f64,
    /// Run-now baseline emissions of the same jobs, kg CO2e.
    pub baseline_kg: f64,
    /// Grid energy, kWh (site rows and totals).
    pub grid_kwh: f64,
    /// Surplus energy absorbed, kWh (site rows and totals).
    pub surplus_kwh: f64,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.emissions_kg += other.emissions_kg;
        self.baseline_kg += other.baseline_kg;
        self.grid_kwh += other.grid_kwh;
        self.surplus_kwh += other.surplus_kwh;
    }

    /// Change against the baseline, percent (negative = less carbon).
    pub fn change_pct(&self) -> f64 {
        if self.baseline_kg > 0.0 {
            100.0 * (self.emissions_kg - self.baseline_kg) / self.baseline_kg
        } else {
            0.0
        }
    }
}

/// A period report.
#[derive(Clone, Debug, Serialize)]
pub struct PeriodReport {
    /// Start of the period.
    pub from_utc: DateTime<Utc>,
    /// End of the period.
    pub to_utc: DateTime<Utc>,
    /// Plans whose slots the report uses.
    pub plan_ids: Vec<i64>,
    /// Slots covered by some plan.
    pub slots_covered: usize,
    /// Totals over the period.
    pub total: Figures,
    /// By site and day.
    pub by_site_day: BTreeMap<String, BTreeMap<NaiveDate, Figures>>,
    /// By job owner and day (jobs submitted without an owner count as `-`).
    pub by_user_day: BTreeMap<String, BTreeMap<NaiveDate, Figures>>,
    /// How the figures are made.
    pub method: String,
}

impl PeriodReport {
    /// Builds the report for `[from, to)` from the stored plans.
    pub async fn build(store: &Store, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Self> {
        if to <= from {
            bail!("--to must be after --from");
        }
        let summaries = store.plan_summaries().await?;
        // Slot start -> (plan id, slot index), per the "plan in force" rule.
        let mut chosen: BTreeMap<DateTime<Utc>, (i64, usize)> = BTreeMap::new();
        let mut created_by: BTreeMap<DateTime<Utc>, bool> = BTreeMap::new();
        for p in summaries.iter().rev() {
            // Oldest first: a newer plan replaces an older one where the rule prefers it.
            let slot = Duration::minutes(i64::from(p.slot_minutes));
            for i in 0..p.slots {
                let t = p.horizon_start_utc + slot * i as i32;
                if t + slot <= from || t >= to {
                    continue;
                }
                let made_before = p.created_utc <= t;
                let had_made_before = created_by.get(&t).copied().unwrap_or(false);
                if made_before || !had_made_before {
                    chosen.insert(t, (p.id, i));
                    created_by.insert(t, made_before || had_made_before);
                }
            }
        }
        let mut by_plan: BTreeMap<i64, Vec<(DateTime<Utc>, usize)>> = BTreeMap::new();
        for (t, (id, i)) in &chosen {
            by_plan.entry(*id).or_default().push((*t, *i));
        }
        let mut report = PeriodReport {
            from_utc: from,
            to_utc: to,
            plan_ids: by_plan.keys().copied().collect(),
            slots_covered: chosen.len(),
            total: Figures::default(),
            by_site_day: BTreeMap::new(),
            by_user_day: BTreeMap::new(),
            method: String::new(),
        };
        let owners: BTreeMap<String, String> = store
            .jobs(None)
            .await?
            .into_iter()
            .map(|j| (j.id, j.owner.unwrap_or_else(|| "-".to_string())))
            .collect();
        let mut signals = std::collections::BTreeSet::new();
        let mut sources = std::collections::BTreeSet::new();
        let mut pues = BTreeMap::new();
        for (id, slots) in &by_plan {
            let record = store
                .plan(*id)
                .await?
                .with_context(|| format!("plan {id} disappeared while reporting"))?;
            let instance = Instance::from_json(&record.instance_json)
                .with_context(|| format!("plan {id}: stored instance"))?;
            let planned = validate(&instance, &record.plan);
            let baseline = baseline_plan(&instance);
            let baseline_check = validate(&instance, &baseline);
            let h = f64::from(record.slot_minutes) / 60.0;
            for p in &record.provenance {
                signals.insert(p.carbon_signal.clone());
                sources.extend(p.sources.iter().cloned());
            }
            for (site, (series, base)) in instance
                .sites
                .iter()
                .zip(planned.sites.iter().zip(&baseline_check.sites))
            {
                pues.insert(site.id.clone(), site.pue);
                for (t, i) in slots {
                    let carbon = site.carbon_g_per_kwh[*i];
                    let row = Figures {
                        emissions_kg: series.grid_kw[*i] * h * carbon / 1000.0,
                        baseline_kg: base.grid_kw[*i] * h * carbon / 1000.0,
                        grid_kwh: series.grid_kw[*i] * h,
                        surplus_kwh: series.surplus_used_kw[*i] * h,
                    };
                    report.total.add(&row);
                    report
                        .by_site_day
                        .entry(site.id.clone())
                        .or_default()
                        .entry(t.date_naive())
                        .or_default()
                        .add(&row);
                }
            }
            let index: BTreeMap<usize, DateTime<Utc>> =
                slots.iter().map(|(t, i)| (*i, *t)).collect();
            let job_planned = job_emissions_g(&instance, &record.plan);
            let job_baseline = job_emissions_g(&instance, &baseline);
            for job in &instance.jobs {
                let owner = owners
                    .get(&job.id)
                    .cloned()
                    .unwrap_or_else(|| "-".to_string());
                let mut add = |list: Option<&Vec<(usize, f64)>>, baseline: bool| {
                    for (slot, g) in list.map(Vec::as_slice).unwrap_or_default() {
                        if let Some(t) = index.get(slot) {
                            let cell = report
                                .by_user_day
                                .entry(owner.clone())
                                .or_default()
                                .entry(t.date_naive())
                                .or_default();
                            if baseline {
                                cell.baseline_kg += g / 1000.0;
                            } else {
                                cell.emissions_kg += g / 1000.0;
                            }
                        }
                    }
                };
                add(job_planned.get(&job.id), false);
                add(job_baseline.get(&job.id), true);
            }
        }
        let pue: Vec<String> = pues.iter().map(|(s, p)| format!("{s} {p}")).collect();
        report.method = format!(
            "Each slot of the period is taken from the plan in force when it began (the newest plan \
             made at or before its start that covers it; slots no plan was made before come from \
             the newest plan covering them). Site figures: grid energy x grid carbon intensity per \
             site and slot, recomputed from the stored plan by the independent validator; surplus \
             (curtailed renewable) energy counts as zero operational emissions; site load = PUE x \
             (GPU power at the planned caps + idle power of GPUs running no job) plus checkpoint \
             transfer energy. User figures: each job's share (its own GPU power, PUE included), \
             so they exclude idle power and may sum to less than the site figures. Baseline \
             (run-now): each job starts as soon as it is released, at its home site, at full \
             power, first fit; accounted on the same signals. Carbon signal: {}. Data sources: {}. \
             PUE: {}. Figures are planned, not metered.",
            if signals.is_empty() {
                "none".to_string()
            } else {
                signals.into_iter().collect::<Vec<_>>().join(", ")
            },
            if sources.is_empty() {
                "none".to_string()
            } else {
                sources.into_iter().collect::<Vec<_>>().join(", ")
            },
            if pue.is_empty() {
                "-".to_string()
            } else {
                pue.join(", ")
            },
        );
        Ok(report)
    }

    /// JSON.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }

    /// CSV: one row per site-day and user-day, then the total.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "group,key,day,emissions_kg,baseline_kg,change_pct,grid_kwh,surplus_kwh\n",
        );
        let mut row = |group: &str, key: &str, day: &str, f: &Figures| {
            let _ = writeln!(
                out,
                "{group},{},{day},{:.6},{:.6},{:.3},{:.6},{:.6}",
                csv_field(key),
                f.emissions_kg,
                f.baseline_kg,
                f.change_pct(),
                f.grid_kwh,
                f.surplus_kwh
            );
        };
        for (site, days) in &self.by_site_day {
            for (day, f) in days {
                row("site", site, &day.to_string(), f);
            }
        }
        for (user, days) in &self.by_user_day {
            for (day, f) in days {
                row("user", user, &day.to_string(), f);
            }
        }
        row("total", "all", "", &self.total);
        out
    }

    /// Markdown.
    pub fn markdown(&self) -> String {
        let t = &self.total;
        let mut out = format!(
            "# windfall report {} to {}\n\n\
             Plans used: {}. Slots covered: {}.\n\n\
             | | value |\n|---|---:|\n\
             | emissions | {:.3} kg CO2e |\n| run-now baseline | {:.3} kg CO2e |\n\
             | change | {:+.1} % |\n| grid energy | {:.1} kWh |\n| surplus absorbed | {:.1} kWh |\n\n",
            self.from_utc.format("%Y-%m-%d %H:%M UTC"),
            self.to_utc.format("%Y-%m-%d %H:%M UTC"),
            if self.plan_ids.is_empty() {
                "none".to_string()
            } else {
                self.plan_ids
                    .iter()
                    .map(|i| format!("#{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            self.slots_covered,
            t.emissions_kg,
            t.baseline_kg,
            t.change_pct(),
            t.grid_kwh,
            t.surplus_kwh,
        );
        out.push_str("## By site and day\n\n| site | day | kg CO2e | baseline kg | change | grid kWh | surplus kWh |\n|---|---|---:|---:|---:|---:|---:|\n");
        for (site, days) in &self.by_site_day {
            for (day, f) in days {
                let _ = writeln!(
                    out,
                    "| {site} | {day} | {:.3} | {:.3} | {:+.1} % | {:.1} | {:.1} |",
                    f.emissions_kg,
                    f.baseline_kg,
                    f.change_pct(),
                    f.grid_kwh,
                    f.surplus_kwh
                );
            }
        }
        out.push_str("\n## By user and day\n\n| user | day | kg CO2e | baseline kg | change |\n|---|---|---:|---:|---:|\n");
        for (user, days) in &self.by_user_day {
            for (day, f) in days {
                let _ = writeln!(
                    out,
                    "| {user} | {day} | {:.3} | {:.3} | {:+.1} % |",
                    f.emissions_kg,
                    f.baseline_kg,
                    f.change_pct()
                );
            }
        }
        let _ = write!(out, "\n## Method\n\n{}\n", self.method);
        out
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}
