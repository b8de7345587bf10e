//! Integration tests: a real PostgreSQL, a real server, the real wire protocols.

mod append;
mod auth;
mod common;
mod embedded;
mod faults;
mod graphql;
mod hostile;
mod in_doubt;
mod jsonl;
mod live;
mod migrations;
mod ops;
mod projection;
mod tenancy;
mod validation;
