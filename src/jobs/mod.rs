//! The three job kinds, as plain async handlers over a [`JobContext`].
//!
//! Handlers know nothing of the queue runtime: they take their arguments
//! and the job's id, do their work, commit their events, view changes and
//! follow-up jobs in one transaction, and return a named outcome. The
//! `workers` package binds them to apalis.
//!
//! Every handler is idempotent: the queue may run a job twice (a worker
//! presumed dead, a duplicate enqueue), and a retry after a crash must find
//! what the first run did rather than do it again.

pub mod assimilate;
pub mod converge;
pub mod create_device;
pub mod delete_machine;
pub mod follow_up;
pub mod gone;
pub mod lease;
pub mod manage;
pub mod moved;
pub mod pass;
pub mod place;
pub mod queue;
pub mod reconcile;
pub mod spend;
pub mod sweep;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::cluster::{self, ClusterSettings};
use crate::config::ProvisionerConfig;
use crate::events::event::SshKeyEnsured;
use crate::events::{NewEvent, StoreError, record};
use crate::limiter::Limiter;
use crate::metal::MetalClient;
use crate::metal::provider::MetalProvider;
use crate::provider::{Provider, ProviderError};

/// Queue names. Named here rather than derived from Rust type paths, which
/// a rename would orphan.
pub const RECONCILE_QUEUE: &str = "reconcile";
pub const CREATE_DEVICE_QUEUE: &str = "create_device";
pub const ASSIMILATE_QUEUE: &str = "assimilate";
pub const DELETE_MACHINE_QUEUE: &str = "delete_machine";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileArgs {
    /// Who asked: `scheduler`, `cli:<user>`, `sql:<role>`.
    #[serde(default)]
    pub requested_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateDeviceArgs {
    pub reservation: Uuid,
    /// Stable across attempts: the witness tag is derived from it.
    pub request: Uuid,
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// Whether the capacity check was already passed (a pass or the CLI
    /// admits when enqueuing; a job pushed from SQL is admitted by its
    /// handler).
    #[serde(default)]
    pub admitted: bool,
    /// `cli:<user>`, `sql:<role>`; absent for a pass's creations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// An operator's reason to admit a penalised reservation anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinbin_override: Option<String>,
    /// An earlier attempt's outcome was unknown: a device of ours may exist,
    /// so this creation ends only after looking.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    /// When the create whose answer was not seen may have been sent: the
    /// settle window runs from here. Absent with `unknown` (a sweep's
    /// resumption): the window starts when the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only look for the device (no POST): the creation's outcome is
    /// unknown and its attempts are spent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
    /// Creates sent by the earlier attempts. The budget of attempts counts
    /// these, not the looks an unknown creation makes while its settle
    /// window runs. Absent in arguments written before it existed: every
    /// earlier attempt counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates: Option<u32>,
    /// What the pass's listing said a create on the unit needs
    /// (`Unit::hint`): the first create is sent without reading the unit
    /// again. Later attempts read it first, as they must.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<serde_json::Value>,
}

impl CreateDeviceArgs {
    /// The first attempt of a creation a pass (or the CLI) admitted.
    pub fn admitted(reservation: Uuid, request: Uuid) -> Self {
        CreateDeviceArgs {
            reservation,
            request,
            attempt: 1,
            admitted: true,
            requested_by: None,
            sinbin_override: None,
            unknown: false,
            unknown_since: None,
            verify: false,
            creates: Some(0),
            hint: None,
        }
    }

    /// Creates the earlier attempts sent (for old arguments, every earlier
    /// attempt).
    pub fn creates_before(&self) -> u32 {
        self.creates
            .unwrap_or_else(|| self.attempt.saturating_sub(1))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssimilateArgs {
    /// The machine by its provider's id.
    pub device: String,
    #[serde(default)]
    pub reservation: Option<Uuid>,
    #[serde(default)]
    pub manual: bool,
    /// Set when the provider has just returned this device to our own
    /// create: its existence and project are known, so no call is needed.
    #[serde(default)]
    pub created: Option<CreatedDeviceFacts>,
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

/// One attempt at deleting a managed machine whose deletion was requested
/// (`deletion_requested` names the request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteMachineArgs {
    pub machine_id: Uuid,
    /// The machine by its provider's id.
    pub device: String,
    /// The deletion's id: only its own outcome ends it.
    pub request: Uuid,
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// An earlier attempt's answer was not seen: the machine may be gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    /// Of the attempts before this one, those that only waited (for the
    /// leave hook, a pause): they name a job but are no try at the delete,
    /// so they use up none of its retries.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waits: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl DeleteMachineArgs {
    pub fn first(machine_id: Uuid, device: String, request: Uuid) -> Self {
        DeleteMachineArgs {
            machine_id,
            device,
            request,
            attempt: 1,
            unknown: false,
            waits: 0,
        }
    }

    /// The tries at the delete this attempt makes part of: its number less
    /// the attempts that only waited.
    pub fn tries(&self) -> u32 {
        self.attempt.saturating_sub(self.waits)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedDeviceFacts {
    pub hostname: String,
}

fn first_attempt() -> u32 {
    1
}

/// What a handler could not do because the infrastructure failed (the
/// database went away). The runtime backs off and lets the queue retry;
/// everything else a handler meets is an outcome, recorded as an event.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the job's arguments do not decode: {0}")]
    BadArgs(String),
}

/// What every handler needs.
pub struct JobContext {
    pub pool: PgPool,
    /// The provider every job speaks to, through the seam.
    pub provider: Arc<dyn Provider>,
    pub config: Arc<ProvisionerConfig>,
    pub creation_limiter: Limiter,
    pub public_key: String,
    ssh_key: Mutex<Option<String>>,
}

impl JobContext {
    /// How long a lease of this process's lives unrenewed: the cluster's
    /// rescue window, after which a silent worker's jobs go to others.
    pub fn lease_term(&self) -> std::time::Duration {
        self.config.rescue.window()
    }

    /// The context of one process's jobs. The creation limiter is the
    /// cluster's (one row in Postgres); it adopts the cluster's rate at the
    /// start of every job.
    pub fn new(
        pool: PgPool,
        metal: MetalClient,
        config: Arc<ProvisionerConfig>,
        public_key: String,
    ) -> Self {
        let provider = MetalProvider::new(metal, config.device_prefix.clone(), config.os.clone());
        Self::with_provider(pool, Arc::new(provider), config, public_key)
    }

    /// The context of one process's jobs against any provider.
    pub fn with_provider(
        pool: PgPool,
        provider: Arc<dyn Provider>,
        config: Arc<ProvisionerConfig>,
        public_key: String,
    ) -> Self {
        let creation_limiter = Limiter::new(
            pool.clone(),
            crate::limiter::DEVICE_CREATION,
            config.device_creation_rate,
        );
        JobContext {
            pool,
            provider,
            config,
            creation_limiter,
            public_key,
            ssh_key: Mutex::new(None),
        }
    }

    /// The cluster's settings now, adopted by this process's limiters. Read
    /// at the start of every job, so a change reaches every worker.
    pub async fn settings(&self) -> Result<ClusterSettings, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let stored = cluster::stored(&mut conn).await?;
        let pools = crate::pools::read(&mut conn).await?;
        self.adopt_pools(&pools);
        self.adopt(&stored)
    }

    /// The cluster's pools now, adopted by this process's provider. Read
    /// at the start of every job that maps machines to units.
    pub async fn pools(&self) -> Result<(), sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let pools = crate::pools::read(&mut conn).await?;
        self.adopt_pools(&pools);
        Ok(())
    }

    /// Adopts pools read as part of a job's own first query.
    pub fn adopt_pools(&self, pools: &[crate::pools::PoolRow]) {
        let declared: Vec<_> = pools.iter().map(crate::pools::PoolRow::declared).collect();
        self.provider.set_pools(&declared);
    }

    /// Adopts settings read as part of a job's own first query.
    pub fn adopt(
        &self,
        stored: &std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<ClusterSettings, sqlx::Error> {
        let fallback = ClusterSettings::proposed_by(&self.config);
        let settings =
            ClusterSettings::from_map(stored, &fallback).map_err(sqlx::Error::Protocol)?;
        self.creation_limiter
            .set_rate(settings.device_creation_rate);
        self.provider.set_api_rate(settings.api_rate);
        Ok(settings)
    }

    /// The managed SSH key's id, ensured once per process (the seed listed
    /// keys before every creation: one call per machine we save).
    pub async fn ssh_key_id(&self) -> Result<String, ProviderError> {
        let mut cached = self.ssh_key.lock().await;
        if let Some(id) = &*cached {
            return Ok(id.clone());
        }
        let id = self.ensure_and_record().await?;
        *cached = Some(id.clone());
        Ok(id)
    }

    /// Ensures the key at the provider, whether cached or not. Called at
    /// worker start, as the seed's SSHEquinixEnsure was.
    pub async fn ensure_ssh_key(&self) -> Result<String, ProviderError> {
        let mut cached = self.ssh_key.lock().await;
        let id = self.ensure_and_record().await?;
        *cached = Some(id.clone());
        Ok(id)
    }

    async fn ensure_and_record(&self) -> Result<String, ProviderError> {
        let id = self
            .provider
            .ensure_ssh_key(&self.config.ssh_key_label, &self.public_key)
            .await?;
        let event = SshKeyEnsured {
            label: self.config.ssh_key_label.clone(),
            key_id: id.clone(),
        };
        let recorded = async {
            let mut tx = self.pool.begin().await?;
            record(&mut tx, vec![NewEvent::new(event)]).await?;
            tx.commit().await?;
            Ok::<_, StoreError>(())
        };
        if let Err(e) = recorded.await {
            tracing::warn!(error = %e, "the SSH key is ensured but its event was not recorded");
        }
        Ok(id)
    }

    /// Forgets the cached key, e.g. after the provider refused it.
    pub async fn forget_ssh_key(&self) {
        *self.ssh_key.lock().await = None;
    }
}
