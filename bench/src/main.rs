//! The benchmark of the performance goals (docs/performance.md): every figure a ratio against a baseline measured in the
//! same run, interleaved A/B/B/A so machine drift cancels. Run with `bash scripts/bench.sh`
//! (or `--smoke` for a few seconds per case, which checks only that every case produced numbers;
//! `--rust` for only the Rust client's rows, over tokio-postgres and over sqlx;
//! `--replay-first` only the rows of `Settings::replay_first`, both drivers).
//!
//! Writes `target/bench/results.csv` and `target/bench/benchmark.png`, and the soak's
//! `target/bench/soak.csv` and `target/bench/soak.png`. `--http` runs only the HTTP rows (see
//! [`http`]) and writes `target/bench/http.csv`; `--stacks` only the actix-web and gRPC rows (see
//! [`stacks`]) into `target/bench/stacks.csv`; `--soak` only the soak; `--rust` only the Rust
//! client's rows (the waiters' row, [`waiters`], among them; `--waiters` that row alone; `--steps` the
//! recovery points' rows, [`steps`], alone); `--rust-case CASE TASKS SECONDS` one case of them for a profiler
//! (bench/profile-client.sh); `--fingerprint` only the fingerprint rows (see [`fingerprint`], no
//! database), into `target/bench/fingerprint.csv`; `--scale` only the ten-million-key rows (see
//! [`scale`], on a server of its own) into `target/bench/scale.csv`; `--chart CSV PNG [TITLE]`
//! draws the chart of a results CSV.

mod chart;
mod client;
mod client_sqlx;
mod fingerprint;
mod http;
mod latency;
mod pgbench;
mod scale;
mod seed_twin;
mod soak;
mod stacks;
mod steps;
mod waiters;

use idempotency_testkit::{cluster_addr, fresh_database, pg_bin, root};
use pgbench::Measure;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

struct Settings {
    smoke: bool,
    /// The length of every run (pgbench runs at least 1 s: its `-T` counts whole seconds).
    run: Duration,
    reps: usize,
    clients: Vec<u32>,
    http_connections: Vec<usize>,
    growth_rows: i64,
    sweep_rows: i64,
    /// Soak cycles, and transactions per client and cycle (4 clients).
    soak_cycles: usize,
    soak_per_client: u32,
}

/// One output row.
struct Row {
    figure: String,
    clients: String,
    baseline: String,
    base: Measure,
    ours: Measure,
    goal: Option<f64>,
    /// Statements per operation (ours, baseline) as the server counted them, or the round trips
    /// the row counted instead.
    work: Option<String>,
}

impl Row {
    fn ratio(&self) -> f64 {
        if self.base.tps > 0.0 { self.ours.tps / self.base.tps } else { 0.0 }
    }
}

/// A connection to `url`, driven by a task of its own (every section's).
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(conn);
    client
}

fn script(name: &str) -> PathBuf {
    root().join("bench/pgbench").join(format!("{name}.sql"))
}

/// Statements per transaction of script `ours` and of `base`, measured by the server.
async fn work(url: &str, db: &tokio_postgres::Client, ours: &str, base: &str) -> Option<String> {
    let pgbench = pg_bin("pgbench");
    let o = pgbench::statements_per_op(&pgbench, url, db, &script(ours)).await?;
    let b = pgbench::statements_per_op(&pgbench, url, db, &script(base)).await?;
    Some(format!("{o:.1} / {b:.1}"))
}

/// Runs `a` and `b` interleaved (A B, then B A, ...) and returns their means.
async fn pair(s: &Settings, url: &str, db: &tokio_postgres::Client, a: &str, b: &str, clients: u32) -> (Measure, Measure) {
    pair_scripts(s, url, db, &script(a), &script(b), clients).await
}

/// The baseline of bench/pgbench/batch.sql: the same keys reserved and completed by single
/// idem_reserve + idem_complete calls in one transaction (2 statements per key; generated,
/// pgbench has no loop).
fn singles_script(keys: u32) -> PathBuf {
    let mut text = String::from("\\set u random(1, 1000)\n\\set k random(1, 9000000000000000000)\nBEGIN;\n");
    for i in 1..=keys {
        text += &format!("SELECT token AS t{i} FROM idem_reserve('bench.single', 'u' || :u, 'k' || :k || '-{i}', 'h') \\gset\n");
        text += &format!("SELECT idem_complete('bench.single', 'u' || :u, 'k' || :k || '-{i}', :t{i}, '{{\"status\": 201}}');\n");
    }
    text += "COMMIT;\n";
    let path = root().join("target/bench/singles.sql");
    std::fs::write(&path, text).expect("write singles.sql");
    path
}

/// [`pair`] of two script files.
async fn pair_scripts(s: &Settings, url: &str, db: &tokio_postgres::Client, a: &Path, b: &Path, clients: u32) -> (Measure, Measure) {
    let pgbench = pg_bin("pgbench");
    let logs = root().join("target/bench/logs");
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        let order = if rep % 2 == 0 { [(a, true), (b, false)] } else { [(b, false), (a, true)] };
        for (name, is_a) in order {
            let before = pgbench::counters(db).await;
            let mut m = pgbench::run(&pgbench, url, name, clients, s.run, &logs);
            pgbench::delta(db, &before, &mut m).await;
            if is_a { ra.push(m) } else { rb.push(m) }
        }
    }
    (Measure::mean(&ra), Measure::mean(&rb))
}

