//! What the lifecycle tests against the fake Latitude share: settings and
//! pools changed from SQL as an operator would, the deletion controls, and
//! the jobs run round after round.

use shepherd::jobs::delete_machine::DeleteOutcome;

use super::latitude::World;
use super::world::{Ran, drain_with};

pub async fn setting(w: &World, key: &str, value: &str) {
    sqlx::query("select shepherd.change_setting($1, $2, 'the test', 'test')")
        .bind(key)
        .bind(value)
        .execute(&w.pool)
        .await
        .unwrap_or_else(|e| panic!("{key} = {value}: {e}"));
}

pub async fn set_count(w: &World, pool: &str, count: u32) {
    sqlx::query(
        "select shepherd.set_pool($1, 'c2-small-x86', 'DAL', $2, 'ubuntu_24_04_x64_lts',
                                  '{}', 'the test resizes it', 'test', false)",
    )
    .bind(pool)
    .bind(count as i32)
    .execute(&w.pool)
    .await
    .unwrap_or_else(|e| panic!("set_pool {pool} {count}: {e}"));
}

/// Acknowledges a machine's leave from SQL, as a drain script would.
pub async fn acknowledge(w: &World, device: &str) {
    sqlx::query("select shepherd.acknowledge_leave($1, 'test')")
        .bind(device)
        .execute(&w.pool)
        .await
        .unwrap_or_else(|e| panic!("acknowledge {device}: {e}"));
}

/// Pauses (true) or resumes deletions from SQL.
pub async fn pause_deletions(w: &World, paused: bool) {
    let statement = if paused {
        "select shepherd.pause_deletions('the test', 'test')"
    } else {
        "select shepherd.resume_deletions('the test', 'test')"
    };
    sqlx::query(statement)
        .execute(&w.pool)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Why the deletion among `ran` was cancelled; fails if none was.
pub fn cancelled_reason(ran: &[Ran]) -> String {
    ran.iter()
        .find_map(|r| match r {
            Ran::Delete(DeleteOutcome::Cancelled { reason }) => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("not cancelled: {ran:?}"))
}

/// Our servers' ids at the fake, oldest first.
pub fn server_ids(w: &World) -> Vec<String> {
    w.fake.servers().into_iter().map(|s| s.id).collect()
}

/// A leave hook on loopback that answers every POST with `answer(n)`
/// (n counts from 0) and keeps the bodies, each with what it was signed
/// with under `_signature`, `_timestamp` and the raw body under `_raw`;
/// `/login` answers 200, as the page a log-in proxy redirects to would.
pub async fn drain_rounds(w: &World, rounds: usize) -> Vec<Ran> {
    let mut ran = vec![];
    for _ in 0..rounds {
        ran.extend(drain_with(&w.pool, &w.ctx).await);
        w.make_due().await;
    }
    ran.extend(drain_with(&w.pool, &w.ctx).await);
    ran
}
