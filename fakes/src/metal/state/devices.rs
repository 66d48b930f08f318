//! The fake's rules for devices: what a create checks and refuses, how a
//! device moves through its states, and what deleting one does to its
//! reservation.

use super::*;

impl World {
    // ----- devices -----

    pub fn device_exists(&self, id: Uuid) -> bool {
        self.devices.contains_key(&id)
    }

    /// The project's devices, by hostname and then id.
    pub fn project_devices(&self, project: Uuid, filter: DeviceFilter<'_>) -> Vec<Uuid> {
        let mut devices: Vec<&Device> = self
            .devices
            .values()
            .filter(|d| d.project_id == project)
            .filter(|d| filter.hostname.is_none_or(|h| d.hostname == h))
            .filter(|d| filter.tag.is_none_or(|t| d.tags.iter().any(|x| x == t)))
            .collect();
        devices.sort_by(|a, b| a.hostname.cmp(&b.hostname).then(a.id.cmp(&b.id)));
        devices.into_iter().map(|d| d.id).collect()
    }

    pub fn create_device(
        &mut self,
        project: Uuid,
        body: input::CreateDevice,
        steal: bool,
        now: Instant,
    ) -> Result<Uuid, ApiError> {
        let plan_slug = required(body.plan.as_deref(), "plan")?;
        let os = required(body.operating_system.as_deref(), "operating_system")?.to_owned();
        let metro = body
            .metro
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty());
        let facilities = body
            .facility
            .map(input::OneOrMany::into_vec)
            .unwrap_or_default();
        if metro.is_none() && facilities.is_empty() {
            return Err(ApiError::unprocessable(
                "Either metro or facility must be provided",
            ));
        }
        if let Some(hostname) = &body.hostname {
            check_hostname(hostname)?;
        }
        let tags = body.tags.unwrap_or_default();
        check_tags(&tags)?;

