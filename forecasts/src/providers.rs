//! Response bodies of the HTTP carbon-intensity providers, parsed into one shape: Electricity
//! Maps v3 (`/carbon-intensity/forecast`), WattTime v3 (`/v3/forecast`), the Green Software
//! Foundation Carbon Aware SDK WebAPI (`/emissions/forecasts/current`) and the GB Carbon
//! Intensity API (`/intensity/{from}/fw48h`, national and regional). Field names, units and
//! quirks follow `../shared/design/providers.md`.
//!
//! Owns units (WattTime's lbs/MWh converted to g/kWh from `meta.units`), the signal type each
//! provider's values are (average or marginal), and value checks. Must not touch the network.

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use crate::canonical::{CarbonSignal, MAX_CARBON_G_PER_KWH};

/// g/kWh per lbs/MWh.
pub const G_PER_KWH_PER_LBS_PER_MWH: f64 = 453.592_37 / 1000.0;

/// A provider's body refused, naming the provider and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{provider}: {message}")]
pub struct ProviderError {
    /// Provider name.
    pub provider: String,
    /// What is wrong (with the point's time where there is one).
    pub message: String,
}

fn err(provider: &str, message: impl Into<String>) -> ProviderError {
    ProviderError {
        provider: provider.to_string(),
        message: message.into(),
    }
}

/// One value of a provider's forecast.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderValue {
    /// Start of the interval.
    pub time_utc: DateTime<Utc>,
    /// Interval length, seconds.
    pub duration_s: i64,
    /// Carbon intensity, g CO2e/kWh.
    pub carbon_g_per_kwh: f64,
}

/// A parsed forecast.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderForecast {
    /// When the provider made it, where it says.
    pub issued_utc: Option<DateTime<Utc>>,
    /// Average or marginal.
    pub signal: CarbonSignal,
    /// The values, in time order.
    pub values: Vec<ProviderValue>,
}

fn check(provider: &str, values: &mut [ProviderValue]) -> Result<(), ProviderError> {
    for v in values.iter() {
        if !v.carbon_g_per_kwh.is_finite() {
            return Err(err(
                provider,
                format!("{}: carbon intensity is not a number", v.time_utc),
            ));
        }
        if v.carbon_g_per_kwh < 0.0 {
            return Err(err(
                provider,
                format!(
                    "{}: negative carbon intensity {}",
                    v.time_utc, v.carbon_g_per_kwh
                ),
            ));
        }
        if v.carbon_g_per_kwh > MAX_CARBON_G_PER_KWH {
            return Err(err(
                provider,
                format!(
                    "{}: carbon intensity {} g/kWh is above {MAX_CARBON_G_PER_KWH} (a unit error?)",
                    v.time_utc, v.carbon_g_per_kwh
                ),
            ));
        }
        if v.duration_s <= 0 {
            return Err(err(
                provider,
                format!("{}: interval length {} s", v.time_utc, v.duration_s),
            ));
        }
    }
    for pair in values.windows(2) {
        if pair[1].time_utc <= pair[0].time_utc {
            return Err(err(
                provider,
                format!(
                    "{}: duplicate or unordered timestamp after {}",
                    pair[1].time_utc, pair[0].time_utc
                ),
            ));
        }
    }
    if values.is_empty() {
        return Err(err(provider, "the forecast holds no values"));
    }
    Ok(())
}

fn body<T: serde::de::DeserializeOwned>(provider: &str, text: &str) -> Result<T, ProviderError> {
    serde_json::from_str(text).map_err(|e| err(provider, format!("malformed body: {e}")))
}

fn time(provider: &str, text: &str) -> Result<DateTime<Utc>, ProviderError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    // The GB API writes `2018-01-20T12:00Z` (no seconds).
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%MZ")
        .map(|t| t.and_utc())
        .map_err(|_| err(provider, format!("`{text}` is not a UTC timestamp")))
}

