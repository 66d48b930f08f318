//! Connecting to Postgres, creating the database, and migrating it.
//!
//! Migrations are safe to run from many processes at once: each migrator
//! holds a Postgres advisory lock while it works, and creating the database
//! tolerates losing the race to another process.

use std::time::Duration;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("DATABASE_URL is not a valid Postgres URL: {0}")]
    BadUrl(String),
    #[error(
        "cannot reach Postgres at {target}: {reason}. Start one (e.g. `docker compose up -d postgres`, or install the postgresql package) or point DATABASE_URL at one"
    )]
    Unreachable { target: String, reason: String },
    #[error(
        "the Postgres server at {target} answered and refused the connection: {reason}. Check the user, password, database and sslmode in DATABASE_URL"
    )]
    Refused { target: String, reason: String },
    #[error(
        "the Postgres server at {target} answered, but it has no database {name}: create it and apply shepherd's schema with `shepherd migrate`"
    )]
    NoDatabase { target: String, name: String },
    #[error(
        "the Postgres server at {target} has no connection left for shepherd ({reason}): every client of it counts against its max_connections. A worker opens at most --db-connections + 1 + --console-connections (5 with the defaults), a scheduler 3 + --console-connections, a command 2 (docs/operations.md, --db-connections); raise max_connections, lower --db-connections, or run fewer processes"
    )]
    Full { target: String, reason: String },
    #[error(
        "the server at {target} refused a startup parameter shepherd sends ({reason}): it is a connection pooler, not Postgres. With PgBouncer, set `ignore_startup_parameters = extra_float_digits`; the pages' statement timeout travels the same way, so give them `--console-statement-timeout 0` (and a statement_timeout on their role) or a --console-database-url that reaches Postgres itself (docs/operations.md, \"Behind PgBouncer\")"
    )]
    Pooler { target: String, reason: String },
    #[error("cannot create database {name}: {reason}")]
    CreateDatabase { name: String, reason: String },
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error("database: {0}")]
    Query(#[from] sqlx::Error),
}

/// Host, port and database of a URL, without user or password, for messages.
pub fn describe_url(url: &str) -> String {
    match url.parse::<PgConnectOptions>() {
        Ok(o) => format!(
            "{}:{}/{}",
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or("")
        ),
        Err(_) => "<unparseable DATABASE_URL>".to_string(),
    }
}

pub fn check_url(url: &str) -> Result<PgConnectOptions, DbError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(DbError::BadUrl(
            "it must start with postgres:// or postgresql://".into(),
        ));
    }
    url.parse::<PgConnectOptions>()
        .map_err(|e| DbError::BadUrl(e.to_string()))
}

/// Creates the database named in `url` when it does not exist yet.
pub async fn ensure_database(url: &str) -> Result<(), DbError> {
    let options = check_url(url)?;
    let name = options.get_database().unwrap_or("postgres").to_string();
    let exists = Postgres::database_exists(url)
        .await
        .map_err(|e| unreachable(url, &e))?;
    if exists {
        return Ok(());
    }
    match Postgres::create_database(url).await {
        Ok(()) => Ok(()),
        // Another process created it between our check and our create.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => Ok(()),
        Err(e) => Err(DbError::CreateDatabase {
            name,
            reason: e.to_string(),
        }),
    }
}

fn unreachable(url: &str, e: &sqlx::Error) -> DbError {
    let name = url
        .rsplit_once('/')
        .map(|(_, n)| n.split('?').next().unwrap_or(n).to_string())
        .unwrap_or_default();
    classify(describe_url(url), name, e)
}

/// What a refused or failed connection means to an operator.
fn classify(target: String, name: String, e: &sqlx::Error) -> DbError {
    // The server answered "invalid_catalog_name": reachable, just no database.
    if let Some(db) = e.as_database_error()
        && db.code().as_deref() == Some("3D000")
    {
        return DbError::NoDatabase { target, name };
    }
    // "too many clients already", "remaining connection slots are
    // reserved": the server is full, which no check of the URL mends.
    if let Some(db) = e.as_database_error()
        && db.code().as_deref() == Some("53300")
    {
        return DbError::Full {
            target,
            reason: db.message().to_string(),
        };
    }
    // PgBouncer refuses startup parameters it cannot carry from one server
    // connection to the next (sqlx's `extra_float_digits`, the pages'
    // `statement_timeout` in `options`); checking the URL would not help.
    if let Some(db) = e.as_database_error()
        && db.message().contains("unsupported startup parameter")
    {
        return DbError::Pooler {
            target,
            reason: db.message().to_string(),
        };
    }
    // The server answered (a role that does not exist, a wrong password,
    // TLS asked of a server without it): starting one would not help.
    if e.as_database_error().is_some() || matches!(e, sqlx::Error::Tls(_)) {
        return DbError::Refused {
            target,
            reason: e.to_string(),
        };
    }
    DbError::Unreachable {
        target,
        reason: e.to_string(),
    }
}

