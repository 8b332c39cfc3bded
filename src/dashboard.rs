//! The web dashboard that `windfall serve` hosts at `/`: overview, sites, jobs (Gantt), plans
//! (history and diff) and period reports with downloads, for sustainability teams and operators.
//!
//! Owns HTML rendering on the server (inline SVG, one embedded stylesheet, no scripts and no
//! fetches at run time) and the login cookie. Every figure comes from the same sources as the
//! API and `windfall report`: the stored plan's metrics, the validator's recomputation and
//! `period::PeriodReport`. Must not write to the store (login only checks a token).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Router};
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use serde_json::Value;
use windfall_solver::Instance;

use crate::auth::{Principal, Role};
use crate::model::PlanRecord;
use crate::report::{PlanFigures, escape, site_chart};
use crate::server::{CachedPlan, Shared, principal_for_token};

const COOKIE: &str = "windfall_session";
const STYLE: &str = include_str!("../dashboard/style.css");
/// Jobs per Gantt page: keeps every page light however large the plan.
const JOBS_PER_PAGE: usize = 100;

/// The dashboard's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(overview))
        .route("/login", get(login_form).post(login))
        .route("/logout", get(logout))
        .route("/assets/style.css", get(style))
        .route("/sites", get(sites))
        .route("/sites/{id}", get(site_page))
        .route("/jobs", get(jobs_page))
        .route("/jobs/{id}", get(job_page))
        .route("/plans", get(plans_page))
        .route("/plans/{id}/diff", get(plan_diff_page))
        .route("/reports", get(reports_page))
        .route("/reports/download", get(report_download))
}

/// A signed-in reader (admin, viewer or user) from the session cookie.
struct Reader(Principal);

impl FromRequestParts<Shared> for Reader {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, Response> {
        let token = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(&format!("{COOKIE}=")))
            .next()
            .map(str::to_string);
        let Some(token) = token else {
            return Err(Redirect::to("/login").into_response());
        };
        match principal_for_token(state, &token).await {
            Ok(p) if p.role != Role::Agent => Ok(Reader(p)),
            _ => Err(Redirect::to("/login?expired=1").into_response()),
        }
    }
}

fn page(title: &str, here: &str, who: Option<&Principal>, body: &str) -> Html<String> {
    let mut nav = String::new();
    if let Some(p) = who {
        for (href, key, label) in [
            ("/", "overview", "Overview"),
            ("/sites", "sites", "Sites"),
            ("/jobs", "jobs", "Jobs"),
            ("/plans", "plans", "Plans"),
            ("/reports", "reports", "Reports"),
        ] {
            let class = if key == here { " class=\"here\"" } else { "" };
            let _ = write!(nav, "<a href=\"{href}\"{class}>{label}</a>");
        }
        let _ = write!(
            nav,
            "<span class=\"who\">{} ({}) · <a href=\"/logout\">sign out</a></span>",
            escape(&p.name),
            p.role.as_str()
        );
    }
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · windfall</title><link rel=\"stylesheet\" href=\"/assets/style.css\"></head>\
         <body><header><strong>windfall</strong>{nav}</header><main>{body}</main></body></html>",
        title = escape(title)
    ))
}

async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLE,
    )
}

#[derive(Deserialize)]
struct LoginQuery {
    #[serde(default)]
    expired: Option<String>,
}

async fn login_form(Query(q): Query<LoginQuery>) -> Html<String> {
    let note = if q.expired.is_some() {
        "<p class=\"bad\">That session is no longer valid; sign in again.</p>"
    } else {
        ""
    };
    login_html(note)
}

fn login_html(note: &str) -> Html<String> {
    page(
        "Sign in",
        "",
        None,
        &format!(
            "<form class=\"login\" method=\"post\" action=\"/login\"><h1>Sign in</h1>{note}\
             <label for=\"token\">API token (viewer, user or admin; <code>windfall token create</code>)</label>\
             <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required>\
             <button id=\"sign-in\" type=\"submit\">Sign in</button></form>"
        ),
    )
}

#[derive(Deserialize)]
struct LoginBody {
    token: String,
}

async fn login(State(state): State<Shared>, Form(body): Form<LoginBody>) -> Response {
    let token = body.token.trim().to_string();
    match principal_for_token(&state, &token).await {
        Ok(p) if p.role != Role::Agent => (
            [(
                header::SET_COOKIE,
                format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"),
            )],
            Redirect::to("/"),
        )
            .into_response(),
        Ok(_) => (
            StatusCode::FORBIDDEN,
            login_html("<p class=\"bad\">Agent tokens cannot sign in to the dashboard.</p>"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::UNAUTHORIZED,
            login_html("<p class=\"bad\">Unknown or revoked token.</p>"),
        )
            .into_response(),
    }
}

async fn logout() -> Response {
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Redirect::to("/login"),
    )
        .into_response()
}