/// The HTTP rows: each example route behind its layer (fresh keys, replays) against the same
/// route without it, interleaved in the order plain, fresh, replay and then reversed. `bound`
/// goes in the fresh `/charges` rows: the SQL-level and Rust-level ratios of the same run that
/// bound what the layer can reach.
async fn http_rows(s: &Settings, rows: &mut Vec<Row>, bound: Option<String>) {
    let url = fresh_database("idem_bench_http").await;
    let db = connect(&url).await;
    let service = http::Service::start(&url).await;
    // Each route with its goals (fresh, replay) against the plain route: issue 28 asks the
    // in-transaction layer for 0.5 of a well-written plain route, the one-statement route 0.8.
    let routes = [
        (http::Route::Charges, "HTTP /charges (in-transaction)", "the same insert in a plain transaction, same pool", 0.5),
        (http::Route::ChargesOne, "HTTP /charges/one (run_statement)", "the same insert in a plain transaction, same pool", 0.8),
        (http::Route::Payouts, "HTTP /payouts (two-phase)", "the same handler (a call to the provider stub), no layer", 0.8),
    ];
    // Statements per request, counted by a second service process that tracks them.
    let mut counts = [[None; 3]; 3];
    let mut seed_count = None;
    if db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.is_ok() {
        let counting = http::Service::counting(&url).await;
        for (r, (route, ..)) in routes.iter().enumerate() {
            for (i, side) in [http::Side::Plain, http::Side::Fresh, http::Side::Replay].into_iter().enumerate() {
                counts[r][i] = http::statements_per_request(&counting, &db, *route, side, if s.smoke { 20 } else { 200 }).await;
            }
        }
        seed_count = http::statements_per_request(&counting, &db, http::Route::Payouts, http::Side::Seed, if s.smoke { 20 } else { 200 }).await;
        counting.stop().await;
    }
    for (r, (route, name, baseline, goal)) in routes.into_iter().enumerate() {
        for &c in &s.http_connections {
            let sides = [http::Side::Plain, http::Side::Fresh, http::Side::Replay];
            let mut runs: [Vec<Measure>; 3] = Default::default();
            for rep in 0..s.reps {
                for i in 0..3 {
                    let i = if rep % 2 == 0 { i } else { 2 - i };
                    runs[i].push(http::load(&service, &db, route, sides[i], c, s.run).await);
                }
            }
            let [plain, fresh, replay] = runs.map(|r| Measure::mean(&r));
            let [n_plain, n_fresh, n_replay] = counts[r];
            let counted = |ours: Option<f64>| ours.zip(n_plain).map(|(o, b)| format!("{o:.1} / {b:.1} top-level (BEGIN, COMMIT included)"));
            let clients = format!("{c} conns");
            let fresh_work = match (counted(n_fresh), (route == http::Route::Charges).then(|| bound.clone()).flatten()) {
                (Some(n), Some(b)) => Some(format!("{n}; {b}")),
                (n, b) => n.or(b),
            };
            rows.push(Row { figure: format!("{name}: fresh vs plain route"), clients: clients.clone(), baseline: baseline.into(), base: plain.clone(), ours: fresh, goal: Some(goal), work: fresh_work });
            rows.push(Row { figure: format!("{name}: replay vs plain route"), clients, baseline: baseline.into(), base: plain, ours: replay, goal: Some(1.0), work: counted(n_replay) });
        }
    }
    // The two-phase route against its fair twin: the same call behind the seed libraries' store
    // flow (seed_twin.rs), interleaved.
    for &c in &s.http_connections {
        let sides = [http::Side::Seed, http::Side::Fresh];
        let mut runs: [Vec<Measure>; 2] = Default::default();
        for rep in 0..s.reps {
            for i in 0..2 {
                let i = if rep % 2 == 0 { i } else { 1 - i };
                runs[i].push(http::load(&service, &db, http::Route::Payouts, sides[i], c, s.run).await);
            }
        }
        let [seed, fresh] = runs.map(|r| Measure::mean(&r));
        let work = counts[2][1].zip(seed_count).map(|(o, b)| format!("{o:.1} / {b:.1} top-level (BEGIN, COMMIT included)"));
        rows.push(Row { figure: "HTTP /payouts (two-phase): fresh vs the seed libraries' store flow".into(), clients: format!("{c} conns"), baseline: "the same call behind reserve + commit, call, complete + commit (prepared)".into(), base: seed, ours: fresh, goal: Some(1.0), work });
    }
    service.stop().await;
}

