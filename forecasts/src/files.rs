//! Adapters for published data files that are not in the canonical layout: the Electricity Maps
//! hourly export (carbon intensity) and the GB balancing-mechanism wind curtailment series
//! (surplus power).
//!
//! Owns each layout's columns, units and conversions, and the series checks every adapter
//! applies (finite, in range, strictly increasing timestamps). Values are *observed* data: each
//! point's issue time is its own interval start. Must not touch a database or the network.

use chrono::{DateTime, NaiveDateTime, Utc};

use crate::canonical::{CarbonSignal, ForecastPoint, MAX_CARBON_G_PER_KWH};
use crate::{ParseError, Table};

/// Electricity Maps export: hour-start time column and the direct (scope 2) intensity column.
const EM_TIME: &str = "Datetime (UTC)";
const EM_CARBON: &str = "Carbon Intensity gCO₂eq/kWh (direct)";

/// GB curtailment columns: hour-start time (naive, UTC) and curtailed energy in GWh per hour
/// (negative = curtailed).
const GB_TIME: &str = "time";
const GB_CURTAILMENT: &str = "total_curtailment";

/// kW in one GWh per hour.
const KW_PER_GWH_PER_H: f64 = 1_000_000.0;

fn naive_utc(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    for format in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(t.and_utc());
        }
    }
    crate::parse_utc(text)
        .map_err(|_| format!("`{text}` is not a time (YYYY-MM-DD HH:MM:SS in UTC, or RFC 3339)"))
}

fn number(
    table: &Table,
    line: u64,
    record: &csv::StringRecord,
    column: &str,
) -> Result<f64, ParseError> {
    let cell = table.get(record, column);
    let value: f64 = cell
        .parse()
        .map_err(|_| table.field_error(line, column, format!("`{cell}` is not a number")))?;
    if !value.is_finite() {
        return Err(table.field_error(line, column, format!("{value} is not a finite number")));
    }
    Ok(value)
}

/// Refuses a series whose timestamps repeat or go backwards, naming the line.
fn check_increasing(
    table: &Table,
    column: &str,
    times: &[(u64, DateTime<Utc>)],
) -> Result<(), ParseError> {
    for pair in times.windows(2) {
        let ((_, a), (line, b)) = (pair[0], pair[1]);
        if b == a {
            return Err(table.field_error(line, column, format!("duplicate timestamp {b}")));
        }
        if b < a {
            return Err(table.field_error(
                line,
                column,
                format!("timestamp {b} is before the previous row's {a}"),
            ));
        }
    }
    Ok(())
}

/// Parses an Electricity Maps hourly export into carbon points for `site` (an *average* signal:
/// the export's direct intensity).
pub fn parse_em_export_csv(
    text: &str,
    source_name: &str,
    site: &str,
) -> Result<Vec<ForecastPoint>, ParseError> {
    let table = Table::read(text, source_name, &[EM_TIME, EM_CARBON])?;
    let mut points = Vec::with_capacity(table.rows.len());
    let mut times = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let time = naive_utc(table.get(record, EM_TIME))
            .map_err(|m| table.field_error(line, EM_TIME, m))?;
        let carbon = number(&table, line, record, EM_CARBON)?;
        if !(0.0..=MAX_CARBON_G_PER_KWH).contains(&carbon) {
            return Err(table.field_error(
                line,
                EM_CARBON,
                format!("{carbon} g/kWh is outside [0, {MAX_CARBON_G_PER_KWH}]"),
            ));
        }
        times.push((line, time));
        points.push(ForecastPoint {
            issued_utc: time,
            time_utc: time,
            site: site.to_string(),
            surplus_kw: None,
            carbon_g_per_kwh: Some(carbon),
            carbon_signal: CarbonSignal::Average,
            price_usd_per_mwh: None,
        });
    }
    check_increasing(&table, EM_TIME, &times)?;
    Ok(points)
}

