//! Every check of the operator credential, from the log-in form or a
//! script's `Authorization: Bearer`, goes through [`check`]: counted,
//! throttled and logged the same way.
//!
//! Throttling is per source first. A source that failed
//! [`PER_SOURCE`] times in [`WINDOW_SECONDS`] is refused until its oldest
//! failure leaves the window, so a stranger who guesses locks out only
//! themself. Across the cluster, once more than [`OVERALL_PER_MINUTE`]
//! checks failed in the last minute (guesses from many addresses), every
//! source that has failed at all in the window is refused too; a source
//! with no failure still has its first try, so an operator with the right
//! credential gets in while the cluster is being guessed at. The count, the
//! comparison and the record happen under a lock of the source's, so
//! parallel guesses from one source are counted one after another.

use sha2::{Digest, Sha256};

use super::{Failure, database_failure};

/// Failed checks one source may make in the window.
pub(super) const PER_SOURCE: i64 = 5;
pub(super) const WINDOW_SECONDS: i64 = 300;
/// Failed checks across the cluster in a minute above which any source
/// with a failure in the window is refused.
pub(super) const OVERALL_PER_MINUTE: i64 = 30;

/// The least a credential must be to guard the console: guessing is then
/// hopeless whatever the throttle lets through.
pub const MIN_LENGTH: usize = 24;
pub const MIN_DISTINCT: usize = 8;

/// Why a credential from `--operator-token-file` is refused, if it is.
pub fn too_weak(credential: &str) -> Option<String> {
    let length = credential.chars().count();
    let mut distinct: Vec<char> = credential.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if length < MIN_LENGTH || distinct.len() < MIN_DISTINCT {
        Some(format!(
            "the operator credential is too weak ({length} characters, {} different): it needs \
             at least {MIN_LENGTH} characters and {MIN_DISTINCT} different ones; make one with \
             `openssl rand -base64 32`",
            distinct.len()
        ))
    } else {
        None
    }
}

/// What a session records of the credential it was made with: enough to
/// tell a rotation, too little to help a guess.
pub(super) fn fingerprint(credential: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"shepherd console credential\0")
        .chain_update(credential.as_bytes())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares `given` with `secret` in a time that depends on the secret's
/// length only: no early stop at the first difference or at a length that
/// differs.
fn same_secret(given: &str, secret: &str) -> bool {
    let (given, secret) = (given.as_bytes(), secret.as_bytes());
    let mut differ = u8::from(given.len() != secret.len());
    for (i, s) in secret.iter().enumerate() {
        differ |= given.get(i).copied().unwrap_or(!s) ^ s;
    }
    differ == 0
}

/// Where a credential check came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Door {
    LogIn,
    Bearer,
}

impl Door {
    fn as_str(self) -> &'static str {
        match self {
            Door::LogIn => "log-in",
            Door::Bearer => "bearer",
        }
    }
}

/// The name a failure is recorded under: what was typed, with anything but
/// a name's characters replaced, so that no name (a NUL, a control
/// character) can make the record fail and the guess go uncounted.
fn recorded_name(who: &str) -> String {
    let name: String = who
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@') {
                c
            } else {
                '?'
            }
        })
        .collect();
    if name.is_empty() { "?".into() } else { name }
}

/// Checks `given` against `secret` for `who` from `source`, refusing a
/// source the throttle holds before comparing anything. The failure is
/// written before the comparison and kept only when the credential is
/// wrong, so a check whose record cannot be written compares nothing.
pub(super) async fn check(
    pool: &sqlx::PgPool,
    source: &str,
    door: Door,
    who: &str,
    given: &str,
    secret: &str,
) -> Result<(), Failure> {
    let failed = |e| database_failure("checking the operator credential", e);
    let who = recorded_name(who);
    let mut tx = pool.begin().await.map_err(failed)?;
    // One check per source at a time; another from the same source is
    // told to come back rather than holding one of the pages' few
    // connections while it waits.
    let free: bool = sqlx::query_scalar(
        "select pg_catalog.pg_try_advisory_xact_lock(
             pg_catalog.hashtextextended('shepherd.console.source:' || $1::text, 0::int8))",
    )
    .bind(source)
    .fetch_one(&mut *tx)
    .await
    .map_err(failed)?;
    if !free {
        return Err(Failure::TooManyRequests(
            "another credential check from this address is under way: try again in a second".into(),
            1,
        ));
    }
    let (mine, oldest_mine, overall): (i64, Option<f64>, i64) = sqlx::query_as(
        "select count(*) filter (where source = $1),
                extract(epoch from now() - min(at) filter (where source = $1))::float8,
                count(*) filter (where at > now() - interval '1 minute')
         from shepherd.console_login_failures
         where at > now() - make_interval(secs => $2)",
    )
    .bind(source)
    .bind(WINDOW_SECONDS as f64)
    .fetch_one(&mut *tx)
    .await
    .map_err(failed)?;
    let held = if mine >= PER_SOURCE {
        let age = oldest_mine.unwrap_or(0.0).max(0.0) as i64;
        Some(((WINDOW_SECONDS - age).max(1), "this address"))
    } else if overall > OVERALL_PER_MINUTE && mine > 0 {
        Some((60, "the cluster"))
    } else {
        None
    };
    if let Some((wait, whose)) = held {
        tracing::warn!(
            source,
            door = door.as_str(),
            who,
            failed = mine,
            failed_overall = overall,
            "operator credential check throttled"
        );
        return Err(Failure::TooManyRequests(
            format!(
                "too many wrong credentials from {whose} ({mine} from this address in the last \
                 {} minutes, {overall} in the cluster in the last minute): try again in {wait} s",
                WINDOW_SECONDS / 60
            ),
            wait as u64,
        ));
    }
    sqlx::query(
        "insert into shepherd.console_login_failures (who, source, door) values ($1, $2, $3)",
    )
    .bind(&who)
    .bind(source)
    .bind(door.as_str())
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    if same_secret(given, secret) {
        // Right: the record goes with the transaction.
        tx.rollback().await.map_err(failed)?;
        return Ok(());
    }
    tx.commit().await.map_err(failed)?;
    tracing::warn!(
        source,
        door = door.as_str(),
        who,
        "operator credential refused: wrong credential"
    );
    Err(Failure::Unauthorized("wrong credential".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("abcd", "abc"));
        assert!(!same_secret("", "abc"));
    }

    #[test]
    fn a_recorded_name_is_always_recordable() {
        assert_eq!(recorded_name("alice"), "alice");
        assert_eq!(recorded_name("a\0b\nc"), "a?b?c");
        assert_eq!(recorded_name(""), "?");
        assert_eq!(recorded_name(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn weak_credentials_are_named() {
        assert!(too_weak("right").is_some());
        assert!(too_weak("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").is_some());
        assert!(too_weak("0123456701234567012345670").is_none());
        assert!(too_weak("Zm9vYmFyYmF6cXV4cXV1eHh5enp5").is_none());
        let why = too_weak("short").unwrap();
        assert!(why.contains("5 characters"), "{why}");
    }

    #[test]
    fn a_fingerprint_tells_credentials_apart_and_hides_them() {
        let a = fingerprint("one-credential-of-twenty-four");
        assert_eq!(a.len(), 16);
        assert_eq!(a, fingerprint("one-credential-of-twenty-four"));
        assert_ne!(a, fingerprint("two-credential-of-twenty-four"));
        assert!(!a.contains("credential"));
    }
}
