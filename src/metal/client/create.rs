//! The idempotent create: read the reservation, recognise our own device
//! by its witness, and only then POST; settle an unknown outcome by looking.
//! A creation's first attempt, which nothing can have preceded, may skip
//! the read and POST on what the pass listed (`CreateDevice::first`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use reqwest::Method;
use uuid::Uuid;

use super::*;

impl MetalClient {
    /// [`MetalClient::create_device`], waiting for `pacer`'s turn right
    /// before every POST: a creation rate limit then holds at the moment
    /// devices are requested, not at some earlier point before the
    /// reservation's read. `fence` is asked after the turn, right before
    /// each POST leaves; a refusal sends nothing.
    pub async fn create_device_paced(
        &self,
        req: &CreateDevice,
        pacer: &dyn Pacer,
        fence: &dyn Fence,
    ) -> Result<CreatedDevice, MetalError> {
        let witness = req.witness.tag();
        // Set when a POST's outcome could not be observed, cleared when a
        // later read of the reservation shows no device of ours: an error
        // that ends the call while it is set means "unknown", not "failed".
        let ambiguous = AtomicBool::new(false);
        let attempts = AtomicU32::new(0);
        let result = retry(&self.inner.retry, "createDevice", |attempt| {
            let witness = &witness;
            let ambiguous = &ambiguous;

            attempts.store(attempt, Ordering::Relaxed);
            async move {
                // The first POST of a creation nothing preceded goes out at
                // once: no device of ours can be on the reservation, and a
                // reservation taken meanwhile answers 422, told apart below
                // by reading it then. Every later attempt reads first.
                if let (1, Some(hint)) = (attempt, &req.first) {
                    let body = self.hinted_body(req, hint, witness);
                    return self
                        .post_and_settle(req, &body, witness, attempt, ambiguous, pacer, fence)
                        .await;
                }
                let reservation = self
                    .json_once::<HardwareReservation>(
                        self.reservation_call(req.reservation, &["device", "facility"]),
                    )
                    .await?;
                if let Some(found) = self
                    .device_on(&reservation, witness, req.reservation)
                    .await?
                {
                    return Ok(CreatedDevice {
                        device: found,
                        recovered: true,
                        attempts: attempt,
                    });
                }
                ambiguous.store(false, Ordering::Relaxed);
                if !reservation.provisionable {
                    return Err(MetalError::NotProvisionable {
                        reservation: req.reservation,
                    });
                }
                let body = self.create_body(req, &reservation, witness)?;
                self.post_and_settle(req, &body, witness, attempt, ambiguous, pacer, fence)
                    .await
            }
        })
        .await;
        match result {
            // A foreign device on the reservation settles it: ours cannot be there.
            Err(e)
                if ambiguous.load(Ordering::Relaxed)
                    && !matches!(e, MetalError::RaceLost { .. }) =>
            {
                Err(MetalError::Ambiguous {
                    op: Operation::CreateDevice,
                    attempts: attempts.load(Ordering::Relaxed),
                    reason: e.to_string(),
                })
            }
            other => other,
        }
    }

