//! `sqlx::migrate!` embeds `migrations/` when the library compiles, and
//! Cargo recompiles only when a file it tracks changes: a migration added
//! without touching Rust would leave the binary and the tests migrating to
//! the old schema. Watching the directory makes a new file a reason to
//! rebuild.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
