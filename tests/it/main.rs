//! Integration tests, one binary: solver against the independent validator and brute force,
//! validator per constraint, instance errors, the store on SQLite and PostgreSQL, and the CLI as
//! a real process.

mod agent;
mod cli;
mod dashboard;
mod fixtures;
mod ingest;
mod instance_errors;
mod providers;
mod service;
mod sim;
mod solver;
mod staleness;
mod store;
mod validator;
