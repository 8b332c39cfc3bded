//! `windfall scenario build`: scenario folders from the public traces in `../shared/data`.
//!
//! Owns the documented, seeded rules that turn real traces into a scenario: carbon per zone
//! (Electricity Maps hourly exports), prices per zone, a site's surplus by one of three rules,
//! jobs from the GAIA PAI trace with gang sizes from the Alibaba GPU trace, deadlines from a
//! slack factor, checkpoint sizes and site bandwidths from stated distributions. The same
//! configuration and seed always give the same files. It writes only into the output folder.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chrono::{DateTime, Datelike, Duration, NaiveDateTime, Utc};

use super::forecast::uniform;
use super::scenario::{SiteConfig, SitesFile};

/// How a site's surplus power is derived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SurplusRule {
    /// GB sites: `price` is unavailable, so a share of GB wind curtailment; other zones: `price`.
    Auto,
    /// Surplus in hours whose wholesale price is <= 0: 80 % of the site's full-power load.
    Price,
    /// A co-located PV plant of twice the site's full-power load with a grid export limit of
    /// half its peak: surplus = max(0, P x solar - P / 2) (Solcast 2022, June to August only).
    Pv,
    /// A share of the GB balancing-mechanism wind curtailment (October 2025, replayed from the
    /// scenario start), sized so the 90th-percentile curtailment hour covers the site's
    /// full-power load.
    GbCurtailment,
}

/// What to build.
#[derive(Clone, Debug)]
pub struct BuildConfig {
    /// Output folder.
    pub out: PathBuf,
    /// The public data folder (`../shared/data`).
    pub data: PathBuf,
    /// One site per zone (Electricity Maps zone ids).
    pub zones: Vec<String>,
    /// Scenario start (a whole hour).
    pub start_utc: DateTime<Utc>,
    /// Length, days.
    pub days: u32,
    /// Surplus rule.
    pub surplus: SurplusRule,
    /// Jobs to generate.
    pub jobs: usize,
    /// GPUs per site.
    pub gpus_per_site: u32,
    /// Deadline slack factor range: deadline = submit + work x (1 + U(lo, hi)) + 2 h.
    pub slack: (f64, f64),
    /// Share of jobs that may migrate.
    pub migratable_share: f64,
    /// Seed.
    pub seed: u64,
}

/// Surplus share of full load in zero-or-negative price hours.
const PRICE_SURPLUS_SHARE: f64 = 0.8;
/// PV plant peak over the site's full-power load.
const PV_PEAK_OVER_LOAD: f64 = 2.0;
/// Export limit over PV peak.
const PV_EXPORT_SHARE: f64 = 0.5;
/// Longest job work accepted from the trace, hours (longer jobs are capped).
const MAX_WORK_H: f64 = 24.0;
/// Shortest job work, hours.
const MIN_WORK_H: f64 = 0.1;
/// Share of the scenario in which jobs arrive (the rest lets them finish).
const ARRIVAL_SHARE: f64 = 0.75;
/// Site WAN bandwidths drawn from, Gbit/s.
const WAN_CHOICES_GBPS: [f64; 5] = [1.0, 10.0, 25.0, 40.0, 100.0];
/// PV profile (Solcast city) per zone.
const PV_CITIES: [(&str, &str); 9] = [
    ("US-CAL-CISO", "San Francisco"),
    ("DE-LU", "Berlin"),
    ("ZA", "Cape Town"),
    ("IN-WE", "Mumbai"),
    ("AU-NSW", "Sydney"),
    ("AU-VIC", "Sydney"),
    ("BR-SP", "São Paulo"),
    ("GB", "Stockholm"),
    ("US-TEX-ERCO", "Mexico City"),
];

fn read_text(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .with_context(|| format!("decompressing {}", path.display()))?;
        Ok(text)
    } else {
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
    }
}

fn hour_key(t: DateTime<Utc>) -> i64 {
    t.timestamp().div_euclid(3600)
}

