//! The project's test harness and private-cluster command (see CONTRIBUTING.md):
//!
//!   cargo run -p xtask -- test                    every layer on the default major, the core
//!                                                 layers on each other major
//!   cargo run -p xtask -- test --all-majors       every layer on every major
//!   cargo run -p xtask -- test --majors "14 17"   only these majors (every layer on the default
//!                                                 one, if given)
//!   cargo run -p xtask -- test --layers "regress upgrade"
//!                                                 only these layers (on the majors chosen), and
//!                                                 the layers they need (install)
//!   cargo run -p xtask -- test --quick            the inner loop: unit, lint, install, regress,
//!                                                 isolation and one e2e pass, default major
//!   cargo run -p xtask -- test --test checklist -- NAME
//!                                                 one e2e test binary with libtest's filter
//!                                                 (or --test regress|isolation -- FILE...),
//!                                                 after the install, default major
//!   cargo run -p xtask -- pg start|stop [immediate]|url|psql ARGS|destroy
//!                                                 the private cluster of PG_CONFIG's major
//!                                                 (fsync off; on with IDEM_PG_DURABLE=1)
//!
//! The test run ends with `N passed, N failed, N skipped` over every layer and major (skipped:
//! what legitimately could not run, such as the Citus layer without Citus); it exits non-zero if
//! any layer fails.

mod artifacts;
mod cargo;
mod ctx;
mod features;
mod harness;
#[cfg(test)]
mod imports;
mod layers;
mod psql;
mod report;
mod sh;
mod suite;
mod workspace;

use idempotency_pgserver::{pg_config, Server, Stop};
use std::process::ExitCode;

const USAGE: &str = "usage: cargo run -p xtask -- test [--all-majors] [--majors \"14 17\"] [--layers \"regress upgrade\"]
       cargo run -p xtask -- test --quick | --test NAME [-- FILTER...]
       cargo run -p xtask -- pg start|stop [immediate]|url|psql ARGS...|destroy";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Every path in the harness is relative to the workspace root.
    std::env::set_current_dir(idempotency_pgserver::root()).expect("cd to the workspace root");
    match args.first().map(String::as_str) {
        Some("test") => match harness::Options::parse(&args[1..]) {
            Ok(options) => harness::run(&options),
            Err(e) => {
                eprintln!("xtask test: {e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
        Some("pg") => pg(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The private cluster by hand (what the demo and the benchmark scripts call).
fn pg(args: &[String]) -> ExitCode {
    let server = Server::private(&pg_config());
    match args.first().map(String::as_str) {
        Some("start") => {
            server.ensure_started();
            println!("{}", server.url("postgres"));
        }
        Some("stop") => match args.get(1).map(String::as_str) {
            None | Some("fast") => server.stop(Stop::Fast),
            Some("immediate") => server.stop(Stop::Immediate),
            Some(other) => {
                eprintln!("xtask pg stop: mode must be fast or immediate, got {other:?}");
                return ExitCode::from(2);
            }
        },
        Some("url") => println!("{}", server.url("postgres")),
        Some("psql") => {
            let status = std::process::Command::new(server.bin("psql"))
                .args(["-X", "-v", "ON_ERROR_STOP=1", &server.url("postgres")])
                .args(&args[1..])
                .status();
            return match status {
                Ok(s) if s.success() => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            };
        }
        Some("destroy") => server.destroy(),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
