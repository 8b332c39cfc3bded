//! What a policy may know of the signals at a given time.
//!
//! Owns the forecast lookup (the newest value issued at or before now, from the scenario's
//! `forecasts.csv`) and the seeded error model that derives forecasts from the actuals when a
//! scenario has none. It must never return a value issued after the time it is asked at: for a
//! slot that has started or lies ahead, only a forecast; for a past slot, the observed actual.
//!
//! # Error model
//! A forecast issued at slot start `now` for slot `t >= now` (lead `L = (t - now)` hours) is the
//! actual scaled by an independent Gaussian factor, clipped at zero:
//! `carbon x max(0, 1 + sigma_c(L) z1)` and `surplus x max(0, 1 + sigma_s(L) z2)`, with
//! `sigma(L) = min(cap, base + growth x L)`. `z1, z2` are standard normal draws from a hash of
//! (seed, site, now, t), so the same replay always sees the same forecasts, and a forecast for
//! `t` changes with each new issue time as a real one would.

use chrono::{DateTime, Utc};
use windfall_forecasts::SignalRow;

use super::scenario::Scenario;

/// Signal values at one site and slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Signal {
    /// Surplus power, kW.
    pub surplus_kw: f64,
    /// Grid carbon intensity, g CO2e/kWh.
    pub carbon_g_per_kwh: f64,
    /// Price, USD/MWh, if known.
    pub price_usd_per_mwh: Option<f64>,
}

impl From<&SignalRow> for Signal {
    fn from(row: &SignalRow) -> Self {
        Signal {
            surplus_kw: row.surplus_kw,
            carbon_g_per_kwh: row.carbon_g_per_kwh,
            price_usd_per_mwh: row.price_usd_per_mwh,
        }
    }
}

/// The seeded forecast error model (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorModel {
    /// Seed of the draws.
    pub seed: u64,
    /// Carbon: relative error at lead 0.
    pub carbon_base: f64,
    /// Carbon: added relative error per hour of lead.
    pub carbon_growth_per_h: f64,
    /// Carbon: largest relative error.
    pub carbon_cap: f64,
    /// Surplus: relative error at lead 0.
    pub surplus_base: f64,
    /// Surplus: added relative error per hour of lead.
    pub surplus_growth_per_h: f64,
    /// Surplus: largest relative error.
    pub surplus_cap: f64,
}

impl Default for ErrorModel {
    /// Day-ahead carbon forecasts are typically within 5-15 % (mean absolute percentage
    /// error); surplus (curtailment) forecasts are much worse, so surplus gets a larger,
    /// faster-growing error.
    fn default() -> Self {
        ErrorModel {
            seed: 1,
            carbon_base: 0.02,
            carbon_growth_per_h: 0.004,
            carbon_cap: 0.25,
            surplus_base: 0.05,
            surplus_growth_per_h: 0.015,
            surplus_cap: 0.6,
        }
    }
}

impl ErrorModel {
    /// The same model scaled by `factor` (0 = perfect forecasts).
    pub fn scaled(&self, factor: f64) -> ErrorModel {
        ErrorModel {
            carbon_base: self.carbon_base * factor,
            carbon_growth_per_h: self.carbon_growth_per_h * factor,
            carbon_cap: self.carbon_cap * factor,
            surplus_base: self.surplus_base * factor,
            surplus_growth_per_h: self.surplus_growth_per_h * factor,
            surplus_cap: self.surplus_cap * factor,
            ..self.clone()
        }
    }
}

enum Source {
    /// The actuals, perturbed by the error model.
    Derived(ErrorModel),
    /// The actuals themselves (the oracle's view).
    Perfect,
}

/// The forecasts of one replay.
pub struct Forecasts<'a> {
    scenario: &'a Scenario,
    source: Source,
}