/// The other stacks' rows (see [`stacks`]): the actix-web and tonic examples' in-transaction
/// route behind its layer (fresh keys, replays) against the same route without it, interleaved
/// as [`http_rows`] does. No goal: issue 35 asks for one figure per stack.
async fn stack_rows(s: &Settings, rows: &mut Vec<Row>) {
    let url = fresh_database("idem_bench_stacks").await;
    let db = connect(&url).await;
    let stacks = [
        (stacks::Stack::Actix, "actix-web /charges (in-transaction)", "the same insert in a plain transaction, same pool, same server"),
        (stacks::Stack::Grpc, "gRPC Charges/Create (in-transaction)", "the same insert in a plain transaction, same pool, a tonic service without the layer"),
    ];
    for (stack, name, baseline) in stacks {
        let service = stacks::start(stack, &url).await;
        for &c in &s.http_connections {
            let sides = [http::Side::Plain, http::Side::Fresh, http::Side::Replay];
            let mut runs: [Vec<Measure>; 3] = Default::default();
            for rep in 0..s.reps {
                for i in 0..3 {
                    let i = if rep % 2 == 0 { i } else { 2 - i };
                    runs[i].push(stacks::load(stack, &service, &db, sides[i], c, s.run).await);
                }
            }
            let [plain, fresh, replay] = runs.map(|r| Measure::mean(&r));
            let clients = format!("{c} conns");
            rows.push(Row { figure: format!("{name}: fresh vs plain route"), clients: clients.clone(), baseline: baseline.into(), base: plain.clone(), ours: fresh, goal: None, work: None });
            rows.push(Row { figure: format!("{name}: replay vs plain route"), clients, baseline: baseline.into(), base: plain, ours: replay, goal: None, work: None });
        }
        service.stop().await;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, database_url, bind, provider_bind] = args.as_slice() {
        if flag == "--serve-http" {
            http::serve(database_url, bind, provider_bind).await;
            return;
        }
    }
    if let [_, flag, stack, database_url, bind, plain_bind] = args.as_slice() {
        if let (true, Some(stack)) = (flag == "--serve-stack", stacks::Stack::parse(stack)) {
            stacks::serve(stack, database_url, bind, plain_bind).await;
            return;
        }
    }
    if let [_, flag, csv, png, title @ ..] = args.as_slice() {
        if flag == "--chart" {
            // Redraws a chart from a results CSV (docs/benchmark.png from docs/benchmark.csv),
            // or the soak's from a soak CSV (docs/soak.png from docs/soak.csv), titled TITLE if given.
            let text = std::fs::read_to_string(csv).unwrap_or_else(|e| panic!("{csv}: {e}"));
            if text.starts_with("cycle,") {
                let kb = soak::kb_of_csv(&text);
                let title = title.first().cloned().unwrap_or_else(|| soak_title(1200));
                soak_chart(&kb, Path::new(png), &title);
                return;
            }
            let title = title.first().cloned().unwrap_or_else(title_of_run);
            draw(&text, Path::new(png), &title);
            return;
        }
    }
    let smoke = args.iter().any(|a| a == "--smoke");
    let only_http = args.iter().any(|a| a == "--http");
    let only_rust = args.iter().any(|a| a == "--rust");
    let s = if smoke {
        Settings { smoke, run: Duration::from_millis(200), reps: 1, clients: vec![1, 8], http_connections: vec![8, 64], growth_rows: 20_000, sweep_rows: 20_000, soak_cycles: 6, soak_per_client: 50 }
    } else {
        Settings { smoke, run: Duration::from_secs(6), reps: 2, clients: vec![1, 8, 32], http_connections: vec![8, 64], growth_rows: 1_000_000, sweep_rows: 500_000, soak_cycles: 100, soak_per_client: 300 }
    };
    // IDEM_BENCH_SECONDS: another length of every run (bench/profile-http.sh shortens them).
    let s = match std::env::var("IDEM_BENCH_SECONDS") {
        Ok(v) => Settings { run: v.parse().ok().and_then(|v| Duration::try_from_secs_f64(v).ok()).unwrap_or_else(|| panic!("IDEM_BENCH_SECONDS={v} is not a number of seconds")), ..s },
        Err(_) => s,
    };
    let out = root().join("target/bench");
    std::fs::create_dir_all(&out).expect("output dir");
    let started = Instant::now();
    if args.iter().any(|a| a == "--fingerprint") {
        let rows = fingerprint::rows(s.smoke, s.reps);
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        println!("(these rows: {} samples of {} per body, interleaved; tps are KiB fingerprinted per second)", 2 * s.reps, if s.smoke { "20 ms" } else { "1 s" });
        std::fs::write(out.join("fingerprint.csv"), csv(&rows, None)).expect("csv");
        check_numbers(&rows, None);
        println!("{} cases measured; wrote target/bench/fingerprint.csv", rows.len());
        return;
    }
    if only_http {
        let mut rows = Vec::new();
        http_rows(&s, &mut rows, None).await;
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        std::fs::write(out.join("http.csv"), csv(&rows, None)).expect("csv");
        check_numbers(&rows, None);
        println!("{} cases measured; wrote target/bench/http.csv", rows.len());
        return;
    }
    if args.iter().any(|a| a == "--stacks") {
        let mut rows = Vec::new();
        stack_rows(&s, &mut rows).await;
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        std::fs::write(out.join("stacks.csv"), csv(&rows, None)).expect("csv");
        check_numbers(&rows, None);
        println!("{} cases measured; wrote target/bench/stacks.csv", rows.len());
        return;
    }
    if args.iter().any(|a| a == "--scale") {
        let report = scale::run(s.smoke).await;
        let s = Settings { run: report.run, reps: report.reps, ..s };
        print!("{}{}", render(report.reserve.as_slice(), None, &s, started.elapsed().as_secs()), report.render());
        std::fs::write(out.join("scale.csv"), report.csv()).expect("csv");
        check_numbers(report.reserve.as_slice(), None);
        if !report.empty().is_empty() {
            eprintln!("scale figures without numbers: {:?}", report.empty());
            std::process::exit(1);
        }
        println!("wrote target/bench/scale.csv and target/bench/scale-sweep.csv");
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--soak-check") {
        let cycles = args.get(at + 1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("usage: bench --soak-check CYCLES"));
        std::process::exit(soak::check(cycles).await);
    }
    if args.iter().any(|a| a == "--soak") {
        let soaked = run_soak(&s, &out).await;
        println!("{}", soak_line(&s, &soaked));
        return;
    }

    // --rust-case CASE TASKS SECONDS: one call kind of the Rust rows on its own, for perf to
    // attach to (bench/profile-client.sh); CASE is raw-insert, run, raw-select, replay,
    // cached-replay, run-statement or replay-first.
    if let Some(at) = args.iter().position(|a| a == "--rust-case") {
        let usage = "usage: bench --rust-case raw-insert|run|raw-select|replay|cached-replay|run-statement|replay-first TASKS SECONDS";
        let [case, tasks, seconds] = [1, 2, 3].map(|i| args.get(at + i).cloned().unwrap_or_else(|| panic!("{usage}")));
        let kind = match case.as_str() {
            "raw-insert" => client::Call::RawInsert,
            "run" => client::Call::Run,
            "raw-select" => client::Call::RawSelect,
            "replay" => client::Call::Replay,
            "cached-replay" => client::Call::CachedReplay,
            "run-statement" => client::Call::RunStatement,
            "replay-first" => client::Call::FirstReplay,
            _ => panic!("{usage}"),
        };
        let (tasks, seconds) = (tasks.parse().unwrap_or_else(|_| panic!("{usage}")), seconds.parse().unwrap_or_else(|_| panic!("{usage}")));
        let url = fresh_database("idem_bench_case").await;
        let db = connect(&url).await;
        db.batch_execute(&std::fs::read_to_string(script("setup")).expect("setup.sql")).await.expect("bench setup");
        db.batch_execute("VACUUM ANALYZE").await.expect("vacuum");
        client::single_case(&url, &db, kind, tasks, seconds).await;
        return;
    }

    // --latency: only the latency rows (latency.rs), into target/bench/latency.csv.
    if args.iter().any(|a| a == "--latency") {
        let url = fresh_database("idem_bench_latency").await;
        let db = connect(&url).await;
        db.batch_execute(&std::fs::read_to_string(script("setup")).expect("setup.sql")).await.expect("bench setup");
        let lat = latency::rows(cluster_addr(), "idem_bench_latency", &url, s.smoke).await;
        print!("{}", latency::render(&lat));
        std::fs::write(out.join("latency.csv"), latency::csv(&lat)).expect("csv");
        check_latency(&lat);
        println!("{} latency cases measured; wrote target/bench/latency.csv", lat.len());
        return;
    }
    let url = fresh_database("idem_bench").await;
    let db = connect(&url).await;
    db.batch_execute(&std::fs::read_to_string(script("setup")).expect("setup.sql")).await.expect("bench setup");
    db.batch_execute("VACUUM ANALYZE").await.expect("vacuum");
    let mut rows: Vec<Row> = Vec::new();
    // --steps: only the recovery points' rows (steps.rs).
    if args.iter().any(|a| a == "--steps") {
        rows.extend(steps::rows(&url, &db, s.smoke, s.reps, s.run).await);
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        check_numbers(&rows, None);
        return;
    }
    // --sqlx-acquire: only the row of sqlx's test_before_acquire.
    if args.iter().any(|a| a == "--sqlx-acquire") {
        rows.push(sqlx_acquire_row(&s, &url).await);
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        check_numbers(&rows, None);
        return;
    }
    // --replay-first: only the replay-first rows (issue 43 item 3): idem_replay against the
    // primary-key SELECT (pgbench, 8 clients), then the Rust rows of both drivers.
    if args.iter().any(|a| a == "--replay-first") {
        rows.push(idem_replay_row(&s, &url, &db, 8).await);
        replay_first_rows(&s, &url, &db, &mut rows).await;
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        check_numbers(&rows, None);
        return;
    }
    // --waiters: only the waiters' row (waiters.rs).
    if args.iter().any(|a| a == "--waiters") {
        rows.push(waiters::row(&url, &db, s.smoke, s.reps).await);
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        check_numbers(&rows, None);
        return;
    }
    if only_rust {
        rust_rows(&s, &url, &db, &mut rows).await;
        print!("{}", render(&rows, None, &s, started.elapsed().as_secs()));
        check_numbers(&rows, None);
        return;
    }

    // 1-2: fresh execution against the hand-written protocol and the bare business transaction.
    for &c in &s.clients {
        let (hand, fresh) = pair(&s, &url, &db, "handwritten", "fresh", c).await;
        rows.push(Row { figure: "fresh execution vs hand-written protocol".into(), clients: c.to_string(), baseline: "hand-written INSERT ON CONFLICT + insert + UPDATE".into(), base: hand, ours: fresh, goal: Some(0.95), work: work(&url, &db, "fresh", "handwritten").await });
        let (bare, fresh) = pair(&s, &url, &db, "bare", "fresh", c).await;
        rows.push(Row { figure: "fresh execution vs bare business transaction".into(), clients: c.to_string(), baseline: "BEGIN; INSERT; COMMIT".into(), base: bare, ours: fresh, goal: Some(0.55), work: work(&url, &db, "fresh", "bare").await });
        // The smallest protocol one could write by hand (one key column, one expiry index, no
        // token, no lease), in the same five statements and as one statement.
        let minimal = "minimal hand-written: INSERT ON CONFLICT + insert + HOT UPDATE, 1 key column";
        let (base, fresh) = pair(&s, &url, &db, "minimal", "fresh", c).await;
        rows.push(Row { figure: "fresh execution vs minimal hand-written protocol".into(), clients: c.to_string(), baseline: minimal.into(), base, ours: fresh, goal: Some(1.1), work: work(&url, &db, "fresh", "minimal").await });
        let (base, one) = pair(&s, &url, &db, "minimal", "fresh_one", c).await;
        rows.push(Row { figure: "fresh in one statement vs minimal hand-written protocol".into(), clients: c.to_string(), baseline: minimal.into(), base, ours: one, goal: Some(1.1), work: work(&url, &db, "fresh_one", "minimal").await });
        let (base, one) = pair(&s, &url, &db, "minimal_one", "fresh_one", c).await;
        rows.push(Row { figure: "fresh in one statement vs minimal hand-written in one statement".into(), clients: c.to_string(), baseline: "insert, then the finished record (23505 on a duplicate)".into(), base, ours: one, goal: None, work: work(&url, &db, "fresh_one", "minimal_one").await });
    }
    // 3: replay.
    for &c in &s.clients {
        let (pk, replay) = pair(&s, &url, &db, "pk_select", "replay", c).await;
        rows.push(Row { figure: "replay of an existing key vs primary-key SELECT".into(), clients: c.to_string(), baseline: "SELECT by primary key".into(), base: pk, ours: replay, goal: Some(0.85), work: work(&url, &db, "replay", "pk_select").await });
        rows.push(idem_replay_row(&s, &url, &db, c).await);
    }
    // 4: the seed libraries' store.
    let (seed, fresh) = pair(&s, &url, &db, "seed_store", "fresh", 8).await;
    rows.push(Row { figure: "fresh execution vs the seed libraries' store".into(), clients: "8".into(), baseline: "lookup, reserve, run, save: 4 statements, 3 commits".into(), base: seed, ours: fresh, goal: Some(1.3), work: work(&url, &db, "fresh", "seed_store").await });

    // 4b: batches: 1,000 keys in one idem_reserve_many + idem_complete_many against the same
    // keys one call at a time in one transaction (both scripts do 1,000 keys per transaction:
    // the tps ratio is the per-key cost ratio).
    let (singles, batch) = pair_scripts(&s, &url, &db, &singles_script(1000), &script("batch"), 1).await;
    rows.push(Row { figure: "1,000-key batch vs 1,000 single calls (per key)".into(), clients: "1".into(), baseline: "1,000 x (idem_reserve; idem_complete) in one transaction".into(), base: singles, ours: batch, goal: Some(5.0), work: None });

    // 4c: the canonical fingerprint of adversarial bodies against ordinary ones (CPU only).
    rows.extend(fingerprint::rows(s.smoke, s.reps));

    // 5: the Rust client against a raw tokio-postgres transaction doing the same insert.
    rust_rows(&s, &url, &db, &mut rows).await;

    // 6: the example services over HTTP, each route against its twin without the layer.
    let ratio_of = |figure: &str, clients: &str| rows.iter().find(|r| r.figure == figure && r.clients == clients).map(|r| format!("{:.2}", r.ratio()));
    let bound = s
        .clients
        .iter()
        .map(|c| ratio_of("fresh execution vs bare business transaction", &c.to_string()).map(|r| format!("{r} ({c})")))
        .collect::<Option<Vec<_>>>()
        .zip(ratio_of("Rust run vs raw tokio-postgres transaction", "8 tasks"))
        .map(|(sql, rust)| format!("bounds: SQL fresh/bare {}; Rust run/raw {rust} (8 tasks)", sql.join(", ")));
    http_rows(&s, &mut rows, bound).await;
    stack_rows(&s, &mut rows).await;
    // 6b: latency at a real round trip (latency.rs).
    let lat = latency::rows(cluster_addr(), "idem_bench", &url, s.smoke).await;

    // 7: growth: fresh execution with 10k vs 1M existing records (two databases, interleaved).
    let small = growth_db("idem_bench_small", 10_000).await;
    let large = growth_db("idem_bench_large", s.growth_rows).await;
    let (sdb, ldb) = (connect(&small).await, connect(&large).await);
    let pgbench_bin = pg_bin("pgbench");
    let (mut ms, mut ml) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        let order: [(&str, &tokio_postgres::Client, bool); 2] = if rep % 2 == 0 { [(&small, &sdb, true), (&large, &ldb, false)] } else { [(&large, &ldb, false), (&small, &sdb, true)] };
        for (u, d, is_small) in order {
            let before = pgbench::counters(d).await;
            let mut m = pgbench::run(&pgbench_bin, u, &script("fresh"), 8, s.run, &out.join("logs"));
            pgbench::delta(d, &before, &mut m).await;
            if is_small { ms.push(m) } else { ml.push(m) }
        }
    }
    rows.push(Row { figure: format!("growth: fresh execution at {} vs 10k records", human(s.growth_rows)), clients: "8".into(), baseline: "the same, 10k existing records".into(), base: Measure::mean(&ms), ours: Measure::mean(&ml), goal: Some(0.85), work: None });

    // 8: sweep throughput, in a database of its own.
    let sweep_url = fresh_database("idem_bench_cycles").await;
    let rows_per_sec = sweep(&s, &connect(&sweep_url).await).await;

    // 9: the soak, on a server of its own (the maintenance worker needs the preloaded library).
    let soaked = run_soak(&s, &out).await;

    let swept = Some((rows_per_sec, &soaked));
    let report = render(&rows, swept, &s, started.elapsed().as_secs()) + &latency::render(&lat);
    print!("{report}");
    let table = csv(&rows, swept) + &latency::csv(&lat);
    std::fs::write(out.join("results.csv"), &table).expect("csv");
    draw(&table, &out.join("benchmark.png"), &title_of_run());
    check_numbers(&rows, swept);
    check_latency(&lat);
    println!(
        "{} cases measured; wrote target/bench/results.csv, target/bench/benchmark.png, target/bench/soak.csv and target/bench/soak.png",
        rows.len() + 2 + lat.len()
    );
}

