//! A whole demo at the most verbose log level, in both log formats, with a
//! recognisable token: the token appears in no output, no event, no job
//! payload and no page the workers serve.

use std::process::Command;

const TOKEN: &str = "sekrit-TOKEN-4f1c9e2a-do-not-leak";

#[test]
fn the_token_leaks_nowhere_in_a_whole_demo_at_trace_level() {
    for provider in ["metal", "latitude"] {
        the_token_leaks_nowhere_with(provider);
    }
}

fn the_token_leaks_nowhere_with(provider: &str) {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base.rsplit_once('/').unwrap();
    let db = format!("shepherd_secrecy_{provider}_{}", std::process::id());
    let url = format!("{server}/{db}");
    for format in ["human", "json"] {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args([
                "--log-format",
                format,
                "--log",
                "trace",
                "demo",
                "--reservations",
                "12",
                "--max-machines",
                "6",
                "--workers",
                "2",
                "--provider",
                provider,
            ])
            .env("SHEPHERD_DEMO_DATABASE_URL", &url)
            .env("SHEPHERD_DEMO_TOKEN", TOKEN)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{provider}: {stderr}");
        assert!(stdout.contains("machines managed:   6"), "{stdout}");
        assert!(stderr.lines().count() > 1000, "expected trace logs");
        assert!(
            !stdout.contains(TOKEN) && !stderr.contains(TOKEN),
            "the token leaked ({provider}, {format})"
        );
        assert!(
            !stderr.contains("TOKEN-4f1c9e2a"),
            "part of the token leaked ({provider}, {format})"
        );
    }
    // Nor is it stored anywhere.
    let dump = Command::new("pg_dump").arg(&url).output().unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.contains("machine_assimilated"),
        "the dump holds the events"
    );
    assert!(!dump.contains(TOKEN), "the token is in the database");
    // Job payloads are bytea, hex in a dump: read them as text.
    let jobs = Command::new("psql")
        .arg(&url)
        .args([
            "-Atc",
            "select string_agg(convert_from(job, 'UTF8'), ' ') from apalis.jobs",
        ])
        .output()
        .unwrap();
    let jobs = String::from_utf8_lossy(&jobs.stdout);
    assert!(
        jobs.contains("reservation"),
        "job payloads were read: {jobs}"
    );
    assert!(!jobs.contains(TOKEN), "the token is in a job payload");
    let _ = Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-qc", &format!("drop database if exists {db} with (force)")])
        .output();
}
