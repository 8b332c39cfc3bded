//! windfall: places deferrable GPU jobs across sites so they run on curtailed renewable energy and
//! clean grid power while meeting their deadlines.
//!
//! This crate is the glue between the pure solver (`windfall-solver`), the forecast parsers and
//! samples (`windfall-forecasts`) and the outside world: the database, files and the command line.
//!
//! # Layout
//! - `model`: the service's domain types (job states, site configs, stored plans);
//! - `db`: the only module that knows SQL;
//! - `fleet`: fleet files, bundled samples, and assembling a solver instance from the store;
//! - `report`: terminal summary and HTML report;
//! - `demo`: `windfall demo`;
//! - `cli`: argument parsing and the commands' glue.

pub mod cli;
pub mod db;
pub mod demo;
pub mod fleet;
pub mod model;
pub mod report;
