//! Log set-up: human-readable by default, JSON for log pipelines.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format
    #[arg(
        long,
        global = true,
        env = "SHEPHERD_LOG_FORMAT",
        default_value = "human"
    )]
    pub log_format: LogFormat,

    /// Log filter, e.g. `debug` or `shepherd=debug,info` [default: info;
    /// warn for the demo, whose progress is on stdout]
    #[arg(long, global = true, env = "SHEPHERD_LOG")]
    pub log: Option<String>,
}

pub fn init(args: &LoggingArgs, default: &str) -> Result<(), String> {
    let wanted = args.log.as_deref().unwrap_or(default);
    let filter = EnvFilter::try_new(wanted)
        .map_err(|e| format!("--log {wanted:?} is not a valid log filter: {e}"))?;
    // Colour only for a person at a terminal: a log file or a pipe gets
    // plain text, and NO_COLOR (no-color.org) turns it off everywhere.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Human => builder.fmt_fields(escaped_fields()).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}

/// Human-readable fields with every control character of a value written
/// as an escape: a name, a reason or a provider's error text that holds a
/// newline cannot start a log line of its own, and an ESC cannot drive the
/// reader's terminal. (JSON escapes them by itself.)
pub fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let raw = format!("{value:?}");
        let text = escape_controls(&raw);
        if field.name() == "message" {
            write!(writer, "{text}")
        } else {
            write!(writer, "{}={text}", field.name())
        }
    })
    .delimited(" ")
}

/// `text` with control characters and the marks that reorder text on
/// screen (bidirectional overrides) written as `\u{..}` escapes.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let hostile = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{061c}'
                    | '\u{200b}'..='\u{200f}'
                    | '\u{2028}'..='\u{202e}'
                    | '\u{2066}'..='\u{2069}'
                    | '\u{feff}'
            )
    };
    if !text.chars().any(hostile) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if hostile(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// What an outsider wrote stays on its own line and cannot colour or
    /// move the terminal, whichever way it is logged.
    #[test]
    fn a_value_cannot_forge_a_line_or_drive_a_terminal() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .fmt_fields(escaped_fields())
            .with_writer(move || writer.clone())
            .finish();
        let hostile = "mallory\n2026-12-05T00:00:00Z  INFO console log-in who=alice\x1b[2J\u{202e}";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(who = %hostile, "refused");
            tracing::warn!(who = hostile, "refused");
            tracing::warn!("refused {hostile}");
        });
        let out = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(!out.contains('\x1b'), "{out:?}");
        assert!(!out.contains('\u{202e}'), "{out:?}");
        assert!(out.contains("mallory\\n2026"), "{out}");
        assert!(out.contains("\\u{1b}[2J"), "{out}");
    }

    #[test]
    fn plain_text_is_left_alone() {
        assert!(matches!(
            escape_controls("alice: console:bob é"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