fn error_page(who: &Principal, status: StatusCode, message: &str) -> Response {
    (
        status,
        page(
            "Error",
            "",
            Some(who),
            &format!("<p class=\"bad\">{}</p>", escape(message)),
        ),
    )
        .into_response()
}

/// The latest plan with its instance and the validator's figures.
/// Borrowed from the server's plan cache, which parses and validates each plan once.
struct Loaded<'a> {
    record: &'a PlanRecord,
    instance: &'a Instance,
    validation: &'a windfall_solver::Validation,
}

impl Loaded<'_> {
    fn of(cached: &CachedPlan) -> Result<Loaded<'_>, String> {
        let broken = || {
            format!(
                "plan #{}: the stored instance does not parse",
                cached.plan.id
            )
        };
        Ok(Loaded {
            record: &cached.plan,
            instance: cached.instance().ok_or_else(broken)?,
            validation: cached.validation().ok_or_else(broken)?,
        })
    }
}

async fn latest(state: &Shared) -> Result<Option<Arc<CachedPlan>>, String> {
    state
        .latest_plan_cached()
        .await
        .map_err(|_| "the plan store is unavailable".to_string())
}

fn no_plan(who: &Principal, here: &str) -> Response {
    page(
        "No plan yet",
        here,
        Some(who),
        "<h1>No plan yet</h1><p>Run <code>windfall plan</code> or <code>POST /v1/plans</code>.</p>",
    )
    .into_response()
}

/// Binds `$cached` to the latest plan and `$l` to its `Loaded` view, or returns the page that
/// says why there is none.
macro_rules! load_or_return {
    ($state:expr, $who:expr, $here:expr, $cached:ident, $l:ident) => {
        let $cached = match latest(&$state).await {
            Ok(Some(c)) => c,
            Ok(None) => return no_plan(&$who, $here),
            Err(e) => return error_page(&$who, StatusCode::INTERNAL_SERVER_ERROR, &e),
        };
        let $l = match Loaded::of(&$cached) {
            Ok(l) => l,
            Err(e) => return error_page(&$who, StatusCode::INTERNAL_SERVER_ERROR, &e),
        };
    };
}

fn kpi(id: &str, label: &str, value: String, note: String) -> String {
    format!(
        "<div class=\"kpi\">{label}<b id=\"{id}\">{value}</b><small>{note}</small></div>",
        label = escape(label)
    )
}

