//! Equinix Metal behind the provider seam: a unit is a hardware
//! reservation, a machine a device, the witness a tag on the device from
//! its first moment, and a creation found again by reading its
//! reservation.

use uuid::Uuid;

use super::client::{CreateDevice, CreateHint, MetalClient, WITNESS_TAG_PREFIX, Witness};
use super::error::MetalError;
use super::model::{Device, HardwareReservation};
use crate::config::Rate;
use crate::limiter::Limiter;
use crate::provider::{
    Created, Deleted, Failure, Fence, Inventory, Machine, MachineFacts, Provider, ProviderError,
    ProviderResult, Unit,
};

/// The name machines of this provider carry in the views.
pub const NAME: &str = "metal";

#[derive(Debug, Clone)]
pub struct MetalProvider {
    pub client: MetalClient,
    /// Hostnames are the prefix and the start of the reservation's id.
    device_prefix: String,
    operating_system: String,
}

impl MetalProvider {
    pub fn new(client: MetalClient, device_prefix: String, operating_system: String) -> Self {
        MetalProvider {
            client,
            device_prefix,
            operating_system,
        }
    }
}

/// A device as the seam shows it.
pub fn machine(d: &Device) -> Machine {
    Machine {
        id: d.id.to_string(),
        hostname: d.hostname.clone(),
        unit: d.reservation_id(),
        witness: d
            .tags
            .iter()
            .find_map(|t| t.strip_prefix(WITNESS_TAG_PREFIX))
            .map(str::to_string),
        condition: condition(d.state),
        created_at: d.created_at,
        status: d
            .state
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|v| v.as_str().map(str::to_string)),
        // A hardware reservation is paid for when reserved.
        billing: None,
    }
}

/// What a device's state means for its lifecycle (`provider::Condition`):
/// `inactive`, powering on or off, `deprovisioning` and a state this
/// client does not know are no failure.
pub fn condition(state: Option<crate::metal::model::DeviceState>) -> crate::provider::Condition {
    use crate::metal::model::DeviceState as S;
    use crate::provider::Condition;
    match state {
        Some(S::Active) => Condition::Ready,
        Some(S::Failed) => Condition::Failed,
        Some(S::Queued | S::Provisioning | S::Reinstalling) => Condition::Deploying,
        _ => Condition::Dormant,
    }
}

pub fn unit(r: &HardwareReservation) -> Unit {
    Unit {
        id: r.id,
        taken: r.device.is_some(),
        provisionable: r.provisionable,
        // A reservation is one machine's hardware, shared with nothing.
        scope: None,
        pool: None,
        hint: CreateHint::of(r).and_then(|h| serde_json::to_value(h).ok()),
    }
}

impl From<MetalError> for ProviderError {
    fn from(e: MetalError) -> Self {
        let failure = match &e {
            MetalError::NotFound { .. } => Failure::NotFound,
            MetalError::RaceLost { device, .. } => Failure::RaceLost {
                other: device.map(|d| d.to_string()),
            },
            MetalError::Invalid {
                status: 422,
                messages,
                ..
            } if messages
                .iter()
                .any(|m| m.to_ascii_lowercase().contains("ssh key")) =>
            {
                Failure::SshKeyRefused
            }
            _ => Failure::Other,
        };
        ProviderError {
            class: e.class(),
            failure,
            // The provider's words go into events, logs and pages: cut,
            // and without the control characters an event cannot hold.
            message: crate::text::bounded(&e.to_string(), crate::text::MAX_MESSAGE),
        }
    }
}

fn created(c: super::CreatedDevice) -> Created {
    Created {
        machine: machine(&c.device),
        recovered: c.recovered,
    }
}

