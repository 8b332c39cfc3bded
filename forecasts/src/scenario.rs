//! The simulator's signal files of formats.md section 2: `signals.csv` (the actuals,
//! `time_utc,site,surplus_kw,carbon_g_per_kwh,price_usd_per_mwh`) and the optional
//! `forecasts.csv` (the same with `issued_utc` first).
//!
//! Owns parsing and row-level checks: times in RFC 3339, non-negative finite surplus, carbon in
//! range, price optional. It does not check that the rows cover a grid of slots and sites: the
//! simulator does, since only it knows the sites.

use chrono::{DateTime, Utc};

use crate::{ParseError, Table, parse_utc};

/// Largest carbon intensity accepted, g/kWh (twice the dirtiest lignite plant).
const MAX_CARBON_G_PER_KWH: f64 = 2000.0;

/// One row of `signals.csv` or `forecasts.csv`.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalRow {
    /// When the value was issued (forecasts only; `None` for actuals).
    pub issued_utc: Option<DateTime<Utc>>,
    /// Start of the slot the value is for.
    pub time_utc: DateTime<Utc>,
    /// Site id.
    pub site: String,
    /// Surplus (curtailed) power available, kW.
    pub surplus_kw: f64,
    /// Grid carbon intensity, g CO2e/kWh.
    pub carbon_g_per_kwh: f64,
    /// Wholesale price, USD/MWh (empty = unknown).
    pub price_usd_per_mwh: Option<f64>,
}

/// Parses `signals.csv` (actuals).
pub fn parse_signals_csv(text: &str, source_name: &str) -> Result<Vec<SignalRow>, ParseError> {
    parse(text, source_name, false)
}

/// Parses a scenario's `forecasts.csv` (the columns of `signals.csv` after `issued_utc`).
pub fn parse_scenario_forecasts_csv(
    text: &str,
    source_name: &str,
) -> Result<Vec<SignalRow>, ParseError> {
    parse(text, source_name, true)
}

fn parse(text: &str, source_name: &str, issued: bool) -> Result<Vec<SignalRow>, ParseError> {
    let mut required = vec!["time_utc", "site", "surplus_kw", "carbon_g_per_kwh"];
    if issued {
        required.insert(0, "issued_utc");
    }
    let table = Table::read(text, source_name, &required)?;
    let mut rows = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let cell = |column: &str| table.get(record, column);
        let err = |column: &str, message: String| table.field_error(line, column, message);
        let number = |column: &str| -> Result<f64, ParseError> {
            let text = cell(column);
            let value: f64 = text
                .parse()
                .map_err(|_| err(column, format!("`{text}` is not a number")))?;
            if !value.is_finite() {
                return Err(err(column, format!("{value} is not a finite number")));
            }
            Ok(value)
        };
        let issued_utc = if issued {
            Some(parse_utc(cell("issued_utc")).map_err(|m| err("issued_utc", m))?)
        } else {
            None
        };
        let time_utc = parse_utc(cell("time_utc")).map_err(|m| err("time_utc", m))?;
        let site = cell("site");
        if site.is_empty() {
            return Err(err("site", "empty site id".into()));
        }
        let surplus_kw = number("surplus_kw")?;
        if surplus_kw < 0.0 {
            return Err(err("surplus_kw", format!("{surplus_kw} kW is negative")));
        }
        let carbon_g_per_kwh = number("carbon_g_per_kwh")?;
        if !(0.0..=MAX_CARBON_G_PER_KWH).contains(&carbon_g_per_kwh) {
            return Err(err(
                "carbon_g_per_kwh",
                format!("{carbon_g_per_kwh} g/kWh is outside [0, {MAX_CARBON_G_PER_KWH}]"),
            ));
        }
        let price_usd_per_mwh = if cell("price_usd_per_mwh").is_empty() {
            None
        } else {
            Some(number("price_usd_per_mwh")?)
        };
        rows.push(SignalRow {
            issued_utc,
            time_utc,
            site: site.to_string(),
            surplus_kw,
            carbon_g_per_kwh,
            price_usd_per_mwh,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_actuals_with_empty_price() {
        let text = "time_utc,site,surplus_kw,carbon_g_per_kwh,price_usd_per_mwh\n\
                    2023-01-01T00:00:00Z,a,10,200,\n2023-01-01T01:00:00Z,a,0,210,-3.5\n";
        let rows = parse_signals_csv(text, "signals.csv").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].price_usd_per_mwh, None);
        assert_eq!(rows[1].price_usd_per_mwh, Some(-3.5));
    }

    #[test]
    fn names_line_and_column() {
        let text = "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh\n\
                    2023-01-01T00:00:00Z,2023-01-01T00:00:00Z,a,-1,200\n";
        let e = parse_scenario_forecasts_csv(text, "forecasts.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("surplus_kw"), "{e}");
    }
}
