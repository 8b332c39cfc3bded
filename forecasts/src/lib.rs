//! windfall-forecasts: forecast series in windfall's canonical CSV and the bundled sample data.
//!
//! Owns parsing of the canonical forecast CSV (formats.md section 3), of published files in their
//! own layouts (Electricity Maps export, GB curtailment, CAISO curtailment; `files`), of the HTTP providers'
//! forecast bodies (`providers`), and of the scenario
//! `jobs.csv`, `signals.csv` and `forecasts.csv` (formats.md section 2), with errors that name the line and column, and the sample
//! fleet, signals and jobs compiled into the binary (see `forecasts/README.md` for sources,
//! licences and the surplus rule). It must not touch a database or the network.

pub mod canonical;
pub mod files;
pub mod fuzz;
pub mod jobs;
pub mod providers;
pub mod samples;
pub mod scenario;

pub use canonical::{CarbonSignal, ForecastPoint, parse_canonical_csv};
pub use files::{parse_caiso_curtailment_csv, parse_em_export_csv, parse_gb_curtailment_csv};
pub use jobs::{JobRow, parse_jobs_csv};
pub use scenario::{SignalRow, parse_scenario_forecasts_csv, parse_signals_csv};

/// Why a forecast or job file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The CSV structure is broken (quoting, column count).
    #[error("{source_name}: line {line}: {message}")]
    Csv {
        /// File name or label of the input.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A cell holds a value outside its domain.
    #[error("{source_name}: line {line}: column `{column}`: {message}")]
    Field {
        /// File name or label of the input.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// Column name.
        column: String,
        /// What is wrong.
        message: String,
    },
    /// The header lacks a required column.
    #[error("{source_name}: header: missing column `{column}`")]
    MissingColumn {
        /// File name or label of the input.
        source_name: String,
        /// Column name.
        column: String,
    },
}

/// Parses an RFC 3339 time with an offset.
pub(crate) fn parse_utc(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| format!("`{text}` is not an RFC 3339 time with a UTC offset"))
}

/// Reads rows of a CSV with a header into `(line, record)` pairs and a column lookup.
pub(crate) struct Table {
    pub source_name: String,
    pub header: csv::StringRecord,
    pub rows: Vec<(u64, csv::StringRecord)>,
}

impl Table {
    pub fn read(text: &str, source_name: &str, required: &[&str]) -> Result<Table, ParseError> {
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let header = reader
            .headers()
            .map_err(|e| ParseError::Csv {
                source_name: source_name.to_string(),
                line: 1,
                message: e.to_string(),
            })?
            .clone();
        for column in required {
            if !header.iter().any(|h| h == *column) {
                return Err(ParseError::MissingColumn {
                    source_name: source_name.to_string(),
                    column: column.to_string(),
                });
            }
        }
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| ParseError::Csv {
                source_name: source_name.to_string(),
                line: e.position().map_or(0, |p| p.line()),
                message: e.to_string(),
            })?;
            let line = record.position().map_or(0, |p| p.line());
            rows.push((line, record));
        }
        Ok(Table {
            source_name: source_name.to_string(),
            header,
            rows,
        })
    }

    pub fn get<'r>(&self, record: &'r csv::StringRecord, column: &str) -> &'r str {
        self.header
            .iter()
            .position(|h| h == column)
            .and_then(|i| record.get(i))
            .unwrap_or("")
    }

    pub fn field_error(&self, line: u64, column: &str, message: impl Into<String>) -> ParseError {
        ParseError::Field {
            source_name: self.source_name.clone(),
            line,
            column: column.to_string(),
            message: message.into(),
        }
    }
}
