//! `shepherd console`: the console's sessions, seen and ended from the
//! command line, for the morning after a laptop is lost or a credential
//! leaks.

use clap::Subcommand;

use super::database::DatabaseArgs;
use crate::table::Table;

#[derive(Debug, Subcommand)]
pub enum ConsoleCommand {
    /// The live console sessions: who, since when, until when
    Sessions {
        #[command(flatten)]
        db: DatabaseArgs,
    },
    /// End every live console session on every worker at once: everyone
    /// logs in again (rotating the credential does this too)
    LogoutAll {
        #[command(flatten)]
        db: DatabaseArgs,
    },
}

pub async fn console(command: ConsoleCommand) -> anyhow::Result<()> {
    match command {
        ConsoleCommand::Sessions { db } => {
            let pool = db.connect(1).await?;
            let rows: Vec<(
                String,
                chrono::DateTime<chrono::Utc>,
                chrono::DateTime<chrono::Utc>,
            )> = sqlx::query_as(
                "select who, created_at, expires_at from shepherd.console_sessions
                     where ended_at is null and now() < expires_at
                     order by created_at",
            )
            .fetch_all(&pool)
            .await?;
            if rows.is_empty() {
                println!("no live console sessions");
                return Ok(());
            }
            let mut t = Table::new(&["WHO", "SINCE", "UNTIL"]);
            for (who, since, until) in rows {
                t.row(vec![
                    who,
                    since.format("%Y-%m-%d %H:%M:%S").to_string(),
                    until.format("%Y-%m-%d %H:%M:%S").to_string(),
                ]);
            }
            print!("{}", t.render());
        }
        ConsoleCommand::LogoutAll { db } => {
            let pool = db.connect(1).await?;
            let ended = sqlx::query(
                "update shepherd.console_sessions set ended_at = now()
                 where ended_at is null and now() < expires_at",
            )
            .execute(&pool)
            .await?
            .rows_affected();
            tracing::info!(ended, "every console session ended");
            println!(
                "ended {ended} console session{}: every operator logs in again",
                if ended == 1 { "" } else { "s" }
            );
        }
    }
    Ok(())
}