/// Hourly values of a column from CSV files, keyed by UTC hour.
fn hourly_column(
    files: &[PathBuf],
    time_column: &str,
    value_column: &str,
) -> anyhow::Result<BTreeMap<i64, f64>> {
    let mut values = BTreeMap::new();
    for path in files {
        let text = read_text(path)?;
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let header = reader.headers()?.clone();
        let find = |name: &str| {
            header
                .iter()
                .position(|h| h == name)
                .with_context(|| format!("{}: no column `{name}`", path.display()))
        };
        let (tc, vc) = (find(time_column)?, find(value_column)?);
        for (i, record) in reader.records().enumerate() {
            let record = record.with_context(|| format!("{}: line {}", path.display(), i + 2))?;
            let raw = record.get(tc).unwrap_or("");
            let time = parse_time(raw)
                .with_context(|| format!("{}: line {}: time `{raw}`", path.display(), i + 2))?;
            let Ok(value) = record.get(vc).unwrap_or("").parse::<f64>() else {
                continue;
            };
            values.insert(hour_key(time), value);
        }
    }
    Ok(values)
}

fn parse_time(raw: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(t) = DateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%:z") {
        return Ok(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(raw, format) {
            return Ok(t.and_utc());
        }
    }
    bail!("not a time")
}

fn years(start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<i32> {
    (start.year()..=end.year()).collect()
}

/// Builds the scenario folder and returns a summary.
pub fn build(config: &BuildConfig) -> anyhow::Result<String> {
    if config.zones.is_empty() {
        bail!("--zones needs at least one zone");
    }
    if config.days == 0 || config.jobs == 0 || config.gpus_per_site == 0 {
        bail!("--days, --jobs and --gpus-per-site must be at least 1");
    }
    let (lo, hi) = config.slack;
    if !(lo.is_finite() && hi.is_finite() && lo >= 0.0 && hi >= lo) {
        bail!("--slack must be LO:HI with 0 <= LO <= HI");
    }
    if config.start_utc.timestamp() % 3600 != 0 {
        bail!("--start must be a whole hour");
    }
    let start = config.start_utc;
    let n_slots = config.days as usize * 24;
    let end = start + Duration::hours(n_slots as i64);
    let data = &config.data;
    let seed = config.seed;

    let mut gpu_models = BTreeMap::new();
    gpu_models.insert(
        "H100".to_string(),
        windfall_solver::GpuModel {
            power_levels_w: vec![700.0, 600.0, 500.0, 400.0],
            throughput: vec![1.0, 0.97, 0.90, 0.78],
            speed: 1.0,
            idle_w: 60.0,
        },
    );
    gpu_models.insert(
        "A100".to_string(),
        windfall_solver::GpuModel {
            power_levels_w: vec![400.0, 350.0, 300.0, 250.0],
            throughput: vec![1.0, 0.96, 0.88, 0.75],
            speed: 0.6,
            idle_w: 50.0,
        },
    );
    let mut sites = Vec::new();
    let mut signal_rows =
        String::from("time_utc,site,surplus_kw,carbon_g_per_kwh,price_usd_per_mwh\n");
    let mut rules_used = Vec::new();
    for (i, zone) in config.zones.iter().enumerate() {
        // A zone listed again gets a numbered site of its own.
        let repeat = config.zones[..i].iter().filter(|z| *z == zone).count();
        let id = if repeat == 0 {
            zone.to_lowercase()
        } else {
            format!("{}-{}", zone.to_lowercase(), repeat + 1)
        };
        let model = if i % 2 == 0 { "H100" } else { "A100" };
        let wan = WAN_CHOICES_GBPS
            [(uniform(seed, 100 + i as u64, 0) * WAN_CHOICES_GBPS.len() as f64) as usize];
        let pue = 1.1 + 0.2 * uniform(seed, 200 + i as u64, 0);
        let full_kw =
            pue * f64::from(config.gpus_per_site) * gpu_models[model].power_levels_w[0] / 1000.0;
        let carbon_files: Vec<PathBuf> = years(start, end)
            .iter()
            .map(|y| {
                data.join("carbon/em_greendcc_16regions_2021_2023")
                    .join(format!("{zone}_{y}_hourly.csv.gz"))
            })
            .collect();
        if let Some(missing) = carbon_files.iter().find(|p| !p.exists()) {
            bail!(
                "no carbon data for zone {zone} over {} to {}: {} is missing (the bundled traces cover 2021-2023)",
                start.to_rfc3339(),
                end.to_rfc3339(),
                missing.display()
            );
        }
        let carbon = hourly_column(
            &carbon_files,
            "Datetime (UTC)",
            "Carbon Intensity gCO₂eq/kWh (direct)",
        )?;
        let price_files: Vec<PathBuf> = years(start, end)
            .iter()
            .map(|y| {
                data.join("energy/prices_greendcc_15regions_2021_2023")
                    .join(format!("{zone}_electricity_prices_{y}.csv.gz"))
            })
            .collect();
        let prices = if price_files.iter().all(|p| p.exists()) {
            Some(hourly_column(
                &price_files,
                "Datetime (UTC)",
                "Price (USD/MWh)",
            )?)
        } else {
            None
        };
        let rule = match config.surplus {
            SurplusRule::Auto if prices.is_none() => SurplusRule::GbCurtailment,
            SurplusRule::Auto => SurplusRule::Price,
            other => other,
        };
        let surplus: Vec<f64> = match rule {
            SurplusRule::Price => {
                let Some(prices) = &prices else {
                    bail!("zone {zone} has no price data; use --surplus gb-curtailment or pv");
                };
                (0..n_slots)
                    .map(|t| {
                        let key = hour_key(start) + t as i64;
                        // IN-WE stamps prices at hh:30: the hour key covers it.
                        match prices.get(&key) {
                            Some(p) if *p <= 0.0 => PRICE_SURPLUS_SHARE * full_kw,
                            _ => 0.0,
                        }
                    })
                    .collect()
            }
            SurplusRule::Pv => {
                let Some((_, city)) = PV_CITIES.iter().find(|(z, _)| z == zone) else {
                    bail!(
                        "no PV profile for zone {zone}; PV profiles exist for {}",
                        PV_CITIES.map(|(z, _)| z).join(", ")
                    );
                };
                let solar = solar_hourly(data, city)?;
                let peak_kw = PV_PEAK_OVER_LOAD * full_kw;
                (0..n_slots)
                    .map(|t| {
                        let key = hour_key(start) + t as i64;
                        let s = solar.get(&key).copied().with_context(|| {
                            format!(
                                "no Solcast PV data for {}: the profiles cover 2022-06-08 to 2022-08-31",
                                (start + Duration::hours(t as i64)).to_rfc3339()
                            )
                        })?;
                        Ok((peak_kw * s - PV_EXPORT_SHARE * peak_kw).max(0.0))
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            SurplusRule::GbCurtailment | SurplusRule::Auto => {
                let path =
                    data.join("energy/gb_wind_curtailment_oct2025/october_imbalance_over_time.csv");
                let series: Vec<f64> = hourly_column(&[path], "time", "total_curtailment")?
                    .values()
                    .map(|gwh| (-gwh).max(0.0) * 1e6)
                    .collect();
                let mut sorted = series.clone();
                sorted.sort_by(f64::total_cmp);
                let p90 = sorted[(sorted.len() * 9 / 10).min(sorted.len() - 1)].max(1.0);
                let share = full_kw / p90;
                (0..n_slots)
                    .map(|t| series[t % series.len()] * share)
                    .collect()
            }
        };
        rules_used.push(format!("{id}: {rule:?}"));
        for (t, surplus_kw) in surplus.iter().enumerate() {
            let time = start + Duration::hours(t as i64);
            let key = hour_key(time);
            let c = carbon.get(&key).with_context(|| {
                format!("zone {zone}: no carbon intensity for {}", time.to_rfc3339())
            })?;
            let price = prices
                .as_ref()
                .and_then(|p| p.get(&key))
                .map_or(String::new(), |p| format!("{p:.2}"));
            let _ = writeln!(
                signal_rows,
                "{},{id},{:.3},{c:.2},{price}",
                time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                surplus_kw
            );
        }
        sites.push(SiteConfig {
            id,
            zone: Some(zone.clone()),
            gpus: BTreeMap::from([(model.to_string(), config.gpus_per_site)]),
            pue: (pue * 100.0).round() / 100.0,
            grid_limit_kw: None,
            wan_gbps: wan,
        });
    }

    // Jobs: GAIA PAI arrivals and lengths, Alibaba GPU gang sizes.
    let pai = read_text(&data.join("jobs/gaia_pai_derived/pai_1k.csv"))?;
    let mut trace: Vec<(f64, f64)> = Vec::new();
    for (i, record) in csv::Reader::from_reader(pai.as_bytes())
        .records()
        .enumerate()
    {
        let record = record.with_context(|| format!("pai_1k.csv: line {}", i + 2))?;
        let arrival: f64 = record
            .get(0)
            .unwrap_or("")
            .parse()
            .context("pai_1k.csv: arrival_time")?;
        let length: f64 = record
            .get(1)
            .unwrap_or("")
            .parse()
            .context("pai_1k.csv: length")?;
        trace.push((arrival, length));
    }
    let gangs = gang_sizes(data)?;
    let gang_total: f64 = gangs.iter().map(|(_, w)| w).sum();
    let week_s = 7.0 * 86_400.0;
    let window_s = f64::from(config.days) * 86_400.0 * ARRIVAL_SHARE;
    let offset = (uniform(seed, 300, 0) * trace.len() as f64) as usize;
    let mut jobs_csv = String::from(
        "id,submit_utc,gpus,gpu_models,work_hours,deadline_utc,checkpoint_gb,migratable,home_site,save_s,restore_s\n",
    );
    let mut total_gpu_h = 0.0;
    // Trace time of the k-th sampled job, from the first sampled one; the trace repeats weekly.
    let first_arrival_s = trace[offset].0;
    let trace_s = |k: usize| {
        let cycle = (offset + k) / trace.len();
        cycle as f64 * week_s + trace[(offset + k) % trace.len()].0 - first_arrival_s
    };
    let span_s = trace_s(config.jobs - 1).max(1.0);
    for k in 0..config.jobs {
        let (_, length_s) = trace[(offset + k) % trace.len()];
        let position = trace_s(k) / span_s;
        let submit = start + Duration::seconds((position * window_s) as i64);
        let work_h = (length_s / 3600.0).clamp(MIN_WORK_H, MAX_WORK_H);
        let mut pick = uniform(seed, 400, k as u64) * gang_total;
        let mut gpus = 1;
        for (size, weight) in &gangs {
            gpus = *size;
            if pick < *weight {
                break;
            }
            pick -= weight;
        }
        let gpus = gpus.min(config.gpus_per_site);
        let slack = lo + (hi - lo) * uniform(seed, 500, k as u64);
        // Work is at full power on a speed-1.0 GPU; a slower allowed model needs more time,
        // so the deadline allows for the slowest model.
        let slowest = 0.6;
        // Deadlines stop at the scenario end, so every policy is judged on jobs it can finish.
        let deadline = (submit
            + Duration::seconds(((work_h / slowest) * (1.0 + slack) * 3600.0 + 7200.0) as i64))
        .min(end);
        let checkpoint_gb = f64::from(gpus) * 2.0 * 20f64.powf(uniform(seed, 600, k as u64));
        let migratable = uniform(seed, 700, k as u64) < config.migratable_share;
        let home = (uniform(seed, 800, k as u64) * sites.len() as f64) as usize;
        total_gpu_h += work_h * f64::from(gpus);
        let _ = writeln!(
            jobs_csv,
            "job-{k:05},{},{gpus},,{work_h:.4},{},{checkpoint_gb:.1},{migratable},{},{:.0},{:.0}",
            submit.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            sites[home].id,
            30.0 + checkpoint_gb / 2.0,
            60.0 + checkpoint_gb / 2.0,
        );
    }

    let file = SitesFile {
        gpu_models,
        sites,
        links_gbps: BTreeMap::new(),
        params: windfall_solver::Params::default(),
    };
    std::fs::create_dir_all(&config.out)
        .with_context(|| format!("creating {}", config.out.display()))?;
    let header = format!(
        "# Built by `windfall scenario build` (seed {seed}) from public traces; see docs/evaluation.md.\n# Surplus rules: {}\n",
        rules_used.join(", ")
    );
    let sites_toml = format!(
        "{header}{}",
        toml::to_string(&file).context("writing sites.toml")?
    );
    for (name, text) in [
        ("sites.toml", sites_toml),
        ("signals.csv", signal_rows),
        ("jobs.csv", jobs_csv),
    ] {
        let path = config.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let stale = config.out.join("forecasts.csv");
    if stale.exists() {
        std::fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    let fleet_gpus = f64::from(config.gpus_per_site) * config.zones.len() as f64;
    Ok(format!(
        "scenario written to {}: {} sites ({}), {} jobs ({:.0} GPU-hours of work, {:.0} % of the fleet's GPU-hours), {} hourly slots from {}",
        config.out.display(),
        config.zones.len(),
        rules_used.join(", "),
        config.jobs,
        total_gpu_h,
        100.0 * total_gpu_h / (fleet_gpus * n_slots as f64),
        n_slots,
        start.to_rfc3339()
    ))
}

/// Gang sizes and their counts among the Alibaba GPU pods that use at least one GPU.
fn gang_sizes(data: &Path) -> anyhow::Result<Vec<(u32, f64)>> {
    let path = data.join("jobs/alibaba_gpu_v2023_openb/openb_pod_list_default.csv");
    let text = read_text(&path)?;
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let column = reader
        .headers()?
        .iter()
        .position(|h| h == "num_gpu")
        .with_context(|| format!("{}: no column num_gpu", path.display()))?;
    let mut counts: BTreeMap<u32, f64> = BTreeMap::new();
    for record in reader.records() {
        let record = record?;
        if let Ok(n) = record.get(column).unwrap_or("").parse::<u32>()
            && n >= 1
        {
            *counts.entry(n).or_default() += 1.0;
        }
    }
    if counts.is_empty() {
        bail!("{}: no GPU pods", path.display());
    }
    Ok(counts.into_iter().collect())
}

/// Hourly mean PV output (0..1) of a Solcast city, keyed by UTC hour (period-end stamps).
fn solar_hourly(data: &Path, city: &str) -> anyhow::Result<BTreeMap<i64, f64>> {
    let path = data.join("energy/solar_solcast_2022_vessim/solcast2022_global_actual.csv.gz");
    let text = read_text(&path)?;
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let column = reader
        .headers()?
        .iter()
        .position(|h| h == city)
        .with_context(|| format!("{}: no column `{city}`", path.display()))?;
    let mut sums: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.with_context(|| format!("{}: line {}", path.display(), i + 2))?;
        let time = parse_time(record.get(0).unwrap_or(""))
            .with_context(|| format!("{}: line {}", path.display(), i + 2))?;
        let Ok(value) = record.get(column).unwrap_or("").parse::<f64>() else {
            continue;
        };
        // A value stamped at its period's end belongs to the hour that period lies in.
        let key = hour_key(time - Duration::seconds(1));
        let entry = sums.entry(key).or_default();
        entry.0 += value;
        entry.1 += 1.0;
    }
    Ok(sums.into_iter().map(|(k, (s, n))| (k, s / n)).collect())
}