/// Why `pool` cannot open a connection, asked of the server with one
/// connection of its own: a pool that cannot connect says only that it
/// timed out waiting, which hides the server's reason (a full server, a
/// role at its limit, a server gone). `None`: the server takes a
/// connection now, so the pool's trouble was its own (every connection
/// busy).
pub async fn diagnose(pool: &PgPool) -> Option<DbError> {
    probe(&pool.connect_options()).await.err()
}

/// One connection, alone, within 5 s, and closed again: what is wrong with
/// connecting, said at once (a pool retries a refused port until its
/// acquire timeout and then says only that it timed out).
async fn probe(options: &PgConnectOptions) -> Result<(), DbError> {
    let name = options.get_database().unwrap_or("").to_string();
    let target = format!("{}:{}/{}", options.get_host(), options.get_port(), name);
    match tokio::time::timeout(
        Duration::from_secs(5),
        <sqlx::PgConnection as sqlx::Connection>::connect_with(options),
    )
    .await
    {
        Err(_) => Err(DbError::Unreachable {
            target,
            reason: "no answer within 5 s".into(),
        }),
        Ok(Err(e)) => Err(classify(target, name, &e)),
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            Ok(())
        }
    }
}

/// How long a connection nobody uses stays open: a worker at rest gives
/// back what a burst of work opened, on a server every process shares.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A pool for `url`. `max_connections` bounds what this process holds.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_idle(url, max_connections, IDLE_TIMEOUT).await
}

/// What every pool's connections say of a slow statement: sqlx writes the
/// whole statement at WARN by default, which for a migration is pages of
/// DDL on an operator's terminal. Kept at DEBUG (`--log
/// sqlx::query=debug` shows them), with the statement's time.
fn quiet_slow_statements(options: PgConnectOptions) -> PgConnectOptions {
    use sqlx::ConnectOptions;
    options.log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1))
}

/// [`connect`], closing connections unused for `idle`.
pub async fn connect_idle(
    url: &str,
    max_connections: u32,
    idle: Duration,
) -> Result<PgPool, DbError> {
    open(
        quiet_slow_statements(check_url(url)?.application_name("shepherd")),
        max_connections,
        Duration::from_secs(10),
        idle,
    )
    .await
}

/// The console's own pool, apart from the jobs': a few connections whose
/// statements the server cancels after `statement_timeout`, and which a
/// page waits on for at most 3 s. A heavy page (a week of charts, a search
/// of every job's arguments) then fails alone instead of holding the
/// connections jobs and heartbeats need. `application_name` tells them
/// apart in `pg_stat_activity`. A zero timeout sends none: a pooler in
/// transaction mode (PgBouncer) refuses a startup `statement_timeout`, as
/// it cannot carry it from one server connection to the next, and the
/// operator sets one on the pages' role instead.
pub async fn connect_pages(
    url: &str,
    max_connections: u32,
    statement_timeout: Duration,
) -> Result<PgPool, DbError> {
    let mut options = quiet_slow_statements(check_url(url)?).application_name("shepherd-console");
    if !statement_timeout.is_zero() {
        options = options.options([(
            "statement_timeout",
            format!("{}ms", statement_timeout.as_millis().max(1)),
        )]);
    }
    open(
        options,
        max_connections,
        Duration::from_secs(3),
        IDLE_TIMEOUT,
    )
    .await
}

/// The connection a worker holds to listen for new jobs (none with
/// `--no-listen`), apart from its pool.
pub const LISTEN_CONNECTIONS: u32 = 1;

