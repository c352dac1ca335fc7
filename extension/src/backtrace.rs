//! No backtrace in an error's detail.
//!
//! pgrx's panic hook captures a Rust backtrace on every panic (`Backtrace::capture`, which
//! honours `RUST_LIB_BACKTRACE` and `RUST_BACKTRACE`), and its guard around each SQL-callable
//! function writes that backtrace into the DETAIL of the ERROR it raises: for a Rust panic, and
//! for a PostgreSQL error passing through a guarded call alike. A server started with
//! `RUST_BACKTRACE` set (a developer's shell, a container image) sent dozens of frames of our
//! internals to every client that met an error.
//!
//! std reads those variables once, at the first capture, and keeps the answer for the rest of
//! the process; this library links its own std, so the answer is this library's alone. [`off`]
//! makes that first read say "off" (`RUST_LIB_BACKTRACE=0`, which takes precedence over
//! `RUST_BACKTRACE`), then puts the environment back as it was: nothing else in the server sees
//! a change, and no later setting of either variable turns backtraces on here. A panic still
//! reaches the client as an ERROR with its message (and the server log has file and line).

/// Turns backtrace capture off for this library. Called first in `_PG_init`, before anything
/// can panic (the postmaster's when preloaded, so every backend inherits the answer).
pub(crate) fn off() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    // A backend is single-threaded, and _PG_init runs before any thread of ours exists.
    std::env::set_var(VAR, "0");
    let _ = std::backtrace::Backtrace::capture();
    match saved {
        Some(value) => std::env::set_var(VAR, value),
        None => std::env::remove_var(VAR),
    }
}