/// The chart's title for a run on this machine.
fn title_of_run() -> String {
    format!("idempotency {} — {}", env!("CARGO_PKG_VERSION"), machine())
}

/// The chart of a results CSV.
fn draw(csv: &str, png: &Path, title: &str) {
    if let Err(e) = chart::draw(png, title, &chart::bars(csv)) {
        eprintln!("chart not drawn: {e}");
        std::process::exit(1);
    }
}

/// The smoke mode asserts only that every case ran and produced numbers.
fn check_numbers(rows: &[Row], sweep: Option<(f64, &soak::Soak)>) {
    let empty: Vec<&str> = rows.iter().filter(|r| !(r.base.tps > 0.0 && r.ours.tps > 0.0)).map(|r| r.figure.as_str()).collect();
    if !empty.is_empty() || sweep.is_some_and(|(rps, soaked)| rps <= 0.0 || soaked.cycles.iter().any(|c| c.total() <= 0)) {
        eprintln!("cases without numbers: {empty:?}{}", if sweep.is_some_and(|(rps, _)| rps <= 0.0) { " and the sweep" } else { "" });
        std::process::exit(1);
    }
}

/// [`check_numbers`] of the latency rows.
fn check_latency(rows: &[latency::LatencyRow]) {
    let empty: Vec<&str> = rows.iter().filter(|r| !r.measured()).map(latency::LatencyRow::figure).collect();
    if !empty.is_empty() {
        eprintln!("latency cases without numbers: {empty:?}");
        std::process::exit(1);
    }
}

