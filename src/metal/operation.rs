//! The API operations shepherd uses, named by the spec's `operationId`s.
//!
//! Client metrics, the fake server's call counters and fault rules all key on
//! these names, so a figure in a test, a dashboard and the spec line up.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Operation {
    #[serde(rename = "findProjectHardwareReservations")]
    FindProjectHardwareReservations,
    #[serde(rename = "findHardwareReservationById")]
    FindHardwareReservationById,
    #[serde(rename = "moveHardwareReservation")]
    MoveHardwareReservation,
    #[serde(rename = "createDevice")]
    CreateDevice,
    #[serde(rename = "findProjectDevices")]
    FindProjectDevices,
    #[serde(rename = "findDeviceById")]
    FindDeviceById,
    #[serde(rename = "updateDevice")]
    UpdateDevice,
    #[serde(rename = "deleteDevice")]
    DeleteDevice,
    #[serde(rename = "performAction")]
    PerformAction,
    #[serde(rename = "findProjectSSHKeys")]
    FindProjectSshKeys,
    #[serde(rename = "createProjectSSHKey")]
    CreateProjectSshKey,
    #[serde(rename = "findSSHKeys")]
    FindSshKeys,
    #[serde(rename = "createSSHKey")]
    CreateSshKey,
    #[serde(rename = "findSSHKeyById")]
    FindSshKeyById,
    #[serde(rename = "updateSSHKey")]
    UpdateSshKey,
    #[serde(rename = "deleteSSHKey")]
    DeleteSshKey,
    #[serde(rename = "findProjectById")]
    FindProjectById,
}

impl Operation {
    pub const ALL: [Operation; 17] = [
        Operation::FindProjectHardwareReservations,
        Operation::FindHardwareReservationById,
        Operation::MoveHardwareReservation,
        Operation::CreateDevice,
        Operation::FindProjectDevices,
        Operation::FindDeviceById,
        Operation::UpdateDevice,
        Operation::DeleteDevice,
        Operation::PerformAction,
        Operation::FindProjectSshKeys,
        Operation::CreateProjectSshKey,
        Operation::FindSshKeys,
        Operation::CreateSshKey,
        Operation::FindSshKeyById,
        Operation::UpdateSshKey,
        Operation::DeleteSshKey,
        Operation::FindProjectById,
    ];

    /// The spec's `operationId`.
    pub fn id(self) -> &'static str {
        match self {
            Operation::FindProjectHardwareReservations => "findProjectHardwareReservations",
            Operation::FindHardwareReservationById => "findHardwareReservationById",
            Operation::MoveHardwareReservation => "moveHardwareReservation",
            Operation::CreateDevice => "createDevice",
            Operation::FindProjectDevices => "findProjectDevices",
            Operation::FindDeviceById => "findDeviceById",
            Operation::UpdateDevice => "updateDevice",
            Operation::DeleteDevice => "deleteDevice",
            Operation::PerformAction => "performAction",
            Operation::FindProjectSshKeys => "findProjectSSHKeys",
            Operation::CreateProjectSshKey => "createProjectSSHKey",
            Operation::FindSshKeys => "findSSHKeys",
            Operation::CreateSshKey => "createSSHKey",
            Operation::FindSshKeyById => "findSSHKeyById",
            Operation::UpdateSshKey => "updateSSHKey",
            Operation::DeleteSshKey => "deleteSSHKey",
            Operation::FindProjectById => "findProjectById",
        }
    }

    pub fn from_id(id: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.id() == id)
    }

    /// Whether repeating the call can change state twice. Only creates are
    /// unsafe to repeat blindly; updates, deletes and actions converge.
    pub fn creates(self) -> bool {
        matches!(
            self,
            Operation::CreateDevice | Operation::CreateProjectSshKey | Operation::CreateSshKey
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}
