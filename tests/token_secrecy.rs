//! The API token never reaches a log line, an error message or a Debug dump,
//! whatever the log level and whatever goes wrong.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use shepherd::metal::{CreateDevice, Operation, Witness};
use shepherd_fakes::metal::FaultKind;
use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

// One thread, so the subscriber set for this test also sees the log lines of
// the HTTP stack's connection tasks.
#[tokio::test(flavor = "current_thread")]
async fn the_token_is_in_no_log_line_and_no_error() {
    let capture = Capture::default();
    for json in [false, true] {
        let builder = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(capture.clone());
        let _guard = if json {
            tracing::subscriber::set_default(builder.json().finish())
        } else {
            tracing::subscriber::set_default(builder.finish())
        };

        let config = fake_config(3);
        let project = config.project_id;
        let fake = start_fake(config).await;
        let client = client_for(&fake, project);
        let mut errors = vec![
            format!("{client:?}"),
            format!("{:?}", client_config(&fake, project)),
        ];

        let key = client
            .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
            .await
            .unwrap();
        let r = client.list_reservations(&["device"]).await.unwrap()[0].id;
        fake.set_faults(next(
            Operation::CreateDevice,
            1,
            FaultKind::AcceptThenFail { status: 500 },
        ));
        let request = CreateDevice {
            reservation: r,
            hostname: "shepherd-x".into(),
            operating_system: "ubuntu_20_04".into(),
            ssh_keys: vec![key],
            witness: Witness::new("w"),
            first: None,
        };
        client.create_device(&request).await.unwrap();
        for kind in [
            FaultKind::Status { status: 503 },
            FaultKind::Status { status: 422 },
            FaultKind::RateLimited {
                retry_after_secs: 0,
            },
            FaultKind::Garbage {
                body: "{".into(),
                status: 200,
            },
        ] {
            fake.set_faults(next(Operation::FindDeviceById, 1, kind));
            if let Err(e) = client.get_device(uuid::Uuid::new_v4()).await {
                errors.push(e.to_string());
                errors.push(format!("{e:?}"));
            }
        }
        let other = CreateDevice {
            witness: Witness::new("other"),
            first: None,
            ..request.clone()
        };
        errors.push(format!(
            "{:?}",
            client.create_device(&other).await.unwrap_err()
        ));

        for e in &errors {
            assert!(!e.contains(TOKEN), "the token leaked into {e}");
        }
    }
    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.lines().count() > 20,
        "expected verbose logs, got:\n{logs}"
    );
    assert!(logs.contains("retrying"));
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
    // The token's distinctive middle, in case something cut or escaped it.
    assert!(!logs.contains("TEST-SECRET"));
}