/// Electricity Maps `GET /v3/carbon-intensity/forecast`: average (lifecycle by default) g/kWh,
/// hourly unless the body says otherwise; null values are refused with their time.
pub fn parse_electricity_maps_forecast(text: &str) -> Result<ProviderForecast, ProviderError> {
    const P: &str = "electricity-maps";
    #[derive(Deserialize)]
    struct Item {
        #[serde(rename = "carbonIntensity")]
        carbon_intensity: Option<f64>,
        datetime: String,
    }
    #[derive(Deserialize)]
    struct Body {
        forecast: Vec<Item>,
        #[serde(rename = "updatedAt", default)]
        updated_at: Option<String>,
        #[serde(rename = "temporalGranularity", default)]
        granularity: Option<String>,
    }
    let b: Body = body(P, text)?;
    let duration_s = match b.granularity.as_deref() {
        Some("5_minutes") => 300,
        Some("15_minutes") => 900,
        _ => 3600,
    };
    let mut values = Vec::with_capacity(b.forecast.len());
    for item in &b.forecast {
        let t = time(P, &item.datetime)?;
        let value = item
            .carbon_intensity
            .ok_or_else(|| err(P, format!("{t}: carbonIntensity is null")))?;
        values.push(ProviderValue {
            time_utc: t,
            duration_s,
            carbon_g_per_kwh: value,
        });
    }
    check(P, &mut values)?;
    Ok(ProviderForecast {
        issued_utc: b.updated_at.as_deref().map(|t| time(P, t)).transpose()?,
        signal: CarbonSignal::Average,
        values,
    })
}

/// WattTime `GET /v3/forecast`: `co2_moer` is marginal, `co2_aoer` average; values are converted
/// from `meta.units` (`lbs_co2_per_mwh`, or g/kWh units passed through; anything else refused).
pub fn parse_watttime_forecast(text: &str) -> Result<ProviderForecast, ProviderError> {
    const P: &str = "watttime";
    #[derive(Deserialize)]
    struct Item {
        point_time: String,
        value: f64,
    }
    #[derive(Deserialize)]
    struct Meta {
        data_point_period_seconds: i64,
        signal_type: String,
        units: String,
        #[serde(default)]
        generated_at: Option<String>,
    }
    #[derive(Deserialize)]
    struct Body {
        data: Vec<Item>,
        meta: Meta,
    }
    let b: Body = body(P, text)?;
    let factor = match b.meta.units.as_str() {
        "lbs_co2_per_mwh" | "lbs_co2e_per_mwh" => G_PER_KWH_PER_LBS_PER_MWH,
        "g_co2_per_kwh" | "g_co2e_per_kwh" | "kg_co2_per_mwh" => 1.0,
        other => return Err(err(P, format!("unknown units `{other}` in meta.units"))),
    };
    let signal = match b.meta.signal_type.as_str() {
        "co2_moer" => CarbonSignal::Marginal,
        "co2_aoer" => CarbonSignal::Average,
        other => {
            return Err(err(
                P,
                format!(
                    "signal_type `{other}` is not a carbon intensity (use co2_moer or co2_aoer)"
                ),
            ));
        }
    };
    let mut values = Vec::with_capacity(b.data.len());
    for item in &b.data {
        values.push(ProviderValue {
            time_utc: time(P, &item.point_time)?,
            duration_s: b.meta.data_point_period_seconds,
            carbon_g_per_kwh: item.value * factor,
        });
    }
    check(P, &mut values)?;
    Ok(ProviderForecast {
        issued_utc: b
            .meta
            .generated_at
            .as_deref()
            .map(|t| time(P, t))
            .transpose()?,
        signal,
        values,
    })
}

/// Carbon Aware SDK `GET /emissions/forecasts/current`: the first location's `forecastData`;
/// values are g/kWh; the signal is what the SDK's data source gives (`signal`).
pub fn parse_carbon_aware_forecast(
    text: &str,
    signal: CarbonSignal,
) -> Result<ProviderForecast, ProviderError> {
    const P: &str = "carbon-aware-sdk";
    #[derive(Deserialize)]
    struct Point {
        timestamp: String,
        duration: i64,
        value: f64,
    }
    #[derive(Deserialize)]
    struct Forecast {
        #[serde(rename = "generatedAt", default)]
        generated_at: Option<String>,
        #[serde(rename = "forecastData")]
        forecast_data: Vec<Point>,
    }
    let list: Vec<Forecast> = body(P, text)?;
    let first = list
        .into_iter()
        .next()
        .ok_or_else(|| err(P, "the response holds no forecast"))?;
    let mut values = Vec::with_capacity(first.forecast_data.len());
    for p in &first.forecast_data {
        values.push(ProviderValue {
            time_utc: time(P, &p.timestamp)?,
            duration_s: p.duration * 60,
            carbon_g_per_kwh: p.value,
        });
    }
    check(P, &mut values)?;
    Ok(ProviderForecast {
        issued_utc: first
            .generated_at
            .as_deref()
            .map(|t| time(P, t))
            .transpose()?,
        signal,
        values,
    })
}

