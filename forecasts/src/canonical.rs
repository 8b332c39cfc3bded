//! The canonical forecast CSV of formats.md section 3:
//! `issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh`.
//!
//! Owns parsing and row-level checks (times with offsets, finite non-negative surplus and carbon,
//! carbon at most 2000 g/kWh, a known signal type). Empty cells are missing values.

use chrono::{DateTime, Utc};

use crate::{ParseError, Table, parse_utc};

/// Whether a carbon value is an average or a marginal intensity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarbonSignal {
    /// Average intensity of the grid mix.
    Average,
    /// Intensity of the marginal generator.
    Marginal,
}

impl CarbonSignal {
    /// The name used in files and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            CarbonSignal::Average => "average",
            CarbonSignal::Marginal => "marginal",
        }
    }

    /// Parses `average` or `marginal`.
    pub fn parse(text: &str) -> Option<CarbonSignal> {
        match text {
            "average" => Some(CarbonSignal::Average),
            "marginal" => Some(CarbonSignal::Marginal),
            _ => None,
        }
    }
}

/// One value set for one site and time, as known at `issued_utc`.
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastPoint {
    /// When the forecast was issued.
    pub issued_utc: DateTime<Utc>,
    /// Start of the interval the values describe.
    pub time_utc: DateTime<Utc>,
    /// Site id.
    pub site: String,
    /// Surplus (curtailed renewable) power available, kW.
    pub surplus_kw: Option<f64>,
    /// Grid carbon intensity, g CO2e/kWh.
    pub carbon_g_per_kwh: Option<f64>,
    /// Signal type of `carbon_g_per_kwh`.
    pub carbon_signal: CarbonSignal,
    /// Wholesale price, USD/MWh.
    pub price_usd_per_mwh: Option<f64>,
}

/// Highest carbon intensity accepted, g/kWh: above it a value is a unit or data error.
pub const MAX_CARBON_G_PER_KWH: f64 = 2000.0;

const COLUMNS: [&str; 7] = [
    "issued_utc",
    "time_utc",
    "site",
    "surplus_kw",
    "carbon_g_per_kwh",
    "carbon_signal",
    "price_usd_per_mwh",
];

/// Parses canonical forecast CSV text; `source_name` labels errors.
pub fn parse_canonical_csv(
    text: &str,
    source_name: &str,
) -> Result<Vec<ForecastPoint>, ParseError> {
    let table = Table::read(text, source_name, &COLUMNS)?;
    let mut points = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let time = |column: &str| {
            parse_utc(table.get(record, column)).map_err(|m| table.field_error(line, column, m))
        };
        let number = |column: &str, min: f64, max: f64| -> Result<Option<f64>, ParseError> {
            let cell = table.get(record, column);
            if cell.is_empty() {
                return Ok(None);
            }
            let value: f64 = cell.parse().map_err(|_| {
                table.field_error(line, column, format!("`{cell}` is not a number"))
            })?;
            if !value.is_finite() || value < min || value > max {
                return Err(table.field_error(
                    line,
                    column,
                    format!("{value} is outside [{min}, {max}]"),
                ));
            }
            Ok(Some(value))
        };
        let site = table.get(record, "site");
        if site.is_empty() {
            return Err(table.field_error(line, "site", "empty site id"));
        }
        let signal_text = table.get(record, "carbon_signal");
        let carbon_signal = if signal_text.is_empty() {
            CarbonSignal::Average
        } else {
            CarbonSignal::parse(signal_text).ok_or_else(|| {
                table.field_error(
                    line,
                    "carbon_signal",
                    format!("`{signal_text}` is neither `average` nor `marginal`"),
                )
            })?
        };
        points.push(ForecastPoint {
            issued_utc: time("issued_utc")?,
            time_utc: time("time_utc")?,
            site: site.to_string(),
            surplus_kw: number("surplus_kw", 0.0, f64::MAX)?,
            carbon_g_per_kwh: number("carbon_g_per_kwh", 0.0, MAX_CARBON_G_PER_KWH)?,
            carbon_signal,
            price_usd_per_mwh: number("price_usd_per_mwh", f64::MIN, f64::MAX)?,
        });
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh\n";

    #[test]
    fn parses_rows_with_missing_cells() {
        let text =
            format!("{HEADER}2023-05-20T00:00:00Z,2023-05-20T01:00:00+01:00,a,1.5,100,average,\n");
        let points = parse_canonical_csv(&text, "t.csv").unwrap();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].time_utc.to_rfc3339(), "2023-05-20T00:00:00+00:00");
        assert_eq!(points[0].price_usd_per_mwh, None);
        assert_eq!(points[0].surplus_kw, Some(1.5));
    }

    #[test]
    fn names_line_and_column_of_bad_values() {
        let text = format!("{HEADER}2023-05-20T00:00:00Z,2023-05-20T00:00:00Z,a,1,2500,average,\n");
        let err = parse_canonical_csv(&text, "t.csv").unwrap_err().to_string();
        assert!(
            err.contains("line 2") && err.contains("carbon_g_per_kwh"),
            "{err}"
        );
        let text = format!("{HEADER}2023-05-20T00:00:00,2023-05-20T00:00:00Z,a,1,2,average,\n");
        let err = parse_canonical_csv(&text, "t.csv").unwrap_err().to_string();
        assert!(
            err.contains("issued_utc") && err.contains("offset"),
            "{err}"
        );
    }

    #[test]
    fn bundled_signals_parse() {
        let points = parse_canonical_csv(crate::samples::SIGNALS_CSV, "sample").unwrap();
        assert!(points.len() >= 4 * 7 * 24);
    }
}
