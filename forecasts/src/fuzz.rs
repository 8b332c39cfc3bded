//! One entry point that feeds arbitrary bytes to every parser of this crate, for the cargo-fuzz
//! target in `fuzz/` and for the deterministic mutation run in the tests below. Parsers may
//! refuse any input; they must never panic.

use crate::CarbonSignal;

/// Runs every CSV and JSON parser on `data` (as UTF-8, lossily) and discards the results.
pub fn fuzz_parsers(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let t = text.as_ref();
    let _ = crate::parse_canonical_csv(t, "fuzz");
    let _ = crate::parse_em_export_csv(t, "fuzz", "s");
    let _ = crate::parse_gb_curtailment_csv(t, "fuzz", "s", 0.5);
    let _ = crate::parse_caiso_curtailment_csv(t, "fuzz", "s", 0.5);
    let _ = crate::parse_jobs_csv(t, "fuzz");
    let _ = crate::parse_signals_csv(t, "fuzz");
    let _ = crate::parse_scenario_forecasts_csv(t, "fuzz");
    let _ = crate::providers::parse_electricity_maps_forecast(t);
    let _ = crate::providers::parse_watttime_forecast(t);
    let _ = crate::providers::parse_carbon_aware_forecast(t, CarbonSignal::Average);
    if let Ok(f) = crate::providers::parse_gb_intensity(t) {
        let _ = crate::providers::resample(&f.values, 3600);
    }
}

/// Seed inputs: one valid document per parser (also the cargo-fuzz corpus).
pub const SEEDS: &[&str] = &[
    "issued_utc,time_utc,site,surplus_kw,carbon_g_per_kwh,carbon_signal,price_usd_per_mwh\n2024-01-01T00:00:00Z,2024-01-01T01:00:00Z,a,10,200,average,40\n",
    "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,Data Estimated,Data Estimation Method\n2021-01-01 00:00:00,Germany,Germany,DE,300,400,50,40,x,false,\n",
    "Date,Hour,Interval,Wind Curtailment,Solar Curtailment,Reason\n4/14/2024,13,1,,2875.31,System\n4/14/2024,13,2,12,1200,Local\n",
    "id,submit_utc,gpus,gpu_models,work_hours,deadline_utc,checkpoint_gb,migratable,home_site\nj,2024-01-01T00:00:00Z,2,H100,3,2024-01-02T00:00:00Z,10,true,a\n",
    r#"{"zone":"DE","forecast":[{"carbonIntensity":326,"datetime":"2018-11-26T17:00:00.000Z"}],"updatedAt":"2018-11-26T17:25:24.685Z"}"#,
    r#"{"data":[{"point_time":"2022-07-15T00:00:00+00:00","value":870}],"meta":{"data_point_period_seconds":300,"region":"CAISO_NORTH","warnings":[],"signal_type":"co2_moer","units":"lbs_co2_per_mwh","generated_at_period_seconds":300,"generated_at":"2022-07-15T00:00:00+00:00"}}"#,
    r#"[{"generatedAt":"2022-07-19T13:35:00+00:00","forecastData":[{"location":"IE","timestamp":"2022-07-19T14:00:00+00:00","duration":5,"value":532.0}]}]"#,
    r#"{"data":[{"from":"2018-01-20T12:00Z","to":"2018-01-20T12:30Z","intensity":{"forecast":266,"actual":null,"index":"moderate"}}]}"#,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A short deterministic mutation run over the seeds (bit flips, byte overwrites, cuts and
    /// splices), the same entry point cargo fuzz drives: no input may panic a parser.
    #[test]
    fn mutated_inputs_never_panic_a_parser() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let interesting: &[&[u8]] = &[
            b",",
            b"\n",
            b"\"",
            b"-",
            b"NaN",
            b"1e309",
            b"null",
            b"{",
            b"]",
            b"9999-99-99",
            b"\xff",
            b"T",
            b"Z",
            b"+99:00",
            b"-0",
        ];
        for round in 0..4000 {
            let seed = SEEDS[round % SEEDS.len()].as_bytes();
            let mut data = seed.to_vec();
            for _ in 0..(1 + next() % 6) {
                if data.is_empty() {
                    break;
                }
                let at = (next() as usize) % data.len();
                match next() % 5 {
                    0 => data[at] ^= 1 << (next() % 8),
                    1 => data[at] = (next() % 256) as u8,
                    2 => data.truncate(at),
                    3 => {
                        let piece = interesting[(next() as usize) % interesting.len()];
                        data.splice(at..at, piece.iter().copied());
                    }
                    _ => {
                        let other = SEEDS[(next() as usize) % SEEDS.len()].as_bytes();
                        let from = (next() as usize) % other.len();
                        data.splice(at..at, other[from..].iter().copied());
                    }
                }
            }
            fuzz_parsers(&data);
        }
        for seed in SEEDS {
            fuzz_parsers(seed.as_bytes());
        }
    }
}