/// GB Carbon Intensity API, national (`/intensity/{from}/fw48h`: `data` is an array) or regional
/// (`/regional/intensity/{from}/fw48h/regionid/{id}`: `data` is an object holding `data`); the
/// `forecast` field, average g/kWh, half-hour periods.
pub fn parse_gb_intensity(text: &str) -> Result<ProviderForecast, ProviderError> {
    const P: &str = "gb-carbon-intensity";
    let v: Value = body(P, text)?;
    let items = match &v["data"] {
        Value::Array(a) => a.clone(),
        Value::Object(o) => match o.get("data") {
            Some(Value::Array(a)) => a.clone(),
            _ => return Err(err(P, "regional `data` object without a `data` array")),
        },
        _ => return Err(err(P, "malformed body: no `data` array or object")),
    };
    let mut values = Vec::with_capacity(items.len());
    for item in &items {
        let from = item["from"]
            .as_str()
            .ok_or_else(|| err(P, "a period without `from`"))?;
        let to = item["to"]
            .as_str()
            .ok_or_else(|| err(P, format!("period {from} without `to`")))?;
        let (from, to) = (time(P, from)?, time(P, to)?);
        let forecast = item["intensity"]["forecast"]
            .as_f64()
            .ok_or_else(|| err(P, format!("{from}: no intensity.forecast")))?;
        values.push(ProviderValue {
            time_utc: from,
            duration_s: (to - from).num_seconds(),
            carbon_g_per_kwh: forecast,
        });
    }
    check(P, &mut values)?;
    Ok(ProviderForecast {
        issued_utc: None,
        signal: CarbonSignal::Average,
        values,
    })
}