/// Parses the GB wind curtailment series into surplus points for `site`: the site's surplus is
/// `share` of the curtailed power, `max(0, -total_curtailment) x 1e6 kW per GWh/h x share`.
pub fn parse_gb_curtailment_csv(
    text: &str,
    source_name: &str,
    site: &str,
    share: f64,
) -> Result<Vec<ForecastPoint>, ParseError> {
    let table = Table::read(text, source_name, &[GB_TIME, GB_CURTAILMENT])?;
    if !(share.is_finite() && share > 0.0 && share <= 1.0) {
        return Err(ParseError::Csv {
            source_name: source_name.to_string(),
            line: 1,
            message: format!("the site's share of GB curtailment must be in (0, 1], not {share}"),
        });
    }
    let mut points = Vec::with_capacity(table.rows.len());
    let mut times = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let time = naive_utc(table.get(record, GB_TIME))
            .map_err(|m| table.field_error(line, GB_TIME, m))?;
        let curtailed_gwh = number(&table, line, record, GB_CURTAILMENT)?;
        times.push((line, time));
        points.push(ForecastPoint {
            issued_utc: time,
            time_utc: time,
            site: site.to_string(),
            surplus_kw: Some((-curtailed_gwh).max(0.0) * KW_PER_GWH_PER_H * share),
            carbon_g_per_kwh: None,
            carbon_signal: CarbonSignal::Average,
            price_usd_per_mwh: None,
        });
    }
    check_increasing(&table, GB_TIME, &times)?;
    Ok(points)
}

/// Pacific local time (CAISO's clock) to UTC under the US rules since 2007: daylight time
/// (UTC-7) from the second Sunday of March, 02:00, to the first Sunday of November, 02:00;
/// standard time (UTC-8) otherwise. In the repeated hour of November the first pass is taken as
/// daylight time.
pub fn pacific_to_utc(local: chrono::NaiveDateTime) -> DateTime<Utc> {
    use chrono::{Datelike, NaiveDate, Weekday};
    let year = local.year();
    let nth_sunday = |month: u32, n: u32| {
        NaiveDate::from_weekday_of_month_opt(year, month, Weekday::Sun, n as u8)
            .and_then(|d| d.and_hms_opt(2, 0, 0))
    };
    let dst = match (nth_sunday(3, 2), nth_sunday(11, 1)) {
        (Some(start), Some(end)) => local >= start && local < end,
        _ => false,
    };
    let offset_h = if dst { 7 } else { 8 };
    (local + chrono::Duration::hours(offset_h)).and_utc()
}

const CAISO_DATE: &str = "Date";
const CAISO_HOUR: &str = "Hour";
const CAISO_INTERVAL: &str = "Interval";
const CAISO_WIND: &str = "Wind Curtailment";
const CAISO_SOLAR: &str = "Solar Curtailment";