impl Provider for MetalProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn machines(&self) -> ProviderResult<'_, Vec<Machine>> {
        Box::pin(async move {
            let devices = self.client.list_devices().await?;
            Ok(devices.iter().map(machine).collect())
        })
    }

    fn units(&self) -> ProviderResult<'_, Inventory> {
        Box::pin(async move {
            let reservations = self
                .client
                .list_reservations(&["facility", "device"])
                .await?;
            Ok(Inventory {
                units: reservations.iter().map(unit).collect(),
                pools: vec![],
            })
        })
    }

    fn unit_exists(&self, unit: Uuid) -> ProviderResult<'_, bool> {
        Box::pin(async move {
            match self.client.get_reservation(unit, &[]).await {
                Ok(_) => Ok(true),
                Err(MetalError::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn unit(&self, id: Uuid) -> ProviderResult<'_, Option<Unit>> {
        Box::pin(async move {
            match self.client.get_reservation(id, &["device"]).await {
                Ok(r) => Ok(Some(unit(&r))),
                Err(MetalError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn hostname(&self, unit: Uuid, _request: Uuid) -> String {
        // As the seed named them: the prefix and the reservation's id.
        let id = unit.to_string();
        format!("{}{}", self.device_prefix, &id[..18])
    }

    fn witness(&self, request: Uuid) -> String {
        Witness::new(request).tag()
    }

    /// A reservation holds one device: Metal refuses a create on a taken
    /// one (422), so a create after an unseen answer cannot make a second.
    fn one_machine_per_unit(&self) -> bool {
        true
    }

    fn create<'a>(
        &'a self,
        unit: Uuid,
        request: Uuid,
        ssh_key: &'a str,
        creations: &'a Limiter,
        fence: &'a dyn Fence,
        first: Option<&'a serde_json::Value>,
    ) -> ProviderResult<'a, Created> {
        Box::pin(async move {
            let key: Uuid = ssh_key.parse().map_err(|_| {
                ProviderError::new(
                    super::ErrorClass::Permanent,
                    format!("{ssh_key:?} is not a Metal SSH key id"),
                )
            })?;
            let req = CreateDevice {
                reservation: unit,
                hostname: self.hostname(unit, request),
                operating_system: self.operating_system.clone(),
                ssh_keys: vec![key],
                witness: Witness::new(request),
                first: first.and_then(|h| serde_json::from_value(h.clone()).ok()),
            };
            Ok(created(
                self.client
                    .create_device_paced(&req, creations, fence)
                    .await?,
            ))
        })
    }

    fn find_created(&self, unit: Uuid, request: Uuid) -> ProviderResult<'_, Option<Created>> {
        Box::pin(async move {
            let found = self
                .client
                .find_created(unit, &Witness::new(request))
                .await?;
            Ok(found.map(|device| Created {
                machine: machine(&device),
                recovered: true,
            }))
        })
    }

    fn machine(&self, id: &str) -> ProviderResult<'_, MachineFacts> {
        let id = id.to_string();
        Box::pin(async move {
            let Ok(device_id) = id.parse::<Uuid>() else {
                return Err(ProviderError {
                    class: super::ErrorClass::Permanent,
                    failure: Failure::NotFound,
                    message: format!("{id:?} is not a Metal device id (a UUID)"),
                });
            };
            let device = self.client.get_device(device_id).await?;
            let foreign = device
                .project_id()
                .filter(|p| *p != self.client.project_id())
                .map(|p| format!("the device belongs to project {p}, not to shepherd's"));
            let seen = machine(&device);
            // A body about another device, or one that names no project,
            // says nothing of this one.
            let unproven = if device.id != device_id {
                Some(format!(
                    "the provider's answer for {device_id} is about device {}",
                    device.id
                ))
            } else if device.project_id().is_none() {
                Some("the provider's answer names no project".to_string())
            } else {
                None
            };
            Ok(MachineFacts {
                unproven,
                unit: device.reservation_id(),
                hostname: device.hostname.clone(),
                witness: seen.witness,
                foreign,
                condition: seen.condition,
                status: seen.status,
            })
        })
    }

    /// The reservation becomes free again (after Metal wipes it), and a
    /// pass provisions it again if the limit has room.
    fn delete<'a>(&'a self, id: &'a str, fence: &'a dyn Fence) -> ProviderResult<'a, Deleted> {
        Box::pin(async move {
            let Ok(device) = id.parse::<Uuid>() else {
                return Err(ProviderError {
                    class: super::ErrorClass::Permanent,
                    failure: Failure::NotFound,
                    message: format!("{id:?} is not a Metal device id (a UUID)"),
                });
            };
            let not_found = self.client.delete_device_fenced(device, fence).await?;
            Ok(Deleted { not_found })
        })
    }

    fn ensure_ssh_key<'a>(
        &'a self,
        label: &'a str,
        public_key: &'a str,
    ) -> ProviderResult<'a, String> {
        Box::pin(async move {
            Ok(self
                .client
                .ensure_ssh_key(label, public_key)
                .await?
                .to_string())
        })
    }

    fn set_api_rate(&self, rate: Rate) {
        self.client.set_api_rate(rate);
    }
}