async fn overview(
    State(state): State<Shared>,
    Reader(who): Reader,
    Query(period): Query<Period>,
) -> Response {
    load_or_return!(state, who, "overview", cached, l);
    let m = &l.record.metrics;
    let change = if m.baseline_emissions_g > 0.0 {
        100.0 * (m.emissions_g - m.baseline_emissions_g) / m.baseline_emissions_g
    } else {
        0.0
    };
    let share = if m.surplus_available_kwh > 0.0 {
        100.0 * m.surplus_used_kwh / m.surplus_available_kwh
    } else {
        0.0
    };
    let jobs = l.instance.jobs.len();
    let on_time = jobs - m.infeasible_jobs.len();
    let checkpoint: BTreeMap<&str, f64> = l
        .instance
        .jobs
        .iter()
        .map(|j| (j.id.as_str(), j.checkpoint_gb))
        .collect();
    let gb_moved: f64 = l
        .record
        .plan
        .migrations
        .iter()
        .map(|mig| checkpoint.get(mig.job.as_str()).copied().unwrap_or(0.0))
        .sum();
    let slot = Duration::minutes(i64::from(l.record.slot_minutes));
    let end = l.record.horizon_start_utc + slot * l.record.slots as i32;
    let mut body = format!(
        "<h1>Plan #{id}</h1><p class=\"muted\">Horizon {start} to {end} in {mins}-minute slots · \
         {sites} sites · {jobs} jobs · made {made} by {method} ({status}), gap {gap:.2} %</p>",
        id = l.record.id,
        start = l.record.horizon_start_utc.format("%Y-%m-%d %H:%M UTC"),
        end = end.format("%Y-%m-%d %H:%M UTC"),
        mins = l.record.slot_minutes,
        sites = l.instance.sites.len(),
        made = l.record.created_utc.format("%Y-%m-%d %H:%M UTC"),
        method = escape(&m.method),
        status = escape(&m.status),
        gap = 100.0 * m.gap,
    );
    let stale = crate::model::degraded_reasons(&l.record.provenance);
    if stale.is_empty() {
        body.push_str(
            "<p id=\"forecast-status\" class=\"ok\">Forecasts: fresh for every site and slot.</p>",
        );
    } else {
        let _ = write!(
            body,
            "<div id=\"forecast-status\" class=\"warn\"><b>Degraded plan:</b> {}</div>",
            stale
                .iter()
                .map(|s| escape(s))
                .collect::<Vec<_>>()
                .join("<br>")
        );
    }
    body.push_str("<div class=\"kpis\">");
    body.push_str(&kpi(
        "kpi-emissions-kg",
        "Emissions (kg CO2e)",
        format!("{:.3}", m.emissions_g / 1000.0),
        format!(
            "<span id=\"kpi-change-pct\">{change:+.1}</span> % vs run-now (<span id=\"kpi-baseline-kg\">{:.3}</span> kg)",
            m.baseline_emissions_g / 1000.0
        ),
    ));
    body.push_str(&kpi(
        "kpi-surplus-mwh",
        "Surplus absorbed (MWh)",
        format!("{:.3}", m.surplus_used_kwh / 1000.0),
        format!(
            "{share:.1} % of {:.3} MWh available",
            m.surplus_available_kwh / 1000.0
        ),
    ));
    body.push_str(&kpi(
        "kpi-grid-mwh",
        "Grid energy (MWh)",
        format!("{:.3}", m.grid_energy_kwh / 1000.0),
        "all sites, PUE included".into(),
    ));
    body.push_str(&kpi(
        "kpi-deadlines",
        "Deadlines met",
        format!("{on_time} / {jobs}"),
        format!("{} infeasible", m.infeasible_jobs.len()),
    ));
    body.push_str(&kpi(
        "kpi-migrations",
        "Migrations",
        format!("{}", l.record.plan.migrations.len()),
        format!("<span id=\"kpi-gb-moved\">{gb_moved:.1}</span> GB of checkpoints moved"),
    ));
    body.push_str("</div>");
    // A chosen period, stitched from the plans in force (as `windfall report`).
    let chosen = period.from.as_deref().is_some_and(|f| !f.is_empty())
        || period.to.as_deref().is_some_and(|t| !t.is_empty());
    let (from, to) = match period_bounds(&period, Some((l.record.horizon_start_utc, end))) {
        Ok(b) => b,
        Err(e) => return error_page(&who, StatusCode::BAD_REQUEST, &e),
    };
    let _ = write!(
        body,
        "<h2>Period</h2><form class=\"inline\" method=\"get\" action=\"/\">\
         <label>from <input name=\"from\" value=\"{}\" size=\"26\"></label>\
         <label>to <input name=\"to\" value=\"{}\" size=\"26\"></label>\
         <button type=\"submit\">Show</button></form>",
        from.to_rfc3339(),
        to.to_rfc3339()
    );
    if chosen {
        match crate::period::PeriodReport::build(&state.store, from, to).await {
            Ok(r) => {
                let t = &r.total;
                body.push_str("<div class=\"kpis\">");
                body.push_str(&kpi(
                    "period-emissions-kg",
                    "Period emissions (kg CO2e)",
                    format!("{:.3}", t.emissions_kg),
                    format!(
                        "{:+.1} % vs run-now ({:.3} kg)",
                        t.change_pct(),
                        t.baseline_kg
                    ),
                ));
                body.push_str(&kpi(
                    "period-surplus-mwh",
                    "Period surplus absorbed (MWh)",
                    format!("{:.3}", t.surplus_kwh / 1000.0),
                    format!("{} slots covered", r.slots_covered),
                ));
                body.push_str(&kpi(
                    "period-grid-mwh",
                    "Period grid energy (MWh)",
                    format!("{:.3}", t.grid_kwh / 1000.0),
                    format!(
                        "plans {}",
                        r.plan_ids
                            .iter()
                            .map(|i| format!("#{i}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
                body.push_str("</div><p class=\"muted\">Each slot of the period comes from the plan in force when it began; details and downloads under <a href=\"/reports\">Reports</a>.</p>");
            }
            Err(e) => {
                let _ = write!(body, "<p class=\"bad\">{}</p>", escape(&format!("{e:#}")));
            }
        }
    } else {
        body.push_str("<p class=\"muted\">Figures above are the current plan's; choose a period to see the plans in force over it.</p>");
    }
    body.push_str("<h2>Sites</h2><table><tr><th>site</th><th>zone</th><th>GPUs</th><th>grid kWh</th><th>surplus kWh</th><th>kg CO2e</th></tr>");
    for (site, series) in l.instance.sites.iter().zip(&l.validation.sites) {
        let gpus: Vec<String> = site.gpus.iter().map(|(m, n)| format!("{n}× {m}")).collect();
        let _ = write!(
            body,
            "<tr><td><a href=\"/sites/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.3}</td></tr>",
            escape(site.zone.as_deref().unwrap_or("")),
            escape(&gpus.join(", ")),
            series.grid_energy_kwh,
            series.surplus_used_kwh,
            series.emissions_g / 1000.0,
            id = escape(&site.id),
        );
    }
    body.push_str("</table>");
    if !m.infeasible_jobs.is_empty() {
        body.push_str(
            "<h2>Infeasible jobs</h2><table><tr><th>job</th><th class=\"l\">reason</th></tr>",
        );
        for entry in &m.infeasible_jobs {
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=\"l\">{}</td></tr>",
                escape(&entry.job),
                escape(&entry.reason)
            );
        }
        body.push_str("</table>");
    }
    page("Overview", "overview", Some(&who), &body).into_response()
}

async fn sites(State(state): State<Shared>, Reader(who): Reader) -> Response {
    load_or_return!(state, who, "sites", cached, l);
    let mut body = String::from("<h1>Sites</h1><ul>");
    for site in &l.instance.sites {
        let _ = write!(
            body,
            "<li><a href=\"/sites/{id}\">{id}</a></li>",
            id = escape(&site.id)
        );
    }
    body.push_str("</ul>");
    page("Sites", "sites", Some(&who), &body).into_response()
}

async fn site_page(
    State(state): State<Shared>,
    Reader(who): Reader,
    Path(id): Path<String>,
) -> Response {
    load_or_return!(state, who, "sites", cached, l);
    let Some(index) = l.instance.sites.iter().position(|s| s.id == id) else {
        return error_page(
            &who,
            StatusCode::NOT_FOUND,
            &format!("no site `{id}` in the current plan"),
        );
    };
    let site = &l.instance.sites[index];
    let series = &l.validation.sites[index];
    let figures = PlanFigures {
        record: l.record,
        instance: l.instance,
        validation: l.validation,
    };
    let mut body = format!(
        "<h1>Site {id}</h1><p class=\"muted\">Zone {zone} · PUE {pue} · grid limit {limit} · WAN {wan} Gbit/s · \
         plan #{plan}: <span id=\"site-emissions-kg\">{em:.3}</span> kg CO2e, {grid:.1} kWh grid, {sur:.1} kWh surplus</p>\
         <h2>Timeline: surplus forecast, planned load, grid import and carbon intensity</h2>",
        id = escape(&site.id),
        zone = escape(site.zone.as_deref().unwrap_or("-")),
        pue = site.pue,
        limit = site
            .grid_limit_kw
            .map_or("none".to_string(), |k| format!("{k} kW")),
        wan = site.wan_gbps,
        plan = l.record.id,
        em = series.emissions_g / 1000.0,
        grid = series.grid_energy_kwh,
        sur = series.surplus_used_kwh,
    );
    let _ = write!(
        body,
        "<div id=\"site-timeline\">{}</div>",
        site_chart(&figures, site, series)
    );
    body.push_str("<h2>Inventory and agent</h2>");
    let heartbeats = state.store.heartbeats().await.unwrap_or_default();
    match heartbeats.iter().find(|h| h.site == id) {
        None => body.push_str("<p id=\"agent-health\" class=\"bad\">No agent has reported for this site; the planner uses its configured GPUs.</p>"),
        Some(h) => {
            let age = Utc::now() - h.time_utc;
            let fresh = age < Duration::minutes(30);
            let _ = write!(
                body,
                "<p id=\"agent-health\" class=\"{}\">Agent last reported {} ago ({})</p>",
                if fresh { "ok" } else { "bad" },
                human(age),
                if fresh { "healthy" } else { "stale: its GPUs are no longer planned" }
            );
            let v: Value = serde_json::from_str(&h.inventory_json).unwrap_or(Value::Null);
            body.push_str("<table><tr><th>GPU</th><th class=\"l\">model</th><th>memory MiB</th><th>power W</th><th>limit W</th><th>range W</th></tr>");
            for g in v["detail"]["gpus"].as_array().into_iter().flatten() {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}-{}</td></tr>",
                    g["index"], escape(g["name"].as_str().unwrap_or("")), g["memory_total_mib"],
                    g["power_usage_w"].as_f64().unwrap_or(0.0), g["limit_w"], g["min_limit_w"], g["max_limit_w"]
                );
            }
            body.push_str("</table>");
            let _ = write!(
                body,
                "<p class=\"muted\">Usable GPUs reported: {}</p>",
                escape(&v["inventory"].to_string())
            );
        }
    }
    page(&format!("Site {id}"), "sites", Some(&who), &body).into_response()
}

fn human(d: Duration) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

#[derive(Deserialize)]
struct JobFilter {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    page: Option<usize>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
];

async fn jobs_page(
    State(state): State<Shared>,
    Reader(who): Reader,
    Query(filter): Query<JobFilter>,
) -> Response {
    let started = Instant::now();
    load_or_return!(state, who, "jobs", cached, l);
    let records = match state.store.jobs(None).await {
        Ok(r) => r,
        Err(e) => return error_page(&who, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let info: BTreeMap<&str, (&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r.id.as_str(),
                (r.owner.as_deref().unwrap_or("-"), r.state.as_str()),
            )
        })
        .collect();
    let user = filter.user.filter(|u| !u.is_empty());
    let wanted_state = filter.state.filter(|s| !s.is_empty());
    let mut runs: BTreeMap<&str, Vec<&windfall_solver::Assignment>> = BTreeMap::new();
    for a in &l.record.plan.assignments {
        runs.entry(a.job.as_str()).or_default().push(a);
    }
    let jobs: Vec<&str> = l
        .instance
        .jobs
        .iter()
        .map(|j| j.id.as_str())
        .filter(|id| {
            let (owner, st) = info.get(id).copied().unwrap_or(("-", "?"));
            user.as_deref().is_none_or(|u| u == owner)
                && wanted_state.as_deref().is_none_or(|s| s == st)
        })
        .collect();
    let pages = jobs.len().div_ceil(JOBS_PER_PAGE).max(1);
    let page_no = filter.page.unwrap_or(1).clamp(1, pages);
    let shown = &jobs[(page_no - 1) * JOBS_PER_PAGE..(page_no * JOBS_PER_PAGE).min(jobs.len())];
    let site_color = |id: &str| {
        let i = l
            .instance
            .sites
            .iter()
            .position(|s| s.id == id)
            .unwrap_or(0);
        COLORS[i % COLORS.len()]
    };
    let max_w: f64 = l
        .instance
        .gpu_models
        .values()
        .flat_map(|m| m.power_levels_w.iter().copied())
        .fold(1.0, f64::max);
    // Gantt: one row per job of this page; colour = site, shade = power cap, ▲ = migration.
    let (left, top, row_h, width) = (130.0, 36.0, 14.0, 1200.0);
    let n = l.record.slots.max(1);
    let step = (width - left - 10.0) / n as f64;
    let height = top + row_h * shown.len().max(1) as f64 + 10.0;
    let mut svg = format!(
        r#"<svg id="gantt" viewBox="0 0 {width} {height}" role="img" aria-label="job schedule">"#
    );
    for (i, site) in l.instance.sites.iter().enumerate() {
        let x = left + 140.0 * i as f64;
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="4" width="10" height="10" fill="{}"/><text x="{}" y="13" font-size="11">{}</text>"#,
            site_color(&site.id),
            x + 14.0,
            escape(&site.id)
        );
    }
    let slot_len = Duration::minutes(i64::from(l.record.slot_minutes));
    let every = n.div_ceil(8).max(1);
    for i in (0..n).step_by(every) {
        let t = l.record.horizon_start_utc + slot_len * i as i32;
        let x = left + step * i as f64;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{height:.1}" stroke="#e3e8ee"/><text x="{x:.1}" y="{:.1}" font-size="10" fill="#5b6b7b">{}</text>"##,
            top - 4.0,
            top - 6.0,
            t.format("%d %H:%M")
        );
    }
    let migrations: BTreeMap<(&str, usize), &windfall_solver::Migration> = l
        .record
        .plan
        .migrations
        .iter()
        .map(|m| ((m.job.as_str(), m.slot), m))
        .collect();
    for (row, job) in shown.iter().enumerate() {
        let y = top + row_h * row as f64;
        let _ = write!(
            svg,
            r#"<text x="4" y="{:.1}" font-size="10"><a href="/jobs/{job}">{job}</a></text>"#,
            y + 10.0,
            job = escape(job)
        );
        for a in runs.get(job).into_iter().flatten() {
            let opacity = (0.35 + 0.65 * a.power_w / max_w).min(1.0);
            let _ = write!(
                svg,
                r#"<rect class="run" data-job="{j}" data-site="{s}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="{opacity:.2}"><title>{j}: slot {} at {s}, cap {} W</title></rect>"#,
                left + step * a.slot as f64,
                y + 1.0,
                step.max(1.0),
                row_h - 3.0,
                site_color(&a.site),
                a.slot,
                a.power_w,
                j = escape(&a.job),
                s = escape(&a.site),
            );
            if let Some(m) = migrations.get(&(a.job.as_str(), a.slot)) {
                let x = left + step * a.slot as f64;
                let _ = write!(
                    svg,
                    r#"<path class="migration" d="M{x:.1} {:.1} l4 -7 l4 7 z" fill="black"><title>{}: moved {} → {}</title></path>"#,
                    y + row_h - 2.0,
                    escape(&m.job),
                    escape(&m.from),
                    escape(&m.to)
                );
            }
        }
    }
    svg.push_str("</svg>");
    let users: std::collections::BTreeSet<&str> = info.values().map(|(u, _)| *u).collect();
    let mut body = format!(
        "<h1>Jobs in plan #{}</h1><form class=\"inline\" method=\"get\" action=\"/jobs\">\
         <label>user <select name=\"user\"><option value=\"\">all</option>{}</select></label>\
         <label>state <select name=\"state\"><option value=\"\">all</option>{}</select></label>\
         <button type=\"submit\">Filter</button></form>\
         <p class=\"muted\" id=\"jobs-count\">{} jobs match; page {page_no} of {pages} ({} per page). \
         Colour = site, shade = power cap (darker = more watts), ▲ = migration into that slot.</p>",
        l.record.id,
        users
            .iter()
            .map(|u| format!(
                "<option{}>{}</option>",
                if user.as_deref() == Some(u) {
                    " selected"
                } else {
                    ""
                },
                escape(u)
            ))
            .collect::<String>(),
        crate::model::JobState::ALL
            .iter()
            .map(|s| format!(
                "<option{}>{}</option>",
                if wanted_state.as_deref() == Some(s.as_str()) {
                    " selected"
                } else {
                    ""
                },
                s.as_str()
            ))
            .collect::<String>(),
        jobs.len(),
        JOBS_PER_PAGE,
    );
    body.push_str(&svg);
    let link = |p: usize, label: &str| {
        let mut q = vec![format!("page={p}")];
        if let Some(u) = &user {
            q.push(format!("user={}", escape(u)));
        }
        if let Some(s) = &wanted_state {
            q.push(format!("state={}", escape(s)));
        }
        format!("<a href=\"/jobs?{}\">{label}</a>", q.join("&amp;"))
    };
    body.push_str("<p class=\"pager\">");
    if page_no > 1 {
        body.push_str(&link(page_no - 1, "← previous"));
    }
    if page_no < pages {
        body.push_str(&link(page_no + 1, "next →"));
    }
    let _ = write!(
        body,
        "</p><p class=\"muted\">Rendered in {:.0} ms.</p>",
        started.elapsed().as_secs_f64() * 1000.0
    );
    page("Jobs", "jobs", Some(&who), &body).into_response()
}

