//! Integration tests: a real PostgreSQL, a real server, the real wire protocols.

mod append;
pub mod attack;
mod auth;
mod browser;
mod citus;
mod clients;
mod common;
mod containers;
mod embedded;
mod faults;
mod graphql;
mod grpc;
mod hostile;
mod in_doubt;
mod jsonl;
mod live;
mod migrations;
mod ops;
mod projection;
mod seed004;
mod seed_profile;
mod shaping;
mod tenancy;
mod tls;
mod validation;
