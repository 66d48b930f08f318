//! The README's "Try Latitude.sh in five minutes", walked as a newcomer
//! would: the fake Latitude.sh as its own process, `shepherd migrate`, a
//! worker with the README's flags, and then the commands an operator types
//! with the README's exported environment only (no `--provider`, no
//! Metal flags): `status`, `machines`, `plan`, `pools set|list`, `history
//! device sv_…`, `enqueue`, `machines release`, `events`. Each must
//! succeed (or refuse, where the README's path would be wrong) and say
//! what the docs say it says.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::PgPool;

mod common;
use common::{database_url, free_port};
#[allow(dead_code)]
#[path = "web/browser.rs"]
mod browser;

const KEY: &str = "try-key";
const PROJECT: &str = "proj_fake0000000001";

struct Walk {
    db: String,
    api: String,
    dir: std::path::PathBuf,
    /// What the README has the newcomer export, beside `DATABASE_URL`.
    env: Vec<(&'static str, String)>,
    children: Vec<Child>,
}

impl Drop for Walk {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Walk {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shepherd"));
        c.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.dir)
            .env("USER", "newcomer")
            .env("DATABASE_URL", &self.db)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null());
        c
    }

    fn spawn(&mut self, name: &str, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = self
            .command(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs a command that must succeed; its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(
            out.status.success(),
            "shepherd {args:?} failed ({}): {stdout}{stderr}",
            out.status
        );
        stdout
    }

    /// The managed machines' provider ids, from `shepherd machines --json`.
    fn machines(&self) -> Vec<String> {
        self.machine_rows()
            .iter()
            .map(|m| m["provider_id"].as_str().unwrap().to_string())
            .collect()
    }

    fn machine_rows(&self) -> Vec<serde_json::Value> {
        let out = self.ok(&["machines", "--json"]);
        serde_json::from_str(&out).unwrap()
    }

    /// Polls `machines` until `n` are managed and the pool's survey agrees.
    async fn wait_for(&self, n: usize, what: &str) -> Vec<String> {
        let started = Instant::now();
        loop {
            let ids = self.machines();
            let status = self.ok(&["status"]);
            if ids.len() == n && !status.to_lowercase().contains("leaving (") {
                return ids;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what}: {} machines; logs in {}\n{status}",
                ids.len(),
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

async fn wait_for_port(port: u16) {
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the fake did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn the_readmes_latitude_path_works_as_written(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("shepherd-walk-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let mut w = Walk {
        db: database_url(&pool).await,
        api: api.clone(),
        dir: dir.clone(),
        env: vec![
            ("LATITUDE_API_KEY", KEY.into()),
            ("LATITUDE_API_URL", api),
            ("LATITUDE_PROJECT", PROJECT.into()),
        ],
        children: vec![],
    };
    let listen = format!("127.0.0.1:{port}");
    w.spawn(
        "fake",
        &[
            "fake-latitude",
            "--listen",
            &listen,
            "--stock",
            "c2-small-x86@DAL=20",
            "--deploy-delay",
            "1s",
        ],
    );
    wait_for_port(port).await;
    let key = dir.join("shepherd-try");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(&key)
        .status()
        .expect("ssh-keygen, which the README uses, is missing");
    assert!(made.success());
    // A fresh database: migrate says what it applied (issue 32: it said
    // "up to date" of a database it had just made).
    let migrated = w.ok(&["migrate"]);
    assert!(migrated.contains("applied"), "{migrated}");
    let public = format!("{}.pub", key.display());
    let metrics = format!("127.0.0.1:{}", free_port());
    w.spawn(
        "worker",
        &[
            "worker",
            "--scheduler",
            "--provider",
            "latitude",
            "--reconcile-rate",
            "2s,1",
            "--max-machines",
            "10",
            "--pool",
            "name=web,plan=c2-small-x86,site=DAL,count=4,os=ubuntu_24_04_x64_lts",
            "--ssh-public-key-file",
            &public,
            "--metrics-listen",
            &metrics,
        ],
    );
    let ids = w.wait_for(4, "web filled").await;
    assert!(ids.iter().all(|id| id.starts_with("sv_")), "{ids:?}");
    // The worker kept each run of its jobs: each creation that made a
    // server ended one run, on this worker, in its own words.
    let created: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "select r.worker, r.result from shepherd.job_runs r
         where r.kind = 'create_device' and r.outcome = 'ok' and r.result like 'Created %'",
    )
    .fetch_all(&pool)
    .await
    .expect("reading the job runs");
    assert_eq!(created.len(), 4, "{created:?}");
    assert!(
        created
            .iter()
            .all(|(worker, _)| worker.as_deref().is_some_and(|w| !w.is_empty())),
        "{created:?}"
    );
    // The page shows each server's status as the last pass listed it, and
    // links Latitude's ids to their history.
    let page_url = format!("http://{metrics}/machines");
    let started = std::time::Instant::now();
    loop {
        let page = reqwest::get(&page_url).await.unwrap().text().await.unwrap();
        assert!(
            page.contains(&format!("href=\"/device/{}\"", ids[0])),
            "{page}"
        );
        if page.matches("data-label=\"Status\">on <span").count() == 4 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no status beside the servers: {page}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The same page in a browser, in Latitude.sh's words: servers in
    // places, each place by its name.
    let browser = browser::Browser::start().await;
    browser.goto(&page_url).await;
    let head = browser.text("table thead").await;
    assert!(
        head.contains("Server") && head.contains("Place") && !head.contains("Reservation"),
        "{head}"
    );
    let places = browser
        .script("return Array.from(document.querySelectorAll(\"a[href^='/reservation/']\")).map(a => a.textContent).sort();")
        .await;
    assert_eq!(
        places,
        serde_json::json!(["web/0", "web/1", "web/2", "web/3"]),
        "places by name"
    );
    browser.screenshot("machines-latitude").await;
    browser
        .click_to_leave(&format!("a[href='/device/{}']", ids[0]))
        .await;
    let history = browser.text("body").await;
    assert!(history.contains("device_created"), "{history}");
    browser.quit().await;
    let status = w.ok(&["status"]);
    assert!(status.contains("web"), "{status}");
    // The pass read the cluster's servers only, and says so.
    assert!(
        status.contains("listed: servers whose hostname starts with shepherd-"),
        "{status}"
    );
    // Creations run at the key's write budget, not the seed's one in 5 s.
    let settings = w.ok(&["settings", "show"]);
    assert!(
        settings
            .lines()
            .any(|l| l.contains("device_creation_rate") && l.contains("3s,20")),
        "{settings}"
    );
    // plan works on the cluster's provider without being told.
    let plan = w.ok(&["plan"]);
    assert!(plan.contains("web"), "{plan}");
    assert!(
        plan.contains("listed: servers whose hostname starts with shepherd-: 4 in 1 read"),
        "{plan}"
    );
    assert!(
        !plan.to_lowercase().contains("reservation"),
        "Metal's words: {plan}"
    );
    let history = w.ok(&["history", "device", &ids[0]]);
    assert!(history.contains("device_created"), "{history}");
    // Shrink: two go (nearest their next billed hour first).
    let changed = w.ok(&[
        "pools",
        "set",
        "web",
        "count=2",
        "--reason",
        "a quieter week",
    ]);
    assert!(changed.contains("web"), "{changed}");
    let left = w.wait_for(2, "web shrunk").await;
    let list = w.ok(&["pools", "list"]);
    assert!(list.contains("web"), "{list}");
    let gone = ids.iter().find(|id| !left.contains(id)).unwrap();
    let history = w.ok(&["history", "device", gone]);
    assert!(
        history.contains("device_created") && history.contains("machine_deleted"),
        "a deleted server's history from creation to deletion: {history}"
    );
    // Manual jobs take the provider's ids and places. Which places the
    // shrink kept follows the shedding order (docs/pools.md), not their
    // numbers: the one asked for is a kept server's.
    w.ok(&["enqueue", "reconcile"]);
    let held: String = sqlx::query_scalar(
        "select 'web/' || (regexp_match(hostname, '^shepherd-web-([0-9]+)-'))[1]
         from shepherd.managed_machines where provider_id = $1",
    )
    .bind(&left[0])
    .fetch_one(&pool)
    .await
    .expect("the place of a kept server");
    let refused = w.run(&["enqueue", "create-device", "--unit", &held]);
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success() && said.contains("already has a machine"),
        "a place that holds a server was admitted: {said}"
    );
    // release refuses a server the provider still has...
    let kept = &left[0];
    let refused = w.run(&["machines", "release", kept, "--reason", "gone?"]);
    assert!(!refused.status.success(), "a live server was released");
    // ...and records one it no longer has.
    let client = reqwest::Client::new();
    let reclaimed = client
        .delete(format!("{}/_fake/servers/{kept}", w.api))
        .send()
        .await
        .unwrap();
    assert!(reclaimed.status().is_success(), "{}", reclaimed.status());
    let released = w.ok(&[
        "machines",
        "release",
        kept,
        "--reason",
        "deleted in the console",
    ]);
    assert!(released.contains(kept.as_str()), "{released}");
    assert!(
        released.contains("a pass is queued to look again"),
        "{released}"
    );
    let events = w.ok(&["events", "--last", "200"]);
    for kind in [
        "pool_changed",
        "deletion_requested",
        "machine_deleted",
        "machine_released",
    ] {
        assert!(events.contains(kind), "no {kind} in: {events}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's Metal path, against the fake Metal as its own process: the
/// exported connection, `migrate`, a worker with the defaults' provider,
/// and the same operator commands, in Metal's words.
#[sqlx::test(migrations = false)]
async fn the_readmes_metal_path_works_as_written(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("shepherd-walk-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}/metal/v1");
    let project = "0d9f6c3a-5b1e-4c7d-8a2f-3e4b5c6d7e8f";
    let token = "walk-metal-token";
    let mut w = Walk {
        db: database_url(&pool).await,
        api: api.clone(),
        dir: dir.clone(),
        env: vec![
            ("METAL_API_URL", api),
            ("METAL_PROJECT_ID", project.into()),
            ("METAL_AUTH_TOKEN", token.into()),
        ],
        children: vec![],
    };
    let listen = format!("127.0.0.1:{port}");
    w.spawn(
        "fake",
        &[
            "fake-metal",
            "--listen",
            &listen,
            "--reservations",
            "6",
            "--provisioning-delay",
            "200ms",
            "--active-delay",
            "500ms",
        ],
    );
    wait_for_port(port).await;
    let key = dir.join("shepherd-try");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(&key)
        .status()
        .expect("ssh-keygen, which the README uses, is missing");
    assert!(made.success());
    w.ok(&["migrate"]);
    let public = format!("{}.pub", key.display());
    let metrics = format!("127.0.0.1:{}", free_port());
    w.spawn(
        "worker",
        &[
            "worker",
            "--scheduler",
            "--reconcile-rate",
            "2s,1",
            "--max-machines",
            "3",
            "--ssh-public-key-file",
            &public,
            "--metrics-listen",
            &metrics,
        ],
    );
    let ids = w.wait_for(3, "three machines").await;
    let rows = w.machine_rows();
    assert!(rows.iter().all(|m| m["provider"] == "metal"), "{rows:?}");
    let status = w.ok(&["status"]);
    assert!(status.contains('3'), "{status}");
    let plan = w.ok(&["plan"]);
    assert!(plan.to_lowercase().contains("reservation"), "{plan}");
    let history = w.ok(&["history", "device", &ids[0]]);
    assert!(history.contains("device_created"), "{history}");
    let unit = rows[0]["reservation_id"].as_str().unwrap().to_string();
    let history = w.ok(&["history", "reservation", &unit]);
    assert!(history.contains("creation_requested"), "{history}");
    let refused = w.run(&["enqueue", "create-device", "--reservation", &unit]);
    assert!(
        !refused.status.success(),
        "a reservation with a device was admitted"
    );
    // A device deleted in the provider's console: release records it.
    let kept = &ids[1];
    let refused = w.run(&["machines", "release", kept, "--reason", "gone?"]);
    assert!(!refused.status.success(), "a live device was released");
    let deleted = reqwest::Client::new()
        .delete(format!("{}/devices/{kept}", w.api))
        .header("X-Auth-Token", token)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let released = w.ok(&[
        "machines",
        "release",
        kept,
        "--reason",
        "deleted in the console",
    ]);
    assert!(released.contains(kept.as_str()), "{released}");
    let events = w.ok(&["events", "--last", "200"]);
    assert!(events.contains("machine_released"), "{events}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a newcomer meets first when the database is not ready: a database
/// never migrated says to run `shepherd migrate`, whatever the command; a
/// role the server refuses is not called unreachable; a port nothing
/// listens on is.
#[sqlx::test(migrations = false)]
async fn a_database_not_ready_says_what_to_do(pool: PgPool) {
    let url = database_url(&pool).await;
    let run = |url: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(args)
            .env("DATABASE_URL", url)
            .env("SHEPHERD_LOG", "warn")
            .env_remove("SHEPHERD_PROVIDER")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["status"][..],
        &["events"],
        &["settings", "show"],
        &["views", "rebuild"],
        &["machines"],
        &["sinbin"],
        &["history", "device", "sv_x"],
        &["pools", "list"],
    ] {
        let (code, err) = run(&url, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("run `shepherd migrate`"), "{args:?}: {err}");
    }
    let (host, name) = url.rsplit_once('/').unwrap();
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let stranger = format!("postgres://no_such_role_7f@{host}/{name}");
    let (code, err) = run(&stranger, &["status"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the connection"), "{err}");
    assert!(
        !err.contains("Start one"),
        "a refusal called unreachable: {err}"
    );
    let nobody = format!("postgres://postgres@127.0.0.1:{}/{name}", free_port());
    let (code, err) = run(&nobody, &["status"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach Postgres"), "{err}");
}

/// The lines of the `sh` block that follows `marker` in a doc.
fn walked_block(doc: &str, marker: &str) -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
    let text = std::fs::read_to_string(format!("{path}{doc}")).unwrap();
    let after = &text[text
        .find(marker)
        .unwrap_or_else(|| panic!("{doc} has no {marker}"))..];
    let body = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("{doc}: no sh block after {marker}"))
        .0;
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// docs/security.md's least-privilege Latitude.sh recipe, each line run as
/// written by `sh` from the repository's root, with the four roles'
/// connection strings and the Latitude variables exported: the owner
/// migrates and grants, a worker and a scheduler run as `shepherd_worker`
/// (the worker declaring the new cluster's pool), the operator lowers the
/// pool, the reader watches. Lines ending in `&` keep running; before the
/// first command after them the walk waits for the pool to fill. Each
/// event is then recorded under the role that did it.
#[sqlx::test(migrations = false)]
async fn the_least_privilege_latitude_recipe_works_as_written(pool: PgPool) {
    let recipe = walked_block("security.md", "<!-- walked: least-privilege latitude -->");
    assert!(recipe.len() >= 5, "{recipe:?}");
    let dir = std::env::temp_dir().join(format!("shepherd-recipe-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join(".ssh")).unwrap();
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(dir.join(".ssh/id_ed25519"))
        .status()
        .expect("ssh-keygen is missing");
    assert!(made.success());
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let owner = database_url(&pool).await;
    let as_role = |role: &str| {
        let url = owner.replacen("://postgres@", &format!("://{role}@"), 1);
        assert_ne!(url, owner, "the test database URL names the postgres user");
        url
    };
    let mut w = Walk {
        db: owner.clone(),
        api: api.clone(),
        dir: dir.clone(),
        env: vec![
            ("LATITUDE_API_KEY", KEY.into()),
            ("LATITUDE_API_URL", api),
            ("LATITUDE_PROJECT", PROJECT.into()),
            ("OWNER_URL", owner.clone()),
            ("WORKER_URL", as_role("shepherd_worker")),
            ("OPERATOR_URL", as_role("shepherd_operator")),
            ("READER_URL", as_role("shepherd_reader")),
        ],
        children: vec![],
    };
    let listen = format!("127.0.0.1:{port}");
    w.spawn(
        "fake",
        &[
            "fake-latitude",
            "--listen",
            &listen,
            "--stock",
            "c2-small-x86@DAL=20",
            "--deploy-delay",
            "1s",
        ],
    );
    wait_for_port(port).await;
    // `shepherd` on the path, as an installed one would be.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_shepherd"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let sh = |line: &str| {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(line)
            .current_dir(root)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", &dir)
            .env("USER", "operator")
            .envs(w.env.iter().map(|(k, v)| (*k, v.as_str())))
            // The walk's impatience, not the recipe's: a pass every 2 s,
            // and each process its own status port.
            .env("SHEPHERD_RECONCILE_RATE", "2s,1")
            .env(
                "SHEPHERD_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .stdin(Stdio::null());
        c
    };
    let mut started = false;
    let mut said = vec![];
    for (n, line) in recipe.iter().enumerate() {
        if let Some(background) = line.strip_suffix('&') {
            let log = std::fs::File::create(dir.join(format!("line-{n}.log"))).unwrap();
            let child = sh(&format!("exec env {}", background.trim()))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            w.children.push(child);
            started = true;
            continue;
        }
        if started {
            w.wait_for(3, "the pool filled by the worker's role").await;
            started = false;
        }
        let out = sh(line).output().unwrap();
        assert!(
            out.status.success(),
            "{line}: {}{}; logs in {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            dir.display()
        );
        said.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    w.wait_for(2, "the pool lowered by the operator's role")
        .await;
    assert!(
        said.iter().any(|s| s.contains("web")),
        "the reader saw no pool: {said:?}"
    );
    // Who did what, as the log's trigger recorded each session's role.
    let roles: Vec<(String, String)> = sqlx::query_as(
        "select distinct event_type, role from shepherd.events
         where event_type in ('pool_declared', 'pool_changed', 'device_created', 'machine_deleted')
         order by 1, 2",
    )
    .fetch_all(&pool)
    .await
    .expect("reading the events' roles");
    assert_eq!(
        roles,
        [
            ("device_created", "shepherd_worker"),
            ("machine_deleted", "shepherd_worker"),
            ("pool_changed", "shepherd_operator"),
            ("pool_declared", "shepherd_worker"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "logs in {}",
        dir.display()
    );
    // The worker's role recorded its process for the console.
    let processes: i64 = sqlx::query_scalar("select count(*) from shepherd.processes")
        .fetch_one(&pool)
        .await
        .expect("reading the processes");
    assert_eq!(processes, 1);
    let _ = std::fs::remove_dir_all(&dir);
}