async fn growth_db(name: &str, rows: i64) -> String {
    let url = fresh_database(name).await;
    let db = connect(&url).await;
    db.batch_execute(&std::fs::read_to_string(script("setup")).expect("setup.sql").replace("generate_series(1, 100000)", "generate_series(1, 1)"))
        .await
        .expect("setup");
    db.execute(
        "INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response, lease_expires_at, expires_at, created_at, updated_at, attempts)
         SELECT _idem_id('bench.old', 'u' || (i % 1000), 'old' || i), 'bench.old', 'u' || (i % 1000), 'old' || i, _idem_hash('h'), 's',
                nextval('idem_token_seq'), '{\"status\": 201}', now(), now() + interval '10 days', now(), now(), 0
           FROM generate_series(1, $1::bigint) AS i",
        &[&rows],
    )
    .await
    .expect("prefill");
    db.batch_execute("VACUUM ANALYZE").await.expect("vacuum");
    url
}

/// Sweep throughput (rows/s) of expired rows, in batches of 10,000.
async fn sweep(s: &Settings, db: &tokio_postgres::Client) -> f64 {
    db.execute(
        "INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response, lease_expires_at, expires_at, created_at, updated_at, attempts)
         SELECT _idem_id('bench.sweep', 'u' || (i % 1000), 's' || i), 'bench.sweep', 'u' || (i % 1000), 's' || i, _idem_hash('h'), 's',
                nextval('idem_token_seq'), '{\"status\": 201}',
                now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now() - interval '2 days', 0
           FROM generate_series(1, $1::bigint) AS i",
        &[&s.sweep_rows],
    )
    .await
    .expect("expired rows");
    db.batch_execute("VACUUM ANALYZE idem_records").await.expect("vacuum");
    let started = Instant::now();
    let mut deleted = 0i64;
    loop {
        let n: i64 = db.query_one("SELECT idem_sweep(10000) AS n", &[]).await.expect("sweep").get("n");
        deleted += n;
        if n < 10000 {
            break;
        }
    }
    deleted as f64 / started.elapsed().as_secs_f64()
}

