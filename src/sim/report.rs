//! The simulator's outputs for people: a comparison table and a Markdown report with SVG
//! charts (cumulative emissions per policy, surplus used against available, completion times).
//!
//! Owns formatting only; the numbers come from [`Outcome`]s unchanged. It writes files only in
//! [`write_report`].

use std::fmt::Write as _;
use std::path::Path;

use super::{Outcome, Scenario};

/// Colours of the policies' lines, in order.
const COLOURS: [&str; 8] = [
    "#7f7f7f", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#2ca02c", "#d62728", "#17becf",
];

/// A plain-text table of the outcomes, one row per policy.
pub fn table(outcomes: &[Outcome]) -> String {
    let base = outcomes
        .iter()
        .find(|o| o.metrics.policy == "run-now")
        .map(|o| o.metrics.emissions_kg);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | emissions kg | vs run-now | surplus used kWh | grid kWh | completed | deadline misses | migrations | GB moved | mean completion h | GPU util | wall s |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for o in outcomes {
        let m = &o.metrics;
        let versus = match base {
            Some(b) if b > 0.0 => format!("{:.3}", m.emissions_kg / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} | {} | {:.0} | {:.0} | {}/{} | {} | {} | {:.0} | {:.1} | {:.1} % | {:.1} |",
            m.policy,
            m.emissions_kg,
            versus,
            m.surplus_used_kwh,
            m.grid_energy_kwh,
            m.completed,
            m.jobs,
            m.deadline_misses,
            m.migrations,
            m.gb_moved,
            m.mean_completion_hours,
            m.gpu_utilisation * 100.0,
            m.wall_seconds
        );
    }
    out
}

/// Writes `report.md` and its charts into `dir` (created if needed).
pub fn write_report(
    dir: &Path,
    scenario: &Scenario,
    forecasts: &str,
    outcomes: &[Outcome],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let fleet = &scenario.fleet;
    let h = fleet.slot_hours();
    let cumulative: Vec<(String, Vec<f64>)> = outcomes
        .iter()
        .map(|o| {
            let mut total = 0.0;
            let series = o
                .series
                .emissions_kg
                .iter()
                .map(|e| {
                    total += e;
                    total
                })
                .collect();
            (o.metrics.policy.clone(), series)
        })
        .collect();
    std::fs::write(
        dir.join("emissions.svg"),
        line_chart(
            "Cumulative grid emissions, kg CO2e",
            "hours",
            h,
            &cumulative,
        ),
    )?;
    let surplus: Vec<(String, f64, f64)> = outcomes
        .iter()
        .map(|o| {
            (
                o.metrics.policy.clone(),
                o.metrics.surplus_used_kwh,
                o.metrics.surplus_available_kwh,
            )
        })
        .collect();
    std::fs::write(dir.join("surplus.svg"), surplus_chart(&surplus))?;
    let delays: Vec<(String, f64, f64)> = outcomes
        .iter()
        .map(|o| {
            (
                o.metrics.policy.clone(),
                o.metrics.mean_completion_hours,
                o.metrics.p95_completion_hours,
            )
        })
        .collect();
    std::fs::write(dir.join("completion.svg"), completion_chart(&delays))?;

    let mut md = String::new();
    let _ = writeln!(md, "# Simulation: {}\n", scenario.name);
    let _ = writeln!(
        md,
        "{} sites, {} jobs, {} slots of {} minutes from {}. Forecasts seen by the policies: {}; the oracle sees the actuals. Emissions are grid emissions on the actual signals.\n",
        fleet.sites.len(),
        scenario.jobs.len(),
        fleet.slots,
        fleet.slot_minutes,
        fleet.start_utc.to_rfc3339(),
        forecasts
    );
    let _ = writeln!(md, "{}", table(outcomes));
    let _ = writeln!(md, "![Cumulative emissions](emissions.svg)\n");
    let _ = writeln!(md, "![Surplus used and available](surplus.svg)\n");
    let _ = writeln!(md, "![Completion times](completion.svg)\n");
    let _ = writeln!(md, "## Per site\n");
    let _ = writeln!(
        md,
        "| policy | site | energy kWh | surplus used kWh | surplus available kWh | grid kWh | emissions kg | GPU util |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|");
    for o in outcomes {
        for s in &o.metrics.sites {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} % |",
                o.metrics.policy,
                s.site,
                s.energy_kwh,
                s.surplus_used_kwh,
                s.surplus_available_kwh,
                s.grid_energy_kwh,
                s.emissions_kg,
                s.gpu_utilisation * 100.0
            );
        }
    }
    let _ = writeln!(md, "\n## How each policy ran\n");
    for o in outcomes {
        let _ = writeln!(
            md,
            "- **{}**: {}; {} decision(s) dropped by the engine; {} site-slot(s) over a grid limit.",
            o.metrics.policy,
            o.metrics.note.as_deref().unwrap_or("no notes"),
            o.metrics.rejected_decisions,
            o.metrics.grid_limit_exceeded_slots
        );
    }
    std::fs::write(dir.join("report.md"), md)
}