    /// One POST of the create and what its answer settles: a refusal that a
    /// taken reservation would give is told apart by reading it again; an
    /// answer not seen marks the creation ambiguous.
    #[allow(clippy::too_many_arguments)]
    async fn post_and_settle(
        &self,
        req: &CreateDevice,
        body: &DeviceCreateRequest,
        witness: &str,
        attempt: u32,
        ambiguous: &AtomicBool,
        pacer: &dyn Pacer,
        fence: &dyn Fence,
    ) -> Result<CreatedDevice, MetalError> {
        {
            {
                let call = Call {
                    op: Operation::CreateDevice,
                    method: Method::POST,
                    path: format!("/projects/{}/devices", self.inner.project_id),
                    query: vec![],
                    body: Some(body),
                };
                let posted = match self.attempt_paced(&call, Some(pacer), Some(fence)).await {
                    Ok((status, body)) => decode::<Device>(call.op, status, &body),
                    Err(e) => Err(e),
                };
                match posted {
                    Ok(device) => Ok(CreatedDevice {
                        device,
                        recovered: false,
                        attempts: attempt,
                    }),
                    Err(
                        e @ MetalError::Invalid {
                            status: 409 | 422, ..
                        },
                    ) => {
                        // A 422 (or a 409) is what a create on a reservation
                        // taken since our read looks like; tell that apart.
                        let now = self
                            .json_once::<HardwareReservation>(
                                self.reservation_call(req.reservation, &["device"]),
                            )
                            .await;
                        match now {
                            Ok(r) => match self.device_on(&r, witness, req.reservation).await? {
                                Some(device) => Ok(CreatedDevice {
                                    device,
                                    recovered: true,
                                    attempts: attempt,
                                }),
                                None => Err(e),
                            },
                            // The refusal may have been for a device of ours
                            // made meanwhile: unknown until the next read.
                            Err(reread) => {
                                ambiguous.store(true, Ordering::Relaxed);
                                Err(MetalError::Transient {
                                    op: call.op,
                                    reason: format!(
                                        "refused ({e}), and the reservation could not be read again: {reread}"
                                    ),
                                })
                            }
                        }
                    }
                    // A create the server accepted but whose answer cannot
                    // be read made a device we cannot see yet: look again.
                    Err(MetalError::Undecodable {
                        status: 200..=299,
                        detail,
                        ..
                    }) => {
                        ambiguous.store(true, Ordering::Relaxed);
                        Err(MetalError::Transient {
                            op: call.op,
                            reason: format!(
                                "the create was accepted but its answer is unreadable: {detail}"
                            ),
                        })
                    }
                    Err(e) => {
                        if matches!(
                            e,
                            MetalError::Transient { .. } | MetalError::Undecodable { .. }
                        ) {
                            ambiguous.store(true, Ordering::Relaxed);
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// The create's body from a listing's hint instead of a fresh read.
    fn hinted_body(
        &self,
        req: &CreateDevice,
        hint: &CreateHint,
        witness: &str,
    ) -> DeviceCreateRequest {
        DeviceCreateRequest {
            hostname: req.hostname.clone(),
            plan: hint.plan.clone(),
            operating_system: req.operating_system.clone(),
            // The metro where there is one, as a read would choose.
            metro: hint.metro.clone(),
            facility: hint.facility.clone().filter(|_| hint.metro.is_none()),
            hardware_reservation_id: req.reservation,
            project_ssh_keys: req.ssh_keys.clone(),
            tags: vec![witness.to_string()],
        }
    }

    /// Looks for the device a creation with `witness` made on `reservation`:
    /// `Some` if it is there, `None` if the reservation has no device, and
    /// `RaceLost` if another party's device is on it. How an unknown outcome
    /// is settled: by looking, never by guessing.
    pub async fn find_created(
        &self,
        reservation: Uuid,
        witness: &Witness,
    ) -> Result<Option<Device>, MetalError> {
        let tag = witness.tag();
        retry(&self.inner.retry, "findCreatedDevice", |_| async {
            let r = self
                .json_once::<HardwareReservation>(
                    self.reservation_call(reservation, &["device", "facility"]),
                )
                .await?;
            self.device_on(&r, &tag, reservation).await
        })
        .await
    }

    /// The device on a reservation if it is ours; `RaceLost` if it is not.
    pub(super) async fn device_on(
        &self,
        reservation: &HardwareReservation,
        witness: &str,
        reservation_id: Uuid,
    ) -> Result<Option<Device>, MetalError> {
        let Some(embedded) = &reservation.device else {
            return Ok(None);
        };
        // The reservation was read with include=device; a bare link would
        // need one more read to see the tags.
        let device = match embedded {
            Embedded::Full(d) => d.clone(),
            Embedded::Link(h) => match h.id() {
                Some(id) => self.json_once::<Device>(self.device_call(id)).await?,
                // A device is there and we cannot tell whose: unknown,
                // not lost (the caller looks again rather than gives up).
                None => {
                    return Err(MetalError::Undecodable {
                        op: Operation::FindHardwareReservationById,
                        status: 200,
                        detail: format!(
                            "reservation {reservation_id} holds a device whose link has no id"
                        ),
                        excerpt: String::new(),
                    });
                }
            },
        };
        if device.has_tag(witness) {
            Ok(Some(device))
        } else {
            Err(MetalError::RaceLost {
                reservation: reservation_id,
                device: Some(device.id),
            })
        }
    }

    pub(super) fn create_body(
        &self,
        req: &CreateDevice,
        reservation: &HardwareReservation,
        witness: &str,
    ) -> Result<DeviceCreateRequest, MetalError> {
        let plan = reservation
            .plan_slug()
            .ok_or_else(|| MetalError::Undecodable {
                op: Operation::FindHardwareReservationById,
                status: 200,
                detail: format!("reservation {} has no plan slug", reservation.id),
                excerpt: String::new(),
            })?
            .to_string();
        let metro = reservation.metro_code().map(str::to_string);
        let facility = match metro {
            Some(_) => None,
            None => reservation.facility().and_then(|f| f.code.clone()),
        };
        Ok(DeviceCreateRequest {
            hostname: req.hostname.clone(),
            plan,
            operating_system: req.operating_system.clone(),
            metro,
            facility,
            hardware_reservation_id: req.reservation,
            project_ssh_keys: req.ssh_keys.clone(),
            tags: vec![witness.to_string()],
        })
    }
}
