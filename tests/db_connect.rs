//! What a pool from `shepherd::db::connect` says on its own: a slow
//! statement (a migration's DDL, a big listing) is noted at DEBUG, not
//! written whole at WARN onto an operator's terminal.

use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_slow_statement_is_no_warning() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = url.rsplit_once('/').expect("DATABASE_URL names a database");
    let pool = shepherd::db::connect(&format!("{server}/postgres"), 1)
        .await
        .expect("the maintenance database answers");
    let seen = Buffer::default();
    let writer = seen.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    sqlx::query("select pg_sleep(1.2), 'a statement long enough to notice'")
        .execute(&pool)
        .await
        .unwrap();
    let log = String::from_utf8(seen.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("slow statement"),
        "the note is kept, at DEBUG: {log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" WARN ") && l.contains("slow statement")),
        "{log}"
    );
}
