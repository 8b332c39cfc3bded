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
//! - `providers`: HTTP forecast providers with fallback, cache, retries and rate limits;
//! - `report`: terminal summary and HTML report;
//! - `period`: `windfall report`, emissions and energy by site, user and day over a period;
//! - `dashboard`: the web dashboard `windfall serve` hosts at `/`;
//! - `demo`: `windfall demo`;
//! - `auth`: API tokens and roles;
//! - `planning`: one planning cycle (`windfall plan`, `POST /v1/plans`) under the planning lock;
//! - `server`: `windfall serve`, the HTTP API;
//! - `client`: `windfall submit` and `windfall jobs` over the API;
//! - `bench`: `windfall bench api`, the API load benchmark;
//! - `solver_bench`: `windfall bench solver`, the solver at three sizes against the direct MILP;
//! - `sim`: `windfall simulate` and `windfall scenario build`, the trace-replay simulator;
//! - `agent`: `windfall agent`, the site agent (GPUs, executors, checkpoint transfers);
//! - `webdriver`: a small WebDriver client for the dashboard's browser test and benchmark;
//! - `cli`: argument parsing and the commands' glue.

pub mod agent;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod client;
pub mod dashboard;
pub mod db;
pub mod demo;
pub mod fleet;
pub mod model;
pub mod period;
pub mod planning;
pub mod providers;
pub mod report;
pub mod server;
pub mod sim;
pub mod solver_bench;
pub mod webdriver;