async fn job_page(
    State(state): State<Shared>,
    Reader(who): Reader,
    Path(id): Path<String>,
) -> Response {
    let record = match state.store.job(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => return error_page(&who, StatusCode::NOT_FOUND, &format!("no job `{id}`")),
        Err(e) => return error_page(&who, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    if who.role == Role::User && record.owner.as_deref() != Some(who.name.as_str()) {
        return error_page(
            &who,
            StatusCode::FORBIDDEN,
            "this job belongs to another user",
        );
    }
    let mut body = format!(
        "<h1>Job {}</h1><p class=\"muted\">state <b id=\"job-state\">{}</b> · owner {} · {} GPU(s) · {} work hours · \
         released {} · deadline {} · home {} · checkpoint {} GB{}</p>",
        escape(&id),
        record.state.as_str(),
        escape(record.owner.as_deref().unwrap_or("-")),
        record.gpus,
        record.work_hours,
        record.release_utc.format("%Y-%m-%d %H:%M"),
        record.deadline_utc.format("%Y-%m-%d %H:%M"),
        escape(&record.home_site),
        record.checkpoint_gb,
        record
            .state_reason
            .as_deref()
            .map(|r| format!(" · {}", escape(r)))
            .unwrap_or_default(),
    );
    if let Ok(Some(cached)) = latest(&state).await
        && let Some(attribution) = cached.attribution()
    {
        let l = &cached.plan;
        let slot = Duration::minutes(i64::from(l.slot_minutes));
        let (planned, baseline) = (&attribution.planned, &attribution.baseline);
        let sum = |m: &BTreeMap<String, Vec<(usize, f64)>>| {
            m.get(&id)
                .map_or(0.0, |v| v.iter().map(|(_, g)| g).sum::<f64>())
        };
        let _ = write!(
            body,
            "<h2>Carbon in plan #{}</h2><p><span id=\"job-emissions-kg\">{:.3}</span> kg CO2e planned against {:.3} kg run-now (its own GPU power, PUE included)</p>\
             <table><tr><th class=\"l\">slot start (UTC)</th><th class=\"l\">site</th><th>power cap W</th><th class=\"l\">GPU model</th></tr>",
            l.id,
            sum(planned) / 1000.0,
            sum(baseline) / 1000.0
        );
        for a in l.plan.assignments.iter().filter(|a| a.job == id) {
            let _ = write!(
                body,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                (l.horizon_start_utc + slot * a.slot as i32).format("%Y-%m-%d %H:%M"),
                escape(&a.site),
                a.power_w,
                escape(a.gpu_model.as_deref().unwrap_or("-"))
            );
        }
        body.push_str("</table>");
    }
    body.push_str("<h2>History</h2><table><tr><th class=\"l\">time (UTC)</th><th class=\"l\">site</th><th class=\"l\">event</th><th class=\"l\">detail</th></tr>");
    for e in state.store.job_events(&id).await.unwrap_or_default() {
        let _ = write!(
            body,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\"><code>{}</code></td></tr>",
            e.time_utc.format("%Y-%m-%d %H:%M:%S"),
            escape(&e.site),
            escape(&e.kind),
            escape(&e.detail.to_string())
        );
    }
    body.push_str("</table>");
    page(&format!("Job {id}"), "jobs", Some(&who), &body).into_response()
}

async fn plans_page(State(state): State<Shared>, Reader(who): Reader) -> Response {
    let summaries = match state.store.plan_summaries().await {
        Ok(s) => s,
        Err(e) => return error_page(&who, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let mut body = String::from(
        "<h1>Plans</h1><table id=\"plans\"><tr><th>plan</th><th class=\"l\">made (UTC)</th><th class=\"l\">horizon start</th>\
         <th>kg CO2e</th><th>run-now kg</th><th>change</th><th>gap</th><th>migrations</th><th class=\"l\">method</th><th></th></tr>",
    );
    for (i, p) in summaries.iter().enumerate() {
        let m = &p.metrics;
        let change = if m.baseline_emissions_g > 0.0 {
            100.0 * (m.emissions_g - m.baseline_emissions_g) / m.baseline_emissions_g
        } else {
            0.0
        };
        let diff = if i + 1 < summaries.len() {
            format!(
                "<a href=\"/plans/{}/diff\">diff with #{}</a>",
                p.id,
                summaries[i + 1].id
            )
        } else {
            String::new()
        };
        let _ = write!(
            body,
            "<tr><td>#{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.3}</td><td>{:.3}</td><td>{change:+.1} %</td><td>{:.2} %</td><td>{}</td><td class=\"l\">{}</td><td>{diff}</td></tr>",
            p.id,
            p.created_utc.format("%Y-%m-%d %H:%M"),
            p.horizon_start_utc.format("%Y-%m-%d %H:%M"),
            m.emissions_g / 1000.0,
            m.baseline_emissions_g / 1000.0,
            100.0 * m.gap,
            m.migrations,
            escape(&m.method)
        );
    }
    body.push_str("</table>");
    page("Plans", "plans", Some(&who), &body).into_response()
}

async fn plan_diff_page(
    State(state): State<Shared>,
    Reader(who): Reader,
    Path(id): Path<i64>,
) -> Response {
    let load = async {
        let plan = state.store.plan(id).await.ok()??;
        let before = state.store.plan_id_before(id).await.ok()??;
        let previous = state.store.plan(before).await.ok()??;
        Some((plan, previous))
    };
    let Some((plan, previous)) = load.await else {
        return error_page(
            &who,
            StatusCode::NOT_FOUND,
            &format!("no plan #{id} with an earlier plan to compare"),
        );
    };
    let diff = crate::server::diff_plans(&plan, &previous);
    let jobs = diff["jobs"].as_array().cloned().unwrap_or_default();
    let mut body = format!(
        "<h1>Plan #{id} against #{}</h1><p>Emissions change: <b id=\"diff-emissions-kg\">{:+.3}</b> kg CO2e · \
         {} jobs changed (compared over the overlap of the two horizons)</p>\
         <table><tr><th class=\"l\">job</th><th class=\"l\">status</th><th>slots changed</th><th class=\"l\">first change</th></tr>",
        previous.id,
        diff["emissions_change_g"].as_f64().unwrap_or(0.0) / 1000.0,
        jobs.len()
    );
    for j in &jobs {
        let changes = j["changed_slots"].as_array().cloned().unwrap_or_default();
        let first = changes
            .first()
            .map(|c| {
                let side = |v: &Value| {
                    v.as_object().map_or("not run".to_string(), |o| {
                        format!("{} @ {} W", o["site"].as_str().unwrap_or(""), o["power_w"])
                    })
                };
                format!(
                    "{}: {} → {}",
                    c["start_utc"].as_str().unwrap_or(""),
                    side(&c["before"]),
                    side(&c["now"])
                )
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            escape(j["job"].as_str().unwrap_or("")),
            escape(j["status"].as_str().unwrap_or("")),
            changes.len(),
            escape(&first)
        );
    }
    body.push_str("</table>");
    page("Plan diff", "plans", Some(&who), &body).into_response()
}

#[derive(Deserialize)]
struct Period {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    format: Option<String>,
}

fn period_bounds(
    p: &Period,
    fallback: Option<(DateTime<Utc>, DateTime<Utc>)>,
) -> Result<(DateTime<Utc>, DateTime<Utc>), String> {
    let parse = |name: &str, v: &Option<String>, default: Option<DateTime<Utc>>| match v
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| format!("`{name}`: `{text}` is not an RFC 3339 time with an offset")),
        None => default.ok_or_else(|| format!("`{name}` is required when there is no plan")),
    };
    let from = parse("from", &p.from, fallback.map(|f| f.0))?;
    let to = parse("to", &p.to, fallback.map(|f| f.1))?;
    if to <= from {
        return Err("`to` must be after `from`".into());
    }
    Ok((from, to))
}

async fn plan_horizon(state: &Shared) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let cached = state.latest_plan_cached().await.ok()??;
    let p = &cached.plan;
    let end = p.horizon_start_utc + Duration::minutes(i64::from(p.slot_minutes)) * p.slots as i32;
    Some((p.horizon_start_utc, end))
}

/// The report for the query's period, by default the current plan's horizon.
async fn period_report(state: &Shared, q: &Period) -> Result<crate::period::PeriodReport, String> {
    let (from, to) = period_bounds(q, plan_horizon(state).await)?;
    crate::period::PeriodReport::build(&state.store, from, to)
        .await
        .map_err(|e| format!("{e:#}"))
}

async fn reports_page(
    State(state): State<Shared>,
    Reader(who): Reader,
    Query(q): Query<Period>,
) -> Response {
    let report = match period_report(&state, &q).await {
        Ok(r) => r,
        Err(e) => return error_page(&who, StatusCode::BAD_REQUEST, &e),
    };
    let (from, to) = (report.from_utc, report.to_utc);
    let (f, t) = (from.to_rfc3339(), to.to_rfc3339());
    let link = |format: &str| {
        format!(
            "<a id=\"download-{format}\" href=\"/reports/download?from={}&amp;to={}&amp;format={format}\" download>{format}</a>",
            urlencode(&f),
            urlencode(&t)
        )
    };
    let total = &report.total;
    let mut body = format!(
        "<h1>Report</h1><form class=\"inline\" method=\"get\" action=\"/reports\">\
         <label>from <input name=\"from\" value=\"{f}\" size=\"26\"></label>\
         <label>to <input name=\"to\" value=\"{t}\" size=\"26\"></label><button type=\"submit\">Show</button></form>\
         <div class=\"kpis\">{}{}{}{}</div><p>Download: {} · {} · {}</p>\
         <h2>By site and day</h2><table><tr><th class=\"l\">site</th><th class=\"l\">day</th><th>kg CO2e</th><th>run-now kg</th><th>change</th><th>grid kWh</th><th>surplus kWh</th></tr>",
        kpi(
            "report-emissions-kg",
            "Emissions (kg CO2e)",
            format!("{:.3}", total.emissions_kg),
            format!("{:+.1} % vs run-now", total.change_pct())
        ),
        kpi(
            "report-baseline-kg",
            "Run-now baseline (kg)",
            format!("{:.3}", total.baseline_kg),
            "same jobs, same signals".into()
        ),
        kpi(
            "report-grid-kwh",
            "Grid energy (kWh)",
            format!("{:.1}", total.grid_kwh),
            String::new()
        ),
        kpi(
            "report-surplus-kwh",
            "Surplus absorbed (kWh)",
            format!("{:.1}", total.surplus_kwh),
            format!(
                "plans {}",
                report
                    .plan_ids
                    .iter()
                    .map(|i| format!("#{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        ),
        link("md"),
        link("csv"),
        link("json"),
    );
    for (site, days) in &report.by_site_day {
        for (day, fig) in days {
            let _ = write!(
                body,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{day}</td><td>{:.3}</td><td>{:.3}</td><td>{:+.1} %</td><td>{:.1}</td><td>{:.1}</td></tr>",
                escape(site),
                fig.emissions_kg,
                fig.baseline_kg,
                fig.change_pct(),
                fig.grid_kwh,
                fig.surplus_kwh
            );
        }
    }
    body.push_str("</table><h2>By user and day</h2><table><tr><th class=\"l\">user</th><th class=\"l\">day</th><th>kg CO2e</th><th>run-now kg</th><th>change</th></tr>");
    for (user, days) in &report.by_user_day {
        for (day, fig) in days {
            let _ = write!(
                body,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{day}</td><td>{:.3}</td><td>{:.3}</td><td>{:+.1} %</td></tr>",
                escape(user),
                fig.emissions_kg,
                fig.baseline_kg,
                fig.change_pct()
            );
        }
    }
    let _ = write!(
        body,
        "</table><h2>Method</h2><p class=\"muted\">{}</p>",
        escape(&report.method)
    );
    page("Report", "reports", Some(&who), &body).into_response()
}

async fn report_download(
    State(state): State<Shared>,
    Reader(who): Reader,
    Query(q): Query<Period>,
) -> Response {
    let report = match period_report(&state, &q).await {
        Ok(r) => r,
        Err(e) => return error_page(&who, StatusCode::BAD_REQUEST, &e),
    };
    let (from, to) = (report.from_utc, report.to_utc);
    let (text, kind, ext) = match q.format.as_deref().unwrap_or("md") {
        "md" => (report.markdown(), "text/markdown; charset=utf-8", "md"),
        "csv" => (report.csv(), "text/csv; charset=utf-8", "csv"),
        "json" => (report.json(), "application/json", "json"),
        other => {
            return error_page(
                &who,
                StatusCode::BAD_REQUEST,
                &format!("format `{other}`: use md, csv or json"),
            );
        }
    };
    let name = format!(
        "windfall-report-{}-{}.{ext}",
        from.format("%Y%m%dT%H%M"),
        to.format("%Y%m%dT%H%M")
    );
    (
        [
            (header::CONTENT_TYPE, kind.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        text,
    )
        .into_response()
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