/// Parses CAISO's production-and-curtailment data, Curtailments layout (`Date, Hour, Interval,
/// Wind Curtailment, Solar Curtailment[, Reason]`, MW, 5-minute intervals, Pacific local time,
/// only intervals with curtailment listed; a blank cell is 0) into hourly surplus points for
/// `site`: `share` of the curtailed power, averaged over each hour (intervals not listed count
/// as 0 within an hour that has any listed interval).
pub fn parse_caiso_curtailment_csv(
    text: &str,
    source_name: &str,
    site: &str,
    share: f64,
) -> Result<Vec<ForecastPoint>, ParseError> {
    let table = Table::read(
        text,
        source_name,
        &[
            CAISO_DATE,
            CAISO_HOUR,
            CAISO_INTERVAL,
            CAISO_WIND,
            CAISO_SOLAR,
        ],
    )?;
    if !(share.is_finite() && share > 0.0 && share <= 1.0) {
        return Err(ParseError::Csv {
            source_name: source_name.to_string(),
            line: 1,
            message: format!(
                "the site's share of CAISO curtailment must be in (0, 1], not {share}"
            ),
        });
    }
    let mut hours: std::collections::BTreeMap<DateTime<Utc>, f64> =
        std::collections::BTreeMap::new();
    let mut times = Vec::with_capacity(table.rows.len());
    for (line, record) in &table.rows {
        let line = *line;
        let date_text = table.get(record, CAISO_DATE).trim();
        // Workbook exports write `4/14/2024` or `4/14/2024 12:00:00 AM`; the date part counts.
        let date_part = date_text.split_whitespace().next().unwrap_or("");
        let date = chrono::NaiveDate::parse_from_str(date_part, "%m/%d/%Y")
            .or_else(|_| chrono::NaiveDate::parse_from_str(date_part, "%Y-%m-%d"))
            .map_err(|_| {
                table.field_error(
                    line,
                    CAISO_DATE,
                    format!("`{date_text}` is not a date (M/D/YYYY)"),
                )
            })?;
        let hour: u32 = table
            .get(record, CAISO_HOUR)
            .trim()
            .parse()
            .ok()
            .filter(|h| (1..=25).contains(h))
            .ok_or_else(|| {
                table.field_error(
                    line,
                    CAISO_HOUR,
                    "must be an hour ending, 1-24 (25 on the autumn change)",
                )
            })?;
        let interval: u32 = table
            .get(record, CAISO_INTERVAL)
            .trim()
            .parse()
            .ok()
            .filter(|i| (1..=12).contains(i))
            .ok_or_else(|| {
                table.field_error(line, CAISO_INTERVAL, "must be a 5-minute interval, 1-12")
            })?;
        let mw = |column: &str| -> Result<f64, ParseError> {
            let cell = table.get(record, column).trim();
            if cell.is_empty() {
                return Ok(0.0);
            }
            let v: f64 = cell.parse().map_err(|_| {
                table.field_error(line, column, format!("`{cell}` is not a number"))
            })?;
            if !v.is_finite() || v < 0.0 {
                return Err(table.field_error(
                    line,
                    column,
                    format!("{v} MW: must be a number >= 0"),
                ));
            }
            Ok(v)
        };
        let total_mw = mw(CAISO_WIND)? + mw(CAISO_SOLAR)?;
        let local = date.and_hms_opt(0, 0, 0).expect("midnight exists")
            + chrono::Duration::hours(i64::from(hour - 1))
            + chrono::Duration::minutes(5 * i64::from(interval - 1));
        let time = pacific_to_utc(local);
        times.push((line, time));
        let hour_start =
            time - chrono::Duration::minutes(i64::from(chrono::Timelike::minute(&time)));
        // Each 5-minute interval is a twelfth of its hour.
        *hours.entry(hour_start).or_default() += total_mw * 1000.0 * share / 12.0;
    }
    check_increasing(&table, CAISO_DATE, &times)?;
    Ok(hours
        .into_iter()
        .map(|(t, kw)| ForecastPoint {
            issued_utc: t,
            time_utc: t,
            site: site.to_string(),
            surplus_kw: Some(kw),
            carbon_g_per_kwh: None,
            carbon_signal: CarbonSignal::Average,
            price_usd_per_mwh: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caiso_curtailment_becomes_hourly_surplus_in_utc() {
        let text = "Date,Hour,Interval,Wind Curtailment,Solar Curtailment,Reason\n\
                    4/14/2024,13,1,,2875.31,System\n\
                    4/14/2024,13,2,12,1200,Local\n\
                    1/10/2024,1,1,6,,System\n";
        // Unordered (January after April) is refused.
        let e = parse_caiso_curtailment_csv(text, "c.csv", "s", 0.5).unwrap_err();
        assert!(e.to_string().contains("c.csv: line 4"), "{e}");
        let text = "Date,Hour,Interval,Wind Curtailment,Solar Curtailment,Reason\n\
                    1/10/2024,1,1,6,,System\n\
                    4/14/2024,13,1,,2875.31,System\n\
                    4/14/2024,13,2,12,1200,Local\n";
        let points = parse_caiso_curtailment_csv(text, "c.csv", "s", 0.5).unwrap();
        assert_eq!(points.len(), 2);
        // January: standard time, hour ending 1 = 00:00 PST = 08:00 UTC.
        assert_eq!(points[0].time_utc.to_rfc3339(), "2024-01-10T08:00:00+00:00");
        assert!((points[0].surplus_kw.unwrap() - 6.0 * 1000.0 * 0.5 / 12.0).abs() < 1e-9);
        // April: daylight time, hour ending 13 = 12:00 PDT = 19:00 UTC.
        assert_eq!(points[1].time_utc.to_rfc3339(), "2024-04-14T19:00:00+00:00");
        let expected = (2875.31 + 1212.0) * 1000.0 * 0.5 / 12.0;
        assert!((points[1].surplus_kw.unwrap() - expected).abs() < 1e-6);
        let bad = "Date,Hour,Interval,Wind Curtailment,Solar Curtailment\n4/14/2024,13,13,1,1\n";
        let e = parse_caiso_curtailment_csv(bad, "c.csv", "s", 0.5).unwrap_err();
        assert!(e.to_string().contains("Interval"), "{e}");
        let neg = "Date,Hour,Interval,Wind Curtailment,Solar Curtailment\n4/14/2024,13,1,-1,1\n";
        assert!(parse_caiso_curtailment_csv(neg, "c.csv", "s", 0.5).is_err());
    }

    const EM_HEADER: &str = "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,Data Estimated,Data Estimation Method\n";

    fn em(rows: &[(&str, &str)]) -> String {
        let mut text = EM_HEADER.to_string();
        for (t, c) in rows {
            text.push_str(&format!(
                "{t},Germany,Germany,DE-LU,{c},400,50,40,x,false,\n"
            ));
        }
        text
    }

    #[test]
    fn bad_inputs_name_the_problem() {
        let cases: [(&str, String, &str); 6] = [
            (
                "NaN",
                em(&[("2023-01-01 00:00:00", "NaN")]),
                "not a finite number",
            ),
            (
                "negative",
                em(&[("2023-01-01 00:00:00", "-5")]),
                "outside [0, 2000]",
            ),
            (
                "out of range",
                em(&[("2023-01-01 00:00:00", "2500")]),
                "outside [0, 2000]",
            ),
            (
                "duplicate",
                em(&[
                    ("2023-01-01 00:00:00", "100"),
                    ("2023-01-01 00:00:00", "90"),
                ]),
                "duplicate timestamp",
            ),
            (
                "unordered",
                em(&[
                    ("2023-01-01 01:00:00", "100"),
                    ("2023-01-01 00:00:00", "90"),
                ]),
                "before the previous row",
            ),
            ("bad time", em(&[("yesterday", "100")]), "is not a time"),
        ];
        for (name, text, expected) in cases {
            let err = parse_em_export_csv(&text, "de.csv", "s")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected) && err.contains("de.csv"),
                "{name}: {err}"
            );
            assert!(
                err.contains("line 2") || err.contains("line 3"),
                "{name}: {err}"
            );
        }
        let err = parse_em_export_csv("a,b\n1,2\n", "x.csv", "s")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Datetime (UTC)"), "{err}");
    }

    #[test]
    fn gb_curtailment_becomes_surplus_kw() {
        let text = "time,total_curtailment,total_pn,total_extra,imbalance\n\
                    2025-10-01T00:00:00.000000,-3.5,1,1,0\n\
                    2025-10-01T01:00:00.000000,0.2,1,1,0\n";
        let points = parse_gb_curtailment_csv(text, "gb.csv", "g", 0.001).unwrap();
        assert_eq!(points.len(), 2);
        assert!((points[0].surplus_kw.unwrap() - 3500.0).abs() < 1e-9);
        assert_eq!(points[1].surplus_kw, Some(0.0));
        assert_eq!(points[0].time_utc.to_rfc3339(), "2025-10-01T00:00:00+00:00");
        assert!(parse_gb_curtailment_csv(text, "gb.csv", "g", 0.0).is_err());
    }
}
