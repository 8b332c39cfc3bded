//! Plan reports: the terminal summary and the self-contained HTML report (inline SVG charts, no
//! scripts, no network fetches).
//!
//! Owns presentation only. Every number comes from the solver's metrics or the independent
//! validator's recomputation of the stored plan; nothing here recomputes accounting.

use std::fmt::Write as _;

use chrono::Duration;
use windfall_solver::{Instance, Validation};

use crate::model::PlanRecord;

/// Figures shown in the summary and the report, derived from a stored plan.
pub struct PlanFigures<'a> {
    /// The stored plan.
    pub record: &'a PlanRecord,
    /// The instance it solved.
    pub instance: &'a Instance,
    /// The validator's recomputation.
    pub validation: &'a Validation,
}

impl PlanFigures<'_> {
    fn reduction_pct(&self) -> f64 {
        let base = self.record.metrics.baseline_emissions_g;
        if base > 0.0 {
            100.0 * (base - self.validation.emissions_g) / base
        } else {
            0.0
        }
    }

    fn surplus_share_pct(&self) -> f64 {
        let available = self.record.metrics.surplus_available_kwh;
        if available > 0.0 {
            100.0 * self.validation.surplus_used_kwh / available
        } else {
            0.0
        }
    }

    fn jobs_planned(&self) -> usize {
        self.instance.jobs.len() - self.record.metrics.infeasible_jobs.len()
    }

    /// The terminal summary.
    pub fn summary(&self) -> String {
        let m = &self.record.metrics;
        let v = self.validation;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plan #{} for {} + {} h ({}-minute slots), {} sites, {} jobs",
            self.record.id,
            self.record.horizon_start_utc.format("%Y-%m-%d %H:%M UTC"),
            self.record.slots as u32 * self.record.slot_minutes / 60,
            self.record.slot_minutes,
            self.instance.sites.len(),
            self.instance.jobs.len()
        );
        let _ = writeln!(
            out,
            "  emissions      {:>10.2} kg CO2e   run-now baseline {:.2} kg   change {:+.1} %",
            v.emissions_g / 1000.0,
            m.baseline_emissions_g / 1000.0,
            -self.reduction_pct()
        );
        let _ = writeln!(
            out,
            "  surplus used   {:>10.1} kWh       of {:.1} kWh available ({:.1} %)",
            v.surplus_used_kwh,
            m.surplus_available_kwh,
            self.surplus_share_pct()
        );
        let _ = writeln!(
            out,
            "  grid energy    {:>10.1} kWh in total",
            v.grid_energy_kwh
        );
        for site in &v.sites {
            let _ = writeln!(
                out,
                "    {:<16} {:>8.1} kWh grid  {:>8.1} kWh surplus  {:>8.2} kg CO2e",
                site.site,
                site.grid_energy_kwh,
                site.surplus_used_kwh,
                site.emissions_g / 1000.0
            );
        }
        let _ = writeln!(
            out,
            "  jobs on time   {} of {} planned to finish before their deadline{}",
            self.jobs_planned(),
            self.instance.jobs.len(),
            if v.valid {
                " (validated)"
            } else {
                " (VALIDATION FAILED)"
            }
        );
        for entry in &m.infeasible_jobs {
            let _ = writeln!(out, "    infeasible {}: {}", entry.job, entry.reason);
        }
        let _ = writeln!(
            out,
            "  migrations     {}",
            self.record.plan.migrations.len()
        );
        let _ = writeln!(
            out,
            "  solver         {} | status {} | lower bound {:.2} kg | gap {:.2} % | {:.1} s",
            m.method,
            m.status,
            m.lower_bound_g / 1000.0,
            100.0 * m.gap,
            m.solve_seconds
        );
        for reason in crate::model::degraded_reasons(&self.record.provenance) {
            let _ = writeln!(out, "  DEGRADED       {reason}");
        }
        for violation in v.violations.iter().take(10) {
            let _ = writeln!(out, "  violation: {violation}");
        }
        out
    }

    /// The self-contained HTML report.
    pub fn html(&self) -> String {
        let m = &self.record.metrics;
        let v = self.validation;
        let mut html = String::new();
        let _ = write!(
            html,
            r#"<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>windfall plan #{id}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#1d2733}}
h1{{font-size:1.5rem}} h2{{font-size:1.15rem;margin-top:2rem}}
.kpis{{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:.75rem}}
.kpi{{border:1px solid #d5dde5;border-radius:8px;padding:.75rem}}
.kpi b{{display:block;font-size:1.4rem}}
table{{border-collapse:collapse;width:100%;font-size:.9rem}} td,th{{border-bottom:1px solid #e3e8ee;padding:.3rem .5rem;text-align:right}}
td:first-child,th:first-child{{text-align:left}} .muted{{color:#5b6b7b;font-size:.85rem}}
svg{{width:100%;height:auto;background:#fbfcfd;border:1px solid #e3e8ee;border-radius:6px}}
</style></head><body>
<h1>windfall plan #{id}</h1>
<p class="muted">Horizon {start} + {hours} h in {slot}-minute slots · {n_sites} sites · {n_jobs} jobs · method: {method} · status: {status}</p>
<div class="kpis">
<div class="kpi">Emissions<b>{em:.2} kg CO2e</b>{red:+.1} % vs run-now ({base:.2} kg)</div>
<div class="kpi">Surplus absorbed<b>{sur:.1} kWh</b>{share:.1} % of {avail:.1} kWh available</div>
<div class="kpi">Grid energy<b>{grid:.1} kWh</b>all sites</div>
<div class="kpi">Jobs on time<b>{planned} / {n_jobs}</b>{infeasible} infeasible</div>
<div class="kpi">Migrations<b>{migs}</b>checkpoint moves</div>
<div class="kpi">Optimality gap<b>{gap:.2} %</b>lower bound {lb:.2} kg</div>
</div>
"#,
            id = self.record.id,
            start = self.record.horizon_start_utc.format("%Y-%m-%d %H:%M UTC"),
            hours = self.record.slots as u32 * self.record.slot_minutes / 60,
            slot = self.record.slot_minutes,
            n_sites = self.instance.sites.len(),
            n_jobs = self.instance.jobs.len(),
            method = escape(&m.method),
            status = escape(&m.status),
            em = v.emissions_g / 1000.0,
            red = -self.reduction_pct(),
            base = m.baseline_emissions_g / 1000.0,
            sur = v.surplus_used_kwh,
            share = self.surplus_share_pct(),
            avail = m.surplus_available_kwh,
            grid = v.grid_energy_kwh,
            planned = self.jobs_planned(),
            infeasible = m.infeasible_jobs.len(),
            migs = self.record.plan.migrations.len(),
            gap = 100.0 * m.gap,
            lb = m.lower_bound_g / 1000.0,
        );
        html.push_str("<h2>Sites</h2><table><tr><th>site</th><th>zone</th><th>GPUs</th><th>grid kWh</th><th>surplus kWh</th><th>kg CO2e</th></tr>");
        for (site, series) in self.instance.sites.iter().zip(&v.sites) {
            let gpus: Vec<String> = site.gpus.iter().map(|(m, n)| format!("{n}× {m}")).collect();
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.2}</td></tr>",
                escape(&site.id),
                escape(site.zone.as_deref().unwrap_or("")),
                escape(&gpus.join(", ")),
                series.grid_energy_kwh,
                series.surplus_used_kwh,
                series.emissions_g / 1000.0
            );
        }
        html.push_str("</table>");
        for (site, series) in self.instance.sites.iter().zip(&v.sites) {
            let _ = write!(
                html,
                "<h2>{} — load, surplus and carbon</h2>",
                escape(&site.id)
            );
            html.push_str(&site_chart(self, site, series));
        }
        html.push_str("<h2>Schedule</h2>");
        html.push_str(&gantt(self));
        if !m.infeasible_jobs.is_empty() {
            html.push_str("<h2>Infeasible jobs</h2><table><tr><th>job</th><th>reason</th></tr>");
            for entry in &m.infeasible_jobs {
                let _ = write!(
                    html,
                    "<tr><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
                    escape(&entry.job),
                    escape(&entry.reason)
                );
            }
            html.push_str("</table>");
        }
        if !self.record.plan.migrations.is_empty() {
            html.push_str("<h2>Migrations</h2><table><tr><th>job</th><th>from</th><th>to</th><th>slot</th><th>transfer s</th><th>window slots</th></tr>");
            for mig in &self.record.plan.migrations {
                let _ = write!(
                    html,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td></tr>",
                    escape(&mig.job),
                    escape(&mig.from),
                    escape(&mig.to),
                    mig.slot,
                    mig.transfer_s,
                    mig.window_slots
                );
            }
            html.push_str("</table>");
        }
        html.push_str("<h2>Method</h2><p class=\"muted\">");
        let _ = write!(
            html,
            "Emissions are grid energy × grid carbon intensity per site and slot; surplus (curtailed renewable) energy counts as zero operational emissions. \
             Site load = PUE × (GPU power at the planned caps + idle power of GPUs running no job), plus checkpoint transfer energy. \
             Baseline (run-now): each job starts as soon as it is released, at its home site, at full power. \
             Carbon signal: {}. Signals: {}. All figures are recomputed from the stored plan by the independent validator.",
            self.instance
                .sites
                .first()
                .map_or("average", |s| match s.carbon_signal {
                    windfall_solver::CarbonSignal::Average => "average",
                    windfall_solver::CarbonSignal::Marginal => "marginal",
                }),
            escape(
                &self
                    .record
                    .provenance
                    .iter()
                    .flat_map(|p| p.sources.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
        html.push_str("</p></body></html>\n");
        html
    }
}

pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 1000.0;
const H: f64 = 220.0;
const LEFT: f64 = 50.0;
const RIGHT: f64 = 50.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

fn polyline(values: &[f64], max: f64, color: &str, dash: &str, width: f64) -> String {
    let n = values.len().max(1);
    let step = (W - LEFT - RIGHT) / n as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .flat_map(|(i, &v)| {
            let y = TOP + (H - TOP - BOTTOM) * (1.0 - v / max);
            let x0 = LEFT + step * i as f64;
            [
                format!("{x0:.1},{y:.1}"),
                format!("{:.1},{y:.1}", x0 + step),
            ]
        })
        .collect();
    format!(
        r#"<polyline fill="none" stroke="{color}" stroke-width="{width}" stroke-opacity="0.85" stroke-dasharray="{dash}" points="{}"/>"#,
        points.join(" ")
    )
}

fn time_axis(figures: &PlanFigures, n: usize) -> String {
    let mut svg = String::new();
    let step = (W - LEFT - RIGHT) / n.max(1) as f64;
    let slot = Duration::minutes(i64::from(figures.record.slot_minutes));
    let every = (n / 8).max(1);
    for i in (0..=n).step_by(every) {
        let x = LEFT + step * i as f64;
        let t = figures.record.horizon_start_utc + slot * i as i32;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#e3e8ee"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle" fill="#5b6b7b">{}</text>"##,
            H - BOTTOM,
            H - 10.0,
            t.format("%d %H:%M")
        );
    }
    svg
}

pub(crate) fn site_chart(
    figures: &PlanFigures,
    site: &windfall_solver::Site,
    series: &windfall_solver::SiteSeries,
) -> String {
    let n = series.load_kw.len();
    let max_kw = series
        .load_kw
        .iter()
        .chain(&site.surplus_kw)
        .copied()
        .fold(1.0, f64::max)
        * 1.1;
    let max_ci = site.carbon_g_per_kwh.iter().copied().fold(1.0, f64::max) * 1.1;
    let mut svg = format!(
        r#"<svg viewBox="0 0 {W} {H}" role="img" aria-label="{} timeline">"#,
        escape(&site.id)
    );
    svg.push_str(&time_axis(figures, n));
    // Surplus available as a filled step area.
    let step = (W - LEFT - RIGHT) / n.max(1) as f64;
    let mut area = format!("M{LEFT},{}", H - BOTTOM);
    for (i, &s) in site.surplus_kw.iter().enumerate() {
        let y = TOP + (H - TOP - BOTTOM) * (1.0 - s / max_kw);
        let _ = write!(
            area,
            " L{:.1},{y:.1} L{:.1},{y:.1}",
            LEFT + step * i as f64,
            LEFT + step * (i + 1) as f64
        );
    }
    let _ = write!(area, " L{:.1},{} Z", W - RIGHT, H - BOTTOM);
    let _ = write!(
        svg,
        r##"<path d="{area}" fill="#8fd19e" fill-opacity="0.55"/>"##
    );
    // Grid import under the load: where no surplus is used they coincide, and the load stays
    // visible on top.
    svg.push_str(&polyline(&series.grid_kw, max_kw, "#c0392b", "", 4.0));
    svg.push_str(&polyline(&series.load_kw, max_kw, "#1f5fbf", "", 1.6));
    svg.push_str(&polyline(
        &site.carbon_g_per_kwh,
        max_ci,
        "#6b6b6b",
        "4 3",
        1.6,
    ));
    let _ = write!(
        svg,
        r##"<text x="6" y="{TOP}" font-size="11" dy="10" fill="#1d2733">{max_kw:.0} kW</text><text x="{}" y="{TOP}" font-size="11" dy="10" text-anchor="end" fill="#6b6b6b">{max_ci:.0} g/kWh</text>"##,
        W - 4.0
    );
    let legend = [
        ("#8fd19e", "surplus available"),
        ("#1f5fbf", "planned load"),
        ("#c0392b", "grid import"),
        ("#6b6b6b", "carbon intensity (right axis)"),
    ];
    for (i, (color, label)) in legend.iter().enumerate() {
        let x = LEFT + 10.0 + 190.0 * i as f64;
        let _ = write!(
            svg,
            r##"<rect x="{x}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}" font-size="11" fill="#1d2733">{label}</text>"##,
            TOP + 2.0,
            x + 14.0,
            TOP + 11.0
        );
    }
    svg.push_str("</svg>");
    svg
}

fn gantt(figures: &PlanFigures) -> String {
    let colors = [
        "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    ];
    let site_color = |id: &str| {
        let i = figures
            .instance
            .sites
            .iter()
            .position(|s| s.id == id)
            .unwrap_or(0);
        colors[i % colors.len()]
    };
    let mut jobs: Vec<&str> = figures
        .record
        .plan
        .assignments
        .iter()
        .map(|a| a.job.as_str())
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    let row_h = 6.0;
    let n = figures.record.slots;
    let height = TOP + BOTTOM + row_h * jobs.len().max(1) as f64 + 20.0;
    let step = (W - LEFT - RIGHT) / n.max(1) as f64;
    let mut svg = format!(r#"<svg viewBox="0 0 {W} {height}" role="img" aria-label="schedule">"#);
    for (i, site) in figures.instance.sites.iter().enumerate() {
        let x = LEFT + 150.0 * i as f64;
        let _ = write!(
            svg,
            r##"<rect x="{x}" y="2" width="10" height="10" fill="{}"/><text x="{}" y="11" font-size="11">{}</text>"##,
            site_color(&site.id),
            x + 14.0,
            escape(&site.id)
        );
    }
    for a in &figures.record.plan.assignments {
        let row = jobs.binary_search(&a.job.as_str()).unwrap_or(0);
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} slot {} at {} ({} W)</title></rect>"#,
            LEFT + step * a.slot as f64,
            TOP + 8.0 + row_h * row as f64,
            step,
            row_h - 1.0,
            site_color(&a.site),
            escape(&a.job),
            a.slot,
            escape(&a.site),
            a.power_w
        );
    }
    svg.push_str("</svg><p class=\"muted\">One row per job; colour = site. Hover a block for its power cap.</p>");
    svg
}
