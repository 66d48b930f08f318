//! The `--database-url` every database-facing subcommand shares, and
//! `shepherd migrate`.

use clap::Args;
use sqlx::PgPool;

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Postgres URL (`shepherd migrate`, `shepherd worker` and `shepherd
    /// scheduler` create the database if it does not exist; other commands
    /// expect it)
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/shepherd",
        hide_env_values = true
    )]
    pub database_url: String,
    /// How long a database connection nobody uses stays open
    #[arg(long, env = "SHEPHERD_DB_IDLE_TIMEOUT", default_value = "30s",
          value_parser = shepherd::config::parse_duration)]
    pub db_idle_timeout: std::time::Duration,
}

impl DatabaseArgs {
    /// Connects without creating or migrating anything.
    pub async fn connect(&self, max_connections: u32) -> anyhow::Result<PgPool> {
        Ok(
            shepherd::db::connect_idle(&self.database_url, max_connections, self.db_idle_timeout)
                .await?,
        )
    }

    /// [`DatabaseArgs::connect`] or [`DatabaseArgs::prepare`] for a
    /// long-running process, through [`waiting_for_room`].
    pub async fn connect_waiting(
        &self,
        max_connections: u32,
        migrate: bool,
    ) -> anyhow::Result<PgPool> {
        waiting_for_room(|| async {
            if migrate {
                self.prepare(max_connections).await
            } else {
                self.connect(max_connections).await
            }
        })
        .await
    }

    /// Creates the database when missing, connects, and migrates.
    pub async fn prepare(&self, max_connections: u32) -> anyhow::Result<PgPool> {
        shepherd::db::ensure_database(&self.database_url).await?;
        let pool = self.connect(max_connections).await?;
        shepherd::db::migrate(&pool).await?;
        Ok(pool)
    }
}

/// Runs `open` until it does not fail for want of a connection: while the
/// server has no connection left for this process, a long-running process
/// says so once and tries again every 5 s instead of exiting (a supervisor
/// restarting it would only add to the crowd). Any other error ends it.
pub async fn waiting_for_room<T, F, Fut>(mut open: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut said = false;
    loop {
        match open().await {
            Err(e) if matches!(e.downcast_ref(), Some(shepherd::db::DbError::Full { .. })) => {
                if !said {
                    tracing::warn!("{e}; waiting for a connection, trying again every 5 s");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
            Ok(done) => {
                if said {
                    tracing::info!("Postgres has a connection for this process again");
                }
                return Ok(done);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A database error as an operator needs it: a schema that is not there is
/// a database never migrated, and says what to run.
pub fn explain(e: sqlx::Error) -> anyhow::Error {
    if let Some(d) = e.as_database_error()
        && d.code().as_deref() == Some("42P01")
    {
        return anyhow::anyhow!(
            "{}: the database has no shepherd schema (or an older one); run `shepherd migrate` first",
            d.message()
        );
    }
    if let Some(d) = e.as_database_error() {
        return anyhow::anyhow!("{}", d.message());
    }
    anyhow::Error::from(e)
}

pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    shepherd::db::ensure_database(&args.database_url).await?;
    let pool = args.connect(2).await?;
    // The ledger's rows, none before the first migration made it.
    let count = |pool: PgPool| async move {
        let exists: bool =
            sqlx::query_scalar("select to_regclass('shepherd._sqlx_migrations') is not null")
                .fetch_one(&pool)
                .await?;
        if !exists {
            return Ok::<i64, sqlx::Error>(0);
        }
        sqlx::query_scalar("select count(*) from shepherd._sqlx_migrations")
            .fetch_one(&pool)
            .await
    };
    let before = count(pool.clone()).await?;
    shepherd::db::migrate(&pool).await?;
    let after = count(pool.clone()).await?;
    let target = shepherd::db::describe_url(&args.database_url);
    if after > before {
        println!(
            "database {target}: applied {} shepherd migration{} ({after} in all)",
            after - before,
            if after - before == 1 { "" } else { "s" }
        );
    } else {
        println!("database {target} is up to date ({after} shepherd migrations applied)");
    }
    Ok(())
}