impl<'a> Forecasts<'a> {
    /// The scenario's `forecasts.csv` when it has one, else forecasts derived with `error`.
    pub fn new(scenario: &'a Scenario, error: ErrorModel) -> Forecasts<'a> {
        Forecasts {
            scenario,
            source: Source::Derived(error),
        }
    }

    /// Perfect knowledge of the actuals, for the oracle.
    pub fn perfect(scenario: &'a Scenario) -> Forecasts<'a> {
        Forecasts {
            scenario,
            source: Source::Perfect,
        }
    }

    /// How the forecasts are made, for reports.
    pub fn describe(&self) -> String {
        match (&self.source, &self.scenario.forecast_rows) {
            (Source::Perfect, _) => "perfect (the actuals)".into(),
            (Source::Derived(_), Some(_)) => "the scenario's forecasts.csv".into(),
            (Source::Derived(e), None) => format!(
                "derived from the actuals: carbon error {:.0} % + {:.1} %/h of lead (cap {:.0} %), surplus error {:.0} % + {:.1} %/h (cap {:.0} %), seed {}",
                e.carbon_base * 100.0,
                e.carbon_growth_per_h * 100.0,
                e.carbon_cap * 100.0,
                e.surplus_base * 100.0,
                e.surplus_growth_per_h * 100.0,
                e.surplus_cap * 100.0,
                e.seed
            ),
        }
    }

    /// The value for `site` at `slot` as known at the start of slot `now`.
    pub fn at(&self, site: usize, slot: usize, now: usize) -> Signal {
        let fleet = &self.scenario.fleet;
        let slot = slot.min(fleet.slots - 1);
        if slot < now {
            return self.scenario.actual(site, slot);
        }
        match &self.source {
            Source::Perfect => self.scenario.actual(site, slot),
            Source::Derived(error) => match &self.scenario.forecast_rows {
                Some(rows) => newest_issued_by(&rows[site][slot], fleet.slot_start(now))
                    // A slot ahead with nothing issued yet: the newest forecast for the current
                    // slot (always present: the scenario checks it), held flat.
                    .or_else(|| newest_issued_by(&rows[site][now], fleet.slot_start(now)))
                    .expect("the scenario checks every slot has a forecast issued by its start"),
                None => derive(self.scenario, error, site, slot, now),
            },
        }
    }
}

fn newest_issued_by(values: &[(DateTime<Utc>, Signal)], now: DateTime<Utc>) -> Option<Signal> {
    let n = values.partition_point(|(issued, _)| *issued <= now);
    (n > 0).then(|| values[n - 1].1)
}

fn derive(scenario: &Scenario, error: &ErrorModel, site: usize, slot: usize, now: usize) -> Signal {
    let actual = scenario.actual(site, slot);
    let lead_h = (slot - now) as f64 * scenario.fleet.slot_hours();
    let sigma_c = (error.carbon_base + error.carbon_growth_per_h * lead_h).min(error.carbon_cap);
    let sigma_s = (error.surplus_base + error.surplus_growth_per_h * lead_h).min(error.surplus_cap);
    let (z1, z2) = normal_pair(error.seed, site as u64, now as u64, slot as u64);
    Signal {
        surplus_kw: actual.surplus_kw * (1.0 + sigma_s * z2).max(0.0),
        carbon_g_per_kwh: actual.carbon_g_per_kwh * (1.0 + sigma_c * z1).max(0.0),
        price_usd_per_mwh: actual.price_usd_per_mwh,
    }
}

/// splitmix64: a fast, well-mixed hash step.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Two independent standard normal draws keyed by the arguments (Box-Muller).
fn normal_pair(seed: u64, a: u64, b: u64, c: u64) -> (f64, f64) {
    let k = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
    let u1 = ((splitmix64(k) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = ((splitmix64(k ^ 0x5555) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let r = (-2.0 * u1.ln()).sqrt();
    let theta = 2.0 * std::f64::consts::PI * u2;
    (r * theta.cos(), r * theta.sin())
}

/// Uniform draw in [0, 1) keyed by the arguments (for scenario building).
pub fn uniform(seed: u64, a: u64, b: u64) -> f64 {
    let k = splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
    (k >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_draws_have_unit_spread() {
        let n = 20_000;
        let draws: Vec<f64> = (0..n).map(|i| normal_pair(7, i, 0, 0).0).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|z| (z - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }
}