fn svg_open(out: &mut String, width: f64, height: f64, title: &str) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#,
        width / 2.0,
        escape(title)
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn line_chart(title: &str, x_label: &str, step: f64, lines: &[(String, Vec<f64>)]) -> String {
    let (w, hgt, left, right, top, bottom) = (820.0, 420.0, 70.0, 170.0, 30.0, 40.0);
    let n = lines.iter().map(|(_, v)| v.len()).max().unwrap_or(0).max(2);
    let y_max = lines
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0, f64::max)
        .max(1e-9);
    let x = |i: usize| left + (w - left - right) * i as f64 / (n - 1) as f64;
    let y = |v: f64| top + (hgt - top - bottom) * (1.0 - v / y_max);
    let mut out = String::new();
    svg_open(&mut out, w, hgt, title);
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#333"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="#333"/>"##,
        hgt - bottom,
        w - right,
        hgt - bottom,
        hgt - bottom
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{:.0}</text>"#,
            left - 4.0,
            y(v) + 4.0,
            v
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label} (0 to {:.0})</text>"#,
        (left + w - right) / 2.0,
        hgt - 10.0,
        (n - 1) as f64 * step
    );
    for (i, (name, values)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(t, v)| format!("{:.1},{:.1}", x(t), y(*v)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" fill="{colour}">{}</text>"#,
            w - right + 8.0,
            top + 16.0 * (i as f64 + 1.0),
            escape(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

fn bar_chart(title: &str, bars: &[(String, Vec<(f64, &str)>)], unit: &str) -> String {
    let (w, row_h, left, right, top) = (820.0, 26.0, 150.0, 90.0, 34.0);
    let per_row = bars.iter().map(|(_, v)| v.len()).max().unwrap_or(1) as f64;
    let hgt = top + bars.len() as f64 * (row_h * per_row + 8.0) + 20.0;
    let v_max = bars
        .iter()
        .flat_map(|(_, v)| v.iter().map(|(x, _)| *x))
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut out = String::new();
    svg_open(&mut out, w, hgt, title);
    let mut y = top;
    for (name, values) in bars {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + row_h * per_row / 2.0 + 4.0,
            escape(name)
        );
        for (value, colour) in values {
            let len = (w - left - right) * value / v_max;
            let _ = writeln!(
                out,
                r#"<rect x="{left}" y="{y}" width="{len:.1}" height="{}" fill="{colour}"/><text x="{}" y="{}">{value:.1} {unit}</text>"#,
                row_h - 4.0,
                left + len + 4.0,
                y + row_h - 9.0
            );
            y += row_h;
        }
        y += 8.0;
    }
    out.push_str("</svg>\n");
    out
}

fn surplus_chart(rows: &[(String, f64, f64)]) -> String {
    let bars: Vec<(String, Vec<(f64, &str)>)> = rows
        .iter()
        .map(|(name, used, available)| {
            (
                name.clone(),
                vec![(used / 1000.0, "#2ca02c"), (available / 1000.0, "#c7e9c0")],
            )
        })
        .collect();
    bar_chart(
        "Surplus energy used (dark) and available (light), MWh",
        &bars,
        "MWh",
    )
}

fn completion_chart(rows: &[(String, f64, f64)]) -> String {
    let bars: Vec<(String, Vec<(f64, &str)>)> = rows
        .iter()
        .map(|(name, mean, p95)| (name.clone(), vec![(*mean, "#1f77b4"), (*p95, "#aec7e8")]))
        .collect();
    bar_chart(
        "Completion time after submission: mean (dark) and 95th percentile (light), hours",
        &bars,
        "h",
    )
}