/// The soak (see soak.rs); writes its CSV and chart.
async fn run_soak(s: &Settings, out: &Path) -> soak::Soak {
    let soaked = soak::soak(s.soak_cycles, 4, s.soak_per_client).await;
    std::fs::write(out.join("soak.csv"), soaked.csv()).expect("soak csv");
    let kb: Vec<f64> = soaked.cycles.iter().map(|c| c.total() as f64 / 1024.0).collect();
    soak_chart(&kb, &out.join("soak.png"), &soak_title(soaked.transactions_per_cycle));
    soaked
}

fn soak_title(transactions_per_cycle: u32) -> String {
    format!("idempotency {} soak: size after each cycle of {transactions_per_cycle} transactions", env!("CARGO_PKG_VERSION"))
}

/// The soak's chart: sizes in kB per cycle, the goal drawn at its multiple of cycle 5's size.
fn soak_chart(kb: &[f64], png: &Path, title: &str) {
    let base = kb.get(soak::BASE_CYCLE - 1).or(kb.first()).copied().unwrap_or(0.0);
    if let Err(e) = chart::sizes(png, title, kb, base * soak::GOAL, &format!("goal: {} x the size after cycle {}", soak::GOAL, soak::BASE_CYCLE)) {
        eprintln!("soak chart not drawn: {e}");
        std::process::exit(1);
    }
}

fn soak_line(s: &Settings, soaked: &soak::Soak) -> String {
    let size = |i: usize| soaked.cycles.get(i).map(|c| c.total() / 1024).unwrap_or(0);
    let last = soaked.cycles.last().copied().unwrap_or_default();
    format!(
        "| soak: size after {} cycles / after cycle {} (worker sweeps, default autovacuum) | 4 | — | {} tx/cycle | {:.2} | ≤ {:.2} {} | {} kB after cycle {}, {} kB after the last; {} autovacuums, {} vacuums; {:.0} s | | | | |",
        soaked.cycles.len(),
        soak::BASE_CYCLE,
        soaked.transactions_per_cycle,
        soaked.ratio(),
        soak::GOAL,
        if soaked.ratio() <= soak::GOAL { "met" } else { "not met" },
        size(soak::BASE_CYCLE - 1),
        soak::BASE_CYCLE,
        size(soaked.cycles.len().saturating_sub(1)),
        last.autovacuums,
        last.vacuums,
        soaked.seconds,
    ) + if s.smoke { " (smoke: too few cycles to mean anything)" } else { "" }
}

fn human(n: i64) -> String {
    if n >= 1_000_000 { format!("{}M", n / 1_000_000) } else { format!("{}k", n / 1000) }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores ({model}), PostgreSQL 15, loopback")
}

fn render(rows: &[Row], sweep: Option<(f64, &soak::Soak)>, s: &Settings, secs: u64) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "\nidempotency benchmark — {} — {} s per run, {} interleaved runs per side{}\n", machine(), s.run.as_secs_f64(), s.reps, if s.smoke { " (SMOKE: numbers are not meaningful)" } else { "" });
    let _ = writeln!(t, "| figure | clients | baseline tps | ours tps | ratio | goal | p50 / p99 ms (ours) | p50 / p99 ms (baseline) | WAL B/op (ours / base) | HOT (ours) | statements per op, nested included (ours / base) |");
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let goal = r.goal.map(|g| format!("≥ {g:.2} {}", if r.ratio() >= g { "met" } else { "not met" })).unwrap_or_else(|| "—".into());
        let hot = r.ours.hot_ratio().map(|h| format!("{:.0}%", h * 100.0)).unwrap_or_else(|| "—".into());
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} / {:.0} | {} | {} |",
            r.figure, r.clients, r.base.tps, r.ours.tps, r.ratio(), goal, r.ours.p50_ms, r.ours.p99_ms, r.base.p50_ms, r.base.p99_ms,
            r.ours.wal_per_op(), r.base.wal_per_op(), hot, r.work.as_deref().unwrap_or("")
        );
    }
    if let Some((sweep_rps, soaked)) = sweep {
        let _ = writeln!(t, "| sweep | 1 | — | {:.0} rows/s | {:.2} | ≥ 200k rows/s {} | | | | | |", sweep_rps, sweep_rps / 200_000.0, if sweep_rps >= 200_000.0 { "met" } else { "not met" });
        let _ = writeln!(t, "{}", soak_line(s, soaked));
    }
    let _ = writeln!(t, "\n(total {secs} s)");
    t
}