        let reservation =
            match body
                .hardware_reservation_id
                .as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                None => None,
                Some("next-available") => {
                    return Err(ApiError::unprocessable(
                        "next-available is not supported by this fake",
                    ));
                }
                Some(raw) => Some(raw.parse::<Uuid>().map_err(|_| {
                    ApiError::unprocessable("hardware_reservation_id must be a UUID")
                })?),
            };
        let (plan, facility) = match reservation {
            Some(id) => {
                let not_ours = || {
                    ApiError::unprocessable(format!(
                        "Hardware reservation {id} was not found in this project"
                    ))
                };
                if self.reservation(id).is_none_or(|r| r.project_id != project) {
                    return Err(not_ours());
                }
                if steal {
                    self.steal(id, now);
                }
                let r = self.reservation(id).ok_or_else(not_ours)?;
                if !r.provisionable(now) {
                    let ours = r
                        .device
                        .and_then(|d| self.devices.get(&d))
                        .is_some_and(|d| !d.created_by_other);
                    if ours {
                        self.duplicate_creates += 1;
                    }
                    return Err(ApiError::unprocessable(NOT_PROVISIONABLE));
                }
                if !r.plan.slug.eq_ignore_ascii_case(plan_slug) {
                    return Err(ApiError::unprocessable(format!(
                        "Plan {plan_slug} does not match the hardware reservation's plan {}",
                        r.plan.slug
                    )));
                }
                let metro_ok = metro.is_none_or(|m| r.facility.metro.matches(m));
                let facility_ok =
                    facilities.is_empty() || facilities.iter().any(|f| r.facility.matches(f));
                if !metro_ok || !facility_ok {
                    return Err(ApiError::unprocessable(format!(
                        "The hardware reservation is in facility {} of metro {}, not where the \
                         device was asked to be",
                        r.facility.code, r.facility.metro.code
                    )));
                }
                (r.plan, r.facility)
            }
            None => {
                let plan = catalog::plan(plan_slug).ok_or_else(|| {
                    ApiError::unprocessable(format!("Plan {plan_slug} was not found"))
                })?;
                let facility = match metro {
                    Some(m) => catalog::facility_in_metro(m),
                    None => facilities.iter().find_map(|f| catalog::facility(f)),
                }
                .ok_or_else(|| {
                    ApiError::unprocessable("No capacity in the requested metro or facility")
                })?;
                (plan, facility)
            }
        };
        let ssh_keys = self.keys_for_device(
            project,
            body.project_ssh_keys.unwrap_or_default(),
            body.user_ssh_keys.unwrap_or_default(),
            body.no_ssh_keys.unwrap_or(false),
        )?;

        let id = self.new_id();
        let stamp = Utc::now();
        self.devices.insert(
            id,
            Device {
                id,
                project_id: project,
                hostname: body
                    .hostname
                    .unwrap_or_else(|| format!("device-{}", short_id(id))),
                description: body.description,
                userdata: body.userdata,
                tags,
                created_at: stamp,
                updated_at: stamp,
                born: now,
                plan,
                facility,
                operating_system: os,
                reservation,
                ssh_keys,
                billing_cycle: body.billing_cycle.unwrap_or_else(|| "hourly".to_owned()),
                locked: body.locked.unwrap_or(false),
                always_pxe: body.always_pxe.unwrap_or(false),
                powered_off: false,
                failed: false,
                created_by_other: false,
            },
        );
        if let Some(r) = reservation.and_then(|r| self.reservation_mut(r)) {
            r.device = Some(id);
        }
        Ok(id)
    }

    /// The keys a new device gets. Like the real API, naming no keys at all
    /// means every key the project and its members have.
    pub(super) fn keys_for_device(
        &self,
        project: Uuid,
        project_keys: Vec<String>,
        user_ids: Vec<String>,
        no_keys: bool,
    ) -> Result<Vec<Uuid>, ApiError> {
        let mut chosen = Vec::new();
        for raw in &project_keys {
            let key = raw
                .parse::<Uuid>()
                .ok()
                .and_then(|id| self.keys.iter().find(|k| k.id == id))
                .filter(|k| k.owner == KeyOwner::Project(project))
                .ok_or_else(|| {
                    ApiError::unprocessable(format!("SSH key {raw} was not found in this project"))
                })?;
            chosen.push(key.id);
        }
        for raw in &user_ids {
            if raw.parse::<Uuid>().is_err() {
                return Err(ApiError::unprocessable(format!(
                    "user_ssh_keys: {raw} is not a UUID"
                )));
            }
        }
        if !user_ids.is_empty() {
            chosen.extend(self.keys_of(KeyOwner::User).map(|k| k.id));
        }
        if no_keys {
            return Ok(Vec::new());
        }
        if project_keys.is_empty() && user_ids.is_empty() {
            chosen.extend(
                self.keys
                    .iter()
                    .filter(|k| {
                        matches!(k.owner, KeyOwner::User) || k.owner == KeyOwner::Project(project)
                    })
                    .map(|k| k.id),
            );
            if chosen.is_empty() {
                return Err(ApiError::unprocessable(NO_KEYS));
            }
        }
        Ok(chosen)
    }

    pub fn update_device(&mut self, id: Uuid, body: input::UpdateDevice) -> Result<(), ApiError> {
        if let Some(hostname) = &body.hostname {
            check_hostname(hostname)?;
        }
        if let Some(tags) = &body.tags {
            check_tags(tags)?;
        }
        let device = self.devices.get_mut(&id).ok_or_else(ApiError::not_found)?;
        if let Some(hostname) = body.hostname {
            device.hostname = hostname;
        }
        if let Some(tags) = body.tags {
            device.tags = tags;
        }
        if body.description.is_some() {
            device.description = body.description;
        }
        if body.userdata.is_some() {
            device.userdata = body.userdata;
        }
        if let Some(cycle) = body.billing_cycle {
            device.billing_cycle = cycle;
        }
        if let Some(locked) = body.locked {
            device.locked = locked;
        }
        if let Some(always_pxe) = body.always_pxe {
            device.always_pxe = always_pxe;
        }
        device.updated_at = Utc::now();
        Ok(())
    }

    pub fn delete_device(&mut self, id: Uuid, now: Instant) -> Result<(), ApiError> {
        let device = self.devices.get(&id).ok_or_else(ApiError::not_found)?;
        if device.locked {
            return Err(ApiError::unprocessable(
                "Device is locked and cannot be deleted",
            ));
        }
        self.remove_device(id, now);
        Ok(())
    }

    /// Removes a device and starts wiping its reservation. `false` when
    /// there was no such device.
    pub fn remove_device(&mut self, id: Uuid, now: Instant) -> bool {
        let Some(device) = self.devices.remove(&id) else {
            return false;
        };
        let wipe = Wipe {
            since: now,
            lasts: self.wipe_delay,
        };
        if let Some(r) = device.reservation.and_then(|r| self.reservation_mut(r))
            && r.device == Some(id)
        {
            r.device = None;
            r.wiping = Some(wipe);
        }
        true
    }

    pub fn fail_device(&mut self, id: Uuid) -> bool {
        match self.devices.get_mut(&id) {
            Some(device) => {
                device.failed = true;
                true
            }
            None => false,
        }
    }

    pub fn perform_action(
        &mut self,
        id: Uuid,
        body: input::DeviceAction,
        now: Instant,
    ) -> Result<(), ApiError> {
        let state = {
            let device = self.devices.get(&id).ok_or_else(ApiError::not_found)?;
            self.device_state(device, now)
        };
        let kind = body
            .kind
            .ok_or_else(|| ApiError::unprocessable("type is required"))?;
        let power_off = match kind.as_str() {
            "power_off" => Some(true),
            "power_on" | "reboot" => Some(false),
            "rescue" | "reinstall" => None,
            other => {
                return Err(ApiError::unprocessable(format!(
                    "{other} is not a valid action type"
                )));
            }
        };
        if !matches!(state, "active" | "inactive") {
            return Err(ApiError::unprocessable(format!(
                "Device cannot {kind} while {state}"
            )));
        }
        if let (Some(off), Some(device)) = (power_off, self.devices.get_mut(&id)) {
            device.powered_off = off;
            device.updated_at = Utc::now();
        }
        Ok(())
    }

    pub(super) fn device_state(&self, device: &Device, now: Instant) -> &'static str {
        let age = now.saturating_duration_since(device.born);
        if device.failed {
            "failed"
        } else if age < self.provisioning_delay {
            "queued"
        } else if age < self.provisioning_delay.saturating_add(self.active_delay) {
            "provisioning"
        } else if device.powered_off {
            "inactive"
        } else {
            "active"
        }
    }
}