/// The one connection that listens for new jobs: held for the process's
/// life, so it sits apart from the pool the queue and the jobs share, where
/// it would hold one of a few connections for good. `application_name`
/// tells it apart in `pg_stat_activity`.
pub fn listener_pool(jobs: &PgPool) -> PgPool {
    let options = (*jobs.connect_options())
        .clone()
        .application_name("shepherd-listen");
    PgPoolOptions::new()
        .max_connections(LISTEN_CONNECTIONS)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options)
}

async fn open(
    options: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
    idle: Duration,
) -> Result<PgPool, DbError> {
    probe(&options).await?;
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .idle_timeout(Some(idle))
        .acquire_timeout(acquire_timeout)
        // Checked above: the pool opens a connection when one is asked for,
        // not one more at start to sit idle.
        .connect_lazy_with(options))
}

/// shepherd's own migrations, tracked in their own table so they live beside
/// apalis's (which keeps `apalis._sqlx_migrations`).
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("./migrations");
    m.dangerous_set_table_name("shepherd._sqlx_migrations");
    m.create_schema("shepherd");
    m
}

/// Applies the job queue's schema, then shepherd's (whose operator views
/// read the queue's tables). A database already up to date is left alone
/// without taking the migrators' lock: that lock is a session's advisory
/// lock, which a pooler in transaction mode (PgBouncer) can leave held on
/// a server connection another client then gets, so every worker started
/// behind one would wait on it; and twenty workers starting at once need
/// not queue on it to learn there is nothing to do.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    let queue = apalis_postgres::PostgresStorage::<()>::migrations();
    let ours = migrator();
    // A role that may not read the ledgers is told, as one that may not
    // migrate is, to migrate as the owner and skip migrations.
    let current = async { Ok(up_to_date(pool, &queue).await? && up_to_date(pool, &ours).await?) };
    match current.await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(DbError::Query(e)) => return Err(DbError::Migrate(with_hint(e.to_string()))),
        Err(e) => return Err(e),
    }
    apalis_postgres::PostgresStorage::<()>::setup(pool)
        .await
        .map_err(|e| DbError::Migrate(with_hint(format!("job queue schema: {e}"))))?;
    ours.run(pool)
        .await
        .map_err(|e| DbError::Migrate(with_hint(e.to_string())))
}

/// Whether every migration of `migrator` is recorded as applied, clean and
/// with its checksum, and nothing else is: anything less (a migration
/// pending, a dirty or changed one, one this build does not know) goes to
/// the migrator itself, which applies it or says what is wrong.
pub async fn up_to_date(
    pool: &PgPool,
    migrator: &sqlx::migrate::Migrator,
) -> Result<bool, DbError> {
    // The ledger's name is the migrator's (apalis names its own); sqlx
    // keeps it in a public field it does not document, so a later sqlx
    // that moves it fails to build here rather than misread.
    let table = migrator.table_name.as_ref();
    let exists: bool = sqlx::query_scalar("select pg_catalog.to_regclass($1) is not null")
        .bind(table)
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(false);
    }
    let applied: Vec<(i64, Vec<u8>, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select version, checksum, success from {table}"
    )))
    .fetch_all(pool)
    .await?;
    let wanted: Vec<_> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    Ok(applied.len() == wanted.len()
        && wanted.iter().all(|m| {
            applied.iter().any(|(version, checksum, success)| {
                *version == m.version && *success && checksum.as_slice() == m.checksum.as_ref()
            })
        }))
}

/// A migration a role may not run says who may: the least-privilege roles
/// of deploy/roles.sql run no migrations.
fn with_hint(message: String) -> String {
    if message.contains("permission denied") || message.contains("must be owner") {
        format!(
            "{message} (this role may not change the schema: run `shepherd migrate` as the \
             database's owner, then start workers and schedulers with --skip-migrations; \
             docs/security.md)"
        )
    } else {
        message
    }
}

/// Drops and recreates the database named in `url` (the demo's own).
pub async fn recreate_database(url: &str) -> Result<(), DbError> {
    check_url(url)?;
    if Postgres::database_exists(url)
        .await
        .map_err(|e| unreachable(url, &e))?
    {
        Postgres::force_drop_database(url)
            .await
            .map_err(|e| DbError::CreateDatabase {
                name: describe_url(url),
                reason: format!("cannot drop the old one: {e}"),
            })?;
    }
    ensure_database(url).await
}