fn csv(rows: &[Row], sweep: Option<(f64, &soak::Soak)>) -> String {
    let mut c = String::from("figure,clients,baseline,baseline_tps,ours_tps,ratio,goal,ours_p50_ms,ours_p99_ms,base_p50_ms,base_p99_ms,ours_wal_per_op,base_wal_per_op,ours_hot_ratio,statements\n");
    for r in rows {
        let _ = writeln!(
            c,
            "\"{}\",{},\"{}\",{:.1},{:.1},{:.3},{},{:.3},{:.3},{:.3},{:.3},{:.0},{:.0},{},\"{}\"",
            r.figure, r.clients, r.baseline, r.base.tps, r.ours.tps, r.ratio(), r.goal.map(|g| g.to_string()).unwrap_or_default(),
            r.ours.p50_ms, r.ours.p99_ms, r.base.p50_ms, r.base.p99_ms, r.ours.wal_per_op(), r.base.wal_per_op(),
            r.ours.hot_ratio().map(|h| format!("{h:.3}")).unwrap_or_default(), r.work.as_deref().unwrap_or("")
        );
    }
    if let Some((sweep_rps, soaked)) = sweep {
        let _ = writeln!(c, "\"sweep rows per second\",1,,,{sweep_rps:.0},{:.3},1,,,,,,,,", sweep_rps / 200_000.0);
        let base = soaked.cycles.get(soak::BASE_CYCLE - 1).or(soaked.cycles.first()).map(soak::Sizes::total).unwrap_or(0);
        let last = soaked.cycles.last().map(soak::Sizes::total).unwrap_or(0);
        let _ = writeln!(c, "\"soak: size after the last cycle / after cycle {}\",4,,{base},{last},{:.3},{},,,,,,,,", soak::BASE_CYCLE, soaked.ratio(), soak::GOAL);
    }
    c
}

/// The Rust client's rows: `run` against the same INSERT in a raw tokio-postgres transaction,
/// and a replay against a raw primary-key SELECT, at 8 and 32 tasks (8 in smoke mode), with the
/// round trips the proxy counts per call.
async fn rust_rows(s: &Settings, url: &str, db: &tokio_postgres::Client, rows: &mut Vec<Row>) {
    let upstream = cluster_addr();
    let calls = if s.smoke { 20 } else { 200 };
    let t = idempotency_testkit::trips::count(upstream, "idem_bench", client::INSERT, calls, 8).await;
    let tasks: &[usize] = if s.smoke { &[8] } else { &[8, 32] };
    for &n in tasks {
        let (mut raw, mut run) = (Vec::new(), Vec::new());
        for rep in 0..s.reps {
            for first in [rep % 2 == 0, rep % 2 != 0] {
                let m = client::throughput(url, db, n, s.run, if first { client::Call::RawInsert } else { client::Call::Run }).await;
                if first { raw.push(m) } else { run.push(m) }
            }
        }
        rows.push(Row { figure: "Rust run vs raw tokio-postgres transaction".into(), clients: format!("{n} tasks"), baseline: "BEGIN; INSERT; COMMIT (tokio-postgres)".into(), base: Measure::mean(&raw), ours: Measure::mean(&run), goal: Some(0.8), work: Some(format!(
            "round trips {:.2} ({:.2} from 8 loops, {:.2} empty closure) / {:.2}; run_external {:.2} to the outside call + {:.2}",
            t.run, t.concurrent, t.empty, t.raw, t.reserve, t.record
        )) });
        let (mut raw, mut one) = (Vec::new(), Vec::new());
        for rep in 0..s.reps {
            for first in [rep % 2 == 0, rep % 2 != 0] {
                let m = client::throughput(url, db, n, s.run, if first { client::Call::RawInsert } else { client::Call::RunStatement }).await;
                if first { raw.push(m) } else { one.push(m) }
            }
        }
        rows.push(Row { figure: "Rust run_statement vs raw tokio-postgres transaction".into(), clients: format!("{n} tasks"), baseline: "BEGIN; INSERT; COMMIT (tokio-postgres)".into(), base: Measure::mean(&raw), ours: Measure::mean(&one), goal: Some(if n == 8 { 0.85 } else { 0.75 }), work: Some("round trips 1 / 3".into()) });
        let (mut select, mut replayed) = (Vec::new(), Vec::new());
        for rep in 0..s.reps {
            for first in [rep % 2 == 0, rep % 2 != 0] {
                let m = client::throughput(url, db, n, s.run, if first { client::Call::RawSelect } else { client::Call::Replay }).await;
                if first { select.push(m) } else { replayed.push(m) }
            }
        }
        rows.push(Row { figure: "Rust replay vs raw tokio-postgres primary-key SELECT".into(), clients: format!("{n} tasks"), baseline: "prepared SELECT of the record (tokio-postgres)".into(), base: Measure::mean(&select), ours: Measure::mean(&replayed), goal: Some(0.9), work: Some(format!(
            "round trips {:.2} to the answer ({:.2} with its ROLLBACK) / 1", t.replay_answer, t.replay_all
        )) });
        let (mut select, mut cached) = (Vec::new(), Vec::new());
        for rep in 0..s.reps {
            for first in [rep % 2 == 0, rep % 2 != 0] {
                let m = client::throughput(url, db, n, s.run, if first { client::Call::RawSelect } else { client::Call::CachedReplay }).await;
                if first { select.push(m) } else { cached.push(m) }
            }
        }
        rows.push(Row { figure: "Rust replay from the replay cache vs raw primary-key SELECT".into(), clients: format!("{n} tasks"), baseline: "prepared SELECT of the record (tokio-postgres)".into(), base: Measure::mean(&select), ours: Measure::mean(&cached), goal: Some(3.0), work: Some("round trips 0 / 1".into()) });
    }
    sqlx_rows(s, url, calls, rows).await;
    replay_first_rows(s, url, db, rows).await;
    // The waiters' row (issue 44): waiting duplicates of a two-phase holder against 409s.
    rows.push(waiters::row(url, db, s.smoke, s.reps).await);
    // The recovery points' rows (issue 45): a three-step request against the steps by hand.
    rows.extend(steps::rows(url, db, s.smoke, s.reps, s.run).await);
}