/// Resamples `values` onto buckets of `bucket_s` seconds aligned to the epoch (e.g. 3600 for
/// hours): each bucket's intensity is the mean of the values overlapping it, weighted by the
/// overlap time (the energy weighting for a constant load). A bucket only partly covered gets the
/// mean over the covered part; buckets with no value are left out.
pub fn resample(values: &[ProviderValue], bucket_s: i64) -> Vec<ProviderValue> {
    let bucket_s = bucket_s.max(1);
    let mut sums: std::collections::BTreeMap<i64, (f64, f64)> = std::collections::BTreeMap::new();
    for v in values {
        let start = v.time_utc.timestamp();
        let end = start + v.duration_s.max(0);
        let mut t = start;
        while t < end {
            let bucket = t.div_euclid(bucket_s) * bucket_s;
            let stop = end.min(bucket + bucket_s);
            let w = (stop - t) as f64;
            let e = sums.entry(bucket).or_insert((0.0, 0.0));
            e.0 += w * v.carbon_g_per_kwh;
            e.1 += w;
            t = stop;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, w))| *w > 0.0)
        .filter_map(|(bucket, (sum, w))| {
            Some(ProviderValue {
                time_utc: DateTime::from_timestamp(bucket, 0)?,
                duration_s: bucket_s,
                carbon_g_per_kwh: sum / w,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watttime_lbs_per_mwh_become_g_per_kwh_and_moer_is_marginal() {
        let body = r#"{"data":[{"point_time":"2022-07-15T00:00:00+00:00","value":870},
            {"point_time":"2022-07-15T00:05:00+00:00","value":860.5}],
            "meta":{"data_point_period_seconds":300,"region":"CAISO_NORTH","warnings":[],
            "signal_type":"co2_moer","model":{"date":"2023-03-01"},"units":"lbs_co2_per_mwh",
            "generated_at_period_seconds":300,"generated_at":"2022-07-15T00:00:00+00:00"}}"#;
        let f = parse_watttime_forecast(body).unwrap();
        assert_eq!(f.signal, CarbonSignal::Marginal);
        assert!((f.values[0].carbon_g_per_kwh - 870.0 * 0.453_592_37).abs() < 1e-9);
        assert_eq!(f.values[1].duration_s, 300);
        let bad = body.replace("lbs_co2_per_mwh", "furlongs");
        assert!(
            parse_watttime_forecast(&bad)
                .unwrap_err()
                .message
                .contains("furlongs")
        );
    }

    #[test]
    fn gb_regional_data_is_an_object_and_national_an_array() {
        let national = r#"{"data":[{"from":"2018-01-20T12:00Z","to":"2018-01-20T12:30Z","intensity":{"forecast":266,"actual":263,"index":"moderate"}},
            {"from":"2018-01-20T12:30Z","to":"2018-01-20T13:00Z","intensity":{"forecast":270,"actual":null,"index":"moderate"}}]}"#;
        let f = parse_gb_intensity(national).unwrap();
        assert_eq!(f.values.len(), 2);
        assert_eq!(f.values[0].duration_s, 1800);
        let regional = r#"{"data":{"regionid":3,"shortname":"North West England","data":[
            {"from":"2023-01-01T00:00Z","to":"2023-01-01T00:30Z","intensity":{"forecast":181,"index":"moderate"},"generationmix":[]}]}}"#;
        assert_eq!(
            parse_gb_intensity(regional).unwrap().values[0].carbon_g_per_kwh,
            181.0
        );
    }

    #[test]
    fn bad_values_name_the_time() {
        let em = r#"{"zone":"DE","forecast":[{"carbonIntensity":326,"datetime":"2018-11-26T17:00:00.000Z"},
            {"carbonIntensity":null,"datetime":"2018-11-26T18:00:00.000Z"}],"updatedAt":"2018-11-26T17:25:24.685Z"}"#;
        let e = parse_electricity_maps_forecast(em).unwrap_err();
        assert!(
            e.message.contains("2018-11-26 18:00:00") && e.message.contains("null"),
            "{e}"
        );
        let cases = [(r#"-5"#, "negative"), (r#"2500"#, "above")];
        for (value, expected) in cases {
            let body = format!(
                r#"{{"zone":"DE","forecast":[{{"carbonIntensity":{value},"datetime":"2018-11-26T17:00:00.000Z"}}]}}"#
            );
            let e = parse_electricity_maps_forecast(&body).unwrap_err();
            assert!(e.message.contains(expected), "{e}");
        }
        let dup = r#"{"zone":"DE","forecast":[{"carbonIntensity":1,"datetime":"2018-11-26T17:00:00.000Z"},
            {"carbonIntensity":2,"datetime":"2018-11-26T17:00:00.000Z"}]}"#;
        assert!(
            parse_electricity_maps_forecast(dup)
                .unwrap_err()
                .message
                .contains("duplicate")
        );
        assert!(
            parse_electricity_maps_forecast("{not json")
                .unwrap_err()
                .message
                .contains("malformed")
        );
    }

    #[test]
    fn resampling_is_time_weighted() {
        let t0 = DateTime::parse_from_rfc3339("2024-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let half = |i: i64, v: f64| ProviderValue {
            time_utc: t0 + chrono::Duration::minutes(30 * i),
            duration_s: 1800,
            carbon_g_per_kwh: v,
        };
        let out = resample(&[half(0, 100.0), half(1, 200.0), half(2, 50.0)], 3600);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].carbon_g_per_kwh, 150.0);
        // The second hour is half covered: the mean over what is covered.
        assert_eq!(out[1].carbon_g_per_kwh, 50.0);
        let five: Vec<ProviderValue> = (0..12)
            .map(|i| ProviderValue {
                time_utc: t0 + chrono::Duration::minutes(5 * i),
                duration_s: 300,
                carbon_g_per_kwh: i as f64,
            })
            .collect();
        assert_eq!(resample(&five, 3600)[0].carbon_g_per_kwh, 5.5);
        assert_eq!(resample(&five, 900).len(), 4);
    }

    #[test]
    fn carbon_aware_durations_are_minutes() {
        let body = r#"[{"generatedAt":"2022-07-19T13:35:00+00:00","location":"northeurope","windowSize":0,
            "optimalDataPoints":[],"forecastData":[{"location":"IE","timestamp":"2022-07-19T14:00:00+00:00","duration":5,"value":532.02}]}]"#;
        let f = parse_carbon_aware_forecast(body, CarbonSignal::Marginal).unwrap();
        assert_eq!(f.values[0].duration_s, 300);
        assert!(f.issued_utc.is_some());
        assert!(parse_carbon_aware_forecast("[]", CarbonSignal::Average).is_err());
    }
}