/// The same rows over the sqlx driver, against a raw sqlx transaction and SELECT, at 8 tasks.
async fn sqlx_rows(s: &Settings, url: &str, calls: u64, rows: &mut Vec<Row>) {
    let upstream = cluster_addr();
    let rt_raw = client_sqlx::round_trips(upstream, "idem_bench", calls, false, false).await;
    let rt_run = client_sqlx::round_trips(upstream, "idem_bench", calls, true, false).await;
    let rt_empty = client_sqlx::round_trips(upstream, "idem_bench", calls, true, true).await;
    let (mut raw, mut run) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let m = client_sqlx::throughput(url, 8, s.run, if first { client::Call::RawInsert } else { client::Call::Run }).await;
            if first { raw.push(m) } else { run.push(m) }
        }
    }
    rows.push(Row { figure: "Rust run (sqlx) vs raw sqlx transaction".into(), clients: "8 tasks".into(), baseline: "begin; INSERT; commit (sqlx)".into(), base: Measure::mean(&raw), ours: Measure::mean(&run), goal: None, work: Some(format!("round trips {rt_run:.1} ({rt_empty:.1} empty closure) / {rt_raw:.1}")) });
    let (mut select, mut replayed) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let m = client_sqlx::throughput(url, 8, s.run, if first { client::Call::RawSelect } else { client::Call::Replay }).await;
            if first { select.push(m) } else { replayed.push(m) }
        }
    }
    rows.push(Row { figure: "Rust replay (sqlx) vs raw sqlx primary-key SELECT".into(), clients: "8 tasks".into(), baseline: "SELECT of the record (sqlx)".into(), base: Measure::mean(&select), ours: Measure::mean(&replayed), goal: None, work: None });
    let (mut select, mut cached) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let m = client_sqlx::throughput(url, 8, s.run, if first { client::Call::RawSelect } else { client::Call::CachedReplay }).await;
            if first { select.push(m) } else { cached.push(m) }
        }
    }
    rows.push(Row { figure: "Rust replay from the replay cache (sqlx) vs raw sqlx primary-key SELECT".into(), clients: "8 tasks".into(), baseline: "SELECT of the record (sqlx)".into(), base: Measure::mean(&select), ours: Measure::mean(&cached), goal: Some(3.0), work: Some("round trips 0 / 1".into()) });
    rows.push(sqlx_acquire_row(s, url).await);
}

/// `idem_replay` of an existing key against the primary-key SELECT of its record, pgbench at
/// `clients` (bench/pgbench/idem_replay.sql, issue 43 item 3).
async fn idem_replay_row(s: &Settings, url: &str, db: &tokio_postgres::Client, clients: u32) -> Row {
    let (pk, replay) = pair(s, url, db, "pk_select", "idem_replay", clients).await;
    Row { figure: "idem_replay of an existing key vs primary-key SELECT".into(), clients: clients.to_string(), baseline: "SELECT by primary key".into(), base: pk, ours: replay, goal: Some(0.9), work: work(url, db, "idem_replay", "pk_select").await }
}

/// Replay first (`Settings::replay_first`, issue 43 item 3), over each driver at 8 tasks,
/// interleaved in one process (the order rotated each repetition): a replay with the setting
/// and without it against the raw primary-key SELECT of the record, and a fresh `run` with it
/// against one without (what the setting costs a fresh request: `idem_replay` first). The load
/// average before and after goes to stderr (ratios only: the machine is shared).
async fn replay_first_rows(s: &Settings, url: &str, db: &tokio_postgres::Client, rows: &mut Vec<Row>) {
    use client::Call::{FirstReplay, FirstRun, RawSelect, Replay, Run};
    let before = load_average();
    for sqlx in [false, true] {
        let driver = if sqlx { "sqlx" } else { "tokio-postgres" };
        let measure = |kind| async move {
            match sqlx {
                true => client_sqlx::throughput(url, 8, s.run, kind).await,
                false => client::throughput(url, db, 8, s.run, kind).await,
            }
        };
        let kinds = [RawSelect, Replay, FirstReplay, Run, FirstRun];
        let mut runs: Vec<Vec<Measure>> = vec![Vec::new(); kinds.len()];
        for rep in 0..s.reps {
            for i in 0..kinds.len() {
                let at = (i + rep) % kinds.len();
                runs[at].push(measure(kinds[at]).await);
            }
        }
        let [select, off, on, fresh_off, fresh_on] = [0, 1, 2, 3, 4].map(|i| Measure::mean(&runs[i]));
        let baseline = format!("SELECT of the record ({driver})");
        rows.push(Row { figure: format!("Rust replay ({driver}) vs raw primary-key SELECT, replay_first off"), clients: "8 tasks".into(), baseline: baseline.clone(), base: select.clone(), ours: off, goal: None, work: Some("BEGIN+reserve, its ROLLBACK queued".into()) });
        rows.push(Row { figure: format!("Rust replay ({driver}) vs raw primary-key SELECT, replay_first on"), clients: "8 tasks".into(), baseline, base: select, ours: on, goal: Some(if sqlx { 0.6 } else { 0.8 }), work: Some("idem_replay in autocommit, nothing after it".into()) });
        rows.push(Row { figure: format!("Rust fresh run ({driver}), replay_first on vs off"), clients: "8 tasks".into(), baseline: format!("run of a new key ({driver})"), base: fresh_off, ours: fresh_on, goal: None, work: Some("idem_replay's round trip first".into()) });
    }
    eprintln!("replay-first rows: load average {before} before, {} after", load_average());
}

/// The load average (1, 5, 15 min) as /proc/loadavg says it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// What sqlx's `test_before_acquire` (a ping on every acquire, sqlx's default) costs a replay:
/// replays over a pool that tests (a pool of your own made with sqlx's defaults, given to
/// `from_pool`) against one that does not (what `from_url` makes), interleaved, at 8 tasks.
async fn sqlx_acquire_row(s: &Settings, url: &str) -> Row {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for rep in 0..s.reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let m = client_sqlx::replay_over_pool(url, 8, s.run, !first).await;
            if first { off.push(m) } else { on.push(m) }
        }
    }
    Row { figure: "Rust replay (sqlx), pool with test_before_acquire vs without".into(), clients: "8 tasks".into(), baseline: "replay, test_before_acquire(false) (from_url's pool)".into(), base: Measure::mean(&off), ours: Measure::mean(&on), goal: None, work: Some("a ping per acquire".into()) }
}
